"""A pipeline composed with data and tensor parallelism through `parallelize` is one device.

Each example draws a schedule (GPipe, 1F1B, interleaved 1F1B with 1 or 2 chunks), pp in
1..4, m in 1..8, the layers split evenly, unevenly (the remainder on the first stages) or
by a drawn list (empty stages included), dp in {1, 2} under DDP, ZeRO-1 or ZeRO-3, tp in
{1, 2} with or without sequence parallelism (world <= 8), tied or untied embeddings,
dropout, clipping and a seed; runs 3 AdamW steps both ways and compares every rank's loss,
the first step's gradients (averaged over dp, gathered over tp) and, after the last step,
the weights and Adam's m and v of every parameter the rank holds.

The reference is one device accumulating the m global micro-batches [s, B/m] in order,
each loss scaled by 1/m; a dp rank runs block d of dp of each micro-batch, and its masks
are that block of the global micro-batch's (pipeline.py). Tolerances: those of
tests/parallel/tp/test_equivalence.py (float64, conftest.py): losses rtol 1e-12;
gradients rtol 1e-12 + 1e-14 of the largest gradient; weights, m and v rtol 1e-12 +
1e-11 of the largest of their kind; the gradient norm rtol 1e-12.
"""

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import minipar as mp
from minipar.parallel import ParallelDims, ShardingStrategy, parallelize
from minipar.parallel.pp import schedule, validate_schedule


def check(kit, ref, res):
    ref_losses, ref_grads, ref_norms, ref_state = ref
    blocks = {}  # dp block -> its ranks' losses: all equal (broadcast from the last stage)
    for losses, *_, where in res:
        blocks.setdefault((where["dp_replicate"], where["dp_shard"]), []).append(losses)
    for block in blocks.values():
        assert all(b == block[0] for b in block)
    kit.assert_close(np.mean([b[0] for b in blocks.values()], axis=0), ref_losses,
                     what="losses")
    scale = max(float(np.abs(g).max()) for g in ref_grads.values())
    kind = lambda k: k.rsplit(".", 1)[1] if k.startswith("optim/") else "param"
    largest: dict = {}
    for key, arr in ref_state.items():
        largest[kind(key)] = max(largest.get(kind(key), 0.0), float(np.abs(arr).max()))
    held = set()
    for r, (_, grads, norm, state, _) in enumerate(res):
        for name, g in grads.items():
            np.testing.assert_allclose(g, ref_grads[name], rtol=kit.RTOL,
                                       atol=kit.GRAD_ATOL_SCALE * scale,
                                       err_msg=f"rank {r} step 0 gradient of {name}")
        for key, arr in state.items():
            np.testing.assert_allclose(arr, ref_state[key], rtol=kit.RTOL,
                                       atol=kit.ATOL_SCALE * largest[kind(key)],
                                       err_msg=f"rank {r} {key}")
            held.add(key)
        if ref_norms[-1] is not None:
            kit.assert_close(norm, ref_norms[-1], what=f"rank {r} gradient norm")
    assert held == set(ref_state)  # every parameter lives on some rank


def tiny(kit, **kw):
    """Sizes tp = 2 divides (heads, ffn, vocabulary, and the sequence under SP)."""
    return kit.tiny_config(**{**dict(vocab_size=16, seq_len=4, hidden=8, num_heads=2,
                                     ffn_hidden=8), **kw})


@pytest.mark.timeout(120)
@settings(max_examples=10)
@given(data=st.data())
def test_a_pipeline_with_dp_and_tp_trains_like_one_device(dpkit, data):
    name = data.draw(st.sampled_from(["interleaved_1f1b", "1f1b", "gpipe"]), "schedule")
    p = data.draw(st.integers(1, 4), "pp")
    if name == "interleaved_1f1b":  # Megatron's grouping: m a multiple of p
        v = data.draw(st.sampled_from([2, 1]), "chunks")
        m = p * data.draw(st.integers(1, max(1, 8 // p)), "micro-batches / pp")
    else:
        v, m = 1, data.draw(st.integers(1, 8), "micro-batches")
    dp = data.draw(st.sampled_from([2, 1]), "dp")
    tp = data.draw(st.sampled_from([2, 1]) if p * dp <= 4 else st.just(1), "tp")
    zero = data.draw(st.sampled_from([3, 1, 0]), "zero")
    sp = tp > 1 and data.draw(st.booleans(), "sequence parallel")
    S = p * v
    if data.draw(st.booleans(), "layers given as a list"):  # empty stages too
        layers = data.draw(st.lists(st.integers(0, 2), min_size=S, max_size=S)
                           .filter(lambda c: sum(c) > 0), "layers")
        L = sum(layers)
    else:
        layers, L = None, S + data.draw(st.integers(0, 2), "layers beyond one per stage")
    tie = data.draw(st.booleans(), "tied") and not (p == 1 and S > 1 and zero == 3)
    clip = data.draw(st.sampled_from([None, 0.05]), "max_grad_norm")
    event(f"{name} p={p} v={v} dp={dp} tp={tp} zero={zero}")
    cfg = tiny(dpkit, num_layers=L, tie_embeddings=tie,
               dropout=data.draw(st.sampled_from([0.0, 0.1]), "dropout"),
               seed=data.draw(st.integers(0, 2**16), "seed"))
    b = data.draw(st.integers(1, 2), "sequences per rank and micro-batch")
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dp * b, seed=cfg.seed)
    dims = (ParallelDims(dp_replicate=dp, pp=p, tp=tp) if zero == 0
            else ParallelDims(dp_shard=dp, pp=p, tp=tp))
    res = dpkit.composed_run(cfg, batches, dims, dpkit.OPT, zero=zero, sequence_parallel=sp,
                             max_grad_norm=clip, schedule=name, microbatches=m, chunks=v,
                             layers=layers)
    check(dpkit, dpkit.reference_tuple(cfg, batches, m, clip), res)


# The draws below search; they guarantee no pair. The CI profile derandomizes them with a
# seed hashed from this function's source (comments excluded: this note leaves the draws
# as they were), and its 10 examples drew DualPipeV never and ZB-H1 (p > 1), ZB-H2 and ZBV
# only with tp = 1 under ZeRO-3. Issue 14's coverage is the fixed grid of
# test_every_zero_bubble_schedule_with_dp_and_tp_trains_like_one_device below: ZB-H1,
# ZB-H2, ZBV and DualPipeV each under DDP, ZeRO-1 and ZeRO-3 with dp = tp = 2 at pp = 2
# (world 8), and DualPipeV on pp = 4 with dp = 2 under DDP.
@pytest.mark.timeout(120)
@settings(max_examples=10)
@given(data=st.data())
def test_split_backward_schedules_with_dp_and_tp_train_like_one_device(dpkit, data):
    """The backward split into I and W (the zero-bubble generators' schedules once on
    main, and schedules derived here: every B as I then W at once, or every W deferred to
    the end of its rank's list), through parallelize with dp under DDP, ZeRO-1 or ZeRO-3
    (each reducing after the last W), tp with or without SP, pp 1..4, m 1..8, even,
    uneven or given splits, tied or not, dropout and clipping: one device's losses,
    gradients, norms, weights, moments. Stages sit where the schedule places them."""
    actions, what = dpkit.draw_split_schedule(data)
    info = validate_schedule(actions)
    p, S, m = len(actions), info.stages, info.microbatches
    dp = data.draw(st.sampled_from([2, 1]), "dp")
    tp = data.draw(st.sampled_from([2, 1]) if p * dp <= 4 else st.just(1), "tp")
    zero = data.draw(st.sampled_from([3, 1, 0]), "zero")
    sp = tp > 1 and data.draw(st.booleans(), "sequence parallel")
    if data.draw(st.booleans(), "layers given as a list"):
        layers = data.draw(st.lists(st.integers(0, 2), min_size=S, max_size=S)
                           .filter(lambda c: sum(c) > 0), "layers")
        L = sum(layers)
    else:
        layers, L = None, S + data.draw(st.integers(0, 2), "layers beyond one per stage")
    ends_on_one_rank = S > 1 and info.placement[0] == info.placement[S - 1]
    tie = data.draw(st.booleans(), "tied") and not (ends_on_one_rank and zero == 3)
    clip = data.draw(st.sampled_from([None, 0.05]), "max_grad_norm")
    event(f"{what} dp={dp} tp={tp} zero={zero}")
    cfg = tiny(dpkit, num_layers=L, tie_embeddings=tie,
               dropout=data.draw(st.sampled_from([0.0, 0.1]), "dropout"),
               seed=data.draw(st.integers(0, 2**16), "seed"))
    b = data.draw(st.integers(1, 2), "sequences per rank and micro-batch")
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dp * b, seed=cfg.seed)
    dims = (ParallelDims(dp_replicate=dp, pp=p, tp=tp) if zero == 0
            else ParallelDims(dp_shard=dp, pp=p, tp=tp))
    res = dpkit.composed_run(cfg, batches, dims, dpkit.OPT, zero=zero, sequence_parallel=sp,
                             max_grad_norm=clip, schedule=actions, microbatches=m, layers=layers)
    check(dpkit, dpkit.reference_tuple(cfg, batches, m, clip), res)


SPLIT_CASES = [  # (dims, zero, sequence parallel, schedule, chunks, W deferred)
    (ParallelDims(dp_replicate=2, pp=2, tp=2), 0, True, "1f1b", 1, True),
    (ParallelDims(dp_shard=2, pp=2, tp=2), 1, False, "interleaved_1f1b", 2, True),
    (ParallelDims(dp_shard=2, pp=2, tp=2), 3, True, "1f1b", 1, False),
    (ParallelDims(dp_shard=2, pp=4), 3, False, "gpipe", 1, True),
    (ParallelDims(dp_replicate=2, pp=2, tp=2), 0, False, "interleaved_1f1b", 2, False),
    (ParallelDims(dp_shard=2, pp=2, tp=2), 1, True, "v", 2, True),  # stages 0, 3 on rank 0
    (ParallelDims(dp_shard=2, pp=4), 2, False, "1f1b", 1, True),  # ZeRO-2 too
]  # the zero-bubble generators' schedules: ZERO_BUBBLE_GRID below


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dims, zero, sp, name, v, defer", SPLIT_CASES)
def test_fixed_split_backward_compositions(dpkit, dims, zero, sp, name, v, defer):
    """DDP, ZeRO-1 and ZeRO-3 each with tp = 2 (SP on and off) under a schedule whose
    backward is split here: GPipe, 1F1B or interleaved 1F1B with each B as I then W at
    once or every W deferred, or a V-shaped one (the first and last stages on pipeline
    rank 0, which reports the loss); ZeRO-2 on pp = 4; 4 micro-batches, tied embeddings,
    dropout and the clip active on every step."""
    m = 4
    cfg = tiny(dpkit, num_layers=9, tie_embeddings=True, dropout=0.1, seed=dims.world_size)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dims.dp, seed=cfg.seed)
    ref = dpkit.reference_tuple(cfg, batches, m, 0.05)
    assert all(n > 0.05 for n in ref[2])
    actions = (dpkit.v_shape(dims.pp, m, defer) if name == "v" else
               dpkit.split_backward(schedule(name, dims.pp, m, v), defer))
    check(dpkit, ref, dpkit.composed_run(cfg, batches, dims, dpkit.OPT, zero=zero,
                                         sequence_parallel=sp, max_grad_norm=0.05,
                                         schedule=actions, microbatches=m))


ZERO_BUBBLE = ("zb_h1", "zb_h2", "zbv", "dualpipev")
ENGINE = {0: "DDP", 1: "ZeRO-1", 3: "ZeRO-3"}
SP_OFF = {("zb_h1", 1), ("zb_h2", 3), ("zbv", 0), ("dualpipev", 3)}  # each row, each column
ZERO_BUBBLE_GRID = [  # (schedule, zero, pp, tp, sequence parallel)
    pytest.param(name, zero, 2, 2, (name, zero) not in SP_OFF,
                 id=f"{name}-{ENGINE[zero]}-pp2-tp2{'' if (name, zero) in SP_OFF else '-sp'}")
    for name in ZERO_BUBBLE for zero in ENGINE
] + [pytest.param("dualpipev", 0, 4, 1, False, id="dualpipev-DDP-pp4")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, zero, p, tp, sp", ZERO_BUBBLE_GRID)
def test_every_zero_bubble_schedule_with_dp_and_tp_trains_like_one_device(
        dpkit, name, zero, p, tp, sp):
    """Issue 14's grid, fixed: every zero-bubble generator (ZB-H1, ZB-H2, ZBV, DualPipeV
    with its pairs) by name through parallelize, under DDP, ZeRO-1 and ZeRO-3, dp = 2 and
    tp = 2 (SP on in 8 of the 12, off in one of each schedule's and at least one of each
    engine's) at pp = 2, a world of 8; and DualPipeV on pp = 4 with dp = 2 under DDP
    (world 8, tp = 1). m = 2p micro-batches (DualPipeV's least), 9 layers (uneven over
    the stages), dropout, the clip active on every step, tied embeddings except under
    ZeRO-3 with a V (refused tied: stages 0 and 2p - 1 share pipeline rank 0). Every
    rank's losses, the first step's gradients, the norm, the weights and Adam's m and v
    after 3 AdamW steps against one device's, at the file's tolerances."""
    m, dp = 2 * p, 2
    info = validate_schedule(schedule(name, p, m))
    v_shaped = name in ("zbv", "dualpipev")
    assert info.split_backward  # some backward as I and W, not only B
    assert info.stages == (2 * p if v_shaped else p)
    assert (info.placement[0] == info.placement[info.stages - 1]) == v_shaped
    tie = not (v_shaped and zero == 3)
    cfg = tiny(dpkit, num_layers=9, tie_embeddings=tie, dropout=0.1,
               seed=10 * ZERO_BUBBLE.index(name) + zero + p)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dp, seed=cfg.seed)
    ref = dpkit.reference_tuple(cfg, batches, m, 0.05)
    assert all(n > 0.05 for n in ref[2])
    dims = (ParallelDims(dp_replicate=dp, pp=p, tp=tp) if zero == 0
            else ParallelDims(dp_shard=dp, pp=p, tp=tp))
    check(dpkit, ref, dpkit.composed_run(cfg, batches, dims, dpkit.OPT, zero=zero,
                                         sequence_parallel=sp, max_grad_norm=0.05,
                                         schedule=name, microbatches=m))


SWEEP = [(name, p, v) for p in (1, 2, 4) for name, v in
         (("1f1b", 1), ("interleaved_1f1b", 2))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, v", SWEEP)
def test_every_schedule_and_pipeline_size_with_dp_2(dpkit, name, p, v):
    """The sweep a draw may miss: 1F1B and interleaved 1F1B (GPipe is in the draws and the
    fixed cases) on 1, 2 and 4 pipeline ranks (3 is in the draws) with dp = 2 under
    DDP, ZeRO-1 and ZeRO-3 in turn, tp = 2 with SP where the world stays <= 8, S + 1
    layers (uneven), m = 2p micro-batches, dropout on, tied unless ZeRO-3 holds both
    ends of the pipeline on one rank."""
    zero, tp = (0, 1, 3)[(p + 2 * v) % 3], 2 if p <= 2 else 1
    m, S = 2 * p, p * v
    cfg = tiny(dpkit, num_layers=S + 1, dropout=0.1, seed=p + 10 * v,
               tie_embeddings=not (p == 1 and S > 1 and zero == 3))
    batches = dpkit.global_batches(cfg, steps=3, global_batch=2 * m, seed=cfg.seed)
    dims = (ParallelDims(dp_replicate=2, pp=p, tp=tp) if zero == 0
            else ParallelDims(dp_shard=2, pp=p, tp=tp))
    check(dpkit, dpkit.reference_tuple(cfg, batches, m, 0.05),
          dpkit.composed_run(cfg, batches, dims, dpkit.OPT, zero=zero, sequence_parallel=tp > 1,
                             max_grad_norm=0.05, schedule=name, microbatches=m, chunks=v))


CASES = [  # (dims, engine and pipeline, layers): the compositions a draw may miss
    (ParallelDims(dp_shard=2, pp=2, tp=2), dict(zero=1, sequence_parallel=True,
                                                schedule="interleaved_1f1b", chunks=2), None),
    (ParallelDims(dp_shard=2, pp=2, tp=2), dict(zero=3, sequence_parallel=True,
                                                schedule="1f1b"), [1, 2]),
    (ParallelDims(dp_replicate=2, pp=4), dict(zero=0, schedule="gpipe"), [2, 0, 0, 1]),
    (ParallelDims(dp_shard=2, pp=4), dict(zero=2, schedule="1f1b"), None),
    (ParallelDims(dp_replicate=2, dp_shard=2, pp=2),
     dict(sharding_strategy=ShardingStrategy.HYBRID_SHARD, schedule="1f1b"), None),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dims, kw, layers", CASES)
def test_fixed_compositions_with_dropout_clipping_and_tied_embeddings(dpkit, dims, kw, layers):
    """dp x pp x tp = 2 x 2 x 2 under ZeRO-1 (interleaved) and ZeRO-3 (1F1B, uneven), an
    empty-stage pipeline under DDP, ZeRO-2 on pp = 4, HYBRID_SHARD (2 x 2) on pp = 2; 4
    micro-batches each, every mask on and the clip active on every step."""
    m = 4
    cfg = tiny(dpkit, num_layers=sum(layers) if layers else 5, tie_embeddings=True,
               dropout=0.1, seed=dims.world_size)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dims.dp, seed=cfg.seed)
    ref = dpkit.reference_tuple(cfg, batches, m, 0.05)
    assert all(n > 0.05 for n in ref[2])
    check(dpkit, ref, dpkit.composed_run(cfg, batches, dims, dpkit.OPT, max_grad_norm=0.05,
                                         microbatches=m, layers=layers, **kw))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, chunks", [("zb_h1", None), ("zb_h2", None), ("zbv", None),
                                          ("dualpipev", None), ("zbv", 2)])
def test_the_zero_bubble_schedules_by_name_train_like_one_device(dpkit, name, chunks):
    """parallelize(cfg, ParallelDims(pp=2), schedule=name, microbatches=4) with chunks left
    out (the schedule's own: 2 in a V) or given as the V's 2: one device's steps."""
    m = 4
    cfg = tiny(dpkit, num_layers=5, tie_embeddings=True, dropout=0.1, seed=7)
    batches = dpkit.global_batches(cfg, steps=2, global_batch=m, seed=cfg.seed)
    kw = {} if chunks is None else dict(chunks=chunks)
    check(dpkit, dpkit.reference_tuple(cfg, batches, m),
          dpkit.composed_run(cfg, batches, ParallelDims(pp=2), dpkit.OPT, schedule=name,
                             microbatches=m, **kw))


def refusal(dims, cfg, **kw) -> str:
    """The ValueError parallelize raises on rank 0 for these arguments."""
    def program(ctx):
        with pytest.raises(ValueError) as e:
            parallelize(cfg, dims, lr=1e-2, **kw)
        return str(e.value)
    return mp.launch(program, dims.world_size)[0]


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize("engine", [dict(zero=2), dict(zero=3),
                                    dict(sharding_strategy=ShardingStrategy.FULL_SHARD)])
def test_a_v_with_tied_embeddings_under_zero_2_or_3_is_refused_with_advice_that_fits(
        dpkit, name, engine):
    """A V puts stages 0 and 2p - 1 on pipeline rank 0: a tied wte sits in two of its units,
    which ZeRO-2/3 cannot hold. The advice names what fixes a V (untie, a one-stage-a-rank
    schedule, zero <= 1), not pp = 1's "chunks=1"."""
    dims = ParallelDims(dp_shard=2, pp=2)
    text = refusal(dims, cfg=tiny(dpkit, num_layers=4, tie_embeddings=True), schedule=name,
                   microbatches=4, **engine)
    for words in ("stages 0 and 3 on one pipeline rank both use wte",
                  "places both on pipeline rank 0, as a V does", "tie_embeddings=False",
                  "'1f1b', 'zb_h1' or 'zb_h2'", "zero=0 or 1"):
        assert words in text
    assert "chunks=1 at pp=1" not in text


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_a_v_refuses_other_chunk_counts_than_its_two(dpkit, name):
    text = refusal(ParallelDims(pp=2), cfg=tiny(dpkit, num_layers=4), schedule=name,
                   microbatches=4, chunks=1)
    assert f"{name!r} places two chunks on each rank in a V" in text
    assert "leave chunks out or pass chunks=2" in text
