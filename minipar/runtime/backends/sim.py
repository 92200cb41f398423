"""The simulated backend: ranks are threads of one process, collectives rendezvous.

At the k-th call of a group, each member deposits its `Call` in the slot (group, k). The
last member to arrive checks that every member called the same thing, computes all the
results with the reference definition (`reference.REFERENCES[kind]`) in group order, and
wakes the others. So results are deterministic, bit for bit, whatever the thread timing.

Sends are eager (like a buffered MPI send): the message is copied into the receiver's
mailbox and the sender goes on. A receive blocks until its message is there.

Diagnosis instead of hangs. A rank that must block records what it waits for. When every
rank that has not finished is blocked and none of their waits can be satisfied, nothing
can ever happen again: the world fails at once with a `DeadlockError` listing each rank.
Blocked threads sleep on one condition variable (no busy waiting) and are woken by every
change of state; when one rank fails, all of them wake and leave with `WorldAborted`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..errors import CollectiveMismatchError, DeadlockError, WorldAborted
from ..reference import REFERENCES
from .base import Call, Outcome


@dataclass
class _Slot:
    """The k-th collective of one group: who has arrived, and the results once complete."""

    size: int
    calls: dict[int, Call] = field(default_factory=dict)  # group rank -> call
    outcomes: Optional[list[Outcome]] = None
    taken: int = 0


@dataclass
class _Message:
    array: np.ndarray
    arrival: float
    where: str


class _Waiting:
    def __init__(self, predicate: Callable[[], bool], describe: Callable[[], str]):
        self.predicate = predicate
        self.describe = describe


class SimHandle:
    """Handle of an operation on the simulated backend; wait() blocks without spinning."""

    def __init__(self, world: "SimWorld", rank: int, ready: Callable[[], bool],
                 take: Callable[[], Outcome], describe: Callable[[], str]):
        self._world, self._rank = world, rank
        self._ready, self._take, self._describe = ready, take, describe
        self._outcome: Optional[Outcome] = None

    def is_completed(self) -> bool:
        with self._world.cond:
            return self._outcome is not None or self._ready()

    def wait(self) -> Outcome:
        if self._outcome is None:
            w = self._world
            with w.cond:
                w.block_until(self._rank, self._ready, self._describe)
                self._outcome = self._take()
        return self._outcome


class SimWorld:
    """Shared state of one simulated run: slots, mailboxes, who waits for what."""

    name = "sim"

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.cond = threading.Condition()
        self.slots: dict[tuple, _Slot] = {}
        self.counters: dict[tuple, int] = {}  # (rank, group key) -> next call index
        self.mail: dict[tuple, dict[int, _Message]] = {}  # (src, dst, tag) -> seq -> msg
        self.sent: dict[tuple, int] = {}
        self.posted: dict[tuple, int] = {}
        self.waiting: dict[int, _Waiting] = {}
        self.finished: set[int] = set()
        self.error: Optional[BaseException] = None

    # ---- lifecycle -----------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """Record the first failure and wake every blocked rank so it can leave."""
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()

    def finish(self, rank: int) -> None:
        """Rank returned from its program; if the others now wait forever, say so."""
        with self.cond:
            self.finished.add(rank)
            self._check_deadlock()
            self.cond.notify_all()

    def _check_alive(self) -> None:
        if self.error is not None:
            raise WorldAborted(f"stopped because another rank failed: {self.error}")

    # ---- blocking with deadlock detection (call with self.cond held) ----------------
    def block_until(self, rank: int, ready: Callable[[], bool], describe: Callable[[], str]):
        while True:
            self._check_alive()
            if ready():
                self.waiting.pop(rank, None)
                return
            self.waiting[rank] = _Waiting(ready, describe)
            if self._check_deadlock():
                raise self.error
            self.cond.wait()

    def _check_deadlock(self) -> bool:
        """True (and the world failed with a DeadlockError) if no live rank can proceed."""
        if self.error is not None:
            return False
        live = [r for r in range(self.world_size) if r not in self.finished]
        if not live or any(r not in self.waiting for r in live):
            return False
        if any(self.waiting[r].predicate() for r in live):
            return False
        lines = ["deadlock: every live rank is blocked and none of them can proceed."]
        for r in range(self.world_size):
            state = ("finished (returned from its program)" if r in self.finished
                     else "waiting in " + self.waiting[r].describe())
            lines.append(f"  rank {r}: {state}")
        lines.append("Check that every rank of each group makes the same collective calls in "
                     "the same order, and that every recv has a matching send.")
        self.error = DeadlockError("\n".join(lines))
        self.cond.notify_all()
        return True

    # ---- collectives -----------------------------------------------------------------
    def collective(self, call: Call) -> SimHandle:
        g = call.group
        me = g.group_rank(call.rank)
        with self.cond:
            self._check_alive()
            ckey = (call.rank, g.key)
            index = self.counters.get(ckey, 0)
            self.counters[ckey] = index + 1
            skey = (g.key, index)
            slot = self.slots.setdefault(skey, _Slot(g.size))
            first = next(iter(slot.calls.values()), None)
            slot.calls[me] = call
            if first is not None and first.signature != call.signature:
                self._mismatch(slot, g, index)
            if len(slot.calls) == g.size:
                self._complete(slot)
                self.cond.notify_all()

        def ready() -> bool:
            return slot.outcomes is not None

        def take() -> Outcome:
            slot.taken += 1
            if slot.taken == g.size:
                self.slots.pop(skey, None)
            return slot.outcomes[me]

        def describe() -> str:
            arrived = sorted(g.ranks[i] for i in slot.calls)
            missing = [r for r in g.ranks if r not in arrived]
            return (f"{call.kind} on group {g} (call #{index} of that group) at {call.where}; "
                    f"arrived: {arrived}, not yet arrived: {missing}")

        return SimHandle(self, call.rank, ready, take, describe)

    def _mismatch(self, slot: _Slot, g, index: int) -> None:
        lines = [f"collective mismatch on group {g} at call #{index} of that group: "
                 "its ranks called different things."]
        for i in sorted(slot.calls):
            lines.append(f"  rank {g.ranks[i]}: {slot.calls[i].describe()}")
        for i in range(g.size):
            if i not in slot.calls:
                lines.append(f"  rank {g.ranks[i]}: (not arrived yet)")
        lines.append("Every rank of a group must make the same collective calls, with the same "
                     "shapes, dtypes, ops and roots, in the same order.")
        self.error = CollectiveMismatchError("\n".join(lines))
        self.cond.notify_all()
        raise self.error

    def _complete(self, slot: _Slot) -> None:
        """The last arrival computes every member's result through the reference."""
        calls = [slot.calls[i] for i in range(slot.size)]
        payloads = [c.payload for c in calls]
        results = REFERENCES[calls[0].ref_kind](payloads, **calls[0].params)
        results = _dealias(results, payloads)
        start = max(c.local_start for c in calls)
        infos = [c.size_info for c in calls] if calls[0].size_info is not None else None
        slot.outcomes = [Outcome(r, start, infos) for r in results]

    # ---- point to point -------------------------------------------------------------
    def send(self, rank: int, array, dst: int, tag: int, arrival: float, where: str) -> None:
        with self.cond:
            self._check_alive()
            key = (rank, dst, tag)
            seq = self.sent.get(key, 0)
            self.sent[key] = seq + 1
            self.mail.setdefault(key, {})[seq] = _Message(np.array(array, copy=True),
                                                          arrival, where)
            self.cond.notify_all()

    def recv(self, rank: int, src: int, tag: int, where: str) -> SimHandle:
        with self.cond:
            self._check_alive()
            key = (src, rank, tag)
            seq = self.posted.get(key, 0)
            self.posted[key] = seq + 1
            box = self.mail.setdefault(key, {})

        def ready() -> bool:
            return seq in box

        def take() -> Outcome:
            msg = box.pop(seq)
            return Outcome(msg.array, msg.arrival)

        def describe() -> str:
            return f"recv(src={src}, tag={tag}) at {where}; rank {src} has sent no such message"

        return SimHandle(self, rank, ready, take, describe)


def _dealias(results: list, payloads: list) -> list:
    """Copy any result array that shares memory with an input or another rank's result,
    so that no rank ever holds a view of another rank's memory."""
    inputs = [a for p in payloads for a in _arrays(p)]
    seen: list[np.ndarray] = []

    def fix(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            if any(np.may_share_memory(a, b) for b in inputs + seen):
                a = a.copy()
            seen.append(a)
            return a
        if isinstance(a, list):
            return [fix(x) for x in a]
        return a

    return [fix(r) for r in results]


def _arrays(p: Any) -> list:
    if isinstance(p, np.ndarray):
        return [p]
    if isinstance(p, (list, tuple)):
        return [a for x in p for a in _arrays(x)]
    return []
