"""Every (dp, pp, tp) layout of world <= 8, and a sample at 16, trains like one device.

The matrix: dp x pp x tp with dp·pp·tp <= 8 (38 layouts) crossed with the data-parallel
engines (DDP, ZeRO-1/2/3, FSDP's NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD), every
schedule of minipar.parallel.pp.SCHEDULES (or none at pp = 1), sequence parallelism, the
recompute modes (none, selective, full, segments of 2) and dropout, through `parallelize`.
Each run takes 3 AdamW steps (clipped in the draws) and is compared with one device
accumulating the same m global micro-batches in order.

Tolerances, float64 (tests/parallel/conftest.py's, as every equivalence test): losses
rtol 1e-12; the first step's gradients rtol 1e-12 + 1e-14 of the largest gradient;
weights, m and v after the last step rtol 1e-12 + 1e-11 of the largest of their kind.
The bfloat16 test states its own bound, measured (its docstring).
"""

import itertools

import numpy as np
import pytest
from hypothesis import assume, event, given, settings, strategies as st

import minipar as mp
from minipar.parallel import ParallelDims, ShardingStrategy, parallelize
from minipar.parallel.pp import SCHEDULES, ScheduleError, placement, schedule

S = ShardingStrategy
LAYOUTS = [(dp, pp, tp) for dp, pp, tp in itertools.product(range(1, 9), repeat=3)
           if dp * pp * tp <= 8]
ENGINES = {"ddp": dict(zero=0), "zero1": dict(zero=1), "zero2": dict(zero=2),
           "zero3": dict(zero=3), "no_shard": dict(sharding_strategy=S.NO_SHARD),
           "shard_grad_op": dict(sharding_strategy=S.SHARD_GRAD_OP),
           "full_shard": dict(sharding_strategy=S.FULL_SHARD),
           "hybrid_shard": dict(sharding_strategy=S.HYBRID_SHARD)}
RECOMPUTE = ("none", "selective", "full", "segments")
OPT = dict(lr=1e-2, weight_decay=0.1)


def dims_for(dp: int, pp: int, tp: int, engine: str) -> ParallelDims:
    """dp as the engine reads it: replicas (DDP, NO_SHARD), shards, or HYBRID_SHARD's
    shards inside replicas (dp_shard = 2 when dp is even)."""
    if engine in ("ddp", "no_shard"):
        return ParallelDims(dp_replicate=dp, pp=pp, tp=tp)
    if engine == "hybrid_shard" and dp % 2 == 0:
        return ParallelDims(dp_replicate=dp // 2, dp_shard=2, pp=pp, tp=tp)
    return ParallelDims(dp_shard=dp, pp=pp, tp=tp)


def config(kit, tp: int, layers: int, recompute: str, tie: bool, seed: int, dtype="float64"):
    """Sizes tp divides: heads (tp of them, 2 dimensions each), ffn, the vocabulary (about
    16) and the sequence (about 8, split under SP)."""
    heads = max(2, tp)
    return kit.tiny_config(vocab_size=tp * -(-16 // tp), seq_len=tp * -(-8 // tp),
                           hidden=2 * heads, num_heads=heads, ffn_hidden=2 * heads,
                           num_layers=layers, dropout=0.1, seed=seed,
                           tie_embeddings=tie, recompute=recompute, dtype=dtype,
                           recompute_segment=2 if recompute == "segments" else 1)


def compare(kit, ref, res, rtol=None, grad_atol=None, atol=None):
    """Every rank against one device; each parameter's state lives on some rank."""
    rtol = kit.RTOL if rtol is None else rtol
    grad_atol = kit.GRAD_ATOL_SCALE if grad_atol is None else grad_atol
    atol = kit.ATOL_SCALE if atol is None else atol
    ref_losses, ref_grads, _, ref_state = ref
    blocks = {}
    for losses, *_, where in res:
        blocks.setdefault((where["dp_replicate"], where["dp_shard"]), losses)
    kit.assert_close(np.mean(list(blocks.values()), axis=0), ref_losses, rtol=rtol,
                     atol_scale=0.0, what="losses")
    scale = max(float(np.abs(g).max()) for g in ref_grads.values())
    kind = lambda k: k.rsplit(".", 1)[1] if k.startswith("optim/") else "param"
    largest: dict = {}
    for key, a in ref_state.items():
        largest[kind(key)] = max(largest.get(kind(key), 0.0), float(np.abs(a).max()))
    held = set()
    for r, (_, grads, _, state, _) in enumerate(res):
        for name, g in grads.items():
            np.testing.assert_allclose(np.asarray(g, np.float64), ref_grads[name], rtol=rtol,
                                       atol=grad_atol * scale, err_msg=f"rank {r} grad {name}")
        for key, a in state.items():
            np.testing.assert_allclose(np.asarray(a, np.float64), ref_state[key], rtol=rtol,
                                       atol=atol * largest[kind(key)], err_msg=f"rank {r} {key}")
            held.add(key)
    assert held == set(ref_state)
    return len(held)


def pipeline_args(name, pp, m):
    """(parallelize's pipeline arguments, the schedule's actions), ({}, None) without a
    pipeline, or None if the schedule refuses (pp, m)."""
    if name is None:
        return {}, None
    try:
        return dict(schedule=name, microbatches=m), schedule(name, pp, m)
    except ScheduleError:
        return None


def run_case(kit, dp, pp, tp, engine, name, sp, recompute, tie, clip, seed, steps=3, m=None):
    """One cell of the matrix, compared with one device; returns how many state arrays
    were compared (all of one device's), or None if the schedule refuses (pp, m). m: pp micro-batches a step by default (2pp for DualPipeV,
    1 without a pipeline). A tied wte is untied where the engine cannot hold it in two
    units of one rank (parallelize refuses that, tested in test_pipeline.py)."""
    if m is None:
        m = 1 if name is None else 2 * pp if name == "dualpipev" else pp
    args = pipeline_args(name, pp, m)
    if args is None:
        return None
    pipe, actions = args
    where = placement(actions) if actions else {0: 0}
    stages = len(where)
    transient = engine in ("zero2", "zero3", "shard_grad_op", "full_shard", "hybrid_shard")
    tie = tie and not (stages > 1 and where[0] == where[stages - 1] and transient)
    cfg = config(kit, tp, stages + seed % 2, recompute, tie, seed)
    dims = dims_for(dp, pp, tp, engine)
    batches = kit.global_batches(cfg, steps=steps, global_batch=m * dp, seed=seed)
    return compare(kit, kit.reference_tuple(cfg, batches, m, clip),
                   kit.composed_run(cfg, batches, dims, OPT, sequence_parallel=sp,
                                    max_grad_norm=clip, **ENGINES[engine], **pipe))


@pytest.mark.timeout(300)
@settings(max_examples=4)
@given(data=st.data())
def test_any_layout_engine_schedule_sp_and_recompute_trains_like_one_device(dpkit, data):
    """A drawn cell of the matrix: a layout of world <= 8, an engine, a schedule (or none
    at pp = 1), SP, a recompute mode, m in {pp, 2pp}, tied or not, the clip on or off, a
    seed; 3 AdamW steps against one device."""
    dp, pp, tp = data.draw(st.sampled_from(LAYOUTS), "dp, pp, tp")
    engine = data.draw(st.sampled_from(list(ENGINES)), "engine")
    name = data.draw(st.sampled_from(list(SCHEDULES) + ([None] if pp == 1 else [])),
                     "schedule")
    sp = tp > 1 and data.draw(st.booleans(), "sequence parallel")
    recompute = data.draw(st.sampled_from(RECOMPUTE), "recompute")
    m = None if name is None else pp * data.draw(st.integers(1, 2), "micro-batches / pp")
    event(f"dp={dp} pp={pp} tp={tp} {engine} {name} sp={sp} {recompute}")
    done = run_case(dpkit, dp, pp, tp, engine, name, sp, recompute,
                    tie=data.draw(st.booleans(), "tied"),
                    clip=data.draw(st.sampled_from([None, 0.05]), "max_grad_norm"),
                    seed=data.draw(st.integers(0, 2**16), "seed"), m=m)
    assume(done is not None)  # DualPipeV refuses m = pp
    assert done >= 3 * 4  # compare() checked losses, gradients, >= 4 weights with m, v


WORLD_16 = [  # (dp, pp, tp, engine, schedule, SP, recompute)
    (2, 2, 4, "zero1", "interleaved_1f1b", True, "selective"),
    (4, 2, 2, "hybrid_shard", "zb_h1", True, "full"),
    (2, 4, 2, "ddp", "zb_h2", False, "segments"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dp, pp, tp, engine, name, sp, recompute", WORLD_16)
def test_a_sample_of_world_16_trains_like_one_device(dpkit, dp, pp, tp, engine, name, sp,
                                                     recompute):
    """16 ranks: 2 x 2 x 4 (ZeRO-1, interleaved 1F1B, SP, selective recompute), 4 x 2 x 2
    (HYBRID_SHARD 2 x 2, ZB-H1, SP, full recompute), 2 x 4 x 2 (DDP, ZB-H2, segments of
    2); tied, clipped, 2 steps."""
    assert dp * pp * tp == 16
    assert run_case(dpkit, dp, pp, tp, engine, name, sp, recompute, tie=True, clip=0.05,
                    seed=16, steps=2) is not None


def sweep_cell(i: int, layout) -> tuple:
    """Layout i's engine, schedule, SP and recompute mode, turning through each list at
    its own pace so that the 38 layouts meet every value of each."""
    dp, pp, tp = layout
    engine = list(ENGINES)[i % len(ENGINES)]
    names = list(SCHEDULES) if pp > 1 else [None] + list(SCHEDULES)
    return (engine, names[(i // 2) % len(names)], tp > 1 and i % 3 != 0,
            RECOMPUTE[(i // 3) % len(RECOMPUTE)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("i, layout", list(enumerate(LAYOUTS)),
                         ids=[f"dp{d}-pp{p}-tp{t}" for d, p, t in LAYOUTS])
def test_every_layout_of_world_at_most_8_trains_like_one_device(dpkit, i, layout):
    """Each of the 38 layouts once, its engine, schedule, SP and recompute mode turned
    through their lists (sweep_cell); one step (the gradients, then the weights, m and v
    after it; the draws take 3), m = pp, tied embeddings where the engine allows, dropout,
    no clip (the draws clip)."""
    engine, name, sp, recompute = sweep_cell(i, layout)
    m = run_case(dpkit, *layout, engine, name, sp, recompute, tie=True, clip=None,
                 seed=i, steps=1)
    if m is None:  # the schedule refuses pp and m = 2pp: the next one takes the cell
        m = run_case(dpkit, *layout, engine, "1f1b", sp, recompute, tie=True, clip=None,
                     seed=i, steps=1)
    assert m is not None


def adam_drift(lr: float, steps: int, betas=(0.9, 0.999)) -> float:
    """2 lr Σ_t C_t: how far two AdamW runs from the same weights can drift apart in
    `steps` steps whatever their gradients, C_t = sqrt(Σ_i a_i² / b_i) bounding
    |m̂_t| / sqrt(v̂_t) by Cauchy-Schwarz (a_i, b_i: the bias-corrected weights of g_i in
    m̂_t and of g_i² in v̂_t; eps only shrinks it). Decoupled decay shrinks the gap."""
    b1, b2 = betas
    total = 0.0
    for t in range(1, steps + 1):
        a = [b1 ** (t - i) * (1 - b1) / (1 - b1 ** t) for i in range(1, t + 1)]
        b = [b2 ** (t - i) * (1 - b2) / (1 - b2 ** t) for i in range(1, t + 1)]
        total += float(np.sqrt(sum(x * x / y for x, y in zip(a, b))))
    return 2 * lr * total


BF16 = [  # (dp, pp, tp, engine, schedule, SP, recompute)
    (2, 2, 2, "zero1", "1f1b", True, "selective"),
    (2, 1, 2, "ddp", None, False, "none"),
    (2, 2, 2, "hybrid_shard", "dualpipev", True, "full"),
    (4, 1, 1, "zero3", None, False, "segments"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp, pp, tp, engine, name, sp, recompute", BF16)
def test_bfloat16_layouts_stay_within_the_stated_bounds(dpkit, dp, pp, tp, engine, name, sp,
                                                        recompute):
    """bfloat16 with float32 masters (MixedPrecisionOptimizer's arithmetic, sharded by the
    engines), 3 clipped AdamW steps, against one bfloat16 device and one float64 device.

    Measured over 14 cells (7 layouts x 2 seeds, three of these among them): losses
    within 1.7e-4 (relative) of one bf16 device and 3.8e-4 of float64; first-step
    gradients within 2.6e-2 of the largest gradient of one bf16 device, 1.5e-1 of
    float64 (bf16 keeps 8 significant bits and every product and partial sum is rounded
    to them: reduction order alone moves a gradient element by a few of its ulps).

    Asserted: losses rtol 2^-8 = 3.9e-3 (bf16's unit roundoff, 10x the worst measured)
    against both; first-step gradients 0.1 (vs bf16) and 0.3 (vs float64) of the largest
    gradient, 2-4x the worst measured: a missing average (x dp) or a missing tp sum moves
    them by O(1) and fails; float32 masters after the steps within adam_drift(lr, 3) =
    0.060 of one bf16 device's, element by element — the one bound that holds whatever the
    rounding, since AdamW's update per step is bounded (near-zero gradients flip the sign
    of an element's update, and that happens; measured at most 0.015 here), and their
    mean absolute gap within drift / 40 = 1.5e-3 (measured at most 3.7e-4 here)."""
    m = 1 if name is None else 2 * pp if name == "dualpipev" else pp
    stages = 1 if name is None else 2 * pp if name in ("dualpipev", "zbv") else pp
    cfg = config(dpkit, tp, stages + 1, recompute, False, seed=3, dtype="bfloat16")
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * dp, seed=3)
    ref16 = dpkit.reference_tuple(cfg, batches, m, 0.05)
    ref64 = dpkit.reference_tuple(cfg.with_(dtype="float64"), batches, m, 0.05)
    pipe = {} if name is None else dict(schedule=name, microbatches=m)
    res = dpkit.composed_run(cfg, batches, dims_for(dp, pp, tp, engine), OPT,
                             sequence_parallel=sp, max_grad_norm=0.05, **ENGINES[engine],
                             **pipe)
    u = 2.0 ** -8
    blocks = {}
    for losses, *_, where in res:
        blocks.setdefault((where["dp_replicate"], where["dp_shard"]), losses)
    losses = np.mean(list(blocks.values()), axis=0)
    np.testing.assert_allclose(losses, ref16[0], rtol=u)
    np.testing.assert_allclose(losses, ref64[0], rtol=u)
    drift, gaps = adam_drift(OPT["lr"], 3), []
    for r, (_, grads, _, state, _) in enumerate(res):
        for ref, share in ((ref16, 0.1), (ref64, 0.3)):
            scale = max(float(np.abs(g).max()) for g in ref[1].values())
            for k, g in grads.items():
                np.testing.assert_allclose(np.asarray(g, np.float64), ref[1][k], rtol=0,
                                           atol=share * scale, err_msg=f"rank {r} grad {k}")
        for k, a in state.items():
            if k.endswith(".master"):
                gap = np.abs(a.astype(np.float64) - ref16[3][k])
                assert gap.max() <= drift, (r, k, gap.max())
                gaps.append(gap)
    assert gaps and np.mean(np.concatenate([g.ravel() for g in gaps])) <= drift / 40


def test_float16_is_refused_by_parallelize_with_the_way_out(dpkit):
    """float16 needs loss scaling, which no data-parallel engine implements: refused before
    anything is built, on every layout (a pipeline rank without parameters too)."""
    cfg = config(dpkit, 1, 2, "none", False, seed=0, dtype="float16")

    def program(ctx):
        with pytest.raises(ValueError, match="use dtype='bfloat16'"):
            parallelize(cfg, ParallelDims(pp=2), schedule="1f1b", microbatches=2, **OPT)
    mp.launch(program, 2)
