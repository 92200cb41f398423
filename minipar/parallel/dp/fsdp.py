"""FullyShardedDataParallel: PyTorch FSDP's names over the ZeRO engines.

PyTorch FSDP (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel") names its sharding strategies after what they partition; each is one of the
engines of this package:

    ShardingStrategy     partitions                          engine
    FULL_SHARD           weights, gradients, optimizer       Zero3Engine      (ZeRO-3)
    SHARD_GRAD_OP        gradients, optimizer                ZeroEngine(2)    (ZeRO-2)
    NO_SHARD             nothing                             DistributedDataParallel
    HYBRID_SHARD         all three inside a node; replicas   Zero3Engine with a replicate
                         of the node's shards across nodes   group

HYBRID_SHARD runs on a 2-D mesh (replicate, shard), shard fastest: ranks of one node form a
shard group, equal positions on different nodes a replicate group. Gradients are
reduce-scattered inside the node (NVLink) and the shard is all-reduced across nodes
(InfiniBand), so only Psi'/N_shard elements per rank cross the slow links:

    s = reduce_scatter(g, "avg", shard group)[r];   s = all_reduce(s, "avg", replicate group)

which is the average over all ranks (equal batch shards: a mean of means). Weights are
gathered inside the node only. Memory per rank is ZeRO-3's with N = the node's size.

Every method of the engine is available here by the same name: `no_sync()`,
`finish_grad_sync()`, `step()`,
`zero_grad()`, `summon_full_params()`, `full_state_dict()`, `load_full_state_dict()`,
`full_grads()`, `local_state()`.
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import Optional, Union

import numpy as np

from ...optim.adam import AdamW
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from ...runtime.mesh import DeviceMesh
from .ddp import DistributedDataParallel
from .engine import DataParallelEngine, LocalState, ModelParallelNorm
from .zero import ZeroEngine
from .zero3 import Zero3Engine


class ShardingStrategy(Enum):
    """torch.distributed.fsdp.ShardingStrategy's names."""

    FULL_SHARD = "FULL_SHARD"  # ZeRO-3
    SHARD_GRAD_OP = "SHARD_GRAD_OP"  # ZeRO-2
    NO_SHARD = "NO_SHARD"  # DDP
    HYBRID_SHARD = "HYBRID_SHARD"  # ZeRO-3 inside a node, DDP across nodes


def hybrid_mesh(device_mesh: Optional[DeviceMesh] = None) -> tuple[ProcessGroup, ProcessGroup]:
    """(shard group, replicate group) of this rank for HYBRID_SHARD.

    Without a mesh: one shard group per node, built from the topology, i.e. the mesh
    init_device_mesh((num_nodes, gpus_per_node), ("replicate", "shard")).
    """
    ctx = current()
    if device_mesh is None:
        topo = ctx.topology
        device_mesh = DeviceMesh((topo.num_nodes, topo.gpus_per_node), ("replicate", "shard"))
    if device_mesh.mesh_dim_names != ("replicate", "shard") or len(device_mesh.shape) != 2:
        raise ValueError(f"HYBRID_SHARD needs a 2-D mesh with dimensions ('replicate', 'shard') "
                         f"(shard fastest, inside a node); got {device_mesh}")
    if device_mesh.size != ctx.world_size:
        raise ValueError(f"the mesh {device_mesh} covers {device_mesh.size} ranks but the "
                         f"world has {ctx.world_size}")
    return (device_mesh.get_group("shard", ctx.rank),
            device_mesh.get_group("replicate", ctx.rank))


class FullyShardedDataParallel:
    """`FullyShardedDataParallel(model, AdamW, sharding_strategy=ShardingStrategy.FULL_SHARD,
    lr=..., max_grad_norm=...)`.

    process_group:  the data-parallel group (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD); for
                    HYBRID_SHARD a pair (shard group, replicate group), as torch's FSDP
                    takes it
    device_mesh:    HYBRID_SHARD's 2-D ("replicate", "shard") mesh (default: from the
                    topology, one shard group per node)
    reshard_after_forward, forward_prefetch, backward_prefetch, prefetch_depth,
    limit_all_gathers:
                    FULL_SHARD / HYBRID_SHARD knobs (see zero3.py)
    bucket_cap_mb:  NO_SHARD's gradient bucket size
    model_parallel: with a model split across ranks, how its gradient norm is completed
    `self.engine` is the engine doing the work.
    """

    def __init__(self, model, optimizer_cls: type = AdamW, *,
                 sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD,
                 process_group: Union[ProcessGroup, tuple[ProcessGroup, ProcessGroup],
                                      None] = None,
                 device_mesh: Optional[DeviceMesh] = None,
                 max_grad_norm: Optional[float] = None, reshard_after_forward: bool = True,
                 forward_prefetch: bool = False, backward_prefetch: bool = True,
                 prefetch_depth: int = 1, limit_all_gathers: Union[bool, int] = True,
                 bucket_cap_mb: float = 25.0,
                 model_parallel: Optional[ModelParallelNorm] = None, **optimizer_kwargs):
        if not isinstance(sharding_strategy, ShardingStrategy):
            raise TypeError(f"sharding_strategy must be a ShardingStrategy "
                            f"({[s.name for s in ShardingStrategy]}), got {sharding_strategy!r}")
        if device_mesh is not None and sharding_strategy is not ShardingStrategy.HYBRID_SHARD:
            if len(device_mesh.shape) != 1:
                raise ValueError(f"{sharding_strategy.name} shards over one group: pass a 1-D "
                                 f"device_mesh or a process_group, not {device_mesh}")
            process_group = device_mesh.get_group(device_mesh.mesh_dim_names[0], current().rank)
        pair = isinstance(process_group, tuple)
        if pair != (sharding_strategy is ShardingStrategy.HYBRID_SHARD and process_group
                    is not None):
            raise ValueError(f"a pair of process groups (shard, replicate) is HYBRID_SHARD's "
                             f"and only HYBRID_SHARD's; got {sharding_strategy.name} with "
                             f"process_group={process_group!r}")
        self.sharding_strategy = sharding_strategy
        common = dict(max_grad_norm=max_grad_norm, model_parallel=model_parallel,
                      **optimizer_kwargs)
        stage3 = dict(reshard_after_forward=reshard_after_forward,
                      forward_prefetch=forward_prefetch, backward_prefetch=backward_prefetch,
                      prefetch_depth=prefetch_depth, limit_all_gathers=limit_all_gathers)
        s = ShardingStrategy
        if sharding_strategy is s.FULL_SHARD:
            self.engine: DataParallelEngine = Zero3Engine(
                model, optimizer_cls, process_group=process_group, **stage3, **common)
        elif sharding_strategy is s.SHARD_GRAD_OP:
            self.engine = ZeroEngine(model, optimizer_cls, stage=2,
                                     process_group=process_group, **common)
        elif sharding_strategy is s.NO_SHARD:
            self.engine = DistributedDataParallel(model, optimizer_cls,
                                                  process_group=process_group,
                                                  bucket_cap_mb=bucket_cap_mb, **common)
        else:
            shard, replicate = process_group if pair else hybrid_mesh(device_mesh)
            self.engine = Zero3Engine(model, optimizer_cls, process_group=shard,
                                      replicate_group=replicate, **stage3, **common)
        self.model = model

    # ---- the engine's API, by the same names ----------------------------------------------
    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.engine.no_sync()

    def finish_grad_sync(self) -> None:
        self.engine.finish_grad_sync()

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def summon_full_params(self, writeback: bool = True) -> contextlib.AbstractContextManager:
        return self.engine.summon_full_params(writeback)

    def full_state_dict(self) -> dict[str, np.ndarray]:
        return self.engine.full_state_dict()

    def load_full_state_dict(self, sd: dict[str, np.ndarray]) -> None:
        self.engine.load_full_state_dict(sd)

    def full_grads(self) -> dict[str, np.ndarray]:
        return self.engine.full_grads()

    def local_state(self) -> LocalState:
        return self.engine.local_state()

    def remove_hooks(self) -> None:
        self.engine.remove_hooks()

    @property
    def lr(self) -> float:
        return self.engine.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.engine.lr = value

    @property
    def last_grad_norm(self) -> Optional[float]:
        return self.engine.last_grad_norm

    @property
    def steps(self) -> int:
        return self.engine.steps

    def __repr__(self) -> str:
        return f"FullyShardedDataParallel({self.sharding_strategy.name}, {self.engine!r})"


def zero_engine(model, optimizer_cls: type = AdamW, *, stage: int, **kwargs) -> DataParallelEngine:
    """ZeRO by stage number: 0 = DistributedDataParallel, 1-2 = ZeroEngine, 3 = Zero3Engine.

    kwargs go to the engine (process_group, max_grad_norm, the optimizer's hyperparameters;
    bucket_cap_mb for stage 0; reshard_after_forward, forward_prefetch, backward_prefetch,
    prefetch_depth, limit_all_gathers for stage 3).
    """
    if stage == 0:
        return DistributedDataParallel(model, optimizer_cls, **kwargs)
    if stage in (1, 2):
        return ZeroEngine(model, optimizer_cls, stage=stage, **kwargs)
    if stage == 3:
        return Zero3Engine(model, optimizer_cls, **kwargs)
    raise ValueError(f"ZeRO stages are 0 (DDP), 1 (optimizer states), 2 (+ gradients) and "
                     f"3 (+ parameters); got stage={stage!r}")
