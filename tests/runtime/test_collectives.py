"""Property tests: every SPMD collective against a plain NumPy computation of its result.

Each test draws a world (1..8 ranks), a group layout (the world, a random subset made with
`new_group`, or the groups along one dimension of a `DeviceMesh`), a dtype, a small shape
and the collective's own arguments, runs a program with `minipar.launch`, and checks on
every rank:

- the result equals, bit for bit, what NumPy computes from the inputs in group order;
- every member of a group got the same thing (where the collective says so);
- results are new arrays: none shares memory with any rank's input or any other result;
- the inputs were not modified.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.runtime.errors import CollectiveUsageError

bf16 = ml_dtypes.bfloat16
FLOAT_DTYPES = [np.float64, np.float32, bf16]
INT_DTYPES = [np.int32, np.int64]
DTYPES = FLOAT_DTYPES + INT_DTYPES
OPS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
IDLE = "idle: not a member of any group"


# ---- expected values in plain NumPy -----------------------------------------------------
def is_int(dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def fold(blocks: list[np.ndarray], op: str) -> np.ndarray:
    """b0 op b1 op ... op b_{n-1}, left to right, in the blocks' dtype."""
    acc = blocks[0]
    for b in blocks[1:]:
        acc = OPS[op](acc, b)
    if op == "avg":
        acc = acc / len(blocks)
    return np.asarray(acc).astype(blocks[0].dtype)


def make_block(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    """Small integers for integer dtypes; values of mixed magnitude for floats, so that
    the order of a floating-point reduction shows in the last bits."""
    if is_int(dtype):
        return np.array(rng.integers(-4, 5, size=shape), dtype=dtype)
    scale = rng.choice([1e-3, 1.0, 1e3], size=shape)
    return np.array(rng.standard_normal(shape) * scale, dtype=dtype)


def make_inputs(seed: int, world_size: int, shape: tuple, dtype) -> list[np.ndarray]:
    return [make_block(np.random.default_rng([seed, r]), shape, dtype)
            for r in range(world_size)]


# ---- checks -----------------------------------------------------------------------------
def assert_exact(got: Any, expected: np.ndarray) -> None:
    """Same type (a real ndarray), dtype, shape and bits."""
    assert isinstance(got, np.ndarray), f"expected an ndarray, got {type(got).__name__}"
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.tobytes() == expected.tobytes(), f"\ngot      {got!r}\nexpected {expected!r}"


def arrays_in(x: Any) -> list[np.ndarray]:
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, dict):
        return [a for v in x.values() for a in arrays_in(v)]
    if isinstance(x, (list, tuple)):
        return [a for v in x for a in arrays_in(v)]
    return []


def assert_no_sharing(outputs: list, inputs: list) -> None:
    """No output shares memory with any input or with another output (over all ranks)."""
    outs, ins = arrays_in(outputs), arrays_in(inputs)
    for i, o in enumerate(outs):
        for x in ins:
            assert not np.shares_memory(o, x), "a result is a view of some rank's input"
        for p in outs[i + 1:]:
            assert not np.shares_memory(o, p), "two results share memory"


def assert_unchanged(inputs: list, snapshot: list) -> None:
    for x, s in zip(arrays_in(inputs), arrays_in(snapshot)):
        assert x.tobytes() == s.tobytes(), "a collective modified its input"


def snapshot(inputs: list) -> list:
    return [[a.copy() for a in arrays_in(x)] for x in inputs]


# ---- group layouts ----------------------------------------------------------------------
def mesh_coords(rank: int, shape: tuple) -> tuple:
    """Coordinates of `rank` in a row-major grid: the last dimension varies fastest."""
    out = []
    for s in reversed(shape):
        out.append(rank % s)
        rank //= s
    return tuple(reversed(out))


def mesh_strides(shape: tuple) -> tuple:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return tuple(strides)


def mesh_groups(shape: tuple, dim: int) -> tuple:
    """Ranks that differ only in coordinate `dim`, each group sorted."""
    groups: dict[tuple, list[int]] = {}
    for r in range(int(np.prod(shape))):
        c = mesh_coords(r, shape)
        groups.setdefault(c[:dim] + c[dim + 1:], []).append(r)
    return tuple(tuple(sorted(g)) for g in groups.values())


@dataclass(frozen=True)
class Layout:
    world_size: int
    kind: str  # "world", "subset" (new_group) or "mesh" (DeviceMesh dimension)
    groups: tuple  # the expected groups, each a sorted tuple of global ranks
    subset_order: tuple = ()  # the ranks as passed to new_group (any order)
    mesh_shape: tuple = ()
    mesh_names: tuple = ()
    mesh_dim: str = ""

    def group_of(self, rank: int) -> Optional[tuple]:
        return next((g for g in self.groups if rank in g), None)


def factorizations(n: int, k: int) -> list[tuple]:
    if k == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0
            for rest in factorizations(n // d, k - 1)]


@st.composite
def layouts(draw, min_world: int = 1, max_world: int = 8) -> Layout:
    ws = draw(st.integers(min_world, max_world))
    kind = draw(st.sampled_from(["world", "subset", "mesh"]))
    if kind == "world":
        return Layout(ws, "world", (tuple(range(ws)),))
    if kind == "subset":
        order = draw(st.permutations(range(ws)))
        size = draw(st.integers(1, ws))
        members = tuple(order[:size])
        return Layout(ws, "subset", (tuple(sorted(members)),), subset_order=members)
    ndim = draw(st.integers(1, 3))
    shape = draw(st.sampled_from(factorizations(ws, ndim)))
    names = ("pp", "dp", "tp")[3 - ndim:]
    dim = draw(st.integers(0, ndim - 1))
    return Layout(ws, "mesh", mesh_groups(shape, dim), mesh_shape=shape, mesh_names=names,
                  mesh_dim=names[dim])


def resolve(layout: Layout, ctx) -> tuple[bool, Optional[mp.ProcessGroup]]:
    """Inside the program: (is this rank a member, the group argument to pass)."""
    if layout.kind == "world":
        return True, None
    if layout.kind == "subset":
        g = mp.new_group(layout.subset_order)
        return ctx.rank in g, g
    mesh = mp.init_device_mesh(layout.mesh_shape, mesh_dim_names=layout.mesh_names)
    return True, mesh.get_group(layout.mesh_dim, ctx.rank)


def run(layout: Layout, body: Callable) -> list:
    """Run body(ctx, group, group_ranks) on every member; idle ranks return IDLE.

    Also checks on every member that the group it got is the expected one and that
    get_rank/get_world_size(group) give its position and size in sorted order."""

    def program(ctx):
        member, g = resolve(layout, ctx)
        if not member:
            return IDLE
        ranks = tuple(range(ctx.world_size)) if g is None else g.ranks
        assert ranks == layout.group_of(ctx.rank), (ranks, layout.group_of(ctx.rank))
        assert mp.get_rank(g) == ranks.index(ctx.rank)
        assert mp.get_world_size(g) == len(ranks)
        return body(ctx, g, ranks)

    results = mp.launch(program, layout.world_size)
    for r in range(layout.world_size):
        if layout.group_of(r) is None:
            assert results[r] == IDLE
    return list(results)


def maybe_wait(out: Any, async_op: bool) -> Any:
    if not async_op:
        assert not isinstance(out, mp.Work)
        return out
    assert isinstance(out, mp.Work)
    first = out.wait()
    assert out.is_completed()
    second = out.wait()  # waiting again gives the same result
    assert arrays_in(first) == [] or all(
        a.tobytes() == b.tobytes() for a, b in zip(arrays_in(first), arrays_in(second)))
    return first


def small_shape(min_dims: int = 0, max_dims: int = 3, max_side: int = 4):
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


seeds = st.integers(0, 2 ** 32 - 1)


# ---- a literal case first ------------------------------------------------------------------
def test_float32_all_reduce_folds_in_sorted_group_order_not_in_the_order_given():
    """new_group([3, 0, 1]) is the group (0, 1, 3): the sum is ((x0 + x1) + x3).
    With x0 = x1 = 1 and x3 = 2**24 that is 16777218; folding in the order given,
    ((x3 + x0) + x1), would round twice back to 16777216."""
    values = {0: 1.0, 1: 1.0, 2: 5.0, 3: 2.0 ** 24}

    def program(ctx):
        g = mp.new_group([3, 0, 1])
        if ctx.rank not in g:
            return None
        return mp.all_reduce(np.array([values[ctx.rank]], np.float32), group=g)

    results = mp.launch(program, 4)
    assert results[2] is None
    for r in (0, 1, 3):
        assert_exact(results[r], np.array([16777218.0], np.float32))


# ---- all_reduce / reduce ------------------------------------------------------------------
@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       op=st.sampled_from(sorted(OPS)), async_op=st.booleans(), seed=seeds)
def test_all_reduce(layout, dtype, shape, op, async_op, seed):
    if op == "avg" and is_int(dtype):
        op = "sum"
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    before = snapshot(inputs)
    results = run(layout, lambda ctx, g, ranks: maybe_wait(
        mp.all_reduce(inputs[ctx.rank], op=op, group=g, async_op=async_op), async_op))
    for group in layout.groups:
        expected = fold([inputs[r] for r in group], op)
        for r in group:
            assert_exact(results[r], expected)
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       op=st.sampled_from(["sum", "max", "min", "prod", "avg"]), root=st.integers(0, 7),
       async_op=st.booleans(), seed=seeds)
def test_reduce(layout, dtype, shape, op, root, async_op, seed):
    if op == "avg" and is_int(dtype):
        op = "max"
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    before = snapshot(inputs)

    def body(ctx, g, ranks):
        dst = ranks[root % len(ranks)]  # a global rank, as torch.distributed takes
        return mp.reduce(inputs[ctx.rank], dst=dst, op=op, group=g, async_op=async_op)

    results = run(layout, lambda ctx, g, ranks: maybe_wait(body(ctx, g, ranks), async_op))
    for group in layout.groups:
        dst = group[root % len(group)]
        assert_exact(results[dst], fold([inputs[r] for r in group], op))
        for r in group:
            if r != dst:
                assert results[r] is None
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


# ---- broadcast ----------------------------------------------------------------------------
@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       root=st.integers(0, 7), pass_buffer=st.booleans(), async_op=st.booleans(), seed=seeds)
def test_broadcast(layout, dtype, shape, root, pass_buffer, async_op, seed):
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    buffers = [np.zeros(shape, dtype) for _ in range(layout.world_size)]
    before = snapshot(inputs)

    def body(ctx, g, ranks):
        src = ranks[root % len(ranks)]
        x = inputs[ctx.rank] if ctx.rank == src else (buffers[ctx.rank] if pass_buffer else None)
        return maybe_wait(mp.broadcast(x, src=src, group=g, async_op=async_op), async_op)

    results = run(layout, body)
    for group in layout.groups:
        src = group[root % len(group)]
        for r in group:
            assert_exact(results[r], inputs[src])
    assert_no_sharing([x for x in results if x is not IDLE], inputs + buffers)
    assert_unchanged(inputs, before)
    for b in buffers:  # functional: a receive buffer is never written
        assert not b.any()


# ---- all_gather / gather ------------------------------------------------------------------
@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(min_dims=1),
       axis_pick=st.integers(0, 5), negative=st.booleans(), async_op=st.booleans(),
       seed=seeds)
def test_all_gather(layout, dtype, shape, axis_pick, negative, async_op, seed):
    axis = axis_pick % len(shape)
    if negative:
        axis -= len(shape)
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    before = snapshot(inputs)
    results = run(layout, lambda ctx, g, ranks: maybe_wait(
        mp.all_gather(inputs[ctx.rank], axis=axis, group=g, async_op=async_op), async_op))
    for group in layout.groups:
        expected = np.concatenate([inputs[r] for r in group], axis=axis)
        for r in group:
            assert_exact(results[r], expected)
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       root=st.integers(0, 7), async_op=st.booleans(), seed=seeds)
def test_gather(layout, dtype, shape, root, async_op, seed):
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    before = snapshot(inputs)

    def body(ctx, g, ranks):
        dst = ranks[root % len(ranks)]
        return maybe_wait(mp.gather(inputs[ctx.rank], dst=dst, group=g, async_op=async_op),
                          async_op)

    results = run(layout, body)
    for group in layout.groups:
        dst = group[root % len(group)]
        got = results[dst]
        assert isinstance(got, list) and len(got) == len(group)
        for piece, r in zip(got, group):
            assert_exact(piece, inputs[r])
        for r in group:
            if r != dst:
                assert results[r] is None
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


# ---- reduce_scatter / scatter -------------------------------------------------------------
@given(layout=layouts(), dtype=st.sampled_from(DTYPES), rest=small_shape(max_dims=2),
       chunk=st.integers(1, 2), axis_pick=st.integers(0, 5),
       op=st.sampled_from(sorted(OPS)), async_op=st.booleans(), seed=seeds)
def test_reduce_scatter(layout, dtype, rest, chunk, axis_pick, op, async_op, seed):
    if op == "avg" and is_int(dtype):
        op = "min"
    axis = axis_pick % (len(rest) + 1)
    # every group of the layout has the same size, so one shape fits all of them
    n = len(layout.groups[0])
    shape = rest[:axis] + (n * chunk,) + rest[axis:]
    inputs = make_inputs(seed, layout.world_size, shape, dtype)
    before = snapshot(inputs)
    results = run(layout, lambda ctx, g, ranks: maybe_wait(
        mp.reduce_scatter(inputs[ctx.rank], op=op, axis=axis, group=g, async_op=async_op),
        async_op))
    for group in layout.groups:
        total = fold([inputs[r] for r in group], op)
        for i, r in enumerate(group):
            index = [slice(None)] * len(shape)
            index[axis] = slice(i * chunk, (i + 1) * chunk)
            assert_exact(results[r], np.ascontiguousarray(total[tuple(index)]))
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


@given(layout=layouts(), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       root=st.integers(0, 7), async_op=st.booleans(), seed=seeds)
def test_scatter(layout, dtype, shape, root, async_op, seed):
    ws = layout.world_size
    n = len(layout.groups[0])
    # rank r, if it is a source, scatters pieces[r][0..n-1]
    pieces = [make_inputs(seed + r, n, shape, dtype) for r in range(ws)]
    before = snapshot(pieces)

    def body(ctx, g, ranks):
        src = ranks[root % len(ranks)]
        mine = pieces[ctx.rank] if ctx.rank == src else None
        return maybe_wait(mp.scatter(mine, src=src, group=g, async_op=async_op), async_op)

    results = run(layout, body)
    for group in layout.groups:
        src = group[root % len(group)]
        for i, r in enumerate(group):
            assert_exact(results[r], pieces[src][i])
    assert_no_sharing([x for x in results if x is not IDLE], pieces)
    assert_unchanged(pieces, before)


# ---- all_to_all ---------------------------------------------------------------------------
@given(layout=layouts(), dtype=st.sampled_from(DTYPES), rest=small_shape(max_dims=2),
       async_op=st.booleans(), seed=seeds, data=st.data())
def test_all_to_all_uneven(layout, dtype, rest, async_op, seed, data):
    ws = layout.world_size
    n = len(layout.groups[0])
    # sizes[j][i]: rows rank j (its group position) sends to position i; may be 0
    sizes = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n),
                               min_size=ws, max_size=ws), label="sizes")
    rng = np.random.default_rng(seed)
    pieces = [[make_block(rng, (sizes[r][i],) + rest, dtype) for i in range(n)]
              for r in range(ws)]
    before = snapshot(pieces)
    results = run(layout, lambda ctx, g, ranks: maybe_wait(
        mp.all_to_all(pieces[ctx.rank], group=g, async_op=async_op), async_op))
    for group in layout.groups:
        for i, r in enumerate(group):
            got = results[r]
            assert isinstance(got, list) and len(got) == len(group)
            for j, src in enumerate(group):  # slot j holds what group rank j sent to i
                assert_exact(got[j], pieces[src][i])
    assert_no_sharing([x for x in results if x is not IDLE], pieces)
    assert_unchanged(pieces, before)


@given(layout=layouts(), dtype=st.sampled_from(DTYPES), rest=small_shape(max_dims=2),
       axis_pick=st.integers(0, 5), even=st.booleans(), async_op=st.booleans(), seed=seeds,
       data=st.data())
def test_all_to_all_single(layout, dtype, rest, axis_pick, even, async_op, seed, data):
    ws = layout.world_size
    n = len(layout.groups[0])
    axis = axis_pick % (len(rest) + 1)
    if even:
        k = data.draw(st.integers(0, 2), label="k")
        splits = [[k] * n for _ in range(ws)]
    else:
        splits = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n),
                                    min_size=ws, max_size=ws), label="splits")
    rng = np.random.default_rng(seed)
    inputs = [make_block(rng, rest[:axis] + (sum(splits[r]),) + rest[axis:], dtype)
              for r in range(ws)]
    before = snapshot(inputs)

    def body(ctx, g, ranks):
        sizes = None if even else splits[ctx.rank]
        return maybe_wait(mp.all_to_all_single(inputs[ctx.rank], sizes, axis=axis, group=g,
                                               async_op=async_op), async_op)

    results = run(layout, body)

    def piece(src: int, i: int) -> np.ndarray:
        start = sum(splits[src][:i])
        return np.take(inputs[src], np.arange(start, start + splits[src][i]), axis=axis)

    for group in layout.groups:
        for i, r in enumerate(group):
            expected = np.concatenate([piece(src, i) for src in group], axis=axis)
            assert_exact(results[r], expected)
    assert_no_sharing([x for x in results if x is not IDLE], inputs)
    assert_unchanged(inputs, before)


# ---- barrier ------------------------------------------------------------------------------
@settings(max_examples=10)
@given(layout=layouts(), flops=st.lists(st.integers(0, 10 ** 12), min_size=8, max_size=8),
       async_op=st.booleans())
def test_barrier_waits_for_every_member(layout, flops, async_op):
    arrived: dict[tuple, list[int]] = {g: [] for g in layout.groups}
    lock = threading.Lock()

    def body(ctx, g, ranks):
        time.sleep(0.002 * (len(ranks) - 1 - ranks.index(ctx.rank)))  # later ranks first
        ctx.compute(flops[ctx.rank])
        before = ctx.clock.now
        with lock:
            arrived[ranks].append(ctx.rank)
        out = maybe_wait(mp.barrier(group=g, async_op=async_op), async_op)
        with lock:
            seen = sorted(arrived[ranks])
        return out, before, ctx.clock.now, seen

    results = run(layout, body)
    for group in layout.groups:
        latest = max(results[r][1] for r in group)
        after = {results[r][2] for r in group}
        for r in group:
            out, _, _, seen = results[r]
            assert out is None
            assert seen == list(group)  # nobody left before everybody arrived
        # simulated time: everyone leaves together, no earlier than the last arrival
        assert len(after) == 1 and after.pop() >= latest


# ---- point to point -----------------------------------------------------------------------
@given(world=st.integers(2, 8), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       tag=st.integers(0, 3), seed=seeds)
def test_ring_send_before_recv(world, dtype, shape, tag, seed):
    """Every rank sends to its right neighbour, then receives from its left one. This is
    only safe because sends are eager (buffered); it must not deadlock. (Under the default
    rendezvous sends it is a deadlock: tests/runtime/test_sends.py.)"""
    inputs = make_inputs(seed, world, shape, dtype)
    originals = snapshot(inputs)

    def program(ctx):
        r, n = ctx.rank, ctx.world_size
        mp.send(inputs[r], dst=(r + 1) % n, tag=tag)
        inputs[r][...] = 0  # the message left with the values at send time
        return mp.recv(src=(r - 1) % n, tag=tag)

    results = mp.launch(program, world, sends="eager")
    for r in range(world):
        assert_exact(results[r], originals[(r - 1) % world][0])
    assert_no_sharing(list(results), inputs)


@given(world=st.integers(2, 4), dtype=st.sampled_from(DTYPES), shape=small_shape(),
       tags=st.lists(st.integers(0, 1), min_size=1, max_size=5),
       post_first=st.booleans(), seed=seeds, data=st.data())
def test_isend_irecv_complete_in_posting_order(world, dtype, shape, tags, post_first,
                                               seed, data):
    """Several outstanding irecvs from one source with the same tag are matched to that
    source's sends in posting order, whatever order they are waited in."""
    k = len(tags)
    messages = make_inputs(seed, k, shape, dtype)
    originals = snapshot(messages)
    wait_order = data.draw(st.permutations(range(k)), label="wait_order")

    def program(ctx):
        if ctx.rank == 0:
            if post_first:
                mp.barrier()  # rank 1 has posted every irecv before anything is sent
            works = [mp.isend(messages[i], dst=1, tag=t) for i, t in enumerate(tags)]
            for m in messages:
                m[...] = 0  # sends are eager: later changes do not travel
            assert all(isinstance(w, mp.Work) for w in works)
            assert [w.wait() for w in works] == [None] * k
            if not post_first:
                mp.barrier()
            return None
        if ctx.rank == 1:
            if not post_first:
                mp.barrier()  # every message has been sent before anything is posted
            works = [mp.irecv(src=0, tag=t) for t in tags]
            if post_first:
                mp.barrier()
            got = [None] * k
            for i in wait_order:
                got[i] = works[i].wait()
            return got
        mp.barrier()
        return None

    results = mp.launch(program, world, sends="eager")  # rank 0 waits on its sends first
    assert len(results[1]) == k
    for i in range(k):
        assert_exact(results[1][i], originals[i][0])
    assert_no_sharing([results[1]], messages)


def test_send_and_recv_within_a_group_use_global_ranks():
    def program(ctx):
        g = mp.new_group([1, 3])
        if ctx.rank == 1:
            mp.send(np.array([1.0, 2.0]), dst=3, group=g)
            return mp.recv(src=3, group=g)
        if ctx.rank == 3:
            got = mp.recv(src=1, group=g)
            mp.send(got * 10, dst=1, group=g)
            return got
        return None

    results = mp.launch(program, 4)
    assert_exact(results[3], np.array([1.0, 2.0]))
    assert_exact(results[1], np.array([10.0, 20.0]))


# ---- async ------------------------------------------------------------------------------
@settings(max_examples=10)
@given(world=st.integers(1, 6), dtype=st.sampled_from(FLOAT_DTYPES), shape=small_shape(1),
       wait_order=st.permutations(range(4)), seed=seeds)
def test_several_outstanding_async_collectives(world, dtype, shape, wait_order, seed):
    inputs = make_inputs(seed, world, shape, dtype)

    def program(ctx):
        x = inputs[ctx.rank]
        works = [mp.all_reduce(x, op="sum", async_op=True),
                 mp.all_gather(x, async_op=True),
                 mp.broadcast(x if ctx.rank == world - 1 else None, src=world - 1,
                              async_op=True),
                 mp.all_reduce(x, op="max", async_op=True)]
        ctx.compute(1e9)  # compute while the communication is in flight
        got = [None] * 4
        for i in wait_order:
            got[i] = works[i].wait()
        return got

    results = mp.launch(program, world)
    for r in range(world):
        s, gathered, b, m = results[r]
        assert_exact(s, fold(inputs, "sum"))
        assert_exact(gathered, np.concatenate(inputs))
        assert_exact(b, inputs[world - 1])
        assert_exact(m, fold(inputs, "max"))
    assert_no_sharing(list(results), inputs)


# ---- device meshes ----------------------------------------------------------------------
def test_device_mesh_2x4_layout_is_last_dim_fastest():
    mesh = mp.DeviceMesh((2, 4), ("dp", "tp"))
    assert [g.ranks for g in mesh.groups("tp")] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [g.ranks for g in mesh.groups("dp")] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.coordinate(6) == {"dp": 1, "tp": 2}
    assert mesh.get_group("dp", 6).ranks == (2, 6)
    assert mesh.dim_size("tp") == 4 and mesh.size == 8


def test_device_mesh_2x2x2_layout():
    mesh = mp.DeviceMesh((2, 2, 2), ("pp", "dp", "tp"))
    assert sorted(g.ranks for g in mesh.groups("tp")) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert sorted(g.ranks for g in mesh.groups("dp")) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert sorted(g.ranks for g in mesh.groups("pp")) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.coordinate(5) == {"pp": 1, "dp": 0, "tp": 1}


@given(layout=layouts(min_world=1).filter(lambda lay: lay.kind == "mesh"))
def test_init_device_mesh_rank_layout(layout):
    shape, names = layout.mesh_shape, layout.mesh_names
    strides = mesh_strides(shape)

    def program(ctx):
        mesh = mp.init_device_mesh(shape, mesh_dim_names=names)
        return (mesh.coordinate(ctx.rank),
                {n: mesh.get_group(n, ctx.rank).ranks for n in names})

    results = mp.launch(program, layout.world_size)
    for r, (coord, groups) in enumerate(results):
        c = tuple(coord[n] for n in names)
        assert sum(ci * si for ci, si in zip(c, strides)) == r  # rank = sum coord * stride
        assert c == mesh_coords(r, shape)
        for d, n in enumerate(names):
            expected = next(g for g in mesh_groups(shape, d) if r in g)
            assert groups[n] == expected


def test_init_device_mesh_must_cover_the_world():
    def program(ctx):
        mp.init_device_mesh((2, 2), ("dp", "tp"))

    with pytest.raises(mp.RankFailedError, match=r"covers 4 ranks but the world has 6") as info:
        mp.launch(program, 6)
    assert isinstance(info.value.original, ValueError)


@settings(max_examples=10)
@given(dp=st.integers(1, 3), tp=st.integers(1, 3), dtype=st.sampled_from(DTYPES), seed=seeds)
def test_mesh_all_reduce_over_tp_then_dp(dp, tp, dtype, seed):
    """Two all_reduces along two mesh dimensions (the groups of each dimension run at the
    same time) sum over the whole mesh, tp first."""
    world = dp * tp
    inputs = make_inputs(seed, world, (3,), dtype)

    def program(ctx):
        mesh = mp.init_device_mesh((dp, tp), mesh_dim_names=("dp", "tp"))
        y = mp.all_reduce(inputs[ctx.rank], group=mesh.get_group("tp", ctx.rank))
        return mp.all_reduce(y, group=mesh.get_group("dp", ctx.rank))

    results = mp.launch(program, world)
    rows = [fold([inputs[d * tp + t] for t in range(tp)], "sum") for d in range(dp)]
    expected = fold(rows, "sum")
    for r in range(world):
        assert_exact(results[r], expected)
    assert_no_sharing(list(results), inputs)


# ---- determinism ------------------------------------------------------------------------
def _mixed_program(inputs: list, delays: list):
    def program(ctx):
        r = ctx.rank
        time.sleep(delays[r])  # perturb which rank arrives last
        a = mp.all_reduce(inputs[r].astype(np.float32))
        time.sleep(delays[-1 - r])
        b = mp.reduce_scatter(inputs[r].astype(bf16), op="avg")
        g = mp.new_group(range(1, ctx.world_size))
        c = mp.all_reduce(inputs[r], op="sum", group=g, async_op=True).wait() if r in g else None
        d = mp.all_to_all_single(inputs[r])
        return a, b, c, d

    return program


def test_same_program_twice_gives_bit_identical_floats():
    world = 8
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(16) * 10.0 ** rng.integers(-4, 5, 16) for _ in range(world)]
    # the data is order-sensitive: summing the float32 blocks backwards gives other bits
    f32 = [x.astype(np.float32) for x in inputs]
    assert fold(f32, "sum").tobytes() != fold(f32[::-1], "sum").tobytes()

    schedules = [[0.0] * (world + 1),
                 [0.002 * r for r in range(world)] + [0.0],
                 [0.002 * (world - r) for r in range(world)] + [0.001]]
    runs = [mp.launch(_mixed_program(inputs, s), world) for s in schedules]
    first = arrays_in(list(runs[0]))
    assert_exact(runs[0][0][0], fold(f32, "sum"))
    for other in runs[1:]:
        again = arrays_in(list(other))
        assert len(again) == len(first)
        for x, y in zip(first, again):
            assert_exact(y, x)


def test_collective_outside_launch_runs_on_a_world_of_one():
    x = np.array([1.5, -2.0], np.float32)
    with mp.device():
        out = mp.all_reduce(x)
    assert_exact(out, x)
    assert not np.shares_memory(out, x)


def test_avg_on_integers_is_refused():
    def program(ctx):
        mp.all_reduce(np.arange(3, dtype=np.int32), op="avg")

    with pytest.raises(CollectiveUsageError, match="not defined for integer dtype int32"):
        mp.launch(program, 2)
