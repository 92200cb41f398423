"""The router of a mixture of experts: each token's k experts and their weights.

    logits = x W_r^T                          x: [T, h], W_r: [E, h] -> [T, E]
    scores = softmax(logits)                  (GShard, Switch, Mixtral; Megatron's default)
           | sigmoid(logits)                  (DeepSeek-V3)
    chosen = top-k of (scores + bias)         bias: [E], selection only (aux-loss-free)
             within the top-M groups          (DeepSeek-V3's group-limited routing)
    g      = scores at the chosen experts     [T, k]
    w      = g / sum(g)  if normalize         (the k weights of a token sum to 1)
           = g           otherwise            (Switch's and GShard's raw probability)
    w     *= scaling_factor                   (DeepSeek-V3's routed scaling, 2.5 there)

References: GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021) for
softmax routing; DeepSeek-V3 (DeepSeek-AI 2024, section 2.1.2) for sigmoid scores, weights
normalised over the chosen experts, the selection bias and group-limited routing; the names
are Megatron-LM's (`TopKRouter`, `moe_router_score_function`, `moe_router_topk_scaling_factor`,
`moe_router_num_groups`, `moe_router_group_topk`). With softmax and normalize, the weights
are softmax over the k chosen logits: Megatron's default (top-k, then softmax) and
Mixtral's.

Selection. Ties go to the lower expert index (a stable sort), so a layout that routes the
same tokens picks the same experts. The bias moves which experts are chosen and never the
weights: g reads the scores, not scores + bias. Groups: the E experts are G equal groups
of consecutive experts; a group's score is the sum of its two highest (scores + bias), the
M best groups are kept, and the top k are chosen among their experts.

Backward. Only the weights w carry a gradient to the router (the choice is a step
function): with ŵ = g / Σg,

    dg    = scaling · (dw − Σ_j dw_j ŵ_j) / Σg     (normalize)  |  scaling · dw  (not)
    dscores[t, chosen] = dg,  plus what the balancing losses add  (balancing.py)
    dlogits = softmax'(dscores) | dscores · s (1 − s),  plus the z-loss's gradient
    dx = dlogits W_r,  dW_r = dlogits^T x                        (the router's Linear)

`aux_probs` are the per-token probabilities the balancing losses read: the softmax scores
themselves, or the sigmoid scores divided by their sum over experts (DeepSeek-V3's s');
`aux_probs_backward` carries their gradient back to dscores.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..linear import Linear
from ..matmul import compute_dtype
from ..module import Module
from ..saved import Saved
from ..softmax import softmax
from ..weight_grads import WeightGradStore

SCORE_FUNCTIONS = ("softmax", "sigmoid")


def scores_of(logits: np.ndarray, score_function: str) -> np.ndarray:
    """softmax(logits) or sigmoid(logits) over the experts, in the compute dtype."""
    z = logits.astype(compute_dtype(logits.dtype), copy=False)
    if score_function == "softmax":
        return softmax(z, axis=-1)
    return 1.0 / (1.0 + np.exp(-z))  # sigmoid


def scores_backward(dscores: np.ndarray, scores: np.ndarray, score_function: str
                    ) -> np.ndarray:
    """dlogits from dscores: s (ds − Σ ds s) for softmax, ds s (1 − s) for sigmoid."""
    if score_function == "softmax":
        return scores * (dscores - (dscores * scores).sum(axis=-1, keepdims=True))
    return dscores * scores * (1.0 - scores)


def select_topk(selection: np.ndarray, k: int, num_groups: int = 1,
                topk_groups: Optional[int] = None) -> np.ndarray:
    """The k highest entries of each row of `selection` [T, E] (scores + bias), best first,
    ties to the lower index; with G groups, only among the `topk_groups` groups whose two
    highest entries sum highest. -> int64 [T, k]"""
    T, E = selection.shape
    if num_groups > 1:
        per = E // num_groups
        grouped = selection.reshape(T, num_groups, per)  # grouped: [T, G, E/G]
        top2 = -np.sort(-grouped, axis=-1)[..., :min(2, per)].sum(axis=-1)  # top2: [T, G]
        keep = np.argsort(-top2, axis=-1, kind="stable")[:, :topk_groups]  # keep: [T, M]
        allowed = np.zeros((T, num_groups), dtype=bool)
        np.put_along_axis(allowed, keep, True, axis=-1)
        selection = np.where(np.repeat(allowed, per, axis=-1), selection, -np.inf)
    return np.argsort(-selection, axis=-1, kind="stable")[:, :k].astype(np.int64)


def aux_probs(scores: np.ndarray, score_function: str) -> np.ndarray:
    """Per-token probabilities over experts for the balancing losses: the softmax scores,
    or the sigmoid scores normalised to sum to 1 (DeepSeek-V3's s'). [T, E]"""
    if score_function == "softmax":
        return scores
    return scores / scores.sum(axis=-1, keepdims=True)


def aux_probs_backward(dprobs: np.ndarray, scores: np.ndarray, score_function: str
                       ) -> np.ndarray:
    """dscores from the gradient of aux_probs: itself for softmax; for p = s / Σs,
    ds = (dp − Σ_j dp_j p_j) / Σs."""
    if score_function == "softmax":
        return dprobs
    total = scores.sum(axis=-1, keepdims=True)
    p = scores / total
    return (dprobs - (dprobs * p).sum(axis=-1, keepdims=True)) / total


class TopKRouter(Module):
    """x [T, h] -> (weights [T, k], experts [T, k]): the gate of a mixture of experts.

    The projection is a bias-free `Linear` named `{name}.weight` ([E, h], std as the
    model's). `expert_bias` ([E] float32, not a parameter: no gradient, no optimizer) is
    DeepSeek-V3's selection bias, zero until balancing.update_expert_bias moves it;
    `tokens_per_expert` counts the choices of the micro-batches whose backward ran since
    the last `reset_counts()` (what that update reads, once per step)."""

    parameter_order = ("linear",)

    def __init__(self, name: str, hidden: int, num_experts: int, top_k: int,
                 score_function: str = "softmax", normalize: bool = True,
                 scaling_factor: float = 1.0, num_groups: int = 1,
                 topk_groups: Optional[int] = None, seed: int = 0, dtype=np.float64,
                 std: float = 0.02):
        check_routing(num_experts, top_k, score_function, num_groups, topk_groups)
        self.name, self.num_experts, self.top_k = name, num_experts, top_k
        self.score_function, self.normalize = score_function, normalize
        self.scaling_factor = float(scaling_factor)
        self.num_groups = num_groups
        self.topk_groups = num_groups if topk_groups is None else topk_groups
        self.linear = Linear(name, hidden, num_experts, bias=False, seed=seed, dtype=dtype,
                             std=std)
        self.expert_bias = np.zeros(num_experts, dtype=np.float32)
        self.tokens_per_expert = np.zeros(num_experts, dtype=np.int64)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, "RouterSaved"]:
        """(w [T, k], experts [T, k], saved) for tokens x [T, h]."""
        logits, s_lin = self.linear.forward(x)  # logits: [T, E]
        scores = scores_of(logits, self.score_function)  # scores: [T, E]
        selection = scores + self.expert_bias if self.expert_bias.any() else scores
        experts = select_topk(selection, self.top_k, self.num_groups, self.topk_groups)
        g = np.take_along_axis(scores, experts, axis=-1)  # g: [T, k]
        total = g.sum(axis=-1, keepdims=True) if self.normalize else None  # total: [T, 1]
        w = (g / total if self.normalize else g) * self.scaling_factor  # w: [T, k]
        saved = RouterSaved(s_lin, logits, scores, experts, g, total)
        return w.astype(x.dtype, copy=False), experts, saved

    def backward(self, dw: np.ndarray, saved: "RouterSaved",
                 dscores_extra: Optional[np.ndarray] = None,
                 dlogits_extra: Optional[np.ndarray] = None,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx [T, h] from dw [T, k] (the weights' gradient), plus the balancing losses'
        gradients with respect to the scores and the logits (already scaled by the loss's
        weight); accumulates dW_r (or, with a store, defers it to W). Counts the choices
        into tokens_per_expert here, once per micro-batch: a recomputed forward (full
        recompute) routes again, but its backward runs once.
        """
        np.add.at(self.tokens_per_expert, saved.experts.reshape(-1), 1)
        ct = saved.scores.dtype
        dwf = dw.astype(ct, copy=False) * self.scaling_factor  # dwf: [T, k]
        if saved.total is not None:
            what = saved.g / saved.total  # the normalised weights ŵ: [T, k]
            dg = (dwf - (dwf * what).sum(axis=-1, keepdims=True)) / saved.total
        else:
            dg = dwf
        dscores = np.zeros_like(saved.scores)  # dscores: [T, E]
        np.put_along_axis(dscores, saved.experts, dg, axis=-1)  # the k chosen are distinct
        if dscores_extra is not None:
            dscores += dscores_extra
        dlogits = scores_backward(dscores, saved.scores, self.score_function)  # [T, E]
        if dlogits_extra is not None:
            dlogits += dlogits_extra
        dtype = saved.dtype
        saved.release()  # not the linear's record (x): its backward releases it, or W's
        return self.linear.backward(dlogits.astype(dtype, copy=False), saved.linear_record,
                                    store)

    def reset_counts(self) -> None:
        self.tokens_per_expert[:] = 0

    def __repr__(self) -> str:
        groups = (f", groups {self.topk_groups} of {self.num_groups}"
                  if self.num_groups > 1 else "")
        return (f"TopKRouter({self.name}, {self.score_function}, top {self.top_k} of "
                f"{self.num_experts}{groups}, normalize={self.normalize}, "
                f"scaling={self.scaling_factor:g})")


class RouterSaved(Saved):
    """What the router's backward reads: the logits and scores [T, E], the choice [T, k],
    the chosen scores g and their sum (None: not normalised); and the Linear's own record
    (x), kept apart: releasing this one leaves it to the Linear's backward."""

    def __init__(self, linear: Saved, logits, scores, experts, g, total):
        super().__init__("router", logits=logits, scores=scores, experts=experts, g=g,
                         total=total, dtype=logits.dtype)
        self.__dict__["linear_record"] = linear


def check_routing(num_experts: int, top_k: int, score_function: str, num_groups: int = 1,
                  topk_groups: Optional[int] = None) -> None:
    """Refuse a routing that cannot be run, saying what to change."""
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be an int in 1..num_experts = 1..{num_experts}, got "
                         f"{top_k!r}")
    if score_function not in SCORE_FUNCTIONS:
        raise ValueError(f"score_function must be one of {SCORE_FUNCTIONS}, got "
                         f"{score_function!r}")
    if not isinstance(num_groups, int) or num_groups < 1 or num_experts % num_groups:
        raise ValueError(f"num_groups must divide num_experts = {num_experts} (experts are "
                         f"split into equal groups), got {num_groups!r}")
    m = num_groups if topk_groups is None else topk_groups
    if not isinstance(m, int) or not 1 <= m <= num_groups:
        raise ValueError(f"topk_groups must be in 1..num_groups = 1..{num_groups}, got {m!r}")
    if m * (num_experts // num_groups) < top_k:
        raise ValueError(f"the {m} kept group(s) of {num_experts // num_groups} experts hold "
                         f"{m * (num_experts // num_groups)} experts, fewer than top_k = "
                         f"{top_k}: keep more groups or choose fewer experts")
