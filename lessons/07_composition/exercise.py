# Your file for lesson 07, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 07`.
"""Lesson 07 — 3-D composition and topology: the exercises' answers.

Exercise 7.1 computes, from a global rank alone, the ranks of its tensor-, pipeline- and
data-parallel groups, in minipar's (Megatron's) default order "tp-cp-ep-dp-pp": tp
varies fastest, then dp, then pp. Exercise 7.2 is a design exercise: it places a layout
on a cluster so that a GPU's memory and the bytes crossing nodes in a step stay within
their budgets; the grader trains one step of it on the simulated cluster. Exercise 7.3
predicts the bytes a pipeline's sends put on inter-node links, graded against a run's trace.
"""

from __future__ import annotations

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.programs.incidents.tp_across_nodes import inter_node_bytes


def groups_of(rank: int, dims: ParallelDims) -> dict[str, list[int]]:
    """rank = tp_rank + tp · (dp_rank + dp · pp_rank): the ranks of `rank`'s tp, dp and pp
    groups, each sorted (lesson section 1).

    dims: a ParallelDims in the default order (cp = ep = 1); its dp is dp_replicate x
    dp_shard, which together make one data-parallel coordinate. Returns {"tp": [...],
    "dp": [...], "pp": [...]}: the ranks that differ from `rank` in that coordinate only.
    """
    raise NotImplementedError("Exercise 7.1: a rank's groups from its coordinates — see lesson.py, section 1")


def cross_node_bytes(ctx, topology: mp.Topology, first: int = 0) -> float:
    """Bytes this rank put on inter-node links since trace event `first`: its share of
    collectives whose group spans nodes, and its sends to another node."""
    total = 0.0
    for e in ctx.trace.events[first:]:
        if e.stream == "comm":
            total += inter_node_bytes(e, topology)
        elif e.stream == "p2p" and e.meta.get("link") == topology.inter.name:
            total += float(e.meta.get("sent_bytes", 0))
    return total


def place_layout(cfg: GPTConfig, topology: mp.Topology, global_batch: int,
                 memory_budget: float, cross_node_budget: float) -> dict:
    """A layout of cfg on every GPU of `topology` for a step of global_batch sequences
    (lesson section 6).

    memory_budget: the most bytes any GPU's ledger may hold at its peak during a step;
    cross_node_budget: the most bytes all GPUs together may put on inter-node links in one
    step (collectives and pipeline sends). Returns {"dims": ParallelDims (default order),
    "zero": 0..2 (0 is DDP; 1 and 2 shard over dims.dp_shard), "microbatches": m (used
    when dims.pp > 1; m divides the batch and B/m divides among the dp ranks)}. The grader
    trains one step of it on the simulated cluster: one device's loss.
    """
    raise NotImplementedError("Exercise 7.2: a layout placed under a memory and a cross-node budget — see lesson.py, section 6")


def pipeline_cross_node_bytes(cfg: GPTConfig, dims: ParallelDims, topology: mp.Topology,
                              global_batch: int, microbatches: int) -> float:
    """Σ over stage boundaries whose two ranks sit on different nodes of 2 m · s · b · h · e
    bytes, b = B / (m · dp): what a pipeline's sends put on inter-node links in one step,
    summed over all GPUs (lesson section 6).

    dims: the default order (use your groups_of); each rank of pp coordinate k < pp - 1
    sends its [s, b, h] activation to the next stage and receives its gradient back, once
    per micro-batch; every tp rank sends the whole [s, b, h]. e: cfg.dtype's bytes (8 for
    float64). The loss's broadcast is a collective, not a send: leave it out.
    """
    raise NotImplementedError("Exercise 7.3: the bytes a pipeline sends across nodes — see lesson.py, section 6")
