"""The GPT of nn.gpt with Megatron tensor parallelism (and, optionally, sequence parallelism).

    x0     = dropout(g(VocabParallelEmbedding(ids)) + wpe[positions])    [s, b, h]
             (SP: split along s before the dropout: [s/t, b, h])
    x_l    = ParallelTransformerLayer_l(x_{l-1})
    logits = f(ln_f(x_L)) W_head,r^T                                       [s, b, V/t]
             (SP: f̄, an all-gather along s; W_head,r = wte's shard when tied)
    loss   = vocab_parallel_cross_entropy(logits, targets)                three [s, b] all-reduces

Every rank of a tensor-parallel group runs this program on the same tokens and holds 1/t
of every weight matrix; the loss, and the gradients gathered across the group, equal the
single-device model's (tests/parallel/tp/test_equivalence.py). The position embedding
(s·h), the LayerNorms and the row-parallel biases are replicated on every rank.

The model has GPT's interface — `forward`, `backward`, `loss_and_grad`, `parameters`,
`units` (root, then blocks.i) and `hooks` — so the data-parallel engines wrap it unchanged
on a dp × tp mesh: give them the dp group, and this model the tp group. `batch_shard`
says which block of the global batch this rank's tokens are, so that dropout masks are the
global batch's (see random.py); `parallel.mesh.parallelize` builds all of it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...nn.config import GPTConfig
from ...nn.dropout import dropout_backward, dropout_forward
from ...nn.embedding import Embedding
from ...nn.hooks import Hooks
from ...nn.parameter import Parameter
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .mappings import scatter_to_sequence_parallel_region
from .random import TensorParallelRNG, check_batch_shard
from .sequence import SequenceParallelGrads, SequenceParallelLayerNorm
from .layers import ColumnParallelLinear, divide, gather_parameter
from .block import ParallelTransformerLayer
from .vocab import (VocabParallelEmbedding, vocab_parallel_cross_entropy,
                    vocab_parallel_cross_entropy_backward, vocab_range)


def check_tensor_parallel(cfg: GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """Refuse a configuration that tp ranks cannot split, naming the fix."""
    if not isinstance(tp, (int, np.integer)) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a positive integer, got {tp!r}")
    divide(cfg.num_heads, tp, "num_heads", "each rank needs whole attention heads; choose "
           "num_heads divisible by tp (Megatron: num_attention_heads % tp == 0)")
    divide(cfg.ffn, tp, "ffn_hidden", "choose ffn_hidden divisible by tp")
    vocab_range(cfg.vocab_size, 0, tp)
    if sequence_parallel:
        divide(cfg.seq_len, tp, "seq_len", "sequence parallelism splits the sequence into tp "
               "equal parts; choose seq_len divisible by tp")


class TensorParallelGPT:
    """GPT split over `tp_group`; `sequence_parallel` splits the residual stream along s."""

    def __init__(self, cfg: GPTConfig, tp_group: ProcessGroup, sequence_parallel: bool = False,
                 batch_shard: tuple[int, int] = (0, 1)):
        check_tensor_parallel(cfg, tp_group.size, sequence_parallel)
        self.batch_shard = check_batch_shard(batch_shard)
        self.cfg, self.group, self.sequence_parallel = cfg, tp_group, sequence_parallel
        self.tp_rank = tp_group.group_rank(current().rank)
        dt, std, seed, g = cfg.np_dtype, cfg.init_std, cfg.seed, tp_group
        self.wte = VocabParallelEmbedding("wte", cfg.vocab_size, cfg.hidden, g, seed, dt, std)
        self.wpe = Embedding("wpe", cfg.seq_len, cfg.hidden, seed, dt, std)  # replicated
        self.blocks = [ParallelTransformerLayer(f"blocks.{i}", cfg, g, sequence_parallel,
                                                cfg.block_recompute(i))
                       for i in range(cfg.num_layers)]
        self.root_grads = SequenceParallelGrads(g) if sequence_parallel else None
        self.ln_f = SequenceParallelLayerNorm("ln_f", cfg.hidden, cfg.layernorm_eps, dt,
                                              self.root_grads)
        self.lm_head = ColumnParallelLinear(
            "lm_head", cfg.hidden, cfg.vocab_size, g, bias=False,
            sequence_parallel=sequence_parallel, seed=seed, dtype=dt, std=std,
            skip_weight_param_allocation=cfg.tie_embeddings)
        self.hooks = Hooks()

    # ---- parameters ------------------------------------------------------------------
    def _root(self) -> list[Parameter]:
        return (self.wte.parameters() + self.wpe.parameters() + self.ln_f.parameters()
                + self.lm_head.parameters())

    def parameters(self) -> list[Parameter]:
        """This rank's parameters (shards keep the full parameter's name), GPT's order."""
        ps = self.wte.parameters() + self.wpe.parameters()
        for blk in self.blocks:
            ps += blk.parameters()
        return ps + self.ln_f.parameters() + self.lm_head.parameters()

    def units(self) -> list[tuple[str, list[Parameter]]]:
        return [("root", self._root())] + [(b.name, b.parameters()) for b in self.blocks]

    def named_parameters(self) -> dict[str, Parameter]:
        return {p.name: p for p in self.parameters()}

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.free_grad()

    def full_parameters(self, grad: bool = False) -> dict[str, np.ndarray]:
        """{name: the full array} gathered over the tp group (a collective): what the
        single-device model holds."""
        return {p.name: gather_parameter(p, self.group, grad) for p in self.parameters()}

    # ---- forward and backward ---------------------------------------------------------
    def _rng(self, rng: Optional[np.random.Generator]) -> TensorParallelRNG:
        base = rng if rng is not None else np.random.default_rng(self.cfg.seed)
        return TensorParallelRNG(base, self.tp_rank, self.group.size, self.batch_shard)

    def _embed_rng(self, rng: TensorParallelRNG):
        if self.sequence_parallel:
            return rng.sharded(axis=0, batch_axis=1)
        return rng.replicated(batch_axis=1)

    def forward(self, ids: np.ndarray, targets: np.ndarray,
                rng: Optional[np.random.Generator] = None):
        """loss, cache.  ids, targets: int [s, b] — the same on every rank of the tp group."""
        s, b = self._check(ids, targets)
        rng = self._rng(rng)
        self.hooks.fire("forward_pre", "root")
        tok, s_wte = self.wte.forward(ids)  # tok: [s, b, h], all-reduced (g)
        pos, s_wpe = self.wpe.forward(np.broadcast_to(np.arange(s)[:, None], (s, b)))
        x = tok + pos  # x: [s, b, h]
        if self.sequence_parallel:
            x = scatter_to_sequence_parallel_region.forward(x, self.group)  # x: [s/t, b, h]
        x, s_drop = dropout_forward(x, self.cfg.dropout, self._embed_rng(rng))
        s_blocks = []
        for blk in self.blocks:
            self.hooks.fire("forward_pre", blk.name)
            x, sb = blk.forward(x, rng)  # x: [s, b, h] ([s/t, b, h])
            self.hooks.fire("forward_post", blk.name)
            s_blocks.append(sb)
        x, s_lnf = self.ln_f.forward(x)
        head_w = self.wte.weight if self.cfg.tie_embeddings else None
        (logits, _), s_head = self.lm_head.forward(x, head_w)  # logits: [s, b, V/t]
        loss, s_ce = vocab_parallel_cross_entropy(logits, targets, self.group)
        self.hooks.fire("forward_post", "root")
        return float(loss), (s_wte, s_wpe, s_drop, s_blocks, s_lnf, s_head, s_ce)

    def backward(self, cache, dloss: float = 1.0) -> None:
        """Accumulate every shard's gradient of dloss * loss (sequence-parallel partial
        gradients are all-reduced over tp at the end of each unit's backward)."""
        s_wte, s_wpe, s_drop, s_blocks, s_lnf, s_head, s_ce = cache
        self.hooks.fire("backward_pre", "root")
        dlogits = vocab_parallel_cross_entropy_backward(dloss, s_ce)  # [s, b, V/t]
        head_w = self.wte.weight if self.cfg.tie_embeddings else None
        dx = self.lm_head.backward(dlogits, s_head, head_w)  # dx: like x (f / f̄ done)
        dx = self.ln_f.backward(dx, s_lnf)
        for blk, sb in zip(reversed(self.blocks), reversed(s_blocks)):
            self.hooks.fire("backward_pre", blk.name)
            dx = blk.backward(dx, sb)
            if blk.sp_grads is not None:
                blk.sp_grads.flush()  # one all-reduce of the block's LN and bias gradients
            self.hooks.fire("backward_post", blk.name)
        dx = dropout_backward(dx, s_drop)
        if self.sequence_parallel:
            dx = scatter_to_sequence_parallel_region.backward(dx, self.group)  # [s, b, h]
        self.wpe.backward(dx, s_wpe)
        self.wte.backward(dx, s_wte)
        if self.root_grads is not None:
            self.root_grads.flush()  # ln_f's gradients
        self.hooks.fire("backward_post", "root")

    def loss_and_grad(self, ids: np.ndarray, targets: np.ndarray,
                      rng: Optional[np.random.Generator] = None, loss_scale: float = 1.0
                      ) -> float:
        loss, cache = self.forward(ids, targets, rng)
        self.backward(cache, loss_scale)
        return loss

    def _check(self, ids: np.ndarray, targets: np.ndarray) -> tuple[int, int]:
        if ids.ndim != 2 or targets.shape != ids.shape:
            raise ValueError(f"ids and targets must both be int [s, b] (sequence first), got "
                             f"{ids.shape} and {targets.shape}")
        s, b = ids.shape
        if s > self.cfg.seq_len:
            raise ValueError(f"sequence length {s} exceeds the model's seq_len "
                             f"{self.cfg.seq_len}; cut the input or raise GPTConfig.seq_len")
        if self.sequence_parallel and s % self.group.size:
            raise ValueError(f"rank {current().rank}: sequence parallelism splits the {s} "
                             f"tokens of each sequence into tp = {self.group.size} equal "
                             f"parts; feed sequences whose length divides by {self.group.size}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")
        return s, b
