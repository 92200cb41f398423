"""parallelize: one GPT config + ParallelDims -> this rank's model, engine and batch block.

    run = parallelize(cfg, ParallelDims(dp_shard=2, tp=2), zero=1, sequence_parallel=True,
                      max_grad_norm=1.0, lr=1e-3)
    for ids, targets in global_batches:           # the same global batch on every rank
        loss = run.train_step(ids, targets, micro_batches=4)

The one place where the parallel forms meet (torchtitan's `parallelize_llama`, picotron's
process-group grid). Every rank runs it with the same arguments; it builds, in order:

    groups    ParallelGroups(dims): this rank's tp, dp, dp_shard, dp_replicate, ... groups
    model     TensorParallelGPT(cfg, groups.tp, sequence_parallel, groups.batch_shard):
              1/tp of every weight matrix; dropout masks are this rank's block of the
              masks one device draws for the whole global batch
    engine    the data-parallel engine over the dp groups (below), told how the gradient
              norm is completed across tp: ModelParallelNorm(groups.tp, counted)
    batches   run.local_batch(ids, targets): block groups.batch_shard of the global batch

and answers the questions that cross forms, so that no form needs to know another:

    which block of the global batch a rank trains on      groups.batch_shard (dp coordinate)
    how dropout is sliced                                 the same block, plus tp's own slices
    which groups a gradient is averaged over              dp_shard (reduce-scatter) and
                                                          dp_replicate (all-reduce), or dp (DDP)
    which group the gradient norm is summed over, and     tp; a parameter replicated across tp
    which parameters count once there                     counts on tp rank 0 only (Megatron's
                                                          param_is_not_tensor_parallel_duplicate)

Data parallelism, by ZeRO stage or FSDP strategy (dp_shard: where states are partitioned,
dp_replicate: replicas of those shards):

    zero=0 / NO_SHARD       DDP over dp = dp_replicate x dp_shard    needs dp_shard = 1
    zero=1, 2               ZeRO over dp_shard, all-reduced over dp_replicate
    zero=3 / FULL_SHARD     ZeRO-3 over dp_shard                      (dp_replicate = 1)
    SHARD_GRAD_OP           ZeRO-2 over dp_shard                      (dp_replicate = 1)
    HYBRID_SHARD            ZeRO-3 over dp_shard, replicated over dp_replicate
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ...data.batches import split_data_parallel, split_microbatches
from ...nn.config import GPTConfig
from ...optim.adam import AdamW
from ..dp import (DataParallelEngine, DistributedDataParallel, FullyShardedDataParallel,
                  ModelParallelNorm, ShardingStrategy, ZeroEngine, Zero3Engine,
                  accumulate_gradients)
from ..tp import TensorParallelGPT
from .dims import ParallelDims
from .groups import ParallelGroups

Engine = Union[DataParallelEngine, FullyShardedDataParallel]


@dataclass
class Parallelized:
    """What a training loop needs on this rank: the model, its engine, its groups."""

    model: TensorParallelGPT
    engine: Engine
    groups: ParallelGroups
    dims: ParallelDims

    def local_batch(self, ids: np.ndarray, targets: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """This rank's block of the global batch.  ids, targets: [s, B] -> [s, B/dp]."""
        return split_data_parallel(ids, targets, *self.groups.batch_shard)

    def forward_backward(self, ids: np.ndarray, targets: np.ndarray,
                         micro_batches: int = 1, no_sync: bool = True) -> float:
        """Forward and backward of this rank's block of the global batch [s, B], cut into
        `micro_batches` (all but the last inside no_sync); returns this rank's mean loss."""
        x, y = self.local_batch(ids, targets)  # x, y: [s, B/dp]
        return accumulate_gradients(self.model, self.engine,
                                    split_microbatches(x, y, micro_batches), no_sync)

    def step(self) -> None:
        """The optimizer step (clipped by the global norm if asked), then zero_grad."""
        self.engine.step()
        self.engine.zero_grad()

    def train_step(self, ids: np.ndarray, targets: np.ndarray, micro_batches: int = 1) -> float:
        """forward_backward, then step; returns this rank's mean loss (its dp block's)."""
        loss = self.forward_backward(ids, targets, micro_batches)
        self.step()
        return loss


def build_model(cfg: GPTConfig, groups: ParallelGroups,
                sequence_parallel: bool = False) -> TensorParallelGPT:
    """This rank's part of the model: 1/tp of the GPT, dropout sliced to its batch block."""
    return TensorParallelGPT(cfg, groups.tp, sequence_parallel, groups.batch_shard)


def model_parallel_norm(model, groups: ParallelGroups) -> Optional[ModelParallelNorm]:
    """How the gradient norm is completed across tp: squares summed over the tp group, each
    replicated parameter counted on tp rank 0 only. None when tp = 1."""
    if groups.tp.size == 1:
        return None
    first = groups.tp.group_rank(groups.rank) == 0
    sharded = frozenset(p.name for p in model.parameters()
                        if getattr(p, "tensor_model_parallel", False))
    return ModelParallelNorm(groups.tp, lambda name: first or name in sharded)


def build_engine(model, groups: ParallelGroups, *, zero: Optional[int] = None,
                 sharding_strategy: Optional[ShardingStrategy] = None,
                 optimizer_cls: type = AdamW, max_grad_norm: Optional[float] = None,
                 **kwargs: Any) -> Engine:
    """The data-parallel engine for `model` on `groups` (the table in the module docstring).
    kwargs: the optimizer's hyperparameters and the engine's knobs (bucket_cap_mb,
    reshard_after_forward, forward_prefetch, prefetch_depth, limit_all_gathers, ...)."""
    if zero is not None and sharding_strategy is not None:
        raise ValueError(f"give zero= (a ZeRO stage) or sharding_strategy= (an FSDP strategy), "
                         f"not both; got zero={zero!r} and {sharding_strategy}")
    if sharding_strategy is not None and not isinstance(sharding_strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy "
                        f"({[s.name for s in ShardingStrategy]}), got {sharding_strategy!r}")
    if sharding_strategy is None and zero is None:
        zero = 0
    if zero is not None and (isinstance(zero, bool) or zero not in (0, 1, 2, 3)):
        raise ValueError(f"zero is a ZeRO stage: 0 (DDP), 1 (optimizer states), 2 (+ "
                         f"gradients) or 3 (+ parameters); got zero={zero!r}")
    dims, what = groups.dims, (f"zero={zero}" if zero is not None else sharding_strategy.name)
    S = ShardingStrategy
    if (zero == 0 or sharding_strategy is S.NO_SHARD) and dims.dp_shard > 1:
        raise ValueError(f"{what} shards nothing, but {dims} asks for dp_shard="
                         f"{dims.dp_shard}: give DDP's replicas as dp_replicate="
                         f"{dims.dp} (and dp_shard=1), or shard with zero>=1")
    if (zero not in (None, 0) or sharding_strategy not in (None, S.NO_SHARD)) \
            and dims.dp_shard == 1 and dims.dp_replicate > 1:
        raise ValueError(f"{what} partitions states over dp_shard, which is 1 in {dims}: "
                         f"every shard group would hold one rank. Give the data-parallel "
                         f"ranks as dp_shard={dims.dp} (or split them: dp_shard x "
                         f"dp_replicate, HYBRID_SHARD-style)")
    if sharding_strategy in (S.FULL_SHARD, S.SHARD_GRAD_OP) and dims.dp_replicate > 1:
        raise ValueError(f"{what} shards over every data-parallel rank, but {dims} has "
                         f"dp_replicate={dims.dp_replicate}: use HYBRID_SHARD to shard inside "
                         f"dp_shard and replicate across dp_replicate, or dp_replicate=1")
    common: dict[str, Any] = dict(max_grad_norm=max_grad_norm,
                                  model_parallel=model_parallel_norm(model, groups), **kwargs)
    replicate = groups.dp_replicate if dims.dp_replicate > 1 else None
    if sharding_strategy is S.HYBRID_SHARD:
        return FullyShardedDataParallel(model, optimizer_cls, sharding_strategy=S.HYBRID_SHARD,
                                        process_group=(groups.dp_shard, groups.dp_replicate),
                                        **common)
    if sharding_strategy is not None:
        group = groups.dp if sharding_strategy is S.NO_SHARD else groups.dp_shard
        return FullyShardedDataParallel(model, optimizer_cls, sharding_strategy=sharding_strategy,
                                        process_group=group, **common)
    if zero == 0:
        return DistributedDataParallel(model, optimizer_cls, process_group=groups.dp, **common)
    if zero in (1, 2):
        return ZeroEngine(model, optimizer_cls, stage=zero, process_group=groups.dp_shard,
                          replicate_group=replicate, **common)
    return Zero3Engine(model, optimizer_cls, process_group=groups.dp_shard,
                       replicate_group=replicate, **common)


def parallelize(cfg: GPTConfig, dims: ParallelDims, *, zero: Optional[int] = None,
                sharding_strategy: Optional[ShardingStrategy] = None,
                sequence_parallel: bool = False, optimizer_cls: type = AdamW,
                max_grad_norm: Optional[float] = None,
                groups: Optional[ParallelGroups] = None, **kwargs: Any) -> Parallelized:
    """This rank's model, engine and groups for training `cfg` on the layout `dims` (call it
    on every rank, inside `launch`, with the same arguments). zero / sharding_strategy pick
    the data-parallel engine (default: DDP); kwargs are the optimizer's hyperparameters
    (lr, weight_decay, ...) and the engine's knobs."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"parallelize builds the model itself, split over the mesh: pass the "
                        f"GPTConfig, not a {type(cfg).__name__}")
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"parallelize takes a ParallelDims, got {type(dims).__name__}")
    dims.check_implemented()
    groups = groups if groups is not None else ParallelGroups(dims)
    if groups.dims != dims:
        raise ValueError(f"groups were built for {groups.dims}, not {dims}")
    model = build_model(cfg, groups, sequence_parallel)
    engine = build_engine(model, groups, zero=zero, sharding_strategy=sharding_strategy,
                          optimizer_cls=optimizer_cls, max_grad_norm=max_grad_norm, **kwargs)
    return Parallelized(model, engine, groups, dims)
