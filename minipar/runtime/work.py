"""What every communication call shares: the `Work` handle of an operation in flight, the
call site named in diagnoses, and the check that an argument is an array."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import numpy as np

from .checks import block
from .context import Context

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


class Work:
    """An operation in flight. `wait()` returns its result; the compute stream waits."""

    def __init__(self, ctx: Context, finish, on_wait=None, ready=None):
        self._ctx = ctx
        self._ready = ready  # () -> bool: has the backend finished it (no blocking)?
        self._finish = finish  # () -> (result, end time); idempotent
        self._done: Optional[tuple[Any, float]] = None
        self._on_wait = on_wait  # run once, at the first wait() (releases the output buffer)

    def _resolve(self) -> tuple[Any, float]:
        if self._done is None:
            self._done = self._finish()
            self._finish = None  # the closure refers back to this Work: break the cycle, so
            # the result is freed as soon as the caller drops it, not at the next gc pass
        return self._done

    def wait(self) -> Any:
        result, end = self._resolve()
        self._ctx.clock.wait_until(end)
        if self._on_wait is not None:
            on_wait, self._on_wait = self._on_wait, None
            on_wait()
        return result

    def is_completed(self) -> bool:
        """True once the data has moved (every member arrived); never blocks."""
        return self._done is not None or (self._ready is not None and self._ready())

    @property
    def end_time(self) -> float:
        """Simulated time the operation finishes (resolves it if needed)."""
        return self._resolve()[1]


_in_runtime: dict[str, Optional[str]] = {}  # file -> None inside the runtime, else basename


def call_site() -> str:
    """file:line of the first caller outside the runtime, for diagnoses."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name not in _in_runtime:
            inside = os.path.dirname(os.path.abspath(name)) == _RUNTIME_DIR
            _in_runtime[name] = None if inside else os.path.basename(name)
        short = _in_runtime[name]
        if short is not None:
            return f"{short}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "<unknown>"


def as_array(x: Any, ctx: Context, kind: str) -> np.ndarray:
    """x as an ndarray, or a CollectiveUsageError naming the rank and the call."""
    return block(x, ctx.rank, kind)  # not None, ragged or objects: see runtime/checks.py
