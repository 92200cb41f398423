# Your file for lesson 04, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 04`.
"""Lesson 04 — tensor and sequence parallelism: the exercises' answers.

Every function runs on each rank of a tensor-parallel group (SPMD, like a Megatron layer):
`group=None` means the whole world. Shapes are per rank, sequence first ([s, b, h]), and
weights are stored [out, in] as in PyTorch, so t = the group's size and r = this rank's
position in it. Use minipar's collectives (`mp.all_reduce(x, "sum", group=group)`, ...).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import minipar as mp
from minipar.nn.layernorm import layernorm_backward
from minipar.nn.saved import Saved


def column_parallel_linear_forward(x: np.ndarray, w_shard: np.ndarray, b_shard: np.ndarray,
                                   group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """y_r = f(x) W_r^T + b_r, where f is the identity in forward.

    x: [s, b, in], the same on every rank; w_shard: [out/t, in] (rows r·out/t ..
    (r+1)·out/t of the full W); b_shard: [out/t] -> y_r: [s, b, out/t]. No communication.
    """
    raise NotImplementedError("Exercise 4.1: the column-parallel linear layer and its f — see lesson.py, section 2")


def column_parallel_linear_backward(dy_shard: np.ndarray, x: np.ndarray, w_shard: np.ndarray,
                                    group: Optional[mp.ProcessGroup] = None
                                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = all_reduce over r of (dy_r W_r) (f's backward); dW_r = dy_r^T x; db_r = Σ dy_r.

    dy_shard: [s, b, out/t], this rank's slice of dL/dy; x: [s, b, in] (the forward's input)
    -> (dx: [s, b, in], the same on every rank; dw_shard: [out/t, in]; db_shard: [out/t])
    """
    raise NotImplementedError("Exercise 4.1: the column-parallel linear layer and its f — see lesson.py, section 2")


def row_parallel_linear_forward(x_shard: np.ndarray, w_shard: np.ndarray, b: np.ndarray,
                                group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """y = g(x_r W_r^T) + b, where g is an all-reduce in forward; the bias is added once.

    x_shard: [s, b, in/t] (e.g. a column-parallel layer's output); w_shard: [out, in/t]
    (columns r·in/t .. (r+1)·in/t of the full W); b: [out], the same on every rank
    -> y: [s, b, out], the same on every rank.
    """
    raise NotImplementedError("Exercise 4.2: the row-parallel linear layer and its g — see lesson.py, section 2")


def row_parallel_linear_backward(dy: np.ndarray, x_shard: np.ndarray, w_shard: np.ndarray,
                                 group: Optional[mp.ProcessGroup] = None
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx_r = g'(dy) W_r with g' the identity; dW_r = dy^T x_r; db = Σ dy.

    dy: [s, b, out], the same on every rank; x_shard: [s, b, in/t] (the forward's input)
    -> (dx_shard: [s, b, in/t]; dw_shard: [out, in/t]; db: [out], the same on every rank)
    """
    raise NotImplementedError("Exercise 4.2: the row-parallel linear layer and its g — see lesson.py, section 2")


def vocab_parallel_cross_entropy_loss(logits_shard: np.ndarray, targets: np.ndarray,
                                      group: Optional[mp.ProcessGroup] = None) -> float:
    """loss = mean over tokens of log Σ_v exp(logits[v]) - logits[target], from shards.

    logits_shard: [s, b, V/t], vocabulary entries r·V/t .. (r+1)·V/t of the logits;
    targets: int [s, b] in [0, V), the same on every rank -> the loss (a float), the same on
    every rank. Communicate only [s, b] numbers (all-reduces: max, then sums); never
    assemble the [s, b, V] logits.
    """
    raise NotImplementedError("Exercise 4.3: cross-entropy over a vocabulary split across ranks — see lesson.py, section 4")


def sequence_parallel_layernorm_grads(dy_shard: np.ndarray, x_shard: np.ndarray,
                                      gamma: np.ndarray,
                                      group: Optional[mp.ProcessGroup] = None,
                                      eps: float = 1e-5
                                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx_r = LayerNorm'(x_r)·dy_r per token; dgamma = all_reduce(Σ dy_r·xhat_r); dbeta =
    all_reduce(Σ dy_r).

    LayerNorm y = xhat·gamma + beta, xhat = (x - mean) / sqrt(var + eps) over the last axis.
    dy_shard, x_shard: [s/t, b, h], this rank's part of the sequence; gamma: [h], the same on
    every rank -> (dx_shard: [s/t, b, h]; dgamma: [h] and dbeta: [h], whole, the same on
    every rank). (`minipar.nn.layernorm.layernorm_backward` computes one device's three.)
    """
    raise NotImplementedError("Exercise 4.4: sequence-parallel LayerNorm gradients — see lesson.py, section 5")
