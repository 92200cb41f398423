"""A device mesh: the world laid out as an n-dimensional grid with named dimensions.

    rank = sum_d coord[d] * stride[d],   stride[last] = 1     (row-major, last dim fastest)

so in `init_device_mesh((2, 4), ("dp", "tp"))` ranks 0..3 form the first tp group, and the
dp groups are {0,4}, {1,5}, {2,6}, {3,7}. PyTorch's `init_device_mesh(shape,
mesh_dim_names=("pp", "dp", "tp"))` spells dimensions slowest-first; Megatron's
`RankGenerator(order="tp-cp-ep-dp-pp")` spells the same layout fastest-first. Both put
tp fastest, which keeps a tensor-parallel group on consecutive ranks, inside one node.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .checks import MAX_RANKS, whole
from .group import ProcessGroup


class DeviceMesh:
    """Named dimensions over ranks 0..prod(shape)-1, last dimension fastest."""

    def __init__(self, shape: Sequence[int], mesh_dim_names: Sequence[str]):
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise TypeError(f"a mesh shape is a tuple of sizes like (2, 4), got "
                            f"{type(shape).__name__} {shape!r}")
        if (isinstance(mesh_dim_names, str) or not hasattr(mesh_dim_names, "__iter__")
                or not all(isinstance(n, str) for n in mesh_dim_names)):
            raise TypeError(f"mesh_dim_names is a tuple of strings like ('dp', 'tp'), got "
                            f"{mesh_dim_names!r}")
        shape = tuple(whole(s, f"mesh dimension {i} of shape {tuple(shape)!r}")
                      for i, s in enumerate(shape))
        names = tuple(mesh_dim_names)
        if len(shape) != len(names):
            raise ValueError(f"mesh shape {shape} has {len(shape)} dimensions but "
                             f"{len(names)} names {names} were given")
        if len(set(names)) != len(names):
            raise ValueError(f"mesh dimension names must be distinct, got {names}")
        if math.prod(shape) > MAX_RANKS:  # Python ints: no overflow
            raise ValueError(f"mesh {shape} covers {math.prod(shape)} ranks, more than "
                             f"minipar lays out ({MAX_RANKS}); is it a typo?")
        self.shape = shape
        self.mesh_dim_names = names
        self.grid = np.arange(int(np.prod(shape))).reshape(shape)  # grid[coord] = rank

    @property
    def size(self) -> int:
        return int(self.grid.size)

    def dim_size(self, name: str) -> int:
        return self.shape[self._axis(name)]

    def coordinate(self, rank: int) -> dict[str, int]:
        """{dim name: index} of `rank` in the mesh."""
        self._check_rank(rank)
        coord = np.unravel_index(rank, self.shape)
        return {n: int(c) for n, c in zip(self.mesh_dim_names, coord)}

    def groups(self, name: str) -> list[ProcessGroup]:
        """Every group along dimension `name`: ranks that differ only in that coordinate."""
        axis = self._axis(name)
        rows = np.moveaxis(self.grid, axis, -1).reshape(-1, self.shape[axis])
        return [ProcessGroup(tuple(int(r) for r in row), name) for row in rows]

    def get_group(self, name: str, rank: int) -> ProcessGroup:
        """The group along dimension `name` that contains `rank`."""
        self._check_rank(rank)
        for g in self.groups(name):
            if rank in g:
                return g
        raise ValueError(f"rank {rank} is not in this mesh of {self.size} ranks")

    def _check_rank(self, rank) -> None:
        if (isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer))
                or not 0 <= rank < self.size):
            raise ValueError(f"rank {rank!r} is not in this mesh of {self.size} ranks "
                             f"(valid ranks are 0..{self.size - 1})")

    def _axis(self, name: str) -> int:
        if name not in self.mesh_dim_names:
            raise KeyError(f"mesh has dimensions {self.mesh_dim_names}, not {name!r}")
        return self.mesh_dim_names.index(name)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.shape))
        return f"DeviceMesh({dims})"
