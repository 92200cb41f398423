"""Which (query, key) pairs one ring step computes under the causal mask: query chunk i and
key chunk j are full if j < i, diagonal (key position <= query position) if j = i, and
fully masked, skipped, if j > i.

    contiguous, rank r holding chunk r, the K/V of rank src:
        src < r: full        src = r: diagonal        src > r: skipped (no compute)
    zigzag, rank r holding chunks (r, 2cp−1−r), the K/V of (src, 2cp−1−src):
        src = r: both query chunks x both key chunks, a causal mask over the pairs
                 ((r, r) diagonal, (r, 2cp−1−r) masked, the other two full / diagonal)
        src < r: both query chunks x key chunk src, full
        src > r: query chunk 2cp−1−r x both key chunks, full
    (ring-flash-attention's zigzag_ring_flash_attn_forward: the whole block, the first half
    of K/V, the second half of Q.)

A step computes one rectangle: the rank's query chunks that attend to anything of the
source's keys, times the source's key chunks that anything attends to, masked by global
positions (allowed = key position <= query position). The mask makes the arithmetic right
for any layout; the chunk pairs decide what is charged.

What is charged, in chunk-pair units of c x c (c tokens a chunk): 1 per full pair, 1/2 per
diagonal pair, 0 per masked pair. That is FlashAttention's convention for a causal kernel
(its benchmarks count causal FLOPs as half the dense count); the exact number of unmasked
pairs in a diagonal c x c block is c(c+1)/2, c/2 more than charged. A masked pair inside
the rectangle (zigzag's own step) is multiplied by NumPy and charged 0, as a tiled kernel
skips it. Under this count the whole causal s x s attention is (k·cp)^2 / 2 units, and the
one-device core (which multiplies the dense s x s scores, and is charged for them) twice
that.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np


def pair_kind(q_chunk: int, k_chunk: int) -> str:
    """'full' (every key before every query), 'diagonal' or 'masked' (every key after)."""
    if k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "masked"


UNITS = {"full": Fraction(1), "diagonal": Fraction(1, 2), "masked": Fraction(0)}


@dataclass(frozen=True)
class Block:
    """One step's rectangle. q_slots: which of the rank's query chunks (indices into its
    chunk list) take part; k_slots: which of the source's key chunks; units: chunk pairs
    charged (full 1, diagonal 1/2, masked 0); kinds: every pair's kind, by slot."""

    q_slots: tuple[int, ...]
    k_slots: tuple[int, ...]
    units: Fraction
    kinds: tuple[tuple[str, ...], ...]

    @property
    def skipped(self) -> bool:
        """Every pair masked: nothing computed, nothing charged."""
        return not self.q_slots


def plan_block(q_chunks: Sequence[int], k_chunks: Sequence[int]) -> Block:
    """The rectangle for query chunks `q_chunks` (this rank's) and key chunks `k_chunks`
    (the source's), both given as chunk indices in storage order."""
    kinds = tuple(tuple(pair_kind(i, j) for j in k_chunks) for i in q_chunks)
    q_slots = tuple(a for a, row in enumerate(kinds) if any(x != "masked" for x in row))
    k_slots = tuple(b for b in range(len(k_chunks))
                    if any(row[b] != "masked" for row in kinds))
    units = sum((UNITS[x] for row in kinds for x in row), Fraction(0))
    return Block(q_slots, k_slots, units, kinds)


def slot_rows(slots: Sequence[int], c: int) -> np.ndarray:
    """The local row indices of chunk slots `slots`, c rows each.  [len(slots)·c] ints"""
    return np.concatenate([np.arange(a * c, (a + 1) * c) for a in slots]) if slots else \
        np.zeros(0, dtype=np.int64)


def causal_allowed(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """allowed[i, j] = key j's position <= query i's position.  [m, n] bool"""
    return k_pos[None, :] <= q_pos[:, None]
