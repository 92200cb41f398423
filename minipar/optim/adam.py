"""Adam: m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  p ← p − lr·m̂/(√v̂ + ε).

Adam (Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1) and
AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2).
At the t-th step of a parameter (t counts that parameter's own steps, from 1):

    g   = grad                     (+ wd·p for Adam: L2 regularisation inside the gradient)
    m   = β1·m + (1 − β1)·g        first moment (mean of g)
    v   = β2·v + (1 − β2)·g²       second moment (uncentred variance of g)
    m̂   = m / (1 − β1^t)           bias correction: m and v start at 0, so early
    v̂   = v / (1 − β2^t)           averages are too small by exactly these factors
    p   = p − lr·wd·p              AdamW only: decoupled decay, outside the adaptive step
    p   = p − lr·m̂ / (√v̂ + ε)

Why decoupling matters: in Adam the decay term wd·p is divided by √v̂ like the rest of
the gradient, so parameters with large gradients are barely decayed; AdamW shrinks every
(decayed) parameter by the same factor (1 − lr·wd). With wd = 0 the two are identical.

State per parameter: `step` (int), `m` and `v`, on the ledger as `optim:{name}.m` and
`optim:{name}.v` (4 + 4 bytes per float32 parameter element: the "8Ψ" of ZeRO's count).
Defaults follow torch.optim.Adam / AdamW (AdamW's weight_decay defaults to 0.01).

Time: a step is memory-bound (a few FLOPs per byte of state it reads and writes). `step()`
charges the clock the bytes Megatron-LM's step moves (`adam_step_bytes`: 36 per float32
parameter) as one "adam" / "adamw" event (nn/memory_bound.py; nothing under the peak
compute model). SGD is not charged.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from ..nn.parameter import Parameter
from ..runtime.context import current
from .optimizer import Optimizer, WeightDecayFilter, state_dtype


def adam_step_bytes(elements: int, weight_bytes: int, grad_bytes: int, state_bytes: int,
                    half_bytes: int = 0) -> int:
    """Bytes one Adam step moves through HBM for `elements` parameter elements, as
    Megatron-LM runs it (the planner's bytes per parameter, plan/compute_time.py):

        g              read the gradient for its global norm (clipping)
        2w + 4s + g    fused Adam: read the weight (or its float32 master), m, v and the
                       gradient, write the weight, m and v
        w + half       mixed precision only: the 16-bit weight written from the master
        g              write the zeroed gradient buffer for the next step

    w, g, s, half: bytes of an element of the weight Adam updates, the gradient, a moment
    and the 16-bit weight (0: no master). float32: 36; bf16 with bf16 gradients: 36; bf16
    with float32 gradients: 42."""
    w, g, s = weight_bytes, grad_bytes, state_bytes
    copy = w + half_bytes if half_bytes else 0
    return elements * (g + (2 * w + 4 * s + g) + copy + g)


class Adam(Optimizer):
    """`Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)`; L2 decay."""

    STATE_KINDS = ("m", "v")
    decoupled = False  # AdamW sets this: decay the weights directly instead of the gradient
    kernel = "adam"    # the name of its step on the clock (AdamW: "adamw")

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0,
                 weight_decay_filter: Optional[WeightDecayFilter] = None):
        super().__init__(params, lr, weight_decay, weight_decay_filter)
        b1, b2 = betas
        for i, b in enumerate((b1, b2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{type(self).__name__}: betas[{i}] must be in [0, 1), got {b}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {eps}")
        self.betas = (float(b1), float(b2))
        self.eps = float(eps)

    def step(self) -> None:
        """Optimizer.step, then its bytes to the clock: adam_step_bytes of every parameter
        with a gradient."""
        nbytes = sum(self.step_bytes(p, p.grad.itemsize) for p in self.params
                     if p.grad is not None)
        super().step()
        current().memory_bound(nbytes, self.kernel)

    def step_bytes(self, p: Parameter, grad_bytes: int, half_bytes: int = 0) -> int:
        """adam_step_bytes of updating p (the weight itself, or a 16-bit one's master) from
        a gradient of grad_bytes an element; half_bytes: the 16-bit weight's, if any."""
        return adam_step_bytes(p.data.size, p.data.itemsize, grad_bytes,
                               state_dtype(p).itemsize, half_bytes)

    def _update(self, p: Parameter, state: dict[str, Any]) -> None:
        b1, b2 = self.betas
        dt = state_dtype(p)
        if "m" not in state:
            state["step"] = 0
            state["m"] = self._new_state(p, "m")
            state["v"] = self._new_state(p, "v")
        state["step"] += 1
        t = state["step"]
        m, v = state["m"], state["v"]

        w = p.data.astype(dt)                       # a copy, in the update's precision
        g = p.grad.astype(dt)
        decay = self.decays(p)
        if decay and not self.decoupled:
            g = g + self.weight_decay * w           # Adam: L2 enters the moments

        m *= b1
        m += (1.0 - b1) * g                         # m = β1 m + (1 − β1) g
        v *= b2
        v += (1.0 - b2) * (g * g)                   # v = β2 v + (1 − β2) g²
        m_hat = m / (1.0 - b1 ** t)
        v_hat = v / (1.0 - b2 ** t)

        if decay and self.decoupled:
            w = w - self.lr * self.weight_decay * w  # AdamW: p −= lr·wd·p
        w = w - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        p.set_data(w.astype(p.data.dtype, copy=False))

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "betas": list(self.betas), "eps": self.eps}

    def _set_hyperparameters(self, h: dict[str, Any]) -> None:
        super()._set_hyperparameters(h)
        self.betas = (float(h["betas"][0]), float(h["betas"][1]))
        self.eps = float(h["eps"])


class AdamW(Adam):
    """`AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`; decoupled
    decay p ← p − lr·wd·p (Loshchilov & Hutter 2019)."""

    decoupled = True
    kernel = "adamw"

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2,
                 weight_decay_filter: Optional[WeightDecayFilter] = None):
        super().__init__(params, lr, betas, eps, weight_decay, weight_decay_filter)

