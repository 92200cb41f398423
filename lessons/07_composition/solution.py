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
    # BEGIN SOLUTION Exercise 7.1: a rank's groups from its coordinates — see lesson.py, section 1
    size = {"tp": dims.tp, "dp": dims.dp, "pp": dims.pp}
    stride = {"tp": 1, "dp": dims.tp, "pp": dims.tp * dims.dp}  # tp fastest, pp slowest
    out = {}
    for name in ("tp", "dp", "pp"):
        coord = rank // stride[name] % size[name]  # this rank's coordinate along name
        base = rank - coord * stride[name]  # the group's member at coordinate 0
        out[name] = [base + i * stride[name] for i in range(size[name])]
    return out
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 7.2: a layout placed under a memory and a cross-node budget — see lesson.py, section 6
    g, world = topology.gpus_per_node, topology.world_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, global_batch))  # [s, B]
    targets = np.roll(ids, -1, axis=0)

    def measure(ctx, dims, zero, m):
        run = parallelize(cfg, dims, zero=zero, lr=1e-3, placement="any",
                          **({"microbatches": m} if dims.pp > 1 else {}))
        first = len(ctx.trace.events)
        ctx.ledger.reset_peak()
        run.train_step(ids, targets)
        ctx.resolve_pending()
        return ctx.ledger.peak(), cross_node_bytes(ctx, topology, first)

    # the checklist: tp inside a node (largest first), pp next, dp last, ZeRO on top
    for tp in [t for t in range(g, 0, -1) if g % t == 0 and cfg.num_heads % t == 0]:
        for pp in [p for p in range(1, world // tp + 1) if (world // tp) % p == 0
                   and p <= cfg.num_layers]:
            dp = world // (tp * pp)
            m = pp  # one micro-batch a stage in flight
            if global_batch % dp or (pp > 1 and (global_batch % m or (global_batch // m) % dp)):
                continue
            for zero in (0, 1, 2) if dp > 1 else (0,):
                dims = (ParallelDims(dp_shard=dp, pp=pp, tp=tp) if zero
                        else ParallelDims(dp_replicate=dp, pp=pp, tp=tp))
                res = mp.launch(lambda ctx: measure(ctx, dims, zero, m), world,
                                topology=topology)
                peak = max(r[0] for r in res)
                crossing = sum(r[1] for r in res)
                if peak <= memory_budget and crossing <= cross_node_budget:
                    return {"dims": dims, "zero": zero, "microbatches": m}
    raise ValueError(f"no layout of {world} GPUs fits {memory_budget} bytes a GPU and "
                     f"{cross_node_budget} bytes across nodes a step")
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 7.3: the bytes a pipeline sends across nodes — see lesson.py, section 6
    b = global_batch // (microbatches * dims.dp)  # sequences of a micro-batch on a dp rank
    message = cfg.seq_len * b * cfg.hidden * np.dtype(cfg.dtype).itemsize  # one [s, b, h]
    total = 0.0
    for rank in range(dims.world_size):
        pp_group = groups_of(rank, dims)["pp"]
        k = pp_group.index(rank)  # this rank's stage
        if k + 1 < len(pp_group) and topology.node_of(rank) != topology.node_of(pp_group[k + 1]):
            total += 2 * microbatches * message  # activations forward, their gradients back
    return total
    # END SOLUTION
