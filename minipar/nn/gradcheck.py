"""Check hand-written gradients against central finite differences, in float64.

    df/dx[i] ≈ (f(x + eps·e_i) - f(x - eps·e_i)) / (2·eps)      (error O(eps²))

    gradcheck(lambda x, w: np.sum(linear_forward(x, w)[0] * r),
              {"x": x, "w": w}, {"x": dx, "w": dw})

`f` must return a scalar. It is called as f(**inputs), or as f() when it takes no
parameters and reads the arrays itself (e.g. a model's loss reading its parameters'
`.data`): each float64 input is perturbed *in place*, one entry at a time, and restored
bit for bit afterwards, so both styles see the perturbation. Inputs that are not float64
arrays are checked through float64 copies, which only the f(**inputs) style can see.

To check a layer with a tensor output y, project it to a scalar with a fixed random r:
f = sum(y * r), whose gradient with respect to y is r (so the backward is fed dy = r).
Every entry of every input named in `analytic` is perturbed in turn (inputs not named
there are held fixed), so keep the shapes small. An entry passes when
    |analytic - numeric| <= atol + rtol·|numeric|.

The evaluations run on a scratch device (`minipar.device()`), so the many forwards a
check makes are not charged to the caller's clock, trace or ledger.
"""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np

from ..runtime.context import device


def _scalar(value) -> float:
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != 1:
        raise ValueError(f"gradcheck needs a scalar function; f returned shape {arr.shape}. "
                         f"Project a tensor output y to a scalar, e.g. np.sum(y * r) with a "
                         f"fixed random r (then dy = r).")
    return float(arr.reshape(()))


def _takes_no_arguments(f: Callable) -> bool:
    try:
        return not inspect.signature(f).parameters
    except (TypeError, ValueError):  # some builtins have no signature: pass the inputs
        return False


def _in_place(v) -> bool:
    """A float64 array can be perturbed where it is, so closures see the perturbation."""
    return isinstance(v, np.ndarray) and v.dtype == np.float64 and v.flags.writeable


def numeric_gradient(f: Callable[..., float], inputs: dict[str, np.ndarray], name: str,
                     eps: float = 1e-6) -> np.ndarray:
    """g[i] = (f(x + eps·e_i) - f(x - eps·e_i)) / (2·eps) for x = inputs[name], in float64.

    inputs[name] is perturbed in place when it is a float64 array (and always restored).
    """
    no_args = _takes_no_arguments(f)
    args = {k: v if _in_place(v) or not _is_float(v) else np.array(v, dtype=np.float64)
            for k, v in inputs.items()}
    x = args[name]
    if not _in_place(inputs[name]):
        if no_args:
            raise ValueError(f"gradcheck: input {name!r} is not a writeable float64 array "
                             f"(dtype {np.asarray(x).dtype}), so it cannot be perturbed in "
                             f"place for an f that takes no arguments; pass float64 arrays "
                             f"(tests run in float64) or let f take the inputs by name")
        x = args[name] = np.array(x, dtype=np.float64)

    def evaluate() -> float:
        return _scalar(f() if no_args else f(**args))

    grad = np.zeros(x.shape, dtype=np.float64)  # grad: same shape as inputs[name]
    with device():
        for i in np.ndindex(x.shape):
            orig = x[i].copy()
            try:
                x[i] = orig + eps
                plus = evaluate()
                x[i] = orig - eps
                minus = evaluate()
            finally:
                x[i] = orig  # restored bit for bit
            grad[i] = (plus - minus) / (2.0 * eps)
    return grad


def _is_float(v) -> bool:
    """Floating-point inputs are evaluated in float64; integer ones (ids) pass as they are."""
    if isinstance(v, float):
        return True
    return isinstance(v, np.ndarray) and (v.dtype.kind == "f"
                                          or v.dtype.name in ("bfloat16", "float16"))


def gradcheck(f: Callable[..., float], inputs: dict[str, np.ndarray],
              analytic: dict[str, np.ndarray], eps: float = 1e-6, rtol: float = 1e-5,
              atol: float = 1e-7) -> bool:
    """Compare analytic gradients of the scalar f(**inputs) (or f()) with central differences.

    inputs: name -> array; analytic: name -> the gradient your backward computed for that
    input (same shape). Returns True, or raises an AssertionError naming the input, the
    worst entry, both derivatives and the error.
    """
    for name, g in analytic.items():
        if name not in inputs:
            raise ValueError(f"gradcheck: analytic gradient given for {name!r}, which is not "
                             f"among the inputs {sorted(inputs)}")
        x = np.asarray(inputs[name])
        if g is None:
            raise AssertionError(f"gradcheck: the gradient for input {name!r} is None (was "
                                 f"the backward run, and did it reach this input?)")
        g = np.asarray(g)
        if g.shape != x.shape:
            raise AssertionError(f"gradcheck: the gradient for input {name!r} has shape "
                                 f"{g.shape} but the input has shape {x.shape}; a gradient "
                                 f"always has its input's shape (a missing sum over a "
                                 f"broadcast axis, or a transpose?)")
        a = g.astype(np.float64)
        n = numeric_gradient(f, inputs, name, eps)
        err = np.abs(a - n)
        tol = atol + rtol * np.abs(n)
        bad = ~(err <= tol)  # also catches NaN
        if bad.any():
            ratio = np.where(np.isnan(err), np.inf, err / tol)
            worst = np.unravel_index(int(np.argmax(ratio)), x.shape) if x.ndim else ()
            aw, nw, ew = float(a[worst]), float(n[worst]), float(err[worst])
            rel = ew / abs(nw) if nw != 0 else float("inf")
            raise AssertionError(
                f"gradcheck failed for input {name!r} (shape {x.shape}): "
                f"{int(bad.sum())} of {x.size} entries are off.\n"
                f"Worst at index {tuple(int(i) for i in worst)}: Received derivative "
                f"{aw:.10g} but was expecting {nw:.10g} (finite differences).\n"
                f"Absolute error {ew:.3g}, relative error {rel:.3g} "
                f"(allowed: atol={atol:g} + rtol={rtol:g} x |expected|).\n"
                f"Common causes: a missing or extra transpose, a sum over the wrong axis, "
                f"a forgotten factor (1/N, 1/(1-p)), or a gradient that is not accumulated "
                f"over every use of the input."
            )
    return True
