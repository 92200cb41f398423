"""The GPT configuration: one validated dataclass that every layout of the model starts from."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import ml_dtypes
import numpy as np

from .moe.config import MoEConfig

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
RECOMPUTE = ("none", "selective", "full", "segments")


def as_dtype(name) -> np.dtype:
    """'bfloat16' -> the ml_dtypes bfloat16 dtype; any numpy dtype passes through."""
    if isinstance(name, str):
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(DTYPES)}")
        return DTYPES[name]
    return np.dtype(name)


def _is_real(v) -> bool:
    """A real number, not a bool (True is an int in Python, never a probability or a size)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_))


def _check_int(name: str, v, minimum: int, what: str) -> None:
    if not (_is_real(v) and isinstance(v, (int, np.integer)) and v >= minimum):
        raise ValueError(f"GPTConfig.{name} must be {what}, got {v!r}")


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only transformer (GPT-2 style, pre-LayerNorm).

    vocab_size  V      seq_len   s (max positions)   hidden  h
    num_heads   a      num_layers l                  ffn_hidden (default 4h)
    recompute   a block's own mode (nn/block.py), or "segments": checkpoint segments of
                recompute_segment blocks, the last shorter (nn/segments.py)
    moe         a MoEConfig: a mixture of experts in the MLP slot of some blocks (nn/moe)
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
    #                          | "segments" (checkpoint segments of recompute_segment blocks)
    recompute_segment: int = 1  # blocks per checkpoint segment, with recompute="segments"
    moe: Optional[MoEConfig] = None  # None: every block's MLP is dense

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "hidden", "num_heads", "num_layers"):
            _check_int(name, getattr(self, name), 1, "a positive integer")
        _check_int("seed", self.seed, 0, "an integer >= 0 (numpy seeds are non-negative)")
        if self.hidden % self.num_heads:
            raise ValueError(
                f"GPTConfig: num_heads={self.num_heads} must divide hidden={self.hidden} "
                f"(each head gets hidden/num_heads dimensions); try num_heads in "
                f"{[d for d in range(1, self.hidden + 1) if self.hidden % d == 0][:8]}")
        if self.ffn_hidden is not None:
            _check_int("ffn_hidden", self.ffn_hidden, 1, "a positive integer (None: 4 hidden)")
        if not (_is_real(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"GPTConfig.dropout must be in [0, 1) (the probability of zeroing "
                             f"an element), got {self.dropout!r}")
        if not isinstance(self.tie_embeddings, (bool, np.bool_)):
            raise ValueError(f"GPTConfig.tie_embeddings must be True or False, got "
                             f"{self.tie_embeddings!r}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"GPTConfig.gelu must be 'tanh' or 'none', got {self.gelu!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"GPTConfig.recompute must be one of {RECOMPUTE}, "
                             f"got {self.recompute!r}")
        _check_int("recompute_segment", self.recompute_segment, 1,
                   "a positive integer (the number of blocks in one checkpoint segment)")
        if self.recompute_segment != 1 and self.recompute != "segments":
            raise ValueError(
                f"GPTConfig.recompute_segment={self.recompute_segment} sizes checkpoint "
                f"segments, but recompute={self.recompute!r} makes none; set "
                f"recompute='segments' to checkpoint {self.recompute_segment} blocks at a "
                f"time, or leave recompute_segment at 1")
        if not (isinstance(self.dtype, (str, np.dtype, type))
                and as_dtype(self.dtype) in DTYPES.values()):
            raise ValueError(f"GPTConfig.dtype must be one of {sorted(DTYPES)} (parameters and "
                             f"activations are floating point), got {self.dtype!r}")
        for name, what in (("init_std", "the standard deviation of the initial weights"),
                           ("layernorm_eps", "added to the variance before the root")):
            v = getattr(self, name)
            if not (_is_real(v) and math.isfinite(v) and v > 0):
                raise ValueError(f"GPTConfig.{name} must be a finite number > 0 ({what}), "
                                 f"got {v!r}")
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise ValueError(f"GPTConfig.moe must be a MoEConfig (or None for dense MLPs), got "
                             f"{type(self.moe).__name__} {self.moe!r}")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def np_dtype(self) -> np.dtype:
        return as_dtype(self.dtype)

    @property
    def layer_recompute(self) -> str:
        """The mode each block applies inside itself: `recompute`, except under "segments",
        where the blocks keep everything and the model's blocks step checkpoints the
        segments around them (nn/segments.py)."""
        return "none" if self.recompute == "segments" else self.recompute

    def with_(self, **changes) -> "GPTConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def num_parameters(self) -> int:
        """Parameter count: embeddings, l blocks (12h^2 + 13h with a 4h MLP), final LN, head;
        a mixture-of-experts block counts all its experts (MoEConfig.layer_parameters)."""
        return self._count(active=False)

    def num_active_parameters(self) -> int:
        """The parameters one token runs through: as num_parameters, with each MoE block's
        k experts instead of all E (DeepSeek-V3: about 37B of 671B)."""
        return self._count(active=True)

    def _count(self, active: bool) -> int:
        h, V, f = self.hidden, self.vocab_size, self.ffn
        attn_ln = (3 * h * h + 3 * h) + (h * h + h) + 4 * h
        dense = (h * f + f) + (f * h + h)
        moe = self.moe.layer_parameters(h, f)[1 if active else 0] if self.moe else 0
        blocks = sum(attn_ln + (moe if self.moe and self.moe.is_moe_block(i) else dense)
                     for i in range(self.num_layers))
        head = 0 if self.tie_embeddings else V * h
        return V * h + self.seq_len * h + blocks + 2 * h + head
