"""Mixed precision: master₃₂ ← inner_step(master₃₂, float32(grad₁₆) / S);  p₁₆ ← round₁₆(master₃₂).

The model computes in 16 bits (bfloat16 or float16): its parameters and gradients are
16-bit. The optimizer keeps a float32 *master* copy of every 16-bit parameter, runs the
inner optimizer (AdamW, SGD, ...) on the masters with float32 gradients, and writes the
rounded result back into the model (Micikevicius et al. 2018, "Mixed Precision Training";
Megatron-LM's `Float16OptimizerWithFloat16Params`). The masters matter: a bf16 weight near
1 has an ulp of 2^-7 ≈ 0.008, so an update of lr·1 = 1e-3 applied in bf16 rounds back to
the old value and is lost; in the float32 master it accumulates until it shows.

One `step()`:

    1. for each 16-bit p with a gradient:  master.grad = float32(p.grad)   (transient)
    2. with a loss scaler:  g ← g / S; if any g is inf/nan → skip, back off S, return False
    3. optional:           clip_grad_norm_(masters, max_grad_norm) on the unscaled grads
    4. inner.step()        on the masters (and on float32 parameters directly)
    5. p.set_data(round₁₆(master))                                        → return True

Memory, for Ψ parameter elements with Adam (ZeRO, Rajbhandari et al. 2020, section 3.1):

    parameters        2Ψ   16-bit p.data                 (the model's, "param:{name}")
    gradients         2Ψ   16-bit p.grad                 (the model's, "grad:{name}")
    optimizer_states  4Ψ   float32 masters               "optim:{name}.master"
                    + 4Ψ   Adam m                         "optim:{name}.m"
                    + 4Ψ   Adam v                         "optim:{name}.v"   = 12Ψ
    total            16Ψ

The masters are made (and charged) eagerly, at construction; m and v lazily at the first
step, as in `Optimizer`. During `step()` the float32 gradient copies are also held, as
"gradients" named `optim:{name}.grad32` (4Ψ more at the peak, given back before `step`
returns), so `ledger.peak("gradients")` is 6Ψ. Megatron keeps such a float32 gradient
buffer permanently (`main_grad`); a leaner implementation would convert one tensor at a
time. Parameters that are already float32 (or float64) get no master: the inner optimizer
updates them directly, after their gradients are unscaled in place.

With `dtype="float16"` a `DynamicLossScaler` is made unless one is given
(`loss_scaler=None` turns it off); multiply the loss gradient by `opt.loss_scale` before
backward. With bfloat16 (float32's exponent range) there is no loss scaling by default.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import ml_dtypes
import numpy as np

from ..nn.parameter import Parameter
from ..runtime.context import current
from .clip import clip_grad_norm_
from .loss_scale import DynamicLossScaler
from .optimizer import Optimizer

HALF_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}


def half_dtype(dtype: Union[str, np.dtype]) -> np.dtype:
    """'bfloat16' | 'float16' (or the numpy dtype) -> the numpy dtype."""
    d = HALF_DTYPES.get(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    if d is None or d not in HALF_DTYPES.values():
        raise ValueError(f"mixed precision needs dtype 'bfloat16' or 'float16', got {dtype!r}")
    return d


class MixedPrecisionOptimizer:
    """`MixedPrecisionOptimizer(AdamW, params, dtype="bfloat16", lr=..., ...)`.

    `inner_cls(master_params, **kwargs)` builds the inner optimizer. `step()` returns
    whether the step was taken (False when the loss scaler found an overflow).
    """

    def __init__(self, inner_cls: type[Optimizer], params: Iterable[Parameter],
                 dtype: Union[str, np.dtype] = "bfloat16",
                 loss_scaler: Union[DynamicLossScaler, None, str] = "auto",
                 max_grad_norm: Optional[float] = None, **kwargs: Any):
        self.dtype = half_dtype(dtype)
        self.params: list[Parameter] = list(params)
        self._ledger = current().ledger
        for p in self.params:  # check everything before charging anything
            if p.data.dtype not in (self.dtype, np.float32, np.float64):
                raise TypeError(
                    f"{p.name} is {p.data.dtype} but this optimizer was built for "
                    f"{self.dtype} (mixed precision keeps float32 masters for {self.dtype} "
                    "parameters and steps float32/float64 ones directly)")
        self.masters: dict[str, Parameter] = {}     # name -> float32 master (16-bit params)
        stepped: list[Parameter] = []               # what the inner optimizer updates
        for p in self.params:
            if p.data.dtype == self.dtype:
                master = Parameter(p.name, p.data.astype(np.float32), charge=False)
                self._ledger.hold(f"optim:{p.name}.master", master.data, "optimizer_states")
                self.masters[p.name] = master
                stepped.append(master)
            else:
                stepped.append(p)
        self._stepped = stepped
        self.inner = inner_cls(stepped, **kwargs)
        if isinstance(loss_scaler, str):
            if loss_scaler != "auto":
                raise ValueError(f"loss_scaler must be 'auto', None or a DynamicLossScaler, "
                                 f"got {loss_scaler!r}")
            loss_scaler = DynamicLossScaler() if self.dtype == np.float16 else None
        self.loss_scaler: Optional[DynamicLossScaler] = loss_scaler
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm: Optional[float] = None
        self.steps_taken = 0
        self.steps_skipped = 0

    # ---- what the training loop uses --------------------------------------------------
    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value

    @property
    def loss_scale(self) -> float:
        """Multiply the loss (the gradient fed into backward) by this; 1.0 without a scaler."""
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def zero_grad(self) -> None:
        """Drop the model's gradients (and any float32 copies, were a step interrupted)."""
        self._free_master_grads()
        for p in self.params:
            p.free_grad()

    def step(self) -> bool:
        """Upcast, unscale and check, clip, step the masters, round back. True if taken."""
        # 1. float32 copies of the 16-bit gradients, on the masters (held while we work)
        for p in self.params:
            master = self.masters.get(p.name)
            if master is not None and p.grad is not None:
                master.grad = p.grad.astype(np.float32)
                self._ledger.hold(f"optim:{p.name}.grad32", master.grad, "gradients")
        try:
            # 2. loss scaling: divide by S in float32; any inf/nan skips the whole step
            if self.loss_scaler is not None:
                found = self.loss_scaler.unscale_and_check(self._stepped)
                self.loss_scaler.update(found)
                if found:
                    self.steps_skipped += 1
                    return False
            # 3. clipping by the global norm of the true (unscaled) gradients
            if self.max_grad_norm is not None:
                self.last_grad_norm = clip_grad_norm_(self._stepped, self.max_grad_norm)
            # 4. the inner optimizer on float32 masters
            self.inner.step()
            # 5. write the rounded masters back into the model
            for p in self.params:
                master = self.masters.get(p.name)
                if master is not None and master.grad is not None:
                    p.set_data(master.data.astype(self.dtype))
            self.steps_taken += 1
            return True
        finally:
            self._free_master_grads()

    def _free_master_grads(self) -> None:
        for name, master in self.masters.items():
            if master.grad is not None:
                self._ledger.release(f"optim:{name}.grad32")
                master.grad = None

    # ---- memory and checkpoints -------------------------------------------------------
    def release(self) -> None:
        """Give back the masters' and the inner optimizer's bytes."""
        self._free_master_grads()
        for name in list(self.masters):
            self._ledger.release(f"optim:{name}.master")
        self.masters.clear()
        self.inner.release()

    def state_dict(self) -> dict[str, Any]:
        """{"inner": ..., "master": {name: float32 array}, "loss_scaler": ... | None,
        "steps_taken": int, "steps_skipped": int} (arrays are copies)."""
        return {
            "inner": self.inner.state_dict(),
            "master": {name: m.data.copy() for name, m in self.masters.items()},
            "loss_scaler": (self.loss_scaler.state_dict()
                            if self.loss_scaler is not None else None),
            "steps_taken": self.steps_taken,
            "steps_skipped": self.steps_skipped,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore the state and make each 16-bit parameter the rounding of its master."""
        missing = sorted(set(self.masters) - set(sd["master"]))
        extra = sorted(set(sd["master"]) - set(self.masters))
        if missing or extra:
            raise KeyError(f"master weights do not match: missing {missing[:10]}, "
                           f"unexpected {extra[:10]}")
        for name, arr in sd["master"].items():
            if arr.shape != self.masters[name].shape:
                raise ValueError(f"master of {name} has shape {arr.shape} in the state dict, "
                                 f"expected {self.masters[name].shape}")
        if (sd["loss_scaler"] is None) != (self.loss_scaler is None):
            raise ValueError("the state dict and this optimizer disagree on loss scaling "
                             f"(state dict: {sd['loss_scaler'] is not None}, "
                             f"here: {self.loss_scaler is not None})")
        self.inner.load_state_dict(sd["inner"])
        for name, arr in sd["master"].items():
            np.copyto(self.masters[name].data, arr, casting="same_kind")
        for p in self.params:
            if p.name in self.masters:
                p.set_data(self.masters[p.name].data.astype(self.dtype))
        if self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(sd["loss_scaler"])
        self.steps_taken = int(sd["steps_taken"])
        self.steps_skipped = int(sd["steps_skipped"])

    def __repr__(self) -> str:
        return (f"MixedPrecisionOptimizer({self.inner!r}, dtype={self.dtype}, "
                f"masters={len(self.masters)}, loss_scale={self.loss_scale:g})")
