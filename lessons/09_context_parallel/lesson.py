# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 09 — Context parallelism
#
# Split the sequence through every layer, attention included: why Megatron's sequence parallelism stops short, the log-sum-exp merge of partial attentions, ring attention and its causal skips, zigzag's balance, the sequence length above which the K/V send hides, DeepSpeed-Ulysses' all-to-all, and how to choose.
#
# Every layer of a transformer but one works token by token: the linears, LayerNorm, the
# MLP, dropout, the loss. A rank holding s/cp of the tokens computes them alone. Attention
# is the exception: every query needs every earlier key. Context parallelism (CP) splits
# the sequence over cp ranks through the whole model and moves keys and values so that
# attention still sees them all.
#
# minipar's pieces: `minipar/parallel/cp/` (`docs/context_parallel.md`): the layouts, the
# merge, ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"),
# the zigzag layout (Llama 3, Dubey et al. 2024, section 3.3.2), DeepSpeed-Ulysses (Jacobs
# et al. 2023) and the costs. Both forms are proven equal to nn's one-device attention core
# in `tests/parallel/cp/`. Sections 1 to 7 run the attention alone on simulated ranks;
# section 8 trains a whole GPT with `parallelize(..., ParallelDims(cp=...))`.
# Everything runs in float64 unless it says bf16.

# %%
from fractions import Fraction

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.nn.attention import core_attention_backward, core_attention_forward
from minipar.nn.layernorm import layernorm_forward
from minipar.parallel.cp import (attention_work, block_forward, chunks, merge, merge_ref,
                                 plan_block, positions, ring_attention_backward,
                                 ring_attention_bytes, ring_attention_flops,
                                 ring_attention_forward, ring_hidden_length, shard,
                                 ulysses_attention_backward,
                                 ulysses_attention_bytes, ulysses_attention_forward, unshard)
from minipar.plan import activation_bytes_per_layer
from minipar.runtime.cost import collective_cost, p2p_time
from minipar.viz import figures

np.set_printoptions(precision=3, suppress=True)
BF16 = np.dtype(ml_dtypes.bfloat16)
GB, MB = 10**9, 10**6
draw = np.random.default_rng(0)

# %% [markdown]
# ## 1. Why Megatron's sequence parallelism is not enough
#
# Tensor parallelism with sequence parallelism (Korthikanti et al. 2022; lesson 04) keeps
# the residual stream split along s *between* the blocks, where LayerNorm and dropout
# work token by token. At the entrance of the attention block it gathers the whole
# sequence: each of the t ranks computes attention over all s tokens, for its a/t heads.
# Its scores are s × s per head, its keys and values span the whole sequence. Ring
# attention over cp ranks gives each rank s/cp of the queries, keys and values, all heads.
#
# The ledger's "activations" after one attention core's forward, per rank, at t = cp = 4
# (8 heads of 8, b = 1): a tp rank runs nn's core on its 2 heads and every token (the
# core keeps its probabilities, as any attention without FlashAttention does: Korthikanti
# et al.'s 5as²b term); a cp rank runs ring attention on its s/4 tokens.

# %%
T = CP = 4
HEADS1, D1 = 8, 8  # h = 64
held = {}
for s in (64, 128, 256):
    qkv1 = draw.standard_normal((s, 1, 3 * HEADS1 * D1))  # qkv1: [s, b, 3h], features [a, 3, d]
    mine = qkv1.reshape(s, 1, HEADS1, 3 * D1)[:, :, :HEADS1 // T].reshape(s, 1, -1)  # [s, b, 3h/t]
    with mp.device() as ctx:  # tp rank 0 of 4: heads 0 and 1, every token
        _, saved = core_attention_forward(mine, HEADS1 // T, 0.0, None)
        tp_held = ctx.ledger.held("activations")
        saved.release()

    def ring_held(ctx):
        group = mp.new_group(range(CP), "cp")
        _, kept = ring_attention_forward(shard(qkv1, "zigzag", ctx.rank, CP), HEADS1, group,
                                         "zigzag")  # this rank's tokens: [s/cp, b, 3h]
        nbytes = ctx.ledger.held("activations")
        kept.release()
        return nbytes

    held[s] = (tp_held, mp.launch(ring_held, CP)[0])
    print(f"s = {s:>3}: a tp rank's attention keeps {held[s][0]:>9,} bytes, a cp rank's "
          f"{held[s][1]:>7,} bytes")

# %% [markdown]
# Doubling s multiplies the tp rank's bytes by nearly 4 and the cp rank's by 2: the tp
# rank keeps s² probabilities for its heads; the ring keeps each rank's q, k, v, output
# and log-sum-exp, and a block's probabilities only while the block is computed. (A
# FlashAttention core under tensor parallelism also drops the s² term; then both keep
# bytes linear in s, divided by t and cp respectively.)
#
# What limits sequence parallelism is how far t can go: it splits the heads, so t ≤ a,
# and its all-gather and reduce-scatter sit on the critical path of every block, so t
# stays inside an NVLink domain (lesson 04's incident A): t ≤ 8 in practice. At Llama 3
# 405B's width (h = 16384, a = 128, b = 1; Dubey et al. 2024, Table 3) one layer keeps,
# per GPU, by Korthikanti et al.'s formulas (`plan.activation_bytes_per_layer`; with the
# FlashAttention-style selective form, no s² term), and with cp = 16 on top (each rank
# the same layer on s/16 tokens):

# %%
H405, A405, LAYERS405, TP405, CP405 = 16384, 128, 126, 8, 16
at_scale = {}
for s in (8192, 32768, 131072):
    at_scale[s] = (activation_bytes_per_layer(s, 1, H405, A405, "none", tp=TP405,
                                              sequence_parallel=True),
                   activation_bytes_per_layer(s, 1, H405, A405, "selective", tp=TP405,
                                              sequence_parallel=True),
                   activation_bytes_per_layer(s // CP405, 1, H405, A405, "selective",
                                              tp=TP405, sequence_parallel=True))
    tp_sp, flash, with_cp = at_scale[s]
    print(f"s = {s:>7,}: tp {TP405} + sp {tp_sp / GB:9.2f} GB a layer; with FlashAttention "
          f"{flash / GB:5.2f} GB ({LAYERS405 * flash / GB:7.1f} GB for {LAYERS405} layers); "
          f"+ cp {CP405} {with_cp / GB:5.3f} GB ({LAYERS405 * with_cp / GB:5.1f} GB)")

# %%
figures.lines("09_activations", f"Llama 3 405B's activations per GPU, all {LAYERS405} layers, "
              f"tp {TP405} + sp", list(at_scale),
              {label: [LAYERS405 * row[i] / GB for row in at_scale.values()] for i, label in
               enumerate(("scores stored", "FlashAttention (selective)",
                          f"FlashAttention + cp {CP405}"))},
              xlabel="sequence length s (tokens)", ylabel="GB per GPU", logx=True, logy=True,
              hline=(80, "an H100's 80 GB"))

# %% [markdown]
# At 128k tokens, even without the s² term, tensor and sequence parallelism leave a
# layer's activations at gigabytes per GPU, and the model's 126 layers far beyond an 80 GB
# device (pipeline parallelism divides the layers, not the tokens). Context parallelism
# divides every term by cp, and its communication — keys and values to a neighbour — can
# cross nodes and hide behind the attention it feeds (section 5). Llama 3 trained its
# 128k-token stage with TP = 8, CP = 16, PP = 16 (Table 4 of its report).
#
# **Four names, three techniques.**
#
# - *Sequence parallelism* in Megatron-LM (Korthikanti et al. 2022): LayerNorm and dropout
#   on s/t tokens next to tensor parallelism; the sequence is whole inside each block.
# - *Sequence parallelism* in Colossal-AI (Li et al. 2021, "Sequence Parallelism: Long
#   Sequence Training from System Perspective"): ring self-attention, the sequence split
#   through every layer and K/V passed around a ring — the idea ring attention (Liu et al.
#   2023) made memory-efficient with blockwise computation.
# - *Sequence parallelism* in DeepSpeed (DeepSpeed-Ulysses, Jacobs et al. 2023): the
#   sequence split everywhere but inside attention, where an all-to-all trades it for a
#   head split (section 6).
# - *Context parallelism*: Megatron-Core's and PyTorch's name for the second, the
#   sequence split through every layer with ring (or all-gathered) K/V; Llama 3's "CP".
#
# A claim one reads about Megatron's kind: "with TP = 8 each GPU holds 1/8 of the
# sequence, but LayerNorm and dropout normalise over the sequence, so they need an
# all-reduce across GPUs". Both halves are wrong. Under tensor parallelism alone every GPU
# holds the *whole* sequence between the blocks (the 10·sbh of lesson 04 is replicated);
# and LayerNorm normalises each token over its own h features (dropout is elementwise),
# so on sequence shards it needs no communication at all. Measured with nn's LayerNorm:

# %%
x_ln = draw.standard_normal((32, 2, 16))  # x_ln: [s, b, h]
gamma, beta = draw.standard_normal(16), draw.standard_normal(16)
with mp.device():
    whole_ln, s_whole = layernorm_forward(x_ln, gamma, beta)  # [s, b, h]
    pieces = [layernorm_forward(piece, gamma, beta) for piece in np.split(x_ln, T)]  # [s/t, b, h]
    sharded_ln = np.concatenate([y for y, _ in pieces])
    s_whole.release()
    for _, s_piece in pieces:
        s_piece.release()
print("LayerNorm on 4 sequence shards, glued, equals the whole one bit for bit:",
      np.array_equal(sharded_ln, whole_ln))

# %% [markdown]
# What sequence parallelism does need is an all-gather before each block and a
# reduce-scatter after it (replacing tensor parallelism's all-reduce), and a sum over the
# tp ranks of the LayerNorm *weight* gradients, each rank having seen s/t tokens.

# %% [markdown]
# ## 2. Attention over blocks and the log-sum-exp merge
#
# For one query with scores x_j = q·k_j / √d over keys j, attention is
# out = Σ_j e^(x_j) v_j / Σ_j e^(x_j). Cut the keys into two blocks K_1, K_2 and give each
# block its own partial answer and its log-sum-exp:
#
#     lse_i = log Σ_{j ∈ K_i} e^(x_j)          out_i = Σ_{j ∈ K_i} e^(x_j − lse_i) v_j
#
# The whole denominator is e^lse_1 + e^lse_2, and each block's numerator is e^lse_i · out_i,
# so
#
#     lse = log(e^lse_1 + e^lse_2)
#     out = (e^lse_1 · out_1 + e^lse_2 · out_2) / (e^lse_1 + e^lse_2)
#
# Divide through by e^lse_1: block 2's share of the weight is 1 / (1 + e^(lse_1 − lse_2)) =
# sigmoid(lse_2 − lse_1), and
#
#     out = out_1 − sigmoid(lse_2 − lse_1) · (out_1 − out_2)
#     lse = lse_1 − logsigmoid(lse_1 − lse_2)
#
# which exponentiates only minus an absolute value (`merge.py`: sigmoid and logsigmoid
# from e^(−|x|) ≤ 1). That is FlashAttention's online softmax (Dao et al. 2022) and ring
# attention's update. Three blocks of 4, 3 and 3 keys, merged in two orders, against the
# softmax over all ten:

# %%
q2 = draw.standard_normal((1, 2, 3, 4))  # q2: [b, a, m, d], 3 queries
k2, v2 = draw.standard_normal((2, 1, 2, 10, 4))  # k2, v2: [b, a, n, d], 10 keys
scores2 = q2 @ k2.swapaxes(-1, -2) / 2.0  # scores2: [b, a, m, n], √d = 2
softmax2 = np.exp(scores2 - scores2.max(-1, keepdims=True))
direct = (softmax2 / softmax2.sum(-1, keepdims=True)) @ v2  # direct: [b, a, m, d]
direct_lse = np.log(np.exp(scores2).sum(-1))  # direct_lse: [b, a, m]
with mp.device():
    parts = [block_forward(q2, k2[:, :, cols], v2[:, :, cols], np.ones((3, len(cols)), bool),
                           0.0) for cols in (range(0, 4), range(4, 7), range(7, 10))]
merged = {}
for order in ((0, 1, 2), (2, 0, 1)):
    out2, lse2 = parts[order[0]]
    for i in order[1:]:
        out2, lse2 = merge(out2, lse2, *parts[i])
    merged[order] = (np.abs(out2 - direct).max(), np.abs(lse2 - direct_lse).max())
    print(f"blocks merged in order {order}: out differs from the softmax by "
          f"{merged[order][0]:.1e}, lse by {merged[order][1]:.1e}")

# %% [markdown]
# The merge is commutative and associative up to rounding, so a ring can merge its blocks
# in whatever order they arrive. Now the same blocks with every score raised by 1000 (a
# shift changes no softmax: out stays, lse moves by 1000). The direct form exponentiates
# lse itself; e^x overflows past x = 709.8 in float64 and past 88.7 in float32:

# %%
shifted = [(o, lse + 1000.0) for o, lse in parts]
(o_a, l_a), (o_b, l_b) = shifted[0], merge(*shifted[1], *shifted[2])
with np.errstate(over="ignore", invalid="ignore"):
    naive = (np.exp(l_a)[..., None] * o_a + np.exp(l_b)[..., None] * o_b) / \
        (np.exp(l_a) + np.exp(l_b))[..., None]
stable_out, stable_lse = merge(o_a, l_a, o_b, l_b)
overflow = {"float64": float(np.log(np.finfo(np.float64).max)),
            "float32": float(np.log(np.finfo(np.float32).max))}
shift_err = (np.abs(stable_out - direct).max(), np.abs(stable_lse - 1000.0 - direct_lse).max())
print(f"e^x overflows past x = {overflow['float64']:.1f} (float64), {overflow['float32']:.1f} "
      f"(float32)")
print(f"scores + 1000: the direct form gives {np.isnan(naive).sum()} NaNs of {naive.size}; the "
      f"sigmoid form differs from the softmax by {shift_err[0]:.1e} (lse by {shift_err[1]:.1e})")

# %% [markdown]
# Subtracting the larger lse before exponentiating (`merge_ref`, the definition, does) is
# the same cure. **Exercise 9.1** writes the merge.

# %% [markdown]
# ## 3. Ring attention
#
# Rank i holds its queries q_i and, in turn, every rank's K/V. In cp steps the blocks
# travel around the ring — rank i sends to i + 1 and receives from i − 1 — so at step t
# rank i holds the K/V of rank (i − t) mod cp, computes its queries' partial attention over
# those keys and merges it in. Each step posts the send of the block it holds and the
# receive of the next *before* computing, so the transfer runs while the block computes.
#
# Under the causal mask, query chunk i and key chunk j are **full** if j < i, **diagonal**
# if j = i (key position ≤ query position inside the block) and **masked** if j > i; a
# step whose pairs are all masked is skipped. The charge in chunk-pair units is 1 per full
# pair, ½ per diagonal one (FlashAttention's convention for causal FLOPs). cp = 4, s = 32,
# b = 2, 4 heads of 4, in the contiguous layout (rank r holds tokens r·s/4 .. (r+1)·s/4 − 1)
# and in zigzag's (section 4), forward and backward against nn's one-device core:

# %%
S3, B3, HEADS3, D3 = 32, 2, 4, 4
qkv3 = draw.standard_normal((S3, B3, 3 * HEADS3 * D3))  # qkv3: [s, b, 3h]
dctx3 = draw.standard_normal((S3, B3, HEADS3 * D3))  # dctx3: [s, b, h]
with mp.device():
    want_ctx3, saved3 = core_attention_forward(qkv3, HEADS3, 0.0, None)  # [s, b, h]
    want_dqkv3 = core_attention_backward(dctx3, saved3)  # [s, b, 3h]


def ring_run(ctx, layout):
    group = mp.new_group(range(CP), "cp")
    out, kept = ring_attention_forward(shard(qkv3, layout, ctx.rank, CP), HEADS3, group,
                                       layout)  # out: [s/cp, b, h]
    mark = len(ctx.trace.events)  # where the backward starts
    dqkv = ring_attention_backward(shard(dctx3, layout, ctx.rank, CP), kept)  # [s/cp, b, 3h]
    return out, dqkv, mark


rings = {layout: mp.launch(lambda ctx: ring_run(ctx, layout), CP)
         for layout in ("contiguous", "zigzag")}
ring_err = {}
for layout, res in rings.items():
    ctx3 = unshard([r[0] for r in res], layout)  # [s, b, h], sequence order
    dqkv3 = unshard([r[1] for r in res], layout)  # [s, b, 3h]
    ring_err[layout] = (np.abs(ctx3 - want_ctx3).max(), np.abs(dqkv3 - want_dqkv3).max())
    print(f"ring attention, {layout:>10}: context differs from one device by "
          f"{ring_err[layout][0]:.1e}, dqkv by {ring_err[layout][1]:.1e}")

# %% [markdown]
# Which blocks each rank computed, read from the trace: the chunk-pair units of each
# step's q·kᵀ matmul (its FLOPs over one full c × c pair's, c = s/cp), with the source of
# the K/V it held:

# %%
unit3 = 2.0 * B3 * HEADS3 * (S3 // CP) ** 2 * D3  # one c x c matmul's FLOPs
res = rings["contiguous"]
step_units = np.zeros((CP, CP))  # [rank, step]
for r, run in enumerate(res.contexts):
    for e in run.trace.events[:res[r][2]]:  # the forward's events
        if e.stream == "compute" and e.label.endswith("q@k^T"):
            step_units[r, int(e.label.split()[3])] = e.flops / unit3
for r in range(CP):
    cells = [f"K/V of {(r - t) % CP}: {Fraction(step_units[r, t]).limit_denominator(4)!s:>3}"
             for t in range(CP)]
    print(f"rank {r}:  " + "   ".join(cells))

# %% [markdown]
# Rank 0's queries come first, so it only ever uses its own keys; rank 3 uses everything.
# The zero entries are skipped blocks: no compute, though the K/V still pass through to the
# next rank.
#
# **The backward** keeps no block's probabilities: the forward saved q, k, v, the output and
# the final lse, and the backward recomputes each block's P = exp(S − lse) exactly (as
# FlashAttention's does). K/V go around the ring again. dQ is this rank's queries' and stays
# home; dK/dV of a block belong to its owner, so their accumulator travels *with* the
# block: every rank adds its queries' share and passes it on, and after cp sends it is
# home, summed over every rank's queries. Forward: cp − 1 K/V sends; backward: cp − 1 K/V
# sends and cp dK/dV sends, the accumulators kept in float32 under bf16
# (ring-flash-attention's choice). The sends of rank 1, from the trace:

# %%
sends3 = [[e.meta["sent_bytes"] for e in events if e.stream == "p2p" and e.name == "send"]
          for events in (res.contexts[1].trace.events[:res[1][2]],
                         res.contexts[1].trace.events[res[1][2]:])]
bytes3 = ring_attention_bytes(S3, B3, HEADS3 * D3, CP, 8)
print(f"forward: {len(sends3[0])} sends, {sum(sends3[0]):,} bytes (formula {bytes3.forward:,.0f}); "
      f"backward: {len(sends3[1])} sends, {sum(sends3[1]):,} bytes (formula "
      f"{bytes3.backward:,.0f})")

# %% [markdown]
# ## 4. Load balance: contiguous against zigzag
#
# Causal attention is a triangle: query i works on i + 1 keys. In the contiguous layout
# rank r computes r full blocks and one diagonal: (2r + 1)/cp² of the work, and every rank
# waits for the last one. **Zigzag** cuts the sequence into 2·cp chunks and gives rank r
# chunks r and 2cp − 1 − r, an early chunk and its mirror image (Llama 3, Dubey et al.
# 2024, section 3.3.2). Striped attention (Brandon et al. 2023) balances the same way with
# single-token stripes, token i on rank i mod cp. The positions at cp = 4, s = 16:

# %%
for layout in ("contiguous", "zigzag"):
    print(f"{layout:>10}: " + "   ".join(
        f"rank {r}: {positions(layout, r, CP, 16).tolist()}" for r in range(CP)))

# %% [markdown]
# Each rank's share of the attention FLOPs, forward and backward, from the trace of the
# runs in section 3, and `costs.attention_work`'s fractions:

# %%
work = {}
for layout, res in rings.items():
    flops = [sum(e.flops for e in run.trace.events if e.stream == "compute")
             for run in res.contexts]
    work[layout] = [Fraction(f / sum(flops)).limit_denominator(64) for f in flops]
    print(f"{layout:>10}: measured {' '.join(map(str, work[layout]))}   costs.attention_work "
          f"{' '.join(map(str, attention_work(layout, CP)))}")

# %%
figures.bars("09_causal_work", f"Each rank's share of causal attention's FLOPs, cp = {CP} "
             "(from the trace)", [f"rank {r}" for r in range(CP)],
             {layout: [float(f) for f in shares] for layout, shares in work.items()},
             ylabel="share of the attention FLOPs", annotate="{:.3f}",
             hline=(1 / CP, f"even: 1/{CP}"))

# %% [markdown]
# With zigzag every ring step costs every rank two chunk-pair units: at its own step a
# causal 2 × 2 block (two diagonals and a full pair), with an earlier rank's K/V both its
# query chunks against that rank's first key chunk, with a later rank's its second query
# chunk against both key chunks. On a device slow enough that compute decides the clock
# (10 MFLOP/s; every transfer is negligible beside it), the forward and backward of one
# attention layer:

# %%
slow = mp.Topology.nodes(1, CP, mp.DeviceSpec("a slow device", {"float64": 1e7}, 80 * GB))
step_time = {}
for layout in ("contiguous", "zigzag"):
    ends = mp.launch(lambda ctx: (ring_run(ctx, layout), ctx.clock.now)[1], CP, topology=slow)
    step_time[layout] = max(ends)
    print(f"{layout:>10}: {step_time[layout] * 1e3:6.2f} ms (each rank's clock: "
          f"{', '.join(f'{t * 1e3:.2f}' for t in ends)} ms)")
print(f"contiguous / zigzag = {step_time['contiguous'] / step_time['zigzag']:.3f}")

# %% [markdown]
# Contiguous takes as long as its last rank's 7/16 of the work, zigzag its even 1/4: 7/4
# times longer, and (2cp − 1)/cp in general, approaching 2. The sum of the work is the
# same; only its spread differs. **Exercise 9.2** computes zigzag's positions and the kind
# of every chunk pair a ring step meets.

# %% [markdown]
# ## 5. When the K/V send hides behind the block compute
#
# Take the zigzag forward, where every step is alike. One step computes 2 chunk-pair units
# of 2 matmuls each, 2·b·a·c²·d FLOPs a matmul with c = s/(2cp):
#
#     T_c = 8·b·h·c² / P = 2·b·h·s² / (cp²·P)             (P: the device's peak FLOP/s)
#
# and sends one rank's K and V, 2·(s/cp)·b·h elements of e bytes, over a link of latency α
# and bandwidth B:
#
#     T_s = α + 2·(s/cp)·b·h·e / B
#
# The send starts with the step's compute, so the forward takes (cp − 1)·max(T_c, T_s) + T_c
# and the transfers hide once T_c ≥ T_s. Setting them equal gives a quadratic in s:
#
#     (2bh / (cp² P)) s² − (2bhe / (cp B)) s − α = 0
#     s* = cp·e·P/B · (1 + √(1 + 2·α·B² / (b·h·e²·P))) / 2   ≈   cp · e · P / B
#
# Without α the crossover depends on nothing but the device and the link: each rank's
# share s/cp must exceed e·P/B tokens. For an H100 in bf16 (P = 989 TFLOP/s), b = 1,
# h = 4096, cp = 4, on NVLink 4 and on InfiniBand NDR (the topology presets), from the
# formula, checked against the cost model's own step times (`ring_attention_flops`,
# `p2p_time`) just below and just above it, and against `costs.ring_hidden_length`, the
# shortest length zigzag can cut (a multiple of 2·cp) at which the send hides:

# %%
B5, HEADS5, D5, E5 = 1, 32, 128, 2  # bf16
H5 = HEADS5 * D5
PEAK = mp.DeviceSpec.h100_sxm().peak("bfloat16")
LINKS = {"NVLink": mp.Topology.nodes(1, 8).intra, "InfiniBand": mp.Topology.nodes(2, 8).inter}
crossover = {}
for name, link in LINKS.items():
    a2, a1 = 2 * B5 * H5 / (CP**2 * PEAK), 2 * B5 * H5 * E5 / (CP * link.bandwidth)
    s_star = (a1 + np.sqrt(a1**2 + 4 * a2 * link.latency)) / (2 * a2)
    grid = 2 * CP * int(np.ceil(s_star / (2 * CP)))  # the first length zigzag can cut
    hides = []
    for s in (grid - 2 * CP, grid):
        t_c = ring_attention_flops("zigzag", 0, CP, s, B5, HEADS5, D5)[0] / CP / PEAK
        t_s = p2p_time(2 * (s // CP) * B5 * H5 * E5, link)
        hides.append(t_c >= t_s)
    crossover[name] = (s_star, CP * E5 * PEAK / link.bandwidth, hides,
                       ring_hidden_length(B5, H5, CP, E5, PEAK, link))
    print(f"{name:>10}: s* = {s_star:,.0f} tokens ({s_star / CP:,.0f} a rank; without α "
          f"{crossover[name][1]:,.0f}); the cost model: hidden at s = {grid - 2 * CP:,}? "
          f"{hides[0]}; at {grid:,}? {hides[1]}; ring_hidden_length {crossover[name][3]:,}")

# %% [markdown]
# **Measured on the clock.** NumPy cannot run 150,000 tokens in a lesson, but the clock
# only adds FLOPs / P and α + V/B. Make the device k times slower and the link's latency
# k times shorter: at s/k tokens every step then takes exactly 1/k of what it takes at s
# tokens on the real hardware (in T_c, s² falls by k² and P by k; in T_s, α and s both
# fall by k), so the crossover falls at s*/k. Ring attention in bf16 on such ranks,
# forward and backward, around s*/k (k = 256 on NVLink, 2048 on InfiniBand), the exposed
# time being the clock minus the compute stream's busy time, scaled back by k:

# %%
SCALE = {"NVLink": 256, "InfiniBand": 2048}
clock5 = {}
for name, link in LINKS.items():
    k = SCALE[name]
    scaled = mp.Topology(CP, 1, mp.DeviceSpec(f"H100 / {k}", {"bfloat16": PEAK / k}, 80 * GB),
                         intra=link, inter=mp.Link(f"{link.name}, α / {k}", link.bandwidth,
                                                   link.latency / k))  # every neighbour on it
    for s_k in (56, 64, 72, 80, 88):
        qkv5 = draw.standard_normal((s_k, B5, 3 * H5)).astype(BF16)  # [s/k, b, 3h]
        dctx5 = draw.standard_normal((s_k, B5, H5)).astype(BF16)  # [s/k, b, h]

        def timed(ctx):
            group = mp.new_group(range(CP), "cp")
            _, kept = ring_attention_forward(shard(qkv5, "zigzag", ctx.rank, CP), HEADS5,
                                             group, "zigzag")  # [s/k/cp, b, h]
            t_fwd, busy_fwd = ctx.clock.now, ctx.trace.busy_time("compute")
            ring_attention_backward(shard(dctx5, "zigzag", ctx.rank, CP), kept)
            return (t_fwd - busy_fwd,
                    ctx.clock.now - t_fwd - (ctx.trace.busy_time("compute") - busy_fwd))

        exposed = mp.launch(timed, CP, topology=scaled)[0]
        tail = p2p_time(2 * (s_k // CP) * B5 * H5 * 4, scaled.inter)  # the last dK/dV send
        clock5[name, s_k * k] = (exposed[0] * k, exposed[1] * k, tail * k)
        print(f"{name:>10} s = {s_k * k:>7,}: forward exposed {exposed[0] * k * 1e6:7.1f} us; "
              f"backward exposed {exposed[1] * k * 1e6:7.1f} us, of which the last dK/dV "
              f"send {tail * k * 1e6:6.1f} us")

# %% [markdown]
# The forward's exposed time falls to zero between the two lengths that bracket s*, on
# each link. Across nodes the crossover is B_NVLink / B_IB = 9 times longer at the same
# cp: a sequence whose ring hides inside a node is nine times too short to hide across
# nodes.
#
# The backward is slower to hide. A step computes 5 matmuls a unit instead of 2 and sends
# both K/V (e bytes) and a dK/dV accumulator (g = 4 bytes, float32): it hides once
# 5·b·h·s²/(cp²·P) ≥ 2α + 2(s/cp)·b·h·(e + g)/B, at about 2(e + g)/(5e) = 1.2 times the
# forward's s* in bf16. And the last dK/dV send, which brings each block's gradient home
# after the last step, has no compute left to hide behind: α + 2(s/cp)·b·h·g/B is exposed
# at every length (the last column above). Grouped-query attention shrinks K and V by
# a_kv/a, and the crossover with them: Llama 3 405B's 8 KV heads of 128 divide it by 16.

# %% [markdown]
# ## 6. DeepSpeed-Ulysses: all-to-all from sequence shards to head shards
#
# Ulysses keeps the sequence split everywhere but inside attention. An all-to-all turns
# each rank's [s/cp, b, 3h] (every head, its tokens) into [s, b, 3h/cp] (every token,
# a/cp heads); each rank runs the one-device core on its heads; a second all-to-all turns
# the context back. The backward is the same two all-to-alls reversed around the core's
# backward. Same run as section 3:

# %%
def ulysses_run(ctx):
    group = mp.new_group(range(CP), "cp")
    out, kept = ulysses_attention_forward(shard(qkv3, "zigzag", ctx.rank, CP), HEADS3, group,
                                          "zigzag")  # out: [s/cp, b, h]
    mark = len(ctx.trace.events)
    dqkv = ulysses_attention_backward(shard(dctx3, "zigzag", ctx.rank, CP), kept)  # [s/cp, b, 3h]
    sent = [sum(e.meta.get("sent_bytes", 0) for e in part if e.stream in ("comm", "p2p"))
            for part in (ctx.trace.events[:mark], ctx.trace.events[mark:])]
    return out, dqkv, sent


uly = mp.launch(ulysses_run, CP)
uly_err = (np.abs(unshard([r[0] for r in uly], "zigzag") - want_ctx3).max(),
           np.abs(unshard([r[1] for r in uly], "zigzag") - want_dqkv3).max())
res = rings["zigzag"]
ring_sent = [sum(e.meta.get("sent_bytes", 0) for e in part if e.stream == "p2p")
             for part in (res.contexts[0].trace.events[:res[0][2]],
                          res.contexts[0].trace.events[res[0][2]:])]
uly_bytes = ulysses_attention_bytes(S3, B3, HEADS3 * D3, CP, 8)
print(f"Ulysses against one device: context {uly_err[0]:.1e}, dqkv {uly_err[1]:.1e}")
print(f"bytes rank 0 sent, forward / backward: Ulysses {uly[0][2][0]:,.0f} / {uly[0][2][1]:,.0f}"
      f" (formula {uly_bytes.forward:,.0f}); ring {ring_sent[0]:,.0f} / {ring_sent[1]:,.0f}")

# %% [markdown]
# Each rank runs nn's own core, so Ulysses equals one device to the last bit. Its bytes:
# four tensors of (s/cp)·b·h each way (q, k, v and the context forward; their gradients
# backward), of which a rank keeps 1/cp: (cp − 1)/cp · 4(s/cp)·b·h·e. The ring sends
# (cp − 1) · 2(s/cp)·b·h·e forward: the same at cp = 2, and Ulysses' falls as 1/cp where
# the ring's approaches 2·s·b·h·e whatever cp. Per layer at s = 32,768, b = 1, h = 4096 in
# bf16 (`costs.py`):

# %%
table6 = {}
for cp in (2, 4, 8, 16):
    ring6 = ring_attention_bytes(32768, 1, 4096, cp, 2)
    uly6 = ulysses_attention_bytes(32768, 1, 4096, cp, 2)
    table6[cp] = (ring6, uly6)
    print(f"cp = {cp:>2}: ring {ring6.forward / MB:5.0f} MB forward, {ring6.backward / MB:5.0f} "
          f"MB backward; Ulysses {uly6.forward / MB:4.0f} MB each way")

# %% [markdown]
# Bytes are not time. The ring's go to a neighbour and hide behind the blocks once the
# sequence is long enough (section 5); Ulysses' all-to-alls sit on the critical path,
# before and after the core, every rank sending to every other. The forward's
# communication time that nothing hides, at s = 65,536, cp = 8 (the ring's exposed sends,
# (cp − 1)·max(0, T_s − T_c); Ulysses' two all-to-alls), inside one node and across 8 nodes
# (one GPU of each), from the cost model:

# %%
S6, CP6 = 65536, 8
kv6 = 2 * (S6 // CP6) * 4096 * 2  # one rank's K and V, bf16
t_c6 = ring_attention_flops("zigzag", 0, CP6, S6, 1, 32, 128)[0] / CP6 / PEAK
exposed6 = {}
for where, topo, ranks in (("one node", mp.Topology.nodes(1, CP6), list(range(CP6))),
                           ("8 nodes", mp.Topology.nodes(CP6, 8), [8 * i for i in range(CP6)])):
    ring_t = (CP6 - 1) * max(0.0, p2p_time(kv6, topo.link(ranks[0], ranks[1])) - t_c6)
    uly_t = sum(collective_cost("all_to_all", part, ranks, topo,
                                traffic=[[part / CP6] * CP6 for _ in ranks]).seconds
                for part in (3 * kv6 / 2, kv6 / 2))  # q, k, v out; the context back
    exposed6[where] = (ring_t, uly_t)
    print(f"{where:>8}: ring {ring_t * 1e3:6.3f} ms exposed, Ulysses {uly_t * 1e3:6.3f} ms "
          f"(a step computes {t_c6 * 1e3:.3f} ms)")

# %% [markdown]
# Inside a node the ring hides entirely and Ulysses pays its all-to-alls; across nodes
# this sequence is too short for the ring (s/cp is under e·P/B on InfiniBand), its sends
# stall every step, and Ulysses' fewer bytes win. So the ring needs long sequences to
# cross nodes, and Ulysses' every-to-every traffic is cheapest inside one. The heads are
# what Ulysses splits, so cp must divide the head count (under tensor parallelism, the
# heads of one tp rank), and minipar refuses anything else:

# %%
def refuse(ctx):
    try:
        ulysses_attention_forward(np.zeros((2, 1, 3 * 6 * 2)), 6, mp.new_group(range(CP)))
    except ValueError as error:
        return str(error)
    return None


refusal = mp.launch(refuse, CP)[0]
print(refusal)

# %% [markdown]
# With grouped-query attention Ulysses splits the KV heads too: Llama 3 405B's 8 KV heads
# cap it at cp = 8 (beyond it the KV heads must be replicated), and its tp = 8 leaves one KV
# head a tp rank. Ring attention has no such limit.

# %% [markdown]
# ## 7. Which to choose, and what bf16 does to it
#
# | | ring attention (zigzag) | DeepSpeed-Ulysses |
# | --- | --- | --- |
# | what moves | K/V to a neighbour, cp − 1 times forward; K/V and dK/dV backward | two all-to-alls each way |
# | bytes a rank | → 2·s·b·h·e forward whatever cp | 4(cp − 1)·s·b·h·e / cp², falls as 1/cp |
# | overlap | hidden once s/cp ≥ e·P/B (section 5) | on the critical path |
# | where | in a node; across nodes once s/cp ≥ e·P/B on InfiniBand | in a node; across nodes it beats a ring that cannot hide |
# | limit | none on heads; s a multiple of 2·cp | cp divides the (KV) heads per tp rank |
# | GQA | K/V shrink by a_kv/a, and the crossover with them | cp ≤ a_kv unless KV heads are copied |
# | masks, dropout | block masks by position; dropout refused here | any mask the core takes; dropout works |
#
# Production systems combine them: Ulysses inside a node and the ring across nodes (the
# hybrid of USP, Fang and Zhao 2024), or Llama 3's choice. A claim one reads is that
# Llama 3 405B trained its long context with ring attention. Its report (section 3.3.2)
# describes otherwise: the zigzag split into 2·cp chunks for balance, but the K/V
# *all-gathered* and then attended locally — simpler, and fit for the document masks of
# its data — affordable because grouped-query attention makes K/V small. At its 128k
# stage (cp = 16 across nodes, tp = 8, so one KV head of 128 a tp rank and 16 query heads),
# from the cost model:

# %%
S7, CP7, KV7, Q7, D7 = 131072, 16, 1, 16, 128  # per tp rank: 1 KV head, 16 query heads
ib16 = mp.Topology.nodes(CP7, 8)
kv_all = 2 * S7 * KV7 * D7 * 2  # K and V of the whole sequence, bf16: the all-gather's output
cp_ranks = [8 * i for i in range(CP7)]  # one GPU of each of 16 nodes
gather = collective_cost("all_gather", kv_all, cp_ranks, ib16)
without_gqa = collective_cost("all_gather", kv_all * Q7 // KV7, cp_ranks, ib16)
attend = ring_attention_flops("zigzag", 0, CP7, S7, 1, Q7, D7)[0] / PEAK
llama = (kv_all / MB, gather.seconds, attend, gather.link, without_gqa.seconds)
print(f"the K/V all-gather: {llama[0]:.0f} MB out, {llama[1] * 1e3:.2f} ms on {llama[3]}; a "
      f"rank's attention forward: {llama[2] * 1e3:.2f} ms; without GQA ({Q7} KV heads a tp "
      f"rank) the all-gather would take {llama[4] * 1e3:.2f} ms")

# %% [markdown]
# The all-gather is exposed, but at a fraction of the attention it feeds; without GQA it
# would carry sixteen times the bytes and take longer than the attention itself.
#
# **bf16.** A ring adds its blocks in another order than one softmax, and in bf16 one might
# fear the error grows with the number of merges. Relative error of the context and of
# dqkv against float64 on one device, s = 64, b = 2, 8 heads of 16 (the ring keeps its
# partial outputs, lse, dQ and the travelling dK/dV in float32, and rounds once):

# %%
qkv7 = draw.standard_normal((64, 2, 3 * 8 * 16))  # [s, b, 3h]
dctx7 = draw.standard_normal((64, 2, 8 * 16))  # [s, b, h]
with mp.device():
    ref_ctx7, saved7 = core_attention_forward(qkv7, 8, 0.0, None)
    ref_dqkv7 = core_attention_backward(dctx7, saved7)
    low_ctx7, saved7 = core_attention_forward(qkv7.astype(BF16), 8, 0.0, None)
    low_dqkv7 = core_attention_backward(dctx7.astype(BF16), saved7)
rel = lambda got, want: float(np.linalg.norm(got.astype(np.float64) - want)  # noqa: E731
                              / np.linalg.norm(want))
bf16_err = {"one device": (rel(low_ctx7, ref_ctx7), rel(low_dqkv7, ref_dqkv7))}
for cp in (1, 2, 4, 8):
    for form, fwd, bwd in (("ring", ring_attention_forward, ring_attention_backward),
                           ("Ulysses", ulysses_attention_forward, ulysses_attention_backward)):

        def bf16_run(ctx):
            group = mp.new_group(range(cp), "cp")
            out, kept = fwd(shard(qkv7.astype(BF16), "zigzag", ctx.rank, cp), 8, group,
                            "zigzag")  # [s/cp, b, h]
            return out, bwd(shard(dctx7.astype(BF16), "zigzag", ctx.rank, cp), kept)

        got = mp.launch(bf16_run, cp)
        bf16_err[form, cp] = (rel(unshard([g[0] for g in got], "zigzag"), ref_ctx7),
                              rel(unshard([g[1] for g in got], "zigzag"), ref_dqkv7))
for key, (fwd_err, bwd_err) in bf16_err.items():
    label = key if isinstance(key, str) else f"{key[0]}, cp = {key[1]}"
    print(f"{label:>16}: context {fwd_err:.2e}, dqkv {bwd_err:.2e}")

# %% [markdown]
# The ring's error does not grow with cp: every merge works in float32 and the result is
# rounded to bf16 once. Its backward sits a little above the one-device core's (the two
# round different intermediates: the ring its recomputed P and dS before each matmul),
# and Ulysses, which runs the one-device core on its heads, has the core's error at every
# cp.

# %% [markdown]
# ## 8. A whole GPT: cp on the mesh
#
# `parallelize(cfg, ParallelDims(dp_replicate=2, cp=2), cp_method=...)` gives each of the 4
# ranks the zigzag rows of its dp block (ids and targets [s, B] → [s/cp, B/dp]), embeds them
# at their global positions, runs the ring (or Ulysses) as every block's attention core, and
# averages the gradients over dp × cp: each cp rank's loss is the mean over its rows, and
# its gradient reaches the weights of every row through the K/V it sent. Three AdamW steps
# against one device, float64:

# %%
from minipar.data.batches import split_microbatches  # noqa: E402
from minipar.nn import GPT, GPTConfig  # noqa: E402
from minipar.optim import AdamW  # noqa: E402
from minipar.parallel import ParallelDims, parallelize  # noqa: E402

CFG8 = GPTConfig(vocab_size=16, seq_len=16, hidden=16, num_heads=4, num_layers=2, seed=3)
steps8 = [draw.integers(0, 16, (2, 16, 4)) for _ in range(3)]  # (ids, targets): [s, B] each
with mp.device():
    one8 = GPT(CFG8)
    opt8 = AdamW(one8.parameters(), lr=1e-2)
    want8 = []
    for ids, tgt in steps8:
        want8.append(one8.loss_and_grad(ids, tgt))
        opt8.step()
        opt8.zero_grad()
    want_w8 = {p.name: p.data.copy() for p in one8.parameters()}
mesh8 = {}
for method in ("ring", "ulysses"):

    def train8(ctx):
        run = parallelize(CFG8, ParallelDims(dp_replicate=2, cp=2), cp_method=method,
                          placement="any", lr=1e-2)
        losses = [run.train_step(ids, tgt) for ids, tgt in steps8]
        rows = run.local_batch(*steps8[0])[0].shape  # this rank's [s/cp, B/dp]
        return losses, run.model.full_parameters(), rows, run.groups.coordinate["cp"]

    got8 = mp.launch(train8, 4)
    mean8 = np.mean([r[0] for r in got8], axis=0)  # each rank: its dp block's mean loss
    loss_err = float(np.abs(mean8 - want8).max())
    w_err = max(float(np.abs(r[1][n] - w).max()) for r in got8 for n, w in want_w8.items())
    mesh8[method] = (loss_err, w_err, got8[0][2])
    print(f"{method:>8}: each rank runs ids of shape {got8[0][2]}; after 3 steps the losses "
          f"differ from one device's by {loss_err:.1e}, the weights by {w_err:.1e}")

# %% [markdown]
# Both equal one device to float64 rounding. What the mesh refuses, it says: dropout with
# cp > 1 (a rank's masks would be a strided slice of the one-device draw, not written),
# a mixture of experts, a sequence the zigzag cannot cut into 2·cp chunks, and Ulysses
# where cp does not divide a tp rank's heads. `minipar train --cp 2 --dp 2` runs it from
# the command line; tests/parallel/mesh/test_context.py proves it with tp (± SP), pp, ZeRO
# and FSDP.

# %% [markdown]
# ## Exercises
#
# - **9.1** `merge_partials`: two partial attentions (out, lse) over disjoint keys merged
#   into one, finite wherever the answer is (section 2), against `merge_ref` on drawn
#   blocks, with scores past e^x's overflow and blocks whose lse differ by hundreds.
# - **9.2** `zigzag_positions` and `step_pairs`: the global positions a zigzag rank holds,
#   and the kind of every (query chunk, key chunk) pair at a ring step, for either layout
#   (sections 3 and 4), against `positions` and `plan_block` at cp up to 8.
# - **9.3** `cp_costs`: a rank's bytes per layer for the ring and for Ulysses (or none, if
#   cp does not divide the heads), one zigzag step's compute and send time, and whether the
#   send hides (sections 5 and 6), against `costs.py` and the cost model.
#
# `minipar grade 09` grades `exercise.py`.
#
# ## Summary
#
# - Megatron's sequence parallelism splits only what lies between the blocks; attention
#   sees the whole sequence for its a/t heads, and t stops at the heads and the node.
#   Context parallelism splits the tokens of every layer by cp, attention included.
#   "Sequence parallelism" also names Colossal-AI's ring and DeepSpeed-Ulysses.
# - Partial attentions over disjoint keys merge by their lse: out −= sigmoid(lse_b −
#   lse)·(out − out_b), lse −= logsigmoid(lse − lse_b), in any order, never overflowing.
# - Ring attention passes K/V around cp ranks, skips fully masked blocks, and in the
#   backward sends K/V again and dK/dV home: (cp − 1) + cp sends. It equals one device.
# - Contiguous shards give rank r (2r + 1)/cp² of the causal work (1/16 .. 7/16 at
#   cp = 4); zigzag's chunks r and 2cp − 1 − r give each 1/cp, and the step is (2cp − 1)/cp
#   times shorter.
# - The forward's K/V send hides once s/cp ≥ e·P/B (plus a latency term): nine times
#   longer sequences across nodes (InfiniBand) than inside one (NVLink); the backward
#   needs 1.2 times that in bf16 and always exposes its last dK/dV send.
# - Ulysses: two all-to-alls each way, 4(cp − 1)·s·b·h·e/cp² bytes a rank, on the critical
#   path, cp dividing the heads. The ring: ~2·s·b·h·e forward, hidden on long enough
#   sequences, no head limit.
# - bf16 error does not grow with cp. Llama 3 all-gathered its (GQA-small) K/V with the
#   zigzag split, not a ring.
