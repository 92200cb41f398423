"""Warmup + cosine: lr = max_lr·s/W (s < W), then min_lr + ½Δlr·(1 + cos(π(s−W)/(T−W))).

The learning-rate schedule of most LLM pre-training runs: a linear warmup (Goyal et al.
2017, "Accurate, Large Minibatch SGD") followed by cosine decay (Loshchilov & Hutter 2017,
"SGDR"), as in GPT-3 (Brown et al. 2020, appendix B) and Megatron-LM's
`OptimizerParamScheduler` with `lr_decay_style="cosine"`:

    s < W:          lr = max_lr · s / W                     (0 at s = 0)
    W ≤ s ≤ T:      lr = min_lr + ½ (max_lr − min_lr)(1 + cos(π (s − W) / (T − W)))
    s > T:          lr = min_lr

with W = warmup_steps and T = total_steps. Step s is the number of optimizer steps already
taken, so the very first step runs at lr(0) = 0 when W > 0, as in Megatron and the Hugging
Face schedules.

`LRScheduler(opt, lr_at)` sets `opt.lr = lr_at(s)` at construction (s = 0) and after each
`step()`. Call it once per optimizer step that was *taken*: with float16 loss scaling a
skipped step should not advance the schedule (Megatron-LM only advances its scheduler when
`optimizer.step()` succeeded).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol


def warmup_cosine(step: int, max_lr: float, warmup_steps: int, total_steps: int,
                  min_lr: float = 0.0) -> float:
    """The learning rate after `step` optimizer steps (see the module docstring)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps, got warmup_steps="
                         f"{warmup_steps}, total_steps={total_steps}")
    if not 0.0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)   # in [0, 1)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class HasLR(Protocol):
    lr: float


class LRScheduler:
    """Sets `optimizer.lr = lr_at(s)` for s = 0 now and s = 1, 2, ... on each `step()`.

    Unlike torch's LambdaLR, `lr_at` returns the learning rate itself, not a multiplier.
    """

    def __init__(self, optimizer: HasLR, lr_at: Callable[[int], float]):
        self.optimizer = optimizer
        self.lr_at = lr_at
        self.last_step = 0
        self.optimizer.lr = float(lr_at(0))

    def step(self) -> float:
        """Advance by one optimizer step; set and return the new learning rate."""
        self.last_step += 1
        lr = float(self.lr_at(self.last_step))
        self.optimizer.lr = lr
        return lr

    def get_lr(self) -> float:
        return float(self.lr_at(self.last_step))

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.last_step = int(sd["last_step"])
        self.optimizer.lr = self.get_lr()


class WarmupCosine(LRScheduler):
    """`LRScheduler` over `warmup_cosine(s, max_lr, warmup_steps, total_steps, min_lr)`."""

    def __init__(self, optimizer: HasLR, max_lr: float, warmup_steps: int, total_steps: int,
                 min_lr: float = 0.0):
        warmup_cosine(0, max_lr, warmup_steps, total_steps, min_lr)  # validate now
        self.max_lr, self.warmup_steps = max_lr, warmup_steps
        self.total_steps, self.min_lr = total_steps, min_lr
        super().__init__(optimizer, lambda s: warmup_cosine(s, max_lr, warmup_steps,
                                                            total_steps, min_lr))
