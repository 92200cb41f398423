"""The interpreter's settings while simulated ranks run: full garbage collections as rare
as the world is large, and a longer switch interval.

A simulated run keeps every rank's model, optimizer state, ledger and trace in one
process: millions of small objects at a few thousand ranks, alive as long as the launch.
CPython's cyclic collector walks all of them at each full (generation 2) collection, and
with its default thresholds (700, 10, 10) it weighs one after every ten collections of
generation 1, that is every ~70,000 allocations, however large the heap. A full
collection's work grows with the world size, so their total grows with its square. One
training step of a tiny GPT as dp x pp x tp (benchmarks/bench_scale.py) measured:

    2,048 ranks   default 60.9 s (26 full collections); x 10: 47.5 s (4); none: 41.4 s
    4,096 ranks   (with the switch interval below) x 256: 78.4 s (3); none: 72.8 s

So while a launch of N ranks runs, the generation-2 threshold is multiplied by
max(10, N / 16): the allocations between two full collections grow with the heap, and a
full collection's cost, spread over them, stays the same per allocation at any N (the
rule of generational collectors). Young objects are collected as often as before, and a
cycle that survives into the old generation is still collected, later; `launch` restores
the thresholds when it returns. (The setting is the interpreter's: two launches
overlapping in two threads of one program share it, and the one that ends last restores
what the first found.)
"""

from __future__ import annotations

import contextlib
import gc
import sys
from typing import Iterator


def factor(world_size: int) -> int:
    """How many times rarer full collections are during a launch of `world_size` ranks."""
    return max(10, world_size // 16)


@contextlib.contextmanager
def fewer_full_collections(world_size: int) -> Iterator[None]:
    """Run a block with the generation-2 threshold factor(world_size) times higher (a no-op
    while automatic collection is off, threshold 0)."""
    before = gc.get_threshold()
    if before[0] == 0 or len(before) < 3:
        yield
        return
    gc.set_threshold(before[0], before[1], before[2] * factor(world_size))
    try:
        yield
    finally:
        gc.set_threshold(*before)


#: seconds a rank's thread may keep the interpreter lock while others want it (CPython's
#: default: 0.005); see `longer_switch_interval`
SWITCH_INTERVAL = 0.1


@contextlib.contextmanager
def longer_switch_interval(seconds: float = SWITCH_INTERVAL) -> Iterator[None]:
    """Run a block with the interpreter's switch interval at `seconds` (if that is longer).

    Rank threads give the interpreter lock up whenever they wait (a collective, a
    receive), which is where a simulated program hands over from one rank to the next.
    With CPython's 5 ms interval, a thread computing between two waits is also made to
    give it up on a timer, often while it holds the world's lock, and every rank that then
    runs and reaches a collective blocks on that lock and switches again: at thousands of
    ranks, most switches are of that kind. Measured on one dp x pp x tp step
    (benchmarks/bench_scale.py): 2,048 ranks 42.0 s at 5 ms, 34.5 s at 50 ms, 33.6 s at
    100 ms, 33.4 s at 500 ms; 4,096 ranks 104.5 s at 5 ms, 83.2 s at 100 ms. Nothing
    waits on the timer for correctness: results never depend on the thread timing."""
    before = sys.getswitchinterval()
    if seconds <= before:
        yield
        return
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
