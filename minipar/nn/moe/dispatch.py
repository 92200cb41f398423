"""Which (token, choice) pairs each expert takes, and the permutation that groups them.

    capacity C = ceil(k · T / E · capacity_factor)        (GShard; Switch Transformer)
    expert e keeps at most C of the pairs routed to it:
        drop_policy "probs"     the C with the highest routing weight (Megatron-LM's default)
        drop_policy "position"  the first C in token order        (GShard, Switch)
    dropless (capacity None): every pair is kept (Megatron-LM's default without a factor)

    permute     xs[r] = x[token of row r]       rows grouped by expert, tokens in order
                (padded: each expert's group filled with zero rows up to C)
    unpermute   y[t] = Σ over t's kept pairs of w[t, j] · ys[row of (t, j)]

A dropped pair contributes nothing: its token keeps the residual stream only (and any
shared expert). The rows are Megatron-LM's layout (`permute` with a routing map: expert
by expert, each expert's tokens in token order), so the experts run one contiguous block
each (a grouped GEMM, or one MLP after another) and an all-to-all can send each expert's
block to the rank holding it (parallel/ep).

Backward:
    permute     dx[t] = Σ of dxs over t's rows                 (a scatter-add; padding drops)
    unpermute   dys[row of (t, j)] = w[t, j] · dy[t],   dw[t, j] = <dy[t], ys[row of (t, j)]>
                (0 for a dropped pair: no gradient reaches its weight)

Tokens are [T] = [s · b] flattened; capacity counts the tokens given, so layouts that
must drop the same tokens must route the same token groups (a micro-batch of one rank,
say) with the same capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..saved import Saved

DROP_POLICIES = ("probs", "position")


def capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """C = ceil(k · T / E · capacity_factor): the pairs one expert takes at most."""
    if capacity_factor is None or capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be a positive number (1.0: exactly the even "
                         f"share), got {capacity_factor!r}; for no dropping use capacity=None")
    return math.ceil(top_k * num_tokens / num_experts * capacity_factor)


@dataclass
class RoutingPlan:
    """The pairs kept and their rows: `row` [T, k] (-1 for a dropped pair), `counts` [E]
    (pairs kept by each expert), `rows_per_expert` [E] (counts, or C each when padded),
    `tokens` [R] (the token of each row; -1 for a padding row)."""

    row: np.ndarray
    counts: np.ndarray
    rows_per_expert: np.ndarray
    tokens: np.ndarray

    @property
    def kept(self) -> np.ndarray:
        """[T, k] bool: which pairs an expert takes."""
        return self.row >= 0

    @property
    def dropped(self) -> int:
        """How many (token, choice) pairs no expert takes."""
        return int((self.row < 0).sum())


def plan_routing(experts: np.ndarray, weights: np.ndarray, num_experts: int,
                 capacity: Optional[int] = None, drop_policy: str = "probs",
                 pad: bool = False) -> RoutingPlan:
    """Each expert's kept pairs and their rows, from the choice experts [T, k] and the
    weights [T, k] ("probs" drops the lowest weights first, ties to the later token)."""
    T, k = experts.shape
    if drop_policy not in DROP_POLICIES:
        raise ValueError(f"drop_policy must be one of {DROP_POLICIES}, got {drop_policy!r}")
    if pad and capacity is None:
        raise ValueError("pad=True fills each expert's block up to its capacity: give a "
                         "capacity (capacity_factor), or pad=False when dropless")
    flat = experts.reshape(-1)  # flat: [T·k], pair p = t·k + j
    pair_token = np.arange(T * k) // k
    kept = np.ones(T * k, dtype=bool)
    if capacity is not None:
        if drop_policy == "probs":  # by expert, then weight descending, then token
            order = np.lexsort((pair_token, -weights.reshape(-1), flat))
        else:  # by expert, then token
            order = np.lexsort((pair_token, flat))
        ranked = flat[order]
        rank = np.arange(T * k) - np.searchsorted(ranked, ranked)  # place within its expert
        kept[order[rank >= capacity]] = False
    counts = np.bincount(flat[kept], minlength=num_experts)  # counts: [E]
    per = np.full(num_experts, capacity) if pad else counts  # rows per expert: [E]
    starts = np.concatenate([[0], np.cumsum(per)[:-1]])
    chosen = np.flatnonzero(kept)
    chosen = chosen[np.lexsort((pair_token[chosen], flat[chosen]))]  # by expert, token
    first = np.searchsorted(flat[chosen], np.arange(num_experts))  # first of each expert
    within = np.arange(len(chosen)) - first[flat[chosen]]
    row = np.full(T * k, -1, dtype=np.int64)
    row[chosen] = starts[flat[chosen]] + within
    tokens = np.full(int(per.sum()), -1, dtype=np.int64)  # tokens: [R]
    tokens[row[chosen]] = pair_token[chosen]
    return RoutingPlan(row.reshape(T, k), counts, np.asarray(per, dtype=np.int64), tokens)


def permute(x: np.ndarray, plan: RoutingPlan) -> np.ndarray:
    """xs [R, h]: row r holds x[plan.tokens[r]] (zeros on padding rows).  x: [T, h]"""
    xs = np.zeros((len(plan.tokens), x.shape[-1]), dtype=x.dtype)  # xs: [R, h]
    real = plan.tokens >= 0
    xs[real] = x[plan.tokens[real]]
    return xs


def permute_backward(dxs: np.ndarray, plan: RoutingPlan, num_tokens: int) -> np.ndarray:
    """dx [T, h] = the sum of each token's rows of dxs [R, h] (padding rows drop out)."""
    dx = np.zeros((num_tokens, dxs.shape[-1]), dtype=dxs.dtype)  # dx: [T, h]
    real = plan.tokens >= 0
    np.add.at(dx, plan.tokens[real], dxs[real])
    return dx


def unpermute(ys: np.ndarray, plan: RoutingPlan, weights: np.ndarray
              ) -> tuple[np.ndarray, Saved]:
    """y [T, h] = Σ_j w[t, j] · ys[row(t, j)] over t's kept pairs; saves ys and w.
    ys: [R, h], weights: [T, k]"""
    T, k = plan.row.shape
    kept = plan.kept
    picked = np.zeros((T, k, ys.shape[-1]), dtype=ys.dtype)  # picked: [T, k, h]
    picked[kept] = ys[plan.row[kept]]
    y = np.einsum("tk,tkh->th", weights.astype(ys.dtype, copy=False), picked)  # y: [T, h]
    return y, Saved("unpermute", picked=picked, weights=weights)


def unpermute_backward(dy: np.ndarray, saved: Saved, plan: RoutingPlan
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(dys [R, h], dw [T, k]) from dy [T, h]: dys[row(t, j)] = w[t, j] dy[t] and
    dw[t, j] = <dy[t], ys[row(t, j)]> on kept pairs (0 on dropped ones and padding)."""
    w_dtype = saved.weights.dtype
    w, picked = saved.weights.astype(dy.dtype, copy=False), saved.picked
    kept = plan.kept
    dys = np.zeros((len(plan.tokens), dy.shape[-1]), dtype=dy.dtype)  # dys: [R, h]
    dys[plan.row[kept]] = (w[..., None] * dy[:, None, :])[kept]
    dw = np.einsum("th,tkh->tk", dy, picked)  # dw: [T, k]; a dropped pair's picked is 0
    saved.release()
    return dys, dw.astype(w_dtype, copy=False)
