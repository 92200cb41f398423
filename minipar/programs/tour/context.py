"""Part 14 of `minipar tour`: context parallelism, the sequence split over cp = 4 ranks of a
node, attention included.

    node 0 (ranks 0-3)   one cp group, the zigzag layout:     rank r holds chunks r, 7 − r
    node 1 (ranks 4-7)   another cp group, the contiguous one: rank r holds chunk r

Each node runs causal ring attention (Liu et al. 2023) on the same sequence, forward and
backward, its K/V passed around the node's ring on NVLink; then DeepSpeed-Ulysses (Jacobs
et al. 2023) on the same shards. Shown: both forms against nn's one-device attention core,
each rank's share of the causal FLOPs read from the trace (zigzag's even 1/4 against
contiguous's 1/16 .. 7/16: Llama 3, Dubey et al. 2024, section 3.3.2), and the bytes a
rank sent, against parallel/cp/costs.py (docs/context_parallel.md; lesson 09).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ...nn.attention import core_attention_backward, core_attention_forward
from ...parallel.cp import (ring_attention_backward, ring_attention_bytes,
                            ring_attention_forward, shard, ulysses_attention_backward,
                            ulysses_attention_bytes, ulysses_attention_forward, unshard)
from ...runtime.collectives import new_group
from ...runtime.context import device
from ...runtime.launch import launch
from .cluster import TOPOLOGY
from .common import Print, Record, no_recorder

CP, S, B, HEADS, HEAD_DIM = 4, 32, 2, 4, 8
LAYOUTS = ("zigzag", "contiguous")  # node 0's, node 1's
FORMS = {"ring attention": (ring_attention_forward, ring_attention_backward),
         "Ulysses": (ulysses_attention_forward, ulysses_attention_backward)}


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """(qkv [s, b, 3h], dcontext [s, b, h]) of one sequence, float64."""
    g = np.random.default_rng(9)
    return (g.standard_normal((S, B, 3 * HEADS * HEAD_DIM)),
            g.standard_normal((S, B, HEADS * HEAD_DIM)))


def _program(form: str, qkv: np.ndarray, dctx: np.ndarray):
    forward, backward = FORMS[form]

    def program(ctx):
        node = ctx.rank // CP
        groups = [new_group(range(n * CP, (n + 1) * CP), f"cp{n}") for n in range(2)]
        group, layout = groups[node], LAYOUTS[node]
        me = group.group_rank(ctx.rank)
        out, saved = forward(shard(qkv, layout, me, CP), HEADS, group, layout)  # [s/cp, b, h]
        mark = len(ctx.trace.events)
        dqkv = backward(shard(dctx, layout, me, CP), saved)  # [s/cp, b, 3h]
        events = ctx.trace.events
        sent = [sum(e.meta.get("sent_bytes", 0) for e in part if e.stream in ("p2p", "comm"))
                for part in (events[:mark], events[mark:])]
        flops = sum(e.flops for e in events if e.stream == "compute")
        return out, dqkv, sent, flops
    return program


def context_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 14."""
    qkv, dctx = inputs()
    with device():
        want_ctx, saved = core_attention_forward(qkv, HEADS, 0.0, None)  # [s, b, h]
        want_dqkv = core_attention_backward(dctx, saved)  # [s, b, 3h]
    out(f"14. Context parallelism: one sequence (s = {S}, b = {B}, {HEADS} heads of "
        f"{HEAD_DIM}, float64) split over cp = {CP} ranks of each node, attention included; "
        f"node 0 zigzag, node 1 contiguous")
    for form in FORMS:
        res = record(f"14. {form}, cp {CP} on each node",
                     launch(_program(form, qkv, dctx), 2 * CP, topology=TOPOLOGY))
        for node, layout in enumerate(LAYOUTS):
            mine = list(res)[node * CP:(node + 1) * CP]
            ctx_err = float(np.abs(unshard([r[0] for r in mine], layout) - want_ctx).max())
            dqkv_err = float(np.abs(unshard([r[1] for r in mine], layout) - want_dqkv).max())
            share = [Fraction(r[3] / sum(x[3] for x in mine)).limit_denominator(64)
                     for r in mine]
            line = (f"   {form:<14} {layout:>10}: against one device, context "
                    f"{ctx_err:.1e}, dqkv {dqkv_err:.1e}")
            if form == "ring attention":
                line += f"; each rank's share of the FLOPs {' '.join(map(str, share))}"
            out(line)
        fwd, bwd = mine[0][2]
        nbytes = (ring_attention_bytes if form == "ring attention"
                  else ulysses_attention_bytes)(S, B, HEADS * HEAD_DIM, CP, 8)
        what = ("K/V forward; K/V and dK/dV backward" if form == "ring attention"
                else "two all-to-alls each way")
        out(f"   {form:<14} bytes a rank sent: {fwd:,.0f} forward, {bwd:,.0f} backward ({what}); "
            f"costs.py says {nbytes.forward:,.0f} and {nbytes.backward:,.0f}")
    out("   the ring's K/V go to one neighbour and hide behind the blocks once s/cp is long "
        "enough; Ulysses sends fewer bytes at cp > 2, on the critical path, and cp must divide "
        "the heads")
