"""Activation memory per transformer layer (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.1).

With 2-byte activations and 1-byte dropout masks, one layer keeps for its backward
    s b h (34 + 5 a s / h)  bytes
      attention  11 sbh + 5 a s^2 b    MLP  19 sbh    two LayerNorms  4 sbh
selective recomputation drops the 5 a s^2 b term; full recomputation keeps 2 sbh (the
layer's input). docs/model.md lists every tensor behind each term.
"""

from __future__ import annotations


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, recompute: str = "none",
                               act_bytes: int = 2, dropout: bool = True) -> float:
    """Bytes one layer saves for backward: sbh(34 + 5as/h) for 2-byte activations.

    act_bytes scales the 2-byte terms (4 for float32, 8 for float64); masks stay 1 byte.
    Without dropout there are no masks, and the softmax output is saved once:
    32 sbh + 2 a s^2 b.
    """
    k = act_bytes / 2
    if recompute == "full":
        return 2 * k * s * b * h
    per_sbh = 32 * k + (2 if dropout else 0)  # 32 sbh of activations, 2 sbh of masks
    attention_core = (4 * k + 1 if dropout else 2 * k) * a * s * s * b
    if recompute == "selective":
        return per_sbh * s * b * h
    if recompute != "none":
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    return per_sbh * s * b * h + attention_core
