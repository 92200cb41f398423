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
    """min(1, max_norm / (total_norm + 1e-6)): the factor every gradient is multiplied by."""
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    return min(1.0, max_norm / (total_norm + CLIP_EPS))


def clip_grad_norm_(params: Iterable[Parameter], max_norm: float,
                    error_if_nonfinite: bool = False) -> float:
    """Scale all gradients in place so their global norm is at most `max_norm`; return
    the norm *before* clipping (what training logs as `grad_norm`).

    A non-finite norm (an inf or nan gradient) raises if `error_if_nonfinite`; otherwise
    the gradients are left untouched and the norm is returned, so the caller (or the loss
    scaler, which skips such steps) can decide.
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
        return total
    coef = clip_coef(total, max_norm)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad[...] = p.grad * p.grad.dtype.type(coef)
    return total
