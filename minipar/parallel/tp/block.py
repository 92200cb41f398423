"""One transformer layer under tensor (and sequence) parallelism: Megatron's ParallelAttention,
ParallelMLP and ParallelTransformerLayer.

    x1 = x  + dropout(RowParallel(attn_core(ColumnParallel_qkv(ln1(x)))))     heads split
    y  = x1 + dropout(RowParallel_fc2(GeLU(ColumnParallel_fc1(ln2(x1)))))    ffn split

(Shoeybi et al. 2019, section 3, Figure 3; Korthikanti et al. 2022, Figure 5.) Per rank,
with t = tensor-parallel size, shapes without / with sequence parallelism:

    x, x1, y                         [s, b, h]           [s/t, b, h]
    ln1(x), ln2(x1)                  [s, b, h]           [s/t, b, h] -> all-gathered to [s, b, h]
    qkv                              [s, b, 3h/t]        (the a/t heads of this rank)
    attention probabilities          [b, a/t, s, s]
    fc1 output, GeLU                 [s, b, ffn/t]
    row-parallel outputs             [s, b, h] (all-reduce) / [s/t, b, h] (reduce-scatter)

Communication per layer, forward: two all-reduces (g) of s·b·h elements; backward: two
more (f). With sequence parallelism: forward two all-gathers (f̄) and two reduce-scatters
(ḡ); backward their conjugates, plus the all-gathers that rebuild the column-parallel
inputs for the weight gradients (see tensor.py), plus one small all-reduce of the
LayerNorm and bias gradients (see sequence.py).

Dropout masks come from a `TensorParallelRNG`: the attention probabilities' mask is this
rank's heads of the single-device mask; the residual dropouts' mask is the whole
single-device mask (replicated) or, with sequence parallelism, this rank's sequence slice.

Activation recomputation is nn.Block's, which ParallelTransformerLayer inherits:
"selective" keeps Q, K, V and recomputes the attention core; "full" keeps the layer's input
and a copy of the generator, and runs the layer's forward — collectives included — again
in backward. Checkpoint segments of several layers (GPTConfig(recompute="segments")) are
the model's (nn/segments.py): the layers run in mode "none" and a segment reruns them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ...nn.attention import core_attention_backward, core_attention_forward
from ...nn.block import Block, BlockParts, residual_out_std
from ...nn.gelu import gelu_backward, gelu_forward
from ...nn.module import Module
from ...runtime.group import ProcessGroup
from .random import TensorParallelRNG
from .sequence import SequenceParallelGrads, SequenceParallelLayerNorm
from .layers import ColumnParallelLinear, RowParallelLinear, divide


@dataclass(frozen=True)
class AttentionCore:
    """The attention core a ParallelAttention runs between its two linears, paired with
    its backward: nn's on the rank's own sequence (LOCAL_CORE), or a context-parallel
    one that reaches the other ranks' keys (parallel/cp; the mesh builds it).

        forward(qkv [s, b, 3h/t], heads, p, rng, selective) -> (context [s, b, h/t], saved)
        backward(dcontext [s, b, h/t], saved) -> dqkv [s, b, 3h/t]
    """

    forward: Callable
    backward: Callable


LOCAL_CORE = AttentionCore(core_attention_forward, core_attention_backward)


class ParallelAttention(Module):
    """x [s, b, h] ([s/t, b, h] with SP) -> y of the same shape; a/t heads per rank."""

    parameter_order = ("qkv", "proj")

    def __init__(self, name: str, cfg, group: ProcessGroup, sequence_parallel: bool,
                 sp_grads: Optional[SequenceParallelGrads], out_std: float,
                 core: AttentionCore = LOCAL_CORE):
        self.name, self.dropout, self.core = name, cfg.dropout, core
        self.heads = divide(cfg.num_heads, group.size, "num_heads",
                            "choose num_heads (and so hidden) divisible by tp")
        kw = dict(sequence_parallel=sequence_parallel, seed=cfg.seed, dtype=cfg.np_dtype)
        self.qkv = ColumnParallelLinear(f"{name}.qkv", cfg.hidden, 3 * cfg.hidden, group,
                                        std=cfg.init_std, **kw)
        self.proj = RowParallelLinear(f"{name}.proj", cfg.hidden, cfg.hidden, group,
                                      std=out_std, sp_grads=sp_grads, **kw)

    def forward(self, x: np.ndarray, rng: TensorParallelRNG, selective: bool = False):
        (qkv, _), s_qkv = self.qkv.forward(x)  # qkv: [s, b, 3h/t], heads [a/t, 3, d]
        context, s_core = self.core.forward(
            qkv, self.heads, self.dropout, rng.sharded(axis=1, batch_axis=0),
            selective)  # context: [s, b, h/t]
        (y, _), s_proj = self.proj.forward(context)  # y: [s, b, h] ([s/t, b, h] with SP)
        return y, (s_qkv, s_core, s_proj)

    def backward(self, dy: np.ndarray, saved, store=None) -> np.ndarray:
        """dx from dy; with a WeightGradStore, the linears' weight gradients wait for W."""
        s_qkv, s_core, s_proj = saved
        dcontext = self.proj.backward(dy, s_proj, store)  # dcontext: [s, b, h/t]
        dqkv = self.core.backward(dcontext, s_core)  # dqkv: [s, b, 3h/t]
        return self.qkv.backward(dqkv, s_qkv, store=store)


class ParallelMLP(Module):
    """x [s, b, h] -> fc2(GeLU(fc1(x))) with ffn/t hidden units per rank."""

    parameter_order = ("fc1", "fc2")

    def __init__(self, name: str, cfg, group: ProcessGroup, sequence_parallel: bool,
                 sp_grads: Optional[SequenceParallelGrads], out_std: float):
        self.name, self.gelu = name, cfg.gelu
        divide(cfg.ffn, group.size, "ffn_hidden", "choose ffn_hidden divisible by tp")
        kw = dict(sequence_parallel=sequence_parallel, seed=cfg.seed, dtype=cfg.np_dtype)
        self.fc1 = ColumnParallelLinear(f"{name}.fc1", cfg.hidden, cfg.ffn, group,
                                        std=cfg.init_std, **kw)
        self.fc2 = RowParallelLinear(f"{name}.fc2", cfg.ffn, cfg.hidden, group, std=out_std,
                                     sp_grads=sp_grads, **kw)

    def forward(self, x: np.ndarray, rng=None):
        (u, _), s1 = self.fc1.forward(x)  # u: [s, b, ffn/t]
        g, s_act = gelu_forward(u, approximate=self.gelu)  # g: [s, b, ffn/t]
        (y, _), s2 = self.fc2.forward(g)  # y: [s, b, h] ([s/t, b, h] with SP)
        return y, (s1, s_act, s2)

    def backward(self, dy: np.ndarray, saved, store=None) -> np.ndarray:
        """dx from dy; with a WeightGradStore, the linears' weight gradients wait for W."""
        s1, s_act, s2 = saved
        dg = self.fc2.backward(dy, s2, store)  # dg: [s, b, ffn/t]
        return self.fc1.backward(gelu_backward(dg, s_act), s1, store=store)


def residual_stream_rng(rng: TensorParallelRNG, sequence_parallel: bool):
    """The generator of dropout on the residual stream (the embedding's, each block's two):
    the single-device mask on every rank, or with sequence parallelism this rank's
    sequence slice of it."""
    if sequence_parallel:
        return rng.sharded(axis=0, batch_axis=1)
    return rng.replicated(batch_axis=1)


def parallel_parts(name: str, cfg, group: ProcessGroup, sequence_parallel: bool,
                   sp_grads: Optional[SequenceParallelGrads], mlp=None,
                   core: AttentionCore = LOCAL_CORE) -> BlockParts:
    """nn.dense_parts' four parts, tensor-parallel over `group`: LayerNorms on the sequence
    shard (their gradients to `sp_grads` under SP), ParallelAttention running `core` and
    ParallelMLP (or `mlp`, made by the caller: a mixture of experts, replicated over the
    tp group)."""
    out_std, dt, eps = residual_out_std(cfg), cfg.np_dtype, cfg.layernorm_eps
    if mlp is None:
        mlp = ParallelMLP(f"{name}.mlp", cfg, group, sequence_parallel, sp_grads, out_std)
    return BlockParts(
        ln1=SequenceParallelLayerNorm(f"{name}.ln1", cfg.hidden, eps, dt, sp_grads),
        attn=ParallelAttention(f"{name}.attn", cfg, group, sequence_parallel, sp_grads,
                               out_std, core),
        ln2=SequenceParallelLayerNorm(f"{name}.ln2", cfg.hidden, eps, dt, sp_grads),
        mlp=mlp)


class ParallelTransformerLayer(Block):
    """An nn.Block built from `parallel_parts`; x: [s, b, h] or, with sequence parallelism,
    [s/t, b, h]. `sp_grads` collects the partial gradients of its LayerNorms and
    row-parallel biases (the model flushes it before the block's backward_post hook).

    The forward, the backward and the recomputation modes are nn.Block's, run on these
    parts; only where the residual dropouts draw their masks differs.
    """

    def __init__(self, name: str, cfg, group: ProcessGroup, sequence_parallel: bool,
                 recompute: Optional[str] = None, mlp=None,
                 core: AttentionCore = LOCAL_CORE):
        self.sequence_parallel = sequence_parallel
        self.sp_grads = SequenceParallelGrads(group) if sequence_parallel else None
        super().__init__(name, cfg, parallel_parts(name, cfg, group, sequence_parallel,
                                                   self.sp_grads, mlp, core), recompute)

    def residual_rng(self, rng: TensorParallelRNG):
        """The residual dropouts' generator: replicated, or this rank's sequence slice."""
        return residual_stream_rng(rng, self.sequence_parallel)
