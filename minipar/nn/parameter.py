"""Parameters: a named array, its gradient, and their place on the device's ledger.

A parameter is initialised at its *full* shape from the model seed and its own name,
    rng = default_rng([seed, crc32(name)])
so the same model comes out whatever order layers are built in, and any sharded layout
(tensor, pipeline, ZeRO) can start from exactly the single-device weights by slicing.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Optional

import numpy as np

from ..runtime.context import current


def name_rng(seed: int, name: str) -> np.random.Generator:
    """The generator for parameter `name` of the model with `seed`."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def init_normal(name: str, shape: tuple, std: float, seed: int, dtype=np.float64) -> np.ndarray:
    """N(0, std^2) at the full shape, from (seed, name). A new array each call."""
    shape = tuple(int(n) for n in shape)
    if math.prod(shape) <= REMEMBERED:
        return _remembered(name, shape, float(std), int(seed), np.dtype(dtype)).copy()
    return _draw(name, shape, std, seed, dtype)


def _draw(name: str, shape: tuple, std: float, seed: int, dtype) -> np.ndarray:
    return (name_rng(seed, name).standard_normal(shape) * std).astype(dtype)


#: parameters up to this many elements are drawn once per process and copied after: every
#: simulated rank initialises the full model, and for a small array making the generator
#: costs far more than the draw (thousands of ranks, tens of parameters each). At most
#: 1,024 of them are kept: 32 MiB in float64 at the most.
REMEMBERED = 1 << 12


@functools.lru_cache(maxsize=1024)
def _remembered(name: str, shape: tuple, std: float, seed: int, dtype: np.dtype) -> np.ndarray:
    a = _draw(name, shape, std, seed, dtype)
    a.flags.writeable = False  # shared by the copies init_normal hands out
    return a


class Parameter:
    """`data` (what forward uses), `grad` (accumulated by backward), both on the ledger.

    The parameter is charged to the current device's ledger as "parameters" when made;
    its gradient as "gradients" when first accumulated, until `free_grad()`.
    """

    def __init__(self, name: str, data: np.ndarray, charge: bool = True):
        self.name = name
        self.data = data
        self.grad: Optional[np.ndarray] = None
        self._ledger = current().ledger if charge else None
        if self._ledger is not None:
            self._ledger.hold(f"param:{name}", data, "parameters")

    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def size(self) -> int:
        return int(self.data.size)

    def accumulate(self, g: np.ndarray) -> None:
        """grad += g (the first call allocates the gradient in the parameter's dtype).
        The shape is checked against the gradient once it exists: a ZeRO-3 unit's weights
        may be sharded away (size 0) while a split backward's W accumulates into it."""
        shape = self.grad.shape if self.grad is not None else self.data.shape
        if g.shape != shape:
            raise ValueError(f"gradient for {self.name} has shape {g.shape}, "
                             f"expected the parameter's shape {shape}")
        if self.grad is None:
            self.grad = np.array(g, dtype=self.data.dtype, copy=True)
            if self._ledger is not None:
                self._ledger.hold(f"grad:{self.name}", self.grad, "gradients")
        else:
            self.grad += g.astype(self.data.dtype, copy=False)

    def free_grad(self) -> None:
        """Drop the gradient (after the optimizer step), giving its bytes back."""
        if self.grad is not None and self._ledger is not None:
            self._ledger.release(f"grad:{self.name}")
        self.grad = None

    def set_data(self, data: np.ndarray) -> None:
        """Replace the values (e.g. an optimizer writing back); shape must not change."""
        if data.shape != self.data.shape:
            raise ValueError(f"new data for {self.name} has shape {data.shape}, "
                             f"expected {self.data.shape}")
        if self._ledger is not None and data.nbytes != self.data.nbytes:
            self._ledger.release(f"param:{self.name}")
            self._ledger.hold(f"param:{self.name}", data, "parameters")
        self.data = data

    def release(self) -> None:
        """Give the parameter's (and its gradient's) bytes back to the ledger."""
        self.free_grad()
        if self._ledger is not None:
            self._ledger.release(f"param:{self.name}")
            self._ledger = None

    def __repr__(self) -> str:
        return f"Parameter({self.name}, shape={self.shape}, dtype={self.data.dtype})"
