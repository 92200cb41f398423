"""The dry run of a whole training step: every kernel, collective and message of the real
program on its simulated clock, with no arithmetic, at any scale.

    tl = timeline(GPTConfig(...), ParallelDims(dp_replicate=128, pp=16, tp=8),
                  global_batch=2048, schedule="interleaved_1f1b", microbatches=16, chunks=2,
                  sequence_parallel=True, topology=CLUSTERS["h100"].topology(2048))
    tl.step_time, tl.ranks[3].events, tl.chrome_trace("step.json")

What runs. `parallel.mesh.parallelize(cfg, dims, schedule=..., zero=0)` and one
`train_step`: each pipeline rank's lowered list (parallel/pp) runs F, B, I and W actions,
each the kernels of stage_ops.py; then the rank waits for its sends, sums a tied wte's two
copies' gradients over the embedding group, all-reduces its DDP buckets over dp (launched
together, serial on the dp stream), and the pp group broadcasts the loss; with clipping,
the squares of the gradients are all-reduced over tp x pp. The clock is the runtime's
(runtime/clock.py, runtime/p2p.py), the costs are runtime/cost.py's on the topology's
links, and the matmuls are charged as nn/matmul.py charges them.

Symmetry. Every rank of one pipeline coordinate runs the same program on the same shapes
(tp ranks split the same layers, dp ranks run other blocks of the same size), so the dry
run runs one rank per pipeline rank, the one at tp = dp = 0, and costs each collective on
that rank's own group. Exact: the events of those ranks. Representative: another rank of
the same coordinate has the same events when its groups cross the same links (a tp group
inside a node, a dp group one rank per node, ...: ParallelDims' order keeps it so on
power-of-two nodes); a group that straddles nodes differently elsewhere would cost more
there. tests/plan/test_timeline.py holds the dry run to the real simulated run of small
layouts, event by event, to the nanosecond, on every rank.

Memory over time: the micro-batches each rank holds after each action (+1 at F, -1 at B
or W; the schedule's peak_in_flight), times a micro-batch's activations on the stage
(`activation_bytes`, the forward's saved tensors, as the planner counts them), on top of
the static bytes; what the saved tensors weigh is representative, when they are held is
exact.

Not modelled (refused, by name): ZeRO / FSDP engines, context and expert parallelism,
mixtures of experts, checkpoint segments; run the real simulation for those.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

from ..nn.config import GPTConfig
from ..parallel.mesh.dims import ParallelDims
from ..parallel.mesh.groups import ParallelGroups
from ..parallel.mesh.pipeline import pipeline_schedule
from ..parallel.pp import (Message, dry_run, lower, pair_overlap, split_layers,
                          validate_schedule)
from ..parallel.pp.actions import F, RECV_B, RECV_F, SEND_B, SEND_F, OverlapFB, parts
from ..parallel.pp.dry_run import DryRun
from ..parallel.tp.gpt import check_tensor_parallel
from ..runtime import cost as cost_model
from ..runtime.topology import Topology
from ..runtime.trace import Event
from .presets import ModelSpec
from .rank_memory import layer_activation_bytes
from .stage_ops import MATMUL, Op, StageShape, stage_ops, stage_units

MIB = 2 ** 20


@dataclass
class RankTimeline:
    """One pipeline rank's step, as its representative global rank runs it."""

    pipeline_rank: int
    rank: int                      # the global rank (tp = dp = 0 of this pipeline rank)
    events: list = field(default_factory=list)   # runtime.trace.Event, by start
    end: float = 0.0               # when its step ends
    in_flight: list = field(default_factory=list)    # (time, micro-batches held) after each action
    activations: list = field(default_factory=list)  # (time, their activation bytes)

    def busy(self, stream: str = "compute", name: Optional[str] = None) -> float:
        return sum(e.duration for e in self.events
                   if e.stream == stream and (name is None or e.name == name))


@dataclass
class Timeline:
    """The dry run of one step: per pipeline rank its events; the step's time."""

    ranks: list
    step_time: float
    schedule: DryRun
    world_size: int

    def events(self) -> list:
        return [e for r in self.ranks for e in r.events]

    def chrome_trace(self, path: Optional[Union[str, os.PathLike]] = None):
        """The events as a Chrome trace (viz.chrome): one process a representative rank."""
        from ..viz.chrome import to_chrome_trace
        return to_chrome_trace(self.events(), path)


class _Costs:
    """Collective and message times on the topology, memoised by (kind, S, ranks)."""

    def __init__(self, topology: Topology, algorithm):
        self.topology, self.algorithm, self.memo = topology, algorithm, {}

    def collective(self, kind: str, S: float, ranks: tuple, me: int, root: int = 0):
        key = (kind, S, ranks, me, root)
        hit = self.memo.get(key)
        if hit is None:
            topo = self.topology
            algo = cost_model.preferred(kind, self.algorithm, ranks, topo)
            c = cost_model.collective_cost(kind, S, ranks, topo, algo)
            nodes = len({topo.node_of(r) for r in ranks})
            sent = cost_model.bytes_sent(kind, c.algorithm, S, len(ranks),
                                         ranks.index(me), root, nodes)
            hit = self.memo[key] = (c, sent)
        return hit


def _refuse(cfg: GPTConfig, dims: ParallelDims, zero) -> None:
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"timeline takes the GPTConfig parallelize would build, got "
                        f"{type(cfg).__name__}")
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"timeline takes a ParallelDims, got {type(dims).__name__}")
    missing = [what for what, on in (
        (f"cp = {dims.cp}", dims.cp > 1), (f"ep = {dims.ep}", dims.ep > 1),
        ("a mixture of experts", cfg.moe is not None),
        ("recompute='segments'", cfg.recompute == "segments"),
        (f"zero = {zero} (DDP, zero = 0, only)", zero not in (0, None)),
        (f"dp_shard = {dims.dp_shard} (DDP's replicas are dp_replicate)", dims.dp_shard > 1))
        if on]
    if missing:
        raise ValueError(f"the dry run models tensor, pipeline and DDP data parallelism of a "
                         f"dense GPT; not {', '.join(missing)}: run the real simulation "
                         f"(parallel.mesh.parallelize) for that layout")


def timeline(cfg: GPTConfig, dims: ParallelDims, *, global_batch: int,
             schedule: Union[str, list, None] = "1f1b", microbatches: Optional[int] = None,
             chunks: Optional[int] = None, layers: Optional[Sequence[int]] = None,
             sequence_parallel: bool = False, zero: Optional[int] = 0,
             max_grad_norm: Optional[float] = None, topology: Optional[Topology] = None,
             algorithm="auto", bucket_cap_mb: float = 25.0) -> Timeline:
    """One train_step of parallelize(cfg, dims, ...) dry-run (the module docstring): the
    same arguments, plus the global batch B (sequences) and the topology it runs on
    (default: nodes of 8 H100s, as many as the world needs)."""
    _refuse(cfg, dims, zero)
    check_tensor_parallel(cfg, dims.tp, sequence_parallel)  # what parallelize refuses
    actions = pipeline_schedule(dims.pp, schedule, microbatches, chunks)
    if actions is None:
        raise ValueError("the dry run times a pipeline schedule: give schedule= and "
                         "microbatches= (at pp = 1 a schedule runs the model as one stage)")
    info = validate_schedule(actions)
    m, S, P = info.microbatches, info.stages, dims.pp
    if global_batch % (m * dims.dp):
        raise ValueError(f"global_batch = {global_batch} sequences do not split into m = {m} "
                         f"micro-batches of dp = {dims.dp} equal blocks: choose a multiple "
                         f"of m x dp = {m * dims.dp}")
    b = global_batch // (m * dims.dp)
    topo = topology or Topology.nodes(-(-dims.world_size // 8), 8)
    if topo.world_size < dims.world_size:
        raise ValueError(f"the topology has {topo.world_size} devices; {dims} needs "
                         f"{dims.world_size}")
    costs = _Costs(topo, algorithm)
    bounds = split_layers(cfg.num_layers, S, layers)
    shapes = [StageShape.of(cfg, dims.tp, sequence_parallel, b, lo, hi, i, S)
              for i, (lo, hi) in enumerate(bounds)]
    reps = [ParallelGroups.at(dims, ParallelGroups.at(dims, 0).rank_of(pp=i))
            for i in range(P)]
    peak = topo.device.peak(cfg.np_dtype)
    kinds = sorted({a.kind.value for row in actions for item in row for a in parts(item)})
    ops = {(k, i): _timed(stage_ops(shapes[i], k), reps[info.placement[i]], costs, peak)
           for k in kinds for i in range(S)}
    durations = {k: [sum(t for _, t, _ in ops[(k, i)]) for i in range(S)] for k in kinds}
    lowered = lower(actions)
    nbytes = shapes[0].message

    def p2p(msg: Message) -> float:
        src, dst = reps[msg.src].rank, reps[msg.dst].rank
        return cost_model.p2p_time(nbytes, topo.link(src, dst))

    dry = dry_run(lowered, durations, p2p)
    act = [activation_bytes(cfg, g) for g in shapes]
    ranks = [_expand(r, reps[r], lowered[r], dry, ops, durations, info, topo, nbytes, act)
             for r in range(P)]
    _tail(ranks, reps, cfg, dims, info, shapes, costs, max_grad_norm, bucket_cap_mb)
    for r in ranks:
        r.events.sort(key=lambda e: (e.start, e.end))
    return Timeline(ranks, max(r.end for r in ranks), dry, dims.world_size)


def activation_bytes(cfg: GPTConfig, g: StageShape) -> float:
    """One micro-batch's activations on a stage: its layers' (plan.rank_memory's per-layer
    formula for this GPT, recompute mode and dtype), not its ends."""
    spec = ModelSpec("GPTConfig", cfg.num_layers, cfg.hidden,
                     cfg.num_heads, cfg.ffn, cfg.vocab_size, cfg.seq_len,
                     tied=cfg.tie_embeddings)
    per_layer = layer_activation_bytes(spec, g.s, g.b, g.tp, g.sequence_parallel,
                                       g.recompute, g.itemsize, dropout=cfg.dropout > 0)
    return (g.hi - g.lo) * per_layer


def _timed(ops: list[Op], rep: ParallelGroups, costs: _Costs, peak: float) -> list:
    """[(op, seconds, sent bytes)] of one action on its representative rank."""
    out = []
    for op in ops:
        if op.name == MATMUL:
            out.append((op, op.flops / peak, 0.0))
        else:
            c, sent = costs.collective(op.name, op.nbytes, rep.tp.ranks, rep.rank)
            out.append((op, c.seconds, sent))
    return out


def _events(rank: int, timed: list, t: float, group: tuple) -> tuple[list, float]:
    """The events of one action's ops from time t, and when they end."""
    out = []
    for op, seconds, sent in timed:
        if op.name == MATMUL:
            out.append(Event(rank, "compute", MATMUL, t, t + seconds, flops=op.flops,
                             label=op.label))
        else:
            out.append(Event(rank, "comm", op.name, t, t + seconds, nbytes=int(op.nbytes),
                             group=group, label=op.label, meta={"sent_bytes": sent}))
        t += seconds
    return out, t


def _expand(r: int, rep: ParallelGroups, row: list, dry: DryRun, ops: dict, durations: dict,
            info, topo: Topology, nbytes: int, act: list) -> RankTimeline:
    """Rank r's spans, each compute action opened into its ops, sends and receives as the
    runtime records them (p2p.py)."""
    tl = RankTimeline(r, rep.rank)
    ev = tl.events
    spans = dry.timeline[r]
    sends = {}  # message -> (start, arrival), filled as the ranks' spans are read
    for q, q_spans in enumerate(dry.timeline):
        for span in q_spans:
            if span.action.kind in (SEND_F, SEND_B):
                sends[(span.action.stage, span.action.kind, span.action.microbatch)] = span
    waited_by_pair = {recv for recv, _ in pair_overlap(row).values() if recv is not None}
    now, held = 0.0, {i: 0 for i in info.stages_of(r)}
    for k, span in enumerate(spans):
        a = span.action
        if a.is_compute:
            halves = [(a.forward, span.start), (a.backward, span.end -
                       durations[a.backward.kind.value][a.backward.stage])] \
                if isinstance(a, OverlapFB) else [(a, span.start)]
            for half, t0 in halves:
                kind = half.kind.value
                body, t1 = _events(rep.rank, ops[(kind, half.stage)], t0, rep.tp.ranks)
                ev.extend(body)
                meta = {"action": str(half), "stage": half.stage, "kind": kind,
                        "microbatch": half.microbatch, "pipeline_rank": r}
                if isinstance(a, OverlapFB):
                    meta["pair"] = str(a)
                ev.append(Event(rep.rank, "compute", kind, t0, t1, label=str(half),
                                meta=meta))
                held[half.stage] += (kind == "F") - (kind in ("B", "W"))
            tl.in_flight.append((span.end, sum(held.values())))
            tl.activations.append((span.end, sum(n * act[i] for i, n in held.items())))
            now = span.end
        elif a.kind in (SEND_F, SEND_B):
            peer = rep.pp.ranks[info.placement[a.stage + (1 if a.kind is SEND_F else -1)]]
            link = topo.link(rep.rank, peer)
            ev.append(Event(rep.rank, "p2p", "send", span.start, span.end, nbytes=nbytes,
                            group=(rep.rank, peer), label=f"to {peer}",
                            meta={"sent_bytes": nbytes, "link": link.name}))
        else:  # a receive: posted when the list reaches it, waited at once (or by a pair)
            src_stage = a.stage - 1 if a.kind is RECV_F else a.stage + 1
            sent = sends[(src_stage, SEND_F if a.kind is RECV_F else SEND_B, a.microbatch)]
            peer = rep.pp.ranks[info.placement[src_stage]]
            posted = now
            ev.append(Event(rep.rank, "recv", "recv", max(posted, sent.start),
                            max(posted, sent.end), nbytes=nbytes, group=(peer, rep.rank),
                            label=f"from {peer}", meta={"link": topo.link(peer, rep.rank).name}))
            if k not in waited_by_pair:
                now = max(now, span.end)
    tl.end = dry.finish[r]
    return tl


def _tail(ranks: list, reps: list, cfg: GPTConfig, dims: ParallelDims, info,
          shapes: list, costs: _Costs, max_grad_norm, bucket_cap_mb: float) -> None:
    """After the lists: the tied wte's all-reduce, DDP's buckets, the loss's broadcast,
    the norm's all-reduce; a collective starts on its group when its last member comes."""
    P, S = len(ranks), info.stages
    now = [r.end for r in ranks]

    def run(kind: str, nbytes: float, members: list, group_of, label: str, root: int = 0):
        start = max(now[q] for q in members)
        for q in members:
            ranks_ = group_of(q)
            c, sent = costs.collective(kind, nbytes, ranks_, reps[q].rank, root)
            ranks[q].events.append(Event(reps[q].rank, "comm", kind, start, start + c.seconds,
                                         nbytes=int(nbytes), group=ranks_, label=label,
                                         meta={"sent_bytes": sent}))
            now[q] = start + c.seconds

    g0, e = shapes[0], shapes[0].itemsize
    first, last = info.placement[0], info.placement[S - 1]
    if cfg.tie_embeddings and first != last:
        pair = tuple(sorted((reps[first].rank, reps[last].rank)))
        run("all_reduce", g0.vocab // g0.tp * g0.h * e, [first, last], lambda q: pair,
            f"embedding/pp")
    if dims.dp > 1:
        for q in range(P):
            t = now[q]
            for numel in _buckets(q, info, shapes, cfg.tie_embeddings, bucket_cap_mb * MIB / e):
                c, sent = costs.collective("all_reduce", numel * e, reps[q].dp.ranks,
                                           reps[q].rank)
                ranks[q].events.append(Event(reps[q].rank, "comm", "all_reduce", t,
                                             t + c.seconds, nbytes=numel * e,
                                             group=reps[q].dp.ranks, label="dp",
                                             meta={"sent_bytes": sent}))
                t += c.seconds
            now[q] = t
    if P > 1:
        src = reps[last].pp.group_rank(reps[last].rank)
        run("broadcast", 8, list(range(P)), lambda q: reps[q].pp.ranks, "pp", root=src)
    if max_grad_norm is not None and reps[0].model_parallel.size > 1:
        run("all_reduce", 8, list(range(P)), lambda q: reps[q].model_parallel.ranks,
            "model_parallel")
    for q in range(P):
        ranks[q].end = now[q]


def _buckets(q: int, info, shapes: list, tied: bool, cap: float) -> list[int]:
    """The numel of each DDP bucket of pipeline rank q (ddp.py's _make_buckets: its
    stages' units reversed, each unit's parameters reversed, closed at cap elements)."""
    mine = info.stages_of(q)
    units = [u for i in mine for u in stage_units(shapes[i], tied)]
    if tied and 0 in mine and info.stages - 1 in mine and info.stages > 1:
        units = [(u, ps[:2] if u == "head" else ps) for u, ps in units]  # wte once, in EMBED
    order = [n for _, ps in reversed(units) for n in reversed(ps)]
    out, total = [], 0
    for i, n in enumerate(order):
        total += n
        if total >= cap or i == len(order) - 1:
            out.append(total)
            total = 0
    return out
