"""DeepSpeed-Ulysses: context = A2A⁻¹(attention(A2A(qkv))), the all-to-all trading a
sequence shard of every head for every token of a/cp heads: [s/cp, b, a, ·] <-> [s, b, a/cp, ·].

    qkv [s/cp, b, 3h]  ─ all_to_all: head group j to rank j ─►  [s, b, 3h/cp]
        (each rank now holds every token of its a/cp heads; with the zigzag layout the
        tokens arrive in the ranks' order and are put back in sequence order)
    core_attention_forward on a/cp heads, exactly nn's one-device core  ─►  [s, b, h/cp]
    context  ─ all_to_all: tokens of rank i back to rank i ─►  [s/cp, b, h]

    forward:   all_to_all qkv (q, k and v of a head travel together), all_to_all context
    backward:  the same all-to-alls reversed: dcontext [s/cp, b, h] -> [s, b, h/cp],
               core_attention_backward, dqkv [s, b, 3h/cp] -> [s/cp, b, 3h]

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
Extreme Long Sequence Transformer Models", section 3. DeepSpeed issues one all-to-all each
for q, k and v; here the QKV projection's features are ordered [a, 3, d] (nn/attention.py),
so one head group's q, k and v are contiguous and go in one all-to-all of the same bytes.

The limit: the heads are what is split, so cp must divide the head count (under tensor
parallelism, the heads a tp rank holds). Ring attention (ring.py) has no such limit.

Layouts. The attention core needs the whole sequence in order; the all-to-all delivers it
in the ranks' order (rank 0's tokens, rank 1's, ...). Any layout works: the gathered rows
are permuted into sequence order before the core and back after it (a local copy, no
communication; the identity for "contiguous"). So Ulysses can share zigzag's layout with
ring attention in the same model.

Dropout. The core draws its mask with `rng.random([b, a/cp, s, s])`. To equal one device,
pass an rng whose draw is this rank's head slice of the one-device draw over
[b, a, s, s] (what tp's SlicedDraw gives with cuts {1: (cp rank, cp)}; parallel/mesh owns
that choice); a plain generator gives a valid dropout that is not one device's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...nn.attention import core_attention_backward, core_attention_forward
from ...nn.saved import Saved
from ...runtime.checks import divisors
from ...runtime.collectives import all_to_all
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .layout import Layout, sequence_order
from .qkv import check_group, check_qkv


def check_heads(num_heads: int, group: ProcessGroup, what: str = "ulysses") -> int:
    """a/cp, the heads each rank attends over, or an error naming the cp that would work."""
    cp = group.size
    if num_heads % cp:
        fits = divisors(num_heads)
        raise ValueError(f"rank {current().rank}: {what} on cp group {group}: num_heads = "
                         f"{num_heads} is not divisible by cp = {cp}: choose cp in "
                         f"{{{', '.join(map(str, fits))}}} or use ring attention")
    return num_heads // cp


def _heads_to_ranks(x: np.ndarray, group: ProcessGroup, order: Optional[np.ndarray]
                    ) -> np.ndarray:
    """[s/cp, b, f] (features: cp head groups) -> [s, b, f/cp] (every token, my heads)."""
    pieces = np.split(x, group.size, axis=2)  # cp pieces: [s/cp, b, f/cp]
    rows = np.concatenate(all_to_all(pieces, group=group), axis=0)  # [s, b, f/cp], rank order
    return rows if order is None else rows[np.argsort(order, kind="stable")]  # sequence order


def _tokens_to_ranks(x: np.ndarray, group: ProcessGroup, order: Optional[np.ndarray]
                     ) -> np.ndarray:
    """[s, b, f/cp] (sequence order, my heads) -> [s/cp, b, f] (my tokens, every head)."""
    rows = x if order is None else x[order]  # rows: [s, b, f/cp] in the ranks' order
    pieces = np.split(rows, group.size, axis=0)  # cp pieces: [s/cp, b, f/cp]
    return np.concatenate(all_to_all(pieces, group=group), axis=2)  # [s/cp, b, f]


def _order(layout: Layout, cp: int, s: int) -> Optional[np.ndarray]:
    """The gathered rows' global positions, or None when they are already in order."""
    order = sequence_order(layout, cp, s)  # order: [s]
    return None if np.array_equal(order, np.arange(s)) else order


def ulysses_attention_forward(qkv: np.ndarray, num_heads: int, group: ProcessGroup,
                              layout: Layout = "contiguous", p: float = 0.0,
                              rng=None, selective: bool = False) -> tuple[np.ndarray, Saved]:
    """context [s/cp, b, h] of this rank's tokens, and what backward needs.
    qkv: [s/cp, b, 3h], this rank's tokens in `layout` order; the result equals
    layout.shard of core_attention_forward's context (with dropout: see the module)."""
    _, cp = check_group(group, "ulysses_attention_forward")
    s = check_qkv(qkv, num_heads, group, layout, "ulysses_attention_forward")
    local_heads = check_heads(num_heads, group, "ulysses_attention_forward")
    if p > 0 and rng is None:
        raise ValueError(f"rank {current().rank}: ulysses_attention_forward on cp group "
                         f"{group} received p = {p} and no rng: pass the generator the "
                         f"dropout mask is drawn from (see the module's docstring)")
    order = _order(layout, cp, s)
    full = np.asarray(qkv) if cp == 1 else _heads_to_ranks(np.asarray(qkv), group, order)
    # full: [s, b, 3h/cp], every token of this rank's a/cp heads, in sequence order
    context, s_core = core_attention_forward(full, local_heads, p, rng, selective)  # [s, b, h/cp]
    out = context if cp == 1 else _tokens_to_ranks(context, group, order)  # [s/cp, b, h]
    return out, Saved("cp.ulysses", core=s_core, group=group, layout=layout, s=s,
                      shape=out.shape)


def ulysses_attention_backward(dcontext: np.ndarray, saved: Saved) -> np.ndarray:
    """dqkv [s/cp, b, 3h] from dcontext [s/cp, b, h]: the forward's all-to-alls reversed
    around nn's core backward."""
    group, cp = saved.group, saved.group.size
    check_group(group, "ulysses_attention_backward")
    if np.shape(dcontext) != saved.shape:
        raise ValueError(f"rank {current().rank}: ulysses_attention_backward on cp group "
                         f"{group} expected dcontext of the forward's context shape "
                         f"{saved.shape} [s/cp, b, h], received {np.shape(dcontext)}")
    order = _order(saved.layout, cp, saved.s)
    d_full = np.asarray(dcontext) if cp == 1 else \
        _heads_to_ranks(np.asarray(dcontext), group, order)  # d_full: [s, b, h/cp]
    dqkv = core_attention_backward(d_full, saved.core)  # dqkv: [s, b, 3h/cp]
    saved.release()
    return dqkv if cp == 1 else _tokens_to_ranks(dqkv, group, order)  # [s/cp, b, 3h]
