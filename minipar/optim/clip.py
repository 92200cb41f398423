"""Global-norm clipping: ‖g‖ = √(Σ_params Σ_i g_i²);  g ← g · min(1, max_norm / (‖g‖ + 1e-6)).

Gradient clipping by the global L2 norm (Pascanu, Mikolov & Bengio 2013, "On the
difficulty of training recurrent neural networks"), as `torch.nn.utils.clip_grad_norm_`
does it: one norm over *all* gradients together, one coefficient for all of them, so the
direction of the whole update is kept and only its length is capped.

The three pieces are separate so that a sharded implementation (ZeRO-2/3, FSDP, tensor
parallelism) can reuse them:

    local  = squared_grad_norm(my_shard_params)       # Σ g² over what this rank holds
    total  = sqrt(all_reduce(local, op="sum"))         # all-reduce the SQUARES, then root
    coef   = clip_coef(total, max_norm)                 # the same number on every rank
    for p in my_shard_params: p.grad *= coef

A sharded implementation must all-reduce the *squared* norms before taking the root.
Clipping each shard by its own norm (or summing per-shard norms) is the classic bug: each
rank then scales by a different coefficient, the ranks' parameters drift apart, and the
model no longer matches the single-device one. (Replicated tensors, e.g. LayerNorm gains
under tensor parallelism, must be counted once, not once per rank.)

A non-finite norm (some gradient holds inf or nan) is treated exactly as
`torch.nn.utils.clip_grad_norm_` treats it with its default `error_if_nonfinite=False`:
the coefficient is computed all the same and every gradient is multiplied by it,

    ‖g‖ = inf  ->  coef = max_norm / inf = 0     finite elements become 0, inf ones nan
    ‖g‖ = nan  ->  coef = nan                    every element becomes nan

so the step that follows writes nan into the weights, visibly, instead of quietly stepping
with the unclipped gradients. `error_if_nonfinite=True` raises instead, naming the
parameters. `MixedPrecisionOptimizer` (whose float16 loss scaler skips such steps before
clipping) and the data-parallel engines use the same coefficient; `minipar train` stops the
run at the first non-finite norm, before the optimizer steps.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from ..nn.parameter import Parameter

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing


def squared_grad_norm(params: Iterable[Parameter]) -> float:
    """Σ over parameters with a gradient of Σ_i g_i², accumulated in float64."""
    total = 0.0
    for p in params:
        if p.grad is not None:
            g = p.grad.astype(np.float64)
            total += float(np.sum(g * g))
    return total


def global_grad_norm(params: Iterable[Parameter]) -> float:
    """‖g‖ = √(Σ_params Σ_i g_i²), in float64; inf or nan if any gradient is."""
    return math.sqrt(squared_grad_norm(params))


def clip_coef(total_norm: float, max_norm: float) -> float:
    """min(1, max_norm / (total_norm + 1e-6)): the factor every gradient is multiplied by;
    0 for an infinite norm and nan for a nan norm, as torch's clamp gives them."""
    if not max_norm > 0:  # also refuses nan, which would never clip
        raise ValueError(f"max_norm must be > 0 (math.inf: never clip), got {max_norm}")
    coef = max_norm / (total_norm + CLIP_EPS)  # nan for a nan norm, and for inf / inf
    return coef if math.isnan(coef) else min(1.0, coef)  # min(1.0, nan) would say 1.0


def scale_grad_(grad: np.ndarray, coef: float) -> None:
    """grad *= coef in place, in grad's dtype (coef 1.0: untouched; inf * 0 gives nan
    quietly, as torch's mul_ does)."""
    if coef != 1.0:  # nan != 1.0 too: a nan coefficient is applied, as torch applies it
        with np.errstate(invalid="ignore"):
            grad *= grad.dtype.type(coef)


def clip_grad_norm_(params: Iterable[Parameter], max_norm: float,
                    error_if_nonfinite: bool = False) -> float:
    """Scale all gradients in place so their global norm is at most `max_norm`; return
    the norm *before* clipping (what training logs as `grad_norm`).

    A non-finite norm (an inf or nan gradient) raises if `error_if_nonfinite`; otherwise
    the gradients are multiplied by the coefficient all the same (0 for inf, nan for nan),
    as torch.nn.utils.clip_grad_norm_ does (see the module docstring).
    """
    params = list(params)
    total = global_grad_norm(params)
    if not math.isfinite(total):
        if error_if_nonfinite:
            bad = [p.name for p in params
                   if p.grad is not None and not np.isfinite(p.grad.astype(np.float64)).all()]
            raise FloatingPointError(
                f"the global gradient norm is {total}: some gradient holds inf or nan "
                f"({bad[:5]}). Lower the learning rate or the loss scale, or use loss "
                "scaling with float16")
    coef = clip_coef(total, max_norm)
    for p in params:
        if p.grad is not None:
            scale_grad_(p.grad, coef)
    return total
