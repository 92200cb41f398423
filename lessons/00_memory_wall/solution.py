"""Lesson 00 — the memory wall: the exercises' answers.

Exercises 0.1-0.3 return bytes or counts as numbers (decimal arithmetic: divide by 1e9 for
GB). Exercise 0.4 returns a plan, which the grader runs on simulated GPUs.
"""

from __future__ import annotations

import math
from typing import Optional

# Exercise 0.4's problem (lesson.py, section 4); the grader keeps its own copy
MODEL = dict(vocab_size=128, hidden=64, num_heads=4, num_layers=4, dtype="bfloat16")
GPUS = 4  # data-parallel GPUs
GLOBAL_BATCH = 16  # sequences per optimizer step
BUDGET_BYTES = 3_000_000  # each GPU's memory
MAX_FLOPS_RATIO = 1.10  # a step's FLOPs over those of the same step without recomputation


def model_state_bytes_per_gpu(psi: float, stage: int, n: int) -> float:
    """Bytes of model states (weights, gradients, optimizer states) one of n data-parallel
    GPUs holds, training with Adam in mixed precision: bf16 weights and gradients, float32
    master weights and Adam moments.

    psi: the number of parameters Ψ (assume it splits evenly over n: no padding);
    stage: 0 (DDP), 1, 2 or 3 (ZeRO-1/2/3); n: the number of data-parallel GPUs.
    What each state costs and what each stage shards: lesson.py, section 1.
    """
    # BEGIN SOLUTION Exercise 0.1: model-state bytes per GPU for DDP and ZeRO-1/2/3 — see lesson.py, section 1
    weights = 2 * psi / (n if stage >= 3 else 1)
    grads = 2 * psi / (n if stage >= 2 else 1)
    optimizer = 12 * psi / (n if stage >= 1 else 1)
    return float(weights + grads + optimizer)
    # END SOLUTION


def activation_bytes(s: int, b: int, h: int, a: int, layers: int,
                     recompute: str = "none") -> float:
    """Bytes of activations a model of `layers` transformer layers keeps from its forward
    for its backward (what waits between them, not the peak inside the backward).

    s: sequence length, b: micro-batch (sequences), h: hidden size, a: attention heads;
    recompute: "none", "selective" or "full". Count as Korthikanti et al. 2022 do: 2-byte
    activations, 1-byte dropout masks, the attention scores stored (no FlashAttention).
    What a layer keeps in each mode: lesson.py, sections 2 and 3.
    """
    # BEGIN SOLUTION Exercise 0.2: activation bytes of a whole model, per recomputation mode — see lesson.py, sections 2 and 3
    sbh = s * b * h
    per_layer = {"none": sbh * (34 + 5 * a * s / h), "selective": 34 * sbh,
                 "full": 2 * sbh}[recompute]
    return float(layers * per_layer)
    # END SOLUTION


def min_gpus(psi: float, stage: int, gpu_bytes: float) -> Optional[int]:
    """The smallest number of GPUs n >= 1 on which one GPU's model states (Exercise 0.1)
    fit in gpu_bytes, or None when no number of GPUs is enough at this stage."""
    # BEGIN SOLUTION Exercise 0.3: the fewest GPUs whose memory holds the model states — see lesson.py, section 1
    replicated = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi  # bytes that no n divides
    sharded = 16 * psi - replicated  # bytes divided by n
    if sharded == 0:
        return 1 if replicated <= gpu_bytes else None
    if replicated >= gpu_bytes:
        return None
    n = max(1, math.ceil(sharded / (gpu_bytes - replicated)))
    # the division above is exact in real numbers; step once each way for float rounding
    if n > 1 and replicated + sharded / (n - 1) <= gpu_bytes:
        n -= 1
    elif replicated + sharded / n > gpu_bytes:
        n += 1
    return n
    # END SOLUTION


def plan_step(seq_len: int) -> dict:
    """A plan for one training step of the model MODEL at sequence length seq_len on GPUS
    data-parallel GPUs (lesson.py, section 4), as a dict:

        zero          0 (DDP), 1, 2 or 3 (ZeRO-1/2/3)
        recompute     "none", "selective" or "full"
        micro_batch   sequences one GPU runs through one forward and backward
        accumulation  micro-batches whose gradients are summed before the optimizer step

    It must train on GLOBAL_BATCH sequences a step, peak within BUDGET_BYTES on every GPU,
    and spend at most MAX_FLOPS_RATIO times the FLOPs of the same step without
    recomputation. The grader runs it for seq_len = 32, 64 and 128.
    """
    # BEGIN SOLUTION Exercise 0.4: a training step within 3 MB a GPU — see lesson.py, section 4
    per_gpu = GLOBAL_BATCH // GPUS  # sequences each GPU trains on per step
    if seq_len <= 32:  # short: the states need sharding, the activations fit whole
        return {"zero": 2, "recompute": "none", "micro_batch": per_gpu, "accumulation": 1}
    if seq_len <= 64:  # the s² scores grow: drop them, and halve what a GPU holds at once
        return {"zero": 1, "recompute": "selective", "micro_batch": per_gpu // 2,
                "accumulation": 2}
    # long: one sequence at a time; full recomputation would cost a third more FLOPs
    return {"zero": 3, "recompute": "selective", "micro_batch": 1, "accumulation": per_gpu}
    # END SOLUTION
