"""Pipelines composed with data and tensor parallelism: each rank's stages, engine and runner.

    run = parallelize(cfg, ParallelDims(dp_shard=2, pp=2, tp=2), zero=1, schedule="1f1b",
                      microbatches=4)                       # 8 ranks, pp slowest
    loss = run.train_step(ids, targets)                     # the same on every rank of a dp block

What crosses forms, answered here (neither pp nor dp knows the other):

    which stages a rank holds      pipeline rank = its pp coordinate; the stages the
                                   schedule places on it, read from its lists
                                   (placement(actions)): stage r for GPipe, 1F1B, ZB-H1
                                   and ZB-H2, stages r, r + p, ... interleaved, stages r
                                   and 2p - 1 - r in a V (ZBV, DualPipeV), so that rank 0
                                   holds the first stage and the last
    which block of each            the m global micro-batches [s, B/m] are cut first, then
    micro-batch it runs            block d of dp of each (groups.batch_shard): the masks are
                                   those of one device running the m micro-batches in order
    which blocks it builds         those of its stages only (GPT's blocks_held; the others
                                   are RemoteBlocks), as Megatron-LM builds a stage's layers
    what the engine wraps          RankStages: the units of this rank's stages only
    when gradients are reduced     once per step: the runner runs its whole list inside
                                   engine.no_sync() and calls engine.finish_grad_sync() after
                                   the last backward (a split schedule's last W: the
                                   gradients are complete only then) and the tied-embedding
                                   all-reduce
                                   (Megatron's no_sync_func and finalize_model_grads_func)
    over which ranks the norm      the model-parallel group tp x pp; a parameter replicated
    is summed, counting what once  over tp on tp rank 0, a tied wte's last-stage copy on
                                   the first stage's rank only (Megatron's
                                   param_is_not_shared)
    which loss a rank reports      the last stage's, broadcast over the pp group from the
                                   rank the schedule places it on (Megatron-LM
                                   logs it on the last stage; every rank gets it here, so a
                                   loop reads the loss the same way on every layout): the
                                   mean over the m micro-batches of this dp block

A rank whose stages hold no parameter (empty middle stages, `layers=[...]` with zeros) has
no optimizer: `NoParameters` counts its steps and takes part in the norm's all-reduce.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from ...runtime.collectives import all_reduce, broadcast
from ...runtime.group import ProcessGroup
from ..dp import LocalState, ModelParallelNorm, ShardingStrategy
from ..pp import (PipelineRunner, RankStages, build_stages, placement, schedule,
                  split_layers, validate_schedule)
from ..pp.actions import Schedule
from .groups import ParallelGroups

#: the engines that gather (ZeRO-3) or free (ZeRO-2) a unit's weights or gradients between
#: its uses, which a tied wte in two units of one rank cannot survive
_TRANSIENT = (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP,
              ShardingStrategy.HYBRID_SHARD)


def pipeline_schedule(pp: int, name: Union[str, Schedule, None], microbatches: Optional[int],
                      chunks: Optional[int] = None) -> Optional[Schedule]:
    """The compute schedule of every pipeline rank, or None when no pipeline is asked for
    (pp = 1 and neither a schedule nor micro-batches given). `name` may be the schedule
    itself, one list of compute actions per pipeline rank (validated here). chunks: None
    is the schedule's own (1, or 2 for the V schedules, which refuse any other)."""
    if isinstance(name, (list, tuple)):
        info = validate_schedule(name)
        if len(name) != pp or microbatches not in (None, info.microbatches):
            raise ValueError(f"the schedule given has {len(name)} ranks' lists and "
                             f"{info.microbatches} micro-batches, but pp = {pp} and "
                             f"microbatches={microbatches}: give matching sizes")
        return [list(row) for row in name]
    if pp == 1 and name is None and microbatches is None and chunks in (None, 1):
        return None
    if microbatches is None:
        raise ValueError(f"a pipeline of pp = {pp} needs microbatches=m, the micro-batches "
                         f"of each step (m >= pp fills it; the global batch must divide by "
                         f"m x dp)")
    return schedule(name or "1f1b", pp, microbatches, chunks)


def check_tied_on_one_rank(cfg, actions: Schedule, zero, strategy) -> None:
    """Refuse a tied wte in two units of one rank under an engine that gathers or frees a
    unit's weights or gradients between its uses: pp = 1 with several chunks, or a V
    schedule (ZBV, DualPipeV), which puts the first and the last stage on rank 0."""
    where = placement(actions)
    S, p = len(where), len(actions)
    transient = zero in (2, 3) or strategy in _TRANSIENT
    if cfg.tie_embeddings and S > 1 and where[0] == where[S - 1] and transient:
        what = f"zero={zero}" if zero is not None else strategy.name
        one_stage = ("chunks=1 at pp=1 (one stage)" if p == 1 else
                     "a schedule with one stage a rank ('1f1b', 'zb_h1' or 'zb_h2', "
                     "whose first and last stages sit on two ranks)")
        where_from = "" if p == 1 else (f" (this schedule places both on pipeline rank "
                                        f"{where[0]}, as a V does)")
        raise ValueError(
            f"with tied embeddings, stages 0 and {S - 1} on one pipeline rank both use wte, "
            f"in two units (EMBED and HEAD){where_from}; {what} gathers or frees a unit's "
            f"weights and gradients around its own use, and the other unit would find them "
            f"gone. Use tie_embeddings=False, {one_stage}, or zero=0 or 1")


def blocks_held(num_layers: int, actions: Schedule, pp_rank: int,
                layers: Optional[Sequence[int]]) -> frozenset:
    """The blocks of the stages the schedule places on pipeline rank `pp_rank` (split as
    build_stages splits them): all this rank builds of the model's blocks."""
    where = placement(actions)
    bounds = split_layers(num_layers, len(where), layers)
    return frozenset(i for s, r in where.items() if r == pp_rank for i in range(*bounds[s]))


def build_rank_stages(model, groups: ParallelGroups, actions: Schedule,
                      layers: Optional[Sequence[int]]) -> RankStages:
    """This rank's stages of `model` (its pp coordinate is its pipeline rank)."""
    return RankStages(build_stages(model, placement(actions), groups.coordinate["pp"], layers))


def shared_parameters(stages: RankStages, actions: Schedule,
                      groups: ParallelGroups) -> frozenset:
    """The names whose squares another rank adds to the norm: a tied wte held here as the
    last stage's copy while the first stage is on another pipeline rank."""
    where = placement(actions)
    model = stages.model
    mine = groups.coordinate["pp"]
    holds_last = where[len(where) - 1] == mine
    if model.cfg.tie_embeddings and holds_last and where[0] != mine:
        return frozenset({model.wte.weight.name})
    return frozenset()


def build_runner(stages: RankStages, actions: Schedule, groups: ParallelGroups,
                 engine, sequence_shard=None) -> PipelineRunner:
    """The runner of this rank's stages in the pp group, reducing through `engine`;
    sequence_shard: this rank's rows of each block under context parallelism."""
    return PipelineRunner(stages.stages, actions, groups.pp, no_sync=engine.no_sync,
                          grads_ready=engine.finish_grad_sync,
                          batch_shard=groups.batch_shard, sequence_shard=sequence_shard)


def broadcast_loss(loss: Optional[float], group: ProcessGroup, src: Optional[int] = None
                   ) -> float:
    """The loss of pipeline rank `src` (the one holding the last stage: the runner's
    loss_rank; default the last) on every rank of the pp group (8 bytes)."""
    if group.size == 1:
        return float(loss)
    x = np.array([np.nan if loss is None else loss], dtype=np.float64)
    src = group.size - 1 if src is None else src
    return float(broadcast(x, src=group.ranks[src], group=group)[0])


class NoParameters:
    """The engine of a pipeline rank whose stages hold no parameter: no optimizer, nothing
    to reduce or save but the step count; its squares (none) join the gradient norm's
    all-reduce over the model-parallel group, as every rank of that group must."""

    stage = 0

    def __init__(self, model: RankStages, groups: ParallelGroups, *, replicated: bool,
                 max_grad_norm: Optional[float], model_parallel: Optional[ModelParallelNorm],
                 lr: Optional[float] = None, **_: Any):
        self.model, self.groups = model, groups
        self.units: list = []
        self.param_shapes: dict = {}
        self.dtype = np.dtype(model.cfg.np_dtype)
        self.max_grad_norm, self.model_parallel = max_grad_norm, model_parallel
        self.lr, self.last_grad_norm, self._steps = lr, None, 0
        # where the engine with parameters would put this rank's (empty) shards
        if replicated:  # DDP, NO_SHARD: replicas over dp
            self._groups = (None, groups.dp if groups.dp.size > 1 else None)
        else:
            rep = groups.dp_replicate
            self._groups = (groups.dp_shard, rep if rep.size > 1 else None)

    @property
    def steps(self) -> int:
        return self._steps

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def finish_grad_sync(self) -> None:
        """Nothing to reduce."""

    def step(self) -> None:
        mp = self.model_parallel
        if self.max_grad_norm is not None:
            total = 0.0
            if mp is not None and mp.group.size > 1:
                total = float(all_reduce(np.array([0.0]), "sum", group=mp.group)[0])
            self.last_grad_norm = math.sqrt(total)
        self._steps += 1

    def zero_grad(self) -> None:
        """No gradients."""

    @contextlib.contextmanager
    def summon_full_params(self, writeback: bool = True) -> Iterator[None]:
        yield

    def full_grads(self) -> dict:
        return {}

    def full_state_dict(self) -> dict[str, np.ndarray]:
        return {"meta/step": np.array(self._steps, dtype=np.int64)}

    def load_full_state_dict(self, sd: dict[str, np.ndarray]) -> None:
        extra = sorted(set(sd) - {"meta/step"})
        if extra:
            raise KeyError(f"load_full_state_dict: this pipeline rank holds no parameter, "
                           f"got {extra[:6]}")
        self._steps = int(sd["meta/step"])

    def local_state(self) -> LocalState:
        return LocalState([], *self._groups, self._steps)

    def remove_hooks(self) -> None:
        """No hooks."""

    def __repr__(self) -> str:
        return f"NoParameters({self.model!r})"
