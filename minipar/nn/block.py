"""A pre-LayerNorm transformer block, and activation recomputation.

    x1 = x  + dropout(attn(ln1(x)))
    y  = x1 + dropout(mlp(ln2(x1)))
(GPT-2, Radford et al. 2019.) Backward runs the same graph in reverse: each residual
branch's gradient is added to the gradient flowing straight through. Each branch's dropout
and residual add is one memory-bound op (Megatron-LM's fused bias-dropout-add), charged
`dropout_add` (3e + r)N forward and (6e + r)N backward, N = x.size (memory_bound.py).

Recomputation (Chen et al. 2016; Korthikanti et al. 2022):
  "none"       every tensor each op saves stays until backward: 34 sbh + 5 a s^2 b bytes
               per block in 16-bit precision with dropout on (see docs/model.md)
  "selective"  the attention core keeps only Q, K, V and recomputes softmax and dropout:
               34 sbh per block, for one more Q K^T matmul
  "full"       the block keeps only its input x (2 sbh) and a copy of the dropout generator;
               backward runs the block's forward again first (one more forward's FLOPs)
These are a block's own modes. GPTConfig(recompute="segments") checkpoints segments of
several blocks instead (Chen et al. 2016): the blocks run in mode "none" and the model's
blocks step keeps only each segment's input (nn/segments.py).

Parts. A block is handed its four sub-layers (`BlockParts`) rather than building them, so a
mixture of experts can take the MLP's place, a context-parallel core the attention's, and
tensor parallelism supply all four (parallel/tp/block.py) — the forward, the backward and
the recomputation above stay this file's. `dense_parts(name, cfg)` builds GPT-2's.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .attention import CausalSelfAttention
from .dropout import dropout_backward, dropout_forward
from .layernorm import LayerNorm
from .memory_bound import charge_bytes, mask_bytes
from .mlp import MLP
from .module import Module
from .saved import Saved, release_all
from .weight_grads import WeightGradStore

BLOCK_MODES = ("none", "selective", "full")  # a block's own recompute modes


@dataclass(frozen=True)
class BlockParts:
    """A block's sub-layers, in the order the block lists their parameters. Each has
    `parameters()` and a backward `backward(dy, saved) -> dx` (taking `store=` too, to run
    split into I and W: weight_grads.py); the forwards are

        ln1, ln2   forward(x) -> (y, saved)
        attn       forward(x, rng, selective) -> (y, saved)   selective: recompute the core
        mlp        forward(x, rng) -> (y, saved)

    with x and y in the residual stream's layout ([s, b, h] on one device).
    """

    ln1: Any
    attn: Any
    ln2: Any
    mlp: Any


def residual_out_std(cfg) -> float:
    """GPT-2's init std of the two projections into the residual stream (attention output,
    fc2): init_std / sqrt(2 l), for the 2 residual branches of each of the l blocks."""
    return cfg.init_std / np.sqrt(2 * cfg.num_layers)


def dense_parts(name: str, cfg, attn=None, mlp=None) -> BlockParts:
    """GPT-2's parts for block `name`: two LayerNorms, causal self-attention and the dense
    MLP; pass `attn` or `mlp` to build the block around another one instead (a replaced
    part made first would stay charged to the ledger)."""
    dt, std, out_std = cfg.np_dtype, cfg.init_std, residual_out_std(cfg)
    ln1 = LayerNorm(f"{name}.ln1", cfg.hidden, cfg.layernorm_eps, dt)
    if attn is None:
        attn = CausalSelfAttention(f"{name}.attn", cfg.hidden, cfg.num_heads, cfg.dropout,
                                   cfg.seed, dt, std, out_std)
    ln2 = LayerNorm(f"{name}.ln2", cfg.hidden, cfg.layernorm_eps, dt)
    if mlp is None:
        mlp = MLP(f"{name}.mlp", cfg.hidden, cfg.ffn, cfg.gelu, cfg.seed, dt, std, out_std)
    return BlockParts(ln1, attn, ln2, mlp)


class Block(Module):
    """One transformer layer: x [s, b, h] -> y [s, b, h], from the parts it is given."""

    parameter_order = ("ln1", "attn", "ln2", "mlp")

    def __init__(self, name: str, cfg, parts: Optional[BlockParts] = None,
                 recompute: Optional[str] = None):
        """parts: default dense_parts(name, cfg). recompute: this block's mode, "none",
        "selective" or "full" (default cfg.layer_recompute). cfg.dropout is the residual
        dropouts' probability."""
        parts = dense_parts(name, cfg) if parts is None else parts
        self.name, self.dropout = name, cfg.dropout
        self.recompute = cfg.layer_recompute if recompute is None else recompute
        if self.recompute not in BLOCK_MODES:
            raise ValueError(
                f"{name}: a block recomputes in mode 'none', 'selective' or 'full', got "
                f"{self.recompute!r}; checkpoint segments of several blocks are the model's "
                f"mode (GPTConfig(recompute='segments')), not a block's")
        self.ln1, self.attn, self.ln2, self.mlp = parts.ln1, parts.attn, parts.ln2, parts.mlp

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
        charge_bytes("dropout_add", dropout_add_bytes(x1, self.dropout))
        m_in, s_ln2 = self.ln2.forward(x1)
        m_out, s_mlp = self.mlp.forward(m_in, rng)
        m_drop, s_d2 = dropout_forward(m_out, self.dropout, self.residual_rng(rng))
        y = x1 + m_drop
        charge_bytes("dropout_add", dropout_add_bytes(y, self.dropout))
        return y, (s_ln1, s_attn, s_d1, s_ln2, s_mlp, s_d2)

    # ---- backward ---------------------------------------------------------------------
    def backward(self, dy: np.ndarray, saved, store: Optional[WeightGradStore] = None,
                 loss_scale: float = 1.0) -> np.ndarray:
        """dx = block.backward(dy, saved); accumulates the parameters' gradients, or with a
        `store` runs I only and leaves the weights' gradients to its W (weight_grads.py;
        "full" reruns the forward in I, and W reads the rerun's records). loss_scale: the
        weight of this micro-batch's loss, passed to an MLP part with losses of its own (a
        mixture of experts' balancing losses)."""
        if self.recompute == "full":
            x, rng = saved.x, saved.replay
            saved.release()
            _, saved = self._forward(x, rng, selective=False)  # the forward, once more
        s_ln1, s_attn, s_d1, s_ln2, s_mlp, s_d2 = saved
        charge_bytes("dropout_add.backward", dropout_add_bytes(dy, self.dropout, True))
        dm_out = dropout_backward(dy, s_d2)
        dm_in = part_backward(self.mlp, dm_out, s_mlp, store, loss_scale)
        dx1 = dy + part_backward(self.ln2, dm_in, s_ln2, store)  # straight through + branch
        charge_bytes("dropout_add.backward", dropout_add_bytes(dx1, self.dropout, True))
        da_out = dropout_backward(dx1, s_d1)
        da_in = part_backward(self.attn, da_out, s_attn, store)
        return dx1 + part_backward(self.ln1, da_in, s_ln1, store)


def dropout_add_bytes(x: np.ndarray, p: float, backward: bool = False) -> int:
    """A residual branch's fused dropout and add over x's N elements (Megatron-LM's
    bias-dropout-add): (3e + r)N forward (read the branch and the stream, write the sum; the
    mask), (6e + r)N backward (the dropout's, the bias's sum and the residual's sum)."""
    return ((6 if backward else 3) * x.itemsize + mask_bytes(p)) * x.size


def part_backward(part, dy: np.ndarray, saved, store: Optional[WeightGradStore],
                  loss_scale: float = 1.0):
    """part.backward(dy, saved), passing `store` when the backward is split (a stand-in
    part, such as a mixture of experts, must then take store= too), and `loss_scale` to a
    part that declares `takes_loss_scale` (its own losses join the model's, weighted as
    the model's loss is)."""
    if getattr(part, "takes_loss_scale", False):
        return part.backward(dy, saved, store=store, loss_scale=loss_scale)
    if store is None:
        return part.backward(dy, saved)
    if "store" not in inspect.signature(part.backward).parameters:
        raise TypeError(f"{type(part).__name__}.backward(dy, saved) cannot split its backward "
                        f"into I and W: give it a store= argument (weight_grads.py: push each "
                        f"weight gradient's record), or run the fused backward (B, not I/W)")
    return part.backward(dy, saved, store=store)


class RemoteBlock:
    """Block `name` as a rank that does not hold it sees it: no parameters, no work.

    A GPT built with `blocks_held` (a pipeline rank, which runs only its stages' blocks,
    as Megatron-LM builds only its layers) puts one in each other slot, so blocks keep
    their global indices and names ("blocks.5" is block 5 on every rank). Running it is a
    mistake in the caller, said as such."""

    sp_grads = None  # nothing to complete (a tensor-parallel block's collector)

    def __init__(self, name: str):
        self.name = name

    def parameters(self) -> list:
        return []

    def forward(self, x, rng):
        raise RuntimeError(f"{self.name} is held by another pipeline rank (this model was "
                           f"built with blocks_held excluding it): run it on the rank whose "
                           f"stage holds it")

    backward = forward

    def __repr__(self) -> str:
        return f"RemoteBlock({self.name})"
