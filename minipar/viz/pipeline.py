"""A pipeline schedule drawn on its clock: one row of actions per rank, I and W included.

    d = dry_run(lower(schedule("zb_h1", 4, 6)), {"F": 1, "I": 1, "W": 1})
    print(render_pipeline(d))                  # the dry run's clock
    print(render_pipeline(result.events()))    # or a run's trace (the runner's F/B/I/W events)

    rank 0 │FFFF···IWFIWFIWIWIWIW│     F forward, B full backward, I backward for the
           │0123   00411522334455│     input (what the previous stage waits for), W
    rank 1 │·FFF··IFIWFIWFIWIWIWW│     backward for the weights (deferred into the
           │ 012  031042153243545│     bubble), & an overlapped F&B pair, · idle

Time runs left to right in equal columns; a cell shows the action running at its middle,
the row under it that action's micro-batch (mod 10; a pair's: its F's). On a rank holding
several stages (interleaved, the V schedules), the actions of all but its first stage are
in lower case (f, b, i, w), as the zero-bubble papers draw the second chunk in another
colour. By default one column is the shortest
action, so a schedule of equal durations is drawn slot by slot, as the papers draw it.
Sends are on their own stream and not drawn; a rank waiting for a message is idle.

The sources: a DryRun (parallel/pp/dry_run.py; its timeline holds a Span per action), or
trace events whose meta holds "kind" and "microbatch" on the compute stream, as the
pipeline runner records them (a pair's kind is "OVERLAP_F_B").

`dry_run_events(d)` turns a dry run into trace Events (compute actions on "compute", sends
on "p2p"), so the other drawings take it too: `render_timeline(dry_run_events(d), p,
symbols=action_letter)` draws the letters over the runtime's compute / communication /
overlap cells, `to_chrome_trace` opens it in Perfetto, `summarize` measures it.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple, Optional

from ..parallel.pp.actions import OverlapFB
from ..runtime.trace import Event
from .timeline import COLLECTIVE_LETTERS

LETTERS = {"F": "F", "B": "B", "I": "I", "W": "W", "OVERLAP_F_B": "&"}
MEANING = {"F": "forward", "B": "full backward", "I": "backward for the input",
           "W": "backward for the weights", "&": "overlapped F&B pair (digit: its F's)"}
MAX_WIDTH = 240


class Box(NamedTuple):
    """One compute action as drawn: rank, interval, letter, micro-batch, stage."""

    rank: int
    start: float
    end: float
    letter: str
    microbatch: int
    stage: int


def boxes(source) -> list[Box]:
    """The compute actions of a DryRun, a LaunchResult or a list of trace Events."""
    timeline = getattr(source, "timeline", None)
    if timeline is not None and hasattr(source, "makespan"):
        out = []
        for rank, spans in enumerate(timeline):
            for s in spans:
                a = s.action
                if isinstance(a, OverlapFB):
                    out.append(Box(rank, s.start, s.end, "&", a.forward.microbatch,
                                   a.forward.stage))
                elif a.is_compute:
                    out.append(Box(rank, s.start, s.end, LETTERS[a.kind.value], a.microbatch,
                                   a.stage))
        return _cased(out)
    contexts = getattr(source, "contexts", None)
    events = [e for c in contexts for e in c.trace.events] if contexts is not None \
        else list(source)
    out = []
    for e in events:
        if not isinstance(e, Event):
            raise TypeError(f"render_pipeline draws a DryRun, a LaunchResult or trace Events; "
                            f"got {type(e).__name__} in the list")
        kind = e.meta.get("kind")
        if e.stream == "compute" and kind in LETTERS and "microbatch" in e.meta:
            out.append(Box(e.rank, e.start, e.end, LETTERS[kind], int(e.meta["microbatch"]),
                           int(e.meta.get("stage", e.rank))))
    return _cased(out)


def _cased(drawn: list[Box]) -> list[Box]:
    """Lower-case the actions of every stage but a rank's first."""
    first: dict[int, int] = {}
    for b in drawn:
        first[b.rank] = min(first.get(b.rank, b.stage), b.stage)
    return [b._replace(letter=b.letter.lower()) if b.stage != first[b.rank] and b.letter != "&"
            else b for b in drawn]


def dry_run_events(d) -> list[Event]:
    """A DryRun's spans as trace Events: compute actions (meta: action, stage, kind,
    micro-batch, as the runner records them) and sends on the p2p stream."""
    out = []
    for rank, spans in enumerate(d.timeline):
        for s in spans:
            a = s.action
            if isinstance(a, OverlapFB):
                meta = {"action": str(a), "stage": a.forward.stage, "kind": a.kind,
                        "microbatch": a.forward.microbatch}
                out.append(Event(rank, "compute", a.kind, s.start, s.end, label=str(a),
                                 meta=meta))
            elif a.is_compute:
                meta = {"action": str(a), "stage": a.stage, "kind": a.kind.value,
                        "microbatch": a.microbatch}
                out.append(Event(rank, "compute", a.kind.value, s.start, s.end, label=str(a),
                                 meta=meta))
            elif a.kind.value.startswith("SEND"):
                out.append(Event(rank, "p2p", "send", s.start, s.end, label=str(a)))
    return out


def action_letter(e: Event) -> Optional[str]:
    """render_timeline's symbols for a pipeline: F B I W & for actions, S for sends."""
    kind = e.meta.get("kind")
    return LETTERS.get(kind) if kind in LETTERS else COLLECTIVE_LETTERS.get(e.name)


def render_pipeline(source, width: Optional[int] = None, ascii: bool = False,
                    microbatches: bool = True) -> str:
    """Each rank's actions on the clock: a row of letters (F B I W &) and, with
    `microbatches`, a row of micro-batch digits under it. width: columns (default: one
    per shortest action, at most 240)."""
    drawn = boxes(source)
    if not drawn:
        raise ValueError("nothing to draw: no F, B, I, W or overlapped pair in the source "
                         "(the runner's trace events carry meta kind and microbatch)")
    ranks = 1 + max(b.rank for b in drawn)
    if hasattr(source, "makespan"):
        ranks = max(ranks, len(source.timeline))
    lo, hi = min(b.start for b in drawn), max(b.end for b in drawn)
    if width is None:
        shortest = min((b.end - b.start for b in drawn if b.end > b.start), default=hi - lo)
        width = max(1, min(MAX_WIDTH, round((hi - lo) / shortest) if shortest else 1))
    if width < 1:
        raise ValueError(f"width must be at least 1 column, got {width}")
    idle, bar = (".", "|") if ascii else ("·", "│")
    label = len(f"rank {ranks - 1}")
    rows = [sorted((b for b in drawn if b.rank == r), key=lambda b: b.start)
            for r in range(ranks)]
    lines = []
    for r, row in enumerate(rows):
        starts = [b.start for b in row]
        letters, digits = [], []
        for c in range(width):
            t = lo + (hi - lo) * (c + 0.5) / width
            k = bisect.bisect_right(starts, t) - 1
            box = row[k] if k >= 0 and row[k].end > t else None
            letters.append(box.letter if box else idle)
            digits.append(str(box.microbatch % 10) if box else " ")
        lines.append(f"{f'rank {r}':<{label}} {bar}{''.join(letters)}{bar}")
        if microbatches:
            lines.append(f"{'':<{label}} {bar}{''.join(digits)}{bar}")
    used = sorted({b.letter.upper() for b in drawn}, key="FBIW&".index)
    cased = any(b.letter.islower() for b in drawn)
    lines.append(" " * (label + 1) + f"{width} columns over {hi - lo:g} s")
    lines.append("legend: " + "  ".join(f"{ch} {MEANING[ch]}" for ch in used) + f"  {idle} idle"
                 + ("; lower case: a rank's later stage" if cased else ""))
    return "\n".join(lines)
