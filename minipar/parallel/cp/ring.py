"""Causal ring attention: out_i = merge over t = 0..cp−1 of blockwise(q_i, K_{i−t}, V_{i−t}),
the K/V blocks passed around a ring of cp ranks and merged by their log-sum-exp.

Each of the cp ranks of the context-parallel group holds its tokens' q, k and v
(qkv [s/cp, b, 3h], layout.py decides which tokens). In cp steps the K/V blocks travel
around the ring, rank i sending to i+1 and receiving from i−1; at step t rank i holds the
K/V of rank i−t, computes its queries' partial attention over those keys (blocks.py skips
fully masked blocks) and merges it into its running (out, lse) (merge.py). The send of
step t's block to the next rank is posted before the block is computed, so on the clock
the transfer runs on the p2p stream while the compute stream works (Liu et al. 2023,
"Ring Attention with Blockwise Transformers for Near-Infinite Context", section 3).

    forward:   send K/V around the ring (cp − 1 sends a rank); keep q, k, v, out, lse
    backward:  send K/V around the ring again, recompute each block's probabilities from
               the saved final lse (blockwise.py), and send dK/dV around the ring with it:
               the accumulator of block src's dK/dV travels with that block, each rank
               adds its queries' share, and after cp sends it is home on rank src, whole
               (ring-flash-attention's ring_flash_attn_backward: cp − 1 K/V sends and cp
               dK/dV sends a rank). dQ stays local: this rank's queries.

    layout "contiguous": rank r holds chunk r; the causal work is uneven (costs.py).
    layout "zigzag": rank r holds chunks r and 2cp−1−r, every rank the same work (Llama 3,
    Dubey et al. 2024, section 3.3.2; Brandon et al. 2023's "Striped Attention" balances
    the same way with stripes of single tokens).

Accumulators (out, lse, dq, the travelling dK/dV) are kept in the compute dtype, float32
for bf16 inputs, as ring-flash-attention keeps them: so the dK/dV messages are float32
under bf16 (costs.py counts them so). The result is rounded once to the input dtype.

Attention dropout is refused (p must be 0): each block would need its slice of the
one-device mask, which is not implemented here; Ulysses (ulysses.py) supports it.

Elementwise bytes (nn/memory_bound.py): as flash attention, the s² scores never reach HBM,
so no softmax is charged (the planner's flash_attention); the per-head layouts of q, k, v
and the context are, 2eQ each way ("attention_layout", as nn's core).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ...nn.attention import layout_bytes
from ...nn.matmul import compute_dtype
from ...nn.memory_bound import charge_bytes
from ...nn.saved import Saved
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from ...runtime.p2p import irecv, isend
from .blocks import Block, causal_allowed, plan_block, slot_rows
from .blockwise import block_backward, block_forward
from .layout import Layout, chunk_size, chunks, positions
from .merge import merge
from .qkv import check_group, check_no_dropout, check_qkv, join_qkv, merge_heads, split_heads

KV_TAG, KV_BACKWARD_TAG, DKV_TAG = 7001, 7002, 7003  # one p2p stream each, FIFO per pair


def pass_around(block: np.ndarray, group: ProcessGroup, tag: int
                ) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (step, src, the block of group rank src) for step = 0..cp−1, src = me − step:
    before yielding, post the send of this block to the next rank and the receive of the
    next block from the previous one; after the caller's work, wait for both."""
    me, cp = group.group_rank(current().rank), group.size
    nxt, prev = group.ranks[(me + 1) % cp], group.ranks[(me - 1) % cp]
    for step in range(cp):
        last = step == cp - 1
        if not last:
            sent, coming = isend(block, nxt, group, tag), irecv(prev, group, tag)
        yield step, (me - step) % cp, block
        if not last:
            block = coming.wait()  # the compute stream waits for its arrival
            sent.wait()


class _Step:
    """One ring step's rectangle in local rows and its mask and FLOP charge."""

    def __init__(self, layout: Layout, me: int, src: int, cp: int, s: int, unit_flops: float):
        c = chunk_size(layout, cp, s)
        self.block: Block = plan_block(chunks(layout, me, cp), chunks(layout, src, cp))
        self.rows = slot_rows(self.block.q_slots, c)  # rows: [m] local query rows
        self.cols = slot_rows(self.block.k_slots, c)  # cols: [n] local key rows of src
        q_pos, k_pos = positions(layout, me, cp, s), positions(layout, src, cp, s)
        self.allowed = causal_allowed(q_pos[self.rows], k_pos[self.cols])  # [m, n]
        self.flops = float(self.block.units) * unit_flops  # each matmul's charge


def _unit_flops(q: np.ndarray, layout: Layout, cp: int, s: int) -> float:
    """2·b·a·c²·d: one matmul over one c x c chunk pair."""
    b, a, _, d = q.shape
    c = chunk_size(layout, cp, s)
    return 2.0 * b * a * c * c * d


def ring_attention_forward(qkv: np.ndarray, num_heads: int, group: ProcessGroup,
                           layout: Layout = "contiguous", p: float = 0.0
                           ) -> tuple[np.ndarray, Saved]:
    """context [s/cp, b, h] of this rank's queries over all keys, and what backward needs.
    qkv: [s/cp, b, 3h], this rank's tokens in `layout` order (layout.shard of the
    one-device qkv); the result equals layout.shard of core_attention_forward's context."""
    me, cp = check_group(group, "ring_attention_forward")
    check_no_dropout(p, group, layout, "ring_attention_forward")
    s = check_qkv(qkv, num_heads, group, layout, "ring_attention_forward")
    q, k, v = split_heads(np.asarray(qkv), num_heads)  # q, k, v: [b, a, s/cp, d]
    kv = np.stack([k, v])  # kv: [2, b, a, s/cp, d], one message a step
    unit = _unit_flops(q, layout, cp, s)
    out = lse = None
    for step, src, kv_src in pass_around(kv, group, KV_TAG):
        st = _Step(layout, me, src, cp, s, unit)
        if st.block.skipped:
            continue  # every key of src lies after every query here
        out_b, lse_b = block_forward(q[:, :, st.rows], kv_src[0][:, :, st.cols],
                                     kv_src[1][:, :, st.cols], st.allowed, st.flops,
                                     f"ring attn step {step}")  # [b, a, m, d], [b, a, m]
        if out is None:  # step 0: the diagonal block covers every query row
            out, lse = out_b, lse_b  # out: [b, a, s/cp, d]; lse: [b, a, s/cp]
        else:
            out[:, :, st.rows], lse[:, :, st.rows] = merge(out[:, :, st.rows],
                                                           lse[:, :, st.rows], out_b, lse_b)
    context = merge_heads(out.astype(q.dtype))  # context: [s/cp, b, h]
    charge_bytes("attention_layout", layout_bytes(np.asarray(qkv), context))
    return context, Saved("cp.ring", qkv=qkv, context=context, lse=lse, heads=num_heads,
                          group=group, layout=layout)


def ring_attention_backward(dcontext: np.ndarray, saved: Saved) -> np.ndarray:
    """dqkv [s/cp, b, 3h] from dcontext [s/cp, b, h]: this rank's queries' dQ, and the dK,
    dV of its own keys summed over every rank's queries (they come home around the ring)."""
    group, layout = saved.group, saved.layout
    me, cp = check_group(group, "ring_attention_backward")
    if np.shape(dcontext) != saved.context.shape:
        raise ValueError(f"rank {current().rank}: ring_attention_backward on cp group "
                         f"{group} expected dcontext of the forward's context shape "
                         f"{saved.context.shape} [s/cp, b, h], received "
                         f"{np.shape(dcontext)}: pass the gradient of this rank's output")
    q, k, v = split_heads(saved.qkv, saved.heads)  # q, k, v: [b, a, s/cp, d]
    b, a, c_loc, d = q.shape
    s = c_loc * cp
    ct = compute_dtype(q.dtype)
    dout = _heads_of(np.asarray(dcontext), a)  # dout: [b, a, s/cp, d]
    out = _heads_of(saved.context, a)  # out: [b, a, s/cp, d]
    delta = (dout.astype(ct) * out.astype(ct)).sum(axis=-1)  # delta: [b, a, s/cp]
    lse = saved.lse  # lse: [b, a, s/cp]
    unit = _unit_flops(q, layout, cp, s)
    nxt, prev = group.ranks[(me + 1) % cp], group.ranks[(me - 1) % cp]
    dq = np.zeros(q.shape, dtype=ct)  # dq: [b, a, s/cp, d]
    dkv = sent = coming = None
    for step, src, kv_src in pass_around(np.stack([k, v]), group, KV_BACKWARD_TAG):
        st = _Step(layout, me, src, cp, s, unit)
        mine = np.zeros((2, b, a, c_loc, d), dtype=ct)  # mine: [2, b, a, s/cp, d]
        if not st.block.skipped:
            r = st.rows
            dq_b, dk_b, dv_b = block_backward(
                q[:, :, r], kv_src[0][:, :, st.cols], kv_src[1][:, :, st.cols], st.allowed,
                dout[:, :, r], lse[:, :, r], delta[:, :, r], st.flops,
                f"ring attn backward step {step}")
            dq[:, :, r] += dq_b  # dq_b: [b, a, m, d]
            mine[0][:, :, st.cols] = dk_b  # dk_b: [b, a, n, d]
            mine[1][:, :, st.cols] = dv_b
        if step == 0:
            dkv = mine  # the accumulator of this rank's own block starts here
        else:  # block src's accumulator from the previous rank, plus this rank's share
            dkv = coming.wait() + mine  # dkv: [2, b, a, s/cp, d]
            sent.wait()
        if cp > 1:  # pass it on with the block: after cp sends it is home on rank src
            sent, coming = isend(dkv, nxt, group, DKV_TAG), irecv(prev, group, DKV_TAG)
    if cp > 1:
        dkv = coming.wait()  # this rank's own block's dK/dV, every rank's share in it
        sent.wait()
    saved.release()
    dqkv = join_qkv(dq, dkv[0], dkv[1], q.dtype)  # dqkv: [s/cp, b, 3h]
    charge_bytes("attention_layout.backward", layout_bytes(dqkv, np.asarray(dcontext)))
    return dqkv


def _heads_of(x: np.ndarray, num_heads: int) -> np.ndarray:
    """[c, b, a·d] -> [b, a, c, d]."""
    c, b, h = x.shape
    return x.reshape(c, b, num_heads, h // num_heads).transpose(1, 2, 0, 3)
