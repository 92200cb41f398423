"""Layer normalisation y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis.

    forward:   mu = mean(x),  rstd = 1 / sqrt(mean((x - mu)^2) + eps)
               xhat = (x - mu) * rstd,  y = xhat * gamma + beta        (Ba et al. 2016)
    backward:  g = dy * gamma
               dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
               dgamma = sum over tokens of dy * xhat,  dbeta = sum over tokens of dy

Memory: the forward saves x only. Mean and rstd are recomputed in the backward (a
reduction over h, cheap next to the matmuls), so a LayerNorm holds exactly its input:
the 2sbh terms of Korthikanti et al. 2022 for bf16. (Fused GPU kernels also keep mean and
rstd, 2 floats a token; here the formula is matched to the byte.)

Precision: computed in float32 for bf16/fp16/float32 inputs and in float64 for float64;
the result is rounded to the input dtype, dgamma/dbeta to gamma's dtype.

FLOPs: none; normalisation is no matmul (see `matmul.py`). Its time is the bytes it moves
(memory_bound.py): 2eN forward (read x, write y), 5eN backward (read dy and x, write dx;
read dy and x again for dgamma and dbeta), N = x.size, e its itemsize.

Split backward (weight_grads.py): with a `store`, the backward computes dx, dgamma and
dbeta exactly as the fused one does (dgamma needs xhat, which dx needs too), frees x, and
defers only the accumulation: the record holds dgamma and dbeta, 2h values.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .matmul import compute_dtype
from .memory_bound import charge_bytes
from .module import Module
from .parameter import Parameter
from .saved import Saved
from .weight_grads import WeightGradStore


def _mean_last(x: np.ndarray) -> np.ndarray:
    """x.mean(axis=-1, keepdims=True) bit for bit (np.mean's own steps: a sum, then a
    division by the count in place), without np.mean's Python wrapper, which costs more
    than the sum itself at the sizes tests and thousand-rank runs use."""
    total = np.add.reduce(x, axis=-1, keepdims=True)  # total: [..., 1]
    total /= x.shape[-1]
    return total


def _normalise(xf: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """xhat = (x - mean) * rstd and rstd, along the last axis (xf already in compute dtype)."""
    mu = _mean_last(xf)  # mu: [..., 1]
    xc = xf - mu
    var = _mean_last(xc * xc)  # var: [..., 1]
    rstd = 1.0 / np.sqrt(var + eps)  # rstd: [..., 1]
    xc *= rstd  # xhat, in place (xc is a new array)
    return xc, rstd


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                      eps: float = 1e-5) -> tuple[np.ndarray, Saved]:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta; saves x only.

    x: [s, b, h] (any leading dims), gamma: [h], beta: [h] -> y: same shape and dtype as x
    """
    if x.shape[-1] != gamma.shape[-1]:
        raise ValueError(f"layernorm over {gamma.shape[-1]} features got x of shape {x.shape}")
    ct = compute_dtype(x.dtype)
    y, _ = _normalise(x.astype(ct, copy=False), eps)  # xhat, a new array
    y *= gamma.astype(ct, copy=False)  # y = xhat * gamma + beta, in place
    y += beta.astype(ct, copy=False)
    charge_bytes("layernorm", 2 * x.nbytes)  # read x, write y: 2eN
    return y.astype(x.dtype, copy=False), Saved("layernorm", x=x)


def layernorm_backward(dy: np.ndarray, saved: Saved, gamma: np.ndarray, eps: float = 1e-5
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma; releases saved.

    dy: [s, b, h] -> dx: [s, b, h] (x's dtype), dgamma: [h], dbeta: [h] (gamma's dtype)
    """
    x = saved.x
    ct = compute_dtype(x.dtype)
    xhat, rstd = _normalise(x.astype(ct, copy=False), eps)  # recomputed, not saved
    dyf = dy.astype(ct, copy=False)
    g = dyf * gamma.astype(ct, copy=False)  # g: [s, b, h], the gradient w.r.t. xhat
    tokens = tuple(range(x.ndim - 1))
    t = dyf * xhat  # scratch: dy * xhat, then g * xhat, then xhat * mean(g * xhat)
    dgamma = t.sum(axis=tokens)  # dgamma: [h]
    dbeta = dyf.sum(axis=tokens)  # dbeta: [h]
    g_mean = _mean_last(g)
    np.multiply(g, xhat, out=t)
    gx_mean = _mean_last(t)
    np.multiply(xhat, gx_mean, out=t)
    g -= g_mean  # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), in place in g
    g -= t
    g *= rstd
    saved.release()
    charge_bytes("layernorm.backward", 5 * x.nbytes)  # dx: read dy, x, write; dgamma, dbeta
    return g.astype(x.dtype, copy=False), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


class LayerNorm(Module):
    """LayerNorm over the last `dim` features; gamma (`{name}.weight`) = 1, beta = 0.

    `weight`/`bias` follow PyTorch's names; `gamma`/`beta` are the same Parameters.
    """

    parameter_order = ("weight", "bias")

    def __init__(self, name: str, dim: int, eps: float = 1e-5, dtype=np.float64):
        self.name = name
        self.dim = dim
        self.eps = eps
        self.weight = Parameter(f"{name}.weight", np.ones(dim, dtype=dtype))
        self.bias = Parameter(f"{name}.bias", np.zeros(dim, dtype=dtype))

    @property
    def gamma(self) -> Parameter:
        return self.weight

    @property
    def beta(self) -> Parameter:
        return self.bias

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Saved]:
        """y = (x - mean) / sqrt(var + eps) * gamma + beta.  x: [s, b, dim] -> y: same."""
        return layernorm_forward(x, self.weight.data, self.bias.data, self.eps)

    def backward(self, dy: np.ndarray, saved: Saved,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma; accumulates dgamma,
        dbeta into the parameters (with a `store`: at its W).  dy: [s, b, dim] -> dx: same
        """
        dx, dgamma, dbeta = layernorm_backward(dy, saved, self.weight.data, self.eps)
        if store is None:
            self.accumulate(dgamma, dbeta)
        else:
            store.put(lambda r: self.accumulate(r.dgamma, r.dbeta),
                      Saved(f"{self.name}.wgrad", dgamma=dgamma, dbeta=dbeta))
        return dx

    def accumulate(self, dgamma: np.ndarray, dbeta: np.ndarray) -> None:
        """The weights' gradients into the parameters (a parallel layout may hold them)."""
        self.weight.accumulate(dgamma)
        self.bias.accumulate(dbeta)

    def __repr__(self) -> str:
        return f"LayerNorm({self.name}, dim={self.dim}, eps={self.eps})"
