"""The end of a dry-run step (timeline.py), after the pipeline's lists: what each rank
does once its sends are done, with ranks where ParallelDims puts them.

    pipeline rank i's representative   R_i = i·t·dp            (tp fastest, then dp, pp)
    its tp group                       R_i, ..., R_i + t - 1
    its dp group                       R_i + t·j, j < dp
    the pp group                       R_0, R_1, ..., R_{pp-1}
    the model-parallel group (tp x pp) R_q + k, q < pp, k < t

In the order PipelineRunner.step, Parallelized.train_step and the DDP engine run them:

    embedding   tied wte, first and last stages on two ranks: AR(V/t·h·e) over the two
    dp          DDP's buckets (ddp.py: the rank's units reversed, each unit's parameters
                reversed, a bucket closed once it holds bucket_cap_mb MiB), launched
                together, one after another on the dp stream: AR(bucket) each
    loss        the last stage's loss broadcast over pp (8 bytes)
    norm        with clipping, the squares summed over tp x pp: AR(8 bytes)
    adamw       under a compute model with a bandwidth, the step's bytes over HBM:
                g + (2w + 4s + g) + (w + half) + g an element (optim/adam.py's
                adam_step_bytes: w, s the float32 master and moments of a bf16 model, g
                and half its 16-bit gradient and weight; float32 and float64 models step
                their own weights, no half)

A collective starts on its group when its last member comes: the embedding's and the pp
group's wait for the slowest pipeline rank among them; tp and dp groups are symmetric.
"""

from __future__ import annotations

from typing import Optional

from ..runtime import cost as cost_model
from ..runtime.topology import Topology
from ..runtime.trace import Event
from .comm_time import groups_of
from .stage_ops import stage_units

MIB = 2 ** 20


class Representative:
    """Pipeline rank i's rank at tp = dp = 0 and its groups (global ranks, sorted), in the
    rank order the planner's communication model uses (comm_time.groups_of)."""

    def __init__(self, layout, i: int):
        g = groups_of(layout)
        self.rank = g.pipeline_rank(i)
        self.tp = tuple(self.rank + r for r in g.tp)
        self.dp = tuple(self.rank + r for r in g.dp_cp)  # cp = 1 here
        self.pp = tuple(g.pipeline_rank(q) for q in range(layout.pp))
        self.model_parallel = tuple(sorted(q + r for q in self.pp for r in g.tp))


class Costs:
    """The clock's prices: collectives on the topology (and the bytes a rank sends,
    memoised), kernels by the compute model at the dtype's peak."""

    def __init__(self, topology: Topology, algorithm, clock, peak: float):
        self.topology, self.algorithm, self.memo = topology, algorithm, {}
        self.clock, self.peak = clock, peak

    def collective(self, kind: str, S: float, ranks: tuple, me: int, root: int = 0):
        """(runtime.cost.Cost, bytes `me` sends) of `kind` of S bytes over `ranks`."""
        key = (kind, S, ranks, me, root)
        hit = self.memo.get(key)
        if hit is None:
            topo = self.topology
            algo = cost_model.preferred(kind, self.algorithm, ranks, topo)
            c = cost_model.collective_cost(kind, S, ranks, topo, algo)
            nodes = len({topo.node_of(r) for r in ranks})
            sent = cost_model.bytes_sent(kind, c.algorithm, S, len(ranks), ranks.index(me),
                                         root, nodes)
            hit = self.memo[key] = (c, sent)
        return hit


def step_tail(ranks: list, reps: list, model, info, shapes: list, costs: Costs,
              max_grad_norm: Optional[float], bucket_cap_mb: float) -> None:
    """Append each rank's tail events (module docstring) and set its end."""
    P, S = len(ranks), info.stages
    now = [r.end for r in ranks]

    def together(kind: str, nbytes: float, members: list, group_of, label: str,
                 root: int = 0) -> None:
        start = max(now[q] for q in members)
        for q in members:
            c, sent = costs.collective(kind, nbytes, group_of(q), reps[q].rank, root)
            ranks[q].events.append(Event(reps[q].rank, "comm", kind, start, start + c.seconds,
                                         nbytes=int(nbytes), group=group_of(q), label=label,
                                         meta={"sent_bytes": sent}))
            now[q] = start + c.seconds

    g, e = shapes[0], shapes[0].itemsize
    first, last = info.placement[0], info.placement[S - 1]
    if model.tied and first != last:
        pair = tuple(sorted((reps[first].rank, reps[last].rank)))
        together("all_reduce", g.vocab // g.tp * g.h * e, [first, last], lambda q: pair,
                 "embedding/pp")
    for q in range(P):
        if len(reps[q].dp) == 1:
            break
        t = now[q]
        for numel in buckets(q, info, shapes, model.tied, bucket_cap_mb * MIB / e):
            c, sent = costs.collective("all_reduce", numel * e, reps[q].dp, reps[q].rank)
            ranks[q].events.append(Event(reps[q].rank, "comm", "all_reduce", t, t + c.seconds,
                                         nbytes=numel * e, group=reps[q].dp, label="dp",
                                         meta={"sent_bytes": sent}))
            t += c.seconds
        now[q] = t
    if P > 1:
        root = reps[last].pp.index(reps[last].rank)
        together("broadcast", 8, list(range(P)), lambda q: reps[q].pp, "pp", root)
    if max_grad_norm is not None and len(reps[0].model_parallel) > 1:
        together("all_reduce", 8, list(range(P)), lambda q: reps[q].model_parallel,
                 "model_parallel")
    if costs.clock.memory_bandwidth is not None:  # AdamW's bytes (optim/adam.py)
        w = 4 if e == 2 else e  # the weight it steps: a 16-bit one's float32 master
        per = e + (2 * w + 4 * w + e) + (w + e if e == 2 else 0) + e
        for q in range(P):
            nbytes = sum(buckets(q, info, shapes, model.tied, float("inf"))) * per
            t = costs.clock.elementwise_seconds(nbytes)
            ranks[q].events.append(Event(reps[q].rank, "compute", "adamw", now[q],
                                         now[q] + t, meta={"bytes": nbytes}))
            now[q] += t
    for q in range(P):
        ranks[q].end = now[q]


def model_states(q: int, info, shapes: list, tied: bool) -> dict:
    """Pipeline rank q's parameters, gradients (DDP's buckets, in the model's dtype) and
    optimizer states (AdamW's m and v in float32, float64 for a float64 model, and a 16-bit
    model's float32 master), bytes: what the ledger holds between steps."""
    numel = sum(buckets(q, info, shapes, tied, float("inf")))
    e = shapes[0].itemsize
    states = 2 * 8 if e == 8 else 2 * 4 + (4 if e == 2 else 0)
    return {"parameters": numel * e, "gradients": numel * e, "optimizer_states": numel * states}


def buckets(q: int, info, shapes: list, tied: bool, cap: float) -> list[int]:
    """The elements of each DDP bucket of pipeline rank q: its stages' units reversed, each
    unit's parameters reversed, a bucket closed at `cap` elements (ddp.py)."""
    mine = info.stages_of(q)
    units = [u for i in mine for u in stage_units(shapes[i], tied)]
    if tied and holds_both_ends(info, mine):
        units = [(u, ps[:2] if u == "head" else ps) for u, ps in units]  # wte once: EMBED's
    order = [n for _, ps in reversed(units) for n in reversed(ps)]
    out, total = [], 0
    for i, n in enumerate(order):
        total += n
        if total >= cap or i == len(order) - 1:
            out.append(total)
            total = 0
    return out


def holds_both_ends(info, mine) -> bool:
    """Whether one rank holds the first and the last of several stages (a V)."""
    return info.stages > 1 and 0 in mine and info.stages - 1 in mine
