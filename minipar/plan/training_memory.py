"""Bytes of one single-device training run, before it runs: M = Ψ(p + g + K) + l·A_layer + A_head.

The course's formulas applied to a configuration (what the ledger will record, category by
category, for `minipar train`):

    parameters        p Ψ          p = bytes of the model dtype (2 bf16/fp16, 4, 8)
    gradients         p Ψ          + 4 n_max for 16-bit models: the float32 copy of one
                                   tensor at a time that MixedPrecisionOptimizer makes
    optimizer_states  2 p Ψ        AdamW's m and v in the model dtype (float32, float64)
                      12 Ψ         float32 master, m and v (bf16/fp16: ZeRO's K = 12)
    activations       l · A_layer  one micro-batch of b = B/k sequences, memory.py:
                                   16p·sbh + p·a s² b a layer without dropout, whose
                                   p·a s² b is the attention scores' softmax
                    + s b (2 p h + p V + c + 24)   the head: ln_f and lm_head inputs,
                                   the logits, the log-sum-exp (c = 4, 8 for float64) and
                                   the int64 token ids, positions and targets
                      with recomputation ("full", or "segments" of k layers) the larger of
                      the forward's end, n · I + the head (n = ceil(l/k) kept inputs,
                      I = p·sbh), and the backward's worst segment,
                      16 sb (ids, positions) + max_m (m I + k_m A_layer) (memory.py)

Ψ = GPTConfig.num_parameters(), n_max = the largest parameter's elements. Each figure is
the peak of its category; the ledger's peak total is at most their sum (gradients fill as
the backward frees activations), so the sum is a bound that the run cannot exceed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory import activation_bytes_per_layer, segment_sizes, segments_activation_bytes

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
MIXED = ("bfloat16", "float16")


@dataclass(frozen=True)
class TrainingMemory:
    """Peak bytes per ledger category of one training run, and their sum."""

    parameters: float
    gradients: float
    optimizer_states: float
    activations: float
    attention_scores: float   # inside activations: l · p a s² b

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states + self.activations


def training_memory(num_parameters: int, largest_parameter: int, micro_batch: int,
                    seq_len: int, num_layers: int, hidden: int, num_heads: int,
                    vocab_size: int, dtype: str, recompute: str = "none",
                    recompute_segment: int = 1) -> TrainingMemory:
    """The peaks of a run of the single-device loop (module docstring), AdamW, no dropout;
    recompute "none", "full" or "segments" (of recompute_segment layers)."""
    if dtype not in ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(ITEMSIZE)}, got {dtype!r}")
    if recompute not in ("none", "full", "segments"):
        raise ValueError(f"training_memory models recompute 'none', 'full' or 'segments', "
                         f"got {recompute!r}")
    p = ITEMSIZE[dtype]
    psi, s, b, h, a, V, l = (num_parameters, seq_len, micro_batch, hidden, num_heads,
                             vocab_size, num_layers)
    mixed = dtype in MIXED
    layer = activation_bytes_per_layer(s, b, h, a, act_bytes=p, dropout=False)
    c = 8 if dtype == "float64" else 4
    head = s * b * (2 * p * h + p * V + c + 3 * 8)
    if recompute == "none":
        activations = l * layer + head
    else:  # "full" is segments of one layer
        k = recompute_segment if recompute == "segments" else 1
        kept = activation_bytes_per_layer(s, b, h, a, "full", act_bytes=p, dropout=False)
        n = len(segment_sizes(l, k))
        activations = max(n * kept + head,
                          2 * 8 * s * b + segments_activation_bytes(l, k, layer, kept))
    return TrainingMemory(
        parameters=float(p * psi),
        gradients=float(p * psi + (4 * largest_parameter if mixed else 0)),
        optimizer_states=float(12 * psi if mixed else 2 * p * psi),
        activations=float(activations),
        attention_scores=float(l * p * a * s * s * b))
