"""Softmax y_i = exp(x_i) / sum_j exp(x_j) along one axis, with its backward written out.

    forward:   y = exp(x - max(x)) / sum(exp(x - max(x)))   (subtracting the max changes
               nothing mathematically and keeps exp from overflowing)
    backward:  dx = y * (dy - sum(dy * y))                  (the Jacobian diag(y) - y y^T
               applied to dy, without forming it)

Memory: the forward saves its output y in the input dtype (y.nbytes; for attention
scores [b, a, s, s] in bf16 that is Korthikanti et al. 2022's 2as²b softmax term). The
backward needs y only, never x.

Precision: computed in float32 for bf16/fp16/float32 inputs and float64 for float64,
rounded to the input dtype. Entries of -inf (masked positions) get probability 0; a row
that is entirely -inf has no softmax and gives NaN, as in PyTorch.

FLOPs: none; softmax is no matmul (see `matmul.py`). Its time is the bytes it moves
(memory_bound.py), as the attention's scale-mask-softmax: 2eS forward (read the scores,
write y), 3eS backward (read y and dy, write dx), S = x.size. `softmax` alone (a router's
probabilities) charges nothing: it is part of the op that calls it.
"""

from __future__ import annotations

import numpy as np

from .matmul import compute_dtype
from .memory_bound import charge_bytes
from .saved import Saved


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """y = exp(x - max) / sum(exp(x - max)) along `axis`, in the input dtype (nothing saved)."""
    ct = compute_dtype(x.dtype)
    xf = x.astype(ct, copy=False)
    e = xf - xf.max(axis=axis, keepdims=True)  # a new array: exp and divide in place
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e.astype(x.dtype, copy=False)


def softmax_forward(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, Saved]:
    """y = exp(x) / sum(exp(x)) along `axis`; saves y.

    x: any shape, e.g. attention scores [b, a, s, s] -> y: same shape and dtype
    """
    y = softmax(x, axis)
    charge_bytes("softmax", 2 * x.nbytes)  # read the scores, write y: 2eS
    return y, Saved("softmax", y=y, axis=axis)


def softmax_backward(dy: np.ndarray, saved: Saved) -> np.ndarray:
    """dx = y * (dy - sum(dy * y)) along the softmax axis; releases `saved`.

    dy: same shape as y -> dx: same shape, y's dtype
    """
    y = saved.y
    ct = compute_dtype(y.dtype)
    yf = y.astype(ct, copy=False)
    dyf = dy.astype(ct, copy=False)
    dx = dyf * yf
    dot = dx.sum(axis=saved.axis, keepdims=True)  # sum(dy * y)
    np.subtract(dyf, dot, out=dx)  # dx = y * (dy - sum(dy * y)), in place
    dx *= yf
    saved.release()
    charge_bytes("softmax.backward", 3 * y.nbytes)  # read y, dy, write dx: 3eS
    return dx.astype(y.dtype, copy=False)
