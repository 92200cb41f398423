"""Activation memory per transformer layer (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.1).

With 2-byte activations and 1-byte dropout masks, one layer keeps for its backward
    s b h (34 + 5 a s / h)  bytes
      attention  11 sbh + 5 a s^2 b    MLP  19 sbh    two LayerNorms  4 sbh
selective recomputation drops the 5 a s^2 b term; full recomputation keeps 2 sbh (the
layer's input). docs/model.md lists every tensor behind each term.

Tensor parallelism over t ranks (Table 2 of the paper) divides what lies inside the
parallel blocks — Q, K, V, the projection input, the MLP's 16 sbh and the attention core —
by t, but not the 10 sbh between them (the two LayerNorm inputs, the inputs of the QKV and
fc1 linears, which are the whole LayerNorm outputs, and the two residual-dropout masks):
    tensor parallel                 s b h (10 + 24/t + 5 a s / (h t))
    tensor + sequence parallel      s b h (34/t + 5 a s / (h t))
and with sequence parallelism full recomputation keeps the input's 2 sbh / t.
docs/tensor_parallel.md lists the terms.

Checkpoint segments of k layers (Chen et al. 2016, nn/segments.py) keep each segment's
input I (full recomputation's figure) and, in the backward, rerun one segment whose k
layers keep everything (A, the "none" figure): at most (L/k - 1) I + k A for the blocks,
smallest near k = sqrt(L I / A) (`segments_activation_bytes`, `best_segment`).
"""

from __future__ import annotations

import math


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, recompute: str = "none",
                               act_bytes: int = 2, dropout: bool = True, tp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """Bytes one layer saves for backward, per rank: sbh(34 + 5as/h) for 2-byte
    activations on one device; sbh(10 + 24/t + 5as/(ht)) with tensor parallelism over
    t = tp ranks; sbh(34/t + 5as/(ht)) with sequence parallelism too.

    act_bytes scales the 2-byte terms (4 for float32, 8 for float64); masks stay 1 byte.
    Without dropout there are no masks, and the softmax output is saved once:
    32 sbh + 2 a s^2 b (one device).
    """
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    if tp < 1 or h % tp or a % tp:
        raise ValueError(f"tp = {tp} must be a positive divisor of h = {h} and a = {a}")
    k, t = act_bytes / 2, tp
    split = t if sequence_parallel else 1  # what divides the stream between the blocks
    if recompute == "full":
        return 2 * k * s * b * h / split
    masks = 2 if dropout else 0  # the two residual-dropout masks, 1 byte an element
    between = (8 * k + masks) / split  # LN inputs, QKV and fc1 inputs, masks
    inside = 24 * k / t  # Q, K, V (6), projection input (2), GeLU input (8), fc2 input (8)
    attention_core = (4 * k + 1 if dropout else 2 * k) * a * s * s * b / t
    if recompute == "selective":
        return (between + inside) * s * b * h
    return (between + inside) * s * b * h + attention_core


def segment_sizes(num_layers: int, segment: int) -> list[int]:
    """The layers in each checkpoint segment: segment k each, the last shorter if k does
    not divide L (one segment of L when k >= L)."""
    if num_layers < 1 or segment < 1:
        raise ValueError(f"num_layers = {num_layers} and segment = {segment} must both be "
                         f"positive integers")
    return [min(segment, num_layers - a) for a in range(0, num_layers, segment)]


def segments_activation_bytes(num_layers: int, segment: int, layer: float,
                              kept: float) -> float:
    """max over segments m of  m I + k_m A: the most the blocks hold at once with checkpoint
    segments of k = `segment` layers; (L/k - 1) I + k A when k divides L.

    layer: A, the bytes a layer keeps when it keeps everything (activation_bytes_per_layer
    with recompute="none"); kept: I, a segment's input (recompute="full"'s figure). The
    maximum is in the backward of segment m, after its rerun: the inputs of the m segments
    below it and its own k_m layers (its input inside its first layer's A). It covers the
    forward too, where one layer at a time keeps everything. k = 1 is full recomputation:
    (L - 1) I + A.
    """
    sizes = segment_sizes(num_layers, segment)
    return float(max(m * kept + k * layer for m, k in enumerate(sizes)))


def best_segment(num_layers: int, layer: float, kept: float) -> int:
    """The k in 1..L with the smallest segments_activation_bytes (the smallest k on a tie):
    near sqrt(L I / A), which is Chen et al.'s sqrt(L) only when A = I."""
    return min(range(1, num_layers + 1),
               key=lambda k: (segments_activation_bytes(num_layers, k, layer, kept), k))


def sqrt_rule(num_layers: int, layer: float, kept: float) -> float:
    """sqrt(L I / A): where (L/k - 1) I + k A is smallest over a real k."""
    return math.sqrt(num_layers * kept / layer)
