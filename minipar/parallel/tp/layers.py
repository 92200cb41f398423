"""Tensor-parallel linear layers: Y = X W^T with W split by rows (outputs) or columns (inputs).

Megatron-LM (Shoeybi et al. 2019, section 3). With W: [out, in] on t ranks, rank r holds

    ColumnParallelLinear   W_r = W[r·out/t : (r+1)·out/t, :]   [out/t, in]
        y_r = f(x) W_r^T + b_r                                  [s, b, out/t]
        f: identity in forward, all-reduce of dx in backward
           (sequence parallel: all-gather of x in forward, reduce-scatter of dx in backward)
        gather_output=True all-gathers y_r into y [s, b, out]

    RowParallelLinear      W_r = W[:, r·in/t : (r+1)·in/t]     [out, in/t]
        y = g(x_r W_r^T) + b                                    [s, b, out]
        g: all-reduce in forward, identity in backward
           (sequence parallel: reduce-scatter to [s/t, b, out] in forward, all-gather of dy
           in backward); the bias is added once, after the reduction
        input_is_parallel=False first splits a whole x [s, b, in] into x_r

so an MLP, Y = GeLU(X A^T) B^T, runs as column(A) → GeLU → row(B): each rank computes its
slice of GeLU's input with no communication, because GeLU is elementwise, and one
all-reduce per block in forward (g) and one in backward (f) restore the full result.

Every shard is the matching slice of the full-shape initialisation from (seed, name), as
Megatron's `_initialize_affine_weight_cpu` builds the master weight and splits it, so a
tensor-parallel model starts from exactly the single-device weights. A shard keeps the
full parameter's name and is tagged `tensor_model_parallel = True`, `partition_dim`.

With sequence parallelism, ColumnParallelLinear saves its *sequence-sharded* input x_r
[s/t, b, in] and all-gathers it again in backward for the weight gradient, as Megatron does
(the 34/t in Korthikanti et al.'s formula relies on it): one more all-gather per column-
parallel layer in backward, in exchange for (t-1)/t of the input's memory.

Split backward (nn/weight_grads.py; Qi et al. 2023). With a `store`, a layer's backward is
I now and W later, the collectives each needs placed with it:

    ColumnParallelLinear  I: dx = f'(dy W_r) (all-reduce; SP: reduce-scatter)
                          W: dW_r = dy^T x, db_r; under SP the all-gather of x runs in W,
                             so I's critical path carries no wgrad traffic, and the record
                             holds x_r [s/t, b, in], not the gathered x
    RowParallelLinear     I: db (a reduction of this rank's dy, [out]), g'(dy) (SP: the
                             all-gather of dy), dx_r = dy W_r
                          W: dW_r = dy^T x_r from the gathered dy the record holds; db into
                             the bias (SP: into sp_grads, all-reduced at the unit's end)
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...nn.linear import (add_bias, linear_backward_input, linear_backward_weight,
                         linear_forward)
from ...nn.matmul import compute_dtype
from ...nn.module import Module
from ...nn.parameter import Parameter, init_normal
from ...nn.saved import Saved
from ...nn.weight_grads import WeightGradStore
from ...runtime.collectives import all_gather
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .mappings import (copy_to_tensor_model_parallel_region,
                       gather_from_sequence_parallel_region,
                       gather_from_tensor_model_parallel_region,
                       reduce_from_tensor_model_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_tensor_model_parallel_region)
from .sequence import SequenceParallelGrads, mark_sequence_parallel


def divide(n: int, t: int, what: str, fix: str) -> int:
    """n / t, or a ValueError saying what cannot be split and how to change it."""
    if n % t:
        raise ValueError(f"{what} = {n} cannot be split across tensor-parallel size {t} "
                         f"({n} % {t} = {n % t}); {fix}")
    return n // t


def shard(full: np.ndarray, dim: int, rank: int, size: int) -> np.ndarray:
    """Part `rank` of `size` equal parts of `full` along `dim` (a contiguous copy)."""
    n = full.shape[dim] // size
    index = [slice(None)] * full.ndim
    index[dim] = slice(rank * n, (rank + 1) * n)
    return np.ascontiguousarray(full[tuple(index)])


def tensor_parallel_parameter(name: str, full: np.ndarray, dim: int,
                              group: ProcessGroup) -> Parameter:
    """This rank's shard of the full array `full`, split along `dim` over `group`; tagged as
    Megatron tags it (tensor_model_parallel, partition_dim), plus which of how many shards it
    is (partition_index of partition_count), so a checkpoint can place it in the full array."""
    r = group.group_rank(current().rank)
    p = Parameter(name, shard(full, dim, r, group.size))
    p.tensor_model_parallel, p.partition_dim = True, dim
    p.partition_index, p.partition_count = r, group.size
    return p


def gather_parameter(p: Parameter, group: ProcessGroup, grad: bool = False) -> np.ndarray:
    """The full array of a (possibly) tensor-parallel parameter or its gradient, on every
    rank of `group` (a collective for sharded parameters)."""
    x = p.grad if grad else p.data
    if not getattr(p, "tensor_model_parallel", False) or group.size == 1:
        return x
    return all_gather(x, axis=p.partition_dim, group=group)


class ColumnParallelLinear(Module):
    """y_r = f(x) W_r^T + b_r with W split along the outputs.  x: [s, b, in] (sequence
    parallel: [s/t, b, in]) -> y_r: [s, b, out/t] (gather_output: [s, b, out])."""

    parameter_order = ("weight", "bias")  # weight: None when passed to forward (tied)

    def __init__(self, name: str, in_features: int, out_features: int, group: ProcessGroup,
                 bias: bool = True, gather_output: bool = False, skip_bias_add: bool = False,
                 sequence_parallel: bool = False, seed: int = 0, dtype=np.float64,
                 std: float = 0.02, skip_weight_param_allocation: bool = False):
        """skip_weight_param_allocation: the weight is passed to forward/backward instead
        (an output layer tied to a VocabParallelEmbedding, whose shard is [V/t, h])."""
        t = group.size
        self.name, self.group = name, group
        self.out_per_rank = divide(out_features, t, f"{name}: out_features",
                                   "choose a size divisible by the tensor-parallel size")
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        self.sequence_parallel = sequence_parallel
        if sequence_parallel and gather_output:
            raise ValueError(f"{name}: gather_output=True with sequence_parallel=True is not "
                             "supported (Megatron refuses it too); keep the output parallel")
        self.weight = None
        if not skip_weight_param_allocation:
            full = init_normal(f"{name}.weight", (out_features, in_features), std, seed, dtype)
            self.weight = tensor_parallel_parameter(f"{name}.weight", full, 0, group)
        self.bias = (tensor_parallel_parameter(f"{name}.bias", np.zeros(out_features, dtype),
                                               0, group) if bias else None)

    def forward(self, x: np.ndarray, weight: Optional[Parameter] = None):
        """(y_r, bias or None), saved.  The bias comes back unadded with skip_bias_add, for
        the caller to fuse (Megatron's bias-GeLU / bias-dropout-add)."""
        if self.sequence_parallel:
            x_total = gather_from_sequence_parallel_region.forward(x, self.group)  # [s, b, in]
        else:
            x_total = copy_to_tensor_model_parallel_region.forward(x, self.group)  # [s, b, in]
        w = self._weight(weight)
        add = self.bias is not None and not self.skip_bias_add
        y, s_lin = linear_forward(x_total, w.data,
                                  self.bias.data if add else None, label=self.name)
        if self.sequence_parallel:  # keep x_r [s/t, b, in], gather it again in backward
            s_lin.release()
            s_lin = Saved(self.name, x=x, label=self.name)
        if self.gather_output:
            y = gather_from_tensor_model_parallel_region.forward(y, self.group)  # [s, b, out]
        out_bias = self.bias.data if (self.bias is not None and self.skip_bias_add) else None
        return (y, out_bias), s_lin  # y: [s, b, out/t]

    def _weight(self, weight: Optional[Parameter]) -> Parameter:
        if (weight is None) == (self.weight is None):
            raise ValueError(f"{self.name}: pass weight= exactly when the layer was built "
                             "with skip_weight_param_allocation=True")
        return weight if weight is not None else self.weight

    def backward(self, dy: np.ndarray, saved: Saved, weight: Optional[Parameter] = None,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx = f'(dy W_r): partial sums all-reduced (SP: reduce-scattered); accumulates
        dW_r = dy^T x and db_r (also with skip_bias_add: the bias was added by the caller),
        with a `store` at its W.
        dy: [s, b, out/t] (gather_output: [s, b, out]) -> dx: [s, b, in] ([s/t, b, in])"""
        if self.gather_output:
            dy = gather_from_tensor_model_parallel_region.backward(dy, self.group)
        w = self._weight(weight)
        if store is None:
            x = self._total_input(saved.x)  # x: [s, b, in]
            dx_partial = linear_backward_input(dy, w.data, self.name)  # [s, b, in]
            dw, db = linear_backward_weight(dy, x, self.bias is not None, self.name)
            saved.release()
            self._accumulate(w, dw, db)
        else:
            dx_partial = linear_backward_input(dy, w.data, self.name)  # [s, b, in]
            store.put(lambda r: self._accumulate(w, *linear_backward_weight(
                r.dy, self._total_input(r.forward.x), self.bias is not None, self.name)),
                Saved(f"{self.name}.wgrad", dy=dy, forward=saved))
        if self.sequence_parallel:
            return gather_from_sequence_parallel_region.backward(dx_partial, self.group)
        return copy_to_tensor_model_parallel_region.backward(dx_partial, self.group)

    def _total_input(self, x: np.ndarray) -> np.ndarray:
        """The input the weight saw: x, or under SP x_r all-gathered ([s/t, b, in] ->
        [s, b, in])."""
        if self.sequence_parallel and self.group.size > 1:
            return all_gather(x, axis=0, group=self.group)
        return x

    def _accumulate(self, w: Parameter, dw: np.ndarray, db: Optional[np.ndarray]) -> None:
        """dW_r and db_r into the parameters."""
        w.accumulate(dw)
        if self.bias is not None:
            self.bias.accumulate(db)


class RowParallelLinear(Module):
    """y = g(x_r W_r^T) + b with W split along the inputs.  x_r: [s, b, in/t] -> y:
    [s, b, out] (sequence parallel: [s/t, b, out])."""

    parameter_order = ("weight", "bias")

    def __init__(self, name: str, in_features: int, out_features: int, group: ProcessGroup,
                 bias: bool = True, input_is_parallel: bool = True, skip_bias_add: bool = False,
                 sequence_parallel: bool = False, seed: int = 0, dtype=np.float64,
                 std: float = 0.02, sp_grads: Optional[SequenceParallelGrads] = None):
        t = group.size
        self.name, self.group = name, group
        self.in_per_rank = divide(in_features, t, f"{name}: in_features",
                                  "choose a size divisible by the tensor-parallel size")
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        self.sequence_parallel = sequence_parallel
        if sequence_parallel and not input_is_parallel:
            raise ValueError(f"{name}: sequence_parallel=True needs input_is_parallel=True")
        if sequence_parallel and bias and sp_grads is None:
            raise ValueError(f"{name}: under sequence parallelism the bias gradient is a "
                             "partial sum; pass sp_grads=SequenceParallelGrads(tp_group)")
        full = init_normal(f"{name}.weight", (out_features, in_features), std, seed, dtype)
        self.weight = tensor_parallel_parameter(f"{name}.weight", full, 1, group)
        self.bias = Parameter(f"{name}.bias", np.zeros(out_features, dtype)) if bias else None
        self.sp_grads = sp_grads if sequence_parallel else None
        if self.bias is not None and self.sp_grads is not None:
            mark_sequence_parallel(self.bias)

    def forward(self, x: np.ndarray):
        """(y, bias or None), saved: partial products reduced, then the bias added once."""
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region.forward(x, self.group)  # [s, b, in/t]
        y_partial, s_lin = linear_forward(x, self.weight.data, None, label=self.name)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region.forward(y_partial, self.group)
        else:
            y = reduce_from_tensor_model_parallel_region.forward(y_partial, self.group)
        if self.bias is not None and not self.skip_bias_add:
            y = add_bias(y, self.bias.data)  # y: [s, b, out] ([s/t, b, out]), a new array
        out_bias = self.bias.data if (self.bias is not None and self.skip_bias_add) else None
        return (y, out_bias), s_lin

    def backward(self, dy: np.ndarray, saved: Saved,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx_r = g'(dy) W_r; accumulates dW_r and db (SP: db is partial, all-reduced via
        sp_grads), with a `store` at its W.
        dy: [s, b, out] ([s/t, b, out]) -> dx: [s, b, in/t] ([s, b, in])"""
        db = None
        if self.bias is not None:
            tokens = tuple(range(dy.ndim - 1))
            db = dy.sum(axis=tokens, dtype=compute_dtype(dy.dtype)).astype(
                self.bias.data.dtype)  # db: [out]
            if store is None:
                self._bias_grad(db)
        if self.sequence_parallel:
            dy = reduce_scatter_to_sequence_parallel_region.backward(dy, self.group)
        else:
            dy = reduce_from_tensor_model_parallel_region.backward(dy, self.group)
        dx = linear_backward_input(dy, self.weight.data, self.name)  # dx: [s, b, in/t]
        if store is None:
            dw, _ = linear_backward_weight(dy, saved.x, False, self.name)
            saved.release()
            self.weight.accumulate(dw)
        else:
            keep = {"db": db} if db is not None else {}
            store.put(self._deferred, Saved(f"{self.name}.wgrad", dy=dy, forward=saved, **keep))
        if not self.input_is_parallel:
            dx = scatter_to_tensor_model_parallel_region.backward(dx, self.group)
        return dx

    def _bias_grad(self, db: np.ndarray) -> None:
        if self.sp_grads is not None:
            self.sp_grads.add(self.bias, db)
        else:
            self.bias.accumulate(db)

    def _deferred(self, record: Saved) -> None:
        """W: dW_r = dy^T x_r (dy: [s, b, out], after g'), then the bias's db that I
        reduced."""
        dw, _ = linear_backward_weight(record.dy, record.forward.x, False, self.name)
        self.weight.accumulate(dw)
        if self.bias is not None:
            self._bias_grad(record.db)
