"""The watchdog of `launch(..., timeout=T)`: ranks waited and nothing happened for T seconds.

A deadlock inside minipar is diagnosed at once (backends/waits.py). What the runtime cannot
see is a rank that never comes back to it: spinning in a loop, sleeping, computing for
ever, waiting on a lock or a queue of its own. Its peers wait for it without end. NCCL's
watchdog ends such a job when a collective has not completed for its timeout (10 minutes
by default in PyTorch, `timeout=` of `init_process_group`); this one ends the run when
some rank waits and the world has not changed for `T` seconds, and says which ranks never
arrived, where each of them is now, and where the others wait.

Ranks are threads, and a thread cannot be killed: the waiting ranks are woken with the
error and leave; a rank that never arrived is left running as a daemon thread (renamed
`minipar-abandoned-rank-N`), named in the error, and stops at its next minipar call.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from .errors import CollectiveTimeoutError

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB = os.path.dirname(os.path.abspath(threading.__file__))
_SKIP = (_RUNTIME_DIR, _STDLIB)  # where a stuck rank's frame is not its own code
GRACE = 1.0  # seconds the woken ranks get to leave before the others are abandoned


def watch(world, threads: list[threading.Thread], timeout: float) -> tuple[bool, list[int]]:
    """Join `threads`. If ranks wait while nothing happens for `timeout` seconds, fail
    `world` with CollectiveTimeoutError. Returns (whether it fired, the ranks whose threads
    were still running when the run ended and were left behind)."""
    poll = min(0.1, timeout / 4)
    fired = False
    while not fired and any(t.is_alive() for t in threads):
        next(t for t in threads if t.is_alive()).join(poll)
        with world.lock:
            if world.error is not None:
                break
            idle = time.monotonic() - world.progress
            if world.waiting and not world.computing and idle >= timeout:
                world.error = CollectiveTimeoutError(_report(world, threads, timeout, idle))
                world._changed()
                fired = True
    # the run has failed (or finished): the woken ranks leave at once; one still running
    # outside minipar gets `timeout` (GRACE after the watchdog fired) and is then left
    end = time.monotonic() + (GRACE if fired else timeout)
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    left = [r for r, t in enumerate(threads) if t.is_alive()]
    for r in left:
        threads[r].name = f"minipar-abandoned-rank-{r}"
    return fired, left


def abandoned_note(ranks: list[int]) -> str:
    """What launch adds to its error about the ranks left running."""
    return (f"rank(s) {ranks}: still running outside minipar when the run ended; a thread "
            "cannot be stopped from outside, so it was left behind as a daemon thread (named "
            "minipar-abandoned-rank-N); it stops at its next minipar call or when this "
            "process exits")


def _report(world, threads: list[threading.Thread], timeout: float, idle: float) -> str:
    """Each rank's state: waiting (in what), finished, or never arrived (and where it is)."""
    lines = [f"watchdog: ranks have waited {idle:.1f} s with no progress "
             f"(launch(..., timeout={timeout:g})); the run is ended, as NCCL's watchdog ends "
             "a job whose collective never completes."]
    absent = []
    frames = sys._current_frames()
    for r in range(world.world_size):
        if r in world.finished:
            lines.append(f"  rank {r}: finished (returned from its program)")
        elif r in world.waiting:
            lines.append(f"  rank {r}: waiting in {world.waiting[r].describe()}")
        else:
            absent.append(r)
            last = world.last_call.get(r)
            last = last[0].format(*last[1:]) if last else None
            lines.append(f"  rank {r}: never arrived: running outside minipar, now at "
                         f"{_where(frames.get(threads[r].ident))}; its last minipar call: "
                         f"{last or 'none yet'}")
    lines.append(f"Ranks that never arrived: {absent}. A rank that computes, sleeps, spins or "
                 "waits on something minipar cannot see (a lock, a queue, input) for longer "
                 "than the timeout looks hung to its peers: find why it does not reach its "
                 "next call, or raise the timeout.")
    return "\n".join(lines)


def _where(frame) -> str:
    """file:line in function of the innermost frame outside minipar's runtime and the
    standard library (time.sleep, queue.get and threading waits are not the rank's code)."""
    if frame is None:
        return "<unknown>"
    stack = traceback.extract_stack(frame)
    mine = [f for f in stack if not os.path.abspath(f.filename).startswith(_SKIP)] or stack
    f = mine[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
