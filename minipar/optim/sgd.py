"""SGD: g = grad + wd·p;  b = μ·b + g;  p ← p − lr·b  (or p − lr·(g + μ·b) with Nesterov).

Stochastic gradient descent with optional heavy-ball momentum (Polyak 1964), Nesterov
momentum in the form of Sutskever et al. 2013, and L2 weight decay added to the gradient.
The conventions are those of `torch.optim.SGD` (without dampening): the momentum buffer
starts as a copy of the first gradient, not as zeros, so the first step equals plain SGD.

    step 1:   b_1 = g_1
    step t:   b_t = μ·b_{t-1} + g_t
    update:   p ← p − lr·b_t                 (heavy ball)
              p ← p − lr·(g_t + μ·b_t)       (nesterov=True)

With momentum = 0 nothing is stored. The buffer is the state `momentum`, on the ledger as
`optim:{name}.momentum`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from ..nn.parameter import Parameter
from .optimizer import Optimizer, WeightDecayFilter, state_dtype


class SGD(Optimizer):
    """`SGD(params, lr, momentum=0.0, weight_decay=0.0, nesterov=False)`."""

    STATE_KINDS = ("momentum",)

    def __init__(self, params: Iterable[Parameter], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False,
                 weight_decay_filter: Optional[WeightDecayFilter] = None):
        super().__init__(params, lr, weight_decay, weight_decay_filter)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD momentum must be in [0, 1), got {momentum}")
        if nesterov and momentum == 0.0:
            raise ValueError("SGD(nesterov=True) needs momentum > 0")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def _update(self, p: Parameter, state: dict[str, Any]) -> None:
        dt = state_dtype(p)
        w = p.data.astype(dt)                       # a copy, in the update's precision
        g = p.grad.astype(dt)
        if self.decays(p):
            g = g + self.weight_decay * w           # L2: the decay is part of the gradient
        if self.momentum:
            if "momentum" not in state:
                state["momentum"] = self._new_state(p, "momentum", g)   # b_1 = g_1
            else:
                b = state["momentum"]
                b *= self.momentum
                b += g                                                  # b = μ b + g
            b = state["momentum"]
            g = g + self.momentum * b if self.nesterov else b
        w = w - self.lr * g
        p.set_data(w.astype(p.data.dtype, copy=False))

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "momentum": self.momentum,
                "nesterov": self.nesterov}

    def _set_hyperparameters(self, h: dict[str, Any]) -> None:
        super()._set_hyperparameters(h)
        self.momentum = float(h["momentum"])
        self.nesterov = bool(h["nesterov"])

