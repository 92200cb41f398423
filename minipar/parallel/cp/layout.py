"""Which tokens a context-parallel rank holds: rank r holds chunks chunks(r, cp) of the
sequence cut into k·cp equal chunks, in that order.

    contiguous   k = 1   rank r holds chunk r               (Liu et al. 2023's ring)
    zigzag       k = 2   rank r holds chunks r, 2·cp−1−r    (Llama 3's context
                                                            parallelism, Dubey et al. 2024
                                                            section 3.3.2;
                                                            ring-flash-attention's zigzag)

    cp = 4, s = 16 (c = s / (k·cp) tokens a chunk):
      contiguous  rank 0: 0-3        rank 1: 4-7        rank 2: 8-11      rank 3: 12-15
      zigzag      rank 0: 0-1 14-15  rank 1: 2-3 12-13  rank 2: 4-5 10-11 rank 3: 6-7 8-9

Under a causal mask, query i attends to keys 0..i, so the work of a query row grows with
its position: contiguous gives the last rank 2·cp−1 times the first's work (costs.py),
zigzag pairs an early chunk with a late one and gives every rank the same.

A layout is plain data: a function chunks(rank, cp) -> the chunk indices, in the order the
rank stores them. Everything here is a function of it: `positions` (the global token
positions a rank holds, in its order), `shard` (cut a [s, ...] array), `unshard` (glue
every rank's shard back). `check_layout` refuses a function that does not hand out each
chunk exactly once. (A zigzag that paired r with 2·cp−r would give rank 0 a chunk that
does not exist and nobody chunk cp.)
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np

Layout = Union[str, Callable[[int, int], Sequence[int]]]


def contiguous_chunks(rank: int, cp: int) -> tuple[int, ...]:
    """Rank r holds chunk r of cp."""
    return (rank,)


def zigzag_chunks(rank: int, cp: int) -> tuple[int, ...]:
    """Rank r holds chunks r and 2·cp−1−r of 2·cp: an early one and its mirror image."""
    return (rank, 2 * cp - 1 - rank)


LAYOUTS = {"contiguous": contiguous_chunks, "zigzag": zigzag_chunks}


def chunks_fn(layout: Layout) -> Callable[[int, int], Sequence[int]]:
    """The chunk function of a layout given by name ("contiguous", "zigzag") or as itself."""
    if callable(layout):
        return layout
    if layout not in LAYOUTS:
        raise ValueError(f"unknown context-parallel layout {layout!r}: expected one of "
                         f"{sorted(LAYOUTS)}, or a function chunks(rank, cp) -> the chunk "
                         f"indices that rank holds")
    return LAYOUTS[layout]


def layout_name(layout: Layout) -> str:
    return layout if isinstance(layout, str) else getattr(layout, "__name__", repr(layout))


def chunks(layout: Layout, rank: int, cp: int) -> tuple[int, ...]:
    """The chunk indices rank `rank` holds, in its order."""
    return tuple(int(c) for c in chunks_fn(layout)(rank, cp))


def check_layout(layout: Layout, cp: int) -> int:
    """k, the chunks per rank, after checking that ranks 0..cp−1 hold every one of the
    k·cp chunks exactly once, k each; else a ValueError naming the chunks at fault."""
    held = [chunks(layout, r, cp) for r in range(cp)]
    k = len(held[0])
    flat = sorted(c for h in held for c in h)
    if k == 0 or any(len(h) != k for h in held) or flat != list(range(k * cp)):
        missing = sorted(set(range(k * cp)) - set(flat))
        extra = sorted(c for c in set(flat) if flat.count(c) > 1 or not 0 <= c < k * cp)
        raise ValueError(
            f"layout {layout_name(layout)} does not cut the sequence into {k}·cp = {k * cp} "
            f"chunks held once each at cp = {cp}: ranks hold {held}; expected every chunk "
            f"0..{k * cp - 1} exactly once (missing {missing}, repeated or out of range "
            f"{extra}); for zigzag, rank r holds chunks r and 2·cp−1−r")
    return k


def chunk_size(layout: Layout, cp: int, s: int) -> int:
    """c = s / (k·cp), the tokens in one chunk; s must be a multiple of k·cp."""
    k = check_layout(layout, cp)
    if s % (k * cp):
        hint = " (zigzag cuts 2·cp chunks)" if k == 2 else ""
        raise ValueError(f"sequence length s = {s} cannot be cut into {k * cp} equal chunks "
                         f"for layout {layout_name(layout)} at cp = {cp}{hint}: expected a "
                         f"multiple of {k * cp}; pad the sequence or choose another cp")
    return s // (k * cp)


def positions(layout: Layout, rank: int, cp: int, s: int) -> np.ndarray:
    """The global positions rank `rank` holds, in its storage order.  [s/cp] ints"""
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not a place in a context-parallel group of cp = "
                         f"{cp}: expected 0 <= rank < {cp} (the rank's index in its cp "
                         f"group, not its global rank)")
    c = chunk_size(layout, cp, s)
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in chunks(layout, rank, cp)])


def shard(x: np.ndarray, layout: Layout, rank: int, cp: int, axis: int = 0) -> np.ndarray:
    """Rank `rank`'s tokens of x, in its order.  x: [s, ...] -> [s/cp, ...] (a copy)"""
    x = np.asarray(x)
    return np.take(x, positions(layout, rank, cp, x.shape[axis]), axis=axis)  # [s/cp, ...]


def unshard(shards: Sequence[np.ndarray], layout: Layout, axis: int = 0) -> np.ndarray:
    """Every rank's shard (in rank order) glued back in sequence order.
    shards: cp arrays [s/cp, ...] -> [s, ...]"""
    cp = len(shards)
    s = sum(np.asarray(x).shape[axis] for x in shards)
    order = sequence_order(layout, cp, s)  # order: [s], the global position of each row
    glued = np.concatenate(shards, axis=axis)  # [s, ...] in rank order
    return np.take(glued, np.argsort(order, kind="stable"), axis=axis)  # [s, ...]


def sequence_order(layout: Layout, cp: int, s: int) -> np.ndarray:
    """order[i] = the global position of row i of the ranks' shards glued in rank order
    (what an all-to-all or all-gather over the cp group delivers).  [s] ints"""
    return np.concatenate([positions(layout, r, cp, s) for r in range(cp)])
