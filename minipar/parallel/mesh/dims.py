"""ParallelDims: how many ranks each parallel dimension takes, and how ranks are laid out.

    world_size = dp_replicate x dp_shard x cp x tp x pp          (ep is folded into dp x cp)

(torchtitan's `ParallelDims`; Megatron-LM's `RankGenerator`.) The six sizes:

    dp_replicate  data-parallel replicas: gradients all-reduced across them (DDP; the
                  "replicate" dimension of HYBRID_SHARD)
    dp_shard      data-parallel ranks among which ZeRO / FSDP partition their states
    tp            Megatron tensor parallelism (+ sequence parallelism on the same group)
    pp            pipeline stages (parallelize builds each rank's stages and a runner)
    cp            context parallelism: the sequence split through attention (ring or
                  Ulysses; mesh/context.py), gradients averaged over dp x cp
    ep            expert parallelism, folded into dp x cp: a mixture of experts' experts
                  spread over ep ranks (mesh/experts.py)

Rank order. Megatron spells a layout fastest dimension first, `order="tp-cp-ep-dp-pp"`: tp
varies fastest, so a tensor-parallel group holds consecutive ranks and sits inside a node;
pp varies slowest. PyTorch's `init_device_mesh(shape, mesh_dim_names)` spells the same
layout slowest first, the last dimension fastest:

    Megatron   order = "tp-cp-ep-dp-pp"
    PyTorch    init_device_mesh((pp, dp_replicate, dp_shard, cp, tp),
                                ("pp", "dp_replicate", "dp_shard", "cp", "tp"))

`dp` in the order string stands for both data-parallel dimensions, dp_shard inside
dp_replicate (HYBRID_SHARD shards inside a node, replicates across nodes). `ep` is not a
dimension of its own: Megatron folds expert parallelism into the data- and context-parallel
ranks, so ep must divide dp x cp. A dimension of size 1 may be left out of the order, as
Megatron allows; it is then placed slowest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...runtime.checks import MAX_RANKS, divisors

#: Megatron-LM's default order, fastest first
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
_ORDER_NAMES = ("tp", "cp", "ep", "dp", "pp")
#: the dimensions parallelize can build so far; the others it accepts at size 1 only
IMPLEMENTED = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class ParallelDims:
    """`ParallelDims(dp_replicate=1, dp_shard=1, pp=1, tp=1, cp=1, ep=1)`, validated."""

    dp_replicate: int = 1
    dp_shard: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = DEFAULT_ORDER
    #: the torch spelling: dimension names slowest first (init_device_mesh's mesh_dim_names)
    mesh_dim_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, v in self.sizes().items():
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"ParallelDims({name}={v!r}): every size must be a positive "
                                 f"integer (1 means the dimension is not used)")
            object.__setattr__(self, name, int(v))  # a NumPy integer becomes an int
        sizes = self.sizes()
        if self.world_size > MAX_RANKS:
            raise ValueError(f"{self} covers {self.world_size} ranks, more than minipar lays "
                             f"out ({MAX_RANKS}); is one of the sizes a typo?")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(
                f"ParallelDims(ep={self.ep}) must divide dp x cp = {self.dp} x {self.cp} = "
                f"{self.dp * self.cp}: expert parallelism is folded into the data- and "
                f"context-parallel ranks (Megatron); choose ep in "
                f"{divisors(self.dp * self.cp)}")
        object.__setattr__(self, "mesh_dim_names", _mesh_dim_names(self.order, sizes))

    # ---- sizes ------------------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """{dimension: size}, in the constructor's order."""
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "pp": self.pp,
                "tp": self.tp, "cp": self.cp, "ep": self.ep}

    @property
    def dp(self) -> int:
        """All data-parallel ranks: dp_replicate x dp_shard (each trains on its own batch)."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """Sizes of `mesh_dim_names`, slowest first: init_device_mesh(mesh_shape, names)."""
        return tuple(getattr(self, n) for n in self.mesh_dim_names)

    def check_implemented(self) -> None:
        """Refuse a size > 1 of a form minipar cannot build yet (the layout itself is valid:
        its groups can be built and planned with)."""
        for name, v in self.sizes().items():
            if name not in IMPLEMENTED and v > 1:
                raise ValueError(
                    f"{self}: {_FORM[name]} has not landed in minipar yet, so {name}={v} "
                    f"cannot be trained; it is accepted at {name}=1 only. Compose "
                    f"{', '.join(IMPLEMENTED)} for now")

    def check_world(self, world_size: int, rank: int) -> None:
        """Refuse a world these dims do not cover, naming both products."""
        if world_size != self.world_size:
            terms = " x ".join(f"{n}={getattr(self, n)}" for n in self.mesh_dim_names)
            raise ValueError(
                f"rank {rank}: {self} covers {self.world_size} ranks ({terms}), but the world has "
                f"{world_size}: launch {self.world_size} ranks, or choose sizes whose product "
                f"is {world_size}")

    def __str__(self) -> str:
        used = [f"{n}={v}" for n, v in self.sizes().items() if v > 1]
        order = "" if self.order == DEFAULT_ORDER else f", order={self.order!r}"
        return f"ParallelDims({', '.join(used) or 'one rank'}{order})"


_FORM = {"cp": "context parallelism", "ep": "expert parallelism"}


def _mesh_dim_names(order: str, sizes: dict[str, int]) -> tuple[str, ...]:
    """Megatron's order string (fastest first) -> the mesh's dimension names, slowest first."""
    if not isinstance(order, str):
        raise ValueError(f"order must be a string like {DEFAULT_ORDER!r}, got {order!r}")
    names = order.split("-")
    unknown = [n for n in names if n not in _ORDER_NAMES]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"order {order!r} must list distinct dimensions from "
                         f"{'-'.join(_ORDER_NAMES)} fastest first, e.g. {DEFAULT_ORDER!r}; got "
                         f"{'unknown ' + str(unknown) if unknown else 'a repeated dimension'}")
    size = {"tp": sizes["tp"], "cp": sizes["cp"], "ep": sizes["ep"], "pp": sizes["pp"],
            "dp": sizes["dp_replicate"] * sizes["dp_shard"]}
    missing = [n for n in _ORDER_NAMES if n not in names and size[n] > 1]
    if missing:
        raise ValueError(f"order {order!r} leaves out {missing}, whose size is > 1; list every "
                         f"dimension that is used, fastest first, e.g. {DEFAULT_ORDER!r}")
    fastest_first = names + [n for n in _ORDER_NAMES if n not in names]
    out: list[str] = []
    for n in reversed(fastest_first):  # slowest first
        if n == "dp":
            out += ["dp_replicate", "dp_shard"]  # shard inside replicate
        elif n != "ep":  # folded into dp x cp, not a dimension of the mesh
            out.append(n)
    return tuple(out)
