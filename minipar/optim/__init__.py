"""Optimizers, learning-rate schedules, gradient clipping, mixed precision, loss scaling.

    opt = AdamW(model_params, lr=3e-4, weight_decay=0.1,
                weight_decay_filter=no_decay_for("*.bias", "*ln*"))
    sched = WarmupCosine(opt, max_lr=3e-4, warmup_steps=100, total_steps=10_000)
    ...backward...
    clip_grad_norm_(model_params, 1.0)
    opt.step(); opt.zero_grad(); sched.step()

In 16 bits: `MixedPrecisionOptimizer(AdamW, params, dtype="bfloat16", lr=...)` keeps
float32 master weights (and, for float16, a `DynamicLossScaler`); its `step()` returns
whether the step was taken.

This package depends only on `Parameter` and the runtime's ledger: it knows nothing of
models or of parallelism (a sharded optimizer composes these pieces in `parallel/`).
"""

from .adam import Adam, AdamW
from .clip import clip_coef, clip_grad_norm_, global_grad_norm, squared_grad_norm
from .loss_scale import DynamicLossScaler
from .mixed_precision import HALF_DTYPES, MixedPrecisionOptimizer, half_dtype
from .optimizer import Optimizer, no_decay_for, state_dtype
from .schedule import LRScheduler, WarmupCosine, warmup_cosine
from .sgd import SGD

__all__ = [
    "Adam", "AdamW", "SGD", "Optimizer", "no_decay_for", "state_dtype",
    "clip_coef", "clip_grad_norm_", "global_grad_norm", "squared_grad_norm",
    "DynamicLossScaler", "MixedPrecisionOptimizer", "HALF_DTYPES", "half_dtype",
    "LRScheduler", "WarmupCosine", "warmup_cosine",
]
