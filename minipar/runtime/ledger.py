"""A device's memory ledger: every named allocation, by category, current and peak.

    held(t)  = sum of the nbytes of the allocations alive at t
    peak     = max over t of held(t)          (also kept per category)

The ledger is bookkeeping, not an allocator: code that keeps an array on a device says so
with `hold(name, array_or_nbytes, category)` and `release(name)`. Going over the device's
capacity raises `SimulatedOutOfMemoryError` with the breakdown, the way a CUDA OOM reports
what is allocated.

`record_history(now)` also keeps, from then on, one (time, category, bytes held in that
category) entry per hold and release, stamped with `now()` (a rank's clock: torch's
`torch.cuda.memory._record_memory_history` does the same for its allocator); `minipar demo`
draws memory over a step from it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import numpy as np

from .errors import SimulatedOutOfMemoryError

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "comm_buffers",
              "other")


def nbytes_of(x: Union[int, float, np.ndarray]) -> int:
    """Bytes of an array (its `nbytes`) or an explicit byte count (int, or a whole float)."""
    if type(x) is np.ndarray:  # the common case first: no checks to make
        return x.nbytes
    if x is None or isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"an allocation's size is an array or a number of bytes, got "
                        f"{type(x).__name__} {x!r}")
    if isinstance(x, (int, np.integer)):
        if x < 0:
            raise ValueError(f"an allocation cannot have a negative size, got {x} bytes")
        return int(x)
    if isinstance(x, (float, np.floating)):  # a byte count computed in floating point
        if not (x >= 0 and float(x).is_integer()):
            raise ValueError(f"an allocation size must be a whole, non-negative number of "
                             f"bytes, got {x}")
        return int(x)
    return int(np.asarray(x).nbytes)


def fmt_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as torch.cuda.memory_summary prints)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class Allocation:
    name: str
    nbytes: int
    category: str


class MemoryLedger:
    """Named allocations of one device, with current and peak bytes per category."""

    def __init__(self, capacity: Optional[int] = None, device_name: str = "device",
                 rank: int = 0):
        if capacity is not None:  # None: no limit
            if isinstance(capacity, (bool, np.bool_)) or not isinstance(
                    capacity, (int, float, np.integer, np.floating)) or not (
                    capacity >= 0 and float(capacity).is_integer()):
                raise ValueError(
                    f"rank {rank}: a memory ledger's capacity is a whole number of bytes "
                    f">= 0 (or None for no limit), got {capacity!r}")
            capacity = int(capacity)
        self.capacity = capacity
        self.device_name = device_name
        self.rank = rank
        self._live: dict[str, Allocation] = {}
        self._current = {c: 0 for c in CATEGORIES}
        self._peak = {c: 0 for c in CATEGORIES}
        self._total = 0
        self._peak_total = 0
        self._serial = 0
        self._now = None  # record_history's clock, when recording
        self.history: list[tuple[float, str, int]] = []

    # ---- holding and releasing ------------------------------------------------------
    def hold(self, name: str, size: Union[int, np.ndarray], category: str = "other") -> str:
        """Charge `size` bytes (an int, or an array's nbytes) under `name`; return the name."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}: expected one of {CATEGORIES}")
        if name in self._live:
            raise ValueError(
                f"rank {self.rank}: an allocation named {name!r} is already held "
                f"({fmt_bytes(self._live[name].nbytes)}, {self._live[name].category}); "
                "release it first or choose another name"
            )
        nb = nbytes_of(size)
        if self.capacity is not None and self._total + nb > self.capacity:
            raise SimulatedOutOfMemoryError(self._oom_message(name, nb, category))
        self._live[name] = Allocation(name, nb, category)
        self._current[category] += nb
        self._total += nb
        self._peak[category] = max(self._peak[category], self._current[category])
        self._peak_total = max(self._peak_total, self._total)
        if self._now is not None:
            self.history.append((self._now(), category, self._current[category]))
        return name

    def hold_unique(self, prefix: str, size: Union[int, np.ndarray], category: str) -> str:
        """Like `hold`, under a fresh name `prefix#k`; returns that name for `release`."""
        self._serial += 1
        return self.hold(f"{prefix}#{self._serial}", size, category)

    def release(self, name: str) -> int:
        """Give back the allocation `name`; returns its bytes."""
        try:
            alloc = self._live.pop(name)
        except KeyError:
            raise KeyError(f"rank {self.rank}: no live allocation named {name!r} to release; "
                           f"live: {sorted(self._live)[:10]}") from None
        self._current[alloc.category] -= alloc.nbytes
        self._total -= alloc.nbytes
        if self._now is not None:
            self.history.append((self._now(), alloc.category, self._current[alloc.category]))
        return alloc.nbytes

    @contextlib.contextmanager
    def scoped(self, name: str, size: Union[int, np.ndarray], category: str = "other"
               ) -> Iterator[str]:
        """Hold for the duration of a `with` block."""
        self.hold(name, size, category)
        try:
            yield name
        finally:
            self.release(name)

    def record_history(self, now) -> None:
        """From now on, append (now(), category, bytes held in it) to `history` at every hold
        and release; `now` is a function of no arguments (e.g. `lambda: ctx.clock.now`);
        None stops recording."""
        if now is not None and not callable(now):
            raise TypeError(f"rank {self.rank}: record_history takes a function returning "
                            f"the time (e.g. lambda: ctx.clock.now), got {now!r}")
        self._now = now

    # ---- reading ------------------------------------------------------------------
    def held(self, category: Optional[str] = None) -> int:
        """Bytes held now, in total or in one category."""
        return self._total if category is None else self._current[category]

    def peak(self, category: Optional[str] = None) -> int:
        """The most bytes ever held at once, in total or in one category."""
        return self._peak_total if category is None else self._peak[category]

    def live(self) -> list[Allocation]:
        return list(self._live.values())

    def reset_peak(self) -> None:
        """Start peak tracking afresh from what is held now (torch.cuda.reset_peak_memory_stats)."""
        self._peak = dict(self._current)
        self._peak_total = self._total

    def summary(self) -> str:
        """A table of current and peak bytes per category."""
        lines = [f"rank {self.rank} {self.device_name}: memory by category",
                 f"  {'category':<18}{'current':>14}{'peak':>14}"]
        for c in CATEGORIES:
            lines.append(f"  {c:<18}{fmt_bytes(self._current[c]):>14}{fmt_bytes(self._peak[c]):>14}")
        lines.append(f"  {'total':<18}{fmt_bytes(self._total):>14}{fmt_bytes(self._peak_total):>14}")
        if self.capacity is not None:
            lines.append(f"  capacity {fmt_bytes(self.capacity)}")
        return "\n".join(lines)

    def _oom_message(self, name: str, nb: int, category: str) -> str:
        biggest = sorted(self._live.values(), key=lambda a: -a.nbytes)[:5]
        lines = [
            f"simulated out of memory on rank {self.rank} ({self.device_name}): tried to hold "
            f"{fmt_bytes(nb)} for {name!r} ({category}) with {fmt_bytes(self._total)} already "
            f"held of {fmt_bytes(self.capacity)} capacity "
            f"({fmt_bytes(self.capacity - self._total)} free).",
            "Held by category:",
        ]
        lines += [f"  {c:<18}{fmt_bytes(self._current[c]):>14}" for c in CATEGORIES
                  if self._current[c]]
        lines.append("Largest live allocations:")
        lines += [f"  {a.name:<30}{fmt_bytes(a.nbytes):>14}  {a.category}" for a in biggest]
        lines.append("Shard more (ZeRO/FSDP, tensor or pipeline parallelism), recompute "
                     "activations, or use smaller micro-batches.")
        return "\n".join(lines)
