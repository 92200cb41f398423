"""A pre-LayerNorm transformer block, and activation recomputation.

    x1 = x  + dropout(attn(ln1(x)))
    y  = x1 + dropout(mlp(ln2(x1)))
(GPT-2, Radford et al. 2019.) Backward runs the same graph in reverse: each residual
branch's gradient is added to the gradient flowing straight through.

Recomputation (Chen et al. 2016; Korthikanti et al. 2022):
  "none"       every tensor each op saves stays until backward: 34 sbh + 5 a s^2 b bytes
               per block in 16-bit precision with dropout on (see docs/model.md)
  "selective"  the attention core keeps only Q, K, V and recomputes softmax and dropout:
               34 sbh per block, for one more Q K^T matmul
  "full"       the block keeps only its input x (2 sbh) and a copy of the dropout generator;
               backward runs the block's forward again first (one more forward's FLOPs)
Each block has its own mode: GPTConfig.recompute_every = k recomputes only every k-th
block and lets the others keep everything (GPTConfig.block_recompute).
"""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np

from .attention import CausalSelfAttention
from .dropout import dropout_backward, dropout_forward
from .layernorm import LayerNorm
from .mlp import MLP
from .saved import Saved, release_all


class Block:
    """One transformer layer: x [s, b, h] -> y [s, b, h]."""

    def __init__(self, name: str, cfg, mlp=None, recompute: Optional[str] = None):
        """recompute: this block's mode (default cfg.recompute; GPT passes
        cfg.block_recompute(i))."""
        dt, std = cfg.np_dtype, cfg.init_std
        out_std = std / np.sqrt(2 * cfg.num_layers)  # GPT-2's scaled residual projections
        self.name, self.dropout = name, cfg.dropout
        self.recompute = cfg.recompute if recompute is None else recompute
        self.ln1 = LayerNorm(f"{name}.ln1", cfg.hidden, cfg.layernorm_eps, dt)
        self.attn = CausalSelfAttention(f"{name}.attn", cfg.hidden, cfg.num_heads, cfg.dropout,
                                        cfg.seed, dt, std, out_std)
        self.ln2 = LayerNorm(f"{name}.ln2", cfg.hidden, cfg.layernorm_eps, dt)
        self.mlp = mlp if mlp is not None else MLP(f"{name}.mlp", cfg.hidden, cfg.ffn, cfg.gelu,
                                                   cfg.seed, dt, std, out_std)

    def parameters(self) -> list:
        return (self.ln1.parameters() + self.attn.parameters() + self.ln2.parameters()
                + self.mlp.parameters())

    # ---- forward ----------------------------------------------------------------------
    def residual_rng(self, rng):
        """The generator the two residual dropouts draw from: `rng` itself here; a layer
        whose residual stream is split (sequence parallelism) hands out its slice."""
        return rng

    def forward(self, x: np.ndarray, rng: np.random.Generator):
        """y, saved = block.forward(x, rng), honouring the block's recompute mode."""
        if self.recompute == "full":
            replay = copy.deepcopy(rng)  # the generator as it is now: the same masks again
            y, inner = self._forward(x, rng, selective=False)
            release_all(inner)  # keep nothing of the inside: backward runs it again
            return y, Saved(f"{self.name}.input", x=x, replay=replay)
        return self._forward(x, rng, selective=self.recompute == "selective")

    def _forward(self, x: np.ndarray, rng: np.random.Generator, selective: bool):
        a_in, s_ln1 = self.ln1.forward(x)  # a_in: [s, b, h]
        a_out, s_attn = self.attn.forward(a_in, rng, selective)  # a_out: [s, b, h]
        a_drop, s_d1 = dropout_forward(a_out, self.dropout, self.residual_rng(rng))
        x1 = x + a_drop  # x1: [s, b, h]
        m_in, s_ln2 = self.ln2.forward(x1)
        m_out, s_mlp = self.mlp.forward(m_in, rng)
        m_drop, s_d2 = dropout_forward(m_out, self.dropout, self.residual_rng(rng))
        return x1 + m_drop, (s_ln1, s_attn, s_d1, s_ln2, s_mlp, s_d2)

    # ---- backward ---------------------------------------------------------------------
    def backward(self, dy: np.ndarray, saved) -> np.ndarray:
        """dx = block.backward(dy, saved); accumulates the parameters' gradients."""
        if self.recompute == "full":
            x, rng = saved.x, saved.replay
            saved.release()
            _, saved = self._forward(x, rng, selective=False)  # the forward, once more
        s_ln1, s_attn, s_d1, s_ln2, s_mlp, s_d2 = saved
        dm_out = dropout_backward(dy, s_d2)
        dm_in = self.mlp.backward(dm_out, s_mlp)
        dx1 = dy + self.ln2.backward(dm_in, s_ln2)  # residual: straight through + branch
        da_out = dropout_backward(dx1, s_d1)
        da_in = self.attn.backward(da_out, s_attn)
        return dx1 + self.ln1.backward(da_in, s_ln1)
