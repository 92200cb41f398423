# Your file for lesson 12, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 12`.
"""Lesson 12 — Activation recomputation: the exercises' answers.

Exercise 12.1 counts the bytes one layer keeps for its backward on a tensor-parallel rank
(Korthikanti et al. 2022, section 4 and Table 2). Exercise 12.2 gives the most bytes
checkpoint segments of k layers hold at once, and the k that makes it smallest (Chen et
al. 2016). Exercise 12.3 turns a step's MFU into its HFU under each recomputation mode.
Exercise 12.4 chooses the recomputation with the fewest FLOPs whose activations fit a
budget, and is graded by running it on the ledger of a simulated device.
"""

from __future__ import annotations

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.plan import activation_bytes_per_layer, best_segment


def layer_activation_bytes(s: int, b: int, h: int, a: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           dropout: bool = True) -> float:
    """Bytes one transformer layer keeps for its backward on one of tp tensor-parallel ranks
    (lesson.py, sections 1–3).

    s: sequence length, b: micro-batch (sequences), h: hidden size, a: attention heads (a GPT
    layer: multi-head attention, a GeLU MLP of 4h, two LayerNorms); activations in bf16 (2
    bytes an element), dropout masks 1 byte an element; the attention scores are stored (no
    FlashAttention). tp: the tensor-parallel size t (it divides h and a);
    sequence_parallel: Megatron's sequence parallelism over the same t ranks; recompute:
    "none", "selective" (the attention core is rerun in the backward) or "full" (the layer
    keeps only its input); dropout: whether the layer drops out (its two residual dropouts
    and the attention dropout), or not at all.
    """
    raise NotImplementedError("Exercise 12.1: a layer's activation bytes per rank and mode — see lesson.py, section 1")


def segments_peak(num_layers: int, k: int, layer: float, kept: float) -> float:
    """The most bytes the layers' activations hold at once with checkpoint segments of k
    layers (lesson.py, section 4).

    The num_layers layers are cut into segments of k from the first, the last one shorter
    when k does not divide num_layers (one segment of all of them when k >= num_layers).
    The forward keeps each segment's input (kept bytes, I); the backward reruns a segment's
    forward keeping everything (layer bytes, A, for each of its layers) just before
    backpropagating through it. layer: A; kept: I (A >= I > 0).
    """
    raise NotImplementedError("Exercise 12.2: checkpoint segments' peak and the best segment size — see lesson.py, section 4")


def best_segment_size(num_layers: int, layer: float, kept: float) -> int:
    """A segment size k in 1..num_layers whose segments_peak is the smallest (lesson.py,
    section 4); on a tie any of them."""
    raise NotImplementedError("Exercise 12.2: checkpoint segments' peak and the best segment size — see lesson.py, section 4")


def hfu_from_mfu(mfu: float, B: int, s: int, l: int, h: int, V: int,
                 recompute: str) -> float:
    """A GPT step's hardware FLOPs utilisation from its model FLOPs utilisation (lesson.py,
    section 5).

    The GPT (Narayanan et al. 2021): l layers of hidden size h, multi-head attention, a GeLU
    MLP of 4h, a vocabulary of V; B sequences of s tokens a step. Its model FLOPs are
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), whatever is recomputed. recompute: "none",
    "selective" or "full", counted as plan.step_time counts them (Megatron-LM's
    recomputation): "selective" reruns each layer's whole attention core, "full" each
    layer's whole forward (the logits layer is not rerun).
    """
    raise NotImplementedError("Exercise 12.3: HFU from MFU under each recomputation mode — see lesson.py, section 5")


def plan_recompute(cfg: GPTConfig, micro_batch: int, budget: int) -> dict:
    """The recomputation with the fewest FLOPs whose activations fit `budget` (lesson.py,
    section 8).

    cfg: a GPT, bf16, no dropout, recompute "none"; micro_batch: b sequences of cfg.seq_len
    tokens; budget: bytes, the most the device's ledger may hold in its "activations"
    category at once during one forward and backward of the micro-batch on one device
    (`GPT(cfg.with_(**plan)).loss_and_grad(ids, targets)` inside `minipar.device()`).
    Returns the plan as GPTConfig fields: {"recompute": "none" | "selective" | "full" |
    "segments", "recompute_segment": k (segments only; default 1)}. Among the plans whose
    peak fits, the grader accepts any with the fewest FLOPs on the trace; one always fits.
    """
    raise NotImplementedError("Exercise 12.4: the cheapest recomputation within a memory budget — see lesson.py, section 8")
