"""Export trace events as a Chrome trace: open it in https://ui.perfetto.dev or
chrome://tracing to scroll and zoom through a run, one process per rank, one thread per
stream.

The file follows the Trace Event Format (Google, "Trace Event Format" document), in its
JSON object form:

    {"traceEvents": [...], "displayTimeUnit": "ns"}

Each runtime `Event` becomes one *complete* event

    {"ph": "X", "name": "all_reduce", "cat": "comm", "pid": rank, "tid": stream id,
     "ts": start in µs, "dur": duration in µs, "args": {"bytes": ..., "busbw": ...}}

(the format's timestamps are microseconds; simulated seconds are multiplied by 1e6), and
metadata events ("ph": "M") name every process "rank N (node K)" and every thread after
its stream, so Perfetto shows labelled rows in rank order.

Collectives get one track per process group on each rank: NCCL runs each communicator
on its own stream, so a tensor-parallel all-reduce and a data-parallel reduce-scatter in
flight at once are concurrent, not nested. The world group keeps the "comm" track; every
other group gets a track "comm <name> [ranks]" whose tid is the same in every process.

Several launches (the parts of `minipar tour`, each with its clock from 0) go into one
file with `one_after_another(runs)`: each run's events shifted to start after the one
before, and `sections` that `to_chrome_trace` marks with a global instant event each.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from ..runtime.topology import Topology
from ..runtime.trace import Event

# One fixed thread id per runtime stream, the same in every process and every file.
STREAM_TIDS = {"compute": 0, "comm": 1, "p2p": 2, "recv": 3}
_FIRST_OTHER_TID = 16  # streams the runtime does not know get ids from here, by name
_FIRST_GROUP_TID = 100  # a process group's own "comm" track, from here, by (name, ranks)

US_PER_SECOND = 1e6


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy of `value`: plain numbers, strings, lists and dicts only.
    Non-finite floats (an algbw of inf for a zero-time collective) become None, since
    JSON has no inf or nan and trace viewers reject them."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _args(e: Event) -> dict:
    """What the viewer shows when an event is clicked: sizes, group, algorithm, bandwidth."""
    args: dict[str, Any] = {}
    if e.stream == "compute":
        args["flops"] = e.flops
    else:
        args["bytes"] = e.nbytes
    if e.group is not None:
        args["group"] = list(e.group)
    if e.label:
        args["label"] = e.label
    for key, value in e.meta.items():
        if key == "issued":  # the runtime records seconds; the trace speaks microseconds
            args["issued_us"] = value * US_PER_SECOND
        else:
            args[key] = value
    safe = _jsonable(args)
    return {k: v for k, v in safe.items() if v is not None}


def _track(e: Event) -> tuple:
    """The track an event is drawn on: its stream, and for a collective outside the world
    group, that group (its name and ranks)."""
    if e.stream == "comm" and e.group is not None and e.label != "world":
        return (e.stream, e.label, tuple(e.group))
    return (e.stream,)


def _track_name(track: tuple) -> str:
    return track[0] if len(track) == 1 else f"{track[0]} {track[1]} {list(track[2])}"


def _tids(tracks: Iterable[tuple]) -> dict[tuple, int]:
    tracks = set(tracks)
    other = sorted({t[0] for t in tracks} - set(STREAM_TIDS))
    tids = {(s,): tid for s, tid in STREAM_TIDS.items()}
    tids.update({(s,): _FIRST_OTHER_TID + i for i, s in enumerate(other)})
    groups = sorted(t for t in tracks if len(t) > 1)
    tids.update({t: _FIRST_GROUP_TID + i for i, t in enumerate(groups)})
    return tids


def one_after_another(runs: Sequence[tuple[str, Sequence[Event]]], gap: float = 0.01
                      ) -> tuple[list[Event], list[tuple[str, float]]]:
    """Lay runs that each start their clock at 0 on one time axis: run k's events shifted
    by the end of run k-1 plus `gap` x the longest run (seconds). Returns the shifted
    copies and the sections [(label, start)] for `to_chrome_trace(sections=...)`."""
    longest = max((max((e.end for e in evs), default=0.0) for _, evs in runs), default=0.0)
    space = gap * longest
    events: list[Event] = []
    sections: list[tuple[str, float]] = []
    t0 = 0.0
    for label, evs in runs:
        sections.append((label, t0))
        for e in evs:
            meta = dict(e.meta)
            if "issued" in meta:
                meta["issued"] = meta["issued"] + t0
            events.append(dataclasses.replace(e, start=e.start + t0, end=e.end + t0,
                                              meta=meta))
        t0 += max((e.end for e in evs), default=0.0) + space
    return events, sections


def _unpack(events) -> tuple[list[Event], Optional[Topology], Optional[int]]:
    """Accept a list of events or a LaunchResult (whose contexts know the topology)."""
    contexts = getattr(events, "contexts", None)
    if contexts is not None:
        return ([e for c in contexts for e in c.trace.events], contexts[0].topology,
                len(contexts))
    return list(events), None, None


def to_chrome_trace(events: Union[Iterable[Event], Any], path: Optional[Union[str, os.PathLike]] = None,
                    topology: Optional[Topology] = None,
                    world_size: Optional[int] = None,
                    sections: Sequence[tuple[str, float]] = ()) -> dict:
    """The trace as a Trace Event Format dict; also written to `path` when given.

    events:     runtime Events (e.g. `launch(...).events()`), or the LaunchResult itself
    topology:   names each process "rank N (node K)" (taken from a LaunchResult if omitted)
    world_size: also name ranks that recorded no event
    sections:   (label, start in seconds) of the parts of a run, each drawn as a global
                instant event (a line across every row), e.g. from `one_after_another`
    """
    evs, topo, ws = _unpack(events)
    topology = topology or topo
    world_size = world_size if world_size is not None else ws
    tids = _tids(_track(e) for e in evs)

    ranks = {e.rank for e in evs} | set(range(world_size or 0))
    threads = sorted({(e.rank, _track(e)) for e in evs}, key=lambda rt: (rt[0], tids[rt[1]]))

    trace: list[dict] = []
    for r in sorted(ranks):
        name = f"rank {r}" if topology is None else f"rank {r} (node {topology.node_of(r)})"
        trace.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                      "args": {"name": name}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                      "args": {"sort_index": r}})
    for r, track in threads:
        trace.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tids[track],
                      "args": {"name": _track_name(track)}})
        trace.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tids[track],
                      "args": {"sort_index": tids[track]}})
    for label, start in sections:
        trace.append({"ph": "i", "s": "g", "name": label, "cat": "section", "pid": 0,
                      "tid": 0, "ts": start * US_PER_SECOND})

    for e in evs:
        trace.append({
            "ph": "X",
            "name": e.name,
            "cat": e.stream,
            "pid": e.rank,
            "tid": tids[_track(e)],
            "ts": e.start * US_PER_SECOND,
            "dur": max(0.0, (e.end - e.start) * US_PER_SECOND),
            "args": _args(e),
        })

    out: dict[str, Any] = {"traceEvents": trace, "displayTimeUnit": "ns"}
    other = {"clock": "simulated (minipar); ts and dur in microseconds"}
    if topology is not None:
        other["topology"] = topology.describe()
    out["otherData"] = other
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, allow_nan=False)
    return out
