"""Grader for lesson 01: your ring collectives against minipar's collectives, on simulated
devices, and your bus bandwidth against minipar.runtime.cost.busbw.

Data are float64 arrays of small integers that depend on the rank and the index
(x_r[i] = 100 r + i + 1), so every sum is exact whatever order a ring adds in, and a chunk
sent to the wrong rank, or taken from the wrong place, shows.
"""

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_equal, on_ranks)
from minipar.runtime.cost import busbw
from minipar.runtime.reference import all_gather_ref

SHAPE = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)  # up to 4 x 4


def asymmetric(rank: int, shape) -> np.ndarray:
    """x_r[i] = 100 r + i + 1 (flat index i), float64: exact sums, rank- and index-dependent."""
    size = int(np.prod(shape))
    return (100.0 * rank + np.arange(1, size + 1)).reshape(shape)


def every_rank(program):
    """`program`, but a rank whose check fails returns the failure instead of raising it,
    so every rank finishes its checks (they come after the last collective)."""
    def run(ctx):
        try:
            program(ctx)
        except GradeFailure as failure:
            return failure
    return run


def lowest_failing_rank(results, world_size: int) -> None:
    """Raise the failure of the lowest rank that failed: the same report every time,
    whichever rank's thread happened to fail first."""
    failures = [(r, f) for r, f in enumerate(results) if isinstance(f, GradeFailure)]
    if failures:
        rank, first = failures[0]
        failure = GradeFailure(str(first))
        failure.add_note(f"(raised on rank {rank} of {world_size})")
        raise failure


def _layout(ctx, world_size: int, strided: bool):
    """(group to pass, group to compare with, its size, this rank's position). Strided: a
    world of 2 * world_size ranks in two groups, the even ranks and the odd ranks, so that
    a group rank is not the global rank and a message to the wrong one is caught."""
    if not strided:
        return None, None, world_size, ctx.rank
    g = mp.new_group(range(ctx.rank % 2, 2 * world_size, 2), name="even" if ctx.rank % 2 == 0
                     else "odd")
    return g, g, g.size, g.group_rank(ctx.rank)


def _called(impl_fn, ctx, *args):
    """Run impl_fn(*args); return (its result, the collectives it called, the bytes it sent)."""
    first = len(ctx.trace.events)
    sent_before = ctx.trace.bytes_sent()
    out = impl_fn(*args)
    events = ctx.trace.events[first:]
    collectives = sorted({e.name for e in events if e.stream == "comm"})
    return out, collectives, ctx.trace.bytes_sent() - sent_before


def _in_group(strided: bool, g) -> str:
    return f" in group {list(g.ranks)}" if strided else ""


@exercise("1.1", "ring reduce-scatter from send/recv")
@SETTINGS
@given(world_size=st.integers(1, 5), shape=SHAPE, strided=st.booleans())
def check_ring_reduce_scatter(impl, world_size, shape, strided):
    def program(ctx):
        group, g, n, me = _layout(ctx, world_size, strided)
        x = asymmetric(me, shape)
        args = (x,) if group is None else (x, group)
        out, collectives, sent = _called(impl.ring_reduce_scatter, ctx, *args)
        flat = x.reshape(-1)
        if flat.size % n == 0:
            expected = mp.reduce_scatter(flat, group=g)
        else:  # what reduce_scatter would give if it allowed uneven chunks
            expected = np.array_split(mp.all_reduce(flat, group=g), n)[me]
        what = (f"ring_reduce_scatter(x){_in_group(strided, group)} with x of shape {shape} "
                f"on {n} rank(s)")
        expect_close(out, expected, rank=ctx.rank, what=what,
                     hint="rank r returns chunk r of the flattened sum, chunks as "
                          "np.array_split(x.reshape(-1), n); check which chunk each step "
                          "sends (chunk c must start at rank c + 1 to end complete on rank c) "
                          "and that send/recv get global ranks")
        expect_equal(collectives, [], rank=ctx.rank, what=f"the collectives {what} called",
                     hint="build it from mp.send/mp.recv (or isend/irecv) only")
        if flat.size % n == 0:
            expect_close(sent, (n - 1) / n * x.nbytes, rank=ctx.rank, rtol=0, atol=0,
                         what=f"the bytes {what} sent",
                         hint="a ring reduce-scatter sends n - 1 chunks of x.nbytes / n: "
                              "(n-1)/n * x.nbytes")
    size = 2 * world_size if strided else world_size
    lowest_failing_rank(on_ranks(every_rank(program), size), size)


@exercise("1.2", "ring all-gather from send/recv")
@SETTINGS
@given(world_size=st.integers(1, 5), k=st.integers(1, 3), extra=st.integers(0, 4),
       strided=st.booleans())
def check_ring_all_gather(impl, world_size, k, extra, strided):
    def program(ctx):
        group, g, n, me = _layout(ctx, world_size, strided)
        # chunk sizes as np.array_split cuts n * k + extra elements: equal when extra = 0
        sizes = [len(c) for c in np.array_split(np.arange(n * k + extra), n)]
        blocks = [asymmetric(j, (sizes[j],)) for j in range(n)]
        chunk = blocks[me]
        args = (chunk,) if group is None else (chunk, group)
        out, collectives, sent = _called(impl.ring_all_gather, ctx, *args)
        equal = len(set(sizes)) == 1
        expected = (mp.all_gather(chunk, group=g) if equal
                    else all_gather_ref(blocks)[me])  # mp.all_gather refuses uneven chunks
        what = (f"ring_all_gather(chunk){_in_group(strided, group)} with chunks of "
                f"{sizes} elements on {n} rank(s)")
        expect_close(out, expected, rank=ctx.rank, what=what,
                     hint="return every rank's chunk, concatenated in group-rank order "
                          "(rank 0's first); at each step pass on the chunk you received "
                          "last, and let chunks differ in length")
        expect_equal(collectives, [], rank=ctx.rank, what=f"the collectives {what} called",
                     hint="build it from mp.send/mp.recv (or isend/irecv) only")
        if equal:
            expect_close(sent, (n - 1) * chunk.nbytes, rank=ctx.rank, rtol=0, atol=0,
                         what=f"the bytes {what} sent",
                         hint="a ring all-gather sends n - 1 chunks: (n-1)/n of the output")
    size = 2 * world_size if strided else world_size
    lowest_failing_rank(on_ranks(every_rank(program), size), size)


@exercise("1.3", "ring all-reduce as reduce-scatter + all-gather")
@SETTINGS
@given(world_size=st.integers(1, 5), shape=SHAPE)
def check_ring_all_reduce(impl, world_size, shape):
    def program(ctx):
        x = asymmetric(ctx.rank, shape)
        sent_before = ctx.trace.bytes_sent()
        out = impl.ring_all_reduce(x)
        sent = ctx.trace.bytes_sent() - sent_before
        expect_close(out, mp.all_reduce(x), rank=ctx.rank, what="ring_all_reduce(x)",
                     hint=f"x has shape {shape}; the result is the sum over ranks, with x's "
                          "shape: reduce-scatter (1.1), then all-gather (1.2), then reshape")
        if x.size % world_size == 0:
            expect_close(sent, 2 * (world_size - 1) / world_size * x.nbytes, rank=ctx.rank,
                         rtol=0, atol=0, what=f"the bytes ring_all_reduce(x) sent (x of shape "
                                              f"{shape}, {x.nbytes} bytes)",
                         hint="a ring all-reduce sends 2(n-1) chunks of x.nbytes / n: "
                              "2(n-1)/n * x.nbytes, whatever n")
    lowest_failing_rank(on_ranks(every_rank(program), world_size), world_size)


@exercise("1.4", "bus bandwidth from algorithm bandwidth")
@SETTINGS
@given(kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
       nbytes=st.integers(1, 10**11), seconds=st.floats(1e-6, 10.0), n=st.integers(1, 1024))
def check_bus_bandwidth(impl, kind, nbytes, seconds, n):
    expect_close(impl.bus_bandwidth(kind, nbytes, seconds, n), busbw(kind, nbytes, seconds, n),
                 rtol=1e-12, atol=0,
                 what=f"bus_bandwidth({kind!r}, nbytes={nbytes}, seconds={seconds!r}, n={n})",
                 hint="algbw = nbytes / seconds; busbw = algbw * 2(n-1)/n for all_reduce, "
                      "* (n-1)/n for all_gather and reduce_scatter")
