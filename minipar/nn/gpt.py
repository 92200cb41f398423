"""The GPT every parallel form is proven against: explicit forward, explicit backward.

    x0     = dropout(wte[ids] + wpe[positions])              # [s, b, h]
    x_l    = block_l(x_{l-1})                                 # l = 1 .. L
    logits = ln_f(x_L) W_head^T     (W_head = wte when tied)  # [s, b, V]
    loss   = mean cross-entropy(logits, targets)
(GPT-2, Radford et al. 2019; the [s, b, h] layout of Megatron-LM, Shoeybi et al. 2019.)

`forward` returns the loss and everything backward needs (`Saved` objects, charged to the
ledger as activations); `backward` walks the same path in reverse and accumulates every
parameter's gradient. Nothing is hidden: read `backward` to see each gradient path.

Units. The model is cut into units, as FSDP wraps modules: one per block ("blocks.i"),
and the "root" holding everything outside the blocks (embeddings, final LayerNorm, head —
with tied embeddings the head's weight *is* the embedding's, so both stay in one unit).
`model.hooks` fires forward_pre/forward_post/backward_pre/backward_post around each unit
(see hooks.py): the root's forward_pre comes first and its backward_post last.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .block import Block
from .config import GPTConfig
from .cross_entropy import cross_entropy_backward, cross_entropy_forward
from .dropout import dropout_backward, dropout_forward
from .embedding import Embedding
from .hooks import Hooks
from .layernorm import LayerNorm
from .linear import Linear, linear_backward, linear_forward
from .parameter import Parameter


class GPT:
    """A decoder-only transformer built from a validated `GPTConfig`.

    `mlp_factory(layer_index)` may supply each block's MLP (a mixture of experts, say);
    by default every block gets the dense `MLP`.
    """

    def __init__(self, cfg: GPTConfig, mlp_factory: Optional[Callable[[int], object]] = None):
        self.cfg = cfg
        dt, std, seed = cfg.np_dtype, cfg.init_std, cfg.seed
        self.wte = Embedding("wte", cfg.vocab_size, cfg.hidden, seed, dt, std)
        self.wpe = Embedding("wpe", cfg.seq_len, cfg.hidden, seed, dt, std)
        self.blocks = [Block(f"blocks.{i}", cfg, mlp_factory(i) if mlp_factory else None,
                             recompute=cfg.block_recompute(i))
                       for i in range(cfg.num_layers)]
        self.ln_f = LayerNorm("ln_f", cfg.hidden, cfg.layernorm_eps, dt)
        self.lm_head = None if cfg.tie_embeddings else Linear(
            "lm_head", cfg.hidden, cfg.vocab_size, bias=False, seed=seed, dtype=dt, std=std)
        self.hooks = Hooks()

    # ---- parameters ------------------------------------------------------------------
    def parameters(self) -> list[Parameter]:
        """Every parameter once, in a fixed order (embeddings, blocks, final LN, head)."""
        ps = self.wte.parameters() + self.wpe.parameters()
        for blk in self.blocks:
            ps += blk.parameters()
        ps += self.ln_f.parameters()
        if self.lm_head is not None:
            ps += self.lm_head.parameters()
        return ps

    def units(self) -> list[tuple[str, list[Parameter]]]:
        """[(unit name, its parameters)]: the root first, then the blocks in order."""
        root = self.wte.parameters() + self.wpe.parameters() + self.ln_f.parameters()
        if self.lm_head is not None:
            root += self.lm_head.parameters()
        return [("root", root)] + [(blk.name, blk.parameters()) for blk in self.blocks]

    def named_parameters(self) -> dict[str, Parameter]:
        return {p.name: p for p in self.parameters()}

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.free_grad()

    # ---- forward and backward ---------------------------------------------------------
    def forward(self, ids: np.ndarray, targets: np.ndarray,
                rng: Optional[np.random.Generator] = None):
        """loss, cache = model.forward(ids, targets, rng).  ids, targets: int [s, b]."""
        s, b = self._check(ids, targets)
        rng = rng if rng is not None else np.random.default_rng(self.cfg.seed)
        self.hooks.fire("forward_pre", "root")
        tok, s_wte = self.wte.forward(ids)  # tok: [s, b, h]
        positions = np.broadcast_to(np.arange(s)[:, None], (s, b))
        pos, s_wpe = self.wpe.forward(positions)  # pos: [s, b, h]
        x, s_drop = dropout_forward(tok + pos, self.cfg.dropout, rng)  # x: [s, b, h]
        s_blocks = []
        for blk in self.blocks:
            self.hooks.fire("forward_pre", blk.name)
            x, sb = blk.forward(x, rng)  # x: [s, b, h]
            self.hooks.fire("forward_post", blk.name)
            s_blocks.append(sb)
        x, s_lnf = self.ln_f.forward(x)
        if self.lm_head is not None:
            logits, s_head = self.lm_head.forward(x)  # logits: [s, b, V]
        else:
            logits, s_head = linear_forward(x, self.wte.weight.data, label="lm_head (tied)")
        loss, s_ce = cross_entropy_forward(logits, targets)
        self.hooks.fire("forward_post", "root")
        return float(loss), (s_wte, s_wpe, s_drop, s_blocks, s_lnf, s_head, s_ce)

    def backward(self, cache, dloss: float = 1.0) -> None:
        """Accumulate d(dloss * loss)/d(parameter) into every parameter's `.grad`."""
        s_wte, s_wpe, s_drop, s_blocks, s_lnf, s_head, s_ce = cache
        self.hooks.fire("backward_pre", "root")
        dlogits = cross_entropy_backward(dloss, s_ce)  # dlogits: [s, b, V]
        if self.lm_head is not None:
            dx = self.lm_head.backward(dlogits, s_head)
        else:  # tied: the head's weight gradient joins the embedding's
            dx, dw, _ = linear_backward(dlogits, s_head, self.wte.weight.data, False)
            self.wte.weight.accumulate(dw)
        dx = self.ln_f.backward(dx, s_lnf)  # dx: [s, b, h]
        for blk, sb in zip(reversed(self.blocks), reversed(s_blocks)):
            self.hooks.fire("backward_pre", blk.name)
            dx = blk.backward(dx, sb)
            self.hooks.fire("backward_post", blk.name)
        dx = dropout_backward(dx, s_drop)
        self.wpe.backward(dx, s_wpe)  # positions and tokens both receive dx
        self.wte.backward(dx, s_wte)
        self.hooks.fire("backward_post", "root")

    def loss_and_grad(self, ids: np.ndarray, targets: np.ndarray,
                      rng: Optional[np.random.Generator] = None, loss_scale: float = 1.0
                      ) -> float:
        """Forward and backward of one (micro-)batch; gradients of loss_scale * loss
        accumulate (scale by 1/k for k micro-batches: see minipar.data)."""
        loss, cache = self.forward(ids, targets, rng)
        self.backward(cache, loss_scale)
        return loss

    def _check(self, ids: np.ndarray, targets: np.ndarray) -> tuple[int, int]:
        if ids.ndim != 2:
            raise ValueError(f"ids must be int [s, b] (sequence first), got shape {ids.shape}")
        if targets.shape != ids.shape:
            raise ValueError(f"targets must match ids' shape {ids.shape}, got {targets.shape}")
        s, b = ids.shape
        if s > self.cfg.seq_len:
            raise ValueError(f"sequence length {s} exceeds the model's seq_len "
                             f"{self.cfg.seq_len}; cut the input or raise GPTConfig.seq_len")
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")
        return s, b
