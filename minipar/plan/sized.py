"""A preset as a GPT of the same size: what the dry run (timeline.py) runs for a model whose
architecture is not minipar's GPT (SwiGLU, grouped key-value heads, RMSNorm, rotary
positions).

    h' = h, a' = a, l' = l, V' = V, s' = s      the shape the step's activations follow
    f' = (P_layer - 4h²) / (2h), rounded down to a multiple of `multiple`

so a layer holds the preset's parameters (to within the rounding) as 4h² of attention and
2hf' of GeLU MLP: a Llama 3 405B layer (2h² + 2h·a_kv·d of attention, 3hf of SwiGLU,
3.19e9) becomes a GPT layer with f' = 64,512. A layer's matmul FLOPs are 2 a parameter a
token in both, and q·kᵀ and p·v do not depend on the number of key-value heads, so the
step's matmul FLOPs agree to the rounding; what differs is the shape of each GEMM (four
linears of the preset's widths become two of another) and what the GPT adds (biases,
LayerNorm's bias, learned positions: s·h parameters). A plain GPT preset (Korthikanti's,
SC'21's, GPT-3) is converted as it is: f' = 4h. A mixture of experts is refused.
"""

from __future__ import annotations

import dataclasses

from .presets import ModelSpec


def as_gpt(model: ModelSpec, multiple: int = 1024) -> ModelSpec:
    """A GPT of `model`'s size (module docstring): GeLU MLP, multi-head attention, biases,
    LayerNorm, learned positions, the preset's tying."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"as_gpt takes a plan.presets ModelSpec, got {type(model).__name__}")
    if model.experts:
        raise ValueError(f"{model.name} is a mixture of experts; the dry run runs dense GPTs")
    h = model.hidden
    gpt = dataclasses.replace(model, kv_heads=None, swiglu=False, biases=True,
                              layernorm=True, learned_positions=True)
    if gpt == model:
        return model
    ffn = (model.layer_parameters() - 4 * h * h) // (2 * h) // multiple * multiple
    return dataclasses.replace(gpt, name=f"{model.name} as a GPT", ffn=ffn)
