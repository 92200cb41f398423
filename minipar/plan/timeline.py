"""The dry run of a whole training step: every kernel, collective and message of the real
program on its simulated clock, with no arithmetic, at any scale.

    tl = timeline(as_gpt(MODELS["llama3-405b"]),
                  Layout(dp=128, pp=16, tp=8, schedule="interleaved_1f1b", chunks=2,
                         global_batch=2048, sequence_parallel=True),
                  CLUSTERS["h100"].topology(2048))
    tl.step_time, tl.ranks[3].events, viz.chrome.to_chrome_trace(tl.events())

What runs. The GPT of `model` (a plain GPT ModelSpec: GeLU MLP, multi-head attention,
biases, LayerNorm, learned positions; plan/sized.py makes one of any preset's size) under
`parallel.mesh.parallelize(cfg, ParallelDims(dp_replicate=dp, pp=pp, tp=tp), zero=0,
schedule=..., microbatches=m, chunks=v, sequence_parallel=...)`, and one `train_step` of B
sequences (m = B / (b·dp) micro-batches of b): each pipeline rank's lowered list
(parallel/pp) runs F, B, I and W actions, each the kernels of stage_ops.py; then the rank waits for its sends, sums a tied wte's two
copies' gradients over the embedding group, all-reduces its DDP buckets over dp (launched
together, serial on the dp stream), and the pp group broadcasts the loss; with clipping,
the squares of the gradients are all-reduced over tp x pp. The clock is the runtime's
(runtime/clock.py, runtime/p2p.py), the costs are runtime/cost.py's on the topology's
links, and the kernels are charged by the runtime's compute model (`compute_model`: each
GEMM at its shape's efficiency, memory-bound work by its bytes; peak: matmuls only, at
peak), as nn charges them.

Ranks sit in ParallelDims' default order (tp fastest, then dp, then pp): pipeline rank i's
representative is global rank i·tp·dp, its tp group the tp ranks from there, its dp
group every tp-th rank of its pipeline coordinate.

Symmetry. Every rank of one pipeline coordinate runs the same program on the same shapes
(tp ranks split the same layers, dp ranks run other blocks of the same size), so the dry
run runs one rank per pipeline rank, the one at tp = dp = 0, and costs each collective on
that rank's own group. Exact: the events of those ranks. Representative: another rank of
the same coordinate has the same events when its groups cross the same links (a tp group
inside a node, a dp group one rank per node, ...: ParallelDims' order keeps it so on
power-of-two nodes); a group that straddles nodes differently elsewhere would cost more
there. tests/plan/test_timeline.py holds the dry run to the real simulated run of small
layouts, event by event, to the nanosecond, on every rank.

Memory over time (`RankTimeline.memory()`): the model states, exact (parameters, DDP's
gradient buckets, AdamW's moments and a 16-bit model's float32 masters: the ledger's bytes
to the byte, a test), plus the micro-batches each rank holds after each action (+1 at F,
-1 at B or W; the schedule's peak_in_flight) times a micro-batch's activations on the stage
(the planner's per-layer count, plan.rank_memory): when they are held is exact, what they
weigh is the planner's count; communication buffers are not drawn.

Not modelled (refused, by name): ZeRO / FSDP engines and the distributed optimizer,
context and expert parallelism, mixtures of experts, other architectures than the GPT's
(convert them with plan.sized.as_gpt); run the real simulation for those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..parallel.pp.actions import RECV_F, SEND_B, SEND_F, OverlapFB, parts
from ..parallel.pp.dry_run import DryRun, dry_run
from ..parallel.pp.lowering import Message, lower, pair_overlap
from ..parallel.pp.schedules import schedule
from ..parallel.pp.validate import validate_schedule
from ..runtime import cost as cost_model
from ..runtime.context import resolve_compute_model
from ..runtime.device import dtype_key
from ..runtime.topology import Topology
from ..runtime.trace import Event
from .layout import Layout
from .pipeline_time import stage_layers
from .presets import ModelSpec
from .rank_memory import layer_activation_bytes
from .stage_ops import BYTES, MATMUL, Op, StageShape, stage_ops
from .step_tail import Costs, Representative, model_states, step_tail

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class RankTimeline:
    """One pipeline rank's step, as its representative global rank runs it."""

    pipeline_rank: int
    rank: int                      # the global rank (tp = dp = 0 of this pipeline rank)
    events: list = field(default_factory=list)       # runtime.trace.Event, by start
    end: float = 0.0                                 # when its step ends
    in_flight: list = field(default_factory=list)    # (time, micro-batches held) after each action
    activations: list = field(default_factory=list)  # (time, their activation bytes)
    states: dict = field(default_factory=dict)       # model states by ledger category, bytes

    def memory(self) -> list:
        """(time, bytes) after each action: the model states plus the activations held."""
        static = sum(self.states.values())
        return [(t, static + a) for t, a in self.activations]

    def busy(self, stream: str = "compute", name: Optional[str] = None) -> float:
        """Seconds of `stream` (and of events called `name`) on this rank."""
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
        """Every representative rank's events (viz.chrome.to_chrome_trace draws them)."""
        return [e for r in self.ranks for e in r.events]


def check_modelled(model: ModelSpec, layout: Layout, dtype: str) -> None:
    """Refuse, by name, what the dry run does not model, and a split the GPT cannot take."""
    if not isinstance(model, ModelSpec) or not isinstance(layout, Layout):
        raise TypeError(f"timeline(model, layout, topology) takes a plan.presets.ModelSpec "
                        f"and a plan.layout.Layout, got {type(model).__name__} and "
                        f"{type(layout).__name__}")
    gpt = (not model.swiglu and model.kv == model.heads and model.biases and
           model.layernorm and model.learned_positions and not model.experts)
    missing = [what for what, on in (
        (f"{model.name}'s architecture (a GPT's only: plan.sized.as_gpt makes one of its "
         f"size)", not gpt),
        (f"cp = {layout.cp}", layout.cp > 1), (f"ep = {layout.ep}", layout.ep > 1),
        (f"ZeRO-{layout.zero} (DDP only)", layout.zero > 0),
        ("the distributed optimizer (DDP only)", layout.distributed_optimizer),
        (f"dtype {dtype!r} (one of {sorted(ITEMSIZE)})", dtype not in ITEMSIZE)) if on]
    if missing:
        raise ValueError(f"the dry run models tensor, pipeline and DDP data parallelism of a "
                         f"GPT; not {', '.join(missing)}: run the real simulation "
                         f"(parallel.mesh.parallelize) for that")
    t = layout.tp
    for what, n in (("heads", model.heads), ("ffn", model.ffn), ("vocab", model.vocab)) + \
            ((("seq_len (sequence parallelism)", model.seq_len),)
             if layout.sequence_parallel else ()):
        if n % t:
            raise ValueError(f"{model.name}: {what} = {n} does not divide by tp = {t}: each "
                             f"tensor-parallel rank takes an equal part; choose tp among "
                             f"its divisors")


def timeline(model: ModelSpec, layout: Layout, topology: Topology, *,
             dtype: str = "bfloat16", dropout: float = 0.0,
             max_grad_norm: Optional[float] = None, bucket_cap_mb: float = 25.0,
             algorithm="auto", compute_model=None) -> Timeline:
    """One train_step of `model` under `layout` on `topology`, dry-run (module docstring);
    dtype, dropout: the model's (parallelize's GPTConfig); max_grad_norm: clipping, as
    parallelize's; bucket_cap_mb: DDP's; algorithm and compute_model ("peak", the default,
    "calibrated", or a runtime ComputeModel): the clock's, as launch's."""
    check_modelled(model, layout, dtype)
    if topology.world_size < layout.gpus:
        raise ValueError(f"the topology has {topology.world_size} devices; {layout} needs "
                         f"{layout.gpus}")
    actions = schedule(layout.schedule, layout.pp, layout.microbatches, layout.chunks)
    info = validate_schedule(actions)
    S, P = info.stages, layout.pp
    bounds, lo = [], 0
    for n in stage_layers(model.layers, S):
        bounds.append((lo, lo + n))
        lo += n
    e = ITEMSIZE[dtype]
    shapes = [StageShape.of(model, layout, e, lo, hi, i, S, dropout)
              for i, (lo, hi) in enumerate(bounds)]
    reps = [Representative(layout, i) for i in range(P)]
    clock = resolve_compute_model(compute_model, topology.device)
    costs = Costs(topology, algorithm, clock, topology.device.peak(dtype_key(dtype)))
    kinds = sorted({a.kind.value for row in actions for item in row for a in parts(item)})
    ops = {(k, i): _timed(stage_ops(shapes[i], k), reps[info.placement[i]], costs)
           for k in kinds for i in range(S)}
    durations = {k: [sum(t for _, t, _ in ops[(k, i)]) for i in range(S)] for k in kinds}
    lowered = lower(actions)
    nbytes = shapes[0].message

    def p2p(msg: Message) -> float:
        return cost_model.p2p_time(nbytes, topology.link(reps[msg.src].rank,
                                                         reps[msg.dst].rank))

    dry = dry_run(lowered, durations, p2p)
    act = [(hi - lo) * layer_activation_bytes(model, g.s, g.b, g.tp, g.sequence_parallel,
                                              g.recompute, e, dropout=dropout > 0)
           for g, (lo, hi) in zip(shapes, bounds)]
    ranks = [_expand(r, reps[r], lowered[r], dry, ops, durations, info, topology, nbytes, act)
             for r in range(P)]
    step_tail(ranks, reps, model, info, shapes, costs, max_grad_norm, bucket_cap_mb)
    for r in ranks:
        r.states = model_states(r.pipeline_rank, info, shapes, model.tied)
    for r in ranks:
        r.events.sort(key=lambda ev: (ev.start, ev.end))
    return Timeline(ranks, max(r.end for r in ranks), dry, layout.gpus)


def _timed(ops: list[Op], rep: Representative, costs: Costs) -> list:
    """[(op, seconds, sent bytes)] of one action on its representative rank; memory-bound
    work only where the clock has a bandwidth (the runtime records nothing otherwise)."""
    out = []
    for op in ops:
        if op.kind == MATMUL:
            out.append((op, costs.clock.matmul_seconds(op.flops, op.dims, costs.peak), 0.0))
        elif op.kind == BYTES:
            if costs.clock.memory_bandwidth is not None:
                out.append((op, costs.clock.elementwise_seconds(op.nbytes), 0.0))
        else:
            c, sent = costs.collective(op.name, op.nbytes, rep.tp, rep.rank)
            out.append((op, c.seconds, sent))
    return out


def _events(rank: int, timed: list, t: float, group: tuple) -> tuple[list, float]:
    """The events of one action's ops from time t, and when they end."""
    out = []
    for op, seconds, sent in timed:
        if op.kind == MATMUL:
            out.append(Event(rank, "compute", MATMUL, t, t + seconds, flops=op.flops,
                             label=op.label))
        elif op.kind == BYTES:
            out.append(Event(rank, "compute", op.name, t, t + seconds,
                             meta={"bytes": op.nbytes}))
        else:
            out.append(Event(rank, "comm", op.name, t, t + seconds, nbytes=int(op.nbytes),
                             group=group, label=op.label, meta={"sent_bytes": sent}))
        t += seconds
    return out, t


def _expand(r: int, rep: Representative, row: list, dry: DryRun, ops: dict,
            durations: dict, info, topo: Topology, nbytes: int, act: list) -> RankTimeline:
    """Rank r's spans, each compute action opened into its ops, sends and receives as the
    runtime records them (p2p.py): a receive from max(posted, the send's start) to
    max(posted, its arrival), posted when the list reaches it."""
    tl = RankTimeline(r, rep.rank)
    ev = tl.events
    sends = {(s.action.stage, s.action.kind, s.action.microbatch): s
             for q_spans in dry.timeline for s in q_spans if s.action.kind in (SEND_F, SEND_B)}
    by_pair = {recv for recv, _ in pair_overlap(row).values() if recv is not None}
    now, held = 0.0, {i: 0 for i in info.stages_of(r)}
    for k, span in enumerate(dry.timeline[r]):
        a = span.action
        if a.is_compute:
            halves = [(a.forward, span.start), (a.backward, span.end -
                       durations[a.backward.kind.value][a.backward.stage])] \
                if isinstance(a, OverlapFB) else [(a, span.start)]
            for half, t0 in halves:
                kind = half.kind.value
                body, t1 = _events(rep.rank, ops[(kind, half.stage)], t0, rep.tp)
                ev.extend(body)
                meta = {"action": str(half), "stage": half.stage, "kind": kind,
                        "microbatch": half.microbatch, "pipeline_rank": r}
                if isinstance(a, OverlapFB):
                    meta["pair"] = str(a)
                ev.append(Event(rep.rank, "compute", kind, t0, t1, label=str(half), meta=meta))
                held[half.stage] += (kind == "F") - (kind in ("B", "W"))
            tl.in_flight.append((span.end, sum(held.values())))
            tl.activations.append((span.end, sum(n * act[i] for i, n in held.items())))
            now = span.end
        elif a.kind in (SEND_F, SEND_B):
            peer = rep.pp[info.placement[a.stage + (1 if a.kind is SEND_F else -1)]]
            ev.append(Event(rep.rank, "p2p", "send", span.start, span.end, nbytes=nbytes,
                            group=(rep.rank, peer), label=f"to {peer}",
                            meta={"sent_bytes": nbytes,
                                  "link": topo.link(rep.rank, peer).name, "message": str(a),
                                  "stage": a.stage, "microbatch": a.microbatch}))
        else:
            src = a.stage - 1 if a.kind is RECV_F else a.stage + 1
            sent = sends[(src, SEND_F if a.kind is RECV_F else SEND_B, a.microbatch)]
            peer = rep.pp[info.placement[src]]
            ev.append(Event(rep.rank, "recv", "recv", max(now, sent.start), max(now, sent.end),
                            nbytes=nbytes, group=(peer, rep.rank), label=f"from {peer}",
                            meta={"link": topo.link(peer, rep.rank).name}))
            if k not in by_pair:  # waited at once; a pair's waits inside its span
                now = max(now, span.end)
    tl.end = dry.finish[r]
    return tl
