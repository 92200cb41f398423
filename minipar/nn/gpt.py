"""The GPT every parallel form is proven against: explicit forward, explicit backward.

    x0     = dropout(wte[ids] + wpe[positions])              # [s, b, h]
    x_l    = block_l(x_{l-1})                                 # l = 1 .. L
    logits = ln_f(x_L) W_head^T     (W_head = wte when tied)  # [s, b, V]
    loss   = mean cross-entropy(logits, targets)
(GPT-2, Radford et al. 2019; the [s, b, h] layout of Megatron-LM, Shoeybi et al. 2019.)

Steps. The forward is three steps, each paired with its backward, so that a pipeline stage
can own blocks lo..hi (the first stage embeds, the last computes the loss):

    x, s_embed  = model.embed_forward(ids, rng)               ids -> x0
    x, s_blocks = model.blocks_forward(x, rng, lo, hi)        x_lo -> x_hi
    loss, s_head = model.head_forward(x, targets)             x_L -> loss
    dx = model.head_backward(s_head, dloss)                   dloss -> dx_L
    dx = model.blocks_backward(dx, s_blocks, lo, hi)          dx_hi -> dx_lo
    model.embed_backward(dx, s_embed)                         dx0 -> wte, wpe gradients

Each backward step also runs split (weight_grads.py): given a WeightGradStore it computes
only I, the input gradients, and pushes the weights' gradients as records for the store's
W; `backward_input(cache)` returns the model's store, `backward_weight(store)` runs it. I
fires backward_pre and backward_input_post; W fires backward_post, the gradients complete.

`forward` and `backward` are exactly these in this order; `forward`'s cache is a
`ForwardCache` of the steps' records, whose `Saved` objects are charged to the ledger as
activations until the backward consumes them. Read the backward steps to see each path.

Units and hooks (hooks.py): `model.hooks` fires forward_pre/forward_post/backward_pre/
backward_post around each unit, as FSDP wraps modules: one unit a block, `block_unit(i)`,
and `ROOT`, everything outside the blocks (a tied head's weight *is* the embedding's, so
both stay in one unit), opened by the embedding step and closed by the head step in
forward, the other way round in backward. A pipeline puts the two steps on different
stages: `split_root()` gives each a unit, `EMBED` (wte, wpe) and `HEAD` (ln_f, lm_head),
opened and closed by its own step, listed first and last by units().

Dropout masks. A forward given no generator draws from `model.dropout_generator`, made
once from cfg.seed and advanced by every draw: each step's masks are fresh, and two models
of one config draw the same masks, so the single-device reference and every parallel
layout (TensorParallelGPT slices the same draws: parallel/tp/random.py) agree step after
step. Pass a generator to choose the masks yourself.

Parallel layouts. TensorParallelGPT (parallel/tp/gpt.py) is this skeleton with parallel
parts: it overrides the `build_*` methods and the steps-within-steps marked "a parallel
layout overrides this" (the dropout generator, the positions, the residual stream's
layout, the logits, the loss, what completes a unit's gradients), and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Optional

import numpy as np

from .block import Block, RemoteBlock, dense_parts
from .config import GPTConfig
from .cross_entropy import cross_entropy_backward, cross_entropy_forward
from .dropout import dropout_backward, dropout_forward
from .embedding import Embedding, charge_embedding
from .hooks import EMBED, HEAD, ROOT, Hooks, block_unit
from .layernorm import LayerNorm
from .linear import Linear, linear_backward, linear_backward_split, linear_forward
from .module import Module
from .moe.layer import moe_layer
from .parameter import Parameter
from .saved import Saved
from .segments import segments_backward, segments_forward
from .weight_grads import WeightGradStore


@dataclass
class EmbedSaved:
    """What the embedding step keeps for its backward."""
    wte: Saved      # the token ids
    wpe: Saved      # the positions
    dropout: Saved  # the embedding dropout's mask


@dataclass
class HeadSaved:
    """What the head step keeps for its backward."""
    ln_f: Saved     # the final LayerNorm's input
    lm_head: Saved  # the head's input
    loss: Saved     # the cross-entropy's logits, log-sum-exp and targets


@dataclass
class ForwardCache:
    """Everything `GPT.forward` keeps for `GPT.backward`, step by step."""
    embed: EmbedSaved
    blocks: list    # blocks[i]: what block i saved (a tuple of Saved; see block.py), or
    #                 with recompute="segments" one Saved per segment (segments.py)
    head: HeadSaved


class GPT(Module):
    """A decoder-only transformer built from a validated `GPTConfig`.

    `mlp_factory(layer_index)` may supply each block's MLP (a mixture of experts, say);
    by default the dense `MLP`, or with cfg.moe a mixture of experts in the blocks it names
    (nn/moe; their balancing losses join the objective in the backward, weighted by dloss).
    `blocks_held` (default: all) builds only those blocks, the others `RemoteBlock`s
    without parameters: a pipeline rank's (the same weights, drawn by name).
    """

    # the order flat buffers, DDP buckets and checkpoints lay parameters out in; a tied
    # head (lm_head None) adds nothing
    parameter_order = ("wte", "wpe", "blocks", "ln_f", "lm_head")
    root_parts = ("wte", "wpe", "ln_f", "lm_head")  # the ROOT unit: all but the blocks
    embed_unit = head_unit = ROOT  # the units the embedding and head steps fire (split_root)

    def __init__(self, cfg: GPTConfig, mlp_factory: Optional[Callable[[int], object]] = None,
                 blocks_held: Optional[Collection[int]] = None):
        self.cfg, self.mlp_factory = cfg, mlp_factory
        if blocks_held is not None and not set(blocks_held) <= set(range(cfg.num_layers)):
            raise ValueError(f"blocks_held={sorted(blocks_held)} names blocks outside the "
                             f"model's 0..{cfg.num_layers - 1}")
        # dropout's generator when a forward is given none (the module docstring)
        self.dropout_generator = np.random.default_rng(cfg.seed)
        self.wte = self.build_wte()
        self.wpe = Embedding("wpe", cfg.seq_len, cfg.hidden, cfg.seed, cfg.np_dtype,
                             cfg.init_std)  # replicated under tensor parallelism
        self.blocks = [self.build_block(i) if blocks_held is None or i in blocks_held
                       else RemoteBlock(block_unit(i)) for i in range(cfg.num_layers)]
        self.ln_f = self.build_ln_f()
        self.lm_head = self.build_lm_head()
        self.hooks = Hooks()

    # ---- parts (a parallel layout overrides these) -----------------------------------
    def position_ids(self, s: int, b: int) -> np.ndarray:
        """The rows' positions, int [s, b]: 0..s-1 (a parallel layout overrides this)."""
        return np.broadcast_to(np.arange(s)[:, None], (s, b))

    def build_wte(self):
        c = self.cfg
        return Embedding("wte", c.vocab_size, c.hidden, c.seed, c.np_dtype, c.init_std)

    def build_block(self, i: int) -> Block:
        cfg, name = self.cfg, block_unit(i)
        mlp = (self.mlp_factory(i) if self.mlp_factory is not None  # None: the dense MLP
               else moe_layer(f"{name}.mlp", cfg) if cfg.moe and cfg.moe.is_moe_block(i)
               else None)
        return Block(name, cfg, dense_parts(name, cfg, mlp=mlp), cfg.layer_recompute)

    def build_ln_f(self):
        return LayerNorm("ln_f", self.cfg.hidden, self.cfg.layernorm_eps, self.cfg.np_dtype)

    def build_lm_head(self) -> Optional[Linear]:
        """None when tied: the head multiplies by wte's weight and adds no parameter."""
        cfg = self.cfg
        if cfg.tie_embeddings:
            return None
        return Linear("lm_head", cfg.hidden, cfg.vocab_size, bias=False, seed=cfg.seed,
                      dtype=cfg.np_dtype, std=cfg.init_std)

    def units(self) -> list[tuple[str, list[Parameter]]]:
        """[(unit name, its parameters)]: the root first, then the blocks in order (after
        split_root(): EMBED first, the blocks, HEAD last; a tied head lists ln_f only)."""
        blocks = [(block_unit(i), blk.parameters()) for i, blk in enumerate(self.blocks)]
        if not self.root_is_split:
            return [(ROOT, self.parameters_from(*self.root_parts))] + blocks
        return ([(EMBED, self.parameters_from("wte", "wpe"))] + blocks
                + [(HEAD, self.parameters_from("ln_f", "lm_head"))])

    def split_root(self) -> None:
        """Fire EMBED around the embedding step and HEAD around the head step, instead of
        one ROOT across both: a pipeline's first and last stages each hold one of them."""
        self.embed_unit, self.head_unit = EMBED, HEAD

    @property
    def root_is_split(self) -> bool:
        return self.embed_unit != self.head_unit

    # ---- the whole model: the steps in order -------------------------------------------
    def forward(self, ids: np.ndarray, targets: np.ndarray,
                rng: Optional[np.random.Generator] = None) -> tuple[float, ForwardCache]:
        """loss, cache = model.forward(ids, targets, rng).  ids, targets: int [s, b]."""
        if np.shape(targets) != np.shape(ids):
            raise ValueError(f"targets must match ids' shape {np.shape(ids)}, got "
                             f"{np.shape(targets)}")
        rng = self.dropout_rng(rng)  # one generator for every dropout of this forward
        x, s_embed = self.embed_forward(ids, rng)  # x: [s, b, h]
        x, s_blocks = self.blocks_forward(x, rng)
        loss, s_head = self.head_forward(x, targets)
        return loss, ForwardCache(s_embed, s_blocks, s_head)

    def backward(self, cache: ForwardCache, dloss: float = 1.0) -> None:
        """Accumulate d(dloss * loss)/d(parameter) into every parameter's `.grad`."""
        dx = self.head_backward(cache.head, dloss)  # dx: [s, b, h]
        dx = self.blocks_backward(dx, cache.blocks, loss_scale=dloss)
        self.embed_backward(dx, cache.embed)

    def backward_input(self, cache: ForwardCache, dloss: float = 1.0) -> WeightGradStore:
        """I of `backward`: every activation gradient, back to the embedding; the weights'
        gradients wait in the returned store until backward_weight(store)."""
        store = WeightGradStore()
        dx = self.head_backward(cache.head, dloss, store)  # dx: [s, b, h]
        dx = self.blocks_backward(dx, cache.blocks, store=store, loss_scale=dloss)
        self.embed_backward(dx, cache.embed, store)
        return store

    def backward_weight(self, store: WeightGradStore) -> None:
        """W: the store's records in order; each unit's gradients are then complete
        (finish_backward, backward_post), as right after its fused backward."""
        store.run(self.weights_done)

    def weights_done(self, unit: str) -> None:
        """`unit`'s gradients are complete: finish them, then fire its backward_post."""
        self.finish_backward(unit)
        self.hooks.fire("backward_post", unit)

    def unit_input_done(self, unit: str, store: Optional[WeightGradStore]) -> None:
        """The end of `unit`'s backward step: fused, its gradients are complete
        (weights_done); split, its I is (backward_input_post) and W completes them."""
        if store is None:
            self.weights_done(unit)
        else:
            self.hooks.fire("backward_input_post", unit)

    def loss_and_grad(self, ids: np.ndarray, targets: np.ndarray,
                      rng: Optional[np.random.Generator] = None, loss_scale: float = 1.0
                      ) -> float:
        """Forward and backward of one (micro-)batch; gradients of loss_scale * loss
        accumulate (scale by 1/k for k micro-batches: see minipar.data)."""
        loss, cache = self.forward(ids, targets, rng)
        self.backward(cache, loss_scale)
        return loss

    # ---- step 1: embedding ------------------------------------------------------------
    def embed_forward(self, ids: np.ndarray, rng) -> tuple[np.ndarray, EmbedSaved]:
        """x0 = dropout(wte[ids] + wpe[positions]).  ids: int [s, b] -> x0: [s, b, h].
        Opens the root unit (forward_pre). rng: the generator of the blocks steps too."""
        s, b = self._check_ids(ids)
        rng = self.dropout_rng(rng)
        self.hooks.fire("forward_pre", self.embed_unit)
        tok, s_wte = self.wte.forward(ids)  # tok: [s, b, h]
        pos, s_wpe = self.wpe.forward(self.position_ids(s, b))  # pos: [s, b, h]
        x = self.to_residual(tok + pos)  # x: [s, b, h] (sequence parallel: [s/t, b, h])
        x, s_drop = dropout_forward(x, self.cfg.dropout, self.residual_rng(rng))
        charge_embedding(x, self.cfg.dropout)  # its bytes, on the stream [s(/t), b, h]
        if self.root_is_split:
            self.hooks.fire("forward_post", EMBED)
        return x, EmbedSaved(s_wte, s_wpe, s_drop)

    def embed_backward(self, dx: np.ndarray, saved: EmbedSaved,
                       store: Optional[WeightGradStore] = None) -> None:
        """Accumulate wte's and wpe's gradients from dx0; closes the root unit
        (backward_post, the last hook of the backward). Split: one record holds dx0 and
        both lookups' ids until W."""
        if self.root_is_split:
            self.hooks.fire("backward_pre", EMBED)
        charge_embedding(dx, self.cfg.dropout, backward=True)
        dx = dropout_backward(dx, saved.dropout)
        dx = self.to_residual_backward(dx)  # dx: [s, b, h]
        if store is None:
            self.embeddings_backward(dx, saved.wpe, saved.wte)
        else:
            store.open(self.embed_unit)
            store.put(lambda r: self.embeddings_backward(r.dx, r.wpe, r.wte),
                      Saved("embed.wgrad", dx=dx, wpe=saved.wpe, wte=saved.wte))
        self.unit_input_done(self.embed_unit, store)

    def embeddings_backward(self, dx: np.ndarray, s_wpe: Saved, s_wte: Saved) -> None:
        self.wpe.backward(dx, s_wpe)  # positions and tokens both receive dx
        self.wte.backward(dx, s_wte)

    # ---- step 2: blocks lo..hi ----------------------------------------------------------
    def blocks_forward(self, x: np.ndarray, rng, lo: int = 0, hi: Optional[int] = None
                       ) -> tuple[np.ndarray, list]:
        """x_hi, saved = blocks lo, ..., hi-1 applied to x_lo; saved[j] is block lo+j's
        (recompute="segments": segment j's, segments.py). Fires forward_pre/forward_post
        ("blocks.i") around each block."""
        lo, hi = self._block_range(lo, hi)
        rng = self.dropout_rng(rng)
        if self.cfg.recompute == "segments":  # one record per segment (segments.py)
            return segments_forward(self, x, rng, lo, hi)
        saved = []
        for i in range(lo, hi):
            self.hooks.fire("forward_pre", block_unit(i))
            x, sb = self.blocks[i].forward(x, rng)  # x: [s, b, h] ([s/t, b, h])
            self.hooks.fire("forward_post", block_unit(i))
            saved.append(sb)
        return x, saved

    def blocks_backward(self, dx: np.ndarray, saved: list, lo: int = 0,
                        hi: Optional[int] = None, store: Optional[WeightGradStore] = None,
                        loss_scale: float = 1.0) -> np.ndarray:
        """dx_lo from dx_hi through blocks hi-1, ..., lo (the range blocks_forward ran);
        with a `store`, I only (each block's weight gradients wait for its W). loss_scale:
        the weight of the micro-batch's loss, which a mixture of experts gives its
        balancing losses too."""
        lo, hi = self._block_range(lo, hi)
        if self.cfg.recompute == "segments":
            return segments_backward(self, dx, saved, lo, hi, store, loss_scale)
        if len(saved) != hi - lo:
            raise ValueError(f"blocks_backward over blocks {lo}..{hi - 1} needs the {hi - lo} "
                             f"records blocks_forward(x, rng, {lo}, {hi}) returned; got "
                             f"{len(saved)}: pass the same lo and hi to both")
        for i in reversed(range(lo, hi)):
            self.hooks.fire("backward_pre", block_unit(i))
            if store is not None:
                store.open(block_unit(i))
            dx = self.blocks[i].backward(dx, saved[i - lo], store, loss_scale)  # dx: [s, b, h]
            self.unit_input_done(block_unit(i), store)
        return dx

    # ---- step 3: head and loss ----------------------------------------------------------
    def head_forward(self, x: np.ndarray, targets: np.ndarray) -> tuple[float, HeadSaved]:
        """loss = cross-entropy(ln_f(x) W_head^T, targets).  x: [s, b, h], targets: int
        [s, b] -> a float. Closes the root unit's forward (forward_post)."""
        if self.root_is_split:
            self.hooks.fire("forward_pre", HEAD)
        x, s_lnf = self.ln_f.forward(x)
        logits, s_head = self.logits_forward(x)  # logits: [s, b, V]
        loss, s_ce = self.loss_forward(logits, targets)
        self.hooks.fire("forward_post", self.head_unit)
        return float(loss), HeadSaved(s_lnf, s_head, s_ce)

    def head_backward(self, saved: HeadSaved, dloss: float = 1.0,
                      store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dx_L of dloss * loss; accumulates the head's and ln_f's gradients (split: at the
        store's W). Opens the root unit's backward (backward_pre, its first hook)."""
        self.hooks.fire("backward_pre", self.head_unit)
        if store is not None:  # an unsplit root's backward ends in the embedding step
            store.open(self.head_unit, closes=self.root_is_split)
        dlogits = self.loss_backward(dloss, saved.loss)  # dlogits: [s, b, V]
        dx = self.logits_backward(dlogits, saved.lm_head, store)
        dx = self.ln_f.backward(dx, saved.ln_f, store)  # dx: [s, b, h]
        if self.root_is_split:
            self.unit_input_done(HEAD, store)
        return dx

    # ---- within the steps (a parallel layout overrides these) --------------------------
    def dropout_rng(self, rng: Optional[np.random.Generator]):
        """The generator every dropout of a forward draws from: `rng`, or when None the
        model's own `dropout_generator` (seeded from cfg.seed at construction, advanced by
        every draw, as torch's default generator is), so successive forwards draw fresh
        masks: through `loss_and_grad`, `accumulate_gradients` and every engine alike."""
        return rng if rng is not None else self.dropout_generator

    def residual_rng(self, rng):
        """The embedding dropout's generator: `rng` itself on one device."""
        return rng

    def to_residual(self, x: np.ndarray) -> np.ndarray:
        """The embeddings' sum in the residual stream's layout: x itself on one device."""
        return x

    def to_residual_backward(self, dx: np.ndarray) -> np.ndarray:
        return dx

    def logits_forward(self, x: np.ndarray) -> tuple[np.ndarray, Saved]:
        """logits = x W_head^T.  x: [s, b, h] -> logits: [s, b, V]."""
        if self.lm_head is not None:
            return self.lm_head.forward(x)
        return linear_forward(x, self.wte.weight.data, label="lm_head (tied)")

    def logits_backward(self, dlogits: np.ndarray, saved: Saved,
                        store: Optional[WeightGradStore] = None) -> np.ndarray:
        if self.lm_head is not None:
            return self.lm_head.backward(dlogits, saved, store)
        w = self.wte.weight  # tied: the head's weight gradient joins the embedding's
        if store is not None:
            return linear_backward_split(dlogits, saved, w.data, False, store,
                                         lambda dw, _: w.accumulate(dw))
        dx, dw, _ = linear_backward(dlogits, saved, w.data, False)
        w.accumulate(dw)
        return dx

    def loss_forward(self, logits: np.ndarray, targets: np.ndarray):
        """(mean cross-entropy, saved).  logits: [s, b, V], targets: int [s, b]."""
        return cross_entropy_forward(logits, targets)

    def loss_backward(self, dloss: float, saved: Saved) -> np.ndarray:
        return cross_entropy_backward(dloss, saved)

    def finish_backward(self, unit: str) -> None:
        """Complete `unit`'s gradients before its backward_post hook (on one device they
        are complete already)."""

    # ---- checks -------------------------------------------------------------------------
    def _check_ids(self, ids: np.ndarray) -> tuple[int, int]:
        if np.ndim(ids) != 2:
            raise ValueError(f"ids must be int [s, b] (sequence first), got {np.shape(ids)}")
        s, b = ids.shape
        if s > self.cfg.seq_len:
            raise ValueError(f"sequence length {s} exceeds the model's seq_len "
                             f"{self.cfg.seq_len}; cut the input or raise GPTConfig.seq_len")
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")
        return s, b

    def _block_range(self, lo: int, hi: Optional[int]) -> tuple[int, int]:
        n = len(self.blocks)
        hi = n if hi is None else hi
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"blocks {lo}..{hi} are not a range of this model's {n} blocks: "
                             f"choose 0 <= lo <= hi <= {n}")
        return lo, hi
