"""Lesson 00 — the memory wall: the exercises' answers.

Each function returns bytes as a float (decimal arithmetic: divide by 1e9 for GB).
"""

from __future__ import annotations

import math
from typing import Optional


def model_state_bytes_per_gpu(psi: float, stage: int, n: int) -> float:
    """Bytes of model states one of n data-parallel GPUs holds at a ZeRO stage.

    Mixed-precision Adam: bf16 weights (2 bytes a parameter), bf16 gradients (2), and fp32
    master weights, m and v (12). Stage 0 is DDP (everything replicated); stage 1 shards
    the 12 optimizer bytes over the n GPUs, stage 2 the gradients too, stage 3 the weights
    too. psi: the number of parameters Ψ (no padding: assume Ψ divides evenly).
    """
    # BEGIN SOLUTION Exercise 0.1: model-state bytes per GPU for DDP and ZeRO-1/2/3 — see lesson.py, section 1
    weights = 2 * psi / (n if stage >= 3 else 1)
    grads = 2 * psi / (n if stage >= 2 else 1)
    optimizer = 12 * psi / (n if stage >= 1 else 1)
    return float(weights + grads + optimizer)
    # END SOLUTION


def activation_bytes(s: int, b: int, h: int, a: int, layers: int,
                     recompute: str = "none") -> float:
    """Bytes of activations a model of `layers` transformer layers keeps for its backward.

    Korthikanti et al. 2022, 2-byte activations and 1-byte dropout masks, per layer:
    "none" sbh(34 + 5as/h); "selective" (the attention core is recomputed) 34sbh; "full"
    (only each layer's input is kept) 2sbh.
    """
    # BEGIN SOLUTION Exercise 0.2: activation bytes of a whole model, per recomputation mode — see lesson.py, section 2
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
