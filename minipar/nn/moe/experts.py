"""The experts: E independent MLPs, each run on its own block of permuted rows.

    xs = [rows of expert 0; rows of expert 1; ...; rows of expert E-1]     [R, h]
    ys = [mlp_0(rows of expert 0); ...; mlp_{E-1}(rows of expert E-1)]     [R, h]

Megatron-LM's SequentialMLP (one MLP after another; its GroupedMLP runs the same blocks as
one grouped GEMM, the same FLOPs): expert e is an `MLP` named `{name}.{e}`, with its
weights drawn from the model seed and that name, so any layout of the experts (all on one
device, or E/ep on each expert-parallel rank) starts from the same values. An expert with
no rows does no work and gets no gradient (its parameters' .grad stays as it was). Padding
rows (dispatch.py, pad=True) are zeros run like any row, as on a GPU that pads to capacity:
they cost FLOPs, and their gradients are zero.

FLOPs: each expert's MLP charges 2 · rows · (h·f + f·h) forward, twice that backward: an
MoE layer with top-k routing and no drops costs k dense MLPs of width f per token.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..mlp import MLP
from ..module import Module
from ..weight_grads import WeightGradStore


class Experts(Module):
    """E MLPs h -> f -> h; forward(xs [R, h], rows_per_expert [E]) -> ys [R, h]."""

    parameter_order = ("local",)

    def __init__(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                 gelu: str = "tanh", seed: int = 0, dtype=np.float64, std: float = 0.02,
                 out_std: float = 0.02, expert_ids: Optional[Sequence[int]] = None):
        """expert_ids: the global indices of the experts built here (default: all E; an
        expert-parallel rank builds its own E/ep), in order."""
        self.name, self.num_experts = name, num_experts
        self.expert_ids = list(range(num_experts)) if expert_ids is None else list(expert_ids)
        self.local = [MLP(f"{name}.{e}", hidden, ffn_hidden, gelu, seed, dtype, std, out_std)
                      for e in self.expert_ids]

    def forward(self, xs: np.ndarray, rows_per_expert: np.ndarray) -> tuple[np.ndarray, list]:
        """ys [R, h]: each local expert's MLP on its block of rows (in expert_ids' order)."""
        if len(rows_per_expert) != len(self.local) or int(np.sum(rows_per_expert)) != len(xs):
            raise ValueError(f"{self.name}: rows_per_expert {list(rows_per_expert)} must give "
                             f"each of the {len(self.local)} local experts its rows, summing "
                             f"to the {len(xs)} rows of xs")
        ys = np.empty_like(xs)  # ys: [R, h]
        saved, start = [], 0
        for mlp, n in zip(self.local, rows_per_expert):
            n = int(n)
            if n:
                ys[start:start + n], s = mlp.forward(xs[start:start + n])
            else:
                s = None  # no rows: no work, nothing saved
            saved.append((start, n, s))
            start += n
        return ys, saved

    def backward(self, dys: np.ndarray, saved: list,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dxs [R, h] from dys [R, h]; accumulates each expert's gradients (or defers
        them to the store's W)."""
        dxs = np.zeros_like(dys)  # dxs: [R, h]
        for mlp, (start, n, s) in zip(self.local, saved):
            if n:
                dxs[start:start + n] = mlp.backward(dys[start:start + n], s, store)
        return dxs

    def __repr__(self) -> str:
        return f"Experts({self.name}, {len(self.local)} of {self.num_experts})"
