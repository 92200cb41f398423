"""Mixtures of experts on the mesh: which layer, which groups, how their gradients reduce.

What crosses forms, answered here (nn/moe, parallel/ep, parallel/dp and parallel/tp know
nothing of each other):

    the MoE layer of block i        ep's ExpertParallelMoE over groups.ep (ep consecutive
                                    ranks of the data-parallel group: Megatron folds ep
                                    into dp), replicated over the tp group on the full
                                    sequence, on the pipeline rank that holds block i
    which tokens it routes          the rank's own block of each micro-batch: capacity,
                                    drops and the balancing losses are those of that token
                                    group, as one device routing each group on its own;
                                    with MoEConfig.global_aux_loss, the aux loss's counts
                                    summed over dp first (every rank's block of the same
                                    micro-batch: one device routing the micro-batch whole)
    how its gradients reduce        router and shared experts: dense, averaged over dp;
                                    experts: averaged over groups.edp (the ranks holding
                                    the same experts) and scaled by 1/ep (dp/experts.py)
    the gradient norm               the experts' squares also summed over groups.ep
    the routers' bias               the step's counts summed over dp, then
                                    b += rate · sign(mean − load) on every replica alike

Composed with DDP only (zero=0), without sequence parallelism; the other engines and SP
are refused with a message (not written yet).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...nn.config import GPTConfig
from ...nn.hooks import block_unit
from ...nn.moe import moe_layer, moe_layers, update_routers
from ...runtime.collectives import all_reduce
from ..dp import ExpertDataParallel
from ..ep import ExpertParallelMoE
from .groups import ParallelGroups


def check_moe(cfg: GPTConfig, groups: ParallelGroups, zero: Optional[int], strategy,
              sequence_parallel: bool) -> None:
    """Refuse what the mesh does not compose with a mixture of experts yet."""
    ep = groups.dims.ep
    if cfg.moe.num_experts % ep:
        raise ValueError(f"GPTConfig.moe.num_experts = {cfg.moe.num_experts} cannot be split "
                         f"over ep = {ep} ranks: choose ep dividing it (each rank holds E/ep)")
    if zero not in (None, 0) or strategy is not None:
        raise ValueError(f"a mixture of experts trains with DDP (zero=0) only here: the "
                         f"sharded engines do not split expert parameters over their "
                         f"replicas yet; got zero={zero!r}, sharding_strategy={strategy}")
    if sequence_parallel:
        raise ValueError("a mixture of experts runs on the full sequence, replicated over the "
                         "tp group: use sequence_parallel=False")


def moe_factory(cfg: GPTConfig, groups: ParallelGroups) -> Callable[[int], object]:
    """Block i's MLP for the tensor-parallel model: the expert-parallel MoE where
    cfg.moe puts one, None (tp's dense ParallelMLP) elsewhere."""
    def factory(i: int):
        if not cfg.moe.is_moe_block(i):
            return None
        return moe_layer(f"{block_unit(i)}.mlp", cfg, ExpertParallelMoE, group=groups.ep,
                         reduce_counts=reduce)
    reduce = None  # the aux loss's f over this rank's micro-batch
    if cfg.moe.global_aux_loss and groups.dp.size > 1:
        def reduce(counts):  # ... or over every dp rank's micro-batch (one per rank, lockstep)
            return all_reduce(counts.astype(np.float64), "sum", group=groups.dp)
    return factory


def expert_data_parallel(model, groups: ParallelGroups) -> Optional[ExpertDataParallel]:
    """How DDP reduces this rank's expert parameters (None: the model has none)."""
    names = frozenset(p.name for layer in moe_layers(model)
                      for p in layer.experts.parameters())
    if not names:
        return None
    return ExpertDataParallel(groups.edp, groups.ep, 1.0 / groups.ep.size, names.__contains__)


def update_expert_biases(model, groups: ParallelGroups) -> None:
    """After the optimizer step: each router's counts of the step summed over dp (every
    replica then moves its bias alike), then the aux-loss-free update (rate 0: counts
    only reset)."""
    layers = moe_layers(model)
    if not layers:
        return
    counts = np.stack([layer.router.tokens_per_expert for layer in layers])  # [n, E]
    if groups.dp.size > 1:
        counts = all_reduce(counts.astype(np.float64), "sum", group=groups.dp)
    for layer, c in zip(layers, counts):
        layer.router.tokens_per_expert[:] = c.astype(np.int64)
    update_routers(model, model.cfg.moe.bias_update_rate)
