"""What context parallelism costs a rank per attention layer: bytes sent and causal work.

With s tokens, b sequences, h = a·d hidden, cp ranks, e bytes per element of q, k, v
(2 in bf16) and g bytes per element of the gradient accumulators (4 under bf16: float32,
as ring.py keeps them; 8 in float64), one K or V shard is (s/cp)·b·h elements:

    ring, forward     (cp − 1) · 2(s/cp)bh · e              K/V, cp − 1 sends
    ring, backward    (cp − 1) · 2(s/cp)bh · e              K/V again, cp − 1 sends
                    +  cp      · 2(s/cp)bh · g              dK/dV, cp sends (the last one
                                                            brings each block's home)
    Ulysses, forward  (cp − 1)/cp · 4(s/cp)bh · e           all_to_all of q, k, v (3) and
                                                            of the context (1): each rank
                                                            keeps 1/cp of what it holds
    Ulysses, backward (cp − 1)/cp · 4(s/cp)bh · e           dcontext (1) and dq, dk, dv (3)

Per rank the ring moves ~2sbh·e in each direction whatever cp (its messages shrink as
there are more of them); Ulysses moves 4sbh·e·(cp−1)/cp², falling as 1/cp, but is bounded
by the head count. (A whole-sequence all-gather of K/V, Megatron-LM's CP without overlap,
would be the ring's forward bytes in one collective.)

Causal work, in chunk pairs (blocks.py: full 1, diagonal 1/2, masked 0) out of the whole
(k·cp)²/2: contiguous gives rank r (2r + 1)/cp² (cp = 4: 1/16, 3/16, 5/16, 7/16), zigzag
gives every rank 1/cp (rank r's chunk r sees r + 1/2, its chunk 2cp−1−r sees 2cp−1−r + 1/2:
2cp in all). The clock charges 4 matmul-FLOPs per unit forward (q k^T, p v) and 10 backward
(S recomputed, dV, dP, dQ, dK), 2·b·a·c²·d each, c = s/(k·cp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from ...runtime.topology import Link
from .blocks import plan_block
from .layout import Layout, check_layout, chunks


@dataclass(frozen=True)
class AttentionBytes:
    """Bytes one rank sends in one attention layer's forward and backward."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        return self.forward + self.backward


def ring_attention_bytes(s: int, b: int, h: int, cp: int, itemsize: int,
                         grad_itemsize: Optional[int] = None) -> AttentionBytes:
    """Ring attention: forward (cp−1) K/V sends; backward (cp−1) K/V and cp dK/dV sends.
    itemsize: bytes of q, k, v's dtype; grad_itemsize: of the dK/dV accumulator (float32
    under 16-bit inputs, else the input's; default: that rule for itemsize 2, else itemsize)."""
    if grad_itemsize is None:
        grad_itemsize = 4 if itemsize == 2 else itemsize
    if cp == 1:
        return AttentionBytes(0.0, 0.0)
    shard = 2 * (s // cp) * b * h  # K and V of one rank: 2(s/cp)bh elements
    kv, dkv = shard * itemsize, shard * grad_itemsize
    return AttentionBytes(float((cp - 1) * kv), float((cp - 1) * kv + cp * dkv))


def ulysses_attention_bytes(s: int, b: int, h: int, cp: int, itemsize: int
                            ) -> AttentionBytes:
    """Ulysses: 4 tensors of (s/cp)bh elements through all-to-all each way, (cp−1)/cp of
    each leaving the rank (forward q, k, v and the context; backward their gradients)."""
    moved = 4 * (s // cp) * b * h * itemsize * (cp - 1) / cp
    return AttentionBytes(float(moved), float(moved))


def rank_units(layout: Layout, rank: int, cp: int) -> Fraction:
    """Chunk-pair units rank `rank` computes over the ring (full 1, diagonal 1/2)."""
    mine = chunks(layout, rank, cp)
    return sum((plan_block(mine, chunks(layout, src, cp)).units for src in range(cp)),
               Fraction(0))


def attention_work(layout: Layout, cp: int) -> list[Fraction]:
    """Each rank's share of the causal attention work: contiguous (2r+1)/cp², zigzag 1/cp."""
    k = check_layout(layout, cp)
    total = Fraction((k * cp) ** 2, 2)
    return [rank_units(layout, r, cp) / total for r in range(cp)]


def ring_attention_flops(layout: Layout, rank: int, cp: int, s: int, b: int,
                         num_heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) matmul FLOPs rank `rank` charges: units · 2·b·a·c²·d · (2, 5)."""
    k = check_layout(layout, cp)
    c = s // (k * cp)
    unit = 2.0 * b * num_heads * c * c * head_dim
    units = float(rank_units(layout, rank, cp))
    return 2 * units * unit, 5 * units * unit


def ring_hidden_length(b: int, h: int, cp: int, itemsize: int, peak_flops: float,
                       link: Link) -> int:
    """The shortest s at which a zigzag ring's K/V send hides behind each step's block:
    8·b·c²·h / F >= α + 4·c·b·h·e / B, with c = s/(2·cp). -> s, a multiple of 2·cp

    Under zigzag every step computes 2 chunk pairs' worth (2 units of c x c), 2 products
    each forward (q k^T, p v: 2·b·c²·h FLOPs a unit and product), at the device's peak F;
    the message is this rank's K and V, 2c rows of b·h elements of e bytes each, over a
    link of latency α and bandwidth B. Above the root of the quadratic the send is free;
    below it every step waits for it (the clock then runs (cp − 1)·T_send + T_block).
    The root is about F·e/(2B) tokens a chunk when α is small: on an H100 in bf16, 2.2k
    over NVLink 4 and 20k over InfiniBand NDR, whatever b and h.
    """
    if min(b, h, cp, itemsize) < 1 or peak_flops <= 0:
        raise ValueError(f"ring_hidden_length: b, h, cp, itemsize must be >= 1 and "
                         f"peak_flops > 0; got b={b}, h={h}, cp={cp}, itemsize={itemsize}, "
                         f"peak_flops={peak_flops}")
    A = 8.0 * b * h / peak_flops  # seconds a chunk's square: the step's compute is A·c²
    beta = 4.0 * b * h * itemsize / link.bandwidth  # seconds a token of chunk: the send
    c = (beta + math.sqrt(beta * beta + 4.0 * A * link.latency)) / (2.0 * A)
    c = max(1, math.ceil(c - 1e-9))
    while A * (c - 1) ** 2 >= link.latency + beta * (c - 1) and c > 1:  # rounding guard
        c -= 1
    while A * c * c < link.latency + beta * c:
        c += 1
    return 2 * cp * c
