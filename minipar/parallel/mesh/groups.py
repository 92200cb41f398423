"""ParallelGroups: this rank's process group along every parallel dimension, and its coordinate.

    rank = sum_d coordinate[d] * stride[d]      over dims.mesh_dim_names, the last fastest

(picotron's process-group grid, torchtitan's `ParallelDims.build_mesh`, Megatron's
`parallel_state`.) With the default order on 8 ranks, ParallelDims(dp_shard=2, tp=4):

    tp groups        {0,1,2,3} {4,5,6,7}         consecutive ranks: inside a node
    dp groups        {0,4} {1,5} {2,6} {3,7}     one rank of each tp group

Groups along one mesh dimension (tp, pp, cp, dp_shard, dp_replicate) hold the ranks that
differ only in that coordinate; flattened ones hold the ranks that differ only in several:

    dp      = dp_replicate x dp_shard   every rank that trains on another block of the batch
    dp_cp   = dp x cp                   the ranks a gradient is averaged over under cp
    dp_shard_cp = dp_shard x cp         the ranks ZeRO / FSDP shard over under cp
    model_parallel = tp x pp            the ranks holding the pieces of one model replica,
                                        over which a gradient norm is completed (Megatron's
                                        model-parallel group)
    ep      ep consecutive ranks of dp_cp (Megatron folds expert parallelism into dp x cp)
    edp     the ranks of dp_cp at this rank's place in their ep groups: those holding the
            same experts (Megatron's expert_data_parallel group), dp·cp / ep of them

Making a group is not a collective here (see runtime/group.py), so every rank builds its own
`ParallelGroups(dims)` once, at the start of its program.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...runtime.context import current
from ...runtime.group import ProcessGroup
from ...runtime.mesh import DeviceMesh
from .dims import ParallelDims


class ParallelGroups:
    """`ParallelGroups(dims)`: this rank's groups and coordinate (inside a launched program)."""

    def __init__(self, dims: ParallelDims, rank: Optional[int] = None):
        if not isinstance(dims, ParallelDims):
            raise TypeError(f"ParallelGroups takes a ParallelDims, got {type(dims).__name__}")
        ctx = current()
        if rank is not None and (isinstance(rank, (bool, np.bool_))
                                 or not isinstance(rank, (int, np.integer))
                                 or not 0 <= rank < ctx.world_size):
            raise ValueError(f"ParallelGroups(rank={rank!r}): rank is a global rank of this "
                             f"world of {ctx.world_size}, 0..{ctx.world_size - 1}, or None "
                             f"for the calling rank ({ctx.rank})")
        self.rank = ctx.rank if rank is None else int(rank)
        dims.check_world(ctx.world_size, self.rank)
        self.dims = dims
        #: the torch spelling of the layout: init_device_mesh(dims.mesh_shape, names)
        self.mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
        self.coordinate: dict[str, int] = self.mesh.coordinate(self.rank)
        self.tp = self._group("tp")
        self.pp = self._group("pp")
        self.cp = self._group("cp")
        self.dp_shard = self._group("dp_shard")
        self.dp_replicate = self._group("dp_replicate")
        self.dp = self._group("dp_replicate", "dp_shard", name="dp")
        self.dp_cp = self._group("dp_replicate", "dp_shard", "cp", name="dp_cp")
        self.dp_shard_cp = self._group("dp_shard", "cp", name="dp_shard_cp")
        self.model_parallel = self._group("pp", "tp", name="model_parallel")
        self.ep, self.edp = self._expert_groups()

    # ---- where this rank is --------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        """This rank's index among all data-parallel ranks (replicate-major, shard-minor)."""
        return self.dp.group_rank(self.rank)

    @property
    def batch_shard(self) -> tuple[int, int]:
        """(index, count): this rank trains on block `index` of `count` equal blocks of the
        global batch (split_data_parallel); tp ranks of one group share a block."""
        return self.dp_rank, self.dims.dp

    def rank_of(self, **coordinate: int) -> int:
        """The global rank at this rank's coordinate with the given dimensions changed."""
        c = {**self.coordinate, **coordinate}
        return int(self.mesh.grid[tuple(c[n] for n in self.mesh.mesh_dim_names)])

    # ---- building groups -----------------------------------------------------------------
    def _group(self, *dims: str, name: Optional[str] = None) -> ProcessGroup:
        """Ranks that share this rank's coordinate on every mesh dimension not in `dims`."""
        index = tuple(slice(None) if n in dims else self.coordinate[n]
                      for n in self.mesh.mesh_dim_names)
        ranks = np.asarray(self.mesh.grid[index]).reshape(-1)
        return ProcessGroup(tuple(sorted(int(r) for r in ranks)), name or dims[0],
                            self.dims.world_size)

    def _expert_groups(self) -> tuple[ProcessGroup, ProcessGroup]:
        """(ep, edp): ep consecutive members of this rank's dp_cp group (in its rank order),
        and the members at the same place in the other ep groups."""
        ep, n = self.dims.ep, self.dims.world_size
        members = self.dp_cp.ranks
        i, j = divmod(members.index(self.rank), ep)
        return (ProcessGroup(members[i * ep:(i + 1) * ep], "ep", n),
                ProcessGroup(members[j::ep], "edp", n))

    def __repr__(self) -> str:
        where = ", ".join(f"{n}={c}" for n, c in self.coordinate.items())
        return f"ParallelGroups(rank {self.rank} at {where}; tp {list(self.tp.ranks)}, " \
               f"pp {list(self.pp.ranks)}, dp {list(self.dp.ranks)})"
