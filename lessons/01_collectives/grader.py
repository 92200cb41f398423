"""Grader for lesson 01: your ring collectives against sums computed here, on a 2-D mesh of
simulated devices with the group passed explicitly; your bus bandwidth against
minipar.runtime.cost.busbw; your all-reduce across nodes against the simulated clock.

Data are arrays of small integers that depend on the global rank and the index
(x_r[i] = 100 r + i + 1), so every sum is exact whatever order a ring adds in, and a chunk
sent to the wrong rank, taken from the wrong place or summed over the wrong group shows.
Each reference is computed here from the ranks' inputs, never from your output.
"""

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, calls, exercise, expect_close,
                                    expect_equal, expect_within, forbid_collectives,
                                    mesh_of, on_mesh, world_sizes)
from minipar.runtime.cost import busbw
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError, WorldAborted)

# shapes up to 4 x 4, shrinking toward (3,): 3 elements cut unevenly over 2 ranks
SHAPE = st.lists(world_sizes(1, 4, first=3), min_size=1, max_size=2).map(tuple)
SIZES = world_sizes(1, 5, first=2)  # group sizes, shrinking toward 2 (then 3, 4, 5, 1)
BUDGET = 55e-6  # seconds: Exercise 1.5 on 2 nodes of 4 GPUs (lesson.py, section 6)
BUCKET = 2**20  # float32 numbers, 4 MiB: Exercise 1.5's gradient bucket
SUM_RATIOS = {"1/n": "averaged where the sum was wanted",
              "n": "each rank's sum was summed again over the group"}
BY_SENDS = ("build it from mp.isend/mp.recv/mp.irecv (Exercises 1.1 and 1.2 are rings of "
            "sends); a built-in collective would make the exercise a call")


def asymmetric(rank: int, shape, dtype=np.float64) -> np.ndarray:
    """x_r[i] = 100 r + i + 1 (flat index i): exact sums, rank- and index-dependent."""
    size = int(np.prod(shape))
    return (100.0 * rank + np.arange(1, size + 1)).reshape(shape).astype(dtype)


#: failures of the whole run, not of one rank's code: launch reports them itself
WORLD_FAILURES = (WorldAborted, DeadlockError, CollectiveTimeoutError, CollectiveMismatchError)


def on_grid(program, shape, names, dim, **launch_kw) -> list:
    """on_mesh, but a rank whose code raises (not a failed check) returns instead, so the
    other ranks finish their checks whatever the thread timing; then the lowest failing
    global rank's error is raised. Without this, a crash on rank 1 may abort rank 0 before
    or after its own check fails, and hypothesis sees two different failures of one case."""
    crashed: dict = {}

    def settled(ctx, spmd):
        try:
            return program(ctx, spmd)
        except (GradeFailure, *WORLD_FAILURES):
            raise
        except Exception as exc:  # the learner's code raised: report it after the others
            crashed[ctx.rank] = exc
            return None

    try:
        results = on_mesh(settled, shape, names, dim, **launch_kw)
    except GradeFailure:
        raise
    except Exception:  # a deadlock left by a crashed rank: the crash is the cause
        if not crashed:
            raise
    if crashed:
        raise crashed[min(crashed)]
    return results


def _layout(n: int, strided: bool):
    """A 2 x n mesh whose groups under test (n ranks each) are consecutive or strided."""
    return mesh_of(n, other=2, strided=strided)


def _where(spmd, strided: bool) -> str:
    kind = "strided" if strided else "consecutive"
    return f"on {spmd.size} rank(s), group {list(spmd.group.ranks)} ({kind} ranks)"


@exercise("1.1", "ring reduce-scatter from send/recv")
@SETTINGS
@given(n=SIZES, shape=SHAPE, strided=st.booleans())
def check_ring_reduce_scatter(impl, n, shape, strided):
    def program(ctx, spmd):
        x = asymmetric(ctx.rank, shape)
        total = sum(asymmetric(r, shape) for r in spmd.group.ranks).reshape(-1)
        expected = np.array_split(total, n)[spmd.rank]  # chunk r of the flattened sum
        what = f"ring_reduce_scatter(x, group) with x of shape {shape} {_where(spmd, strided)}"
        call = calls(ctx, impl.ring_reduce_scatter, x, spmd.group, names=["x", "group"])
        forbid_collectives(call, what=what, rank=spmd.words, hint=BY_SENDS)
        expect_close(call.result, expected, rank=spmd.words, what=what, ratios=SUM_RATIOS, n=n,
                     hint="group rank r returns chunk r of the flattened sum, chunks as "
                          "np.array_split(x.reshape(-1), n): chunk c must start at group "
                          "rank c + 1 to end complete on rank c; send/recv take global "
                          "ranks, your position is the group rank (ring_neighbours(group))")
        if x.size % n == 0:
            expect_close(call.bytes_sent, (n - 1) / n * x.nbytes, rank=spmd.words, rtol=0,
                         atol=0, what=f"the bytes {what} sent",
                         hint="a ring reduce-scatter sends n - 1 chunks of x.nbytes / n")
    on_grid(program, *_layout(n, strided))


@exercise("1.2", "ring all-gather from send/recv")
@SETTINGS
@given(n=SIZES, k=st.integers(1, 3), extra=st.integers(0, 4), strided=st.booleans())
def check_ring_all_gather(impl, n, k, extra, strided):
    sizes = [len(c) for c in np.array_split(np.arange(n * k + extra), n)]  # equal if extra=0

    def program(ctx, spmd):
        chunks = [asymmetric(r, (sizes[i],)) for i, r in enumerate(spmd.group.ranks)]
        expected = np.concatenate(chunks)  # in group-rank order
        what = f"ring_all_gather(chunk, group) with chunks of {sizes} elements {_where(spmd, strided)}"
        call = calls(ctx, impl.ring_all_gather, chunks[spmd.rank], spmd.group,
                     names=["chunk", "group"])
        forbid_collectives(call, what=what, rank=spmd.words, hint=BY_SENDS)
        expect_close(call.result, expected, rank=spmd.words, what=what,
                     hint="return every group member's chunk, concatenated in group-rank "
                          "order (group rank 0's first, whatever your own position); at "
                          "each step pass on the chunk you received last, and let chunks "
                          "differ in length")
        if len(set(sizes)) == 1:
            expect_close(call.bytes_sent, (n - 1) * chunks[spmd.rank].nbytes, rank=spmd.words,
                         rtol=0, atol=0, what=f"the bytes {what} sent",
                         hint="a ring all-gather sends n - 1 chunks, each once")
    on_grid(program, *_layout(n, strided))


@exercise("1.3", "ring all-reduce as reduce-scatter + all-gather")
@SETTINGS
@given(n=SIZES, shape=SHAPE, strided=st.booleans())
def check_ring_all_reduce(impl, n, shape, strided):
    def program(ctx, spmd):
        x = asymmetric(ctx.rank, shape)
        expected = sum(asymmetric(r, shape) for r in spmd.group.ranks)
        what = f"ring_all_reduce(x, group) with x of shape {shape} {_where(spmd, strided)}"
        call = calls(ctx, impl.ring_all_reduce, x, spmd.group, names=["x", "group"])
        forbid_collectives(call, what=what, rank=spmd.words,
                           hint="ring_all_reduce must be built from your ring_reduce_scatter "
                                "(1.1) and ring_all_gather (1.2), not by calling mp.all_reduce")
        expect_close(call.result, expected, rank=spmd.words, what=what, ratios=SUM_RATIOS, n=n,
                     hint=f"x has shape {shape}; the result is the sum over the group's ranks, "
                          "with x's shape: reduce-scatter (1.1), all-gather (1.2), reshape")
        if x.size % n == 0:
            expect_close(call.bytes_sent, 2 * (n - 1) / n * x.nbytes, rank=spmd.words, rtol=0,
                         atol=0, what=f"the bytes {what} sent ({x.nbytes} bytes in x)",
                         hint="a ring all-reduce sends 2(n-1) chunks of x.nbytes / n, less "
                              "than 2 x.nbytes whatever n; sending all of x to every other "
                              "rank costs (n-1) x.nbytes, which is the same only at n = 2")
    on_grid(program, *_layout(n, strided))


def _bus_bandwidth_diagnosis(received: float, kind: str, nbytes, seconds, n) -> str:
    """Name a known wrong form of busbw when `received` is one (and the right one is not)."""
    algbw, right = nbytes / seconds, busbw(kind, nbytes, seconds, n)
    factor = right / algbw
    floor = 2 * (n - 1) // n if kind == "all_reduce" else (n - 1) // n
    forms = (("you returned algbw itself: busbw multiplies it by the collective's factor",
              algbw),
             ("you divided algbw by the factor: busbw = algbw times the factor",
              algbw / factor if factor else None),
             ("the factor was rounded down: `//` is integer division, use `/`", algbw * floor))
    same = lambda a, b: bool(np.isclose(a, b, rtol=1e-12, atol=0))
    fits = [words for words, v in forms
            if v is not None and same(received, v) and not same(v, right)]
    return "; or ".join(fits) + ". " if fits else ""


@exercise("1.4", "bus bandwidth from algorithm bandwidth")
@SETTINGS
@given(kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
       nbytes=st.integers(1, 10**11), seconds=st.floats(1e-6, 10.0), n=st.integers(1, 1024))
def check_bus_bandwidth(impl, kind, nbytes, seconds, n):
    received = impl.bus_bandwidth(kind, nbytes, seconds, n)
    try:
        received = float(received)
    except (TypeError, ValueError):
        raise GradeFailure(f"bus_bandwidth({kind!r}, ...) returned {received!r}, expected a "
                           "number of bytes per second") from None
    expect_close(received, busbw(kind, nbytes, seconds, n), rtol=1e-12, atol=0,
                 what=f"bus_bandwidth({kind!r}, nbytes={nbytes}, seconds={seconds!r}, n={n})",
                 ratios={"2": "the all-reduce factor where all-gather and reduce-scatter, "
                              "which move half as much, have their own",
                         "1/2": "the all-gather factor where all-reduce, which moves twice "
                                "as much, has its own"},
                 hint=_bus_bandwidth_diagnosis(received, kind, nbytes, seconds, n)
                 + "busbw is what each link carries per second, comparable with the link's "
                   "bandwidth whatever n: see lesson.py, section 5")


def _cluster(nodes: int, gpus: int) -> dict:
    """How Exercise 1.5 is launched: a cluster of nodes, every collective one flat ring."""
    return dict(topology=mp.Topology.nodes(nodes, gpus_per_node=gpus), algorithm="ring")


@SETTINGS
@given(nodes=world_sizes(1, 3, first=2), gpus=world_sizes(1, 4, first=2),
       length=world_sizes(1, 12, first=3))  # 3 first: odd, and 1 last
def _values_across_nodes(impl, nodes, gpus, length):
    """Exercise 1.5's values, on clusters of 1-3 nodes of 1-4 GPUs and any bucket length."""
    topology = _cluster(nodes, gpus)["topology"]
    expected = sum(asymmetric(r, (length,), np.float32) for r in range(topology.world_size))

    def program(ctx, spmd):
        grad = asymmetric(ctx.rank, (length,), np.float32)
        call = calls(ctx, impl.all_reduce_across_nodes, grad, topology,
                     names=["grad", "topology"])
        expect_close(call.result, expected, rank=spmd.words, n=gpus,
                     what=f"all_reduce_across_nodes(grad, topology) with a bucket of {length} "
                          f"numbers on {nodes} node(s) of {gpus} GPU(s)",
                     ratios={"n": "every GPU of a node added in its node's sum: the step "
                                  "across nodes runs on a group of one GPU per node",
                             "1/n": "averaged where the sum was wanted"},
                     hint="every rank gets the sum of all ranks' buckets, of grad's shape; "
                          "rank r sits on node r // gpus_per_node, and a bucket's length "
                          "need not divide by anything")
    on_grid(program, (nodes, gpus), ("node", "gpu"), "gpu", **_cluster(nodes, gpus))


def _breakdown(ctx, first: int) -> str:
    """What one rank's communication was, grouped: collective or send, group, link, time."""
    rows: dict = {}
    for e in ctx.trace.events[first:]:
        if e.stream not in ("comm", "p2p"):
            continue
        who = (f"over {list(e.group)}" if e.stream == "comm" else f"to rank {e.group[1]}")
        key = (e.name, who if e.stream == "comm" else "", e.meta.get("link", "?"))
        count, seconds, sent = rows.get(key, (0, 0.0, 0.0))
        rows[key] = (count + 1, seconds + e.duration, sent + e.meta.get("sent_bytes", 0))
    return "; ".join(f"{n} x {name} {who} on {link}: {t * 1e6:.2f} us, {b / 2**20:.3g} MiB sent"
                     .replace("  ", " ") for (name, who, link), (n, t, b) in rows.items())


def _within_budget(impl):
    """Exercise 1.5's budget: the 4 MiB bucket on 2 nodes of 4 GPUs within BUDGET."""
    cluster = _cluster(2, 4)
    expected = sum(asymmetric(r, (BUCKET,), np.float32) % 4096 for r in range(8))

    def program(ctx, spmd):
        grad = asymmetric(ctx.rank, (BUCKET,), np.float32) % 4096
        t0, first = ctx.clock.now, len(ctx.trace.events)
        call = calls(ctx, impl.all_reduce_across_nodes, grad, cluster["topology"],
                     names=["grad", "topology"])
        expect_close(call.result, expected, rank=spmd.words,
                     what="all_reduce_across_nodes(grad, topology) with the 4 MiB bucket on "
                          "2 nodes of 4 GPUs")
        return ctx.clock.elapsed() - t0, _breakdown(ctx, first)

    results = on_grid(program, (2, 4), ("node", "gpu"), "gpu", **cluster)
    slowest = max(range(8), key=lambda r: results[r][0])
    seconds, breakdown = results[slowest]
    link = cluster["topology"].inter
    expect_within(seconds * 1e6, BUDGET * 1e6, unit="us",
                  what="the all-reduce of the 4 MiB bucket on 2 nodes of 4 GPUs, on the "
                       f"simulated clock of its slowest rank (global rank {slowest})",
                  hint=f"That rank ran: {breakdown or 'no communication'}. Sending the whole "
                       f"bucket across {link.name} once takes {link.time(BUCKET * 4) * 1e6:.2f} "
                       "us: which bytes must cross between nodes, and how few per GPU? "
                       "(lesson.py, section 6)")


@exercise("1.5", "an all-reduce across nodes within the budget")
def check_all_reduce_across_nodes(impl):
    _values_across_nodes(impl)  # right everywhere first, then fast enough where it counts
    _within_budget(impl)
