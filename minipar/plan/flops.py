"""Model FLOPs of one training step (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", section 5.1 and appendix).

Per layer, forward, with B sequences of length s, hidden h, a 4h MLP:
    QKV projection      2 B s h (3h)  = 6 B s h^2
    Q K^T               2 B s^2 h
    attention x V       2 B s^2 h
    output projection   2 B s h^2
    MLP                 2 B s h (4h) * 2 = 16 B s h^2
    total               24 B s h^2 + 4 B s^2 h
The logit layer adds 2 B s h V. Backward costs twice the forward (a gradient for the
input and one for the weight, per matmul), so one step is 3x the forward:
    F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
Full recomputation runs every layer's forward once more (4x), but not the logit layer:
    F_full = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
Conventions: only matmuls count; attention is counted over the full s x s score matrix
(as dense kernels compute it; causal masking does not halve it); the embedding lookup
costs nothing; a tied head counts the same as an untied one.
"""

from __future__ import annotations


def model_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """72 B s l h^2 (1 + s/(6h) + V/(12 l h)): one training step, no recomputation."""
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def model_flops_full_recompute(B: int, s: int, l: int, h: int, V: int) -> float:
    """96 B s l h^2 (1 + s/(6h) + V/(16 l h)): one step with every layer recomputed."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def selective_recompute_extra_flops(B: int, s: int, l: int, h: int) -> float:
    """l * 2 B s^2 h: selective recomputation re-runs Q K^T in every layer (the softmax and
    dropout it also re-runs are not matmuls)."""
    return l * 2 * B * s**2 * h
