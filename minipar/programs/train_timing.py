"""Where a step's simulated time went on each rank: compute, exposed communication per link
class, idle.

    T = the step's makespan (the slowest rank's step)
    on rank r, over its window [t0, t0 + T]:
      compute          the union of its compute events
      exposed <link>   its compute stream idle while a collective, send or receive of its
                       own is on the wire over <link> (NVLink4, IB-NDR400, or both for a
                       hierarchical collective); when several are in flight at once, the
                       time goes to the slowest link class among them
      idle             the rest: nothing to compute and nothing of its own on the wire: a
                       pipeline's bubble, a wait for a peer stage or for the last rank of a
                       collective to arrive, the end of a step that is shorter than T
    compute + sum of exposed + idle = T

Communication that runs while the rank computes (DDP's buckets under the backward, a send
while the next micro-batch runs) is hidden and counts as compute: only what the compute
stream waits for costs time. Read from the trace of the step (runtime/trace.py); `StepClock`
keeps one step's events on each rank, so a long run's trace stays one step long.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..runtime.trace import Event

COMM_STREAMS = ("comm", "p2p", "recv")


class StepClock:
    """One rank's per-step accounting: the simulated seconds and matmul FLOPs of each step,
    and the events of the last step (the trace is cleared when each step starts)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.times: list[float] = []
        self.flops = 0.0
        self.events: list[Event] = []
        self.t0 = 0.0

    def start(self) -> None:
        self.ctx.trace.clear()
        self.t0 = self.ctx.clock.now

    def stop(self) -> None:
        self.times.append(self.ctx.clock.now - self.t0)
        self.events = list(self.ctx.trace.events)
        self.flops += sum(e.flops for e in self.events if is_kernel(e))

    def last(self) -> tuple[float, list[Event]]:
        """(the last step's start on this rank's clock, its events)."""
        return self.t0, self.events


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals [a, b), as sorted disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def is_kernel(e: Event) -> bool:
    """A compute event that is work itself, not a pipeline action's span (the runner records
    each F, B, I, W around its kernels and its tensor-parallel collectives, meta 'action')."""
    return e.stream == "compute" and "action" not in e.meta


def link_speed(name: str, bandwidth: dict[str, float]) -> float:
    """A link class's bandwidth; a hierarchical collective's 'NVLink4+IB-NDR400' runs at its
    slowest part's."""
    return min(bandwidth.get(part, 0.0) for part in name.split("+"))


def split_step(events: list[Event], t0: float, T: float, bandwidth: dict[str, float],
               links: Optional[list[str]] = None) -> dict[str, float]:
    """{"compute": s, <link class>: s exposed, ..., "idle": s} over [t0, t0 + T] (module
    docstring); `bandwidth`: {link name: bytes/s} orders the link classes, slowest wins;
    `links`: classes to report even at 0 (the topology's)."""
    end = t0 + T
    clip = [(max(e.start, t0), min(e.end, end), e) for e in events]
    compute = _merge((a, b) for a, b, e in clip if is_kernel(e))
    wire = [(a, b, e.meta.get("link", "?")) for a, b, e in clip
            if e.stream in COMM_STREAMS and b > a]
    out = {"compute": sum(b - a for a, b in compute)}
    for name in links or []:
        out[name] = 0.0
    # one sweep over every boundary: between two consecutive ones, the compute stream is
    # busy or not and the same transfers are on the wire (O(n log n), a long trace's step)
    points = sorted({t0, end} | {x for a, b in compute for x in (a, b)}
                    | {x for a, b, _ in wire for x in (a, b) if t0 < x < end})
    starts = sorted((a, i) for i, (a, _, _) in enumerate(wire))
    ends = sorted((b, i) for i, (_, b, _) in enumerate(wire))
    active: dict[str, int] = {}
    si = ei = ci = 0
    idle = 0.0
    for a, b in zip(points, points[1:]):
        while si < len(starts) and starts[si][0] <= a:
            name = wire[starts[si][1]][2]
            active[name] = active.get(name, 0) + 1
            si += 1
        while ei < len(ends) and ends[ei][0] <= a:
            name = wire[ends[ei][1]][2]
            active[name] -= 1
            if not active[name]:
                del active[name]
            ei += 1
        while ci < len(compute) and compute[ci][1] <= a:
            ci += 1
        if ci < len(compute) and compute[ci][0] <= a:
            continue  # computing: counted in the union above
        if active:
            slowest = min(active, key=lambda n: (link_speed(n, bandwidth), n))
            out[slowest] = out.get(slowest, 0.0) + (b - a)
        else:
            idle += b - a
    out["idle"] = idle
    return out
