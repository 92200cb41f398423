"""A flat parameter: one unit's parameters laid end to end in one 1-D buffer, cut into N shards.

    flat   = concat(p_0.ravel(), p_1.ravel(), ..., p_{k-1}.ravel(), zeros(pad))
    numel  = sum_i p_i.size
    padded = ceil(numel / N) * N          pad = padded - numel, 0 <= pad < N
    shard  = padded / N                   rank r owns flat[r*shard : (r+1)*shard]

Each parameter is a *view* of the buffer (`p.data = flat[o:o+n].reshape(shape)`), so one
collective moves a whole unit, and backward accumulating into views of a gradient buffer
fills that buffer in place. This is PyTorch FSDP's FlatParameter (Zhao et al. 2023, "PyTorch
FSDP: Experiences on Scaling Fully Sharded Data Parallel", section 3.2) and the flat
partitions of DeepSpeed ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 5).

Padding. `reduce_scatter` splits a buffer into N equal chunks and `all_gather` needs equal
blocks, so the buffer ends with `pad` zeros. The padding is real memory and real traffic:
it is charged on the ledger wherever the buffer or a shard of it is held, and it travels in
every all_gather and reduce_scatter. So every memory and traffic formula of ZeRO holds with

    Psi' = sum over units of padded    (at most N - 1 extra elements per unit)

in place of Psi. Padding is zero in parameters, gradients and optimizer states; no optimizer
ever updates it, and a parameter never sees it.

A parameter whose storage is sharded away (ZeRO-3) gets a size-0 array as its `data`, as
FSDP frees a parameter's storage: any use while sharded fails with a shape error instead of
reading stale values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...nn.parameter import Parameter


@dataclass(frozen=True)
class Segment:
    """Where one rank's shard meets one parameter, in flat coordinates.

    flat[start:stop] holds elements [start - offset, stop - offset) of parameter `name`
    (raveled), and elements [start - lo, stop - lo) of the shard that begins at flat[lo].
    """

    name: str
    start: int
    stop: int
    offset: int


@dataclass(frozen=True)
class FlatShard:
    """One rank's shard of a unit's flat buffers: shard i of `flat`'s N is, for each kind,

        arrays[kind] = buffer_of_kind[i*S : (i+1)*S]        S = flat.shard_numel   # [S]

    kinds: "param" (the weights, in the parameters' dtype), Adam's "m" and "v", and the
    float32 "master" of a 16-bit model. Padding (the last shard's end) is zero in all.
    """

    flat: "FlatParameter"
    arrays: dict[str, np.ndarray]


class FlatParameter:
    """The layout of one unit's parameters in a padded flat buffer shared by `world` ranks.

    unit:   the unit's name ("root", "blocks.0", ...), used in ledger names and errors
    params: the unit's parameters, in the order they are laid out
    world:  N, the number of ranks the buffer is sharded over (1: no sharding, no padding)
    """

    def __init__(self, unit: str, params: Sequence[Parameter], world: int):
        if not isinstance(world, int) or world < 1:
            raise ValueError(f"FlatParameter({unit!r}): world must be a positive integer, "
                             f"got {world!r}")
        if not params:
            raise ValueError(f"FlatParameter({unit!r}) got no parameters; a unit with "
                             "nothing to shard cannot be flattened")
        dtypes = {p.data.dtype for p in params}
        if len(dtypes) != 1:
            found = {p.name: str(p.data.dtype) for p in params}
            raise TypeError(f"unit {unit!r} mixes parameter dtypes {found}; one flat buffer "
                            "holds one dtype: build the model in a single dtype")
        self.unit = unit
        self.params = list(params)
        self.world = world
        self.dtype = dtypes.pop()
        self.shapes = [tuple(p.shape) for p in self.params]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = [int(o) for o in np.cumsum([0] + self.sizes[:-1])]
        self.numel = int(sum(self.sizes))
        self.padded_numel = -(-self.numel // world) * world  # ceil(numel / N) * N
        self.padding = self.padded_numel - self.numel
        self.shard_numel = self.padded_numel // world
        self._empty = np.empty(0, dtype=self.dtype)  # what a sharded-away parameter holds

    # ---- layout ---------------------------------------------------------------------
    def shard_range(self, rank: int) -> tuple[int, int]:
        """[lo, hi) of rank `rank`'s shard in the flat buffer (rank = position in the group)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"unit {self.unit!r}: shard rank {rank} is outside "
                             f"0..{self.world - 1}")
        lo = rank * self.shard_numel
        return lo, lo + self.shard_numel

    def segments(self, rank: int) -> list[Segment]:
        """Every parameter piece inside rank `rank`'s shard, in layout order (padding excluded)."""
        lo, hi = self.shard_range(rank)
        out = []
        for p, off, n in zip(self.params, self.offsets, self.sizes):
            start, stop = max(lo, off), min(hi, off + n)
            if start < stop:
                out.append(Segment(p.name, start, stop, off))
        return out

    def slices(self) -> dict[str, slice]:
        """{parameter name: its slice of the flat buffer}."""
        return {p.name: slice(o, o + n) for p, o, n in zip(self.params, self.offsets, self.sizes)}

    # ---- buffers ------------------------------------------------------------------------
    def flatten(self, dtype=None) -> np.ndarray:
        """A new padded buffer holding the parameters' current values.  -> [padded_numel]"""
        flat = np.zeros(self.padded_numel, dtype=dtype or self.dtype)
        for p, off, n in zip(self.params, self.offsets, self.sizes):
            if p.data.size != n:
                raise ValueError(f"unit {self.unit!r}: {p.name} holds {p.data.size} elements "
                                 f"(shape {p.data.shape}), expected {n}; is it sharded away?")
            flat[off:off + n] = p.data.reshape(-1)
        return flat

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """Each parameter's view of `flat` (no copies).  flat: [padded_numel]"""
        self._check(flat, "views")
        return [flat[o:o + n].reshape(s)
                for o, n, s in zip(self.offsets, self.sizes, self.shapes)]

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """{parameter name: a copy of its values in `flat`}, padding dropped."""
        return {p.name: v.copy() for p, v in zip(self.params, self.views(flat))}

    # ---- pointing the model's parameters at buffers ---------------------------------------
    # `data` is assigned directly, not through Parameter.set_data: the engine, not the
    # parameter, keeps the ledger of these buffers, and a sharded-away parameter changes
    # shape (to size 0) and back, which set_data rightly refuses for ordinary updates.
    def use_data(self, flat: np.ndarray) -> None:
        """Make every parameter's data a view of `flat` (forward then reads the buffer)."""
        for p, v in zip(self.params, self.views(flat)):
            p.data = v

    def free_data(self) -> None:
        """Shard the storage away: every parameter's data becomes a size-0 array."""
        for p in self.params:
            p.data = self._empty

    def use_grads(self, flat: np.ndarray) -> None:
        """Make every parameter's grad a view of `flat`: backward accumulates in place."""
        self._grad_views = self.views(flat)
        for p, v in zip(self.params, self._grad_views):
            p.grad = v

    def drop_grads(self) -> None:
        """Detach the parameters from the gradient buffer (it is about to be freed)."""
        self._grad_views = None
        for p in self.params:
            p.grad = None

    def detached_grads(self) -> list[str]:
        """Names of parameters whose grad is not (any longer) a view of the buffer."""
        views = getattr(self, "_grad_views", None)
        if views is None:
            return [p.name for p in self.params]
        return [p.name for p, v in zip(self.params, views) if p.grad is not v]

    def _check(self, flat: np.ndarray, what: str) -> None:
        if flat.ndim != 1 or flat.shape[0] != self.padded_numel:
            raise ValueError(f"unit {self.unit!r}: {what} needs a flat buffer of shape "
                             f"[{self.padded_numel}] (numel {self.numel} + padding "
                             f"{self.padding}), got {flat.shape}")

    def __repr__(self) -> str:
        return (f"FlatParameter({self.unit}, {len(self.params)} params, numel={self.numel}, "
                f"padded={self.padded_numel}, shard={self.shard_numel} x {self.world}, "
                f"dtype={self.dtype})")
