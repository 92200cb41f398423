"""Argument checks the runtime's constructors and calls share: a count is a whole number >= 1,
a rate is a positive finite number, a block of a collective is an array of numbers.

    count:  int, NumPy integer or a whole float (2.0 -> 2); never a bool, a string, 2.5, nan
    rate:   a real number with 0 < x < inf (bandwidth, FLOP/s); latency may be 0

Each raises an error that names what was expected, what was received and where, in the
caller's terms ("Topology.nodes(gpus_per_node=2.5)"), so a typo never turns into a float
world size, a truncated rank or a hang much later.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np

from .errors import CollectiveUsageError

#: the largest mesh or world minipar lays out (2**20 ranks; today's largest clusters have
#: about 10**5 GPUs): a larger one is a typo, and its rank grid would exhaust host memory
MAX_RANKS = 1 << 20


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending, in O(sqrt n): what an error offers as the sizes
    that split n evenly."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def whole(value: Any, what: str, minimum: int = 1, maximum: Optional[int] = None) -> int:
    """`value` as an int in [minimum, maximum], or a ValueError (TypeError for a non-number)
    that names `what`."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be a whole number >= {minimum}, got the bool {value!r}")
    if isinstance(value, numbers.Integral):
        n = int(value)
    elif isinstance(value, numbers.Real):
        f = float(value)
        if not (math.isfinite(f) and f.is_integer()):
            raise ValueError(f"{what} must be a whole number >= {minimum}, got {value!r}")
        n = int(f)
    else:
        raise TypeError(f"{what} must be a whole number >= {minimum}, got "
                        f"{type(value).__name__} {value!r}")
    if n < minimum:
        raise ValueError(f"{what} must be a whole number >= {minimum}, got {value!r}")
    if maximum is not None and n > maximum:
        raise ValueError(f"{what} = {n} is more than minipar lays out ({maximum}); "
                         f"is it a typo?")
    return n


def positive(value: Any, what: str, allow_zero: bool = False) -> float:
    """`value` as a finite float > 0 (>= 0 with `allow_zero`), or an error naming `what`."""
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a finite number {bound}, got "
                        f"{type(value).__name__} {value!r}")
    f = float(value)
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        raise ValueError(f"{what} must be a finite number {bound}, got {value!r}")
    return f


# ---- the blocks collectives and sends move ---------------------------------------------
def block(x: Any, rank: int, kind: str) -> np.ndarray:
    """x as an ndarray that can cross the wire, or a CollectiveUsageError naming the rank
    and the call: not None, not ragged, not Python objects (an object array holds
    references, so every rank would share the same objects; NCCL moves only buffers)."""
    if x is None:
        raise CollectiveUsageError(f"rank {rank}: {kind} needs an array, got None")
    try:
        a = np.asarray(x)
    except ValueError as e:  # a ragged nested list
        raise CollectiveUsageError(
            f"rank {rank}: {kind} needs a rectangular array, but its input cannot become one "
            f"({e}); pad the rows to one length, or send the pieces as separate calls"
        ) from None
    if a.dtype.kind == "O":
        raise CollectiveUsageError(
            f"rank {rank}: {kind} got an array of Python objects (dtype object); a collective "
            "moves buffers of numbers (as NCCL does), and copying references would let ranks "
            "share objects. Convert it to a numeric dtype first")
    return a


def is_numeric(dtype: np.dtype) -> bool:
    """bool, integer, floating or complex, including ml_dtypes' bfloat16 and float8 types
    (kind 'V' like a structured dtype, but with their own scalar type, not np.void)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "biufc" or (dtype.kind == "V" and dtype.type is not np.void)


def reducible(x: np.ndarray, rank: int, kind: str, group) -> None:
    """Refuse a reduction of strings, bytes, dates or records: sum, max... are not defined
    for them (and some would silently return the input)."""
    if x.dtype.kind not in "biufc" and not is_numeric(x.dtype):
        raise CollectiveUsageError(
            f"rank {rank}: {kind} on group {group} got an array of dtype {x.dtype}, which "
            "cannot be reduced: reductions (sum, avg, prod, max, min) need numbers (bool, "
            "integer, floating or complex), as in NCCL. Encode it as numbers first, or move "
            "it unreduced with all_gather, gather or broadcast")
