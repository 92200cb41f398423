"""Mixed precision: master₃₂ ← inner_step(master₃₂, float32(grad₁₆) / S);  p₁₆ ← round₁₆(master₃₂).

The model computes in 16 bits (bfloat16 or float16): its parameters and gradients are
16-bit. The optimizer keeps a float32 *master* copy of every 16-bit parameter, runs the
inner optimizer (AdamW, SGD, ...) on the masters with float32 gradients, and writes the
rounded result back into the model (Micikevicius et al. 2018, "Mixed Precision Training";
Megatron-LM's `Float16OptimizerWithFloat16Params`). The masters matter: a bf16 weight near
1 has an ulp of 2^-7 ≈ 0.008, so an update of lr·1 = 1e-3 applied in bf16 rounds back to
the old value and is lost; in the float32 master it accumulates until it shows.

One `step()` walks the parameters one tensor at a time, so only one float32 gradient
copy exists at any moment:

    pass 1 (only with a loss scaler or clipping), for each p:
        g = float32(p.grad) / S        (transient)   any inf/nan → skip, back off S, False
        ‖g‖² += Σ g²                                  (the global norm, for clipping)
    pass 2, for each p:
        g = float32(p.grad) / S · clip_coef          (transient, on the master)
        inner update of the master with g;  p ← round₁₆(master);  free g       → True

The float32 copy is made twice when pass 1 runs: a cheap conversion buys a memory bound.
Results are bit for bit those of converting every gradient first (same divisions, same
order of the norm's sum, same inner update per parameter).

Memory, for Ψ parameter elements with Adam (ZeRO, Rajbhandari et al. 2020, section 3.1):

    parameters        2Ψ   16-bit p.data                 (the model's, "param:{name}")
    gradients         2Ψ   16-bit p.grad                 (the model's, "grad:{name}")
    optimizer_states  4Ψ   float32 masters               "optim:{name}.master"
                    + 4Ψ   Adam m                         "optim:{name}.m"
                    + 4Ψ   Adam v                         "optim:{name}.v"   = 12Ψ
    total            16Ψ

The masters are made (and charged) eagerly, at construction; m and v lazily at the first
step, as in `Optimizer`. During `step()` the float32 gradient copy of the tensor being
worked on is held too, as "gradients" named `optim:{name}.grad32`, and given back before
the next tensor's is made. So

    ledger.peak("gradients") = 2Ψ + 4·n_max      n_max = elements of the largest 16-bit p

instead of the 2Ψ + 4Ψ = 6Ψ of converting all gradients at once.

Float32 gradient accumulation, `main_grad=True` (Megatron-LM's `main_grad`, which its
`accumulate_allreduce_grads_in_fp32` turns on, as it does for every bf16 run; Narayanan et
al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"):

    main₃₂ ← main₃₂ + float32(g₁₆^(i))   for each micro-batch i;   step on main₃₂ / S

Each 16-bit parameter's gradient *is* a float32 buffer, made at construction and kept:
`p.grad` is it, so every backward adds its 16-bit gradient into float32 (`Parameter.
accumulate` rounds each contribution to the parameter's dtype, as the backward computes
it, then adds). Summing k micro-batches in bf16 instead rounds every partial sum to 8
significant bits: the error grows with k, while in float32 it stays at the 16-bit
gradients' own rounding. The step reads the buffer directly (no transient copy; a loss
scale is divided out in place, once), and `zero_grad()` zeroes it in place. Memory:

    parameters        2Ψ   16-bit p.data
    gradients         4Ψ   float32 main_grad           ("grad:{name}", held for good)
    optimizer_states 12Ψ   float32 masters, Adam m, v
    total            18Ψ   (16Ψ without: 2 bytes of gradient become 4)

Every 16-bit parameter is stepped, a zero gradient where no backward reached it (Megatron
steps its whole gradient buffer). The data-parallel engines take the same option
(`DistributedDataParallel(..., main_grad=True)`, `ZeroEngine`): their gradient buffers are
float32, so the reduction over the ranks adds in float32 too (docs/data_parallel.md).
Parameters that are already float32 (or float64) get no master: the inner optimizer
updates them directly, after their gradients are unscaled in place.

With `dtype="float16"` a `DynamicLossScaler` is made unless one is given
(`loss_scaler=None` turns it off); multiply the loss gradient by `opt.loss_scale` before
backward. With bfloat16 (float32's exponent range) there is no loss scaling by default.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Union

import ml_dtypes
import numpy as np

from ..nn.parameter import Parameter
from ..runtime.context import current
from .adam import Adam
from .clip import clip_coef, scale_grad_, squared_grad_norm
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
    `main_grad=True`: every 16-bit parameter's gradient is a float32 buffer that each
    backward adds into (Megatron's main_grad, module docstring): 18 bytes a parameter.
    """

    def __init__(self, inner_cls: type[Optimizer], params: Iterable[Parameter],
                 dtype: Union[str, np.dtype] = "bfloat16",
                 loss_scaler: Union[DynamicLossScaler, None, str] = "auto",
                 max_grad_norm: Optional[float] = None, main_grad: bool = False,
                 **kwargs: Any):
        if not isinstance(main_grad, (bool, np.bool_)):
            raise TypeError(f"main_grad is True (float32 gradient accumulation) or False, "
                            f"got {main_grad!r}")
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
        # name -> float32 [shape]: each 16-bit parameter's gradient, for good (main_grad)
        self.main_grads: dict[str, np.ndarray] = {}
        self._main_names: dict[str, str] = {}  # name -> the ledger name it is held under
        if main_grad:
            for p in self.params:
                if p.name in self.masters:
                    self._attach_main_grad(p)
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

    @property
    def main_grad(self) -> bool:
        """Whether 16-bit parameters accumulate their gradients in float32 buffers."""
        return bool(self.main_grads)

    def zero_grad(self) -> None:
        """Drop the model's gradients (and any float32 copies, were a step interrupted);
        with main_grad, zero the float32 buffers in place (they stay the gradients)."""
        self._free_master_grads()
        for p in self.params:
            if p.name in self.main_grads:
                if p.grad is not self.main_grads[p.name]:  # freed or replaced: attach again
                    self._detach_main_grad(p)
                    self._attach_main_grad(p)
                self.main_grads[p.name].fill(0)
            else:
                p.free_grad()

    # ---- main_grad: the float32 gradient buffers ----------------------------------------
    def _attach_main_grad(self, p: Parameter) -> None:
        """Make p.grad a float32 buffer held for good (an existing gradient is kept in it)."""
        main = np.zeros(p.shape, dtype=np.float32)
        if p.grad is not None:
            main += p.grad.astype(np.float32)
            p.free_grad()
        # under p's own name when p keeps its gradient on the ledger, so that p.free_grad()
        # gives these bytes back; else under the optimizer's
        name = (f"grad:{p.name}" if getattr(p, "_ledger", None) is not None
                else f"optim:{p.name}.main_grad")
        self._ledger.hold(name, main, "gradients")
        p.grad = main
        self.main_grads[p.name] = main
        self._main_names[p.name] = name

    def _detach_main_grad(self, p: Parameter) -> None:
        """Give the buffer's bytes back (unless p.free_grad() already did) and drop p.grad."""
        name = self._main_names.pop(p.name)
        main = self.main_grads.pop(p.name)
        if p.grad is main:
            p.grad = None
            self._ledger.release(name)
        elif name.startswith("optim:"):
            self._ledger.release(name)
        else:  # p.free_grad() released it; whatever p holds now is a gradient of its own
            p.free_grad()

    def _check_main_grads(self) -> None:
        for p in self.params:
            main = self.main_grads.get(p.name)
            if main is not None and p.grad is not main:
                raise RuntimeError(
                    f"the gradient of {p.name} is no longer its float32 main_grad buffer "
                    f"(got {None if p.grad is None else p.grad.dtype}): something freed or "
                    "replaced it (p.free_grad(), a model's zero_grad()?), so the backward "
                    "accumulated elsewhere. Call this optimizer's zero_grad() instead")

    def step(self) -> bool:
        """Unscale and check, clip, step and round back, one tensor at a time. True if taken.

        The inner optimizer must update each parameter on its own (`Optimizer._update`), as
        every optimizer in this package does: `step` runs that update parameter by parameter.
        """
        scale = self.loss_scale  # S of this step: update() below may change it
        self._check_main_grads()
        work = [p for p in self.params if p.grad is not None]
        if scale != 1.0:  # main_grad: unscale the float32 buffers in place, once
            for main in self.main_grads.values():
                np.divide(main, main.dtype.type(scale), out=main)
        try:
            coef = 1.0
            if self.loss_scaler is not None or self.max_grad_norm is not None:
                # pass 1: overflow check and squared global norm, one float32 copy at a time
                found, sq_norm = False, 0.0
                for p in work:
                    if p.name in self.masters:
                        master = self._grad32(p, scale)
                        found = found or not np.isfinite(master.grad).all()
                        sq_norm += squared_grad_norm([master])
                        self._free_grad32(p.name)
                    else:  # float32/float64 parameter: unscale its own gradient in place
                        if self.loss_scaler is not None:
                            found = self.loss_scaler.unscale_and_check([p]) or found
                        sq_norm += squared_grad_norm([p])
                if self.loss_scaler is not None:
                    self.loss_scaler.update(found)
                    if found:  # nothing is touched: not the masters, not the moments
                        self.steps_skipped += 1
                        return False
                if self.max_grad_norm is not None:  # the norm of the true (unscaled) grads
                    self.last_grad_norm = math.sqrt(sq_norm)
                    # inf: 0, nan: nan, applied all the same, as clip_grad_norm_ (and torch)
                    coef = clip_coef(self.last_grad_norm, self.max_grad_norm)
            # pass 2: float32 copy, unscale, clip, update the master, round back, free the copy
            self._charge(work)
            for p in work:
                is_half = p.name in self.masters
                stepped = self._grad32(p, scale) if is_half else p
                scale_grad_(stepped.grad, coef)
                self._update_one(stepped)
                if is_half:
                    p.set_data(stepped.data.astype(self.dtype))  # p₁₆ ← round₁₆(master)
                    self._free_grad32(p.name)
            self.steps_taken += 1
            return True
        finally:
            self._free_master_grads()  # a copy is left only if something raised

    def _charge(self, work: list[Parameter]) -> None:
        """An Adam step's bytes to the clock (optim/adam.py's adam_step_bytes): each 16-bit
        parameter through its float32 master, with its 16-bit gradient and weight."""
        if not isinstance(self.inner, Adam):
            return
        nbytes = sum(self.inner.step_bytes(self.masters[p.name], p.grad.itemsize,
                                           p.data.itemsize)
                     if p.name in self.masters else self.inner.step_bytes(p, p.grad.itemsize)
                     for p in work)
        current().memory_bound(nbytes, self.inner.kernel)

    def _grad32(self, p: Parameter, scale: float) -> Parameter:
        """Put float32(p.grad) / S on p's master as its gradient, charged to the ledger as
        `optim:{name}.grad32`; return the master. With main_grad the buffer itself, already
        unscaled (step() divided it), nothing charged."""
        master = self.masters[p.name]
        if p.name in self.main_grads:
            master.grad = self.main_grads[p.name]
            return master
        g = p.grad.astype(np.float32)
        if scale != 1.0:  # the division of DynamicLossScaler.unscale_and_check
            np.divide(g, g.dtype.type(scale), out=g)
        master.grad = g
        self._ledger.hold(f"optim:{p.name}.grad32", g, "gradients")
        return master

    def _free_grad32(self, name: str) -> None:
        if name not in self.main_grads:
            self._ledger.release(f"optim:{name}.grad32")
        self.masters[name].grad = None

    def _update_one(self, p: Parameter) -> None:
        """The inner optimizer's update of one parameter: `Optimizer.step`'s loop body."""
        state = self.inner.state.get(p.name, {})
        self.inner._update(p, state)
        if state:  # plain SGD keeps nothing
            self.inner.state[p.name] = state

    def _free_master_grads(self) -> None:
        for name, master in self.masters.items():
            if master.grad is not None:
                self._free_grad32(name)

    # ---- memory and checkpoints -------------------------------------------------------
    def release(self) -> None:
        """Give back the masters', the main_grad buffers' and the inner optimizer's bytes."""
        self._free_master_grads()
        for p in self.params:
            if p.name in self.main_grads:
                self._detach_main_grad(p)
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
                f"masters={len(self.masters)}, loss_scale={self.loss_scale:g}"
                + (", main_grad=True" if self.main_grads else "") + ")")
