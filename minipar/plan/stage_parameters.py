"""Parameters one rank holds for one pipeline stage: what its optimizer updates and its
data-parallel group reduces.

    dense  = n (attention + norms + dense MLP or router + shared experts) / t
             + [first stage] (V h / t + s h learned positions)
             + [last stage] (V h / t head, or the tied embedding's copy when pp > 1; + the
             final norm)
    expert = n (E / ep) MLP(f_e) / t        (reduced over the expert-data-parallel group)

Norms and biases are counted divided by t with the rest (they are replicated, but small:
13h a layer against 12h²).
"""

from __future__ import annotations


def stage_parameters(model, layout, stage: int, stages: int, layers: int) -> tuple[float, float]:
    """(dense, expert) parameters of `stage` (of `stages`, holding `layers` layers) on one
    rank of `layout` (module docstring)."""
    t, h, V = layout.tp, model.hidden, model.vocab
    norms = 2 * h * (2 if model.layernorm else 1)
    expert = 0.0
    if model.experts:
        h_, f, glu = model.hidden, model.expert_ffn, model.swiglu
        one = (3 if glu else 2) * h_ * f + (((2 if glu else 1) * f + h_) if model.biases else 0)
        routed = model.experts * one
        dense_mlp = model.mlp_parameters() - routed
        expert = layers * routed / layout.ep / t
    else:
        dense_mlp = model.mlp_parameters()
    dense = layers * (model.attention_parameters() + dense_mlp + norms) / t
    if stage == 0:
        dense += V * h / t + (model.seq_len * h if model.learned_positions else 0)
    if stage == stages - 1:
        if not model.tied or layout.pp > 1:
            dense += V * h / t
        dense += h * (2 if model.layernorm else 1)
    return dense, expert
