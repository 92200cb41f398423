"""Grader for lesson 02: your data-parallel pieces against one device and against minipar's
DistributedDataParallel, on tiny float64 GPTs and simulated ranks.

Every check that takes a group runs on a 2-D mesh (your data-parallel group is its
consecutive or its strided dimension, and every group has its own batch), with rendezvous
sends; the references come from the grader's own copy of the inputs. Exercise 2.5 is
graded on the ledger and the simulated clock of lesson.py, section 6.
"""

from functools import lru_cache

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.expect import constant_ratio
from minipar.course.grading import (SETTINGS, GradeFailure, calls, exercise, expect_close,
                                    expect_equal, expect_within, mesh_of, on_mesh,
                                    world_sizes)
from minipar.data import split_data_parallel
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import DistributedDataParallel
from minipar.viz.timeline import measure

MIB, US = 2**20, 1e-6
SUMMED = "summed over the group where the mean was wanted: use op 'avg' (or divide by n)"
ADDED = "the micro-batch losses were added, not averaged"


def tiny(layers: int, tied: bool = False, dtype: str = "float64", hidden: int = 8,
         vocab: int = 16, seq: int = 8) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, seq_len=seq, hidden=hidden, num_heads=2,
                     num_layers=layers, tie_embeddings=tied, dtype=dtype)


def batch(cfg: GPTConfig, columns: int, seed: int):
    """(ids, targets), each [s, columns], from the seed."""
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, cfg.vocab_size, (2, cfg.seq_len, columns)))


def one_device(cfg: GPTConfig, ids, targets):
    """(loss, {name: gradient}) of one device on the whole batch."""
    with mp.device():
        model = GPT(cfg)
        loss = model.loss_and_grad(ids, targets)
        return loss, {p.name: p.grad.copy() for p in model.parameters()}


def cuts(columns: int, seed: int, most: int = 4) -> list[int]:
    """Random sizes (>= 1, at most `most` of them) that add up to `columns`."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, min(columns, most) + 1))
    inner = sorted(rng.choice(np.arange(1, columns), k - 1, replace=False)) if k > 1 else []
    edges = [0, *map(int, inner), columns]
    return [b - a for a, b in zip(edges, edges[1:])]


def dp_mesh(size: int, strided: bool):
    """(shape, names, "dp") of a 2-D mesh whose dp groups have `size` ranks: consecutive
    ranks, or (strided) ranks 2 apart; the other dimension, tp, holds the other dp group."""
    return mesh_of(size, 2, strided, names=("dp", "tp") if strided else ("tp", "dp"))


def which_group(spmd) -> int:
    """The index of this rank's data-parallel group among the mesh's groups along dim."""
    return next(i for i, g in enumerate(spmd.mesh.groups(spmd.dim)) if spmd.global_rank in g)


def check_group_of(events, spmd, what: str) -> None:
    """GradeFailure if a collective ran on ranks other than this rank's group."""
    mine = tuple(spmd.group.ranks)
    for e in events:
        if e.stream == "comm" and e.group is not None and tuple(e.group) != mine:
            whole = " (the whole world)" if len(e.group) == spmd.mesh.size else ""
            raise GradeFailure(
                f"{spmd.words}: {what} ran {e.name} over ranks {list(e.group)}{whole}, not "
                f"over its group {list(mine)}: the other ranks train on other data (or hold "
                "other shards). Pass the group to every collective (group=group, or "
                "process_group=group for an engine)")


def forward_starts(ctx, model) -> list[float]:
    """A list that fills with the clock's time at the start of each of model's forwards."""
    starts: list[float] = []
    model.hooks.register("forward_pre",
                         lambda unit: starts.append(ctx.clock.now) if unit == "root" else None)
    return starts


def traced(ctx, spmd, fn, *args, names=None):
    """calls(ctx, fn, *args) and the trace events it added on this rank."""
    start = len(ctx.trace.events)
    call = calls(ctx, fn, *args, names=names, rank=spmd.words)
    return call, ctx.trace.events[start:]


# ---- 2.1 -----------------------------------------------------------------------------
@exercise("2.1", "average every parameter's gradient over the group")
@SETTINGS
@given(size=world_sizes(1, 4, first=2), strided=st.booleans(), per_rank=st.integers(1, 3),
       layers=st.integers(1, 2), tied=st.booleans(), seed=st.integers(0, 2**16))
def check_all_reduce_gradients(impl, size, strided, per_rank, layers, tied, seed):
    cfg = tiny(layers, tied)
    shape, names, dim = dp_mesh(size, strided)
    data = [batch(cfg, size * per_rank, seed + g) for g in range(2)]  # each group's batch
    expected = [one_device(cfg, *d)[1] for d in data]

    def program(ctx, spmd):
        g = which_group(spmd)
        model = GPT(cfg)
        model.loss_and_grad(*split_data_parallel(*data[g], spmd.rank, size))  # [s, per_rank]
        own = {p.name: p.grad.copy() for p in model.parameters()}  # this shard's gradient
        call, events = traced(ctx, spmd, lambda: impl.all_reduce_gradients(model, spmd.group))
        check_group_of(events, spmd, "all_reduce_gradients")
        if size > 1 and not call.collectives:
            raise GradeFailure(f"{spmd.words}: all_reduce_gradients ran no collective, so each "
                               "rank kept the gradient of its own shard")
        if size > 1 and all(np.array_equal(p.grad, own[p.name]) for p in model.parameters()):
            raise GradeFailure(
                f"{spmd.words}: after all_reduce_gradients every p.grad still holds this "
                f"rank's own gradient, although {', '.join(sorted(set(call.collectives)))} "
                "ran: minipar's collectives return a new array and leave their input alone "
                "(unlike torch.distributed.all_reduce, which works in place); store the "
                "result in p.grad")
        for p in model.parameters():
            c = constant_ratio(p.grad, expected[g][p.name])
            halved = c is not None and size > 2 and np.isclose(c, size / 2)
            expect_close(p.grad, expected[g][p.name], rank=spmd.words, n=size,
                         what=f"{p.name}.grad after all_reduce_gradients(model, "
                              f"group={list(spmd.group.ranks)})",
                         ratios={"2": SUMMED, "n": SUMMED,
                                 "1/2": "divided by the world's size where the group's was "
                                        "meant: the mesh has twice the group's ranks"},
                         hint=(f"that is n/2 (n = {size}): the sum was divided by 2, not by "
                               "the group's size" if halved else
                               f"each rank's gradient must become the mean over the {size} "
                               "rank(s) of the group, written into p.grad"))

    on_mesh(program, shape, names, dim)


# ---- 2.2 -----------------------------------------------------------------------------
def sizes_of(cfg: GPTConfig) -> list[int]:
    """Bytes of each parameter, listed unit by unit in model.units() order."""
    with mp.device():
        return [int(p.data.nbytes) for _, ps in GPT(cfg).units() for p in ps]


def ddp_buckets(cfg: GPTConfig, cap_bytes: float):
    """What DistributedDataParallel does with this cap: (its buckets as indices in units()
    order, each one's units, the backward_post order, `Bucket.launched_after` of each)."""
    with mp.device():
        model = GPT(cfg)
        params = [p for _, ps in model.units() for p in ps]
        index = {p.name: i for i, p in enumerate(params)}
        ddp = DistributedDataParallel(model, AdamW, bucket_cap_mb=cap_bytes / MIB)
        buckets = [[index[p.name] for p in b.flat.params] for b in ddp.buckets]
        units = [sorted(b.units) for b in ddp.buckets]
        order = []  # the units in the order their backward_post fired
        model.hooks.register("backward_post", order.append)
        model.loss_and_grad(*batch(cfg, 2, 0))
        return buckets, units, order, [b.launched_after for b in ddp.buckets]


MODELS = st.builds(tiny, layers=st.integers(1, 4), tied=st.booleans(),
                   dtype=st.sampled_from(["float64", "float32"]),
                   hidden=st.sampled_from([4, 8, 12]), vocab=st.integers(3, 20),
                   seq=st.integers(2, 8))


def cap_for(sizes: list[int], pick: int, exact: bool) -> float:
    """A cap in bytes: exactly what the last j parameters hold (a bucket boundary), or any
    number, not always whole, up to a little more than the whole model."""
    if exact:
        return int(np.cumsum(sizes[::-1])[pick % len(sizes)])
    return 1 + pick % (sum(sizes) + 64) + (pick % 7) / 8


@exercise("2.2", "DDP's bucket assignment")
@SETTINGS
@given(cfg=MODELS, pick=st.integers(0, 10**6), exact=st.booleans())
def check_make_buckets(impl, cfg, pick, exact):
    sizes = sizes_of(cfg)
    cap = cap_for(sizes, pick, exact)
    expected = ddp_buckets(cfg, cap)[0]
    got = impl.make_buckets(list(sizes), cap)
    got = [list(map(int, b)) for b in got] if isinstance(got, (list, tuple)) else got
    what = f"make_buckets({sizes}, cap_bytes={cap:g})"
    if isinstance(got, list) and sorted(i for b in got for i in b) != list(range(len(sizes))):
        raise GradeFailure(f"{what}: the buckets must hold every index 0..{len(sizes) - 1} "
                           f"exactly once, but received {got}")
    if got and got[0] and got[0][0] != expected[0][0]:
        raise GradeFailure(f"{what}: the first bucket starts with index {got[0][0]}, expected "
                           f"{expected[0][0]}: it holds what backward finishes first (section "
                           "3, step 1)")
    expect_equal(got, expected, what=what,
                 hint="a bucket is closed as soon as it holds at least cap_bytes; the "
                      "parameter that crosses the cap belongs to it (section 3, step 2)")


# ---- 2.3 -----------------------------------------------------------------------------
def synthetic(seed: int):
    """Made-up units, a backward order and buckets (not contiguous, in any order):
    (bucket_units, backward_order, the rule applied by the grader to its own copy)."""
    rng = np.random.default_rng(seed)
    order = [f"u{i}" for i in rng.permutation(int(rng.integers(1, 7)))]
    buckets = [sorted(map(str, rng.choice(order, rng.integers(1, len(order) + 1), False)))
               for _ in range(int(rng.integers(1, 5)))]
    position = {u: i for i, u in enumerate(order)}
    launched, last = [], 0
    for units in buckets:  # every unit done, and never before the bucket ahead of it
        last = max([last] + [position[u] for u in units])
        launched.append(order[last])
    return buckets, order, launched


@exercise("2.3", "the backward_post at which each bucket is launched")
@SETTINGS
@given(cfg=MODELS, pick=st.integers(0, 10**6), exact=st.booleans(), general=st.booleans(),
       seed=st.integers(0, 2**16))
def check_launch_after(impl, cfg, pick, exact, general, seed):
    if general:
        units, order, expected = synthetic(seed)
    else:
        _, units, order, expected = ddp_buckets(cfg, cap_for(sizes_of(cfg), pick, exact))
    got = impl.launch_after([list(u) for u in units], list(order))
    got = list(got) if isinstance(got, tuple) else got
    what = f"launch_after({units}, {order})"
    if isinstance(got, list) and len(got) == len(expected) and set(got) <= set(order):
        for j, (g, e) in enumerate(zip(got, expected)):
            at, own = order.index(g), max(order.index(u) for u in units[j])
            if at < own:
                why = (f"bucket {j} would go out after {g!r}, but it also holds the gradients "
                       f"of {order[own]!r}, whose backward finishes later")
            elif at != order.index(e):
                why = (f"bucket {j}'s own units are done after {g!r}, but the bucket ahead of "
                       "it goes out later: buckets go out in their order, a bucket never "
                       "before the one ahead of it" if at < order.index(e) else
                       f"bucket {j} waits until {g!r}, but it could go out at {e!r}: DDP "
                       "launches a bucket at the first backward_post at which it may go out")
            else:
                continue
            raise GradeFailure(f"{what}: expected {expected!r} but received {got!r}; {why} "
                               "(section 3, step 3)")
    expect_equal(got, expected, what=what,
                 hint="one unit name per bucket, in the buckets' order (section 3, step 3)")


# ---- 2.4 -----------------------------------------------------------------------------
@exercise("2.4", "gradient accumulation with the right loss scale")
@SETTINGS
@given(size=world_sizes(1, 3, first=2), strided=st.booleans(), per_rank=st.integers(1, 6),
       layers=st.integers(1, 2), cap_mb=st.sampled_from([25.0, 0.004, 0.001]),
       seed=st.integers(0, 2**16))
def check_accumulate(impl, size, strided, per_rank, layers, cap_mb, seed):
    cfg = tiny(layers)
    shape, names, dim = dp_mesh(size, strided)
    data = [batch(cfg, size * per_rank, seed + g) for g in range(2)]  # each group's batch
    expected = [one_device(cfg, *d)[1] for d in data]
    blocks = [[split_data_parallel(*d, r, size) for r in range(size)] for d in data]
    block_loss = [[one_device(cfg, *b)[0] for b in bs] for bs in blocks]
    use_engine = size > 1

    def program(ctx, spmd):
        g = which_group(spmd)
        model = GPT(cfg)
        engine = (DistributedDataParallel(model, AdamW, process_group=spmd.group,
                                          bucket_cap_mb=cap_mb) if use_engine else None)
        x, y = blocks[g][spmd.rank]  # [s, per_rank]
        sizes = cuts(per_rank, seed + 7 * spmd.global_rank)  # rank-dependent, unequal sizes
        edges = np.cumsum([0] + sizes)
        micro = [(x[:, a:b].copy(), y[:, a:b].copy()) for a, b in zip(edges, edges[1:])]
        what = (f"accumulate(model, micro-batches of {sizes} sequences"
                + (", engine=DistributedDataParallel(...))" if use_engine else ")"))

        forwards = forward_starts(ctx, model)

        def accumulate(micro_batches):
            return impl.accumulate(model, micro_batches, engine)

        call, events = traced(ctx, spmd, accumulate, micro, names=["micro_batches"])
        if use_engine:  # the count first: it names the bug the values only hint at
            buckets, k = len(engine.buckets), len(sizes)
            runs = sum(e.name == "all_reduce" for e in events)
            why = {0: "no all-reduce ran: every micro-batch stayed inside no_sync(), so the "
                      "gradients were never averaged; the last backward must run outside it",
                   k * buckets: f"every one of the {k} micro-batches all-reduced: those "
                                "before the last can run inside no_sync()"}
            expect_equal(runs, buckets, rank=spmd.words,
                         what=f"all-reduces issued by {what} with {buckets} bucket(s)",
                         hint=why.get(runs, "one all-reduce per bucket per step, whatever "
                                            "the number of micro-batches"))
            check_group_of(events, spmd, "accumulate")
            last = forwards[-1] if forwards else float("inf")
            early = [e for e in events if e.name == "all_reduce" and e.end <= last]
            if early:
                raise GradeFailure(
                    f"{spmd.words}: {what}: {len(early)} of the {runs} all-reduce(s) ran "
                    f"before the last of the {len(forwards)} micro-batches began, so the "
                    "gradients of the micro-batches after them were never averaged over the "
                    "group: only the last backward may communicate")
        grads = engine.full_grads() if use_engine else {p.name: p.grad for p in
                                                        model.parameters()}
        for name, e in expected[g].items():
            expect_close(grads[name], e, rank=spmd.words, what=f"{name}.grad after {what}",
                         n=len(sizes), ratios={"n": ADDED, "2": ADDED},
                         hint=f"these micro-batches hold {sizes} sequences: the sum of their "
                              "gradients must be the whole batch's gradient, each weighed "
                              "by its part of the batch (equal weights are right for equal "
                              "sizes only)")
        expect_close(call.result, block_loss[g][spmd.rank], rank=spmd.words,
                     what=f"the loss {what} returned",
                     hint="return the mean loss of all the rank's sequences, each "
                          "micro-batch's mean weighed by its part of them")

    on_mesh(program, shape, names, dim)


# ---- 2.5 -----------------------------------------------------------------------------
BUDGET_CFG = GPTConfig(vocab_size=64, seq_len=32, hidden=128, num_heads=4, num_layers=4)
MAX_SEQUENCES, EXPOSED_BUDGET = 16, 9.5 * US  # lesson.py, section 6
NODE = mp.Topology.nodes(1, gpus_per_node=4)  # the 2 x 2 mesh: four H100s on NVLink
SCENARIOS = ((24, False), (16, True))  # (sequences per rank, whether the group is strided)


@lru_cache(maxsize=None)
def shard(sequences: int, part: int):
    """One device, one forward and backward of BATCH's part-th block of `sequences`:
    (its gradients, its compute time, the activations it held)."""
    with mp.device() as ctx:
        model = GPT(BUDGET_CFG)
        ctx.ledger.reset_peak()
        model.loss_and_grad(*(a[:, part * sequences:(part + 1) * sequences] for a in BATCH))
        return ({p.name: p.grad.copy() for p in model.parameters()},
                measure(ctx.trace.events, 1)[0].compute, ctx.ledger.peak("activations"))


BATCH = batch(BUDGET_CFG, 2 * max(s for s, _ in SCENARIOS), 100)  # [s, 48]: every group's


def over_budget_why(events, forwards: list[float], t) -> str:
    """What the clock says about where the exposed communication came from."""
    comm = [e for e in events if e.stream == "comm" and e.name != "broadcast"]
    early = [e for e in comm if e.end <= forwards[-1]]
    if early:
        return (f"{len(early)} all-reduce(s) ran before the last of this rank's {len(forwards)} "
                f"forwards began ({sum(e.duration for e in early) / US:.2f} µs): only the "
                "last backward's gradients need to travel")
    end = max(e.end for e in events if e.stream == "compute")
    tail = max([end] + [e.end for e in comm]) - end
    return (f"{len(comm)} all-reduce(s), {t.comm / US:.2f} µs of communication, "
            f"{t.overlap / US:.2f} µs of it under compute and {tail / US:.2f} µs after the "
            "compute ended. What starts only when the last backward ends cannot hide, and "
            "every all-reduce pays its latencies besides its bytes (sections 3, 4 and 6)")


@exercise("2.5", "a step under a memory and a time budget")
@SETTINGS
@given(scenario=st.sampled_from(SCENARIOS))
def check_budgeted_step(impl, scenario):
    per_rank, strided = scenario
    (g0, compute, _), (g1, _, _) = shard(per_rank, 0), shard(per_rank, 1)
    expected = {name: (g0[name] + g1[name]) / 2 for name in g0}  # the pair's batch (section 1)
    # activations are proportional to the sequences (tests/course/lessons/test_lesson_02.py)
    activations = shard(per_rank, 0)[2] * MAX_SEQUENCES / per_rank  # what 16 sequences hold
    shape, names, dim = dp_mesh(2, strided)
    data = tuple(a[:, :2 * per_rank] for a in BATCH)  # both groups' batch: [s, 2·per_rank]

    def program(ctx, spmd):
        model = GPT(BUDGET_CFG)
        ids, targets = split_data_parallel(*data, spmd.rank, spmd.size)  # [s, per_rank]
        forwards = forward_starts(ctx, model)
        ctx.ledger.reset_peak()

        def budgeted_step(ids, targets):
            return impl.budgeted_step(model, ids, targets, spmd.group, MAX_SEQUENCES)

        _, events = traced(ctx, spmd, budgeted_step, ids, targets, names=["ids", "targets"])
        what = f"budgeted_step on {per_rank} sequences a rank"
        expect_within(ctx.ledger.peak("activations") / MIB, activations / MIB, unit="MiB",
                      rank=spmd.words, what=f"the peak of activations on the ledger in {what}",
                      hint=f"a forward's activations stay on the ledger until its backward "
                           f"has used them; this rank ran {len(forwards)} forward(s), and the "
                           f"budget is what {MAX_SEQUENCES} sequences hold")
        check_group_of(events, spmd, "budgeted_step")
        if not any(e.stream == "comm" and e.name != "broadcast" for e in events):
            raise GradeFailure(f"{spmd.words}: {what} ran no gradient communication, so each "
                               "rank kept the gradient of its own sequences: is every "
                               "backward inside no_sync()?")
        for p in model.parameters():
            expect_close(p.grad, expected[p.name], rank=spmd.words, n=spmd.size,
                         what=f"{p.name}.grad after {what}", ratios={"2": SUMMED, "n": SUMMED},
                         hint="every p.grad must hold the gradient of the mean loss over "
                              "all the group's sequences (micro-batches of different sizes: "
                              "they weigh differently, section 5)")
        first = min(e.start for e in events if e.stream == "compute")
        t = measure(ctx.trace.events, ctx.world_size, start=first)[ctx.rank]
        expect_within((t.window - compute) / US, EXPOSED_BUDGET / US, unit="µs",
                      rank=spmd.words, what=f"the time {what} lasted beyond its "
                      f"{compute / US:.2f} µs of compute (the step took {t.window / US:.2f} µs)",
                      hint=over_budget_why(events, forwards, t))

    on_mesh(program, shape, names, dim, topology=NODE)
