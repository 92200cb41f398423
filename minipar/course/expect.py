"""Expectations a check states about a learner's answer, and failures worded for the learner.

    expect_close(received, expected)   same shape, values within rtol·|expected| + atol
    expect_equal(received, expected)   ==, for counts, strings, tuples
    expect_within(value, budget)       value <= budget, for budgeted design exercises
    expect_number(value)               a finite real number (not a bool), as a float
    expect_keys(result, keys)          a dict with these keys: their values

A failed expectation summarises instead of dumping: the shapes, how many elements differ,
the largest difference and where, a few differing positions side by side, and — when the
answer is a constant multiple of the right one — the ratio by name (2×, ½, n×, 1/n, −1×),
with its meaning when the check gives one (`ratios={"2": "summed where the mean was
wanted: divide by n"}`). A ratio is the most specific diagnosis there is, so it comes first.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterable, Mapping, Optional, Union

import numpy as np


class GradeFailure(AssertionError):
    """An expectation that did not hold, worded for the learner."""


Rank = Union[int, str, None]

#: the ratios `describe_ratio` names, as functions of the group size n (None: needs no n)
_RATIOS = (("2", lambda n: 2.0), ("1/2", lambda n: 0.5), ("-1", lambda n: -1.0),
           ("n", lambda n: float(n)), ("1/n", lambda n: 1.0 / n),
           ("n-1", lambda n: float(n - 1)), ("1/(n-1)", lambda n: 1.0 / (n - 1)))
_NEEDS_N = {"n", "1/n", "n-1", "1/(n-1)"}
_SPELLING = {"2": "2×", "1/2": "½", "-1": "−1×", "n": "n×", "1/n": "1/n",
             "n-1": "(n−1)×", "1/(n-1)": "1/(n−1)"}


def _where(rank: Rank) -> str:
    if rank is None:
        return ""
    return f"rank {rank}: " if isinstance(rank, (int, np.integer)) else f"{rank}: "


def constant_ratio(received: Any, expected: Any, rtol: float = 1e-9) -> Optional[float]:
    """c if received == c · expected element by element (within rtol), over the elements
    where expected is not zero (and received is zero where expected is); else None (also
    for c = 1, nothing to name, and c = 0, all zeros, which the values show)."""
    r = np.asarray(received, dtype=np.float64).reshape(-1)
    e = np.asarray(expected, dtype=np.float64).reshape(-1)
    if r.shape != e.shape or r.size == 0 or not (np.isfinite(r).all() and np.isfinite(e).all()):
        return None
    nz = e != 0
    if not nz.any() or np.any(r[~nz] != 0):
        return None
    c = r[nz] / e[nz]
    c0 = float(np.median(c))
    if c0 in (0.0, 1.0) or not np.allclose(c, c0, rtol=rtol, atol=0):
        return None
    return c0


def describe_ratio(received: Any, expected: Any, n: Optional[int] = None,
                   prefer: Iterable[str] = ()) -> Optional[tuple[str, str]]:
    """(key, words) naming a constant ratio received / expected: ("2", "received = 2×
    expected everywhere"), ("1/n", "... 1/n (n = 4) ..."); None when there is no constant
    ratio. A ratio no name fits is still given as a number ("0.75×"): for a single
    quantity (a 0-d result: bytes, seconds) when it is a simple fraction such as 3/2, and
    for an array when at least three nonzero elements agree on it (one or two fit any c). Where two names fit
    (2 and n at n = 2) the first of them in `prefer` wins, then the order above."""
    c = constant_ratio(received, expected)
    if c is None:
        return None
    preferred = [k for k in prefer if k in dict(_RATIOS)]
    rank = {k: i for i, k in enumerate(preferred)}
    for key, value in sorted(_RATIOS, key=lambda kv: rank.get(kv[0], len(rank))):
        if key in _NEEDS_N and (n is None or n < 2 or (key == "1/(n-1)" and n < 3)):
            continue
        if np.isclose(c, value(n), rtol=1e-9, atol=0):
            spelled = _SPELLING[key] + (f" (n = {n})" if key in _NEEDS_N else "")
            return key, f"received = {spelled} expected everywhere"
    e = np.asarray(expected)
    if e.ndim and np.count_nonzero(e) < 3:  # one or two elements of an array fit any c
        return None
    if not e.ndim:  # a single quantity: only a simple fraction (3/2, 4/3) says something
        simple = Fraction(c).limit_denominator(8)
        if not np.isclose(c, float(simple), rtol=1e-9, atol=0):
            return None
    return f"{c:.6g}", f"received = {c:.6g}× expected everywhere"


def _show(a: np.ndarray) -> str:
    if a.ndim == 0:
        return repr(a.item())
    if a.size <= 8:
        text = np.array2string(a, precision=6, max_line_width=88, separator=", ")
        return f"{text} (shape {a.shape}, {a.dtype})"
    return f"an array of shape {a.shape}, {a.dtype}"


def _differences(r: np.ndarray, e: np.ndarray, bad: np.ndarray, shown: int = 3) -> str:
    """How many elements differ, the largest difference and where, and a few positions."""
    diff = np.abs(r - e)
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), r.shape)
    at = f" at index {tuple(int(k) for k in worst)}" if r.ndim else ""
    text = (f"{int(bad.sum())} of {bad.size} elements differ; the largest difference is "
            f"{float(diff[worst]):.3g}{at}")
    if r.size > 8:
        idx = np.argwhere(bad)[:shown]
        cells = [f"{tuple(int(k) for k in i)}: expected {e[tuple(i)]:.6g}, received "
                 f"{r[tuple(i)]:.6g}" for i in idx]
        text += "; first differing: " + "; ".join(cells)
    return text


def expect_close(received: Any, expected: Any, *, what: str, rank: Rank = None,
                 rtol: float = 1e-10, atol: float = 1e-12, hint: str = "",
                 ratios: Optional[Mapping[str, str]] = None, n: Optional[int] = None) -> None:
    """Raise GradeFailure unless `received` has `expected`'s shape and values (within
    rtol·|expected| + atol). `ratios` maps a named constant ratio ("2", "1/2", "-1", "n",
    "1/n", "n-1", "1/(n-1)"; n = `n`) to what it means; a matching one is said first."""
    where = _where(rank)
    if received is None:
        raise GradeFailure(f"{where}{what} returned None, expected {_show(np.asarray(expected))}"
                           f"; did you forget a `return`? {hint}".rstrip())
    r, e = np.asarray(received), np.asarray(expected)
    if r.dtype == object or not (np.issubdtype(r.dtype, np.number) or r.dtype == bool):
        raise GradeFailure(f"{where}{what} is {type(received).__name__} {received!r:.80}, "
                           f"expected numbers like {_show(e)}. {hint}".rstrip())
    if r.shape != e.shape:
        raise GradeFailure(f"{where}{what} has shape {r.shape}, expected shape {e.shape}. "
                           f"{hint}".rstrip())
    rf, ef = r.astype(np.float64), e.astype(np.float64)
    bad = ~(np.abs(rf - ef) <= atol + rtol * np.abs(ef))
    if not bad.any():
        return
    named = describe_ratio(rf, ef, n, prefer=ratios or ())
    lead = ""
    if named is not None:
        key, words = named
        meaning = (ratios or {}).get(key)
        lead = f" {words}" + (f": {meaning}." if meaning else ".")
    detail = (f"off by {float(np.abs(rf - ef)):.3g}" if r.ndim == 0
              else _differences(rf, ef, bad))
    raise GradeFailure(f"{where}{what}:{lead} expected {_show(e)}\n    but received "
                       f"{_show(r)}\n    ({detail}). {hint}".rstrip())


def expect_equal(received: Any, expected: Any, *, what: str, rank: Rank = None,
                 hint: str = "") -> None:
    """Raise GradeFailure unless received == expected (numbers, strings, tuples, lists)."""
    if received != expected:
        raise GradeFailure(f"{_where(rank)}{what}: expected {expected!r} but received "
                           f"{received!r}. {hint}".rstrip())


def expect_within(value: float, budget: float, *, what: str, unit: str = "",
                  rank: Rank = None, hint: str = "") -> None:
    """Raise GradeFailure unless value <= budget: "peak memory 41.2 GiB is over its budget
    of 40 GiB by 1.2 GiB (3 %)"."""
    if not np.isfinite(value) or value > budget:
        u = f" {unit}" if unit else ""
        over = value - budget
        pct = f" ({100 * over / budget:.3g} %)" if budget > 0 and np.isfinite(value) else ""
        raise GradeFailure(f"{_where(rank)}{what} is {value:.6g}{u}, over its budget of "
                           f"{budget:.6g}{u} by {over:.3g}{u}{pct}. {hint}".rstrip())


def expect_number(value: Any, *, what: str) -> float:
    """`value` as a float when it is a finite real number (a bool is not one); else a
    GradeFailure saying what it is."""
    if isinstance(value, (bool, np.bool_)):
        raise GradeFailure(f"{what} is {value!r}; expected a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise GradeFailure(f"{what} is {value!r:.80}; expected a number") from None
    if not math.isfinite(out):
        raise GradeFailure(f"{what} is {out}; expected a finite number")
    return out


def expect_keys(result: Any, keys: Iterable[str], *, what: str) -> dict:
    """{key: result[key]} for each of `keys` when `result` is a dict holding them all; else
    a GradeFailure naming the first key missing (or saying a dict was expected)."""
    keys = tuple(keys)
    if not isinstance(result, dict):
        raise GradeFailure(f"{what} returned {result!r:.80}; expected a dict with the keys "
                           f"{', '.join(keys)}")
    missing = [k for k in keys if k not in result]
    if missing:
        raise GradeFailure(f"{what} returned no {missing[0]!r}; expected the keys "
                           f"{', '.join(keys)}")
    return {k: result[k] for k in keys}


def learner(what: str, fn, *args):
    """Call the learner's function; a crash is reported as a GradeFailure saying what was
    called (`what`), not as the grader's own traceback. GradeFailure and NotImplementedError
    (an exercise not done yet) pass through."""
    try:
        return fn(*args)
    except (GradeFailure, NotImplementedError):
        raise
    except Exception as e:  # noqa: BLE001 (the learner's bug, in their terms)
        raise GradeFailure(f"{what} raised {type(e).__name__}: {e}") from None
