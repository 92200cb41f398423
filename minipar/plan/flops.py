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
A mixture of experts (moe_model_flops) replaces the MLP of each of its l_moe layers,
2 B s h f · 2 forward (f = 4h above), by the k experts a token runs, 2 B s h f_e · 2 each,
the router's 2 B s h E and any shared experts' 2 B s h f_sh · 2 (the active parameters:
dropped tokens and padding change the work, not the model's FLOPs).
Conventions: only matmuls count; attention is counted over the full s x s score matrix
(as dense kernels compute it; causal masking does not halve it); the embedding lookup
costs nothing; a tied head counts the same as an untied one.
"""

from __future__ import annotations

from typing import Optional


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


def moe_model_flops(B: int, s: int, l: int, h: int, V: int, moe_layers: int,
                    num_experts: int, top_k: int, expert_ffn: int, shared_ffn: int = 0,
                    ffn: Optional[int] = None) -> float:
    """model_flops with `moe_layers` of the l MLPs (width ffn, default 4h) replaced by
    top_k experts of width expert_ffn, the router and the shared experts, all times 3."""
    f = 4 * h if ffn is None else ffn
    dense = model_flops(B, s, l, h, V) + 3 * l * 4 * B * s * h * (f - 4 * h)
    per_layer = (4 * B * s * h * (top_k * expert_ffn + shared_ffn - f)
                 + 2 * B * s * h * num_experts)
    return dense + 3 * moe_layers * per_layer
