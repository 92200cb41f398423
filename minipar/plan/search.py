"""The layouts of N GPUs that fit a model, ranked by predicted step time, with the reasons.

    plans = search(MODELS["llama3-70b"], gpus=256, cluster=CLUSTERS["h100"],
                   global_batch=512)
    plans[0].layout, plans[0].time.seconds, plans[0].reasons

Memory first (the seed's first rule): every candidate's busiest rank is counted
(rank_memory.py) and a layout that does not fit the device is dropped before its time is
predicted (step_time.py). The candidates, for N GPUs of g per node:

    tp      a power of two dividing the heads, at most 2g (one step past the node, to show
            what crossing it costs)
    pp      a divisor of the layers (and of N / tp)
    cp      1, or a power of two up to 8 when the sequence is 16k tokens or longer
    dp      N / (tp · pp · cp), dividing the global batch
    ep      a mixture of experts: a power of two dividing the experts and dp x cp
    the schedule  1F1B, and interleaved 1F1B with 2 or 3 chunks where the layers split
    memory  SP whenever tp > 1; Megatron's distributed optimizer (ZeRO-1) over dp, or ZeRO-3
            without a pipeline; recompute none, selective or full

Each plan carries the findings of the tuning checklist that apply to it, in its terms and
with the fix: a tp group that crosses a node, a pipeline whose stages are not a factor or a
multiple of the nodes, a bubble over 10 % of the step, exposed communication over 30 % of
the compute, pipeline parallelism on a model of 7B or less, a mixture of experts without
expert parallelism, and a peak within 10 % of the device's memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from .layout import Layout
from .presets import ClusterSpec, ModelSpec
from .rank_memory import RankMemory, rank_memory
from .step_time import StepTime, step_time

SMALL_MODEL = 7e9  # the checklist's "≤ 7B" (Llama 2 7B's 6.74B): DDP + ZeRO-2, no pipeline


@dataclass(frozen=True)
class Plan:
    """One candidate: its layout, the busiest rank's memory, the step's time, the findings."""

    layout: Layout
    memory: RankMemory
    time: StepTime
    reasons: tuple = field(default_factory=tuple)

    def row(self) -> dict:
        """The plan as plain data (what `minipar plan --json` prints)."""
        t, lay = self.time, self.layout
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp,
                "schedule": lay.schedule if lay.pp > 1 else None, "chunks": lay.chunks,
                "microbatches": lay.microbatches, "sequence_parallel": lay.sequence_parallel,
                "zero": lay.zero, "distributed_optimizer": lay.distributed_optimizer,
                "recompute": lay.recompute, "step_seconds": t.seconds, "mfu": t.mfu,
                "hfu": t.hfu, "bubble_fraction": t.bubble_fraction,
                "exposed_communication_seconds": t.exposed_communication,
                "peak_bytes": self.memory.peak, "reasons": list(self.reasons)}


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def candidates(model: ModelSpec, gpus: int, cluster: ClusterSpec, global_batch: int,
               micro_batch: int = 1) -> Iterator[Layout]:
    """Every layout of the module docstring's space that divides evenly."""
    g = cluster.gpus_per_node
    cps = [1] + ([2, 4, 8] if model.seq_len >= 16384 else [])
    for tp in _powers_of_two(2 * g):
        if model.heads % tp or gpus % tp:
            continue
        for cp in cps:
            for pp in range(1, model.layers + 1):
                if model.layers % pp or gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                if global_batch % (micro_batch * dp):
                    continue
                m = global_batch // (micro_batch * dp)
                schedules = [("1f1b", 1)]
                if pp > 1:
                    schedules += [("interleaved_1f1b", v) for v in (2, 3)
                                  if model.layers % (pp * v) == 0 and m % pp == 0]
                zeros = [(1, True)] if pp > 1 else [(1, True), (3, False)]
                eps = [e for e in _powers_of_two(model.experts or 1)
                       if (model.experts or 1) % e == 0 and (dp * cp) % e == 0]
                for (name, v), (zero, dist), recompute, ep in itertools.product(
                        schedules, zeros, ("none", "selective", "full"), eps):
                    yield Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, schedule=name, chunks=v,
                                 micro_batch=micro_batch, global_batch=global_batch,
                                 sequence_parallel=tp > 1, recompute=recompute,
                                 zero=0 if dist else zero, distributed_optimizer=dist)


def reasons(model: ModelSpec, lay: Layout, cluster: ClusterSpec, memory: RankMemory,
            time: StepTime) -> tuple[str, ...]:
    """The tuning checklist's findings for this plan, each with its fix."""
    g, nodes = cluster.gpus_per_node, -(-lay.gpus // cluster.gpus_per_node)
    out = []
    if lay.tp > g:
        out.append(f"tp {lay.tp} crosses a node of {g} GPUs: every layer's tensor-parallel "
                   f"collectives go over {cluster.inter.name}; keep tp <= {g}")
    if lay.pp > 1 and nodes > 1 and nodes % lay.pp and lay.pp % nodes:
        out.append(f"pp {lay.pp} is neither a factor nor a multiple of the {nodes} nodes: "
                   f"stages straddle nodes unevenly; choose pp dividing {nodes}")
    bubble = time.terms["pipeline"] / time.seconds if time.seconds else 0.0
    if bubble > 0.10:
        out.append(f"bubble {bubble:.0%} of the step ({lay.microbatches} micro-batches on "
                   f"pp {lay.pp}): raise m (a larger global batch or smaller micro-batch) "
                   f"or use more chunks")
    if time.compute and time.exposed_communication > 0.30 * time.compute:
        out.append(f"communication {time.exposed_communication / time.compute:.0%} of "
                   f"compute exposed: lower tp or pp, or overlap more")
    if model.experts and lay.ep == 1 and lay.dp * lay.cp > 1:
        out.append(f"every rank holds all {model.experts} experts (ep 1): spread them over "
                   f"ep ranks of dp x cp to cut their memory by ep")
    params = model.parameters()
    if lay.pp > 1 and params <= SMALL_MODEL:
        out.append(f"a {params / 1e9:.1f}B model needs no pipeline: DDP with ZeRO-2 (pp 1) "
                   f"avoids the bubble")
    if memory.capacity and memory.peak > 0.9 * memory.capacity:
        out.append(f"peak {memory.peak / 2**30:.1f} GiB is within 10 % of the "
                   f"{memory.capacity / 2**30:.0f} GiB device: little room for fragmentation")
    return tuple(out)


def search(model: ModelSpec, gpus: int, cluster: ClusterSpec, global_batch: int,
           micro_batch: int = 1, top: Optional[int] = 10,
           progress: Optional[Callable[[int, int], None]] = None) -> list[Plan]:
    """The layouts that fit, fastest first (ties: less memory first); `top` None: all.
    progress(done, total) is called before each candidate and once at the end (a display
    for a slow search)."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"search plans a presets.ModelSpec, got {type(model).__name__}")
    for name, v in (("gpus", gpus), ("global_batch", global_batch),
                    ("micro_batch", micro_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"search: {name} must be a positive int, got {v!r}")
    todo = list(candidates(model, gpus, cluster, global_batch, micro_batch))
    if not todo:
        raise ValueError(f"no layout of {gpus} GPUs splits {model.name} with a global batch "
                         f"of {global_batch} (b = {micro_batch}): the heads ({model.heads}) "
                         f"and layers ({model.layers}) must divide by tp and pp, and the "
                         f"batch by b x dp; try a batch that is a multiple of {gpus}")
    plans = []
    for i, lay in enumerate(todo):
        if progress is not None:
            progress(i, len(todo))
        try:
            mem = rank_memory(model, lay, cluster, dropout=False)
        except ValueError:  # a split the model refuses (uneven layers per chunk, ...)
            continue
        if not mem.fits:
            continue
        t = step_time(model, lay, cluster, dropout=False)
        plans.append(Plan(lay, mem, t, reasons(model, lay, cluster, mem, t)))
    if progress is not None:
        progress(len(todo), len(todo))
    plans.sort(key=lambda p: (p.time.seconds, p.memory.peak))
    return plans if top is None else plans[:top]
