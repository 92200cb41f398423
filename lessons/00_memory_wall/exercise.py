# Your file for lesson 00, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 00`.
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
    raise NotImplementedError("Exercise 0.1: model-state bytes per GPU for DDP and ZeRO-1/2/3 — see lesson.py, section 1")


def activation_bytes(s: int, b: int, h: int, a: int, layers: int,
                     recompute: str = "none") -> float:
    """Bytes of activations a model of `layers` transformer layers keeps from its forward
    for its backward (what waits between them, not the peak inside the backward).

    s: sequence length, b: micro-batch (sequences), h: hidden size, a: attention heads;
    recompute: "none", "selective" or "full". Count as Korthikanti et al. 2022 do: 2-byte
    activations, 1-byte dropout masks, the attention scores stored (no FlashAttention).
    What a layer keeps in each mode: lesson.py, sections 2 and 3.
    """
    raise NotImplementedError("Exercise 0.2: activation bytes of a whole model, per recomputation mode — see lesson.py, sections 2 and 3")


def min_gpus(psi: float, stage: int, gpu_bytes: float) -> Optional[int]:
    """The smallest number of GPUs n >= 1 on which one GPU's model states (Exercise 0.1)
    fit in gpu_bytes, or None when no number of GPUs is enough at this stage."""
    raise NotImplementedError("Exercise 0.3: the fewest GPUs whose memory holds the model states — see lesson.py, section 1")


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
    raise NotImplementedError("Exercise 0.4: a training step within 3 MB a GPU — see lesson.py, section 4")
