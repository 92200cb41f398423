"""Blocked ranks on the simulated backend: who waits for what, who wakes whom, deadlocks.

Ranks are threads. One lock guards the world's state (this class's and the slots and
mailboxes of backends/sim.py). A rank that must wait records what it waits for — a
predicate over that state, and a sentence for diagnoses — and sleeps, without spinning,
on a condition of its own over the world's lock.

Who wakes whom. Every change of state calls `_changed`, which stamps `progress` for the
watchdog (runtime/watchdog.py) and re-checks the predicate of the sleeping ranks it can
satisfy (a message its receiver, a posted recv its sender, a complete collective its
members; not every sleeper, which made each change O(world)): only the ranks whose wait
is now satisfied are woken, each once. A failure wakes them all, and
they leave with `WorldAborted`. So a rank never wakes to find nothing to do: with a
single condition shared by all, every change woke every sleeper, which then had to take
the interpreter lock back only to sleep again (benchmarks/README.md, "Pipeline
parallelism", counts them).

Diagnosis instead of hangs. When every rank that has not finished is blocked and none of
their waits can be satisfied, nothing can ever happen again: the world fails at once with
a `DeadlockError` listing each rank and what it waits in. A wait may carry a deadline
(`Work.wait(timeout=)`): past it, the waiting rank raises `CollectiveTimeoutError`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterable, Optional

from ..errors import CollectiveTimeoutError, DeadlockError, WorldAborted


class _Waiting:
    """What a blocked rank waits for; `woken` once a change has satisfied it."""

    def __init__(self, predicate: Callable[[], bool], describe: Callable[[], str]):
        self.predicate = predicate
        self.describe = describe
        self.woken = False


class RankWaits:
    """The blocking part of a simulated world of `world_size` ranks (SimWorld extends it)."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.lock = threading.Lock()  # guards the world's state, here and in SimWorld
        self.wakeup = [threading.Condition(self.lock) for _ in range(world_size)]  # per rank
        self.waiting: dict[int, _Waiting] = {}  # rank -> what it sleeps on
        self.sleeps = [0] * world_size  # how often each rank went to sleep in a wait
        self.wakeups = [0] * world_size  # how often each rank was woken; equal to sleeps
        # in a run where no wait times out and nothing fails
        self.finished: set[int] = set()
        self.woken: set[int] = set()  # ranks in `waiting` already woken, not yet running
        self.error: Optional[BaseException] = None
        self.progress = time.monotonic()  # wall time of the last change of state
        self.computing = 0  # last arrivals computing a collective's results, lock released
        self.last_call: dict[int, tuple] = {}  # rank -> its latest call: (format, *args)
        self.deadlines: dict[int, tuple[float, float]] = {}  # rank -> (deadline, timeout)
        self._cut: Optional[tuple] = None  # (error, its first line): see _headline

    # ---- lifecycle (call with self.lock held, except fail and finish) ---------------
    def _changed(self, ranks: Optional[Iterable[int]] = None) -> None:
        """Something happened: stamp the watchdog's clock, and wake each sleeping rank
        whose wait it satisfied (every one of them once the world has failed). `ranks`:
        the only ranks whose wait this change can satisfy (a message's receiver, a recv's
        sender, a collective's members), so a change costs O(those), not O(world); None
        re-checks every sleeping rank."""
        self.progress = time.monotonic()
        failed = self.error is not None
        if failed or ranks is None:
            candidates = list(self.waiting.items())
        else:
            candidates = [(r, self.waiting[r]) for r in ranks if r in self.waiting]
        for rank, w in candidates:
            if not w.woken and (failed or w.predicate()):
                w.woken = True
                self.woken.add(rank)
                self.wakeups[rank] += 1
                self.wakeup[rank].notify()

    def fail(self, error: BaseException) -> None:
        """Record the first failure and wake every blocked rank so it can leave."""
        with self.lock:
            if self.error is not None:
                return  # the first failure already woke every rank, and none sleeps again
            self.error = error
            self._changed()

    def finish(self, rank: int) -> None:
        """Rank returned from its program; if the others now wait forever, say so."""
        with self.lock:
            self.finished.add(rank)
            self._stop_waiting(rank)
            self._check_deadlock()
            self._changed(())  # a rank's end satisfies no other rank's wait

    def _check_alive(self) -> None:
        if self.error is not None:
            raise WorldAborted(f"stopped because another rank failed: {self._headline()}")

    def _headline(self) -> str:
        """The failure's first line, cut once. Its whole text has a line per rank (about
        600 KB at 4,096 ranks), and each rank leaving used to copy all but that line
        (str.partition): a fresh large allocation every time, whose pages the kernel had to
        map. A mismatch on a world group of 4,096 ranks took 177 s to report, 146 s of it
        in the kernel; about 6 s since."""
        if self._cut is None or self._cut[0] is not self.error:
            text = str(self.error)
            end = text.find("\n")
            self._cut = (self.error, text if end < 0 else text[:end])
        return self._cut[1]

    # ---- blocking with deadlock detection (call with self.lock held) ----------------
    def block_until(self, rank: int, ready: Callable[[], bool], describe: Callable[[], str]):
        """Sleep until ready() holds; woken by `_changed` only once it does (or on failure)."""
        deadline = self.deadlines.get(rank)
        while True:
            self.woken.discard(rank)
            self._check_alive()
            if ready():
                self._stop_waiting(rank)
                return
            self.waiting[rank] = _Waiting(ready, describe)
            if self._check_deadlock():
                raise self.error
            self.sleeps[rank] += 1
            if deadline is None:
                self.wakeup[rank].wait()
                continue
            left = deadline[0] - time.monotonic()
            if left <= 0:
                self._stop_waiting(rank)
                raise CollectiveTimeoutError(
                    f"rank {rank}: Work.wait(timeout={deadline[1]:g}) expired, still waiting "
                    f"in {describe()}. torch raises the same when a wait times out; find the "
                    "rank that never arrived, or wait longer")
            self.wakeup[rank].wait(left)

    def _stop_waiting(self, rank: int) -> None:
        self.waiting.pop(rank, None)
        self.woken.discard(rank)

    @contextlib.contextmanager
    def deadline(self, rank: int, seconds: float):
        """Waits of `rank` inside this block raise CollectiveTimeoutError after `seconds`."""
        self.deadlines[rank] = (time.monotonic() + seconds, seconds)
        try:
            yield
        finally:
            self.deadlines.pop(rank, None)

    def _check_deadlock(self) -> bool:
        """True (and the world failed with a DeadlockError) if no live rank can proceed."""
        if self.error is not None:
            return False
        # O(1) at almost every sleep: some live rank is running (not waiting), or was
        # woken and will run; waits only ever become satisfiable, so a woken one stays so
        if self.woken or len(self.waiting) < self.world_size - len(self.finished):
            return False
        live = [r for r in range(self.world_size) if r not in self.finished]
        if not live or any(self.waiting[r].predicate() for r in live):
            return False
        lines = ["deadlock: every live rank is blocked and none of them can proceed."]
        for r in range(self.world_size):
            state = ("finished (returned from its program)" if r in self.finished
                     else "waiting in " + self.waiting[r].describe())
            lines.append(f"  rank {r}: {state}")
        lines.append("Check that every rank of each group makes the same collective calls in "
                     "the same order, and that every recv has a matching send.")
        if any(self.waiting[r].describe().startswith("send(") for r in live):
            lines.append(
                "A blocking send returns only once its receiver has posted the matching recv "
                "(launch(..., sends='rendezvous'), as on NCCL and with MPI_Ssend): when every "
                "rank of a ring sends before it receives, all of them wait forever. Post both "
                "sides at once (isend, then recv, then wait on the send; or "
                "batch_isend_irecv), or alternate by parity: even ranks send first, odd ranks "
                "receive first.")
        self.error = DeadlockError("\n".join(lines))
        self._changed()
        return True
