"""What every communication call shares: the `Work` handle of an operation in flight, the
call site named in diagnoses, and the checks that an argument is an array or a timeout."""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
from typing import Any, Optional

import numpy as np

from .checks import block
from .context import Context
from .errors import CollectiveTimeoutError, CollectiveUsageError

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

    def wait(self, timeout=None) -> Any:
        """The result, once the operation is done. `timeout` (seconds, or a timedelta as
        torch takes): raise CollectiveTimeoutError if it is not done in that much wall
        time, as torch's `Work.wait(timeout)` does."""
        if timeout is not None and self._done is None:
            seconds = check_timeout(timeout, "Work.wait(timeout=...)")
            deadline = getattr(self._ctx.backend, "deadline", None)
            if deadline is not None:
                with deadline(self._ctx.rank, seconds):
                    self._resolve()
            else:  # a backend without deadlines (mpi): poll until done or out of time
                end = time.monotonic() + seconds
                while not self.is_completed():
                    if time.monotonic() > end:
                        raise CollectiveTimeoutError(
                            f"rank {self._ctx.rank}: Work.wait(timeout={seconds:g}) expired "
                            "before the operation completed")
                    time.sleep(1e-3)
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


def check_timeout(timeout: Any, what: str) -> float:
    """A timeout in seconds (a number or a datetime.timedelta) as a positive finite float."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    ok = (isinstance(timeout, (int, float, np.integer, np.floating))
          and not isinstance(timeout, bool))
    if not ok or not math.isfinite(timeout) or timeout <= 0:
        raise CollectiveUsageError(
            f"{what} got {timeout!r}: a timeout is a positive, finite number of seconds (or "
            "a datetime.timedelta); pass None for no timeout")
    return float(timeout)
