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
"""

from __future__ import annotations


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
