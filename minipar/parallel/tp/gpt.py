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

TensorParallelGPT is nn.GPT with parallel parts: the same steps (embed_forward,
blocks_forward, head_forward and their backwards), forward, backward, units (root, then
blocks.i), hooks and parameter order; it overrides only the parts it builds and the
places inside the steps where a parallel layout differs (marked in nn/gpt.py): the
dropout generator, the sequence-parallel scatter of the residual stream, the logits, the
loss and the SequenceParallelGrads flush that completes a unit's gradients. The
data-parallel engines wrap it unchanged on a dp × tp mesh: give them the dp group, and
this model the tp group. `batch_shard` says which block of the global batch this rank's
tokens are, so that dropout masks are the global batch's (see random.py);
`parallel.mesh.parallelize` builds all of it.
"""

from __future__ import annotations

from typing import Callable, Collection, Optional

import numpy as np

from ...nn.config import GPTConfig
from ...nn.gpt import GPT
from ...nn.hooks import EMBED, HEAD, ROOT, block_unit
from ...nn.saved import Saved
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .mappings import scatter_to_sequence_parallel_region
from .random import TensorParallelRNG, check_batch_shard
from .sequence import SequenceParallelGrads, SequenceParallelLayerNorm
from .layers import ColumnParallelLinear, divide, gather_parameter
from .block import LOCAL_CORE, AttentionCore, ParallelTransformerLayer, residual_stream_rng
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


class TensorParallelGPT(GPT):
    """GPT split over `tp_group`; `sequence_parallel` splits the residual stream along s."""

    def __init__(self, cfg: GPTConfig, tp_group: ProcessGroup, sequence_parallel: bool = False,
                 batch_shard: tuple[int, int] = (0, 1),
                 blocks_held: Optional[Collection[int]] = None,
                 mlp_factory: Optional[Callable[[int], object]] = None,
                 attention_core: AttentionCore = LOCAL_CORE,
                 positions: Optional[Callable[[int], np.ndarray]] = None):
        """mlp_factory(i): block i's MLP when it is not the tensor-parallel dense one (None:
        ParallelMLP); a mixture of experts (cfg.moe) needs it: parallel/mesh passes an
        expert-parallel MoE, replicated over the tp group, on the full sequence.
        attention_core: what every block's attention runs between its linears (nn's core
        on this rank's rows, or a context-parallel one); positions: int [s_local], the
        positions(s) -> int [s]: the global positions of the s sequence rows this rank runs,
        in its order (None: 0..s-1) (both from parallel/mesh under context parallelism)."""
        if cfg.moe is not None and (mlp_factory is None or sequence_parallel):
            raise ValueError(
                "GPTConfig.moe under tensor parallelism: the mixture-of-experts blocks are "
                "replicated over the tp group on the full sequence, so they need the "
                "mlp_factory parallelize passes (an expert-parallel MoE) and no sequence "
                "parallelism (sequence_parallel=False); build the run with parallelize")
        check_tensor_parallel(cfg, tp_group.size, sequence_parallel)
        self.batch_shard = check_batch_shard(batch_shard)
        self.group, self.sequence_parallel = tp_group, sequence_parallel
        self.tp_rank = tp_group.group_rank(current().rank)
        self.root_grads = SequenceParallelGrads(tp_group) if sequence_parallel else None
        self.tp_mlp_factory = mlp_factory
        self.attention_core = attention_core
        self.positions = positions
        super().__init__(cfg, blocks_held=blocks_held)  # builds the parts below, in order
        # the collector each unit's backward flushes (None: its gradients are complete);
        # a pipeline splits the root (split_root) into EMBED and HEAD, which share it
        self.unit_grads = {ROOT: self.root_grads, EMBED: self.root_grads,
                           HEAD: self.root_grads, **{
                               block_unit(i): blk.sp_grads for i, blk in enumerate(self.blocks)}}

    def full_parameters(self, grad: bool = False) -> dict[str, np.ndarray]:
        """{name: the full array} gathered over the tp group (a collective): what the
        single-device model holds."""
        return {p.name: gather_parameter(p, self.group, grad) for p in self.parameters()}

    # ---- parallel parts ---------------------------------------------------------------
    def build_wte(self) -> VocabParallelEmbedding:
        cfg = self.cfg
        return VocabParallelEmbedding("wte", cfg.vocab_size, cfg.hidden, self.group, cfg.seed,
                                      cfg.np_dtype, cfg.init_std)

    def build_block(self, i: int) -> ParallelTransformerLayer:
        f = self.tp_mlp_factory
        return ParallelTransformerLayer(block_unit(i), self.cfg, self.group,
                                        self.sequence_parallel, self.cfg.layer_recompute,
                                        None if f is None else f(i), self.attention_core)

    def build_ln_f(self) -> SequenceParallelLayerNorm:
        cfg = self.cfg
        return SequenceParallelLayerNorm("ln_f", cfg.hidden, cfg.layernorm_eps, cfg.np_dtype,
                                         self.root_grads)

    def build_lm_head(self) -> ColumnParallelLinear:
        """Column-parallel over the vocabulary; tied, it holds no weight and multiplies by
        wte's shard [V/t, h] (passed to forward and backward)."""
        cfg = self.cfg
        return ColumnParallelLinear(
            "lm_head", cfg.hidden, cfg.vocab_size, self.group, bias=False,
            sequence_parallel=self.sequence_parallel, seed=cfg.seed, dtype=cfg.np_dtype,
            std=cfg.init_std, skip_weight_param_allocation=cfg.tie_embeddings)

    # ---- where the steps differ from one device ------------------------------------------
    def position_ids(self, s: int, b: int) -> np.ndarray:
        """This rank's rows' global positions (context parallelism), else 0..s-1. [s, b]"""
        if self.positions is None:
            return super().position_ids(s, b)
        return np.broadcast_to(self.positions(s)[:, None], (s, b))  # [s, b]

    def dropout_rng(self, rng) -> TensorParallelRNG:
        """The single-device generator, handing out this rank's slices (random.py)."""
        if isinstance(rng, TensorParallelRNG):
            return rng
        return TensorParallelRNG(super().dropout_rng(rng), self.tp_rank, self.group.size,
                                 self.batch_shard)

    def residual_rng(self, rng: TensorParallelRNG):
        return residual_stream_rng(rng, self.sequence_parallel)

    def to_residual(self, x: np.ndarray) -> np.ndarray:
        """Sequence parallel: this rank's s/t positions (x: [s, b, h] -> [s/t, b, h])."""
        if self.sequence_parallel:
            return scatter_to_sequence_parallel_region.forward(x, self.group)
        return x

    def to_residual_backward(self, dx: np.ndarray) -> np.ndarray:
        """Sequence parallel: all-gather along s (dx: [s/t, b, h] -> [s, b, h])."""
        if self.sequence_parallel:
            return scatter_to_sequence_parallel_region.backward(dx, self.group)
        return dx

    def _head_weight(self):
        return self.wte.weight if self.cfg.tie_embeddings else None

    def logits_forward(self, x: np.ndarray) -> tuple[np.ndarray, Saved]:
        """logits_r = f(x) W_head,r^T (SP: f̄, an all-gather along s) -> [s, b, V/t]."""
        (logits, _), saved = self.lm_head.forward(x, self._head_weight())
        return logits, saved

    def logits_backward(self, dlogits: np.ndarray, saved: Saved, store=None) -> np.ndarray:
        """dx like x (f: all-reduce; SP f̄: reduce-scatter); tied, dW joins wte's shard
        (with a WeightGradStore, at its W)."""
        return self.lm_head.backward(dlogits, saved, self._head_weight(), store)

    def loss_forward(self, logits: np.ndarray, targets: np.ndarray):
        """Cross-entropy from vocabulary shards: three [s, b] all-reduces (vocab.py)."""
        return vocab_parallel_cross_entropy(logits, targets, self.group)

    def loss_backward(self, dloss: float, saved: Saved) -> np.ndarray:
        return vocab_parallel_cross_entropy_backward(dloss, saved)  # [s, b, V/t]

    def finish_backward(self, unit: str) -> None:
        """Sequence parallel: one all-reduce over tp of the unit's LayerNorm and
        row-parallel bias gradients (partial sums over the sequence shards)."""
        grads = self.unit_grads[unit]
        if grads is not None:
            grads.flush()

    def _check_ids(self, ids: np.ndarray) -> tuple[int, int]:
        s, b = super()._check_ids(ids)
        if self.sequence_parallel and s % self.group.size:
            raise ValueError(f"rank {current().rank}: sequence parallelism splits the {s} "
                             f"tokens of each sequence into tp = {self.group.size} equal "
                             f"parts; feed sequences whose length divides by {self.group.size}")
        return s, b
