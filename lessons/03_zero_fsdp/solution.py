"""Lesson 03 — ZeRO and FSDP: the exercises' answers.

Exercise 3.1 runs on simulated devices (call it inside a program given to mp.launch);
3.2 and 3.3 are arithmetic: bytes as floats, elements as floats; 3.4 returns a plan that
the grader runs on simulated devices.
"""

from __future__ import annotations

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig


def zero1_step(flat_params: np.ndarray, flat_grad: np.ndarray, m: np.ndarray, v: np.ndarray,
               step: int, group=None, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w ← AdamW(w, (1/n) Σ_r g_r), with rank r of `group` keeping only its shard's m and v.

    This rank's part of one ZeRO-1 step over the n ranks of `group` (None: the world):

        flat_params  [padded]     the whole flat weights, equal on every rank (float64);
                                  padded is a multiple of n and the padding holds zeros
        flat_grad    [padded]     this rank's local gradient, from its own micro-batch
        m, v         [padded/n]   Adam's moments of the shard this rank owns
        step         t, the number of this step (1 for the first), for bias correction

    Rank r (its position in `group`) owns flat[r*padded/n : (r+1)*padded/n]. Returns
    (new flat_params [padded], new m [padded/n], new v [padded/n]): the weights equal, on
    every rank, one AdamW step of the whole buffer on the gradient averaged over the ranks,
    AdamW exactly as minipar.optim.AdamW computes it (its update is written out in
    minipar/optim/adam.py). Which collectives carry the gradient in and the weights out,
    and what they cost: lesson.py, section 2. Leave the inputs as they are: compute into
    new arrays.
    """
    # BEGIN SOLUTION Exercise 3.1: the ZeRO-1 AdamW step: reduce-scatter, Adam on the shard, all-gather — see lesson.py, section 2
    n, r = mp.get_world_size(group), mp.get_rank(group)
    shard = flat_params.shape[0] // n
    w = flat_params[r * shard:(r + 1) * shard]  # [padded/n]: the weights this rank owns
    g = mp.reduce_scatter(flat_grad, "avg", group=group)  # [padded/n]: their averaged gradient
    b1, b2 = betas
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * (g * g)
    m_hat = m / (1.0 - b1 ** step)
    v_hat = v / (1.0 - b2 ** step)
    w = w - lr * weight_decay * w
    w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return mp.all_gather(w, group=group), m, v  # [padded], [padded/n], [padded/n]
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 3.2: model-state bytes per rank, padding included — see lesson.py, section 3
    full = psi if stage == 0 else psi + (-psi) % n  # Ψ or Ψ'
    shard = full / n
    params = param_bytes * (shard if stage >= 3 else full)
    grads = grad_bytes * (shard if stage >= 2 else full)
    optim = k * (shard if stage >= 1 else full)
    return {"parameters": float(params), "gradients": float(grads),
            "optimizer_states": float(optim), "total": float(params + grads + optim)}
    # END SOLUTION


def zero_comm_elements(psi: int, stage: int, n: int) -> float:
    """sent(Ψ, stage, n) = Σ over one step's collectives of the elements this rank sends.

    psi parameters, n data-parallel ranks, ring collectives, one reduction of the gradients
    per step (no accumulation). Which collectives a stage runs, over which buffer (Ψ, or
    Ψ' = Ψ + ((−Ψ) mod n) padded as in Exercise 3.2) and how much of its buffer a ring
    rank sends: lesson 01 (the ring reduce-scatter and all-gather) and this lesson's
    sections 2 and 4. ZeRO-3 is counted as the ZeRO paper counts it, every unit resharded
    after its forward (the root's saved all-gather of section 4 is not subtracted).
    Returns a number of elements (a float), not bytes.
    """
    # BEGIN SOLUTION Exercise 3.3: elements sent per rank and step under DDP and ZeRO-1/2/3 — see lesson.py, section 4
    full = psi if stage == 0 else psi + (-psi) % n
    passes = 3 if stage == 3 else 2  # ZeRO-3 gathers the weights twice
    return float(passes * full * (n - 1) / n)
    # END SOLUTION


def fit_plan(cfg: GPTConfig, n: int, batch: int, memory_budget: int,
             traffic_budget: float) -> dict:
    """A plan whose training step keeps peak ≤ memory_budget and sent ≤ traffic_budget per rank.

    The task of lesson.py, section 6. One training step of the GPT `cfg` (float64, AdamW:
    8 + 8 + 16 bytes of weight, gradient and optimizer state per parameter) on n
    data-parallel ranks, each training on `batch` sequences of cfg.seq_len tokens:

        memory_budget   bytes one rank may hold at once (the ledger's peak, from when the
                        engine is built until engine.step() returns)
        traffic_budget  bytes one rank may send during the step (the trace's comm events)

    Return the plan as a dict; the grader builds GPT(cfg with your model fields) and the
    engine, runs the step on n simulated ranks, and checks both budgets and that the
    updated weights are one device's AdamW step on the whole batch:

        "stage"          0 (DDP), 1, 2 or 3 (FSDP FULL_SHARD)                    required
        "micro_batches"  k, a divisor of batch: accumulate k micro-batches of batch/k
                         sequences, each loss scaled by 1/k                    default 1
        "no_sync"        True: every micro-batch but the last skips communication
                         (engine.no_sync()); False: each one reduces its gradients
                                                                            default True
        "limit_all_gathers", "reshard_after_forward", "forward_prefetch",
        "backward_prefetch", "prefetch_depth"      ZeRO-3's knobs (stage 3 only)
        any GPTConfig field, e.g. "recompute": "none", "selective" or "full"
    """
    # BEGIN SOLUTION Exercise 3.4: fit a training step under a memory and a traffic budget — see lesson.py, section 6
    # The traffic budget is one all-reduce of the padded gradients: ZeRO-3 (weights gathered
    # for the forward and again for the backward) and reducing every micro-batch are over it.
    # ZeRO-1 shards the largest state, Adam's, at DDP's traffic. Activations are the rest:
    # full recomputation keeps only each block's input, and micro-batches of one sequence
    # hold one sequence's worth at a time.
    return {"stage": 1, "recompute": "full", "micro_batches": batch}
    # END SOLUTION
