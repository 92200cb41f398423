"""The seed's rule "a model of 7B or less: DDP + ZeRO-2, no pipeline", computed.

    ZeRO-2 per GPU = 2Ψ + 14Ψ/N  (+ activations: l x activation_bytes_per_layer)
    a pipeline of p stages, m micro-batches: idle share (p - 1)/(m + p - 1)

A GPT-shaped 7B (Llama-2-7B's h = 4096, 32 layers, 32 heads: 6.7B parameters in this
GPT's shape), bf16, micro-batches of 1 sequence, no dropout, on 80 GB GPUs: the memory of
one GPU under ZeRO-2 over N data-parallel ranks for a few sequence lengths and recompute
choices, and what a pipeline of 2 stages would cost in idle time instead.
"""

from __future__ import annotations

from typing import Any

from ...nn import GPTConfig
from ...plan import activation_bytes_per_layer, model_state_bytes

SEVEN_B = GPTConfig(vocab_size=32000, seq_len=4096, hidden=4096, num_heads=32, num_layers=32,
                    dtype="bfloat16")
HBM = 80e9


def zero2_memory(cfg: GPTConfig = SEVEN_B, dp: int = 8, seq_len: int = 4096,
                 recompute: str = "none") -> float:
    """Bytes one GPU holds under ZeRO-2 over dp ranks, at the activation peak of one
    micro-batch of one sequence of seq_len tokens (every layer's saved activations)."""
    psi = cfg.num_parameters()
    states = model_state_bytes(psi, 2, dp)["total"]  # 2Ψ + 14Ψ/N
    layer = activation_bytes_per_layer(seq_len, 1, cfg.hidden, cfg.num_heads, recompute,
                                       dropout=False)
    return states + cfg.num_layers * layer


def rule_table(dps=(8, 64), seq_lens=(4096, 32768),
               recomputes=("none", "selective", "full")) -> list[dict[str, Any]]:
    """One row per (dp, seq_len, recompute): GB a GPU and whether it fits 80 GB."""
    rows = []
    for dp in dps:
        for s in seq_lens:
            for r in recomputes:
                gb = zero2_memory(SEVEN_B, dp, s, r) / 1e9
                rows.append({"dp": dp, "seq_len": s, "recompute": r, "gb": gb,
                             "fits": gb * 1e9 <= HBM})
    return rows


def pipeline_idle(p: int, m: int) -> float:
    """The idle share of a step with p equal stages and m micro-batches (GPipe, 1F1B)."""
    return (p - 1) / (m + p - 1)
