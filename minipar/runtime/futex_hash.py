"""The kernel's futex hash while simulated ranks run: a bucket for every few ranks, not 16.

Every blocked rank sleeps in the kernel on a futex (a Python lock is a semaphore, and a
semaphore waits on a futex), and every wake-up looks its sleeper up in a hash table of
waiters: a bucket is a list, walked until the futex is found. Since Linux 6.16 a process
has a private table, sized when its first thread starts at 4 buckets per online CPU, at
least 16: 16 buckets on this 2-core machine, whatever the number of threads. With 4,096
ranks asleep, a bucket holds about 256 of them and each wake-up walks half of that, so
the kernel's share of a step grows with the square of the world size. A process may
resize its table (prctl PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS), and while a launch of N
ranks runs it is given the power of two at or above 4·N slots (N = 4,096: 16,384 slots,
a few hundred KiB), the kernel's own 4 per thread. Measured on one dp x pp x tp step at
4,096 ranks (benchmarks/bench_scale.py): kernel time 19.9 s with 16 buckets, 11.9 s with
8,192; wall time 70-74 s before, about 65 s after.

A resize is not free: the kernel moves every waiter to the new table after an RCU grace
period, about 75 ms for a resize and its restore on this machine, more than a whole launch
of 8 ranks (4-10 ms). Below RESIZE_FROM ranks the 16 buckets cost less than that (at 512
ranks, 20 all-reduces took 3.73 s with 16 buckets and 3.81 s resized), so only launches
of RESIZE_FROM ranks or more resize.

Elsewhere (an older kernel, another system, a sandbox that refuses the call) nothing
changes: the call fails and is ignored. Results never depend on it, only the time.
`launch` restores the size it found when it returns (0: the kernel's global table).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from typing import Iterator, Optional

PR_FUTEX_HASH = 78  # prctl option (linux/prctl.h, 6.16+)
PR_FUTEX_HASH_SET_SLOTS = 1
PR_FUTEX_HASH_GET_SLOTS = 2
RESIZE_FROM = 1024  # ranks: smaller launches keep the table they find (module docstring)


def slots_for(world_size: int) -> int:
    """The table size asked for during a launch of `world_size` ranks: the power of two
    at or above 4·world_size (the kernel refuses sizes that are not powers of two)."""
    return 1 << max(4, (4 * world_size - 1).bit_length())


def _prctl():
    """libc's prctl, or None off Linux (or without a C library to load)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def get_slots() -> Optional[int]:
    """The process's futex hash size (0: the kernel's global table), or None where the
    kernel has no private futex hash."""
    prctl = _prctl()
    if prctl is None:
        return None
    n = prctl(PR_FUTEX_HASH, PR_FUTEX_HASH_GET_SLOTS, 0, 0, 0)
    return None if n < 0 else int(n)


def _set_slots(n: int) -> bool:
    prctl = _prctl()
    return prctl is not None and prctl(PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS, n, 0, 0) == 0


@contextlib.contextmanager
def enough_futex_slots(world_size: int) -> Iterator[None]:
    """Run a block with at least slots_for(world_size) futex hash buckets (for
    RESIZE_FROM ranks or more, if the kernel has a private hash to resize, and it is
    smaller), then restore the size found."""
    if world_size < RESIZE_FROM:
        yield
        return
    before = get_slots()
    want = slots_for(world_size)
    if before is None or (before != 0 and before >= want) or not _set_slots(want):
        yield
        return
    try:
        yield
    finally:
        _set_slots(before)
