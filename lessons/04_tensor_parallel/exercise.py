# Your file for lesson 04, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 04`.
"""Lesson 04 — tensor and sequence parallelism: the exercises' answers.

Exercises 4.1-4.4 run on each rank of a tensor-parallel group (SPMD, like a Megatron
layer). The grader runs them on a 2-D mesh and passes your tensor-parallel group as `group`,
so t = `group`'s size and r = this rank's *group rank*, its index in `group`
(`mp.get_rank(group)`; the global rank, `mp.get_rank()`, is another number). Shapes are per
rank, sequence first ([s, b, h]), and weights are stored [out, in] as in PyTorch. Use
minipar's collectives (`mp.all_reduce(x, "sum", group=group)`, ...), and leave your inputs
as they are: return new arrays. Exercise 4.5 is a design exercise: it returns a plan.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.nn.layernorm import layernorm_backward
from minipar.nn.saved import Saved
from minipar.parallel import ParallelDims
from minipar.plan import activation_bytes_per_layer


def column_parallel_linear_forward(x: np.ndarray, w_shard: np.ndarray, b_shard: np.ndarray,
                                   group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """y_r = outputs r·out/t .. (r+1)·out/t of the full layer x W^T + b (lesson section 2).

    x: [s, b, in], the same on every rank; w_shard: [out/t, in] (rows r·out/t ..
    (r+1)·out/t of the full W); b_shard: [out/t] -> y_r: [s, b, out/t].
    """
    raise NotImplementedError("Exercise 4.1: the column-parallel linear layer and its f — see lesson.py, section 2")


def column_parallel_linear_backward(dy_shard: np.ndarray, x: np.ndarray, w_shard: np.ndarray,
                                    group: Optional[mp.ProcessGroup] = None
                                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dL/dx, dL/dW_r, dL/db_r) of the column-parallel layer, where L depends on the
    outputs of every rank (lesson section 2: what f does in backward).

    dy_shard: [s, b, out/t], this rank's slice of dL/dy; x: [s, b, in] (the forward's input)
    -> (dx: [s, b, in], the same on every rank; dw_shard: [out/t, in]; db_shard: [out/t])
    """
    raise NotImplementedError("Exercise 4.1: the column-parallel linear layer and its f — see lesson.py, section 2")


def row_parallel_linear_forward(x_shard: np.ndarray, w_shard: np.ndarray, b: np.ndarray,
                                group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """y = x W^T + b of the full layer, from this rank's slice of x and of W (lesson
    section 2: g).

    x_shard: [s, b, in/t] (e.g. a column-parallel layer's output); w_shard: [out, in/t]
    (columns r·in/t .. (r+1)·in/t of the full W); b: [out], the same on every rank
    -> y: [s, b, out], the same on every rank.
    """
    raise NotImplementedError("Exercise 4.2: the row-parallel linear layer and its g — see lesson.py, section 2")


def row_parallel_linear_backward(dy: np.ndarray, x_shard: np.ndarray, w_shard: np.ndarray,
                                 group: Optional[mp.ProcessGroup] = None
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dL/dx_r, dL/dW_r, dL/db) of the row-parallel layer (lesson section 2: what g does
    in backward).

    dy: [s, b, out], the same on every rank; x_shard: [s, b, in/t] (the forward's input)
    -> (dx_shard: [s, b, in/t]; dw_shard: [out, in/t]; db: [out], the same on every rank)
    """
    raise NotImplementedError("Exercise 4.2: the row-parallel linear layer and its g — see lesson.py, section 2")


def vocab_parallel_cross_entropy_loss(logits_shard: np.ndarray, targets: np.ndarray,
                                      group: Optional[mp.ProcessGroup] = None) -> float:
    """loss = mean over tokens of log Σ_v exp(logits[v]) - logits[target], from shards
    (lesson section 4).

    logits_shard: [s, b, V/t], vocabulary entries r·V/t .. (r+1)·V/t of the logits;
    targets: int [s, b] in [0, V), the same on every rank -> the loss (a float), the same on
    every rank, for any finite logits. Communicate only numbers of one token each ([s, b]
    arrays), at most three times; never assemble the [s, b, V] logits.
    """
    raise NotImplementedError("Exercise 4.3: cross-entropy over a vocabulary split across ranks — see lesson.py, section 4")


def sequence_parallel_layernorm_grads(dy_shard: np.ndarray, x_shard: np.ndarray,
                                      gamma: np.ndarray,
                                      group: Optional[mp.ProcessGroup] = None,
                                      eps: float = 1e-5
                                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dL/dx_r, dL/dgamma, dL/dbeta) of a LayerNorm whose tokens are split along the
    sequence over the group (lesson section 5).

    LayerNorm y = xhat·gamma + beta, xhat = (x - mean) / sqrt(var + eps) over the last axis.
    dy_shard, x_shard: [s/t, b, h], this rank's part of the sequence; gamma: [h], the same on
    every rank -> (dx_shard: [s/t, b, h]; dgamma: [h] and dbeta: [h] of the whole sequence,
    the same on every rank). (`minipar.nn.layernorm.layernorm_backward` computes one
    device's three.)
    """
    raise NotImplementedError("Exercise 4.4: sequence-parallel LayerNorm gradients — see lesson.py, section 5")


def choose_tensor_parallel_layout(cfg: GPTConfig, topology: mp.Topology, global_batch: int,
                                  activation_budget: float, tp_comm_budget: float) -> dict:
    """A layout that trains `cfg` on every GPU of `topology` within two budgets per GPU and
    step: peak activations <= activation_budget bytes, time in tensor-parallel collectives
    <= tp_comm_budget seconds (lesson section 7).

    global_batch: sequences of cfg.seq_len tokens a step. Returns {"dims":
    ParallelDims(dp_replicate=..., tp=..., order=...), "sequence_parallel": bool, "cfg": the
    GPTConfig to train with}. The grader trains two steps of AdamW with `parallelize` on the
    simulated cluster, reads the ledger and the clock, and wants the losses one device gets
    training `cfg` on the same batches.
    """
    raise NotImplementedError("Exercise 4.5: a tensor-parallel layout within a memory and a time budget — see lesson.py, section 7")
