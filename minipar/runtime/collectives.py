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

Point-to-point `send` is eager (buffered): it costs the sender a + V/B on its p2p stream
and returns; `recv` returns the message once it has arrived, on the receiver's clock.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Any, Optional, Sequence

import numpy as np

from . import cost as cost_model
from .backends.base import Call, Outcome
from .context import Context, current
from .errors import CollectiveUsageError
from .group import ProcessGroup, make_group
from .reference import check_op
from .trace import Event

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


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
    ctx = current()
    return ctx.rank if group is None else group.group_rank(ctx.rank)


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    return current().world_size if group is None else group.size


def new_group(ranks: Sequence[int], name: Optional[str] = None) -> ProcessGroup:
    """A group over global `ranks` (sorted); identified by its name and ranks."""
    return make_group(ranks, current().world_size, name)


# ---- work handles -------------------------------------------------------------------
class Work:
    """An operation in flight. `wait()` returns its result; the compute stream waits."""

    def __init__(self, ctx: Context, finish, on_wait=None, ready=None):
        self._ctx = ctx
        self._ready = ready  # () -> bool: has the backend finished it (no blocking)?
        self._finish = finish  # () -> (result, end time); idempotent
        self._done: Optional[tuple[Any, float]] = None
        self._on_wait = on_wait  # run once, at the first wait() (releases the output buffer)

    def _resolve(self) -> tuple[Any, float]:
        if self._done is None:
            self._done = self._finish()
            self._finish = None  # the closure refers back to this Work: break the cycle, so
            # the result is freed as soon as the caller drops it, not at the next gc pass
        return self._done

    def wait(self) -> Any:
        result, end = self._resolve()
        self._ctx.clock.wait_until(end)
        if self._on_wait is not None:
            on_wait, self._on_wait = self._on_wait, None
            on_wait()
        return result

    def is_completed(self) -> bool:
        """True once the data has moved (every member arrived); never blocks."""
        return self._done is not None or (self._ready is not None and self._ready())

    @property
    def end_time(self) -> float:
        """Simulated time the operation finishes (resolves it if needed)."""
        return self._resolve()[1]


_in_runtime: dict[str, Optional[str]] = {}  # file -> None inside the runtime, else basename


def _where() -> str:
    """file:line of the first caller outside the runtime, for diagnoses."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name not in _in_runtime:
            inside = os.path.dirname(os.path.abspath(name)) == _RUNTIME_DIR
            _in_runtime[name] = None if inside else os.path.basename(name)
        short = _in_runtime[name]
        if short is not None:
            return f"{short}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "<unknown>"


def _member(ctx: Context, group: Optional[ProcessGroup], kind: str) -> ProcessGroup:
    g = ctx.world if group is None else group
    if ctx.rank not in g:
        raise CollectiveUsageError(
            f"rank {ctx.rank} called {kind} on group {g}, which it is not a member of: "
            "only a group's members may call its collectives"
        )
    return g


def _root(ctx: Context, g: ProcessGroup, root: int, what: str, kind: str) -> int:
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
    where = _where()
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
    algo = cost_model.preferred("all_to_all" if traffic is not None else kind, ctx.algorithm,
                                g.ranks, ctx.topology)
    c = cost_model.collective_cost(kind, S, g.ranks, ctx.topology, algo, traffic)
    me = g.group_rank(ctx.rank)
    nodes = len({ctx.topology.node_of(r) for r in g.ranks})
    sent = cost_model.bytes_sent(kind, c.algorithm, S, g.size, me, root, nodes,
                                 traffic[me] if traffic else None)
    if traffic is None:
        ctx.cost_cache[key] = (c, sent)
    return c, sent


def _size_from(kind: str, result: Any, n: int) -> float:
    """The collective's size S when only the result tells it (broadcast, scatter)."""
    if kind == "scatter":
        return float(result.nbytes * n)
    return float(result.nbytes)


def _arr(x: Any, ctx: Context, kind: str) -> np.ndarray:
    if x is None:
        raise CollectiveUsageError(f"rank {ctx.rank}: {kind} needs an array, got None")
    return np.asarray(x)


def _axis(x: np.ndarray, axis: int, ctx: Context, kind: str) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind} along axis {axis} of an array of shape {x.shape}: "
            f"axis must be in [{-x.ndim}, {x.ndim})")
    return axis % x.ndim


# ---- collectives -------------------------------------------------------------------
def all_reduce(x, op: str = "sum", group: Optional[ProcessGroup] = None,
               async_op: bool = False):
    """out = x_0 op x_1 op ... op x_{n-1} on every rank (see reference.all_reduce_ref)."""
    ctx = current()
    g, x = _member(ctx, group, "all_reduce"), _arr(x, ctx, "all_reduce")
    op = check_op(op, x.dtype)
    return _issue(ctx, "all_reduce", g, x, {"op": op},
                  {"shape": x.shape, "dtype": x.dtype, "op": op},
                  x.nbytes, float(x.nbytes), async_op)


def all_gather(x, axis: int = 0, group: Optional[ProcessGroup] = None,
               async_op: bool = False):
    """out = concat(x_0, ..., x_{n-1}) along `axis` on every rank; equal shapes required."""
    ctx = current()
    g, x = _member(ctx, group, "all_gather"), _arr(x, ctx, "all_gather")
    axis = _axis(x, axis, ctx, "all_gather")
    total = x.nbytes * g.size
    return _issue(ctx, "all_gather", g, x, {"axis": axis},
                  {"shape": x.shape, "dtype": x.dtype, "axis": axis},
                  total, float(total), async_op)


def reduce_scatter(x, op: str = "sum", axis: int = 0, group: Optional[ProcessGroup] = None,
                   async_op: bool = False):
    """out_i = i-th of n equal chunks (along `axis`) of x_0 op ... op x_{n-1}."""
    ctx = current()
    g, x = _member(ctx, group, "reduce_scatter"), _arr(x, ctx, "reduce_scatter")
    axis = _axis(x, axis, ctx, "reduce_scatter")
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
    ctx = current()
    g = _member(ctx, group, "broadcast")
    s = _root(ctx, g, src, "src", "broadcast")
    x = None if x is None else np.asarray(x)
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
    ctx = current()
    g, x = _member(ctx, group, "reduce"), _arr(x, ctx, "reduce")
    d = _root(ctx, g, dst, "dst", "reduce")
    op = check_op(op, x.dtype)
    return _issue(ctx, "reduce", g, x, {"dst": d, "op": op},
                  {"shape": x.shape, "dtype": x.dtype, "op": op, "dst": dst},
                  x.nbytes if ctx.rank == dst else 0, float(x.nbytes), async_op, root=d)


def gather(x, dst: int, group: Optional[ProcessGroup] = None, async_op: bool = False):
    """out = [x_0, ..., x_{n-1}] on rank `dst`; None elsewhere. Equal shapes required."""
    ctx = current()
    g, x = _member(ctx, group, "gather"), _arr(x, ctx, "gather")
    d = _root(ctx, g, dst, "dst", "gather")
    total = x.nbytes * g.size
    return _issue(ctx, "gather", g, x, {"dst": d},
                  {"shape": x.shape, "dtype": x.dtype, "dst": dst},
                  total if ctx.rank == dst else 0, float(total), async_op, root=d)


def scatter(pieces: Optional[Sequence], src: int, group: Optional[ProcessGroup] = None,
            async_op: bool = False):
    """out_i = pieces[i] from rank `src`; the other ranks pass None. Equal shapes required."""
    ctx = current()
    g = _member(ctx, group, "scatter")
    s = _root(ctx, g, src, "src", "scatter")
    payload = None
    if ctx.rank == src:
        if pieces is None or len(pieces) != g.size:
            got = "None" if pieces is None else f"{len(pieces)} pieces"
            raise CollectiveUsageError(
                f"rank {ctx.rank}: scatter source must pass one piece per rank of group {g} "
                f"({g.size}), got {got}")
        payload = [np.asarray(p) for p in pieces]
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
    ctx = current()
    g = _member(ctx, group, "all_to_all")
    if len(pieces) != g.size:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: all_to_all on group {g} needs one piece per rank "
            f"({g.size}), got {len(pieces)}")
    pieces = [np.asarray(p) for p in pieces]
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
    ctx = current()
    g, x = _member(ctx, group, "all_to_all_single"), _arr(x, ctx, "all_to_all_single")
    axis = _axis(x, axis, ctx, "all_to_all_single")
    n = g.size
    if input_split_sizes is None:
        if x.shape[axis] % n:
            raise CollectiveUsageError(
                f"rank {ctx.rank}: all_to_all_single splits axis {axis} of shape {x.shape} "
                f"equally over {n} ranks, but {x.shape[axis]} is not divisible by {n}; "
                "pass input_split_sizes for uneven splits")
        input_split_sizes = [x.shape[axis] // n] * n
    splits = [int(s) for s in input_split_sizes]
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
    ctx = current()
    g = _member(ctx, group, "barrier")
    return _issue(ctx, "barrier", g, None, {}, {}, 0, 0.0, async_op)


# ---- point to point -----------------------------------------------------------------
def _peer(ctx: Context, peer: int, what: str, kind: str, group: Optional[ProcessGroup]) -> None:
    g = ctx.world if group is None else group
    if peer not in g or peer == ctx.rank:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind}({what}={peer}) needs another member of group {g}; "
            f"{what} is a global rank other than {ctx.rank}")


def isend(x, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> Work:
    """Start sending x to `dst`; the message costs a + V/B on this rank's p2p stream."""
    ctx = current()
    _peer(ctx, dst, "dst", "send", group)
    x = _arr(x, ctx, "send")
    link = ctx.topology.link(ctx.rank, dst)
    start = max(ctx.clock.compute, ctx.clock.p2p)
    end = start + cost_model.p2p_time(x.nbytes, link)
    ctx.clock.p2p = end
    where = _where()
    ctx.backend.send(ctx.rank, x, dst, tag, end, where)
    ctx.trace.record(Event(ctx.rank, "p2p", "send", start, end, nbytes=x.nbytes,
                           group=(ctx.rank, dst), label=f"to {dst}",
                           meta={"sent_bytes": x.nbytes, "link": link.name, "where": where}))
    return Work(ctx, lambda: (None, end), ready=lambda: True)


def irecv(src: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> Work:
    """Post a receive from `src`; wait() returns the array once it has arrived."""
    ctx = current()
    _peer(ctx, src, "src", "recv", group)
    posted = ctx.clock.compute
    handle = ctx.backend.recv(ctx.rank, src, tag, _where())

    def finish():
        out = handle.wait()
        arr = out.result
        link = ctx.topology.link(src, ctx.rank)
        end = max(posted, out.start)
        begin = max(posted, out.start - cost_model.p2p_time(arr.nbytes, link))
        ctx.trace.record(Event(ctx.rank, "recv", "recv", begin, end, nbytes=arr.nbytes,
                               group=(src, ctx.rank), label=f"from {src}",
                               meta={"link": link.name}))
        return arr, end

    return Work(ctx, finish, ready=handle.is_completed)


def send(x, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> None:
    """Blocking send: the compute stream waits until the message has left (a + V/B)."""
    isend(x, dst, group, tag).wait()


def recv(src: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> np.ndarray:
    """Blocking receive: returns the message from `src` (a new array)."""
    return irecv(src, group, tag).wait()
