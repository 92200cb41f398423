"""The trace: every compute and communication event of a rank, on the simulated clock.

An event is an interval [start, end) in simulated seconds on one of a rank's streams:
    "compute"  kernels (FLOPs / peak)
    "comm"     collectives, serialised in issue order, as on one NCCL stream
    "p2p"      point-to-point sends, serialised on the sender
    "recv"     point-to-point receives (several may be in flight at once)
`viz/` turns a list of events into a Chrome trace or a terminal timeline; nothing in the
runtime reads the trace back, so recording is all it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Event:
    """One interval on one stream of one rank."""

    rank: int
    stream: str  # "compute" | "comm" | "p2p" | "recv"
    name: str  # e.g. "all_reduce", "matmul", "send"
    start: float  # simulated seconds
    end: float
    nbytes: int = 0
    flops: float = 0.0
    group: Optional[tuple[int, ...]] = None
    label: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


class Trace:
    """The events of one rank, in the order they were recorded."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.events: list[Event] = []
        self.enabled = True

    def record(self, event: Event) -> Event:
        if self.enabled:
            self.events.append(event)
        return event

    def clear(self) -> None:
        self.events.clear()

    def of(self, stream: Optional[str] = None, name: Optional[str] = None) -> list[Event]:
        """Events filtered by stream and/or name."""
        return [e for e in self.events
                if (stream is None or e.stream == stream) and (name is None or e.name == name)]

    def busy_time(self, stream: str) -> float:
        """Total simulated time the stream was busy (summed; receives may overlap)."""
        return sum(e.duration for e in self.events if e.stream == stream)

    def bytes_sent(self) -> float:
        """Bytes this rank put on the wire, summed over its communication events (a float:
        a ring moves (n-1)/n of a buffer, which need not be a whole number of bytes)."""
        return sum(float(e.meta.get("sent_bytes", 0)) for e in self.events)
