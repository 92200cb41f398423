"""Context parallelism through parallelize trains like one device: cp x dp x tp (± SP) x pp,
ring or Ulysses, zigzag or contiguous rows, DDP or a sharded engine, every recompute mode.

Each run takes 3 AdamW steps (clipped in the draws) and is compared with one device
accumulating the same m global micro-batches in order (the composition matrix's
comparison, tests/parallel/mesh/test_layout_matrix.py): losses, the first step's
gradients, weights, m and v, in float64, at the data-parallel tests' tolerances.

The known bugs, planted, must fail: the position embedding at 0..s/cp-1 on every rank (the
rows' global positions forgotten), the gradients averaged over dp only (the cp ranks'
shares never meet), and the ring told "contiguous" while the rows are zigzag's.
"""

import importlib

import pytest
from hypothesis import event, given, settings, strategies as st

import minipar as mp
from minipar.parallel import ParallelDims, ParallelGroups, ShardingStrategy, parallelize
from minipar.parallel.mesh import context as mesh_context

from .test_layout_matrix import OPT, compare

mesh_parallelize = importlib.import_module("minipar.parallel.mesh.parallelize")

S = ShardingStrategy
ENGINES = {"ddp": dict(zero=0), "zero1": dict(zero=1), "zero3": dict(zero=3),
           "full_shard": dict(sharding_strategy=S.FULL_SHARD)}
REPLICATED = {"hybrid": dict(sharding_strategy=S.HYBRID_SHARD),  # dp replicas, shards over cp
              "zero2_replicated": dict(zero=2)}


def config(kit, cp, tp, recompute="none", layers=2, seed=0, sp=False):
    """Heads: tp·cp of them, so that Ulysses can split every tp rank's heads over cp;
    the sequence: 2·cp rows (zigzag's chunks) times tp under SP, times 2."""
    heads = tp * cp
    return kit.tiny_config(vocab_size=16 * tp, seq_len=4 * cp * tp, hidden=2 * heads,
                           num_heads=heads, ffn_hidden=4 * tp, num_layers=layers, seed=seed,
                           recompute=recompute, recompute_segment=2 if recompute ==
                           "segments" else 1)


def dims_of(cp, dp, tp, pp, engine):
    if engine == "ddp" or engine in REPLICATED:
        return ParallelDims(dp_replicate=dp, cp=cp, tp=tp, pp=pp)
    return ParallelDims(dp_shard=dp, cp=cp, tp=tp, pp=pp)


def run(kit, cp, dp, tp, pp, *, method="ring", layout="zigzag", engine="ddp", sp=False,
        recompute="none", clip=0.05, seed=0, steps=3):
    """(one device's reference, every rank's run) for one layout."""
    m = pp  # micro-batches: the pipeline's m, or one at pp = 1
    cfg = config(kit, cp, tp, recompute, layers=max(2, pp), seed=seed, sp=sp)
    batches = kit.global_batches(cfg, steps=steps, global_batch=m * dp, seed=seed)
    pipe = dict(schedule="1f1b", microbatches=m) if pp > 1 else {}
    res = kit.composed_run(cfg, batches, dims_of(cp, dp, tp, pp, engine), OPT,
                           sequence_parallel=sp, max_grad_norm=clip, cp_method=method,
                           cp_layout=layout, placement="any",
                           **{**ENGINES, **REPLICATED}[engine], **pipe)
    return kit.reference_tuple(cfg, batches, m, clip), res


LAYOUTS = [  # (cp, dp, tp, pp, method, layout, engine, sp, why)
    (2, 1, 1, 1, "ring", "zigzag", "ddp", False, "the ring alone"),
    (4, 1, 1, 1, "ring", "contiguous", "ddp", False, "contiguous rows"),
    (4, 1, 1, 1, "ulysses", "zigzag", "ddp", False, "Ulysses, reordered"),
    (2, 2, 1, 1, "ring", "zigzag", "ddp", False, "gradients over dp x cp"),
    (2, 2, 1, 1, "ulysses", "contiguous", "zero1", False, "ZeRO-1 over dp_shard x cp"),
    (2, 1, 2, 1, "ring", "zigzag", "ddp", True, "tp with SP"),
    (2, 1, 2, 1, "ulysses", "zigzag", "ddp", False, "tp, Ulysses on a/t heads"),
    (2, 1, 1, 2, "ring", "zigzag", "ddp", False, "pp: rows of each micro-batch"),
    (2, 2, 1, 1, "ring", "zigzag", "hybrid", False, "HYBRID_SHARD: shards over cp, dp replicas"),
    (2, 2, 1, 1, "ulysses", "zigzag", "zero2_replicated", False, "ZeRO-2 over cp, dp replicas"),
]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("cp, dp, tp, pp, method, layout, engine, sp, why", LAYOUTS,
                         ids=[case[-1] for case in LAYOUTS])
def test_a_context_parallel_layout_trains_like_one_device(dpkit, cp, dp, tp, pp, method,
                                                          layout, engine, sp, why):
    ref, res = run(dpkit, cp, dp, tp, pp, method=method, layout=layout, engine=engine, sp=sp)
    assert compare(dpkit, ref, res) > 0


@pytest.mark.timeout(300)
@settings(max_examples=6)
@given(data=st.data())
def test_any_cp_layout_trains_like_one_device(dpkit, data):
    """A drawn layout of world <= 8 with cp in {2, 4}, a method, a row layout, an engine,
    SP, a recompute mode, the clip on or off, a seed."""
    cp = data.draw(st.sampled_from([2, 4]), "cp")
    rest = [(dp, tp, pp) for dp in (1, 2) for tp in (1, 2) for pp in (1, 2)
            if cp * dp * tp * pp <= 8]
    dp, tp, pp = data.draw(st.sampled_from(rest), "dp, tp, pp")
    method = data.draw(st.sampled_from(["ring", "ulysses"]), "method")
    layout = data.draw(st.sampled_from(["zigzag", "contiguous"]), "layout")
    engine = data.draw(st.sampled_from(list(ENGINES)), "engine")
    sp = tp > 1 and data.draw(st.booleans(), "sequence parallel")
    recompute = data.draw(st.sampled_from(["none", "selective", "full"]), "recompute")
    event(f"cp={cp} dp={dp} tp={tp} pp={pp} {method} {layout} {engine} sp={sp}")
    ref, res = run(dpkit, cp, dp, tp, pp, method=method, layout=layout, engine=engine,
                   sp=sp, recompute=recompute,
                   clip=data.draw(st.sampled_from([None, 0.05]), "clip"),
                   seed=data.draw(st.integers(0, 2**16), "seed"), steps=2)
    assert compare(dpkit, ref, res) > 0


def _trains_like_one_device(kit, **kw) -> bool:
    """Whether one step at dp 2 x cp 2 matches one device (compare's assertions hold)."""
    ref, res = run(kit, 2, 2, 1, 1, steps=1, **kw)
    try:
        compare(kit, ref, res)
    except AssertionError:
        return False
    return True


@pytest.mark.timeout(120)
def test_the_known_bugs_fail(dpkit, monkeypatch):
    assert _trains_like_one_device(dpkit)  # the layout itself is right
    with monkeypatch.context() as m:  # every rank's rows embedded at 0..s/cp-1
        m.setattr(mesh_parallelize, "sequence_positions", lambda cfg, groups, layout: None)
        assert not _trains_like_one_device(dpkit)
    with monkeypatch.context() as m:  # gradients averaged over dp only
        m.setattr(mesh_parallelize, "ParallelGroups", _DpOnly)
        assert not _trains_like_one_device(dpkit)
    with monkeypatch.context() as m:  # the ring told "contiguous", the rows zigzag's
        real_core = mesh_context.attention_core
        m.setattr(mesh_parallelize, "attention_core",
                  lambda groups, method, layout: real_core(groups, method, "contiguous"))
        assert not _trains_like_one_device(dpkit)


class _DpOnly(ParallelGroups):
    """The groups with the cp ranks left out of the gradients' average."""

    def __init__(self, dims):
        super().__init__(dims)
        self.dp_cp, self.dp_shard_cp = self.dp, self.dp_shard


@pytest.mark.parametrize("cfg_kw, dims, kw, match", [
    (dict(dropout=0.1), ParallelDims(cp=2), {}, "with dropout = 0.1.*dropout=0.0"),
    (dict(seq_len=6), ParallelDims(cp=2), {}, "seq_len = 6 cannot be split over cp = 2.*"
                                              "multiple of 4"),
    (dict(seq_len=6), ParallelDims(cp=2, tp=2),
     dict(sequence_parallel=True, cp_layout="contiguous"),
     "seq_len = 6 cannot be split over cp = 2: contiguous cuts the sequence into 2 chunks "
     "and sequence parallelism splits each rank's rows over tp = 2; expected a multiple "
     "of 4"),
    (dict(num_heads=2, hidden=4, seq_len=16), ParallelDims(cp=4), dict(cp_method="ulysses"),
     r"2 heads .* not divisible by 4: choose cp in \[1, 2\], or cp_method='ring'"),
    ({}, ParallelDims(cp=2), dict(cp_method="flash"), "cp_method must be one of"),
    ({}, ParallelDims(cp=2), dict(cp_layout="striped"), "cp_layout must be one of"),
])
def test_what_context_parallelism_does_not_compose_with_is_refused(dpkit, cfg_kw, dims, kw,
                                                                    match):
    cfg = dpkit.tiny_config(**{**dict(seq_len=12, hidden=8, num_heads=4), **cfg_kw})

    def program(ctx):
        parallelize(cfg, dims, placement="any", **kw, **OPT)

    with pytest.raises(mp.RankFailedError, match=match):
        mp.launch(program, dims.world_size)
