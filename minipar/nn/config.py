"""The GPT configuration: one validated dataclass that every layout of the model starts from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import ml_dtypes
import numpy as np

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
RECOMPUTE = ("none", "selective", "full")


def as_dtype(name) -> np.dtype:
    """'bfloat16' -> the ml_dtypes bfloat16 dtype; any numpy dtype passes through."""
    if isinstance(name, str):
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(DTYPES)}")
        return DTYPES[name]
    return np.dtype(name)


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only transformer (GPT-2 style, pre-LayerNorm).

    vocab_size  V      seq_len   s (max positions)   hidden  h
    num_heads   a      num_layers l                  ffn_hidden (default 4h)
    """

    vocab_size: int = 64
    seq_len: int = 16
    hidden: int = 32
    num_heads: int = 4
    num_layers: int = 2
    ffn_hidden: Optional[int] = None
    dropout: float = 0.0
    tie_embeddings: bool = False
    gelu: str = "tanh"  # "tanh" (GPT-2's approximation) or "none" (exact, with erf)
    layernorm_eps: float = 1e-5
    dtype: str = "float64"  # parameters and activations; "bfloat16"/"float16" = mixed precision
    init_std: float = 0.02
    seed: int = 0
    recompute: str = "none"  # "none" | "selective" (attention core) | "full" (whole block)
    recompute_every: int = 1  # only every k-th block recomputes (block i: (i + 1) % k == 0)

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "hidden", "num_heads", "num_layers"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
        if self.hidden % self.num_heads:
            raise ValueError(
                f"GPTConfig: num_heads={self.num_heads} must divide hidden={self.hidden} "
                f"(each head gets hidden/num_heads dimensions); try num_heads in "
                f"{[d for d in range(1, self.hidden + 1) if self.hidden % d == 0][:8]}")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ValueError(f"GPTConfig.ffn_hidden must be positive, got {self.ffn_hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"GPTConfig.gelu must be 'tanh' or 'none', got {self.gelu!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"GPTConfig.recompute must be one of {RECOMPUTE}, "
                             f"got {self.recompute!r}")
        if not isinstance(self.recompute_every, (int, np.integer)) or self.recompute_every < 1:
            raise ValueError(f"GPTConfig.recompute_every must be a positive integer (1: every "
                             f"block recomputes, k: every k-th), got {self.recompute_every!r}")
        as_dtype(self.dtype)
        if self.init_std <= 0:
            raise ValueError(f"GPTConfig.init_std must be positive, got {self.init_std}")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def np_dtype(self) -> np.dtype:
        return as_dtype(self.dtype)

    def block_recompute(self, i: int) -> str:
        """The recompute mode of block i: `recompute` for every k-th block (k =
        recompute_every, counted from 1: blocks k-1, 2k-1, ...), "none" for the others.

        Layer-selective activation checkpointing: torchtitan's `selective_ac_option="k"`
        checkpoints every k-th transformer block the same way (Megatron-LM's
        `recompute_method="block"` instead recomputes the first N blocks of a stage). The
        blocks that do not recompute keep all their activations and skip the extra forward:
        less recomputation for more activation memory. Gradients are identical either way.
        """
        return self.recompute if (i + 1) % self.recompute_every == 0 else "none"

    def with_(self, **changes) -> "GPTConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def num_parameters(self) -> int:
        """Parameter count: embeddings, l blocks (12h^2 + 13h with a 4h MLP), final LN, head."""
        h, V, f = self.hidden, self.vocab_size, self.ffn
        block = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
        head = 0 if self.tie_embeddings else V * h
        return V * h + self.seq_len * h + self.num_layers * block + 2 * h + head
