"""The simulated backend: ranks are threads of one process, collectives rendezvous.

At the k-th call of a group, each member deposits its `Call` in the slot (group, k). The
last member to arrive checks that every member called the same thing, computes all the
results with the reference definition (`reference.REFERENCES[kind]`) in group order, and
wakes the others. So results are deterministic, bit for bit, whatever the thread timing.

Sends. The message is always copied into the receiver's mailbox at once (so the data
and the simulated clock never depend on the mode). What the mode decides is when a
blocking `send` may return. `sends="rendezvous"` (the default of `launch`): only once the
receiver has posted the matching recv, as on NCCL and with MPI_Ssend, so a ring in which
every rank sends before it receives deadlocks here as it would on a cluster, and is
diagnosed. `sends="eager"`: at once, like a buffered MPI send. A receive blocks until its
message is there. Under rendezvous a rank's program ends only once every send it started
has been matched; under eager, messages nobody received are reported when the run ends.

Blocking, wake-ups and the diagnosis of deadlocks are in backends/waits.py (`RankWaits`,
which `SimWorld` extends): a blocked rank sleeps until a change satisfies its own wait.
The last rank to arrive at a collective computes the results outside the world's lock, so
the other ranks' sends, receives and arrivals do not queue behind it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..errors import CollectiveMismatchError
from ..reference import REFERENCES
from .base import Call, Outcome
from .waits import RankWaits


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


SENDS = ("rendezvous", "eager")
RENDEZVOUS_HINT = "send blocks until the receiver posts its recv"


class SimHandle:
    """Handle of an operation on the simulated backend; wait() blocks without spinning."""

    def __init__(self, world: "SimWorld", rank: int, ready: Callable[[], bool],
                 take: Callable[[], Outcome], describe: Callable[[], str]):
        self._world, self._rank = world, rank
        self._ready, self._take, self._describe = ready, take, describe
        self._outcome: Optional[Outcome] = None

    def is_completed(self) -> bool:
        with self._world.lock:
            return self._outcome is not None or self._ready()

    def wait(self) -> Outcome:
        if self._outcome is None:
            w = self._world
            with w.lock:
                w.block_until(self._rank, self._ready, self._describe)
                self._outcome = self._take()
        return self._outcome


class SimWorld(RankWaits):
    """Shared state of one simulated run: slots and mailboxes (who waits for what, and
    the lock that guards it all: RankWaits)."""

    name = "sim"

    def __init__(self, world_size: int, sends: str = "rendezvous"):
        if sends not in SENDS:
            raise ValueError(f"sends={sends!r}: expected one of {SENDS}")
        super().__init__(world_size)
        self.sends = sends
        self.unsettled: dict[int, list] = {}  # rank -> its sends (key, seq, dst, tag, where)
        self.slots: dict[tuple, _Slot] = {}
        self.counters: dict[tuple, int] = {}  # (rank, group key) -> next call index
        self.mail: dict[tuple, dict[int, _Message]] = {}  # (src, dst, tag) -> seq -> msg
        self.sent: dict[tuple, int] = {}
        self.posted: dict[tuple, int] = {}

    # ---- collectives -----------------------------------------------------------------
    def collective(self, call: Call) -> SimHandle:
        g = call.group
        me = g.group_rank(call.rank)
        with self.lock:
            self._check_alive()
            ckey = (call.rank, g.key)
            index = self.counters.get(ckey, 0)
            self.counters[ckey] = index + 1
            skey = (g.key, index)
            slot = self.slots.setdefault(skey, _Slot(g.size))
            first = next(iter(slot.calls.values()), None)
            slot.calls[me] = call
            self.progress = time.monotonic()  # an arrival is progress, for the watchdog
            if first is not None and first.signature != call.signature:
                self._mismatch(slot, g, index)
            self.last_call[call.rank] = ("{} on group {} at {}", call.kind, g, call.where)
            last = len(slot.calls) == g.size
            if last:
                self.computing += 1
        if last:  # the results, outside the lock; the members wait for slot.outcomes
            outcomes = None
            try:
                outcomes = _outcomes(slot)
            finally:
                with self.lock:
                    self.computing -= 1
                    if outcomes is not None:
                        slot.outcomes = outcomes
                        self._changed(g.ranks)

        def ready() -> bool:
            return slot.outcomes is not None

        def take() -> Outcome:
            slot.taken += 1
            if slot.taken == g.size:
                self.slots.pop(skey, None)
            return slot.outcomes[me]

        def describe() -> str:
            arrived = sorted(g.ranks[i] for i in slot.calls)
            missing = [g.ranks[i] for i in range(g.size) if i not in slot.calls]
            return (f"{call.kind} on group {g} (call #{index} of that group) at {call.where}; "
                    f"arrived: {rank_list(arrived)}, not yet arrived: {rank_list(missing)}")

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
        self._changed()
        raise self.error

    # ---- point to point -------------------------------------------------------------
    def send(self, rank: int, array, dst: int, tag: int, arrival: float,
             where: str) -> SimHandle:
        """Deliver a copy to dst's mailbox; the handle completes once dst has posted the
        matching recv (rendezvous) or at once (eager)."""
        message = _Message(np.array(array, copy=True), arrival, where)  # outside the lock
        with self.lock:
            self._check_alive()
            key = (rank, dst, tag)
            seq = self.sent.get(key, 0)
            self.sent[key] = seq + 1
            self.mail.setdefault(key, {})[seq] = message
            self.last_call[rank] = ("send(dst={}, tag={}) at {}", dst, tag, where)
            if self.sends == "rendezvous":
                mine = self.unsettled.setdefault(rank, [])
                if len(mine) >= 64:  # forget the sends already matched
                    mine[:] = [m for m in mine if self.posted.get(m[0], 0) <= m[1]]
                mine.append((key, seq, dst, tag, where))
            self._changed((dst,))  # its receiver may wait for this message

        def ready() -> bool:
            return self.sends == "eager" or self.posted.get(key, 0) > seq

        def describe() -> str:
            return (f"send(dst={dst}, tag={tag}) at {where}; {RENDEZVOUS_HINT} "
                    f"(sends='rendezvous'), and rank {dst} has posted no matching recv")

        return SimHandle(self, rank, ready, lambda: Outcome(None, arrival), describe)

    def recv(self, rank: int, src: int, tag: int, where: str) -> SimHandle:
        with self.lock:
            self._check_alive()
            key = (src, rank, tag)
            seq = self.posted.get(key, 0)
            self.posted[key] = seq + 1
            box = self.mail.setdefault(key, {})
            self.last_call[rank] = ("recv(src={}, tag={}) at {}", src, tag, where)
            self._changed((src,))  # its sender may be waiting for this recv to be posted

        def ready() -> bool:
            return seq in box

        def take() -> Outcome:
            msg = box.pop(seq)
            return Outcome(msg.array, msg.arrival)

        def describe() -> str:
            return f"recv(src={src}, tag={tag}) at {where}; rank {src} has sent no such message"

        return SimHandle(self, rank, ready, take, describe)

    def settle_sends(self, rank: int) -> None:
        """At the end of rank's program (rendezvous): wait until every send it started has
        been matched by a posted recv; one never matched ends in a DeadlockError."""
        with self.lock:
            mine = self.unsettled.pop(rank, [])
            if not mine:
                return

            def open_sends() -> list:
                return [m for m in mine if self.posted.get(m[0], 0) <= m[1]]

            def describe() -> str:
                sends = "; ".join(f"send(dst={dst}, tag={tag}) at {where}"
                                  for _, _, dst, tag, where in open_sends())
                return (f"the end of its program, for sends no rank has posted a recv for "
                        f"({sends}): a send completes only once its receiver posts the recv "
                        "(sends='rendezvous'), so a program cannot end with a send nobody "
                        "receives; post the recv on the receiving rank, or drop the send")

            self.block_until(rank, lambda: not open_sends(), describe)

    def unreceived(self) -> list[str]:
        """Messages no rank ever posted a recv for (eager sends), one line each."""
        lines = []
        for (src, dst, tag), box in sorted((k, b) for k, b in self.mail.items() if b):
            for seq, msg in sorted(box.items()):
                if seq >= self.posted.get((src, dst, tag), 0):
                    lines.append(f"rank {src} -> rank {dst}, tag {tag}: message #{seq} sent at "
                                 f"{msg.where} was never received")
        return lines


def rank_list(ranks: list[int], limit: int = 16) -> str:
    """`[0, 1, 5]` as is; a longer list as runs, `[0..1022, 1023]`, so that a diagnosis at
    thousands of ranks stays readable (and small)."""
    if len(ranks) <= limit:
        return str(list(ranks))
    runs, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            a, b = ranks[start], ranks[i - 1]
            runs.append(str(a) if a == b else f"{a}..{b}")
            start = i
    shown = runs if len(runs) <= limit else runs[:limit] + [f"... {len(runs) - limit} more runs"]
    return f"[{', '.join(shown)}] ({len(ranks)} ranks)"


def _outcomes(slot: _Slot) -> list[Outcome]:
    """Every member's result through the reference, in group order (the last arrival
    computes them; no other rank touches a complete slot until its outcomes are set)."""
    calls = [slot.calls[i] for i in range(slot.size)]
    payloads = [c.payload for c in calls]
    results = REFERENCES[calls[0].ref_kind](payloads, **calls[0].params)
    results = _dealias(results, payloads)
    start = max(c.local_start for c in calls)
    infos = [c.size_info for c in calls] if calls[0].size_info is not None else None
    return [Outcome(r, start, infos) for r in results]


def _dealias(results: list, payloads: list) -> list:
    """Copy any result array that shares memory with an input or another rank's result,
    so that no rank ever holds a view of another rank's memory. Arrays are compared only
    with those of the same underlying buffer (their root `.base`), so a group of g ranks
    costs O(g), not O(g^2)."""
    by_root: dict[int, list] = {}  # id of a buffer -> the arrays seen on it

    def root(a: np.ndarray) -> int:
        while isinstance(a.base, np.ndarray):
            a = a.base
        return id(a if a.base is None else a.base)

    for a in (a for p in payloads for a in _arrays(p)):
        by_root.setdefault(root(a), []).append(a)

    def fix(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            same = by_root.get(root(a), ())
            if any(np.may_share_memory(a, b) for b in same):
                a = a.copy()
            by_root.setdefault(root(a), []).append(a)
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
