"""A terminal timeline of a run, one row per rank, and the times behind it.

Time runs left to right, cut into `width` equal columns. Each cell says what its rank was
doing during that slice of simulated time:

    █  compute              (the "compute" stream)
    ▒  communication        (collectives on "comm", sends on "p2p", receives on "recv")
    ▓  both at once         (communication overlapped with compute)
    ·  idle                 (waiting: for a slower rank, a message, or the end of the run)

    rank 0 │██████████··········▒▒▒▒▒▒▒▒▒▒│
    rank 1 │████████████████████▒▒▒▒▒▒▒▒▒▒│
            0 µs                  3.000 ms

Rule for one cell: it is idle when less than half of it is busy; otherwise it shows
whichever of compute-only, communication-only and overlap fills most of it (ties go to
overlap, then communication, so the rarer states stay visible). With `symbols`, cells
show a letter per event instead, e.g. COLLECTIVE_LETTERS: A all_reduce, G all_gather, R
reduce_scatter, B broadcast, T all_to_all, S send, r recv; the letter of a communication
event is drawn over compute where they overlap. `ascii=True` keeps to ASCII characters.

`measure` / `summarize` give the same picture in numbers, per rank: compute time and
communication time (each the length of the *union* of that rank's intervals, since
streams run concurrently), their overlap (the length of the intersection), and idle time
(the window minus the union of everything).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from ..runtime.trace import Event

COMPUTE_STREAMS = frozenset({"compute"})  # every other stream counts as communication

COLLECTIVE_LETTERS: dict[str, str] = {
    "all_reduce": "A", "all_gather": "G", "reduce_scatter": "R", "broadcast": "B",
    "all_to_all": "T", "all_to_all_single": "T", "send": "S", "recv": "r",
    "reduce": "D", "gather": "g", "scatter": "s", "barrier": "W",
}

_UNICODE = {"compute": "█", "comm": "▒", "overlap": "▓", "idle": "·", "border": "│",
            "us": "µs"}
_ASCII = {"compute": "#", "comm": "=", "overlap": "@", "idle": ".", "border": "|",
          "us": "us"}

Interval = tuple[float, float]
Symbols = Union[Mapping[str, str], Callable[[Event], Optional[str]]]


# ---- interval arithmetic ------------------------------------------------------------
def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time as `intervals` (empty ones dropped)."""
    out: list[Interval] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The intersection of two merged interval lists (a merged list)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


class _Coverage:
    """covered(a, b) = time of a merged interval list inside [a, b), in O(log n)."""

    def __init__(self, merged: Sequence[Interval]):
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self.prefix = [0.0]
        for s, e in merged:
            self.prefix.append(self.prefix[-1] + (e - s))

    def _upto(self, t: float) -> float:
        k = bisect.bisect_right(self.starts, t) - 1
        if k < 0:
            return 0.0
        return self.prefix[k] + min(t, self.ends[k]) - self.starts[k]

    def covered(self, a: float, b: float) -> float:
        return self._upto(b) - self._upto(a)


# ---- per-rank measurement -----------------------------------------------------------
@dataclass(frozen=True)
class RankTimes:
    """What one rank did during a window of simulated time (seconds)."""

    rank: int
    window: float  # end - start
    compute: float  # union of compute intervals
    comm: float  # union of communication intervals (comm, p2p, recv streams)
    overlap: float  # time computing and communicating at once
    idle: float  # window - union of everything

    @property
    def busy(self) -> float:
        return self.compute + self.comm - self.overlap

    @property
    def exposed_comm(self) -> float:
        """Communication not hidden behind compute: what overlap would save."""
        return self.comm - self.overlap

    @property
    def comm_share(self) -> float:
        """Fraction of the window during which this rank communicated."""
        return self.comm / self.window if self.window > 0 else 0.0


def _events_of(events) -> list[Event]:
    contexts = getattr(events, "contexts", None)  # a LaunchResult
    if contexts is not None:
        return [e for c in contexts for e in c.trace.events]
    return list(events)


def _window(evs: Sequence[Event], start: Optional[float], end: Optional[float]
            ) -> tuple[float, float]:
    lo = start if start is not None else min((e.start for e in evs), default=0.0)
    hi = end if end is not None else max((e.end for e in evs), default=lo)
    if hi < lo:
        raise ValueError(f"the time window ends ({hi}) before it starts ({lo})")
    return lo, hi


def _by_rank(evs: Sequence[Event], world_size: int) -> list[list[Event]]:
    rows: list[list[Event]] = [[] for _ in range(world_size)]
    for e in evs:
        if not 0 <= e.rank < world_size:
            raise ValueError(f"an event of rank {e.rank} ({e.name} on {e.stream}) is outside "
                             f"world_size={world_size}; pass the run's world size")
        rows[e.rank].append(e)
    return rows


def _split(row: Sequence[Event], lo: float, hi: float
           ) -> tuple[list[Interval], list[Interval], list[Interval]]:
    """(compute, communication, overlap) of one rank, merged and clipped to [lo, hi]."""
    comp = clip(merge((e.start, e.end) for e in row if e.stream in COMPUTE_STREAMS), lo, hi)
    comm = clip(merge((e.start, e.end) for e in row if e.stream not in COMPUTE_STREAMS), lo, hi)
    return comp, comm, intersect(comp, comm)


def measure(events, world_size: int, start: Optional[float] = None,
            end: Optional[float] = None) -> list[RankTimes]:
    """Per-rank compute, communication, overlap and idle time in [start, end].

    The window defaults to [earliest event start, latest event end] over all ranks, so a
    rank that finishes early is idle until the slowest one ends, as in a training step.
    """
    evs = _events_of(events)
    lo, hi = _window(evs, start, end)
    out = []
    for r, row in enumerate(_by_rank(evs, world_size)):
        comp, comm, both = _split(row, lo, hi)
        c, m, o = length(comp), length(comm), length(both)
        out.append(RankTimes(r, hi - lo, c, m, o, max(0.0, (hi - lo) - (c + m - o))))
    return out


# ---- formatting ---------------------------------------------------------------------
def _unit(t: float, glyphs: Mapping[str, str]) -> tuple[str, float]:
    t = abs(t)
    if t < 1e-3:
        return glyphs["us"], 1e6
    if t < 1.0:
        return "ms", 1e3
    return "s", 1.0


def _fmt(t: float, unit: tuple[str, float]) -> str:
    return f"{t * unit[1]:.3f} {unit[0]}"


def summarize(events, world_size: int, start: Optional[float] = None,
              end: Optional[float] = None, ascii: bool = False) -> str:
    """A table of `measure`: compute, comm, overlap, exposed comm, idle and comm share."""
    glyphs = _ASCII if ascii else _UNICODE
    rows = measure(events, world_size, start, end)
    lo, hi = _window(_events_of(events), start, end)
    unit = _unit(hi - lo if hi > lo else max(abs(lo), abs(hi)), glyphs)
    head = ["rank", "compute", "comm", "overlap", "exposed", "idle", "comm share"]
    table = [[str(t.rank), _fmt(t.compute, unit), _fmt(t.comm, unit), _fmt(t.overlap, unit),
              _fmt(t.exposed_comm, unit), _fmt(t.idle, unit), f"{100 * t.comm_share:.1f} %"]
             for t in rows]
    widths = [max(len(r[i]) for r in [head] + table) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head] + table]
    lines.append(f"window {_fmt(lo, unit)} .. {_fmt(hi, unit)} ({_fmt(hi - lo, unit)})")
    lines.append("comm: union of the comm/p2p/recv streams; overlap: computing and "
                 "communicating at once;")
    lines.append("exposed = comm - overlap; idle = window - busy; comm share = comm / window")
    return "\n".join(lines)


def _symbol_fn(symbols: Optional[Symbols]) -> Optional[Callable[[Event], Optional[str]]]:
    if symbols is None:
        return None
    if callable(symbols) and not isinstance(symbols, Mapping):
        return symbols
    table = dict(symbols)
    return lambda e: table.get(e.name)


def _dominant(row: Sequence[Event], starts: Sequence[float], longest: float,
              a: float, b: float, want_compute: bool) -> Optional[Event]:
    """The event of the wanted kind that covers most of [a, b)."""
    best, best_t = None, 0.0
    k = bisect.bisect_left(starts, b) - 1
    while k >= 0 and starts[k] >= a - longest:
        e = row[k]
        if (e.stream in COMPUTE_STREAMS) == want_compute:
            t = min(e.end, b) - max(e.start, a)
            if t > best_t:
                best, best_t = e, t
        k -= 1
    return best


def cell_states(row: Sequence[Event], lo: float, hi: float, width: int) -> list[str]:
    """One rank's `width` cells over [lo, hi]: "compute", "comm", "overlap" or "idle" each,
    by the rule of the module docstring (render_timeline draws them; minipar demo too)."""
    comp, comm, both = (_Coverage(x) for x in _split(row, lo, hi))
    out = []
    for i in range(width):
        a, b = lo + (hi - lo) * i / width, lo + (hi - lo) * (i + 1) / width
        out.append(_state(comp.covered(a, b), comm.covered(a, b), both.covered(a, b), b - a))
    return out


def render_timeline(events, world_size: int, width: int = 72, start: Optional[float] = None,
                    end: Optional[float] = None, symbols: Optional[Symbols] = None,
                    ascii: bool = False) -> str:
    """One row per rank, `width` columns over [start, end] (default: the whole run).

    symbols: a mapping from event name to one character (e.g. COLLECTIVE_LETTERS), or a
             function Event -> character or None; events without a symbol keep the block
             characters
    ascii:   draw with '#', '=', '@', '.' and '|' instead of block characters
    """
    if width < 1:
        raise ValueError(f"width must be at least 1 column, got {width}")
    glyphs = _ASCII if ascii else _UNICODE
    symbol_of = _symbol_fn(symbols)
    evs = _events_of(events)
    lo, hi = _window(evs, start, end)
    dt = (hi - lo) / width
    label_w = len(f"rank {world_size - 1}")
    used_symbols: dict[str, str] = {}

    lines = []
    for r, row in enumerate(_by_rank(evs, world_size)):
        row = sorted(row, key=lambda e: e.start)
        starts = [e.start for e in row]
        longest = max((e.end - e.start for e in row), default=0.0)
        cells = []
        for i, state in enumerate(cell_states(row, lo, hi, width)):
            a, b = lo + (hi - lo) * i / width, lo + (hi - lo) * (i + 1) / width
            ch = glyphs[state]
            if symbol_of is not None and state != "idle":
                e = _dominant(row, starts, longest, a, b, want_compute=(state == "compute"))
                sym = symbol_of(e) if e is not None else None
                if sym:
                    ch = sym[0]
                    used_symbols.setdefault(ch, e.name)
            cells.append(ch)
        lines.append(f"{f'rank {r}':<{label_w}} {glyphs['border']}{''.join(cells)}"
                     f"{glyphs['border']}")

    unit = _unit(max(abs(lo), abs(hi)), glyphs)
    left, right = _fmt(lo, unit), _fmt(hi, unit)
    gap = max(1, width + 2 - len(left) - len(right))
    lines.append(" " * (label_w + 1) + left + " " * gap + right)
    col_unit = _unit(dt, glyphs)
    lines.append(" " * (label_w + 1) + f"1 column = {_fmt(dt, col_unit)}")
    legend = [f"{glyphs['compute']} compute", f"{glyphs['comm']} communication",
              f"{glyphs['overlap']} both (overlap)", f"{glyphs['idle']} idle"]
    legend += [f"{ch} {name}" for ch, name in sorted(used_symbols.items(),
                                                      key=lambda kv: kv[1])]
    lines.append("legend: " + "  ".join(legend))
    return "\n".join(lines)


def _state(c: float, m: float, o: float, dt: float) -> str:
    """idle / compute / comm / overlap for a cell of length dt (see the module docstring)."""
    busy = c + m - o
    if dt <= 0 or 2 * busy < dt:
        return "idle"
    shares = [(o, "overlap"), (m - o, "comm"), (c - o, "compute")]  # tie order
    return max(shares, key=lambda s: s[0])[1]
