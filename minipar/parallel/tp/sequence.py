"""Sequence parallelism: LayerNorm and dropout on 1/t of the sequence, and the gradients
this leaves partial.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.2.2). Between the tensor-parallel blocks, tensor parallelism keeps the residual
stream [s, b, h] whole on every rank: LayerNorm, dropout and the residual add run t times
over the same data, and their saved inputs (10 sbh bytes per layer in 16-bit) are not
divided by t. Sequence parallelism splits that stream along s:

    x_r [s/t, b, h] ─ LayerNorm ─ all-gather (f̄) ─ column-parallel ... row-parallel ─
                    reduce-scatter (ḡ) ─ dropout ─ + x_r ─► [s/t, b, h]

Parameters replicated across the tensor-parallel group but applied to sequence shards —
LayerNorm's gamma and beta, the row-parallel biases — now see only 1/t of the tokens on
each rank, so each rank's gradient is a partial sum:

    dgamma = sum over ranks r of (sum over rank r's tokens of dy * xhat)   -> all-reduce

Megatron-LM tags these parameters `sequence_parallel = True` and all-reduces their
gradients across the tensor-parallel group after the backward (`finalize_model_grads`).
Here each layer hands its new gradient to a `SequenceParallelGrads` collector, and the
model flushes it at the end of every unit's backward — one all-reduce of the concatenated
gradients per unit — before the unit's backward_post hook, so data-parallel engines see
complete gradients. Without that all-reduce the replicas drift apart
(tests/parallel/tp/test_sequence_parallel.py removes it and watches the equivalence fail).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...nn.layernorm import LayerNorm
from ...nn.parameter import Parameter
from ...runtime.collectives import all_reduce
from ...runtime.group import ProcessGroup


class SequenceParallelGrads:
    """Gradients of sequence-parallel parameters, held until one all-reduce over tp."""

    def __init__(self, group: ProcessGroup):
        self.group = group
        self.pending: list[tuple[Parameter, np.ndarray]] = []

    def add(self, param: Parameter, grad: np.ndarray) -> None:
        """Hold this rank's partial gradient of a replicated parameter."""
        self.pending.append((param, grad))

    def flush(self) -> None:
        """dparam = sum over the tp group of the partial gradients; then accumulate."""
        if not self.pending:
            return
        flat = np.concatenate([g.reshape(-1) for _, g in self.pending])  # flat: [sum of sizes]
        if self.group.size > 1:
            flat = all_reduce(flat, "sum", group=self.group)
        offset = 0
        for param, g in self.pending:
            param.accumulate(flat[offset:offset + g.size].reshape(g.shape))
            offset += g.size
        self.pending.clear()


def mark_sequence_parallel(param: Parameter) -> Parameter:
    """Tag a replicated parameter whose gradient is partial under sequence parallelism."""
    param.sequence_parallel = True
    return param


class SequenceParallelLayerNorm(LayerNorm):
    """LayerNorm over the local sequence shard x_r [s/t, b, h]; gamma and beta's gradients
    go to `grads` (all-reduced over tp) instead of straight into the parameters.
    With `grads=None` it is the plain LayerNorm (tensor parallelism without SP)."""

    def __init__(self, name: str, hidden: int, eps: float, dtype,
                 grads: Optional[SequenceParallelGrads]):
        super().__init__(name, hidden, eps, dtype)
        self.grads = grads
        if grads is not None:
            for p in self.parameters():
                mark_sequence_parallel(p)

    def accumulate(self, dgamma: np.ndarray, dbeta: np.ndarray) -> None:
        """This rank's partial dgamma, dbeta to the collector (at W in a split backward)."""
        if self.grads is None:
            return super().accumulate(dgamma, dbeta)
        self.grads.add(self.weight, dgamma)
        self.grads.add(self.bias, dbeta)
