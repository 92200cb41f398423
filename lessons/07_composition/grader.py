"""Grader for lesson 07: your rank -> groups arithmetic against ParallelGroups on every rank
of hypothesis-drawn layouts (world up to 64, tp fastest); your placed layout trained for
one step on the simulated cluster: the ledger's peak against the memory budget, the
trace's inter-node bytes against the cross-node budget, and the loss against one device's;
and your pipeline's cross-node bytes against the sends a run's trace records."""

import numpy as np
from hypothesis import assume, given, strategies as st

import minipar as mp
from minipar.course.grading import learner
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_within, on_ranks, world_sizes)
from minipar.nn import GPT, GPTConfig
from minipar.parallel import ParallelDims, ParallelGroups, parallelize
from minipar.parallel.tp import check_tensor_parallel
from minipar.programs.incidents.tp_across_nodes import inter_node_bytes

NAMES = ("tp", "dp", "pp")



# ---- exercise 7.1: a rank's groups from its coordinates -----------------------------------

def stride_words(dims: ParallelDims) -> str:
    return (f"rank = tp_rank + tp·(dp_rank + dp·pp_rank): tp varies fastest (stride 1), dp "
            f"next (stride tp = {dims.tp}), pp slowest (stride tp·dp = {dims.tp * dims.dp})")


def diagnose(name: str, got: list, want: list, dims: ParallelDims) -> str:
    """The most specific reason a group is wrong."""
    if len(got) != len(want):
        return (f"a {name} group holds {name} = {len(want)} ranks, not {len(got)}"
                + (" (dp is dp_replicate x dp_shard: both data-parallel dimensions)"
                   if name == "dp" else ""))
    steps = sorted({b - a for a, b in zip(got, got[1:])})
    stride = {"tp": 1, "dp": dims.tp, "pp": dims.tp * dims.dp}[name]
    if name == "tp" and steps != [1]:
        return "your tp group is not consecutive ranks: tp varies fastest, so its ranks " \
               "are neighbours (inside a node)"
    if name == "dp" and steps == [1]:
        return "your dp group is consecutive ranks, as if dp varied fastest: in the order " \
               f"tp-cp-ep-dp-pp tp does, and dp's stride is tp = {dims.tp}"
    if name == "dp" and steps == [dims.tp * dims.pp]:
        return f"your dp group steps by tp·pp = {dims.tp * dims.pp}: the strides of dp and " \
               f"pp are swapped (pp is slowest, dp's stride is tp = {dims.tp})"
    if name == "pp" and steps == [dims.tp]:
        return f"your pp group steps by tp = {dims.tp}: the strides of dp and pp are swapped " \
               f"(pp's stride is tp·dp = {stride})"
    if name == "pp" and len(steps) == 1:
        return f"your pp group steps by {steps[0]}; pp's stride is tp·dp = {stride}"
    return f"the {name} group's stride is {stride}"


@exercise("7.1", "a rank's groups from its coordinates")
@SETTINGS
@given(tp=world_sizes(1, 4, first=2), dp_shard=world_sizes(1, 4, first=2),
       dp_replicate=world_sizes(1, 2, first=2), pp=world_sizes(1, 4, first=2))
def check_groups_of(impl, tp, dp_shard, dp_replicate, pp):
    dims = ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, pp=pp, tp=tp)
    assume(dims.world_size <= 64)

    def program(ctx):
        groups = ParallelGroups(dims)
        want = {n: list(getattr(groups, n).ranks) for n in NAMES}
        what = f"groups_of({ctx.rank}, {dims})"
        try:
            got = learner(what, impl.groups_of, ctx.rank, dims)
        except GradeFailure as e:
            return str(e)
        if not isinstance(got, dict) or sorted(got) != sorted(NAMES):
            return f"{what} returned {got!r:.100}; expected a dict with the keys tp, dp, pp"
        where = ", ".join(f"{n}={c}" for n, c in groups.coordinate.items() if dims.sizes()[n] > 1)
        for name in NAMES:
            mine = got[name]
            if not isinstance(mine, (list, tuple)) or not all(
                    isinstance(r, (int, np.integer)) for r in mine):
                return f"{what}[{name!r}] is {mine!r:.80}; expected a list of global ranks"
            mine = [int(r) for r in mine]
            if mine != want[name]:
                sorted_note = " (sort the ranks)" if sorted(mine) == want[name] else ""
                return (f"{what}: the {name} group of rank {ctx.rank} (at {where or 'one rank'})"
                        f" is {want[name]}, received {mine}{sorted_note}. "
                        f"{diagnose(name, mine, want[name], dims)}. {stride_words(dims)}")
        return None

    failures = on_ranks(program, dims.world_size)
    for message in failures:
        if message:
            raise GradeFailure(message)  # the lowest failing rank, the same every run


# ---- exercise 7.2: a layout placed under a memory and a cross-node budget ---------------

MODEL = GPTConfig(vocab_size=32, seq_len=8, hidden=32, num_heads=4, num_layers=4, seed=0)
#: (name, topology, global batch, memory budget, cross-node budget), bytes
SCENARIOS = (
    ("2 nodes of 4 GPUs, 12 sequences a step", mp.Topology.nodes(2, 4), 12, 650_000,
     150_000),
    ("4 nodes of 2 GPUs, 12 sequences a step", mp.Topology.nodes(4, 2), 12, 650_000,
     400_000),
)


def read_plan(plan, name: str, topo: mp.Topology, batch: int):
    keys = ["dims", "microbatches", "zero"]
    if not isinstance(plan, dict) or sorted(plan) != keys:
        raise GradeFailure(f"{name}: place_layout(...) returned {plan!r:.100}; expected a "
                           f"dict with the keys {keys}")
    dims, zero, m = plan["dims"], plan["zero"], plan["microbatches"]
    if not isinstance(dims, ParallelDims):
        raise GradeFailure(f"{name}: plan['dims'] is {dims!r:.80}; expected a ParallelDims")
    if dims.world_size != topo.world_size:
        raise GradeFailure(f"{name}: {dims} covers {dims.world_size} ranks; the cluster has "
                           f"{topo.world_size} GPUs: use every one")
    if zero not in (0, 1, 2) or not isinstance(m, (int, np.integer)) or m < 1:
        raise GradeFailure(f"{name}: zero = {zero!r} and microbatches = {m!r}; expected a "
                           f"ZeRO stage 0, 1 or 2 and a positive integer")
    if batch % dims.dp or (dims.pp > 1 and (batch % m or (batch // m) % dims.dp)):
        raise GradeFailure(
            f"{name}: the batch is not divisible: {batch} sequences over dp = {dims.dp}"
            + (f" in m = {m} micro-batches (B/m = {batch / m:g} per micro-batch, split over "
               f"dp)" if dims.pp > 1 else "") + ": every dp rank trains on an equal block "
            "of whole sequences; choose dp (and m) dividing the batch")
    try:
        check_tensor_parallel(MODEL, dims.tp)
    except ValueError as e:
        raise GradeFailure(f"{name}: tp = {dims.tp} cannot split the model: {e}") from None
    return dims, int(zero), int(m)


def trained(dims: ParallelDims, zero: int, m: int, topo: mp.Topology, batch: int):
    """One step on the simulated cluster: per rank (loss, peak bytes, cross-node bytes by
    group name, tp group)."""
    rng = np.random.default_rng(7)
    ids = rng.integers(0, MODEL.vocab_size, (MODEL.seq_len, batch))  # [s, B]
    targets = np.roll(ids, -1, axis=0)

    def program(ctx):
        run = parallelize(MODEL, dims, zero=zero, lr=1e-3, placement="any",
                          **({"microbatches": m} if dims.pp > 1 else {}))
        first = len(ctx.trace.events)
        ctx.ledger.reset_peak()
        loss = run.train_step(ids, targets)
        ctx.resolve_pending()
        crossing: dict[str, float] = {}
        for e in ctx.trace.events[first:]:
            b = inter_node_bytes(e, topo) if e.stream == "comm" else float(
                e.meta.get("sent_bytes", 0)) if (
                e.stream == "p2p" and e.meta.get("link") == topo.inter.name) else 0.0
            key = "pp sends" if e.stream == "p2p" else e.label
            crossing[key] = crossing.get(key, 0.0) + b
        return loss, ctx.ledger.peak(), crossing, run.groups.tp.ranks

    try:
        res = mp.launch(program, dims.world_size, topology=topo)
    except Exception as e:  # noqa: BLE001 (a layout parallelize refuses)
        raise GradeFailure(f"{dims} with zero = {zero}, m = {m} cannot be trained: {e}") from None
    with mp.device():
        want = GPT(MODEL).loss_and_grad(ids, targets)
    return res, want


@exercise("7.2", "a layout placed under a memory and a cross-node budget")
def check_place_layout(impl):
    for name, topo, batch, memory, cross in SCENARIOS:
        plan = learner(f"place_layout on {name}", impl.place_layout, MODEL, topo, batch,
                       memory, cross)
        dims, zero, m = read_plan(plan, name, topo, batch)
        res, want = trained(dims, zero, m, topo, batch)
        layout = f"{dims} with zero = {zero}" + (f", m = {m}" if dims.pp > 1 else "")
        spans = sorted({topo.node_of(r) for r in res[0][3]})
        by_group: dict[str, float] = {}
        for r in res:
            for k, v in r[2].items():
                by_group[k] = by_group.get(k, 0.0) + v
        total = sum(by_group.values())
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(by_group.items()) if v)
        peak = max(r[1] for r in res)
        expect_within(peak, memory, unit="bytes", what=f"{name}: the peak of {layout} on the "
                      f"busiest GPU's ledger during a step",
                      hint="over memory: ZeRO-1/2 shard the optimizer states (and gradients) "
                           "over dp_shard; tp and pp split the parameters")
        hint = (f"the tp group {list(res[0][3])} spans nodes {spans}: tensor parallelism "
                f"all-reduces activations 4 times a layer and belongs inside a node; "
                if len(spans) > 1 else "") + (
            f"by group: {parts}. Gradients all-reduced across nodes weigh the whole model; "
            f"pipeline sends only a micro-batch's activations at a stage boundary")
        expect_within(total, cross, unit="bytes", what=f"{name}: the bytes {layout} puts on "
                      f"inter-node links in one step (all GPUs, from the trace)", hint=hint)
        dp_losses = [r[0] for r in res]  # each dp block's mean, tp x pp ranks each
        expect_close(float(np.mean(dp_losses)), want, rtol=1e-10,
                     what=f"{name}: the loss of {layout}, one step on the simulated cluster",
                     hint="a 3-D layout trains the model one device trains")


# ---- exercise 7.3: the bytes a pipeline sends across nodes ---------------------------------

SMALL = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=4, seed=1)


def sent_across(dims: ParallelDims, topo: mp.Topology, batch: int, m: int) -> tuple:
    """(inter-node bytes of the pipeline's sends, all of them), summed over GPUs, one step."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, SMALL.vocab_size, (SMALL.seq_len, batch))  # [s, B]
    targets = np.roll(ids, -1, axis=0)

    def program(ctx):
        run = parallelize(SMALL, dims, microbatches=m, lr=1e-3, placement="any")
        first = len(ctx.trace.events)
        run.train_step(ids, targets)
        ctx.resolve_pending()
        sends = [e for e in ctx.trace.events[first:] if e.stream == "p2p"]
        inter = sum(float(e.meta["sent_bytes"]) for e in sends
                    if e.meta.get("link") == topo.inter.name)
        return inter, sum(float(e.meta["sent_bytes"]) for e in sends)

    res = mp.launch(program, dims.world_size, topology=topo)
    return sum(r[0] for r in res), sum(r[1] for r in res)


@exercise("7.3", "the bytes a pipeline sends across nodes")
@SETTINGS
@given(tp=world_sizes(1, 2, first=1), pp=world_sizes(2, 4, first=3),
       dp=world_sizes(1, 2, first=2), gpus_per_node=st.sampled_from([2, 1, 4]),
       m=st.integers(1, 4), b=st.integers(1, 2))
def check_pipeline_cross_node_bytes(impl, tp, pp, dp, gpus_per_node, m, b):
    dims = ParallelDims(dp_replicate=dp, pp=pp, tp=tp)  # DDP: its states do not matter
    assume(dims.world_size % gpus_per_node == 0)
    topo = mp.Topology.nodes(dims.world_size // gpus_per_node, gpus_per_node)
    batch = m * dp * b
    what = (f"pipeline_cross_node_bytes(cfg, {dims}, {topo.num_nodes} nodes of "
            f"{gpus_per_node}, global_batch={batch}, microbatches={m})")
    got = learner(what, impl.pipeline_cross_node_bytes, SMALL, dims, topo, batch, m)
    if not isinstance(got, (int, float, np.integer, np.floating)):
        raise GradeFailure(f"{what} returned {got!r:.80}; expected a number of bytes")
    want, every = sent_across(dims, topo, batch, m)
    if got == want:
        return
    message = SMALL.seq_len * b * SMALL.hidden * 8
    pair = 2 * m * message  # one crossing (rank, next stage) pair's bytes a step
    if got == every != want:
        hint = "counted every boundary: only a boundary whose two ranks sit on different " \
               "nodes crosses"
    elif tp > 1 and got * tp == want:
        hint = "divided by tp: every tp rank sends the whole [s, b, h]"
    else:
        hint = (f"your figure is {got / pair:g} crossing (rank, next stage) pairs' worth of "
                f"2m = {2 * m} messages, the trace's {want / pair:g}" + (
                    " (if you counted the forward's activations only: the backward sends "
                    "each activation's gradient back, the same size)" if 2 * got == want
                    else "") + ". A boundary crosses nodes when node_of(rank) differs from "
                "node_of of the next rank of its pp group: count each such pair")
    raise GradeFailure(f"{what}: the trace's sends put {want:,.0f} bytes on inter-node links "
                       f"(all sends: {every:,.0f}; one [s, b, h] message is {message} bytes), "
                       f"received {got!r}: {hint}")
