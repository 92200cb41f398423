"""The linear layer y = x @ w.T + b, with its backward written out.

    forward:   y  = x @ w.T + b            x: [..., in], w: [out, in], b: [out]
    backward:  dx = dy @ w                 [..., in]     ("dgrad", needed by the layer below)
               dw = dy^T @ x               [out, in]     ("wgrad", summed over all tokens)
               db = sum of dy over tokens  [out]

The weight is stored as [out, in], PyTorch's layout, so Megatron's splits read naturally:
a ColumnParallelLinear splits w along dim 0 (the outputs), a RowParallelLinear along
dim 1 (the inputs) (Megatron-LM, Shoeybi et al. 2019, section 3).

Memory: the forward saves its input x and nothing else (the weight is a parameter, passed
to backward explicitly), which is the 2sbh / 8sbh "linear input" terms of Korthikanti et
al. 2022's activation formula.

FLOPs: only the matmuls are charged (see `matmul.py`): 2·N·in·out for the forward and
twice that for the backward (dgrad and wgrad), N being the number of tokens. Adding the
bias and summing db are elementwise work and charge nothing of their own: Megatron-LM fuses
them into the ops that follow (bias-GeLU, bias-dropout-add; memory_bound.py).

The backward is also offered in its two halves, `linear_backward_input` (dgrad) and
`linear_backward_weight` (wgrad), because zero-bubble pipeline schedules run them at
different times (Qi et al. 2023): `linear_backward_split` runs dgrad now and defers wgrad
to a WeightGradStore (weight_grads.py), whose record keeps x (the forward's record) and dy.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .matmul import compute_dtype, matmul
from .module import Module
from .parameter import Parameter, init_normal
from .saved import Saved
from .weight_grads import WeightGradStore


def linear_forward(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None,
                   label: str = "") -> tuple[np.ndarray, Saved]:
    """y = x @ w.T + b; saves x (by reference: do not modify x before backward).

    x: [..., in] (Megatron's [s, b, in]), w: [out, in], b: [out] or None -> y: [..., out]
    """
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear {label or '(unnamed)'}: input has {x.shape[-1]} features "
                         f"(x: {x.shape}) but the weight expects {w.shape[1]} "
                         f"(w: [out, in] = {w.shape})")
    y = _tokens_matmul(x, w.T, label)  # y: [..., out]
    if b is not None:
        y = add_bias(y, b)
    return y, Saved(label or "linear", x=x, label=label)


def _tokens_matmul(x: np.ndarray, w: np.ndarray, label: str) -> np.ndarray:
    """x @ w as one [N, k] @ [k, n] matmul over all N tokens.  x: [..., k] -> [..., n]

    np.matmul would run a stacked [s, b, k] @ [k, n] as s separate [b, k] @ [k, n] BLAS
    calls, each reading all of w again: several times slower, for the same FLOPs (the
    charge, 2·k per output element, is unchanged).
    """
    y = matmul(x.reshape(-1, x.shape[-1]), w, label=label)  # y: [N, n]
    return y.reshape(x.shape[:-1] + (w.shape[-1],))


def add_bias(y: np.ndarray, b: np.ndarray) -> np.ndarray:
    """y + b, in place when that gives the same dtype (y is matmul's new array)."""
    if np.result_type(y, b) == y.dtype:
        y += b
        return y
    return y + b


def linear_backward_input(dy: np.ndarray, w: np.ndarray, label: str = "") -> np.ndarray:
    """dx = dy @ w ("dgrad").  dy: [..., out], w: [out, in] -> dx: [..., in]"""
    return _tokens_matmul(dy, w, f"{label}.dgrad" if label else "dgrad")  # dx: [..., in]


def linear_backward_weight(dy: np.ndarray, x: np.ndarray, has_bias: bool, label: str = ""
                           ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """dw = dy^T @ x summed over tokens, db = sum of dy over tokens ("wgrad").

    dy: [..., out], x: [..., in] -> dw: [out, in], db: [out] (None without a bias)
    """
    dy2 = dy.reshape(-1, dy.shape[-1])  # dy2: [N, out]
    x2 = x.reshape(-1, x.shape[-1])  # x2: [N, in]
    dw = matmul(dy2.T, x2, label=f"{label}.wgrad" if label else "wgrad")  # dw: [out, in]
    db = None
    if has_bias:
        db = dy2.sum(axis=0, dtype=compute_dtype(dy.dtype)).astype(dy.dtype)  # db: [out]
    return dw, db


def linear_backward(dy: np.ndarray, saved: Saved, w: np.ndarray, has_bias: bool
                    ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """dx = dy @ w, dw = dy^T @ x, db = sum(dy); releases `saved`.

    dy: [..., out], w: [out, in] -> dx: [..., in], dw: [out, in], db: [out] or None
    """
    dx = linear_backward_input(dy, w, saved.label)
    dw, db = linear_backward_weight(dy, saved.x, has_bias, saved.label)
    saved.release()
    return dx, dw, db


def linear_backward_split(dy: np.ndarray, saved: Saved, w: np.ndarray, has_bias: bool,
                          store: WeightGradStore,
                          accumulate: Callable[[np.ndarray, Optional[np.ndarray]], None]
                          ) -> np.ndarray:
    """I: dx = dy @ w now; W (store.run): accumulate(dw, db), dw = dy^T x, db = sum(dy).

    The record holds dy and the forward's `saved` (x) until W; nothing else is kept.
    dy: [..., out], w: [out, in] -> dx: [..., in]
    """
    dx = linear_backward_input(dy, w, saved.label)  # dx: [..., in]
    label = saved.label or "linear"
    store.put(lambda r: accumulate(*linear_backward_weight(r.dy, r.forward.x, has_bias,
                                                           r.forward.label)),
              Saved(f"{label}.wgrad", dy=dy, forward=saved))
    return dx


class Linear(Module):
    """y = x @ W.T + b with W: [out_features, in_features] ~ N(0, std^2), b = 0.

    Parameters are named `{name}.weight` and `{name}.bias` and initialised at full shape
    from (seed, name), so every parallel layout can start from these exact values.
    """

    parameter_order = ("weight", "bias")  # bias: None without one

    def __init__(self, name: str, in_features: int, out_features: int, bias: bool = True,
                 seed: int = 0, dtype=np.float64, std: float = 0.02):
        self.name = name
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(f"{name}.weight",
                                init_normal(f"{name}.weight", (out_features, in_features),
                                            std, seed, dtype))
        self.bias = (Parameter(f"{name}.bias", np.zeros(out_features, dtype=dtype))
                     if bias else None)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Saved]:
        """y = x @ W.T + b.  x: [..., in] -> y: [..., out], and what backward needs (x)."""
        b = self.bias.data if self.bias is not None else None
        return linear_forward(x, self.weight.data, b, label=self.name)

    def backward(self, dy: np.ndarray, saved: Saved,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx = dy @ W; accumulates dW = dy^T x (and db = sum dy) into the parameters, or
        with a `store` defers them to its W (linear_backward_split).

        dy: [..., out] -> dx: [..., in]
        """
        if store is not None:
            return linear_backward_split(dy, saved, self.weight.data, self.bias is not None,
                                         store, self.accumulate)
        dx, dw, db = linear_backward(dy, saved, self.weight.data, self.bias is not None)
        self.accumulate(dw, db)
        return dx

    def accumulate(self, dw: np.ndarray, db: Optional[np.ndarray]) -> None:
        """W's last act: dW (and db) into the parameters' gradients."""
        self.weight.accumulate(dw)
        if self.bias is not None:
            self.bias.accumulate(db)

    def __repr__(self) -> str:
        return (f"Linear({self.name}, in={self.in_features}, out={self.out_features}, "
                f"bias={self.bias is not None}, dtype={self.weight.data.dtype})")
