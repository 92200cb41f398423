# Your file for lesson 03, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 03`.
"""Lesson 03 — ZeRO and FSDP: the exercises' answers.

Exercise 3.1 runs on simulated devices (call it inside a program given to mp.launch);
3.2 and 3.3 are arithmetic: bytes as floats, elements as floats.
"""

from __future__ import annotations

import numpy as np

import minipar as mp


def zero1_step(flat_params: np.ndarray, flat_grad: np.ndarray, m: np.ndarray, v: np.ndarray,
               step: int, group=None, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZeRO-1: s = reduce_scatter(g, "avg")[r]; w_r = AdamW(w_r, s; m, v); w = all_gather(w_r).

    This rank's part of one ZeRO-1 step over the n ranks of `group` (None: the world):

        flat_params  [padded]     the whole flat weights, equal on every rank (float64);
                                  padded is a multiple of n and the padding holds zeros
        flat_grad    [padded]     this rank's local gradient, from its own micro-batch
        m, v         [padded/n]   Adam's moments of the shard this rank owns
        step         t, the number of this step (1 for the first), for bias correction

    Rank r (its position in the group) owns flat[r*padded/n : (r+1)*padded/n]. Returns
    (new flat_params [padded], new m [padded/n], new v [padded/n]): the weights equal, on
    every rank, one AdamW step of the whole buffer on the gradient averaged over the ranks.
    AdamW as minipar.optim.AdamW does it (minipar/optim/adam.py):

        m = β1·m + (1 − β1)·g          v = β2·v + (1 − β2)·g²
        m̂ = m / (1 − β1^t)             v̂ = v / (1 − β2^t)
        w = w − lr·wd·w                (decoupled weight decay, before the Adam update)
        w = w − lr·m̂ / (√v̂ + ε)
    """
    raise NotImplementedError("Exercise 3.1: the ZeRO-1 AdamW step: reduce-scatter, Adam on the shard, all-gather — see lesson.py, section 2")


def zero_bytes_per_rank(psi: int, stage: int, n: int, param_bytes: float = 2,
                        grad_bytes: float = 2, k: float = 12) -> dict[str, float]:
    """Model-state bytes per rank at a ZeRO stage, Ψ' = Ψ + ((−Ψ) mod n) at stages >= 1.

    psi parameters in one flat buffer, n data-parallel ranks; param_bytes and grad_bytes
    per element of weights and gradients (2 in bf16), k bytes of optimizer state per
    element (12: float32 master, m and v). Stage 0 (DDP) holds everything whole and pads
    nothing. Stages >= 1 pad the buffer with zeros to Ψ' elements, a multiple of n, and
    rank r keeps a shard of Ψ'/n elements of what the stage partitions: stage 1 the
    optimizer states, stage 2 the gradients too, stage 3 the weights too; whatever is
    not partitioned is held whole, Ψ' elements, padding included.
    Returns {"parameters", "gradients", "optimizer_states", "total"} in bytes (floats).
    """
    raise NotImplementedError("Exercise 3.2: model-state bytes per rank, padding included — see lesson.py, section 3")


def zero_comm_elements(psi: int, stage: int, n: int) -> float:
    """Elements sent per rank and step: DDP 2Ψ(n−1)/n, ZeRO-1/2 2Ψ'(n−1)/n, ZeRO-3 3Ψ'(n−1)/n.

    Ring collectives: an all-reduce sends 2(n−1)/n of its buffer, a reduce-scatter and an
    all-gather (n−1)/n each. DDP all-reduces the Ψ gradients; ZeRO-1/2 reduce-scatter the
    padded gradient buffer and all-gather the updated weights; ZeRO-3 all-gathers the
    weights in the forward and again in the backward and reduce-scatters the gradients
    (ZeRO's count: no unit is kept whole). Ψ' = Ψ + ((−Ψ) mod n), as in Exercise 3.2.
    """
    raise NotImplementedError("Exercise 3.3: elements sent per rank and step under DDP and ZeRO-1/2/3 — see lesson.py, section 4")
