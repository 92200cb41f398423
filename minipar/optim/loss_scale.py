"""Dynamic loss scaling: backward of (S·loss) gives S·g; step with g = (S·g)/S only if finite.

Float16 has 5 exponent bits: its smallest normal number is 2^-14 ≈ 6e-5, and gradients of
a large model are often smaller and flush to zero. Multiplying the loss by a scale S shifts
every gradient up by the same factor (backward is linear), into fp16's range; the optimizer
divides by S again in float32 before using them (Micikevicius et al. 2018, "Mixed
Precision Training", section 3.2). A scale that is too large overflows to inf, so S is
adjusted *dynamically*, as PyTorch's `torch.amp.GradScaler` and Megatron-LM's
`DynamicGradScaler` do:

    found = any gradient is inf or nan (after unscaling)
    found:      S ← max(S · backoff_factor, min_scale);  skip this step;  clean ← 0
    otherwise:  clean ← clean + 1;  if clean = growth_interval: S ← S · growth_factor, clean ← 0

A skipped step changes nothing: not the parameters, not the optimizer's moments, not its
step count (so Adam's bias correction is not advanced either). bfloat16 has float32's
8-bit exponent and needs no loss scaling. (Megatron adds a `hysteresis`: several
consecutive overflows before backing off; this scaler backs off at the first, as
GradScaler does.)
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..nn.parameter import Parameter


class DynamicLossScaler:
    """`scale` to multiply the loss (or the loss gradient) by; unscale, check, update."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 min_scale: float = 1.0):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        if not 0.0 < min_scale <= init_scale:
            raise ValueError(f"need 0 < min_scale <= init_scale, got min_scale={min_scale}, "
                             f"init_scale={init_scale}")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.growth_tracker = 0  # clean steps since the scale last changed
        self.overflows = 0       # steps skipped so far

    def unscale_and_check(self, params: Iterable[Parameter]) -> bool:
        """g ← g / S in place for every gradient; return True if any is inf or nan.

        Gradients must be float32 or wider (the division happens in their own precision):
        unscaling a float16 gradient in float16 would flush the small values that loss
        scaling exists to save. `MixedPrecisionOptimizer` unscales float32 copies.
        """
        found = False
        for p in params:
            g = p.grad
            if g is None:
                continue
            if g.dtype.itemsize < 4:
                raise ValueError(
                    f"refusing to unscale the {g.dtype} gradient of {p.name} in place: "
                    "unscaling in 16 bits would underflow the values loss scaling protects. "
                    "Unscale float32 copies (MixedPrecisionOptimizer does this)")
            np.divide(g, g.dtype.type(self.scale), out=g)
            if not np.isfinite(g).all():
                found = True
        return found

    def update(self, found_overflow: bool) -> None:
        """Back off after an overflow; grow after `growth_interval` clean steps in a row."""
        if found_overflow:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.growth_tracker = 0
            self.overflows += 1
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale, "growth_tracker": self.growth_tracker,
                "overflows": self.overflows}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.scale = float(sd["scale"])
        self.growth_factor = float(sd["growth_factor"])
        self.backoff_factor = float(sd["backoff_factor"])
        self.growth_interval = int(sd["growth_interval"])
        self.min_scale = float(sd["min_scale"])
        self.growth_tracker = int(sd["growth_tracker"])
        self.overflows = int(sd["overflows"])

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self.scale:g}, growth_tracker={self.growth_tracker}"
                f"/{self.growth_interval}, overflows={self.overflows})")
