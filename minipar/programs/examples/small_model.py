"""ZeRO-2 a GPU = 2Ψ + 14Ψ/N + activations: the seed's "≤ 7B: DDP + ZeRO-2, no PP", computed.

    ZeRO-2 per GPU = 2Ψ + 14Ψ/N  (+ activations: l x activation_bytes_per_layer)
    a pipeline of p stages, m micro-batches: idle share (p - 1)/(m + p - 1)

A GPT-shaped 7B (Llama-2-7B's h = 4096, 32 layers, 32 heads: 6.7B parameters in this
GPT's shape), bf16, micro-batches of 1 sequence, no dropout, on 80 GB GPUs: the memory of
one GPU under ZeRO-2 over N data-parallel ranks for a few sequence lengths and recompute
choices, and what a pipeline of 2 stages would cost in idle time instead.
"""

from __future__ import annotations

from typing import Any, Callable

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


def run(out: Callable[[str], Any] = print) -> dict[str, Any]:
    """Print the table and the pipeline's idle share; returns {"rows", "idle"}."""
    rows, idle = rule_table(), pipeline_idle(2, 8)
    psi = SEVEN_B.num_parameters()
    out(f"<= 7B: DDP + ZeRO-2, no pipeline? A GPT-shaped 7B ({psi / 1e9:.1f}B parameters, "
        f"h={SEVEN_B.hidden}, {SEVEN_B.num_layers} layers), bf16, one sequence a "
        f"micro-batch, no dropout, on {HBM / 1e9:.0f} GB GPUs (computed with minipar.plan)")
    out(f"   {'ZeRO-2 over':>11} {'tokens':>7} {'recompute':>10} {'GB a GPU':>9}  fits")
    for r in rows:
        out(f"   {r['dp']:>11} {r['seq_len']:>7,} {r['recompute']:>10} {r['gb']:>9.1f}  "
            f"{'yes' if r['fits'] else 'no'}")
    out(f"   model states 2Ψ + 14Ψ/N; a pipeline of 2 stages at m = 8 would idle "
        f"(p - 1)/(m + p - 1) = {100 * idle:.1f} % of each step")
    lo, hi = min(r["seq_len"] for r in rows), max(r["seq_len"] for r in rows)
    short = all(r["fits"] for r in rows if r["seq_len"] == lo)
    long = sorted({r["recompute"] for r in rows if r["seq_len"] == hi and r["fits"]})
    out(f"   every short-sequence row fits: {short}; at {hi:,} tokens only with recompute "
        f"{', '.join(long) or 'none'}: the sequence length, not the parameter count, decides")
    return {"rows": rows, "idle": idle}
