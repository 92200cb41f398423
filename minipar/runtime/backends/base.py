"""The small interface every backend implements, and the records that cross it.

The front end (`runtime/collectives.py`) validates arguments, charges the ledger, and
turns what a backend reports into simulated time and trace events. A backend only moves
data: it matches the ranks of a collective, computes each rank's result, and reports when
the collective could start (the latest of its members' local start times). So the
algorithms above never know which backend runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from ..group import ProcessGroup


@dataclass
class Call:
    """One rank's side of one collective."""

    kind: str  # a key of reference.REFERENCES
    group: ProcessGroup
    rank: int  # global rank of the caller
    payload: Any  # the block this rank contributes (array, list of arrays, or None)
    params: dict  # keyword arguments of the reference function (op, axis, src, ...)
    signature: dict  # what must agree across the group's ranks at this call index
    local_start: float  # when this rank's comm stream can start it (simulated seconds)
    where: str  # the caller's file:line, for diagnoses
    size_info: Optional[list] = None  # per-rank sizes the cost model needs (all_to_all)

    @property
    def ref_kind(self) -> str:
        """The reference definition that computes it: all_to_all_single moves its pieces
        exactly as all_to_all does (the front end cuts and glues the array)."""
        return "all_to_all" if self.kind == "all_to_all_single" else self.kind

    def describe(self) -> str:
        sig = ", ".join(f"{k}={v}" for k, v in self.signature.items() if k != "kind")
        return f"{self.kind}({sig}) on group {self.group} at {self.where}"


@dataclass
class Outcome:
    """What a finished collective (or receive) gives one rank back."""

    result: Any
    start: float  # simulated time the operation started on the group (max of local starts)
    size_infos: Optional[list] = None  # every member's Call.size_info, in group order
    meta: dict = field(default_factory=dict)


class Handle(Protocol):
    def wait(self) -> Outcome: ...

    def is_completed(self) -> bool: ...


class Backend(Protocol):
    """What a backend provides; see SimWorld (threads) and MpiBackend (processes)."""

    name: str

    def collective(self, call: Call) -> Handle:
        """Deposit this rank's side; the handle's wait() returns the rank's Outcome."""

    def send(self, rank: int, array, dst: int, tag: int, arrival: float, where: str) -> Handle:
        """The message (a copy) is delivered to dst, arriving at `arrival`; the handle
        completes once dst has posted the matching recv (sends="rendezvous") or at once
        (sends="eager")."""

    def recv(self, rank: int, src: int, tag: int, where: str) -> Handle:
        """Post a receive; wait() returns Outcome(result=array, start=arrival time)."""
