"""The collectives a program calls: torch.distributed's names, functional results.

Each function runs on every rank of `group` (the world by default) and returns a *new*
array; no result is ever a view of another rank's memory. Their meaning is the reference
definition of the same name in `reference.py`; this module adds what a real run has:

- validation, with errors that name the rank, the group and the shapes;
- the simulated clock: a collective is issued at the rank's compute time, queues behind
  earlier collectives of the same group on that group's comm stream (one stream per
  process group, as in PyTorch's NCCL backend), starts on the group when its last member
  can start, and lasts what `cost.collective_cost` says;
- a "comm_buffers" charge on the ledger for the output buffer, from issue until `wait()`;
- a trace event with the bytes this rank sent (`cost.bytes_sent`) and algbw/busbw.

`async_op=True` returns a `Work`; its `wait()` returns the result and makes the compute
stream wait for the communication, as `torch.distributed` work handles do. Do not modify
an input until its work is waited on (the same rule as with NCCL).

Point-to-point send and recv are in p2p.py; `Work` in work.py.
"""

from __future__ import annotations

import functools

from enum import Enum
from typing import Any, Optional, Sequence

import numpy as np

from . import cost as cost_model
from .backends.base import Call, Outcome
from .checks import block, reducible, whole
from .context import Context, rank_context
from .errors import CollectiveUsageError
from .group import ProcessGroup, make_group
from .reference import check_op
from .trace import Event
from .work import Work, call_site


class ReduceOp(str, Enum):
    """torch.distributed.ReduceOp's names; plain strings ("sum", ...) work too."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "prod"
    MAX = "max"
    MIN = "min"


# ---- groups ---------------------------------------------------------------------------
def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This rank's global rank, or its position in `group`."""
    ctx = rank_context("get_rank")
    return ctx.rank if group is None else group.group_rank(ctx.rank)


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    return rank_context("get_world_size").world_size if group is None else group.size


def new_group(ranks: Sequence[int], name: Optional[str] = None) -> ProcessGroup:
    """A group over global `ranks` (sorted); identified by its name and ranks."""
    return make_group(ranks, rank_context("new_group").world_size, name)


def _member(ctx: Context, group: Optional[ProcessGroup], kind: str) -> ProcessGroup:
    g = ctx.world if group is None else group
    if not isinstance(g, ProcessGroup):
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} got group={g!r} ({type(g).__name__}); pass a "
            "ProcessGroup (from mp.new_group, a DeviceMesh or ParallelGroups), or None for "
            "the whole world")
    g.check_world(ctx.world_size, ctx.rank, kind)
    if ctx.rank not in g:
        raise CollectiveUsageError(
            f"rank {ctx.rank} called {kind} on group {g}, which it is not a member of: "
            "only a group's members may call its collectives"
        )
    return g


def _root(ctx: Context, g: ProcessGroup, root: int, what: str, kind: str) -> int:
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer, float)):
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} got {what}={root!r} ({type(root).__name__}); {what} is "
            f"a global rank, an int, one of {list(g.ranks)}")
    if root not in g:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} got {what}={root}, which is not in group {g}; "
            f"{what} is a global rank and must be one of {list(g.ranks)}"
        )
    return g.group_rank(root)


def _issue(ctx: Context, kind: str, g: ProcessGroup, payload: Any, params: dict,
           signature: dict, out_nbytes: int, size: Optional[float], async_op: bool,
           root: int = 0, size_info: Optional[list] = None, post=None):
    """Hand one collective to the backend and return its result (or a Work)."""
    previous = ctx.pending.get(g.key)
    if previous is not None:  # the group's comm stream is serial: learn when the last ends
        previous._resolve()
    issued = ctx.clock.compute  # when the program called it
    local_start = max(issued, ctx.clock.comm_stream(g.key))  # when the stream can start it
    where = call_site()
    call = Call(kind, g, ctx.rank, payload, params, {"kind": kind, **signature}, local_start,
                where, size_info)
    buf = ctx.ledger.hold_unique(f"comm:{kind}", out_nbytes, "comm_buffers") if out_nbytes else None
    handle = ctx.backend.collective(call)

    def finish() -> tuple[Any, float]:
        out: Outcome = handle.wait()
        result = out.result if post is None else post(out.result)
        S = size if size is not None else _size_from(kind, out.result, g.size)
        traffic = out.size_infos if kind in ("all_to_all", "all_to_all_single") else None
        c, sent = _cost(ctx, kind, S, g, root, traffic)
        end = out.start + c.seconds
        ctx.clock.comm_free[g.key] = max(ctx.clock.comm_stream(g.key), end)
        ctx.trace.record(Event(ctx.rank, "comm", kind, out.start, end, nbytes=int(S),
                               group=g.ranks, label=g.name, meta={
                                   "algorithm": c.algorithm, "link": c.link,
                                   "formula": c.formula, "sent_bytes": sent,
                                   "algbw": cost_model.algbw(S, c.seconds) if S else 0.0,
                                   "busbw": cost_model.busbw(kind, S, c.seconds, g.size)
                                   if S and kind in cost_model.BUSBW_FACTOR else 0.0,
                                   "issued": issued, "where": where}))
        if ctx.pending.get(g.key) is work:
            del ctx.pending[g.key]
        return result, end

    # The output buffer stays charged until wait(), even if a later collective resolves
    # this one first: two async collectives in flight hold both their outputs.
    work = Work(ctx, finish, None if buf is None else (lambda: ctx.ledger.release(buf)),
                handle.is_completed)
    ctx.pending[g.key] = work
    return work if async_op else work.wait()


def _cost(ctx: Context, kind: str, S: float, g: ProcessGroup, root: int,
          traffic: Optional[list]) -> tuple[cost_model.Cost, float]:
    """(collective_cost, bytes_sent by this rank), memoised per context: both are pure
    functions of their arguments, and programs repeat the same collectives."""
    key = (kind, S, g.ranks, root)
    hit = ctx.cost_cache.get(key) if traffic is None else None
    if hit is not None:
        return hit
    if traffic is None:  # the group's part, the same on each member: computed once
        try:
            c, nodes = _group_cost(kind, S, g.ranks, root, ctx.algorithm, ctx.topology)
        except TypeError:  # an algorithm given per kind (a dict): not cached
            c, nodes = _group_cost.__wrapped__(kind, S, g.ranks, root, ctx.algorithm,
                                               ctx.topology)
    else:
        algo = cost_model.preferred("all_to_all", ctx.algorithm, g.ranks, ctx.topology)
        c = cost_model.collective_cost(kind, S, g.ranks, ctx.topology, algo, traffic)
        nodes = len({ctx.topology.node_of(r) for r in g.ranks})
    me = g.group_rank(ctx.rank)
    sent = cost_model.bytes_sent(kind, c.algorithm, S, g.size, me, root, nodes,
                                 traffic[me] if traffic else None)
    if traffic is None:
        ctx.cost_cache[key] = (c, sent)
    return c, sent


@functools.lru_cache(maxsize=4096)
def _group_cost(kind: str, S: float, ranks: tuple, root: int, algorithm: str,
                topology) -> tuple[cost_model.Cost, int]:
    """(collective_cost, nodes the group spans): O(g) to compute, so once per group and
    call shape rather than once per member (O(g^2) a collective at thousands of ranks)."""
    algo = cost_model.preferred(kind, algorithm, ranks, topology)
    c = cost_model.collective_cost(kind, S, ranks, topology, algo, None)
    return c, len({topology.node_of(r) for r in ranks})


def _size_from(kind: str, result: Any, n: int) -> float:
    """The collective's size S when only the result tells it (broadcast, scatter)."""
    if kind == "scatter":
        return float(result.nbytes * n)
    return float(result.nbytes)


def _axis(x: np.ndarray, axis: int, ctx: Context, kind: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} got axis={axis!r} ({type(axis).__name__}); axis is an "
            f"int in [{-x.ndim}, {x.ndim}) for an array of shape {x.shape}")
    if not -x.ndim <= axis < x.ndim:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} along axis {axis} of an array of shape {x.shape}: "
            f"axis must be in [{-x.ndim}, {x.ndim})")
    return axis % x.ndim


# ---- collectives -------------------------------------------------------------------
def all_reduce(x, op: str = "sum", group: Optional[ProcessGroup] = None,
               async_op: bool = False):
    """out = x_0 op x_1 op ... op x_{n-1} on every rank (see reference.all_reduce_ref)."""
    ctx = rank_context("all_reduce")
    g, x = _member(ctx, group, "all_reduce"), block(x, ctx.rank, "all_reduce")
    reducible(x, ctx.rank, "all_reduce", g)
    op = check_op(op, x.dtype)
    return _issue(ctx, "all_reduce", g, x, {"op": op},
                  {"shape": x.shape, "dtype": x.dtype, "op": op},
                  x.nbytes, float(x.nbytes), async_op)


def all_gather(x, axis: int = 0, group: Optional[ProcessGroup] = None,
               async_op: bool = False):
    """out = concat(x_0, ..., x_{n-1}) along `axis` on every rank; equal shapes required."""
    ctx = rank_context("all_gather")
    g, x = _member(ctx, group, "all_gather"), block(x, ctx.rank, "all_gather")
    axis = _axis(x, axis, ctx, "all_gather")
    total = x.nbytes * g.size
    return _issue(ctx, "all_gather", g, x, {"axis": axis},
                  {"shape": x.shape, "dtype": x.dtype, "axis": axis},
                  total, float(total), async_op)


def reduce_scatter(x, op: str = "sum", axis: int = 0, group: Optional[ProcessGroup] = None,
                   async_op: bool = False):
    """out_i = i-th of n equal chunks (along `axis`) of x_0 op ... op x_{n-1}."""
    ctx = rank_context("reduce_scatter")
    g, x = _member(ctx, group, "reduce_scatter"), block(x, ctx.rank, "reduce_scatter")
    axis = _axis(x, axis, ctx, "reduce_scatter")
    reducible(x, ctx.rank, "reduce_scatter", g)
    op = check_op(op, x.dtype)
    if x.shape[axis] % g.size:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: reduce_scatter over group {g} ({g.size} ranks) splits axis "
            f"{axis} of shape {x.shape} into {g.size} equal chunks, but {x.shape[axis]} is "
            f"not divisible by {g.size}; pad axis {axis} to a multiple of {g.size}")
    return _issue(ctx, "reduce_scatter", g, x, {"op": op, "axis": axis},
                  {"shape": x.shape, "dtype": x.dtype, "op": op, "axis": axis},
                  x.nbytes // g.size, float(x.nbytes), async_op)


def broadcast(x, src: int, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """out = x_src on every rank. Other ranks may pass None or a buffer of the same shape."""
    ctx = rank_context("broadcast")
    g = _member(ctx, group, "broadcast")
    s = _root(ctx, g, src, "src", "broadcast")
    x = None if x is None else block(x, ctx.rank, "broadcast")
    if ctx.rank == src and x is None:
        raise CollectiveUsageError(f"rank {ctx.rank} is the broadcast source but passed None")

    def check(result):
        if x is not None and (x.shape != result.shape or x.dtype != result.dtype):
            raise CollectiveUsageError(
                f"rank {ctx.rank}: broadcast from rank {src} on group {g} sent "
                f"{result.shape} {result.dtype}, but this rank passed a buffer of "
                f"{x.shape} {x.dtype}; pass None or a buffer of the source's shape and dtype")
        return result

    return _issue(ctx, "broadcast", g, x, {"src": s}, {"src": src},
                  0 if x is None else x.nbytes, None if x is None else float(x.nbytes),
                  async_op, root=s, post=check)


def reduce(x, dst: int, op: str = "sum", group: Optional[ProcessGroup] = None,
           async_op: bool = False):
    """out = x_0 op ... op x_{n-1} on rank `dst`; None on the other ranks."""
    ctx = rank_context("reduce")
    g, x = _member(ctx, group, "reduce"), block(x, ctx.rank, "reduce")
    d = _root(ctx, g, dst, "dst", "reduce")
    reducible(x, ctx.rank, "reduce", g)
    op = check_op(op, x.dtype)
    return _issue(ctx, "reduce", g, x, {"dst": d, "op": op},
                  {"shape": x.shape, "dtype": x.dtype, "op": op, "dst": dst},
                  x.nbytes if ctx.rank == dst else 0, float(x.nbytes), async_op, root=d)


def gather(x, dst: int, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """out = [x_0, ..., x_{n-1}] on rank `dst`; None elsewhere. Equal shapes required."""
    ctx = rank_context("gather")
    g, x = _member(ctx, group, "gather"), block(x, ctx.rank, "gather")
    d = _root(ctx, g, dst, "dst", "gather")
    total = x.nbytes * g.size
    return _issue(ctx, "gather", g, x, {"dst": d},
                  {"shape": x.shape, "dtype": x.dtype, "dst": dst},
                  total if ctx.rank == dst else 0, float(total), async_op, root=d)


def scatter(pieces: Optional[Sequence], src: int, group: Optional[ProcessGroup] = None,
            async_op: bool = False):
    """out_i = pieces[i] from rank `src`; the other ranks pass None. Equal shapes required."""
    ctx = rank_context("scatter")
    g = _member(ctx, group, "scatter")
    s = _root(ctx, g, src, "src", "scatter")
    payload = None
    if ctx.rank == src:
        if not hasattr(pieces, "__len__") or len(pieces) != g.size:
            got = (f"{len(pieces)} pieces" if hasattr(pieces, "__len__")
                   else type(pieces).__name__)
            raise CollectiveUsageError(
                f"rank {ctx.rank}: scatter source must pass one piece per rank of group {g} "
                f"({g.size}), got {got}")
        payload = [block(p, ctx.rank, f"scatter piece {i}") for i, p in enumerate(pieces)]
        shapes = {(p.shape, p.dtype) for p in payload}
        if len(shapes) != 1:
            raise CollectiveUsageError(
                f"rank {ctx.rank}: scatter pieces must share one shape and dtype, got "
                f"{[(p.shape, p.dtype) for p in payload]}; use all_to_all for uneven pieces")
    out_nb = payload[0].nbytes if payload else 0
    return _issue(ctx, "scatter", g, payload, {"src": s}, {"src": src}, out_nb,
                  float(out_nb * g.size) if payload else None, async_op, root=s)


def all_to_all(pieces: Sequence, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Any:
    """out[j] = rank j's pieces[i] on rank i: piece i goes to group rank i (sizes may differ)."""
    ctx = rank_context("all_to_all")
    g = _member(ctx, group, "all_to_all")
    if pieces is None or isinstance(pieces, (str, bytes)) or not hasattr(pieces, "__len__"):
        raise CollectiveUsageError(
            f"rank {ctx.rank}: all_to_all on group {g} needs a list of {g.size} pieces, one "
            f"per rank, got {type(pieces).__name__}")
    if len(pieces) != g.size:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: all_to_all on group {g} needs one piece per rank "
            f"({g.size}), got {len(pieces)}")
    pieces = [block(p, ctx.rank, f"all_to_all piece {i}") for i, p in enumerate(pieces)]
    dtypes = {p.dtype for p in pieces}
    if len(dtypes) != 1:
        raise CollectiveUsageError(f"rank {ctx.rank}: all_to_all pieces must share one dtype, "
                                   f"got {sorted(map(str, dtypes))}")
    sizes = [p.nbytes for p in pieces]
    return _issue(ctx, "all_to_all", g, pieces, {}, {"dtype": dtypes.pop()},
                  sum(sizes), float(sum(sizes)), async_op, size_info=sizes)


def all_to_all_single(x, input_split_sizes: Optional[Sequence[int]] = None, axis: int = 0,
                      group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Cut x along `axis` into pieces of `input_split_sizes` (equal if None), send piece i
    to group rank i, and concatenate what arrives in group-rank order."""
    ctx = rank_context("all_to_all_single")
    g, x = _member(ctx, group, "all_to_all_single"), block(x, ctx.rank, "all_to_all_single")
    axis = _axis(x, axis, ctx, "all_to_all_single")
    n = g.size
    if input_split_sizes is None:
        if x.shape[axis] % n:
            raise CollectiveUsageError(
                f"rank {ctx.rank}: all_to_all_single splits axis {axis} of shape {x.shape} "
                f"equally over {n} ranks, but {x.shape[axis]} is not divisible by {n}; "
                "pass input_split_sizes for uneven splits")
        input_split_sizes = [x.shape[axis] // n] * n
    try:
        splits = [whole(s, "each of input_split_sizes", minimum=0) for s in input_split_sizes]
    except (TypeError, ValueError) as e:
        raise CollectiveUsageError(f"rank {ctx.rank}: all_to_all_single: {e}") from None
    if len(splits) != n or sum(splits) != x.shape[axis] or min(splits) < 0:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: input_split_sizes {splits} must have {n} non-negative entries "
            f"summing to x.shape[{axis}] = {x.shape[axis]}")
    pieces = np.split(x, np.cumsum(splits)[:-1], axis=axis)
    sizes = [p.nbytes for p in pieces]
    return _issue(ctx, "all_to_all_single", g, pieces, {},
                  {"dtype": x.dtype, "axis": axis,
                   "other_dims": x.shape[:axis] + x.shape[axis + 1:]},
                  x.nbytes, float(x.nbytes), async_op, size_info=sizes,
                  post=lambda got: np.concatenate(got, axis=axis))


def barrier(group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Every rank leaves after every rank of the group has arrived."""
    ctx = rank_context("barrier")
    g = _member(ctx, group, "barrier")
    return _issue(ctx, "barrier", g, None, {}, {}, 0, 0.0, async_op)
