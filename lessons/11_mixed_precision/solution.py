"""Lesson 11 — Mixed precision: the exercises' answers.

Exercise 11.1 rounds float32 values to bf16 by integer arithmetic on their bits (section
1). Exercise 11.2 is one step of a dynamic loss scaler (section 3). Exercise 11.3 counts the
bytes a parameter of the model states under a precision, a gradient dtype and a sharding
(section 4). Exercise 11.4 plans: main_grad or not, a ZeRO stage and micro-batches for a
bf16 GPT that fits a memory budget with an accurate reduced gradient; the grader runs the
plan on simulated devices (sections 4–6).
"""

from __future__ import annotations

import numpy as np


def round_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns (uint16) of x's values rounded to bfloat16, x float32, any shape.

    Round to the nearest bf16 value, ties to the one whose last kept bit is 0 (IEEE 754's
    default): a bf16 value is the top 16 bits of a float32, so keep them, rounded. Signs,
    subnormals, infinities and the carry into the exponent (1.999 -> 2, the largest
    float32 -> inf) all follow from the bits. x holds no NaN. Work on the integers
    (x.view(np.uint32)), not by casting to a bfloat16 dtype: that cast is what you are
    graded against. Returns a uint16 array of x's shape (section 1).
    """
    # BEGIN SOLUTION Exercise 11.1: round a float32 to bf16, nearest, ties to even — see lesson.py, section 1
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (bits >> 16) & 1  # the last bit kept: a tie rounds to make it 0
    rounded = bits + np.uint32(0x7FFF) + lsb  # past the halfway point, or at it when odd
    return (rounded >> 16).astype(np.uint16)
    # END SOLUTION


def loss_scale_update(scale: float, clean_steps: int, found_overflow: bool,
                      growth_factor: float = 2.0, backoff_factor: float = 0.5,
                      growth_interval: int = 2000, min_scale: float = 1.0
                      ) -> tuple[bool, float, int]:
    """One step of a dynamic loss scaler: (take the step?, the next scale, the next count).

    scale: S this step; clean_steps: steps in a row without an overflow since S last
    changed; found_overflow: whether any gradient of this step was inf or nan. On an
    overflow the step is skipped, S is multiplied by backoff_factor but never goes below
    min_scale, and the count restarts; otherwise the step is taken and counted, and the
    growth_interval-th clean step in a row multiplies S by growth_factor and restarts the
    count. minipar.optim.DynamicLossScaler.update is the reference (section 3).
    """
    # BEGIN SOLUTION Exercise 11.2: a dynamic loss scaler's update — see lesson.py, section 3
    if found_overflow:
        return False, max(scale * backoff_factor, min_scale), 0
    clean_steps += 1
    if clean_steps == growth_interval:
        return True, scale * growth_factor, 0
    return True, scale, clean_steps
    # END SOLUTION


def state_bytes_per_parameter(precision: str, fp32_grads: bool, zero: int,
                              distributed_optimizer: bool, d: int) -> dict[str, float]:
    """Bytes a parameter of each model state on one rank, with Adam (padding left out).

    precision: "bf16" (bf16 weights, float32 master, m, v) or "fp32" (float32 weights, m,
    v, no master); fp32_grads: Megatron's float32 main_grad, 4-byte gradients in bf16 (an
    fp32 run's gradients are float32 anyway); zero: the ZeRO stage 0..3 over the d
    data-parallel ranks; distributed_optimizer: Megatron's, which shards what ZeRO-1 shards.
    Returns {"parameters", "gradients", "optimizer_states", "total"} in bytes a parameter
    (floats), as minipar.plan counts them (section 4).
    """
    # BEGIN SOLUTION Exercise 11.3: bytes a parameter by precision and sharding — see lesson.py, section 4
    if precision == "fp32":
        w, g, k = 4, 4, 8  # float32 weights and gradients, Adam's m and v
    else:
        w, g, k = 2, (4 if fp32_grads else 2), 12  # bf16 weights; master, m, v
    stage = max(zero, 1 if distributed_optimizer else 0)
    params = w / d if stage >= 3 else w
    grads = g / d if stage >= 2 else g
    optim = k / d if stage >= 1 else k
    return {"parameters": params, "gradients": grads, "optimizer_states": optim,
            "total": params + grads + optim}
    # END SOLUTION


def fit_precision(cfg, n: int, batch: int, memory_budget: int, max_error: float) -> dict:
    """A plan for one training step of the bf16 GPT `cfg` on n ranks, `batch` sequences a
    rank (sections 4–6):

        {"main_grad": bool, "stage": 0..3, "micro_batches": k}

    main_grad: float32 gradient buffers (the engines' option); stage: the ZeRO stage
    (0: DDP; 1 with main_grad is Megatron's distributed optimizer); micro_batches: k, a
    divisor of batch, the rank's sequences cut into k micro-batches accumulated under
    no_sync. The grader runs the plan with zero_engine and accumulate_gradients and
    requires (a) every rank's peak memory (ledger.peak(), after the engine is built) at
    most memory_budget bytes, and (b) the reduced gradient (engine.full_grads()) within
    max_error, in norm relative to the norm, of the exact (float64) average over the ranks
    of the sum of the same bf16 micro-batch gradients. Choose the plan from what sections
    4–6 measured; no run is needed.
    """
    # BEGIN SOLUTION Exercise 11.4: a precision plan within a memory and an error budget — see lesson.py, section 5
    # bf16 buffers round every partial sum: only float32 ones meet 1e-5 over n >= 2 ranks.
    # With them DDP holds 18 bytes a parameter; the distributed optimizer 6 + 12/n, and
    # micro-batches of one sequence keep the activations of one.
    return {"main_grad": True, "stage": 1, "micro_batches": batch}
    # END SOLUTION
