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
              norm is completed across tp x pp: ModelParallelNorm(groups.model_parallel,
              counted)
    batches   run.local_batch(ids, targets): block groups.batch_shard of the global batch
              (under context parallelism, this rank's rows of it: context.py)
    pipeline  with pp > 1 (or a schedule at pp = 1): this rank's stages of the model, the
              engine over their units only, and a PipelineRunner in the pp group that
              runs the schedule (pipeline.py says what crosses forms there)

and answers the questions that cross forms, so that no form needs to know another:

    which block of the global batch a rank trains on      groups.batch_shard (dp coordinate)
    how dropout is sliced                                 the same block, plus tp's own slices
    which groups a gradient is averaged over              dp_shard (reduce-scatter) and
                                                          dp_replicate (all-reduce), or dp (DDP);
                                                          with cp > 1, dp_shard x cp and dp x cp
    which rows of the sequence a rank runs, and which     context.py: zigzag rows, the ring or
    attention core reaches the others' keys               Ulysses over groups.cp
    which group the gradient norm is summed over, and     tp x pp; a parameter replicated
    which parameters count once there                     across tp counts on tp rank 0 only
                                                          (Megatron's param_is_not_tensor_
                                                          parallel_duplicate), a tied wte on
                                                          the first stage only

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
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ...data.batches import split_data_parallel, split_microbatches
from ...nn.config import GPTConfig
from ...optim.adam import AdamW
from ...runtime.collectives import all_reduce
from ...runtime.context import current
from ..dp import (DataParallelEngine, DistributedDataParallel, FullyShardedDataParallel,
                  ModelParallelNorm, ShardingStrategy, ZeroEngine, Zero3Engine,
                  accumulate_gradients)
from ..pp import PipelineRunner, RankStages, validate_schedule
from ..tp import TensorParallelGPT
from .context import attention_core, check_context, sequence_positions, sequence_shard
from .dims import ParallelDims
from .experts import check_moe, expert_data_parallel, moe_factory, update_expert_biases
from .groups import ParallelGroups
from .placement import apply_placement
from .pipeline import (NoParameters, blocks_held, broadcast_loss, build_rank_stages,
                       build_runner, check_tied_on_one_rank, pipeline_schedule,
                       shared_parameters)

Engine = Union[DataParallelEngine, FullyShardedDataParallel, NoParameters]


@dataclass
class Parallelized:
    """What a training loop needs on this rank: the model, its engine, its groups; under a
    pipeline also this rank's stages and the runner."""

    model: TensorParallelGPT
    engine: Engine
    groups: ParallelGroups
    dims: ParallelDims
    stages: Optional[RankStages] = None
    runner: Optional[PipelineRunner] = None
    sequence_shard: Optional[Callable] = None  # context parallelism: this rank's rows

    def local_batch(self, ids: np.ndarray, targets: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """This rank's block of the global batch.  ids, targets: [s, B] -> [s, B/dp]
        ([s/cp, B/dp] with context parallelism: its rows of the block, context.py).
        (A pipeline's runner takes block d of each of its m micro-batches instead.)"""
        x, y = split_data_parallel(ids, targets, *self.groups.batch_shard)  # [s, B/dp]
        if self.sequence_shard is not None:
            x, y = self.sequence_shard(x, y)  # [s/cp, B/dp]
        return x, y

    def _block_loss(self, loss: float) -> float:
        """The dp block's mean loss from this rank's: under cp the mean over the cp group
        of its ranks' means (equal rows each); 8 bytes."""
        if self.groups.dims.cp == 1:
            return loss
        return float(all_reduce(np.array([loss]), "avg", group=self.groups.cp)[0])

    def forward_backward(self, ids: np.ndarray, targets: np.ndarray,
                         micro_batches: Optional[int] = None, no_sync: bool = True) -> float:
        """Forward and backward of this rank's block of the global batch [s, B], cut into
        `micro_batches` (default 1; all but the last inside no_sync); returns this rank's
        mean loss. Under a pipeline: the runner's step over the schedule's m micro-batches
        (block groups.batch_shard of each), gradients reduced once at its end, and the
        last stage's loss broadcast over the pp group (pipeline.py)."""
        if self.runner is not None:
            m = self.runner.info.microbatches
            if micro_batches not in (None, m):
                raise ValueError(f"this run's pipeline schedule runs m = {m} micro-batches "
                                 f"a step (parallelize(..., microbatches={m})); got "
                                 f"micro_batches={micro_batches}: leave it out")
            return self._block_loss(broadcast_loss(self.runner.step(ids, targets),
                                                   self.groups.pp, self.runner.loss_rank))
        x, y = self.local_batch(ids, targets)  # x, y: [s, B/dp] ([s/cp, B/dp])
        return self._block_loss(accumulate_gradients(
            self.model, self.engine, split_microbatches(x, y, micro_batches or 1), no_sync))

    def step(self) -> None:
        """The optimizer step (clipped by the global norm if asked), then zero_grad; with
        a mixture of experts, the routers' biases (experts.py)."""
        self.engine.step()
        self.engine.zero_grad()
        if self.model.cfg.moe is not None:
            update_expert_biases(self.model, self.groups)

    def train_step(self, ids: np.ndarray, targets: np.ndarray,
                   micro_batches: Optional[int] = None) -> float:
        """forward_backward, then step; returns this rank's mean loss (its dp block's)."""
        loss = self.forward_backward(ids, targets, micro_batches)
        self.step()
        return loss


def _zero_stage(zero: Optional[int], strategy: Optional[ShardingStrategy]) -> int:
    """The ZeRO stage an engine choice moves the bytes of (FSDP strategies by name)."""
    if strategy is None:
        return zero or 0
    return {ShardingStrategy.NO_SHARD: 0, ShardingStrategy.SHARD_GRAD_OP: 2}.get(strategy, 3)


def build_model(cfg: GPTConfig, groups: ParallelGroups, sequence_parallel: bool = False,
                blocks: Optional[frozenset] = None, cp_method: str = "ring",
                cp_layout: str = "zigzag") -> TensorParallelGPT:
    """This rank's part of the model: 1/tp of the GPT, dropout sliced to its batch block;
    of the blocks, only `blocks` (default: all; a pipeline rank's: its stages'); with
    cfg.moe, expert-parallel MoE layers over groups.ep (experts.py); with cp > 1, its
    rows' positions and the ring or Ulysses attention core over groups.cp (context.py)."""
    factory = moe_factory(cfg, groups) if cfg.moe is not None else None
    return TensorParallelGPT(cfg, groups.tp, sequence_parallel, groups.batch_shard, blocks,
                             factory, attention_core(groups, cp_method, cp_layout),
                             sequence_positions(cfg, groups, cp_layout))


def model_parallel_norm(model, groups: ParallelGroups,
                        shared: frozenset = frozenset()) -> Optional[ModelParallelNorm]:
    """How the gradient norm is completed across tp x pp: squares summed over the
    model-parallel group, each parameter replicated across tp counted on tp rank 0 only,
    the `shared` ones (a tied wte's last-stage copy) not at all. None on a group of one."""
    if groups.model_parallel.size == 1:
        return None
    first = groups.tp.group_rank(groups.rank) == 0
    sharded = frozenset(p.name for p in model.parameters()
                        if getattr(p, "tensor_model_parallel", False))
    return ModelParallelNorm(groups.model_parallel,
                             lambda name: (first or name in sharded) and name not in shared)


def build_engine(model, groups: ParallelGroups, *, zero: Optional[int] = None,
                 sharding_strategy: Optional[ShardingStrategy] = None,
                 optimizer_cls: type = AdamW, max_grad_norm: Optional[float] = None,
                 shared: frozenset = frozenset(), **kwargs: Any) -> Engine:
    """The data-parallel engine for `model` on `groups` (the table in the module docstring).
    kwargs: the optimizer's hyperparameters and the engine's knobs (bucket_cap_mb,
    reshard_after_forward, forward_prefetch, prefetch_depth, limit_all_gathers, ...).
    `model` may be a pipeline rank's RankStages: a rank without parameters gets
    NoParameters; `shared`: parameters another rank counts in the norm."""
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
            and dims.dp_shard * dims.cp == 1 and dims.dp_replicate > 1:
        raise ValueError(f"{what} partitions states over dp_shard (x cp), which is 1 in "
                         f"{dims}: every shard group would hold one rank. Give the data-parallel "
                         f"ranks as dp_shard={dims.dp} (or split them: dp_shard x "
                         f"dp_replicate, HYBRID_SHARD-style)")
    if sharding_strategy in (S.FULL_SHARD, S.SHARD_GRAD_OP) and dims.dp_replicate > 1:
        raise ValueError(f"{what} shards over every data-parallel rank, but {dims} has "
                         f"dp_replicate={dims.dp_replicate}: use HYBRID_SHARD to shard inside "
                         f"dp_shard and replicate across dp_replicate, or dp_replicate=1")
    common: dict[str, Any] = dict(max_grad_norm=max_grad_norm,
                                  model_parallel=model_parallel_norm(model, groups, shared),
                                  **kwargs)
    experts = expert_data_parallel(getattr(model, "model", model), groups)
    if experts is not None:  # DDP only (check_moe)
        common["experts"] = experts
    if not model.units():  # a pipeline rank of empty stages only
        return NoParameters(model, groups, replicated=zero == 0 or sharding_strategy is
                            S.NO_SHARD, **common)
    replicate = groups.dp_replicate if dims.dp_replicate > 1 else None
    # under context parallelism the cp ranks of a dp block average their gradients too
    dp, shard = ((groups.dp_cp, groups.dp_shard_cp) if dims.cp > 1
                 else (groups.dp, groups.dp_shard))
    if sharding_strategy is S.HYBRID_SHARD:
        return FullyShardedDataParallel(model, optimizer_cls, sharding_strategy=S.HYBRID_SHARD,
                                        process_group=(shard, groups.dp_replicate), **common)
    if sharding_strategy is not None:
        group = dp if sharding_strategy is S.NO_SHARD else shard
        return FullyShardedDataParallel(model, optimizer_cls, sharding_strategy=sharding_strategy,
                                        process_group=group, **common)
    if zero == 0:
        return DistributedDataParallel(model, optimizer_cls, process_group=dp, **common)
    if zero in (1, 2):
        return ZeroEngine(model, optimizer_cls, stage=zero, process_group=shard,
                          replicate_group=replicate, **common)
    return Zero3Engine(model, optimizer_cls, process_group=shard, replicate_group=replicate,
                       **common)


def parallelize(cfg: GPTConfig, dims: ParallelDims, *, zero: Optional[int] = None,
                sharding_strategy: Optional[ShardingStrategy] = None,
                sequence_parallel: bool = False, optimizer_cls: type = AdamW,
                max_grad_norm: Optional[float] = None,
                groups: Optional[ParallelGroups] = None, schedule: Union[str, list, None] = None,
                microbatches: Optional[int] = None, chunks: Optional[int] = None,
                layers: Optional[Sequence[int]] = None, placement: str = "warn",
                cp_method: str = "ring", cp_layout: str = "zigzag",
                **kwargs: Any) -> Parallelized:
    """This rank's model, engine and groups for training `cfg` on the layout `dims` (call it
    on every rank, inside `launch`, with the same arguments). zero / sharding_strategy pick
    the data-parallel engine (default: DDP); kwargs are the optimizer's hyperparameters
    (lr, weight_decay, ...) and the engine's knobs. A pipeline (dims.pp > 1, or a schedule
    at pp = 1): schedule "gpipe", "1f1b" (default), "interleaved_1f1b" with `chunks`
    stages per rank, the zero-bubble "zb_h1", "zb_h2", or the V schedules "zbv" and
    "dualpipev" (two stages a rank; any name of minipar.parallel.pp.SCHEDULES), or the
    compute schedule itself, one list of actions per pp rank; `chunks` None is the
    schedule's own (1, or 2 in a V); `microbatches` m a step, `layers` blocks per stage
    (default: even, the remainder on the first stages). The stages sit where the schedule
    places them (pipeline.py). `placement`: "warn" (default) warns when the launched
    topology puts a tp group across nodes or another order of the same sizes is cheaper
    (placement.py, with the cost model's figures), "strict" refuses that layout, "any"
    runs it without a word. Context parallelism (dims.cp > 1): `cp_method` "ring" or
    "ulysses", `cp_layout` "zigzag" (default) or "contiguous" (context.py)."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"parallelize builds the model itself, split over the mesh: pass the "
                        f"GPTConfig, not a {type(cfg).__name__}")
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"parallelize takes a ParallelDims, got {type(dims).__name__}")
    dims.check_implemented()
    if cfg.np_dtype == np.float16:
        raise ValueError("parallelize composes float64, float32 and bfloat16 (float32 masters, "
                         "no loss scaling); float16 needs a loss scaler, which the "
                         "data-parallel engines do not implement: use dtype='bfloat16', or "
                         "train float16 on one device with MixedPrecisionOptimizer")
    groups = groups if groups is not None else ParallelGroups(dims)
    if groups.dims != dims:
        raise ValueError(f"groups were built for {groups.dims}, not {dims}")
    if cfg.moe is not None:
        check_moe(cfg, groups, zero, sharding_strategy, sequence_parallel)
    check_context(cfg, dims, cp_method, cp_layout, sequence_parallel)
    actions = pipeline_schedule(dims.pp, schedule, microbatches, chunks)
    if actions is None and layers is not None:
        raise ValueError(f"layers={layers!r} splits the blocks among pipeline stages, but "
                         f"{dims} runs no pipeline: give pp > 1, or schedule= at pp = 1")
    if actions is not None:
        check_tied_on_one_rank(cfg, actions, zero, sharding_strategy)
    info = None if actions is None else validate_schedule(actions)
    m, v = (1, 1) if info is None else (info.microbatches, info.stages // dims.pp)
    apply_placement(placement, dims, current().topology, cfg, groups.rank, microbatches=m,
                    chunks=v, sequence_parallel=sequence_parallel,
                    zero=_zero_stage(zero, sharding_strategy))
    held = None if actions is None else blocks_held(cfg.num_layers, actions,
                                                    groups.coordinate["pp"], layers)
    model = build_model(cfg, groups, sequence_parallel, held, cp_method, cp_layout)
    rows = sequence_shard(groups, cp_layout)
    engine_args = dict(zero=zero, sharding_strategy=sharding_strategy,
                       optimizer_cls=optimizer_cls, max_grad_norm=max_grad_norm, **kwargs)
    if actions is None:
        return Parallelized(model, build_engine(model, groups, **engine_args), groups, dims,
                            sequence_shard=rows)
    stages = build_rank_stages(model, groups, actions, layers)
    engine = build_engine(stages, groups, shared=shared_parameters(stages, actions, groups),
                          **engine_args)
    return Parallelized(model, engine, groups, dims, stages,
                        build_runner(stages, actions, groups, engine, rows), rows)
