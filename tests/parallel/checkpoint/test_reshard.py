"""Resharding between (dp, pp, tp) layouts: a save at (2, 2, 2) loads at (1, 4, 2),
(8, 1, 1), (1, 1, 8) and (1, 1, 1), and continues bit for bit; any layout of <= 8 ranks
loads any other.

"Continues bit for bit", stated precisely (two layouts add their reductions in different
orders, so like is compared with like):

  1. the state loaded is the state saved, bit for bit: every full tensor (weights, Adam's m
     and v, float32 masters of a bfloat16 model, the step), as the saving run held it in
     memory, and as the loading run writes it again at once;
  2. continuing at layout B gives exactly (==) the losses and end state of a run at B that
     loaded the same state from memory (the saving run's tensors and dropout generator),
     so the files carry everything the run needs, nothing is lost or added on the way;
  3. and it agrees with the run that never stopped, at A, to the reduction-order bound of
     tests/parallel/conftest.py (losses rtol 1e-12; weights, m, v 1e-11 of the largest of
     their kind, float64).

Layouts without a pipeline draw a step's dropout masks over the whole batch at once, a
pipeline micro-batch by micro-batch (test_pipeline.py): the pp = 1 layouts here run a
one-stage pipeline schedule, so that every layout draws the masks of the run at A.
"""

import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipar.parallel import ParallelDims, ShardingStrategy
from minipar.parallel import checkpoint as ck

HYBRID = ShardingStrategy.HYBRID_SHARD
SAVER = dict(dims=ParallelDims(dp_shard=2, pp=2, tp=2), zero=1, schedule="1f1b", sp=True)
TARGETS = [  # (dp, pp, tp) of the issue, each with another engine and schedule
    dict(dims=ParallelDims(pp=4, tp=2), zero=0, schedule="gpipe", sp=True),
    dict(dims=ParallelDims(dp_shard=8), zero=3, schedule="1f1b"),
    dict(dims=ParallelDims(tp=8), zero=0, schedule="1f1b", sp=True),
    dict(dims=ParallelDims(), zero=0, schedule="1f1b"),
]


def config(kit, **kw):
    """Heads, hidden, ffn, vocabulary and sequence divisible by tp = 8; 4 blocks for pp 4."""
    base = dict(vocab_size=16, seq_len=8, hidden=16, num_heads=8, ffn_hidden=16,
                num_layers=4, tie_embeddings=True, dropout=0.1, seed=13)
    return kit.tiny_config(**{**base, **kw})


@pytest.mark.timeout(300)
def test_a_2x2x2_save_loads_at_1x4x2_8x1x1_1x1x8_1x1x1_and_continues_bit_for_bit(
        dpkit, ckrun, tmp_path):
    cfg = config(dpkit)
    batches = dpkit.global_batches(cfg, 4, 16, seed=13)
    saver = ckrun.Layout(**SAVER)
    straight = ckrun.session(dpkit, cfg, saver, batches, snapshot=2)
    first = ckrun.session(dpkit, cfg, saver, batches, steps=2, save_root=tmp_path, save_every=2)
    dpkit.assert_close(first.mean_losses, straight.mean_losses[:2], rtol=0, atol_scale=0)
    saved = ck.read_full_state(tmp_path / "step-00000002")
    dpkit.assert_state_equal(saved, straight.snapshot[0])  # 1: what the run held
    for i, target in enumerate(TARGETS):
        layout = ckrun.Layout(**target)
        again = tmp_path / f"again{i}"
        files = ckrun.session(dpkit, cfg, layout, batches, resume_from=tmp_path,
                              resave_to=again)
        assert files.resumed.step == 2 and files.resumed.skipped == []
        dpkit.assert_state_equal(ck.read_full_state(again), saved)  # 1: as loaded
        memory = ckrun.session(dpkit, cfg, layout, batches, from_memory=straight.snapshot)
        assert files.losses == memory.losses, f"2: {layout}"  # every rank's, exactly
        dpkit.assert_state_equal(files.state, memory.state)
        dpkit.assert_close(files.mean_losses, straight.mean_losses[2:], what=f"3: {layout}")
        dpkit.assert_state_close_by_kind(files.state, straight.state)


# ---- any layout of <= 8 ranks, any engine, to any other -------------------------------------
SIZES = [(dp, pp, tp) for dp in (1, 2, 4, 8) for pp in (1, 2, 4) for tp in (1, 2, 4, 8)
         if dp * pp * tp <= 8]


def layout(size, zero, schedule, sp) -> dict:
    """(dp, pp, tp) with DDP (zero 0: dp replicas), ZeRO or FULL_SHARD over dp_shard, or
    HYBRID_SHARD (dp_shard 2 x dp_replicate dp/2; FULL_SHARD where dp < 4), a schedule
    at pp > 1 (interleaved needs pp x 2 chunks <= 4 blocks, else 1F1B), SP where tp > 1."""
    dp, pp, tp = size
    shard, replicate = (dp, 1) if zero else (1, dp)
    if zero is HYBRID:
        shard, replicate = (2, dp // 2) if dp >= 4 else (dp, 1)
        zero = HYBRID if dp >= 4 else ShardingStrategy.FULL_SHARD
    dims = ParallelDims(dp_shard=shard, dp_replicate=replicate, pp=pp, tp=tp)
    if schedule == "interleaved_1f1b" and pp * 2 > 4:
        schedule = "1f1b"
    return dict(dims=dims, zero=zero, schedule=schedule if pp > 1 else None,
                sp=sp and tp > 1)


LAYOUTS = st.builds(layout, st.sampled_from(SIZES), st.sampled_from([0, 1, 2, 3, HYBRID]),
                    st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"]),
                    st.booleans())


@pytest.mark.timeout(600)
@settings(max_examples=10)
@given(save_as=LAYOUTS, load_as=LAYOUTS, dtype=st.sampled_from(["float64", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_any_layout_of_at_most_8_ranks_loads_any_other_and_continues_bit_for_bit(
        dpkit, ckrun, save_as, load_as, dtype, seed):
    """The state loaded equals the state saved (masters of bfloat16 included), and the
    continued run equals, exactly, the one at the loading layout that loaded the same
    state from memory. No dropout: layouts with and without a pipeline draw differently."""
    cfg = config(dpkit, dtype=dtype, seed=seed, dropout=0.0, tie_embeddings=False)
    batches = dpkit.global_batches(cfg, 2, 16, seed=seed)
    save_as, load_as = ckrun.Layout(**save_as), ckrun.Layout(**load_as)
    with tempfile.TemporaryDirectory() as tmp:
        first = ckrun.session(dpkit, cfg, save_as, batches, steps=1, save_root=tmp,
                              snapshot=1)
        dpkit.assert_state_equal(ck.read_full_state(first.saved[0]), first.snapshot[0])
        files = ckrun.session(dpkit, cfg, load_as, batches, resume_from=tmp,
                              resave_to=f"{tmp}/again")
        dpkit.assert_state_equal(ck.read_full_state(f"{tmp}/again"), first.snapshot[0])
        memory = ckrun.session(dpkit, cfg, load_as, batches, from_memory=first.snapshot)
        assert files.losses == memory.losses
        dpkit.assert_state_equal(files.state, memory.state)
        assert np.isfinite(files.mean_losses).all()


# ---- context parallelism: the model is whole on every cp rank ------------------------------
CP_PAIRS = [  # (save_as, load_as)
    (dict(dims=ParallelDims(dp_replicate=2, cp=2)), dict(dims=ParallelDims())),
    (dict(dims=ParallelDims(dp_shard=2, cp=2), zero=1, cp_method="ulysses"),
     dict(dims=ParallelDims(cp=4, tp=2), sp=True)),
    (dict(dims=ParallelDims(dp_shard=2, tp=2), zero=3, sp=True),
     dict(dims=ParallelDims(cp=2, pp=2), schedule="1f1b")),
    (dict(dims=ParallelDims(cp=2, pp=2, tp=2), schedule="1f1b"),
     dict(dims=ParallelDims(dp_shard=2, cp=2), zero=2)),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("save_as, load_as", CP_PAIRS,
                         ids=[f"{i}" for i in range(len(CP_PAIRS))])
def test_a_context_parallel_save_loads_at_other_layouts_and_continues_bit_for_bit(
        dpkit, ckrun, tmp_path, save_as, load_as):
    """Context parallelism splits the sequence, not the state: its cp ranks hold the same
    shards (DDP: replicas over dp x cp; ZeRO: shards over dp_shard x cp), and a save at cp
    loads at any layout, cp or not, as the dp tests' saves do."""
    cfg = config(dpkit, dropout=0.0, tie_embeddings=False, seq_len=16)
    batches = dpkit.global_batches(cfg, 2, 8, seed=5)
    save_as, load_as = ckrun.Layout(**save_as), ckrun.Layout(**load_as)
    first = ckrun.session(dpkit, cfg, save_as, batches, steps=1, save_root=tmp_path,
                          snapshot=1)
    dpkit.assert_state_equal(ck.read_full_state(first.saved[0]), first.snapshot[0])
    files = ckrun.session(dpkit, cfg, load_as, batches, resume_from=tmp_path,
                          resave_to=tmp_path / "again")
    dpkit.assert_state_equal(ck.read_full_state(tmp_path / "again"), first.snapshot[0])
    memory = ckrun.session(dpkit, cfg, load_as, batches, from_memory=first.snapshot)
    assert files.losses == memory.losses
    dpkit.assert_state_equal(files.state, memory.state)
    straight = ckrun.session(dpkit, cfg, save_as, batches)
    dpkit.assert_close(files.mean_losses, straight.mean_losses[1:], what=str(load_as))
