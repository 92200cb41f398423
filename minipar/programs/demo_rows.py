"""A step's trace as the demo page draws it: one row per rank, the step's numbers, and the
batch's journey through the collectives.

    row    = {rank, pp_stage, dp_replica, tp_index, actions, cells, split, memory, peak}
    cells  = W characters over [0, T]: "c" compute, "m" communication, "o" both, "." idle
             (viz.timeline.cell_states: the terminal timeline's rule, of the row's kernels
             and transfers; the pipeline runner's F/B/I/W spans are drawn as `actions`)
    split  = train_timing.split_step: compute, exposed communication, idle; they sum to T

The numbers (minipar train's definitions):
    step time    T = the last event's end, from the step's start
    compute, communication, idle shares: split_step's, averaged over the rows
    MFU          = model FLOPs / (T · GPUs · peak)
                   model FLOPs = 3·B·s·(l·(8h² + 4hf + 4sh) + 2hV): a layer's four linears
                   and two s² products, the head; forward once, backward twice, no recompute

The journey (the data mode) is the same trace read as a list of steps in time order: each
pipeline action with the ranks that ran it and the collectives and sends inside it (with
no pipeline, the step's forward and backward, told apart by the backward kernels' labels),
then the step's tail (gradient synchronisation, clipping, the loss's broadcast), grouped
by collective.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

from ..runtime.ledger import CATEGORIES
from ..runtime.trace import Event
from ..viz.timeline import cell_states
from .train_timing import is_kernel, split_step

#: cells a row (the page stretches them to its width)
WIDTH = 480
#: memory points a row at most (resampled keeping each bin's highest total)
MEMORY_POINTS = 240
CELL = {"compute": "c", "comm": "m", "overlap": "o", "idle": "."}


def model_flops(B: int, s: int, l: int, h: int, f: int, V: int) -> float:
    """3·B·s·(l·(8h² + 4hf + 4sh) + 2hV): one training step's matmul FLOPs, no recompute."""
    return 3.0 * B * s * (l * (8 * h * h + 4 * h * f + 4 * s * h) + 2 * h * V)


KINDS = ("tp", "dp", "pp", "mp", "world")


def group_kind(e: Event, groups: dict) -> str:
    """Which of this rank's groups the event's ranks are: 'tp', 'dp', 'pp', 'mp' (the
    model-parallel group, tp x pp: the gradient norm's all-reduce) or 'world', the first
    that matches; 'p2p' for a send or receive; 'other' for any other group. `groups`:
    each kind's sorted ranks (ParallelGroups' on a real run, the dry run's Representative)."""
    if e.stream in ("p2p", "recv"):
        return "p2p"
    ranks = tuple(sorted(e.group or ()))
    for k in KINDS:
        if ranks == tuple(groups[k]):
            return k
    return "other"


def resample(times: Sequence[float], totals: Sequence[dict], n: int) -> tuple[list, list]:
    """At most n points of a step function, keeping in each of n time bins the point with
    the highest total (so the peak survives), plus the first and last."""
    if len(times) <= n:
        return list(times), list(totals)
    lo, hi = times[0], times[-1]
    best: dict[int, int] = {}
    for i, t in enumerate(times):
        b = min(n - 3, int((t - lo) / (hi - lo) * (n - 2))) if hi > lo else 0
        if b not in best or sum(totals[i].values()) > sum(totals[best[b]].values()):
            best[b] = i
    keep = sorted({0, len(times) - 1} | set(best.values()))
    return [times[i] for i in keep], [totals[i] for i in keep]


def memory_series(start: dict, history: Sequence[tuple], t0: float, T: float) -> dict:
    """{"t": [...], category: [...]} from the bytes held at t0 and a ledger's history
    (time, category, held after), times from the step's start (a time may repeat: what
    was held and released at one instant), resampled."""
    now = {c: int(start.get(c, 0)) for c in CATEGORIES}
    times, totals = [0.0], [dict(now)]
    for t, c, held in history:
        now[c] = int(held)
        times.append(min(max(t - t0, 0.0), T))  # several at one time: a held-and-freed
        totals.append(dict(now))                # scratch buffer is still a peak
    times.append(T)
    totals.append(dict(now))
    times, totals = resample(times, totals, MEMORY_POINTS)
    out = {"t": times}
    for c in CATEGORIES:
        out[c] = [v[c] for v in totals]
    return out


def is_backward_kernel(e: Event) -> bool:
    """A kernel of the backward, by nn's labels: a linear's dgrad or wgrad, attention's
    d(...) products (lm_head.dgrad, attn d(p@v)/dp, ...)."""
    return e.stream == "compute" and (e.label.endswith(("dgrad", "wgrad"))
                                      or " d(" in e.label)


#: the files of the tensor-parallel layers' collectives (a collective's meta "where")
TP_LAYERS = ("mappings.py", "layers.py", "sequence.py", "vocab.py")


def action_spans(events: Sequence[Event]) -> list[Event]:
    """The pipeline runner's F/B/I/W spans of one rank; with no pipeline (no spans on the
    trace) the step's one forward and one backward: from the first event to the first
    backward kernel (is_backward_kernel), and from there to the end of the last backward
    kernel or tensor-parallel layer's collective (TP_LAYERS: SP's LayerNorm gradients, the
    embedding's), after which the step's tail begins."""
    spans = [e for e in events if e.stream == "compute" and "action" in e.meta]
    back = [e for e in events if is_backward_kernel(e)]
    if spans or not back:
        return spans
    first = min(e.start for e in events)
    b0 = min(e.start for e in back)
    b1 = max([e.end for e in back] + [
        e.end for e in events if e.stream == "comm" and e.start >= b0
        and e.meta.get("where", "").startswith(TP_LAYERS)])
    r = events[0].rank
    return [Event(r, "compute", k, a, b, label=f"0{k}0",
                  meta={"action": f"0{k}0", "stage": 0, "kind": k, "microbatch": 0})
            for k, a, b in (("F", first, b0), ("B", b0, b1))]


def row(rank: int, coord: dict, events: Sequence[Event], t0: float, T: float,
        bandwidth: dict, memory: Optional[dict], peak: Optional[dict]) -> dict:
    """One rank's row (module docstring); events on the run's clock, shifted by t0."""
    evs = list(events)
    actions = [[e.start - t0, e.end - t0, e.meta["kind"] if e.meta["kind"] != "OVERLAP_F_B"
                else "&", int(e.meta["microbatch"]), int(e.meta["stage"])]
               for e in action_spans(evs)]
    drawn = [e for e in evs if is_kernel(e) or e.stream != "compute"]
    cells = "".join(CELL[s] for s in cell_states(sorted(drawn, key=lambda e: e.start),
                                                 t0, t0 + T, WIDTH))
    split = split_step(evs, t0, T, bandwidth, [])
    comm = sum(v for k, v in split.items() if k not in ("compute", "idle"))
    return dict(coord, rank=rank, actions=actions, cells=cells,
                split={"compute": split["compute"], "comm": comm, "idle": split["idle"]},
                memory=memory, peak=peak)


def numbers(rows: Sequence[dict], T: float, flops: float, gpus: int, peak: float) -> dict:
    """The step's numbers (module docstring) from its rows."""
    n = len(rows)
    share = {k: sum(r["split"][k] for r in rows) / (n * T) for k in ("compute", "comm", "idle")}
    top = max(rows, key=lambda r: (r["peak"] or {}).get("total", 0))
    return {"step_time": T, "compute_share": share["compute"], "comm_share": share["comm"],
            "idle_share": share["idle"], "mfu": flops / (T * gpus * peak),
            "model_flops": flops, "peak_memory": (top["peak"] or {}).get("total", 0),
            "peak_rank": top["rank"]}


def journey(events: dict, groups: dict, t0: float) -> list[dict]:
    """The step as steps in time order (module docstring). events: rank -> its Events;
    groups: rank -> {"tp": [...], "dp": [...], "pp": [...]}."""
    actions: dict = {}
    inside: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    tail: dict = {}
    for r, evs in events.items():
        spans = action_spans(evs) if evs else []
        for e in spans:
            key = (e.meta["kind"], int(e.meta["stage"]), int(e.meta["microbatch"]))
            a = actions.setdefault(key, {"start": e.start, "end": e.end, "ranks": []})
            a["start"], a["end"] = min(a["start"], e.start), max(a["end"], e.end)
            a["ranks"].append(r)
        last = max((e.end for e in spans), default=float("-inf"))
        for e in evs:
            if e.stream == "compute" or e.stream == "recv":
                continue
            if e.stream == "p2p":  # the action whose output (or input's gradient) it sends
                made = ("F",) if "SEND_F" in e.meta.get("message", "") else ("B", "I")
                owner = next((s for s in spans if s.meta["kind"] in made
                              and s.meta["stage"] == e.meta.get("stage")
                              and s.meta["microbatch"] == e.meta.get("microbatch")), None)
            else:
                owner = next((s for s in spans if s.start <= e.start < s.end), None)
            kind = group_kind(e, groups[r])
            if owner is not None:
                key = (owner.meta["kind"], int(owner.meta["stage"]),
                       int(owner.meta["microbatch"]))
                c = inside[key][(e.name, kind)]
                if r == min(actions[key]["ranks"]):
                    c[0] += 1
                    c[1] = max(c[1], e.nbytes)
            elif e.start >= last:
                k = (e.name, kind, e.label)
                t = tail.setdefault(k, {"start": e.start, "end": e.end, "ranks": set(),
                                        "count": 0, "bytes": 0, "first": r})
                t["start"], t["end"] = min(t["start"], e.start), max(t["end"], e.end)
                t["ranks"].add(r)
                if r == t["first"]:
                    t["count"] += 1
                    t["bytes"] += e.nbytes
    steps = []
    for (kind, stage, mb), a in actions.items():
        colls = [{"name": n, "group": g, "count": c, "bytes": b}
                 for (n, g), (c, b) in sorted(inside[(kind, stage, mb)].items())]
        steps.append({"kind": kind, "stage": stage, "microbatch": mb,
                      "start": a["start"] - t0, "end": a["end"] - t0,
                      "ranks": sorted(a["ranks"]), "collectives": colls})
    for (name, kind, label), t in tail.items():
        steps.append({"kind": "tail", "stage": None, "microbatch": None, "name": name,
                      "group": kind, "start": t["start"] - t0, "end": t["end"] - t0,
                      "ranks": sorted(t["ranks"]), "count": t["count"], "bytes": t["bytes"]})
    steps.sort(key=lambda s: (s["start"], s["kind"] == "tail", s["stage"] or 0))
    return steps
