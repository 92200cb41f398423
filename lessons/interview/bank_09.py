"""Interview questions on lesson 09 (context parallelism), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 09`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from parallel/cp (the merge, the
layouts and their blocks, costs.py's bytes, work and FLOPs, Ulysses' head check), the cost
model (minipar.runtime.cost), the activation formulas (minipar.plan) and small runs of ring
attention on simulated devices (minipar.launch) whose trace and clock are read back.
"""

from __future__ import annotations

import functools
import math
import re

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.nn.attention import core_attention_backward, core_attention_forward
from minipar.parallel.cp import (attention_work, chunks, merge, plan_block, positions,
                                 ring_attention_backward, ring_attention_bytes,
                                 ring_attention_flops, ring_attention_forward,
                                 ring_hidden_length, shard, sigmoid,
                                 ulysses_attention_bytes, ulysses_attention_forward, unshard)
from minipar.plan import activation_bytes_per_layer
from minipar.runtime.cost import bytes_sent, collective_cost, p2p_time

MB, GB, MS = 10**6, 10**9, 1e-3
BF16 = np.dtype(ml_dtypes.bfloat16)
H100 = mp.DeviceSpec.h100_sxm()
PEAK = H100.peak("bfloat16")
NVLINK, IB = mp.Topology.nodes(1, 8).intra, mp.Topology.nodes(2, 8).inter


# ---- helpers ---------------------------------------------------------------------------
def held_text(layout: str, rank: int, cp: int, s: int) -> str:
    """'8–15 and 32–39': the positions of each chunk the rank holds."""
    c = s // (len(chunks(layout, rank, cp)) * cp)
    return " and ".join(f"{j * c}–{(j + 1) * c - 1}" for j in chunks(layout, rank, cp))


def fractions_text(fracs) -> str:
    return ", ".join(str(f) for f in fracs)


def crossover(b: int, h: int, cp: int, e: float, link) -> float:
    """The s at which a zigzag forward step's compute 2bhs²/(cp²P) equals its K/V send
    α + 2(s/cp)bh·e/B on `link` (e: bytes of K/V an element of q); checked against the
    cost model's step times on both sides."""
    a2, a1 = 2 * b * h / (cp**2 * PEAK), 2 * b * h * e / (cp * link.bandwidth)
    s_star = (a1 + math.sqrt(a1**2 + 4 * a2 * link.latency)) / (2 * a2)
    heads, d = h // 128, 128
    for s, hidden in ((2 * cp * math.floor(s_star / (2 * cp)), False),
                      (2 * cp * math.ceil(s_star / (2 * cp)), True)):
        t_c = ring_attention_flops("zigzag", 0, cp, s, b, heads, d)[0] / cp / PEAK
        t_s = p2p_time(2 * (s // cp) * b * h * e, link)
        assert (t_c >= t_s) == hidden, "the closed form disagrees with the cost model"
    if float(e).is_integer():  # costs.ring_hidden_length: the first length that hides
        assert ring_hidden_length(b, h, cp, int(e), PEAK, link) == \
            2 * cp * math.ceil(s_star / (2 * cp))
    return s_star


@functools.lru_cache(maxsize=None)
def ring_sends(cp: int) -> tuple:
    """(forward, backward) sends rank 0 posts in causal ring attention, from the trace."""
    qkv = np.random.default_rng(1).standard_normal((2 * cp, 1, 6))  # [s, b, 3h], 1 head

    def program(ctx):
        group = mp.new_group(range(cp), "cp")
        _, saved = ring_attention_forward(shard(qkv, "contiguous", ctx.rank, cp), 1, group)
        mark = len(ctx.trace.events)
        ring_attention_backward(np.ones((2, 1, 2)), saved)
        sends = [e.stream == "p2p" and e.name == "send" for e in ctx.trace.events]
        return sum(sends[:mark]), sum(sends[mark:])

    return mp.launch(program, cp)[0]


@functools.lru_cache(maxsize=None)
def clock_ratio(cp: int) -> float:
    """Forward + backward time, contiguous over zigzag, on a device so slow that the
    attention's FLOPs decide the clock (1 MFLOP/s)."""
    qkv = np.random.default_rng(2).standard_normal((8 * cp, 2, 3 * 4 * 8))  # [s, b, 3h]
    slow = mp.Topology.nodes(1, cp, mp.DeviceSpec("slow", {"float64": 1e6}, 80 * GB))
    ends = {}
    for layout in ("contiguous", "zigzag"):
        def program(ctx):
            group = mp.new_group(range(cp), "cp")
            out, saved = ring_attention_forward(shard(qkv, layout, ctx.rank, cp), 4, group,
                                                layout)
            ring_attention_backward(np.ones_like(out), saved)
            return ctx.clock.now
        ends[layout] = max(mp.launch(program, cp, topology=slow))
    return ends["contiguous"] / ends["zigzag"]


@functools.lru_cache(maxsize=None)
def bf16_errors(s: int, b: int, heads: int, d: int, cp: int) -> tuple:
    """Relative errors of the context and dqkv against float64 on one device: one device's
    bf16 core, then ring attention (zigzag) in bf16 on cp ranks."""
    g = np.random.default_rng(3)
    qkv, dctx = g.standard_normal((s, b, 3 * heads * d)), g.standard_normal((s, b, heads * d))
    with mp.device():
        ref_ctx, saved = core_attention_forward(qkv, heads, 0.0, None)
        ref_dqkv = core_attention_backward(dctx, saved)
        low_ctx, saved = core_attention_forward(qkv.astype(BF16), heads, 0.0, None)
        low_dqkv = core_attention_backward(dctx.astype(BF16), saved)

    def rel(got, want):
        return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))

    def program(ctx):
        group = mp.new_group(range(cp), "cp")
        out, kept = ring_attention_forward(shard(qkv.astype(BF16), "zigzag", ctx.rank, cp),
                                           heads, group, "zigzag")
        return out, ring_attention_backward(shard(dctx.astype(BF16), "zigzag", ctx.rank, cp),
                                            kept)

    got = mp.launch(program, cp)
    ring_ctx = unshard([r[0] for r in got], "zigzag")
    ring_dqkv = unshard([r[1] for r in got], "zigzag")
    return (rel(low_ctx, ref_ctx), rel(low_dqkv, ref_dqkv), rel(ring_ctx, ref_ctx),
            rel(ring_dqkv, ref_dqkv))


def heads_refusal(num_heads: int, cp: int) -> str:
    """The message Ulysses refuses a head count with, on cp ranks."""
    qkv = np.zeros((1, 1, 3 * num_heads * 2))  # one token a rank, heads of 2

    def program(ctx):
        try:
            ulysses_attention_forward(qkv, num_heads, mp.new_group(range(cp), "cp"))
        except ValueError as e:
            return str(e)
        return ""

    return mp.launch(program, cp)[0]


def uniform_traffic(S: float, n: int) -> list:
    return [[S / n] * n for _ in range(n)]


# ---- the questions' numbers ------------------------------------------------------------
def q80(s, b, h, n):
    """Megatron SP, Ulysses and the ring on the same layer: bytes a rank, what attention sees."""
    S = s * b * h * 2  # the [s, b, h] activation in bf16
    megatron = (bytes_sent("all_gather", "ring", S, n, 0)
                + bytes_sent("reduce_scatter", "ring", S, n, 0))
    return {"s_mb": S / MB, "megatron_mb": megatron / MB,
            "ulysses_mb": ulysses_attention_bytes(s, b, h, n, 2).forward / MB,
            "ring_mb": ring_attention_bytes(s, b, h, n, 2).forward / MB,
            "sends": n - 1, "tokens_ring": positions("contiguous", 0, n, s).size}


def q81(lse1, lse2, out1, out2):
    """Two blocks merged by their lse; the direct form overflowing."""
    o, l = merge(np.array([[out1]]), np.array([lse1]), np.array([[out2]]), np.array([lse2]))
    with np.errstate(over="ignore", invalid="ignore"):
        e1, e2 = np.exp(lse1), np.exp(lse2)
        naive = (e1 * out1 + e2 * out2) / (e1 + e2)
    return {"w1": float(sigmoid(np.array(lse1 - lse2))),
            "w2": float(sigmoid(np.array(lse2 - lse1))),
            "out": float(o[0, 0]), "lse": float(l[0]),
            "f64": math.log(np.finfo(np.float64).max), "f32": math.log(np.finfo(np.float32).max),
            "naive": str(naive)}


def q82(s, cp):
    """Contiguous and zigzag positions, and each rank's share of the causal work."""
    zig = [held_text("zigzag", r, cp, s) for r in range(cp)]
    con = [held_text("contiguous", r, cp, s) for r in range(cp)]
    work = attention_work("contiguous", cp)
    return {"chunks": 2 * cp, "c": s // (2 * cp),
            "contiguous": "; ".join(f"rank {r}: {t}" for r, t in enumerate(con)),
            "zigzag": "; ".join(f"rank {r}: {t}" for r, t in enumerate(zig)),
            "work_contiguous": fractions_text(work),
            "work_zigzag": fractions_text(attention_work("zigzag", cp)),
            "last_over_first": int(work[-1] / work[0]), "slower": float(work[-1] * cp)}


def q83(cp):
    """The blocks of a contiguous causal ring, and the sends of forward and backward."""
    kinds = [plan_block(chunks("contiguous", r, cp), chunks("contiguous", src, cp)).kinds[0][0]
             for r in range(cp) for src in range(cp)]
    fwd, bwd = ring_sends(cp)
    units = sum({"full": 1.0, "diagonal": 0.5, "masked": 0.0}[k] for k in kinds)
    return {"blocks": len(kinds), "full": kinds.count("full"),
            "diagonal": kinds.count("diagonal"), "skipped": kinds.count("masked"),
            "units": units, "sends_fwd": fwd, "sends_bwd": bwd}


def q84(b, h, cp):
    """The length above which the forward's K/V send hides, on NVLink and InfiniBand; the
    backward; grouped-query attention."""
    nv, ib = crossover(b, h, cp, 2, NVLINK), crossover(b, h, cp, 2, IB)
    gqa = crossover(b, h, cp, 2 / 8, IB)  # K/V of 1/8 of the heads: a_kv/a = 1/8
    tail = p2p_time(2 * (ib // cp) * b * h * 4, IB)  # the last dK/dV send, float32
    return {"nv_s": nv, "ib_s": ib, "nv_rank": nv / cp, "ib_rank": ib / cp,
            "link_ratio": NVLINK.bandwidth / IB.bandwidth, "bwd_factor": 2 * (2 + 4) / (5 * 2),
            "gqa_s": gqa, "tail_ms": tail / MS}


def q85(s, b, h, cp):
    """Ring bytes forward and backward (dK/dV in float32), Ulysses' for contrast."""
    ring, uly = ring_attention_bytes(s, b, h, cp, 2), ulysses_attention_bytes(s, b, h, cp, 2)
    dkv = ring.backward - ring.forward
    return {"fwd_mb": ring.forward / MB, "bwd_mb": ring.backward / MB, "dkv_mb": dkv / MB,
            "ratio": ring.backward / ring.forward, "uly_mb": uly.forward / MB}


def q86(heads, tp, tp2, cp):
    """Which cp Ulysses takes under tensor parallelism: the project's refusal, read."""
    message = heads_refusal(heads // tp, cp)
    options = re.search(r"choose cp in \{([\d, ]+)\}", message).group(1)
    options2 = re.search(r"choose cp in \{([\d, ]+)\}",
                         heads_refusal(heads // tp2, cp)).group(1)
    return {"per_rank": heads // tp, "per_rank2": heads // tp2, "options": options,
            "options2": options2, "message": message.split(": ", 2)[-1].split(": choose")[0]}


def q87(s, b, h, cp_small, cp_big):
    """Forward bytes of ring and Ulysses at two cp; their forward time in and across nodes."""
    out = {}
    for tag, cp in (("small", cp_small), ("big", cp_big)):
        out[f"ring_{tag}"] = ring_attention_bytes(s, b, h, cp, 2).forward / MB
        out[f"uly_{tag}"] = ulysses_attention_bytes(s, b, h, cp, 2).forward / MB
    cp, shard_e = cp_big, (s // cp_big) * b * h * 2
    times = {}
    for where, topo, ranks in (("node", mp.Topology.nodes(1, cp), list(range(cp))),
                               ("nodes", mp.Topology.nodes(cp, 8), [8 * i for i in range(cp)])):
        uly = sum(collective_cost("all_to_all", k * shard_e, ranks, topo,
                                  traffic=uniform_traffic(k * shard_e, cp)).seconds
                  for k in (3, 1))  # q, k, v out; the context back
        link = topo.link(ranks[0], ranks[1])
        t_c = ring_attention_flops("zigzag", 0, cp, s, b, h // 128, 128)[0] / cp / PEAK
        t_s = p2p_time(2 * shard_e, link)
        times[where] = (uly, (cp - 1) * max(0.0, t_s - t_c))
    out.update({"uly_node_ms": times["node"][0] / MS, "ring_node_ms": times["node"][1] / MS,
                "uly_nodes_ms": times["nodes"][0] / MS, "ring_nodes_ms": times["nodes"][1] / MS})
    return out


def q88(cp):
    """Contiguous against zigzag at cp: the work of the first and last rank, the step."""
    work = attention_work("contiguous", cp)
    return {"first": str(work[0]), "last": str(work[-1]), "times": int(work[-1] / work[0]),
            "even": str(attention_work("zigzag", cp)[0]), "ratio": float(work[-1] * cp),
            "measured": clock_ratio(cp)}


def q89(s, b, heads, d, cp_big):
    """bf16 ring attention's error at cp = 1 and cp_big against one device's."""
    one_f, one_b, r1_f, r1_b = bf16_errors(s, b, heads, d, 1)
    _, _, rb_f, rb_b = bf16_errors(s, b, heads, d, cp_big)
    return {"one_fwd": one_f, "one_bwd": one_b, "growth_fwd": rb_f / r1_f,
            "growth_bwd": rb_b / r1_b, "vs_one": rb_b / one_b}


def q90(s, cp, tp, h, heads, kv_heads):
    """Llama 3's all-gather CP at its 128k stage, from the cost model."""
    kv, q, d = kv_heads // tp, heads // tp, h // heads  # heads a tp rank holds
    nodes = mp.Topology.nodes(cp, 8)
    ranks = [8 * i for i in range(cp)]  # one GPU of each node: tp fills a node
    kv_all = 2 * s * kv * d * 2  # K and V of the whole sequence, bf16
    gather = collective_cost("all_gather", kv_all, ranks, nodes)
    mha = collective_cost("all_gather", kv_all * q // kv, ranks, nodes)
    attend = ring_attention_flops("zigzag", 0, cp, s, 1, q, d)[0] / PEAK
    rank_crossover = crossover(1, q * d, cp, 2 * kv / q, IB) / cp  # the ring, with GQA's K/V
    return {"kv": kv, "gather_mb": kv_all / MB, "gather_ms": gather.seconds / MS,
            "attend_ms": attend / MS, "mha_ms": mha.seconds / MS,
            "rank_crossover": rank_crossover, "tokens_rank": s // cp}


def q91(s, h, a, t, cp):
    """Activations a layer per GPU: tp + sp with and without FlashAttention, and cp on top."""
    none = activation_bytes_per_layer(s, 1, h, a, "none", tp=t, sequence_parallel=True)
    flash = activation_bytes_per_layer(s, 1, h, a, "selective", tp=t, sequence_parallel=True)
    with_cp = activation_bytes_per_layer(s // cp, 1, h, a, "selective", tp=t,
                                         sequence_parallel=True)
    return {"none_gb": none / GB, "flash_gb": flash / GB, "cp_gb": with_cp / GB,
            "scores_share": 1 - flash / none}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="09", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q80", dict(s=6000, b=3, h=5120, n=5),
        "Three techniques are called \"sequence parallelism\". On a layer with s = {s}, "
        "b = {b}, h = {h} in bf16 over {n} ranks, what does each send per rank in the "
        "attention block's forward, and what does each rank's attention see?",
        "S = s·b·h·2 = {s_mb:.2f} MB. Megatron-LM's (Korthikanti et al. 2022) all-gathers S "
        "before the block and reduce-scatters it after, {megatron_mb:.2f} MB a rank; its "
        "attention sees all {s} tokens of a/{n} heads. DeepSpeed-Ulysses' (Jacobs et al. "
        "2023) all-to-alls of q, k, v and the context move {ulysses_mb:.2f} MB; its "
        "attention too sees all {s} tokens of a/{n} heads. The ring (Li et al. 2021's "
        "sequence parallelism, ring attention, Megatron-Core's context parallelism) sends "
        "K/V {sends} times, {ring_mb:.2f} MB — the same 2(n − 1)/n · S as Megatron's, but "
        "to a neighbour and behind the blocks — and its attention sees {tokens_ring} "
        "queries a rank: the only one of the three that never holds the whole sequence.",
        q80),
    entry(
        "q81", dict(lse1=1000.7, lse2=997.9, out1=0.31, out2=-0.58),
        "Ring attention has two partial results for one query: over block 1, out1 = {out1} "
        "with lse1 = {lse1}; over block 2, out2 = {out2} with lse2 = {lse2} (lse = log Σ "
        "e^score over the block). What is the attention over both, and why not compute "
        "e^lse?",
        "The blocks weigh by their share of the softmax denominator: block 2's is "
        "sigmoid(lse2 − lse1) = {w2:.4f}, block 1's {w1:.4f}. So out = out1 − {w2:.4f}·(out1 "
        "− out2) = {out:.4f} and lse = lse1 − logsigmoid(lse1 − lse2) = {lse:.4f}, which "
        "the next block's merge needs. Written as (e^lse1·out1 + e^lse2·out2)/(e^lse1 + "
        "e^lse2) it gives {naive}: e^x is inf past {f64:.2f} in float64 ({f32:.2f} in "
        "float32). The sigmoid form exponentiates only −|lse1 − lse2|, as FlashAttention's "
        "online softmax does.",
        q81),
    entry(
        "q82", dict(s=48, cp=3),
        "s = {s} tokens over cp = {cp} ranks, causal attention: which positions does each "
        "rank hold in the contiguous and in the zigzag layout, and what share of the "
        "attention work does each do?",
        "Contiguous: {contiguous}; the work is (2r + 1)/cp²: {work_contiguous}, the last "
        "rank {last_over_first} times the first, and the layer waits for it: {slower:.3f} "
        "times an even split. Zigzag cuts {chunks} chunks of {c} and gives rank r chunks r "
        "and 2cp − 1 − r: {zigzag}; each does {work_zigzag}. (Llama 3, Dubey et al. 2024, "
        "section 3.3.2; striped attention, Brandon et al. 2023, deals single tokens "
        "round-robin for the same effect.)",
        q82),
    entry(
        "q83", dict(cp=5),
        "Causal ring attention over cp = {cp} ranks, contiguous layout: of the cp² (rank, "
        "K/V block) pairs, how many are computed in full, with a causal mask, or skipped? "
        "How many sends does a rank make in the forward and the backward?",
        "Of {blocks} blocks, {full} are full (the keys all earlier), {diagonal} diagonal "
        "(a rank's own block, masked inside) and {skipped} skipped (all keys later): "
        "{units} chunk pairs' work of {blocks}, half, as causal attention should be. The "
        "trace of a run: {sends_fwd} sends forward (K/V, cp − 1) and {sends_bwd} backward: "
        "K/V again (cp − 1) and the dK/dV accumulators (cp), which travel with their "
        "block, gather every rank's queries' share and arrive home on the last send.",
        q83),
    entry(
        "q84", dict(b=2, h=5120, cp=8),
        "Ring attention in bf16 on H100s, b = {b}, h = {h}, cp = {cp}, zigzag layout: above "
        "which sequence length does the forward's K/V send hide behind the block compute, "
        "on NVLink and on InfiniBand NDR?",
        "A step computes 2bhs²/(cp²P) and sends α + 2(s/cp)bh·e/B; equal at s ≈ cp·e·P/B: "
        "{nv_s:,.0f} tokens on NVLink ({nv_rank:,.0f} a rank) and {ib_s:,.0f} on "
        "InfiniBand ({ib_rank:,.0f} a rank), {link_ratio:.0f}x the bandwidth apart. The "
        "backward computes 5 matmuls a unit and sends K/V plus float32 dK/dV: it hides "
        "from about {bwd_factor:.1f}x these lengths, and its last dK/dV send has no compute "
        "left to hide behind ({tail_ms:.2f} ms on InfiniBand at the crossover). With "
        "grouped-query attention at a_kv/a = 1/8 the K/V shrink 8-fold and InfiniBand hides "
        "from {gqa_s:,.0f}.",
        q84),
    entry(
        "q85", dict(s=24576, b=1, h=5120, cp=6),
        "Ring attention, s = {s}, b = {b}, h = {h}, bf16, cp = {cp}: how many bytes does a "
        "rank send per layer in the forward and in the backward, and why is the backward "
        "more than twice the forward?",
        "Forward: cp − 1 sends of K and V, {fwd_mb:.1f} MB. Backward: the same K/V again "
        "(the blocks are recomputed) plus the dK/dV accumulators, cp sends of float32 "
        "(ring-flash-attention keeps them so), {dkv_mb:.1f} MB: {bwd_mb:.1f} MB in all, "
        "{ratio:.2f}x the forward. Ulysses moves {uly_mb:.1f} MB each way at this cp, but "
        "on the critical path.",
        q85),
    entry(
        "q86", dict(heads=40, tp=8, tp2=4, cp=16),
        "A model with {heads} attention heads runs tensor parallelism tp = {tp}. Can "
        "DeepSpeed-Ulysses use cp = {cp}? Which cp can it use, and with tp = {tp2}?",
        "Ulysses splits the heads a tp rank holds, {per_rank}: minipar refuses cp = {cp} "
        "(\"{message}\") and names the cp that divide them, {options}. With tp = {tp2} a "
        "rank holds {per_rank2} heads and cp may be {options2}. Ring attention has no head "
        "limit; the two combine (Ulysses inside a node, the ring across) when cp must "
        "outgrow the heads.",
        q86),
    entry(
        "q87", dict(s=65536, b=1, h=6144, cp_small=2, cp_big=8),
        "s = {s}, b = {b}, h = {h} in bf16: compare the forward bytes a rank sends in ring "
        "attention and in Ulysses at cp = {cp_small} and cp = {cp_big}, and their time at "
        "cp = {cp_big} inside one node and across {cp_big} nodes.",
        "cp = {cp_small}: ring {ring_small:.0f} MB, Ulysses {uly_small:.0f} MB. cp = "
        "{cp_big}: ring {ring_big:.0f} MB, Ulysses {uly_big:.0f} MB: Ulysses' "
        "4(cp − 1)/cp² · sbh·e falls as 1/cp, the ring's 2(cp − 1)/cp · sbh·e does not. "
        "But time is what counts: inside a node Ulysses' two all-to-alls take "
        "{uly_node_ms:.3f} ms on the critical path, the ring's sends expose "
        "{ring_node_ms:.3f} ms; across nodes {uly_nodes_ms:.3f} ms against "
        "{ring_nodes_ms:.3f} ms, the ring's sends too long for its blocks there.",
        q87),
    entry(
        "q88", dict(cp=8),
        "Causal attention with the contiguous layout at cp = {cp}: what share of the work "
        "do the first and the last rank do, and how much longer is the step than with "
        "zigzag?",
        "Rank r computes r full blocks and one diagonal: (2r + 1)/cp², {first} for rank 0 "
        "and {last} for the last, {times} times as much. Every rank waits for the last, so "
        "the step takes {ratio:.3f} times zigzag's, where each rank does {even}; measured "
        "on a compute-bound clock: {measured:.3f}.",
        q88),
    entry(
        "q89", dict(s=32, b=2, heads=4, d=16, cp_big=8),
        "Ring attention adds its blocks in another order than one softmax. In bf16, does "
        "its error grow with cp? (s = {s}, b = {b}, {heads} heads of {d}, zigzag, cp = 1 "
        "against cp = {cp_big}.)",
        "No. Against float64 on one device, one device's bf16 core is off by {one_fwd:.2e} "
        "(context) and {one_bwd:.2e} (dqkv), relative. The ring at cp = {cp_big} has "
        "{growth_fwd:.3f}x its cp = 1 error in the context and {growth_bwd:.3f}x in dqkv "
        "({vs_one:.3f}x the one-device core's): the partial outputs, lse, dQ and the "
        "travelling dK/dV stay in float32 and each result is rounded to bf16 once.",
        q89),
    entry(
        "q90", dict(s=131072, cp=16, tp=8, h=16384, heads=128, kv_heads=8),
        "Llama 3 405B (h = {h}, {heads} query heads, {kv_heads} KV heads) trained its "
        "{s}-token stage with CP = {cp} across nodes and TP = {tp}. Its CP all-gathers K/V "
        "instead of passing them around a ring. Why could it afford to?",
        "A tp rank holds heads/tp query heads and {kv} KV head. The all-gather collects "
        "{gather_mb:.1f} MB of K/V in {gather_ms:.2f} ms on InfiniBand, against "
        "{attend_ms:.2f} ms of the rank's own attention forward: exposed, but small. "
        "Without grouped-query attention it would take {mha_ms:.2f} ms, longer than the "
        "attention. (A ring with GQA's K/V would hide from {rank_crossover:,.0f} tokens a "
        "rank; this stage has {tokens_rank:,}.) The all-gather is simpler and fits the "
        "document masks of its data; the zigzag split of 2·cp chunks is kept for balance "
        "(Dubey et al. 2024, section 3.3.2).",
        q90),
    entry(
        "q91", dict(s=65536, h=12288, a=96, t=8, cp=16),
        "Why is Megatron's sequence parallelism not enough for long sequences? A layer "
        "with h = {h}, a = {a}, s = {s}, b = 1, on tp = {t} with sequence parallelism: "
        "activations a GPU, and with cp = {cp} on top.",
        "sbh(34/t + 5as/(ht)) = {none_gb:.1f} GB a layer: {scores_share:.1%} of it the "
        "s² attention scores every tp rank keeps for its heads over the whole sequence. "
        "FlashAttention drops them, {flash_gb:.2f} GB, still linear in s, and t cannot "
        "grow past a node or the heads. Context parallelism splits the tokens of every "
        "layer: {cp_gb:.3f} GB with cp = {cp}.",
        q91),
]
