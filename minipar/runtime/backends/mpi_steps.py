"""How each collective moves over MPI: the wire format, and one generator per collective.

A header (dtype code, ndim, a time, shape) tells a receiver what comes; data moves as
bytes (`as_bytes`), or typed (`as_typed`) where MPI reduces it itself. Each collective is
a generator that posts one stage of nonblocking MPI calls, yields their requests, and
returns the result once they complete (see mpi.py, which drives them).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Generator

import ml_dtypes
import numpy as np
from mpi4py import MPI

from ..errors import CollectiveUsageError
from ..reference import REFERENCES
from .base import Call

MAX_NDIM = 32
HEADER = 3 + MAX_NDIM  # [dtype code, ndim, float64 bits of a time, shape padded with 0]
DTYPES = [np.dtype(t) for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)]
CODES = {d: i for i, d in enumerate(DTYPES)}
NATIVE = {np.dtype(t): getattr(MPI, t.upper() + "_T") for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
NATIVE.update({np.dtype("float32"): MPI.FLOAT, np.dtype("float64"): MPI.DOUBLE})
OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
#: float sums and products over more than two ranks of at most this many bytes per rank
#: are reduced in group order (by_reference); larger ones by MPI, in its own order
ORDERED_BYTES = 1 << 16
Steps = Generator[list, None, Any]  # yields the requests of each stage, returns the result


class BufferCache:
    """Results of 1 MiB or more reuse buffers no array refers to any more, as PyTorch's
    caching allocator reuses freed GPU memory: fresh pages, which the kernel must map and
    zero, were most of the overhead over a bare mpi4py Allreduce. A buffer is handed out
    again only when no result, nor any view of one, is alive: results stay functional."""

    def __init__(self, min_bytes: int = 1 << 20, limit: int = 8):
        self.min_bytes, self.limit, self._bufs = min_bytes, limit, []  # uint8 owners

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        for i in reversed(range(len(self._bufs))):  # most recently used first: still warm
            if self._bufs[i].nbytes == nbytes and sys.getrefcount(self._bufs[i]) == 2:
                self._bufs.append(self._bufs.pop(i))  # 2 refs above: the list, the argument
                return self._bufs[-1].view(dtype).reshape(shape)
        free = [i for i in range(len(self._bufs)) if sys.getrefcount(self._bufs[i]) == 2]
        if len(self._bufs) >= self.limit and free:
            del self._bufs[free[0]]  # forget the least recently used free buffer
        buf = np.empty(nbytes, np.uint8)
        if len(self._bufs) < self.limit:
            self._bufs.append(buf)
        return buf.view(dtype).reshape(shape)


CACHE = BufferCache()


def private_copy(a: np.ndarray) -> np.ndarray:
    out = CACHE.empty(a.shape, a.dtype)
    out[...] = a
    return out


def as_bytes(a: np.ndarray) -> list:
    """A C-contiguous array as [bytes, MPI.BYTE]: any dtype moves as bytes."""
    return [a.reshape(-1).view(np.uint8), MPI.BYTE]


def as_typed(a: np.ndarray) -> list:
    return [a.reshape(-1), NATIVE[a.dtype]]


def caller(call: Call) -> str:
    return f"rank {call.rank}: {call.describe()}"


def check_movable(a: np.ndarray, who) -> None:
    """Refuse what cannot move as bytes; `who` (a Call or a text) names the caller."""
    if a.dtype not in CODES or a.ndim > MAX_NDIM:
        raise CollectiveUsageError(
            f"{who if isinstance(who, str) else caller(who)}: the mpi backend cannot move an "
            f"array of shape {a.shape} and dtype {a.dtype}; it moves up to {MAX_NDIM} "
            f"dimensions of {[str(d) for d in DTYPES]}")


def header(a: np.ndarray, who, when: float = 0.0) -> np.ndarray:
    """What a receiver needs to know of `a`: dtype code, ndim, a time, shape."""
    check_movable(a, who)
    h = np.zeros(HEADER, np.int64)
    h[0], h[1], h[2] = CODES[a.dtype], a.ndim, np.float64(when).view(np.int64)
    h[3:3 + a.ndim] = a.shape
    return h


def unheader(h: np.ndarray) -> tuple[tuple, np.dtype, float]:
    """(shape, dtype, time) from a header."""
    return tuple(int(s) for s in h[3:3 + h[1]]), DTYPES[h[0]], float(h[2:3].view(np.float64)[0])


def average(total: np.ndarray, op: str, n: int) -> np.ndarray:
    return np.asarray(total / n).astype(total.dtype, copy=False) if op == "avg" else total


def offsets(counts: list[int]) -> list[int]:
    return [0] + np.cumsum(counts)[:-1].tolist()


# ---- one generator per collective: post a stage, yield its requests; return the result ---
def _all_reduce(comm, me: int, call: Call) -> Steps:
    x, op = np.ascontiguousarray(call.payload), call.params["op"]
    out = CACHE.empty(x.shape, x.dtype)
    yield [comm.Iallreduce(as_typed(x), as_typed(out), OPS[op])]
    return average(out, op, comm.size)


def _reduce(comm, me: int, call: Call) -> Steps:
    x, op, dst = np.ascontiguousarray(call.payload), call.params["op"], call.params["dst"]
    out = CACHE.empty(x.shape, x.dtype) if me == dst else None
    yield [comm.Ireduce(as_typed(x), None if out is None else as_typed(out), OPS[op], root=dst)]
    return None if out is None else average(out, op, comm.size)


def _reduce_scatter(comm, me: int, call: Call) -> Steps:
    op, axis = call.params["op"], call.params["axis"]
    front = np.ascontiguousarray(np.moveaxis(call.payload, axis, 0))  # chunk i: rank i's rows
    out = CACHE.empty((front.shape[0] // comm.size,) + front.shape[1:], front.dtype)
    yield [comm.Ireduce_scatter_block(as_typed(front), as_typed(out), OPS[op])]
    return np.ascontiguousarray(np.moveaxis(average(out, op, comm.size), 0, axis))


def in_group_order(x: np.ndarray, op: str, n: int) -> bool:
    """Whether a reduction of x over n ranks goes `by_reference`, giving the sim backend's
    bits: MPI cannot reduce its dtype (bfloat16, float16), or MPI's order of adding would
    change the bits and x is small enough (ORDERED_BYTES) that all-gathering the n blocks
    costs what MPI's own reduction does (both latency-bound). Order cannot matter for
    integers, for max and min, nor over two ranks (a + b = b + a in IEEE arithmetic)."""
    if x.dtype not in NATIVE:
        return True
    return (n > 2 and x.dtype.kind == "f" and op in ("sum", "avg", "prod")
            and x.nbytes <= ORDERED_BYTES)


def by_reference(comm, me: int, call: Call) -> Steps:
    """A reduction MPI cannot do (bfloat16, float16, ...), or a small float one whose
    bits must be the sim backend's (in_group_order): all-gather the blocks, then reduce
    them with reference.py in group order, as the sim backend does."""
    x = np.ascontiguousarray(call.payload)
    blocks = CACHE.empty((comm.size,) + x.shape, x.dtype)
    yield [comm.Iallgather(as_bytes(x), as_bytes(blocks))]
    return REFERENCES[call.ref_kind](list(blocks), **call.params)[me]


def _all_gather(comm, me: int, call: Call) -> Steps:
    x, axis = np.ascontiguousarray(call.payload), call.params["axis"]
    blocks = CACHE.empty((comm.size,) + x.shape, x.dtype)
    yield [comm.Iallgather(as_bytes(x), as_bytes(blocks))]
    return blocks.reshape((-1,) + x.shape[1:]) if axis == 0 else np.concatenate(blocks, axis)


def _gather(comm, me: int, call: Call) -> Steps:
    x, dst = np.ascontiguousarray(call.payload), call.params["dst"]
    blocks = CACHE.empty((comm.size,) + x.shape, x.dtype) if me == dst else None
    yield [comm.Igather(as_bytes(x), None if blocks is None else as_bytes(blocks), root=dst)]
    return None if blocks is None else list(blocks)


def _broadcast(comm, me: int, call: Call) -> Steps:
    src = call.params["src"]
    mine = private_copy(call.payload) if me == src else None  # the source's own result
    head = header(mine, call) if me == src else np.empty(HEADER, np.int64)
    yield [comm.Ibcast(head, root=src)]
    shape, dtype, _ = unheader(head)
    out = mine if me == src else CACHE.empty(shape, dtype)
    yield [comm.Ibcast(as_bytes(out), root=src)]
    return out


def _scatter(comm, me: int, call: Call) -> Steps:
    src = call.params["src"]
    pieces = np.stack(call.payload) if me == src else None  # [n, *piece shape]
    head = header(pieces[0], call) if me == src else np.empty(HEADER, np.int64)
    yield [comm.Ibcast(head, root=src)]
    shape, dtype, _ = unheader(head)
    out = CACHE.empty(shape, dtype)
    yield [comm.Iscatter(None if pieces is None else as_bytes(pieces), as_bytes(out), root=src)]
    return out


def _all_to_all(comm, me: int, call: Call) -> Steps:
    pieces = [np.ascontiguousarray(p) for p in call.payload]
    heads = np.stack([header(p, call) for p in pieces])
    theirs = np.empty_like(heads)  # theirs[j]: the header of the piece rank j sends here
    yield [comm.Ialltoall(heads, theirs)]
    got = [unheader(h) for h in theirs]
    sent, counts = [p.nbytes for p in pieces], [int(np.prod(s)) * d.itemsize for s, d, _ in got]
    send = np.concatenate([as_bytes(p)[0] for p in pieces])
    recv = CACHE.empty((sum(counts),), np.uint8)
    yield [comm.Ialltoallv([send, (sent, offsets(sent)), MPI.BYTE],
                           [recv, (counts, offsets(counts)), MPI.BYTE])]
    return [recv[o:o + c].view(d).reshape(s)
            for (s, d, _), o, c in zip(got, offsets(counts), counts)]


def _barrier(comm, me: int, call: Call) -> Steps:
    yield [comm.Ibarrier()]


KINDS: dict[str, Callable[..., Steps]] = {
    "all_reduce": _all_reduce, "reduce": _reduce, "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather, "gather": _gather, "broadcast": _broadcast,
    "scatter": _scatter, "all_to_all": _all_to_all, "barrier": _barrier}
