"""All-reduce algorithms built from send/recv, to watch step by step.

The direct `all_reduce` computes its result at a rendezvous; these build the same result
the way NCCL and MPI libraries do, out of point-to-point messages, so every step (who
sends which chunk to whom) is visible in the trace and in the pure `*_schedule` functions.

Ring (Patarasuk & Yuan 2009; what NCCL runs inside a node). x is cut into n chunks.
    reduce-scatter, steps s = 0..n-2:  send chunk (r - s) mod n to r+1,
                                       receive chunk (r - s - 1) mod n from r-1 and add it.
    Rank r now holds chunk (r + 1) mod n fully reduced.
    all-gather, steps s = 0..n-2:      send chunk (r + 1 - s) mod n to r+1,
                                       receive chunk (r - s) mod n from r-1 and keep it.
    2(n-1) steps of S/n bytes:  t = 2(n-1) (a + S/(nB)) = 2(n-1) a + 2(n-1)/n * S/B,
which is the ring all-reduce cost formula of cost.py, now measured on the clock.

Recursive halving-doubling (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005), for n a
power of two: log2(n) halving steps exchange half of the current segment with the partner
at distance n/2, n/4, ..., 1 and add; log2(n) doubling steps exchange back in reverse.

Order of addition. The direct all_reduce folds ranks in order 0, 1, ..., n-1. The ring
folds chunk c in the order c, c+1, ..., c-1 (cyclically); halving-doubling adds pairs.
So results are bit-identical to the direct all_reduce when floating-point addition is
exact for the data (integers, or integer-valued floats), and otherwise agree within
rounding (a few ulp). Integers are exact always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .p2p import irecv, isend
from .context import current
from .errors import CollectiveUsageError
from .group import ProcessGroup


@dataclass(frozen=True)
class Step:
    """One step of one rank (group positions): send a chunk to a partner, receive one."""

    phase: str  # "reduce-scatter" | "all-gather"
    step: int
    rank: int
    send_to: int
    send_chunk: int
    recv_from: int
    recv_chunk: int


def ring_schedule(n: int) -> list[Step]:
    """Every step of every rank of a ring all-reduce over n ranks (group positions)."""
    steps = []
    for s in range(n - 1):
        for r in range(n):
            steps.append(Step("reduce-scatter", s, r, (r + 1) % n, (r - s) % n,
                              (r - 1) % n, (r - s - 1) % n))
    for s in range(n - 1):
        for r in range(n):
            steps.append(Step("all-gather", s, r, (r + 1) % n, (r + 1 - s) % n,
                              (r - 1) % n, (r - s) % n))
    return steps


def halving_doubling_schedule(n: int) -> list[Step]:
    """Every step of a recursive halving-doubling all-reduce over n = 2^k ranks.

    Chunks are the n equal pieces of x; in halving step s (distance d = n / 2^(s+1)) rank r
    exchanges with r XOR d and keeps the half of its segment on its own side."""
    if n < 1 or n & (n - 1):
        raise CollectiveUsageError(
            f"recursive halving-doubling needs a power-of-two group size, got {n}; "
            "use the ring algorithm")
    steps: list[Step] = []
    seg = {r: (0, n) for r in range(n)}  # chunk range [lo, hi) each rank is reducing
    d, s = n // 2, 0
    while d >= 1:
        for r in range(n):
            lo, hi = seg[r]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
            steps.append(Step("reduce-scatter", s, r, r ^ d, give[0], r ^ d, keep[0]))
            seg[r] = keep
        d, s = d // 2, s + 1
    d, s = 1, 0
    while d < n:
        for r in range(n):
            lo, hi = seg[r]
            width = hi - lo
            other = (lo + width, hi + width) if r & d == 0 else (lo - width, hi - width)
            steps.append(Step("all-gather", s, r, r ^ d, lo, r ^ d, other[0]))
            seg[r] = (min(lo, other[0]), max(hi, other[1]))
        d, s = d * 2, s + 1
    return steps


def _exchange(g: ProcessGroup, me: int, step: Step, payload: np.ndarray, algo: str,
              tag: int) -> np.ndarray:
    """Send `payload` to the step's partner and return what the partner sent us."""
    ctx = current()
    dst, src = g.ranks[step.send_to], g.ranks[step.recv_from]
    w = isend(payload, dst, group=g, tag=tag)
    got = irecv(src, group=g, tag=tag).wait()
    w.wait()
    for e in ctx.trace.events[-2:]:
        e.meta.update(algorithm=algo, phase=step.phase, step=step.step,
                      send_chunk=step.send_chunk, recv_chunk=step.recv_chunk)
    return got


def _flat_chunks(x: np.ndarray, n: int) -> list[np.ndarray]:
    return [c.copy() for c in np.array_split(x.reshape(-1), n)]


def _group(group: Optional[ProcessGroup]) -> tuple[ProcessGroup, int]:
    ctx = current()
    g = ctx.world if group is None else group
    if ctx.rank not in g:
        raise CollectiveUsageError(f"rank {ctx.rank} is not a member of group {g}")
    return g, g.group_rank(ctx.rank)


def ring_all_reduce(x, group: Optional[ProcessGroup] = None, tag: int = 1 << 20) -> np.ndarray:
    """Sum x over the group with a ring: reduce-scatter then all-gather, 2(n-1) steps."""
    g, me = _group(group)
    x = np.asarray(x)
    n = g.size
    chunks = _flat_chunks(x, n)
    for step in (s for s in ring_schedule(n) if s.rank == me):
        got = _exchange(g, me, step, chunks[step.send_chunk], "ring", tag)
        if step.phase == "reduce-scatter":
            chunks[step.recv_chunk] = got + chunks[step.recv_chunk]
        else:
            chunks[step.recv_chunk] = got
    return np.concatenate(chunks).reshape(x.shape).astype(x.dtype, copy=False)


def halving_doubling_all_reduce(x, group: Optional[ProcessGroup] = None,
                                tag: int = 1 << 21) -> np.ndarray:
    """Sum x over a power-of-two group by recursive halving, then recursive doubling."""
    g, me = _group(group)
    x = np.asarray(x)
    n = g.size
    chunks = _flat_chunks(x, n)
    seg = (0, n)
    for step in (s for s in halving_doubling_schedule(n) if s.rank == me):
        width = seg[1] - seg[0]
        if step.phase == "reduce-scatter":
            half = width // 2
            give = range(step.send_chunk, step.send_chunk + half)
            keep = range(step.recv_chunk, step.recv_chunk + half)
            got = _exchange(g, me, step, _pack(chunks, give), "halving_doubling", tag)
            lower_first = me < step.send_to  # add in rank order: lower rank's data first
            for i, piece in zip(keep, _unpack(got, chunks, keep)):
                chunks[i] = chunks[i] + piece if lower_first else piece + chunks[i]
            seg = (keep.start, keep.stop)
        else:
            mine = range(seg[0], seg[1])
            theirs = range(step.recv_chunk, step.recv_chunk + width)
            got = _exchange(g, me, step, _pack(chunks, mine), "halving_doubling", tag)
            for i, piece in zip(theirs, _unpack(got, chunks, theirs)):
                chunks[i] = piece
            seg = (min(seg[0], theirs.start), max(seg[1], theirs.stop))
    return np.concatenate(chunks).reshape(x.shape).astype(x.dtype, copy=False)


def _pack(chunks: list[np.ndarray], idx: range) -> np.ndarray:
    return np.concatenate([chunks[i] for i in idx])


def _unpack(flat: np.ndarray, chunks: list[np.ndarray], idx: range) -> list[np.ndarray]:
    sizes = [chunks[i].size for i in idx]
    return np.split(flat, np.cumsum(sizes)[:-1])
