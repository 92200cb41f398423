"""Megatron's conjugate mappings: each a forward and the backward that undoes its transpose.

Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", section 3, Figure 3) needs only
two operators, f and g, placed around each parallel block:

                 f                                                  g
    x [s,b,h] ──────► X W1_r  (column-parallel: W1 split by output) ──► Y_r W2_r ──────► y
              identity                     ... GeLU ...               (row-parallel) all-reduce
    dx ◄────────────  dgrad_r                                   ◄──── dy
         all-reduce                                                     identity

    f: identity in forward, all-reduce in backward (each rank's dx is a partial sum)
    g: all-reduce in forward (each rank's y is a partial sum), identity in backward

Sequence parallelism (Korthikanti et al. 2022, section 4.2.2) splits the tensors between
the blocks along the sequence, so g becomes a reduce-scatter and f an all-gather — the
same bytes, since all-reduce = reduce-scatter + all-gather:

    ḡ: reduce-scatter along s in forward, all-gather along s in backward
    f̄: all-gather along s in forward, reduce-scatter along s in backward

Every mapping below is an (forward, backward) pair over the tensor-parallel group; on a
group of one rank both halves are the identity and no collective is issued. Names follow
Megatron-LM's `core/tensor_parallel/mappings.py`:

    mapping                                        forward              backward
    copy_to_tensor_model_parallel_region      (f)  identity             all-reduce
    reduce_from_tensor_model_parallel_region  (g)  all-reduce           identity
    scatter_to_tensor_model_parallel_region        split last dim       all-gather last dim
    gather_from_tensor_model_parallel_region       all-gather last dim  split last dim
    scatter_to_sequence_parallel_region            split first dim      all-gather first dim
    gather_from_sequence_parallel_region      (f̄)  all-gather first dim reduce-scatter first dim
    reduce_scatter_to_sequence_parallel_region(ḡ)  reduce-scatter first all-gather first dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...runtime.collectives import all_gather, all_reduce, reduce_scatter
from ...runtime.context import current
from ...runtime.group import ProcessGroup


@dataclass(frozen=True)
class Mapping:
    """A forward and its backward; both take (array, tensor-parallel group)."""

    name: str
    forward_fn: Callable[[np.ndarray, ProcessGroup], np.ndarray]
    backward_fn: Callable[[np.ndarray, ProcessGroup], np.ndarray]
    doc: str

    def forward(self, x: np.ndarray, group: ProcessGroup) -> np.ndarray:
        return x if group.size == 1 else self.forward_fn(x, group)

    def backward(self, dy: np.ndarray, group: ProcessGroup) -> np.ndarray:
        return dy if group.size == 1 else self.backward_fn(dy, group)

    def __repr__(self) -> str:
        return f"{self.name}: {self.doc}"


def _identity(x: np.ndarray, group: ProcessGroup) -> np.ndarray:
    return x


def _reduce(x: np.ndarray, group: ProcessGroup) -> np.ndarray:
    """sum over the group's ranks.  x: any -> same shape"""
    return all_reduce(x, "sum", group=group)


def _split(x: np.ndarray, group: ProcessGroup, axis: int) -> np.ndarray:
    """This rank's 1/t of x along `axis`, as a contiguous copy.  [.., n, ..] -> [.., n/t, ..]"""
    t, r = group.size, group.group_rank(current().rank)
    n = x.shape[axis]
    if n % t:
        raise ValueError(f"rank {current().rank}: cannot split axis {axis} of shape {x.shape} "
                         f"into {t} equal parts for tensor-parallel group {group}: {n} is not "
                         f"divisible by {t}; make that dimension a multiple of {t}")
    index = [slice(None)] * x.ndim
    index[axis] = slice(r * n // t, (r + 1) * n // t)
    return np.ascontiguousarray(x[tuple(index)])


def _split_last(x, group):
    return _split(x, group, -1)  # [..., n] -> [..., n/t]


def _gather_last(x, group):
    return all_gather(x, axis=x.ndim - 1, group=group)  # [..., n/t] -> [..., n]


def _split_first(x, group):
    return _split(x, group, 0)  # [s, ...] -> [s/t, ...]


def _gather_first(x, group):
    return all_gather(x, axis=0, group=group)  # [s/t, ...] -> [s, ...]


def _reduce_scatter_first(x, group):
    return reduce_scatter(x, "sum", axis=0, group=group)  # [s, ...] partial -> [s/t, ...] summed


copy_to_tensor_model_parallel_region = Mapping(
    "copy_to_tensor_model_parallel_region (f)", _identity, _reduce,
    "identity in forward, all-reduce in backward")
reduce_from_tensor_model_parallel_region = Mapping(
    "reduce_from_tensor_model_parallel_region (g)", _reduce, _identity,
    "all-reduce in forward, identity in backward")
scatter_to_tensor_model_parallel_region = Mapping(
    "scatter_to_tensor_model_parallel_region", _split_last, _gather_last,
    "split the last dim in forward, all-gather it in backward")
gather_from_tensor_model_parallel_region = Mapping(
    "gather_from_tensor_model_parallel_region", _gather_last, _split_last,
    "all-gather the last dim in forward, split it in backward")
scatter_to_sequence_parallel_region = Mapping(
    "scatter_to_sequence_parallel_region", _split_first, _gather_first,
    "split the sequence (first) dim in forward, all-gather it in backward")
gather_from_sequence_parallel_region = Mapping(
    "gather_from_sequence_parallel_region (f-bar)", _gather_first, _reduce_scatter_first,
    "all-gather the sequence dim in forward, reduce-scatter it in backward")
reduce_scatter_to_sequence_parallel_region = Mapping(
    "reduce_scatter_to_sequence_parallel_region (g-bar)", _reduce_scatter_first, _gather_first,
    "reduce-scatter the sequence dim in forward, all-gather it in backward")

MAPPINGS = (copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region,
            scatter_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
            scatter_to_sequence_parallel_region, gather_from_sequence_parallel_region,
            reduce_scatter_to_sequence_parallel_region)
