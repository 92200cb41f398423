"""GeLU y = x·Φ(x) (Hendrycks & Gimpel 2016), exact or in GPT-2's tanh form.

    "none":  y = x·Φ(x) = 0.5·x·(1 + erf(x/√2))
             dy/dx = Φ(x) + x·φ(x),               φ(x) = exp(-x²/2) / √(2π)
    "tanh":  y = 0.5·x·(1 + tanh(u)),             u = √(2/π)·(x + 0.044715·x³)
             dy/dx = 0.5·(1 + tanh(u)) + 0.5·x·(1 - tanh(u)²)·√(2/π)·(1 + 3·0.044715·x²)

Both backwards are the exact derivatives of their forwards (the tanh form's backward
differentiates the approximation, as PyTorch's does, so gradients check to rounding).
NumPy has no erf; the exact form applies `math.erf` (the C library's, accurate to an ulp
or so in float64) element by element.

Memory: the forward saves x (x.nbytes; for the MLP's [s, b, 4h] input in bf16 that is
Korthikanti et al. 2022's 8sbh GeLU term). Precision: computed in float32 for
bf16/fp16/float32 inputs (the erf itself in float64), float64 for float64, rounded to the
input dtype. FLOPs: none; GeLU is elementwise (see `matmul.py`). Its time is the bytes it
moves (memory_bound.py): 2eF forward (read x, write y), 4eF backward (read dy and x, write
dx, and the fused bias's gradient, as Megatron-LM's bias-GeLU), F = x.size.
"""

from __future__ import annotations

import math

import numpy as np

from .matmul import compute_dtype
from .memory_bound import charge_bytes
from .saved import Saved

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
TANH_COEF = 0.044715

_erf_object = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x) = 2/√π ∫_0^x exp(-t²) dt elementwise, in float64 (math.erf on each element)."""
    x = np.asarray(x, dtype=np.float64)
    return _erf_object(x).astype(np.float64).reshape(x.shape)


def _tanh_u(xf: np.ndarray) -> np.ndarray:
    """tanh(u), u = √(2/π)·(x + 0.044715·x³), as a new array (x³ as x·x·x: np.power with
    an exponent of 3 calls the C library's pow on every element, ten times slower)."""
    u = xf * xf
    u *= xf
    u *= TANH_COEF
    u += xf
    u *= SQRT_2_OVER_PI
    return np.tanh(u, out=u)


def _check(approximate: str) -> None:
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu approximate must be 'tanh' (GPT-2) or 'none' (exact, erf), "
                         f"got {approximate!r}")


def gelu_forward(x: np.ndarray, approximate: str = "tanh") -> tuple[np.ndarray, Saved]:
    """y = x·Φ(x) (approximate="none") or 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))); saves x.

    x: any shape, e.g. [s, b, 4h] -> y: same shape and dtype
    """
    _check(approximate)
    ct = compute_dtype(x.dtype)
    xf = x.astype(ct, copy=False)
    if approximate == "tanh":
        xf = xf.reshape(-1)  # 1-D (a 0-d x too), so every step below has an array to reuse
        y = 0.5 * xf  # y = 0.5 x (1 + tanh(u)), in place to spare temporaries
        y *= _tanh_u(xf) + 1.0
        y = y.reshape(x.shape)
    else:
        y = 0.5 * xf * (1.0 + erf(xf * INV_SQRT_2).astype(ct, copy=False))
    charge_bytes("gelu", 2 * x.nbytes)  # read x, write y: 2eF
    return y.astype(x.dtype, copy=False), Saved("gelu", x=x, approximate=approximate)


def gelu_backward(dy: np.ndarray, saved: Saved) -> np.ndarray:
    """dx = dy · GeLU'(x) for the form used in forward; releases `saved`.

    dy: same shape as x -> dx: same shape, x's dtype
    """
    x = saved.x
    ct = compute_dtype(x.dtype)
    xf = x.astype(ct, copy=False)
    if saved.approximate == "tanh":
        xf = xf.reshape(-1)  # 1-D (a 0-d x too), so every step below has an array to reuse
        t = _tanh_u(xf)
        # d = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2), in place
        du = 3.0 * TANH_COEF * xf  # du/dx / sqrt(2/pi) = 1 + 3 c x^2
        du *= xf
        du += 1.0
        d = 0.5 * xf
        t2 = t * t
        d *= np.subtract(1.0, t2, out=t2)
        d *= SQRT_2_OVER_PI
        d *= du
        t += 1.0
        t *= 0.5
        d += t
        d = d.reshape(x.shape)
    else:
        cdf = 0.5 * (1.0 + erf(xf * INV_SQRT_2).astype(ct, copy=False))  # Φ(x)
        pdf = INV_SQRT_2PI * np.exp(-0.5 * xf * xf)  # φ(x)
        d = cdf + xf * pdf
    saved.release()
    d *= dy.astype(ct, copy=False)
    charge_bytes("gelu.backward", 4 * x.nbytes)  # read dy, x, write dx, the bias: 4eF
    return d.astype(x.dtype, copy=False)
