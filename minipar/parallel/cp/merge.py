"""Two partial attentions over disjoint key blocks merged into one: out −= sigmoid(lse_b −
lse)·(out − out_b);  lse −= logsigmoid(lse − lse_b).

A query's attention over keys K = K_1 ∪ K_2 is a weighted mean of its attention over each
block, weighted by each block's share of the softmax denominator. With the log-sum-exp
lse_i = log Σ_{j in K_i} exp(score_j) and out_i = Σ_{j in K_i} softmax_i(score)_j v_j:

    lse = log(e^lse_1 + e^lse_2)                  = lse_1 − logsigmoid(lse_1 − lse_2)
    out = (e^lse_1 out_1 + e^lse_2 out_2) / e^lse = out_1 − sigmoid(lse_2 − lse_1)(out_1 − out_2)

The right-hand forms never exponentiate a large number: sigmoid and logsigmoid of a
difference are computed from exp(−|x|) <= 1. (The left-hand forms overflow once a score
passes ~709 in float64, ~88 in float32.) This is the update of Liu et al. 2023's ring
attention and of FlashAttention's online softmax (Dao et al. 2022), in the form
ring-flash-attention's `_update_out_and_lse` writes it.

merge is associative and commutative (up to rounding): a ring merges the cp blocks in the
order they arrive, and the result is the softmax over all of them (`merge_ref`, the
definition, tests/parallel/cp/test_merge.py).
"""

from __future__ import annotations

import numpy as np


def logsigmoid(x: np.ndarray) -> np.ndarray:
    """log(1 / (1 + e^−x)) = min(x, 0) − log1p(e^−|x|), finite for every finite x."""
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^−x), from e^−|x| <= 1 (no overflow on either side)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def merge(out: np.ndarray, lse: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of the union of two key blocks from each block's (out, lse).
    out, out_b: [b, a, m, d]; lse, lse_b: [b, a, m] -> new arrays, the same shapes"""
    w = sigmoid(lse_b - lse)[..., None]  # w: [b, a, m, 1], block b's share
    return out - w * (out - out_b), lse - logsigmoid(lse - lse_b)


def merge_ref(outs: list, lses: list) -> tuple[np.ndarray, np.ndarray]:
    """The definition over any number of blocks: lse = log Σ_i e^lse_i (max subtracted),
    out = Σ_i e^(lse_i − lse) out_i.  outs: [b, a, m, d] each; lses: [b, a, m] each"""
    top = np.max(lses, axis=0)  # top: [b, a, m]
    lse = top + np.log(np.sum([np.exp(x - top) for x in lses], axis=0))  # [b, a, m]
    out = np.sum([np.exp(x - lse)[..., None] * o for o, x in zip(outs, lses)], axis=0)
    return out, lse
