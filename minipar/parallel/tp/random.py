"""Dropout masks under tensor parallelism: mask_rank = (the single-device mask)[rank's slice].

Megatron-LM (Shoeybi et al. 2019, section 3; `tensor_parallel/random.py`) keeps two
generator states per GPU:

    default state           the same seed on every tensor-parallel rank: dropout in
                            *replicated* regions (the residual stream after the all-reduce)
                            draws identical masks everywhere, as it must, since the ranks
                            hold identical activations
    "model-parallel-rng"    seed + 2718 + tp_rank, entered with `get_cuda_rng_tracker().fork()`:
                            dropout in *sharded* regions (attention probabilities split by
                            head; with sequence parallelism, the residual stream split by
                            sequence) draws a different mask on every rank

Megatron's sharded masks are different from each other but from no single-device run. Here
the sharded draw is a slice of the single-device draw instead, which keeps both properties
(replicated: identical; sharded: different) and adds a third — the masks equal the ones
the single-device model draws, so equivalence tests can run with dropout on:

    single device:   mask = rng.random(full_shape) >= p     one draw of prod(full_shape) values
    rank r:          mask_r = mask[slice_r]                 drawn directly: the generator
                     skips ahead to each contiguous run of slice_r (PCG64.advance), draws it,
                     and finally moves past the whole full-shape draw

so the next draw starts where the single-device generator's would. A counter-based
generator (Philox, which GPU dropout kernels use) allows the same offset trick.

With data parallelism too, each rank holds a block of the global batch (split_data_parallel),
and the batch axis is sliced the same way: the masks equal those of one device running the
global batch. Which block is a question of the mesh, not of tensor parallelism: the
composition home (parallel/mesh) answers it as `batch_shard = (index, count)` and passes it in. `TensorParallelRNG.replicated(...)` and `.sharded(...)` hand out generator-like
objects with `random(shape)`, which is all `nn.dropout_forward` calls.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def check_batch_shard(batch_shard) -> tuple[int, int]:
    """(index, count) with 0 <= index < count, or a ValueError saying what to pass."""
    try:
        index, count = (int(v) for v in batch_shard)
        ok = 0 <= index < count and tuple(batch_shard) == (index, count)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"batch_shard must be (index, count) with 0 <= index < count: this "
                         f"rank's block of the global batch, as ParallelGroups.batch_shard "
                         f"gives it; got {batch_shard!r}")
    return index, count


class SlicedDraw:
    """A generator-like view: random(local_shape) = base.random(full_shape)[slices]."""

    def __init__(self, base: np.random.Generator, cuts: dict[int, tuple[int, int]]):
        """cuts: {axis: (index, parts)} — along `axis` keep part `index` of `parts` equal parts."""
        if not isinstance(base.bit_generator, np.random.PCG64):
            raise TypeError(f"sliced dropout draws skip ahead with PCG64.advance; got a "
                            f"{type(base.bit_generator).__name__} generator: build it with "
                            "np.random.default_rng(seed)")
        self.base, self.cuts = base, {a: c for a, c in cuts.items() if c[1] > 1}

    def random(self, shape) -> np.ndarray:
        """The local block of a uniform [0, 1) draw over the full shape.  shape: local."""
        shape = tuple(np.atleast_1d(shape).tolist()) if not isinstance(shape, tuple) else shape
        if not self.cuts:
            return self.base.random(shape)
        full = list(shape)
        for axis, (_, parts) in self.cuts.items():
            full[axis] *= parts
        ranges = [(0, n) for n in shape]
        for axis, (index, parts) in self.cuts.items():
            ranges[axis] = (index * shape[axis], (index + 1) * shape[axis])
        out = self._runs(tuple(full), ranges, shape)
        self.base.bit_generator.advance(int(np.prod(full)))  # past the whole full draw
        return out

    def _runs(self, full: tuple, ranges: list, shape: tuple) -> np.ndarray:
        """Draw the block `ranges` of a row-major full-shape draw, run by contiguous run."""
        inner = max(self.cuts)  # the innermost cut axis: below it every axis is whole
        run = (ranges[inner][1] - ranges[inner][0]) * int(np.prod(full[inner + 1:]))
        strides = np.cumprod((full[1:] + (1,))[::-1])[::-1]  # row-major element strides
        g = np.random.Generator(np.random.PCG64())
        g.bit_generator.state = self.base.bit_generator.state
        out = np.empty((int(np.prod(shape[:inner])), run))
        pos = 0
        for i, idx in enumerate(np.ndindex(*shape[:inner])):
            offset = sum((ranges[d][0] + idx[d]) * int(strides[d]) for d in range(inner))
            offset += ranges[inner][0] * int(strides[inner])
            g.bit_generator.advance(offset - pos)
            out[i] = g.random(run)
            pos = offset + run
        return out.reshape(shape)


class TensorParallelRNG:
    """The dropout generators of one rank: replicated regions and tensor-parallel shards.

    generator:    the single-device model's generator, in the same state on every rank
    batch_shard:  (index, count): this rank's tokens are block `index` of `count` equal
                  blocks of the global batch (data parallelism); (0, 1): the whole batch
    """

    def __init__(self, generator: np.random.Generator, tp_rank: int = 0, tp_size: int = 1,
                 batch_shard: tuple[int, int] = (0, 1)):
        self.generator = generator
        self.tp = (tp_rank, tp_size)
        self.batch = check_batch_shard(batch_shard)

    def replicated(self, batch_axis: Optional[int]):
        """Identical on every tensor-parallel rank (Megatron's default state); only the
        data-parallel batch block is sliced out."""
        if self.batch[1] == 1 or batch_axis is None:
            return self.generator
        return SlicedDraw(self.generator, {batch_axis: self.batch})

    def sharded(self, axis: int, batch_axis: Optional[int]):
        """Rank tp_rank's slice along `axis` (Megatron's `fork()` into the model-parallel
        state): different on every tensor-parallel rank."""
        cuts = {axis: self.tp}
        if batch_axis is not None and self.batch[1] > 1:
            cuts[batch_axis] = self.batch
        return SlicedDraw(self.generator, cuts)
