"""Checkpoint segments: keep the input of every k-th block, rerun k blocks at a time.

    forward   x_b = B_{b-1}(... B_a(x_a))       per segment a..b-1: keep x_a and the generator
    backward  rerun B_a, ..., B_{b-1} from x_a, saving everything; then dx_a from dx_b

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": cut the chain of L
layers into segments of k, keep only each segment's input during the forward, and in the
backward rerun one segment's forward just before backpropagating through it. With I the
bytes of a block's input (p sbh for p-byte activations: 2 sbh in bf16, 8 sbh in float64)
and A the bytes a block saves when it keeps everything, the blocks hold at most (L
divisible by k)

    (L/k - 1) I + k A      the inputs of the L/k - 1 segments below + one segment rerun

(the rerun segment's own input is inside its first block's A), smallest near
k = sqrt(L I / A). Chen's sqrt(L) is that optimum when a layer keeps no more than its input
(A = I); a transformer block keeps at least 16 times its input (A = 32 to 34 sbh plus the
attention scores' 2 to 5 a s^2 b in 16 bits, against I = 2 sbh), so there the best k is
small: sqrt(L / 16) or less. The exact peak, the shorter last segment included, is
`minipar.plan.segments_activation_bytes`; the FLOPs are full recomputation's (one more
forward of every block), whatever k.

Segments are groups of k = GPTConfig.recompute_segment consecutive blocks of the range a
blocks step runs, counted from its first block: lo..lo+k-1, lo+k..lo+2k-1, ...; when k does
not divide hi - lo the last segment is shorter, and k >= hi - lo makes one segment of all
of them (Megatron-LM's `--recompute-method uniform --recompute-num-layers k`, per pipeline
stage). k = 1 is recompute="full", bit for bit: the same masks, losses and gradients, and
the same bytes on the ledger at every moment.

Dropout: the generator is copied when a segment starts (as "full" copies it when a block
starts), and the rerun draws from the copy: the same masks, in the same order.

Hooks (hooks.py): the forward fires forward_pre/forward_post around each block as usual.
The backward of segment a..b-1 fires backward_pre(blocks.b-1) (the gradient has reached the
segment's output), recompute_pre/recompute_post around each rerun block — ZeRO-3 gathers a
block's weights at its recompute_pre, so the segment's k blocks are whole together until
each one's backward_post — and then each block's backward_pre, backward, backward_post.
"""

from __future__ import annotations

import copy

import numpy as np

from .hooks import block_unit
from .saved import Saved, release_all


def segment_ranges(lo: int, hi: int, k: int) -> list[tuple[int, int]]:
    """[(a, b)]: blocks lo..hi-1 in segments a..b-1 of k blocks from lo, the last shorter."""
    return [(a, min(a + k, hi)) for a in range(lo, hi, k)]


def segments_forward(model, x: np.ndarray, rng, lo: int, hi: int
                     ) -> tuple[np.ndarray, list[Saved]]:
    """x_hi, saved = blocks lo..hi-1 applied to x_lo, keeping one record per segment (its
    input and a copy of the generator). model: a GPT (its blocks, hooks and cfg)."""
    saved = []
    for a, b in segment_ranges(lo, hi, model.cfg.recompute_segment):
        replay = copy.deepcopy(rng)  # the generator as it is now: the same masks again
        x_in = x  # x_in: [s, b, h] ([s/t, b, h] with sequence parallelism)
        for i in range(a, b):
            model.hooks.fire("forward_pre", block_unit(i))
            x, inner = model.blocks[i].forward(x, rng)  # x: [s, b, h] ([s/t, b, h])
            release_all(inner)  # keep nothing of the inside: the backward reruns it
            if i == a:  # block a's own record held the input until now
                saved.append(Saved(f"segment.{block_unit(a)}-{b - 1}", x=x_in,
                                   replay=replay, lo=a, hi=b))
            model.hooks.fire("forward_post", block_unit(i))
    return x, saved


def segments_backward(model, dx: np.ndarray, saved: list, lo: int, hi: int,
                      store=None, loss_scale: float = 1.0) -> np.ndarray:
    """dx_lo from dx_hi: segment by segment, the last first, rerun its blocks' forwards
    from the kept input, then backpropagate through them (accumulating the gradients; with
    a WeightGradStore, I only: W reads the rerun's records later)."""
    ranges = segment_ranges(lo, hi, model.cfg.recompute_segment)
    _check_records(saved, ranges, lo, hi)
    for (a, b), kept in zip(reversed(ranges), reversed(saved)):
        model.hooks.fire("backward_pre", block_unit(b - 1))  # dx has reached the output
        x, rng = kept.x, kept.replay
        kept.release()  # block a's rerun record holds the input again
        inner = []
        for i in range(a, b):
            model.hooks.fire("recompute_pre", block_unit(i))
            x, record = model.blocks[i].forward(x, rng)  # the forward once more, all saved
            inner.append(record)
            model.hooks.fire("recompute_post", block_unit(i))
        for i in reversed(range(a, b)):
            if i != b - 1:
                model.hooks.fire("backward_pre", block_unit(i))
            if store is not None:
                store.open(block_unit(i))
            dx = model.blocks[i].backward(dx, inner[i - a], store, loss_scale)  # dx: [s, b, h]
            model.unit_input_done(block_unit(i), store)
    return dx


def _check_records(saved: list, ranges: list[tuple[int, int]], lo: int, hi: int) -> None:
    got = [(getattr(s, "lo", None), getattr(s, "hi", None)) if isinstance(s, Saved)
           else None for s in saved]
    if got != ranges:
        raise ValueError(
            f"blocks_backward over blocks {lo}..{hi - 1} in checkpoint segments {ranges} needs "
            f"the segment records blocks_forward(x, rng, {lo}, {hi}) returned, got records "
            f"for {got}: pass the same lo and hi (and the same model) to both")
