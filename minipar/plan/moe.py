"""Total and active parameters, and FLOPs per token, of a mixture-of-experts transformer.

    total  = embeddings + head + L · attention + L_dense · dense FFN
             + L_moe · (router + E routed experts + S shared experts)
    active = the same with k of the E routed experts (what one token runs)
    FLOPs  ≈ 6 · active (forward 2, backward 4, per parameter a token touches; the
             attention scores' s-dependent part left out, as in Kaplan et al.'s 6N)

The layers as DeepSeek-V3 builds them (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
section 2 and its published configuration): multi-head latent attention (MLA, from
DeepSeek-V2) with low-rank query and key-value projections and a decoupled RoPE key, and
SwiGLU feed-forward blocks of three matrices (gate, up, down) with no biases; RMSNorm
gains of h before attention and before the FFN of every layer, after the low-rank
projections, and at the end. The routers' selection bias (aux-loss-free balancing) is not a
parameter. The multi-token-prediction module (MTP) is left out, as the report's 671B does.

DEEPSEEK_V3 holds the published architecture (sizes, not results): the counts are computed
from it. tests/plan/test_moe_plan.py compares them with the report's 671B total and 37B
activated per token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention's sizes (DeepSeek-V2, section 2.1)."""

    heads: int
    q_lora_rank: int  # the query's low-rank latent (0: a full-rank query projection)
    kv_lora_rank: int  # the compressed key-value latent
    qk_nope_head_dim: int  # per head: the part of q and k without RoPE
    qk_rope_head_dim: int  # per head: the decoupled RoPE part (k's shared by all heads)
    v_head_dim: int

    def parameters(self, hidden: int) -> int:
        """W_DQ, its norm, W_UQ (q and its rope part); W_DKV with the shared rope key, its
        norm, W_UK and W_UV; W_O."""
        H, qk = self.heads, self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * H * qk
        else:
            q = hidden * H * qk
        kv = (hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * H * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + H * self.v_head_dim * hidden


@dataclass(frozen=True)
class MoETransformer:
    """A decoder of `layers` blocks, the first `dense_layers` with a dense SwiGLU FFN of
    width `dense_ffn`, the others with `experts` routed SwiGLU experts of width `expert_ffn`
    (k = `top_k` per token) and `shared_experts` shared ones of the same width."""

    vocab_size: int
    hidden: int
    layers: int
    dense_layers: int
    dense_ffn: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    attention: MLAConfig
    tie_embeddings: bool = False

    def _count(self, routed: int) -> int:
        h = self.hidden
        swiglu = 3 * h  # gate, up and down of a width-1 FFN
        attention = self.attention.parameters(h) + 2 * h  # and the two RMSNorm gains
        moe = (self.experts * h + routed * swiglu * self.expert_ffn
               + self.shared_experts * swiglu * self.expert_ffn)
        ends = self.vocab_size * h * (1 if self.tie_embeddings else 2) + h  # + final norm
        return (ends + self.layers * attention + self.dense_layers * swiglu * self.dense_ffn
                + (self.layers - self.dense_layers) * moe)

    def total_parameters(self) -> int:
        """Every parameter: all E routed experts of every MoE layer."""
        return self._count(self.experts)

    def active_parameters(self) -> int:
        """The parameters one token runs through: k routed experts a layer (the input
        embedding counted: its row is read)."""
        return self._count(self.top_k)

    def flops_per_token(self) -> float:
        """Training FLOPs per token, ≈ 6 · active parameters (matmuls only; attention's
        s-dependent scores left out)."""
        return 6.0 * self.active_parameters()


#: DeepSeek-V3's published architecture: h 7168, 61 layers (3 dense), 128 MLA heads,
#: 256 routed experts of width 2048 (8 per token) and 1 shared, a 129,280-token vocabulary
DEEPSEEK_V3 = MoETransformer(
    vocab_size=129280, hidden=7168, layers=61, dense_layers=3, dense_ffn=18432,
    experts=256, top_k=8, expert_ffn=2048, shared_experts=1,
    attention=MLAConfig(heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128))
