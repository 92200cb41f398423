"""The transformer MLP: y = W2 GeLU(W1 x + b1) + b2, with a 4h hidden layer by default.

Saved for backward (Korthikanti et al. 2022, section 4.1; 2-byte activations):
    first linear's input   2 sbh          (saved by fc1)
    GeLU input             2 s b ffn = 8 sbh for ffn = 4h
    second linear's input  2 s b ffn = 8 sbh   (the GeLU output, saved by fc2)
The dropout after the MLP belongs to the block (its 1-byte mask, sbh).

Any object with `forward(x, rng) -> (y, saved)`, `backward(dy, saved) -> dx` and
`parameters()` can stand in for this MLP in a `Block` (`dense_parts(name, cfg, mlp=...)`,
or `GPT(cfg, mlp_factory=...)`): that is where a mixture of experts plugs in. To run under
a split backward (weight_grads.py) its backward also takes `store=`.
"""

from __future__ import annotations

import numpy as np

from .gelu import gelu_backward, gelu_forward
from .linear import Linear
from .module import Module


class MLP(Module):
    """x [s, b, h] -> fc2(gelu(fc1(x))) [s, b, h]."""

    parameter_order = ("fc1", "fc2")

    def __init__(self, name: str, hidden: int, ffn_hidden: int, gelu: str = "tanh",
                 seed: int = 0, dtype=np.float64, std: float = 0.02, out_std: float = 0.02):
        self.name, self.gelu = name, gelu
        self.fc1 = Linear(f"{name}.fc1", hidden, ffn_hidden, seed=seed, dtype=dtype, std=std)
        self.fc2 = Linear(f"{name}.fc2", ffn_hidden, hidden, seed=seed, dtype=dtype, std=out_std)

    def forward(self, x: np.ndarray, rng: np.random.Generator = None):
        u, s1 = self.fc1.forward(x)  # u: [s, b, ffn]
        g, s_act = gelu_forward(u, approximate=self.gelu)  # g: [s, b, ffn]
        y, s2 = self.fc2.forward(g)  # y: [s, b, h]
        return y, (s1, s_act, s2)

    def backward(self, dy: np.ndarray, saved, store=None) -> np.ndarray:
        """dx from dy [s, b, h]; with a WeightGradStore, fc1's and fc2's weight gradients
        wait for its W (GeLU has none)."""
        s1, s_act, s2 = saved
        dg = self.fc2.backward(dy, s2, store)  # dg: [s, b, ffn]
        du = gelu_backward(dg, s_act)
        return self.fc1.backward(du, s1, store)  # dx: [s, b, h]
