"""Parameters one rank holds for one pipeline stage: what its optimizer updates and its
data-parallel group reduces.

    dense  = n · (one layer on a tp rank, rank_states.layer_on_rank: the matrices and
             column-parallel biases ÷ t, row-parallel biases and norms whole, the router
             whole, shared experts ÷ t)
             + [first stage] ceil(V/t)·h (+ s·h learned positions)
             + [last stage] ceil(V/t)·h head (or the tied embedding's copy when pp > 1)
               + the final norm
    expert = n · (E/ep) experts ÷ t       (reduced over the expert-data-parallel group)

The same counts rank_memory reports for the first pipeline rank (rank_states.py).
"""

from __future__ import annotations

from .rank_states import layer_on_rank


def stage_parameters(model, layout, stage: int, stages: int, layers: int) -> tuple[float, float]:
    """(dense, expert) parameters of `stage` (of `stages`, holding `layers` layers) on one
    rank of `layout` (module docstring)."""
    t, h = layout.tp, model.hidden
    per_dense, per_expert, _ = layer_on_rank(model, t, layout.ep)
    dense, expert = float(layers * per_dense), float(layers * per_expert)
    V_t = -(-model.vocab // t)
    if stage == 0:
        dense += V_t * h + (model.seq_len * h if model.learned_positions else 0)
    if stage == stages - 1:
        if not model.tied or layout.pp > 1:
            dense += V_t * h
        dense += h * (2 if model.layernorm else 1)
    return dense, expert
