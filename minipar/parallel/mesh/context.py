"""Context parallelism on the mesh: which rows of the sequence a rank runs, which attention
core reaches the others, and over which ranks the gradients average.

What crosses forms, answered here (parallel/cp, tp, pp and dp know nothing of each other):

    which rows a rank runs      rows cp.positions(layout, c, cp, s) of its dp block, c its
                                cp coordinate: "zigzag" (default; rank c holds chunks c and
                                2·cp−1−c, the causal work even) or "contiguous"
                                ids, targets: [s, B] -> [s/cp, B/dp]
    the position embedding      wpe at those rows' global positions (TensorParallelGPT's
                                positions)
    the attention core          ring attention or Ulysses over groups.cp
                                (TensorParallelGPT's attention_core), on the tp rank's a/t
                                heads; with sequence parallelism the s/cp rows are split
                                over tp outside attention, and gathered back before it
    the loss                    each rank's mean over its s/cp rows; the rows are equal in
                                number, so the mean over the cp group is the dp block's
    the gradients               averaged over dp_cp = dp x cp (Megatron-LM's dp_cp group):
                                every cp rank's loss is 1/cp of the block's, and its
                                gradient reaches the weights of every row through the K/V it
                                sent; ZeRO and FSDP shard over dp_shard x cp
    under a pipeline            the runner cuts each micro-batch's dp block to the rows
                                (its sequence_shard); the p2p messages are [s/cp, b/dp, h]

Refused with a message: dropout (the masks of a rank's rows would be a strided slice of
the one-device draw, not written), a mixture of experts (its balancing losses and capacity
are per sequence), and a sequence that the layout cannot cut evenly (zigzag: 2·cp chunks;
with sequence parallelism, each rank's s/cp rows split over tp too).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...nn.config import GPTConfig
from ...runtime.checks import divisors
from ..cp import (LAYOUTS, positions, ring_attention_backward, ring_attention_forward, shard,
                  ulysses_attention_backward, ulysses_attention_forward)
from ..tp import LOCAL_CORE, AttentionCore
from .dims import ParallelDims
from .groups import ParallelGroups

#: how attention reaches the other ranks' keys: K/V around a ring, or heads all-to-all
CP_METHODS = ("ring", "ulysses")


def check_context(cfg: GPTConfig, dims: ParallelDims, method: str, layout: str,
                  sequence_parallel: bool) -> None:
    """Refuse what context parallelism does not compose with, naming the fix."""
    if method not in CP_METHODS:
        raise ValueError(f"cp_method must be one of {CP_METHODS}, got {method!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"cp_layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    cp, tp = dims.cp, dims.tp
    if cp == 1:
        return
    if cfg.dropout > 0:
        raise ValueError(f"context parallelism (cp = {cp}) with dropout = {cfg.dropout}: a "
                         f"rank's masks would be the one-device draw at its rows, which is "
                         f"not written here; use GPTConfig(dropout=0.0) with cp > 1")
    if cfg.moe is not None:
        raise ValueError(f"context parallelism (cp = {cp}) with a mixture of experts "
                         f"(GPTConfig.moe) is not composed here: its capacity and balancing "
                         f"losses are per sequence; use cp = 1 with experts")
    k = 2 if layout == "zigzag" else 1
    if cfg.seq_len % (k * cp) or (sequence_parallel and (cfg.seq_len // cp) % tp):
        need = k * cp * (tp if sequence_parallel else 1)
        why = (f"{layout} cuts the sequence into {k * cp} chunks" +
               (f" and sequence parallelism splits each rank's rows over tp = {tp}"
                if sequence_parallel else ""))
        raise ValueError(f"seq_len = {cfg.seq_len} cannot be split over cp = {cp}: {why}; "
                         f"expected a multiple of {need}: choose seq_len accordingly")
    if method == "ulysses":
        heads = cfg.num_heads // tp
        if heads % cp:
            raise ValueError(f"Ulysses at cp = {cp} splits each tp rank's {heads} heads "
                             f"(num_heads = {cfg.num_heads} over tp = {tp}) over the cp "
                             f"group, but {heads} is not divisible by {cp}: choose cp in "
                             f"{divisors(heads)}, or "
                             f"cp_method='ring'")


def attention_core(groups: ParallelGroups, method: str, layout: str) -> AttentionCore:
    """The core every block's attention runs: nn's (cp = 1), or ring / Ulysses over
    groups.cp on this rank's rows."""
    if groups.dims.cp == 1:
        return LOCAL_CORE
    group = groups.cp
    if method == "ring":
        def forward(qkv, heads, p, rng, selective):  # qkv: [s/cp, b, 3h/t]
            return ring_attention_forward(qkv, heads, group, layout, p)
        return AttentionCore(forward, ring_attention_backward)

    def forward(qkv, heads, p, rng, selective):  # qkv: [s/cp, b, 3h/t]
        return ulysses_attention_forward(qkv, heads, group, layout, p, rng, selective)
    return AttentionCore(forward, ulysses_attention_backward)


def sequence_positions(cfg: GPTConfig, groups: ParallelGroups, layout: str
                       ) -> Optional[Callable[[int], np.ndarray]]:
    """positions(s_local) -> the global positions of this rank's s_local rows (None at
    cp = 1: 0..s-1)."""
    cp = groups.dims.cp
    if cp == 1:
        return None
    c = groups.coordinate["cp"]

    def rows(s_local: int) -> np.ndarray:
        s = s_local * cp
        if s > cfg.seq_len:
            raise ValueError(f"rank {groups.rank}: {s_local} rows at cp = {cp} make a "
                             f"sequence of {s}, beyond GPTConfig.seq_len = {cfg.seq_len}")
        return positions(layout, c, cp, s)  # [s/cp]
    return rows


def sequence_shard(groups: ParallelGroups, layout: str
                   ) -> Optional[Callable[[np.ndarray, np.ndarray], tuple]]:
    """shard(ids, targets) -> this rank's rows of them, [s, b] -> [s/cp, b] (None at
    cp = 1)."""
    cp = groups.dims.cp
    if cp == 1:
        return None
    c = groups.coordinate["cp"]

    def rows_of(ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # cp.shard refuses a length the layout cannot cut evenly
        return shard(ids, layout, c, cp), shard(targets, layout, c, cp)  # [s/cp, b] each
    return rows_of
