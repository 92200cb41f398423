# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 12 — Activation recomputation
#
# Trade FLOPs for memory: what a block keeps for its backward, tensor by tensor on the ledger; full and selective recomputation measured in bytes and in FLOPs from the trace; checkpoint segments of k layers and the best k; HFU against MFU; what FlashAttention leaves to recompute; incident C as a recomputation question; and a recomputation plan chosen under a memory budget.
#
# A layer's backward needs tensors its forward computed. Keeping them all costs memory
# that grows with the batch, the sequence and the depth (lesson 00 §2–3); recomputing
# them costs FLOPs. Three papers frame the trade: Chen et al. 2016 ("Training Deep Nets
# with Sublinear Memory Cost") keep only the inputs of checkpointed segments and rerun
# each segment in the backward; Korthikanti et al. 2022 ("Reducing Activation
# Recomputation in Large Transformer Models") count what a transformer layer keeps,
# tensor by tensor, and recompute only its attention core; Dao et al. 2022
# ("FlashAttention") never write the attention scores to memory at all, and recompute them
# tile by tile in the backward. Lesson 03 §5 met checkpoint segments in incident C and
# lesson 10 §3 and §7 priced recomputation in a planned step; here each mode is taken
# apart on the ledger and the trace of simulated devices, then at real scale with the
# planner.
#
# `GPTConfig(recompute=...)` has four modes (`minipar/nn/block.py`, `nn/segments.py`):
# `"none"`, `"selective"` (the attention core), `"full"` (every block keeps only its
# input) and `"segments"` with `recompute_segment=k` (Chen et al.'s segments of k blocks).

# %%
import dataclasses
import functools

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.nn.attention import core_attention_backward, core_attention_forward
from minipar.nn.saved import saved_nbytes
from minipar.parallel.cp import ring_attention_backward, ring_attention_forward
from minipar.parallel.tp.gpt import TensorParallelGPT
from minipar.plan import (CLUSTERS, MODELS, Layout, ModelSpec, activation_bytes_per_layer,
                          best_segment, model_flops, model_flops_full_recompute, rank_memory,
                          segments_activation_bytes, selective_recompute_extra_flops,
                          sqrt_rule, step_time)
from minipar.plan.rank_memory import layer_activation_bytes
from minipar.programs.incidents import zero3_recompute
from minipar.viz import figures

GiB, GB, MiB = 2**30, 10**9, 2**20
A100, H100 = CLUSTERS["a100"], CLUSTERS["h100"]

# %% [markdown]
# ## 1. What a block keeps for its backward
#
# Korthikanti et al. (section 4.1) count one layer's saved tensors, with 2-byte
# activations and 1-byte dropout masks, as sbh(34 + 5as/h) bytes: s tokens, b sequences,
# hidden size h, a heads. minipar's block saves exactly those tensors, each a `Saved`
# object charged to the ledger's "activations" (`nn/saved.py`). Here is block 0's forward
# of a one-layer GPT in bf16 with dropout, read off the ledger allocation by allocation.
# The sizes make as/h = 2.4, so every tensor is a whole number of exactly one unit: sbh
# for the [s, b, ·] ones, as²b for the [b, a, s, s] ones.

# %%
s, b, h, a = 24, 2, 40, 4
sbh, as2b = s * b * h, a * s * s * b
TENSORS = [  # in the order block 0's forward saves them: (the tensor, its unit)
    ("ln1's input x", sbh), ("the QKV linear's input", sbh), ("softmax output", as2b),
    ("attention dropout mask (1 byte)", as2b), ("Q, K and V", sbh),
    ("attention dropout output", as2b), ("the projection's input", sbh),
    ("residual dropout mask (1 byte)", sbh), ("ln2's input x1", sbh),
    ("fc1's input", sbh), ("GeLU's input [s, b, 4h]", sbh), ("fc2's input [s, b, 4h]", sbh),
    ("residual dropout mask (1 byte)", sbh)]
cfg1 = GPTConfig(vocab_size=32, seq_len=s, hidden=h, num_heads=a, num_layers=1, dropout=0.1,
                 dtype="bfloat16")
with mp.device() as ctx:
    model = GPT(cfg1)
    live = {}  # unit -> the allocations alive before its forward, then those it added
    model.hooks.register("forward_pre", lambda unit: live.__setitem__(
        unit, {x.name for x in ctx.ledger.live()}))
    model.hooks.register("forward_post", lambda unit: live.__setitem__(
        unit, [x for x in ctx.ledger.live() if x.name not in live[unit]]))
    ids = np.random.default_rng(1).integers(0, cfg1.vocab_size, (s, b))
    loss, cache = model.forward(ids, ids)
kept1 = live["blocks.0"]
by_unit = {"sbh": 0, "as²b": 0}
for (what, unit), x in zip(TENSORS, kept1):
    name = "sbh" if unit == sbh else "as²b"
    by_unit[name] += x.nbytes / unit
    print(f"  {x.name.split('#')[0]:<30} {x.nbytes:>7,} B = {x.nbytes / unit:g} {name:<5} {what}")
measured1 = sum(x.nbytes for x in kept1)
print(f"  block 0 keeps {measured1:,} B = {by_unit['sbh']:g} sbh + {by_unit['as²b']:g} as²b; "
      f"sbh(34 + 5as/h) = {sbh * (34 + 5 * a * s / h):,.0f} B; "
      f"activation_bytes_per_layer = {activation_bytes_per_layer(s, b, h, a):,.0f} B")

# %% [markdown]
# Korthikanti et al. group them: attention 11sbh + 5as²b (the QKV input 2, Q and K 4, V 2,
# the projection input 2, the output dropout's mask 1; the softmax output 2as²b, its
# dropout's mask as²b and the dropped probabilities 2as²b), the MLP 19sbh (fc1's input 2,
# GeLU's input 8, fc2's input 8, the mask 1), the two LayerNorms 4sbh. Two details of the
# count matter below. **Without dropout** there are no masks and the dropped
# probabilities *are* the softmax output, kept once: 32sbh + 2as²b. **Under tensor
# parallelism** over t ranks (Table 2 of the paper) what lies inside the column- and
# row-parallel blocks is split — Q, K, V, the projection's input, the MLP's 16sbh and the
# whole s² core, 24sbh + 5as²b — but the 10sbh between them (the LayerNorm inputs and
# outputs feeding the QKV and fc1 linears, the residual masks) is whole on every rank,
# unless sequence parallelism splits it along s (lesson 04):
#
#     tensor parallel              sbh(10 + 24/t + 5as/(ht))
#     tensor + sequence parallel   sbh(34/t + 5as/(ht))
#
# Measured on rank 0 of a tensor-parallel GPT over t = 2, each mode, against the formula:

# %%
def tp_block_bytes(ctx, sp=False, recompute="none"):
    model = TensorParallelGPT(cfg1.with_(recompute=recompute), mp.new_group(range(2), "tp"),
                              sequence_parallel=sp)
    held = {}
    model.hooks.register("forward_pre", lambda unit: held.__setitem__(
        unit, -ctx.ledger.held("activations")))
    model.hooks.register("forward_post", lambda unit: held.__setitem__(
        unit, held[unit] + ctx.ledger.held("activations")))
    model.forward(ids, ids)
    return held["blocks.0"]


table2 = {}
for sp in (False, True):
    for recompute in ("none", "selective", "full"):
        got = mp.launch(functools.partial(tp_block_bytes, sp=sp, recompute=recompute), 2)[0]
        want = activation_bytes_per_layer(s, b, h, a, recompute, tp=2, sequence_parallel=sp)
        table2[sp, recompute] = (got, want)
        print(f"  t = 2, {'SP   ' if sp else 'no SP'}, {recompute:<9}: {got:>6,} B = "
              f"{got / sbh:6.3f} sbh on the ledger, {want / sbh:6.3f} sbh by the formula")

# %% [markdown]
# Without sequence parallelism the 10sbh between the blocks does not shrink: at t = 2 a
# rank keeps 10 + 12 = 22sbh of the 34 (selective), and full recomputation keeps the whole
# input, 2sbh, on both ranks. With it every term is split: 17sbh and 1sbh. A common
# mistake divides only the attention term by t, or divides everything by t without SP.

# %% [markdown]
# ## 2. Full recomputation: keep the input, run the forward twice
#
# Under `recompute="full"` a block keeps its input x (2sbh) and a copy of the dropout
# generator's state, and frees everything its forward saved. Its backward first reruns
# the forward from x, keeping everything, then backpropagates through it. The forward
# therefore holds L·2sbh instead of L·sbh(34 + 5as/h); the peak comes in the backward,
# (L − 1)·2sbh + one layer's whole A, as lesson 00 §3 measured. What it costs: every block's
# forward runs twice. A forward of a layer is 24Bsh² + 4Bs²h FLOPs, its backward twice
# that, so the blocks' FLOPs grow by 4/3 exactly; the head (the logits, 2BshV) is not
# rerun. Counted from the trace of a 4-layer GPT, forward and backward apart, in each mode:

# %%
cfg2 = GPTConfig(vocab_size=64, seq_len=16, hidden=32, num_heads=2, num_layers=4,
                 dropout=0.1, dtype="bfloat16")
B2 = 3
ids2 = np.random.default_rng(2).integers(0, cfg2.vocab_size, (cfg2.seq_len, B2))
runs2 = {}
for recompute in ("none", "selective", "full"):
    with mp.device() as ctx:
        model = GPT(cfg2.with_(recompute=recompute))
        loss, cache = model.forward(ids2, np.roll(ids2, -1, axis=0))
        kept = ctx.ledger.held("activations")
        n_forward = len(ctx.trace.events)
        model.backward(cache)
        events = [e for e in ctx.trace.events if e.flops]
        forward = [e for e in ctx.trace.events[:n_forward] if e.flops]
        backward = [e for e in ctx.trace.events[n_forward:] if e.flops]
        runs2[recompute] = {
            "kept": kept, "peak": ctx.ledger.peak("activations"), "loss": loss,
            "forward": sum(e.flops for e in forward), "backward": sum(e.flops for e in backward),
            "blocks": sum(e.flops for e in events if not e.label.startswith("lm_head")),
            "qk": sum(e.label == "attn q@k^T" for e in events),
            "grads": {n: p.grad.copy() for n, p in model.named_parameters().items()}}
F2 = model_flops(B2, cfg2.seq_len, cfg2.num_layers, cfg2.hidden, cfg2.vocab_size)
F2_full = model_flops_full_recompute(B2, cfg2.seq_len, cfg2.num_layers, cfg2.hidden,
                                     cfg2.vocab_size)
for recompute, r in runs2.items():
    print(f"  {recompute:<9} kept after the forward {r['kept']:>7,} B, peak {r['peak']:>7,} B; "
          f"FLOPs forward {r['forward']:>10,.0f}, backward {r['backward']:>10,.0f}, total "
          f"{r['forward'] + r['backward']:>10,.0f}")
print(f"  model_flops = {F2:,.0f}; model_flops_full_recompute = {F2_full:,.0f} "
      f"(x{F2_full / F2:.4f})")
print(f"  the blocks alone: x{runs2['full']['blocks'] / runs2['none']['blocks']:.4f} "
      f"(4/3 = {4 / 3:.4f}); the backward: x"
      f"{runs2['full']['backward'] / runs2['none']['backward']:.4f}")
same2 = all(np.array_equal(g, runs2[mode]["grads"][n]) for mode in ("selective", "full")
            for n, g in runs2["none"]["grads"].items())
print(f"  gradients of all {len(runs2['none']['grads'])} parameters bit for bit equal in the "
      f"three modes: {same2}")

# %% [markdown]
# The trace's totals are `plan.model_flops` and `plan.model_flops_full_recompute` to the
# FLOP: 72Bslh²(1 + s/(6h) + V/(12lh)) and 96Bslh²(1 + s/(6h) + V/(16lh)). The blocks'
# FLOPs grow by exactly 4/3; the step's by less, since the head is not rerun, and the
# backward's by almost half (one forward on top of a backward of two forwards' worth, the
# head's excepted). The gradients are identical bit for bit because the rerun replays the
# same dropout masks: the block copies the generator before its forward and draws from the
# copy when it reruns (Megatron keeps a CUDA RNG tracker for the same reason). A rerun that
# drew fresh masks would compute the gradient of a different network, with the same loss:
# interview question q130 measures how far off.

# %% [markdown]
# ## 3. Selective recomputation: drop the s² tensors, rerun Q Kᵀ
#
# The 5as/h term is the attention core's s² tensors: the softmax output, its dropout
# mask and the dropped probabilities. They are large (at s = 2048, h = 12288, a = 96 the
# term is 80 against the 34) and cheap to recompute (no weights; one batched matmul).
# Selective recomputation keeps Q, K and V and reruns the core in the backward: a layer
# keeps 34sbh (32sbh without dropout). In the runs above, the selective block kept 34sbh
# and the trace counted the core's Q Kᵀ matmul (label "attn q@k^T") once more per layer:

# %%
extra_selective = runs2["selective"]["forward"] + runs2["selective"]["backward"] - F2
print(f"  Q Kᵀ matmuls: none {runs2['none']['qk']}, selective {runs2['selective']['qk']}, "
      f"full {runs2['full']['qk']} (L = {cfg2.num_layers})")
print(f"  selective's extra FLOPs {extra_selective:,.0f} = L·2Bs²h = "
      f"{selective_recompute_extra_flops(B2, cfg2.seq_len, cfg2.num_layers, cfg2.hidden):,.0f}")

# %% [markdown]
# Why Q Kᵀ alone: the core's backward needs the softmax output P (for the softmax's own
# backward) and the dropped probabilities (for dV = Pᵀ·dO), never the core's output, so
# minipar reruns Q Kᵀ, the softmax and the dropout (from the saved generator) and skips
# P·V: 2Bs²h a layer. Megatron-LM checkpoints the whole core function, so it reruns P·V
# too: 4Bs²h. The planner (and so HFU in section 5) counts Megatron's 4Bs²h.
#
# The trade depends on s/h. Per layer, the bytes saved are 5as²b of sbh(34 + 5as/h); the
# FLOPs added, 4Bs²h a layer over 72Bsh²(1 + s/(6h) + V/(12lh)), about s/(18h) of the
# step. For GPT-3 175B's shape (96 layers, h = 12288, 96 heads, V = 51,200) at longer
# and longer sequences:

# %%
G3 = MODELS["175b"]
L3, h3, a3, V3 = G3.layers, G3.hidden, G3.heads, G3.vocab
lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
trade = {}
for s3 in lengths:
    none3 = activation_bytes_per_layer(s3, 1, h3, a3)
    sel3 = activation_bytes_per_layer(s3, 1, h3, a3, "selective")
    flops3 = model_flops(1, s3, L3, h3, V3)
    trade[s3] = {"saved": 1 - sel3 / none3,
                 "megatron": 2 * selective_recompute_extra_flops(1, s3, L3, h3) / flops3,
                 "minipar": selective_recompute_extra_flops(1, s3, L3, h3) / flops3}
    print(f"  s = {s3:>6,}: selective drops {trade[s3]['saved']:6.1%} of a layer's bytes "
          f"for {trade[s3]['megatron']:6.2%} more FLOPs (Q Kᵀ alone: "
          f"{trade[s3]['minipar']:6.2%})")

# %% [markdown]
# At s = 2048 selective recomputation removes 70 % of the activations for under 1 % of
# the FLOPs: the best trade in the course. The saving stays near all of it as s grows, but
# the price climbs with s/h: a fifth of the step at 128k tokens. FlashAttention
# (section 6) avoids the s² tensors without that price.
#
# Per layer and micro-batch (b = 1), with tensor parallelism over 8 and sequence
# parallelism as Megatron runs GPT-3 175B, the three modes against the sequence length:

# %%
per_layer = {mode: [activation_bytes_per_layer(s3, 1, h3, a3, mode, tp=8,
                                               sequence_parallel=True) / GiB
                    for s3 in lengths] for mode in ("none", "selective", "full")}
for i, s3 in enumerate(lengths):
    print(f"  s = {s3:>6,}: none {per_layer['none'][i]:8.3f} GiB, selective "
          f"{per_layer['selective'][i]:7.3f} GiB, full {per_layer['full'][i]:6.3f} GiB")
figures.lines("12_activations_vs_length",
              "GPT-3 175B: one layer's activations, tp 8 + SP, b = 1",
              lengths, {{"none": "no recomputation"}.get(m, m): v
                        for m, v in per_layer.items()},
              xlabel="sequence length s", ylabel="GiB a layer", logx=True, logy=True)

# %% [markdown]
# On the log-log axes "none" bends upward (the s² term takes over past s ≈ 34h/(5a),
# 870 tokens here), selective and full stay straight (linear in s), 17 to 1 apart.
# Multiply by the layers a rank holds (96/p, and 1F1B's micro-batches in flight, lesson 05)
# to get a rank's total.

# %% [markdown]
# ## 4. Checkpoint segments: (L/k − 1)·I + k·A, and the best k
#
# Chen et al. 2016 keep less than one input per layer: cut the L layers into segments of
# k, keep only each segment's input through the forward, and in the backward rerun one
# segment's k forwards, keeping everything, just before backpropagating through it
# (`recompute="segments"`, `recompute_segment=k`; Megatron-LM's `--recompute-method
# uniform --recompute-num-layers k`). With I = 2sbh a kept input and A what a layer keeps
# when it keeps everything, the worst moment is the backward of the top segment, after its
# rerun: the inputs of the L/k − 1 segments below it, and its own k layers (its input is
# inside its first layer's A). For k dividing L:
#
#     M(k) = (L/k − 1)·I + k·A  ≈  2sbh·L/k + k·A
#
# Fewer kept inputs cost a larger rerun. Over a real k, dM/dk = −L·I/k² + A = 0 at
#
#     k* = √(L·I/A),     M(k*) = 2√(L·I·A) − I.
#
# Chen et al.'s √L is this optimum for a chain whose layers keep no more than their inputs
# (A = I): memory O(√L), sublinear in depth. A transformer layer keeps far more than its
# input: A/I = 17 + 2.5as/h in bf16 with dropout, 16 + as/h without, so k* = √(L/17) or
# less, about 2 at L = 64. For integers, segments of k beat segments of k − 1 when
# L > k(k − 1)·A/I, and when k does not divide L the last segment is shorter and the peak
# is the largest m·I + k_m·A over the segments m (`plan.segments_activation_bytes`,
# `plan.best_segment`). FLOPs do not depend on k: every layer's forward runs twice, as in
# full recomputation (k = 1 *is* full recomputation, byte for byte). Measured on a 64-layer
# GPT (bf16, no dropout, as/h = 0.5, so A = 16.5·I), one forward and backward each:

# %%
cfg4 = GPTConfig(vocab_size=16, seq_len=8, hidden=32, num_heads=2, num_layers=64,
                 dtype="bfloat16")
L4, s4, h4, a4 = cfg4.num_layers, cfg4.seq_len, cfg4.hidden, cfg4.num_heads
A4 = activation_bytes_per_layer(s4, 1, h4, a4, "none", dropout=False)
I4 = activation_bytes_per_layer(s4, 1, h4, a4, "full", dropout=False)
ids4 = np.random.default_rng(4).integers(0, cfg4.vocab_size, (s4, 1))
segment_sizes = [1, 2, 3, 4, 6, 8, 16, 32, 64]
segments4 = {}
for k in segment_sizes:
    cfg_k = cfg4.with_(recompute="segments", recompute_segment=k)
    with mp.device() as ctx:
        GPT(cfg_k).loss_and_grad(ids4, np.roll(ids4, -1, axis=0))
        segments4[k] = {"ledger": ctx.ledger.peak("activations"),
                        "planned": zero3_recompute.planned_activations(cfg_k),
                        "blocks": segments_activation_bytes(L4, k, A4, I4),
                        "flops": sum(e.flops for e in ctx.trace.events)}
ids_bytes4 = 2 * 8 * s4  # the int64 token ids and positions, held through the step
for k, r in segments4.items():
    print(f"  k = {k:>2}: ledger peak {r['ledger']:>7,} B, formula {r['planned']:>9,.0f} B "
          f"(blocks (L/k − 1)I + kA = {r['blocks'] / I4:5.1f} I, + the ids); FLOPs "
          f"{r['flops']:,.0f}")
best4 = best_segment(L4, A4, I4)
print(f"  A = {A4 / I4:g} I: best k = {best4}; √(L·I/A) = {sqrt_rule(L4, A4, I4):.2f}; "
      f"Chen's √L = {L4 ** 0.5:g}, best for a chain (A = I): "
      f"k = {best_segment(L4, I4, I4)}")
figures.lines("12_peak_vs_segment", f"Peak activations against the segment size ({L4} layers)",
              segment_sizes,
              {"ledger (less the ids)": [(segments4[k]["ledger"] - ids_bytes4) / I4
                                         for k in segment_sizes],
               f"(L/k − 1)·I + k·A, A = {A4 / I4:g} I": [segments4[k]["blocks"] / I4
                                                      for k in segment_sizes],
               "a chain, A = I (Chen's √L)": [segments_activation_bytes(L4, k, I4, I4) / I4
                                              for k in segment_sizes]},
              xlabel="segment size k (layers)", ylabel="peak, in kept inputs I = 2sbh",
              logx=True, logy=True)

# %% [markdown]
# The ledger equals the formula at every k (the formula's extra 16sb bytes are the token
# ids and positions, held through the step). The curve is a U with its bottom at k = 2:
# 63 I kept inputs of k = 1 fall to 31, for one more layer of 16.5 I rerun at once; at
# k = 3 the rerun already costs more than the inputs save, and one segment of all 64
# layers holds all 64 layers' A at once, as no recomputation does. For a chain the bottom
# sits near √64 = 8 (k = 6 and 8 tie at 15 I), where this model holds 139 I, more than
# twice its best. The FLOPs are the same for every k: the segment size is chosen for
# memory alone.

# %% [markdown]
# ## 5. MFU against HFU
#
# Model FLOPs utilisation counts the FLOPs the model needs (Narayanan et al. 2021's
# 72Bslh²(1 + s/(6h) + V/(12lh)) for a GPT) over what the GPUs could have done in the
# step; hardware FLOPs utilisation also counts the recomputed ones (lesson 10 §7). Since
# both divide by the same step · GPUs · peak, their ratio is a property of the shape
# alone:
#
#     HFU/MFU (full)       = F_full/F = (4/3)·(1 + s/(6h) + V/(16lh)) / (1 + s/(6h) + V/(12lh))
#     HFU/MFU (selective)  = 1 + 4Bs²hl/F = 1 + (s/(18h)) / (1 + s/(6h) + V/(12lh))
#
# GPT-3 175B on 64 A100s as Korthikanti et al. ran it (Table 3: tp 8, pp 8, interleaved
# with 3 chunks, 64 sequences of 2048 a step), planned by `plan.step_time`:

# %%
mfu175 = {}
for label, recompute, sp in (("none, SP", "none", True), ("full, no SP", "full", False),
                             ("full, SP", "full", True), ("selective, SP", "selective", True)):
    lay = Layout(tp=8, pp=8, schedule="interleaved_1f1b", chunks=3, global_batch=64,
                 sequence_parallel=sp, recompute=recompute)
    st, mem = step_time(G3, lay, A100), rank_memory(G3, lay, A100)
    mfu175[label] = {"seconds": st.seconds, "mfu": st.mfu, "hfu": st.hfu,
                     "recompute": st.terms["recompute"] / st.seconds,
                     "peak": mem.peak / GiB, "fits": mem.fits}
    print(f"  {label:<14} step {st.seconds:6.2f} s, MFU {st.mfu:6.1%}, HFU {st.hfu:6.1%} "
          f"(HFU/MFU {st.hfu / st.mfu:.4f}), recompute {mfu175[label]['recompute']:5.1%} of "
          f"the step; peak {mem.peak / GiB:5.1f} GiB: {'fits' if mem.fits else 'does not fit'}")
s175 = G3.seq_len
x175 = 1 + s175 / (6 * h3)
ratio175 = {"full": 4 / 3 * (x175 + V3 / (16 * L3 * h3)) / (x175 + V3 / (12 * L3 * h3)),
            "selective": 1 + s175 / (18 * h3) / (x175 + V3 / (12 * L3 * h3))}
print(f"  by the closed forms: full {ratio175['full']:.4f}, selective {ratio175['selective']:.4f}")

# %% [markdown]
# Without recomputation the first rank needs more than an 80 GB A100. Full recomputation
# fits, and its HFU of about 53 % looks as good as selective's 54 %: the GPUs are as busy.
# But a quarter of what they compute is the forward again, and its MFU is 39.5 % against
# 53.5 %: the step is a third longer. HFU measures how well the kernels run; MFU measures
# how fast the model trains. Quote MFU, and HFU beside it when recomputation is on
# (Korthikanti et al. report both). The ratio depends only on the shape: a reported HFU
# under full recomputation is 4/3 of the MFU, less the head's share.

# %% [markdown]
# ## 6. What FlashAttention changes
#
# FlashAttention (Dao et al. 2022) computes the attention core tile by tile in on-chip
# memory: the s × s scores and probabilities never reach HBM, so they cannot be kept. It
# keeps Q, K, V, the output and, per query row and head, the float32 log-sum-exp of its
# scores (4asb bytes); its backward recomputes each tile's probabilities from Q, K and
# the log-sum-exp. minipar's blockwise attention (`parallel/cp`, the core of ring
# attention) works the same way; on one rank it *is* FlashAttention's algorithm. The
# attention core alone, in bf16 without dropout, in the three forms, what it keeps and the
# matmuls its forward and backward run:

# %%
def attention_cores(ctx):
    rng = np.random.default_rng(6)
    qkv = rng.standard_normal((s, b, 3 * h)).astype(cfg1.np_dtype)
    out = {}
    for form in ("stored scores", "selective", "FlashAttention"):
        start = len(ctx.trace.events)
        if form == "FlashAttention":
            y, kept = ring_attention_forward(qkv, a, mp.new_group([0], "cp"))
        else:
            y, kept = core_attention_forward(qkv, a, 0.0, rng, selective=form == "selective")
        held, middle = saved_nbytes(kept), len(ctx.trace.events)
        backward = ring_attention_backward if form == "FlashAttention" else core_attention_backward
        backward(np.ones_like(y), kept)
        out[form] = {"kept": held,
                     "forward": sum(1 for e in ctx.trace.events[start:middle] if e.flops),
                     "backward": sum(1 for e in ctx.trace.events[middle:] if e.flops)}
    return out


cores6 = mp.launch(attention_cores, 1)[0]
lse6 = 4 * a * s * b  # float32, one per query row and head
for form, r in cores6.items():
    print(f"  {form:<15} keeps {r['kept']:>6,} B = {r['kept'] / sbh:5.2f} sbh; matmuls: "
          f"forward {r['forward']}, backward {r['backward']}")
print(f"  FlashAttention: Q, K, V 6sbh = {6 * sbh:,} + its output 2sbh = {2 * sbh:,} + the "
      f"log-sum-exp 4asb = {lse6:,} B")

# %% [markdown]
# The stored-scores core keeps 6sbh + 2as²b (no dropout: the softmax output once) and its
# backward runs 4 matmuls. Selective keeps 6sbh and runs 5: Q Kᵀ again. FlashAttention
# keeps 6sbh, its output (which in a real block is the projection's input, already among
# the 34sbh: one tensor, counted once) and the log-sum-exp, and its backward also runs 5:
# the recomputed scores, then dV, dP, dQ, dK. So FlashAttention *is* selective
# recomputation, done inside the kernel: the same bytes (plus 4asb) and the same extra
# Q Kᵀ. On top of FlashAttention, Megatron's selective recomputation has nothing left to
# drop and only costs its rerun. At scale, Llama 3 70B (lesson 10's layout: tp 8, pp 4,
# dp 8, SP, the distributed optimizer) at 8k and 32k tokens:

# %%
L70 = MODELS["llama3-70b"]
LAY70 = Layout(tp=8, pp=4, dp=8, global_batch=512, sequence_parallel=True,
               distributed_optimizer=True)
flash6 = {}
for s70 in (8192, 32768):
    model70 = dataclasses.replace(L70, seq_len=s70)
    bytes70 = {"stored": layer_activation_bytes(model70, s70, 1, 8, True, "none", dropout=False),
               "selective": layer_activation_bytes(model70, s70, 1, 8, True, "selective",
                                                   dropout=False),
               "flash": layer_activation_bytes(model70, s70, 1, 8, True, "none", dropout=False,
                                               core=False)}
    times70 = {}
    for recompute in ("none", "selective"):
        for flash in (False, True):
            lay = dataclasses.replace(LAY70, recompute=recompute)
            times70[recompute, flash] = step_time(model70, lay, H100, dropout=False,
                                                  flash_attention=flash).seconds
    flash6[s70] = {"bytes": bytes70, "times": times70}
    print(f"  s = {s70:>6,}: a layer keeps {bytes70['stored'] / GiB:6.2f} GiB with stored scores, "
          f"{bytes70['selective'] / GiB:5.3f} GiB selective, {bytes70['flash'] / GiB:5.3f} GiB "
          f"with FlashAttention")
    print(f"           step: stored scores {times70['none', False]:6.2f} s (selective "
          f"{times70['selective', False]:6.2f} s); FlashAttention {times70['none', True]:6.2f} s, "
          f"+ selective {times70['selective', True]:6.2f} s "
          f"({times70['selective', True] / times70['none', True] - 1:+.1%} for no memory)")

# %% [markdown]
# With FlashAttention and no recomputation a layer keeps what selective recomputation
# keeps, and the step is the shortest of the four (no s² bytes through HBM either, lesson
# 10 §5). Adding selective recomputation then costs 6 % of the step at 8k tokens and 16 %
# at 32k for nothing. The decision that remains is full recomputation (or segments):
# whether even 34sbh/t a layer is too much.

# %% [markdown]
# ## 7. Incident C as a recomputation question
#
# The case (lesson 03 §5, lesson 10 §9): a 13B model moved from ZeRO-2 to ZeRO-3 with
# activation checkpointing peaked about 20 % *above* ZeRO-2; `limit_all_gathers=True` and
# checkpointing "in groups of 2 layers" instead of per layer were reported as the fix.
# Lesson 03 showed the all-gathers running ahead; lesson 10 found the planner's accounting
# below ZeRO-2. The recomputation half of the question: did the groups of 2 help?
#
# Groups of 2 are segments of k = 2. Under ZeRO-3 a segment's rerun needs its k blocks'
# weights whole (gathered at each block's recompute, released after its backward), so
# every layer a segment adds costs its A *and* its gathered weights W: the same formula
# with A + W in place of A,
#
#     M(k) = (L/k − 1)·I + k·(A + W),     k* = √(L·I/(A + W)).
#
# On the small model of `minipar incident c`, cut to 8 layers (dp 4, bf16, the limit on
# all-gathers), the largest rank's ledger, per-layer checkpoints against segments of 2:

# %%
cfg7 = zero3_recompute.MODEL.with_(num_layers=8)
table7 = zero3_recompute.scenarios(cfg7)
peaks7 = {key: zero3_recompute.measure(table7[key][1], table7[key][2])["peak"]
          for key in ("zero3_limit", "zero3_both")}
with mp.device():
    W7 = 2 * sum(p.size for p in GPT(cfg7).units()[1][1])  # one bf16 block, whole
A7 = activation_bytes_per_layer(cfg7.seq_len, 1, cfg7.hidden, cfg7.num_heads, dropout=False)
I7 = activation_bytes_per_layer(cfg7.seq_len, 1, cfg7.hidden, cfg7.num_heads, "full",
                                dropout=False)
change7 = {c: peaks7["zero3_both"][c] - peaks7["zero3_limit"][c]
           for c in ("parameters", "activations", "total")}
print(f"  per layer:      parameters {peaks7['zero3_limit']['parameters']:>9,} B, activations "
      f"{peaks7['zero3_limit']['activations']:>7,} B, total {peaks7['zero3_limit']['total']:>9,} B")
print(f"  segments of 2:  parameters {peaks7['zero3_both']['parameters']:>9,} B, activations "
      f"{peaks7['zero3_both']['activations']:>7,} B, total {peaks7['zero3_both']['total']:>9,} B")
print(f"  parameters {change7['parameters']:+,} B = one block W = {W7:,} B; activations "
      f"{change7['activations']:+,} B = A − 4I = {A7 - 4 * I7:+,.0f} B (A = {A7 / I7:g} I)")

# %% [markdown]
# Segments of 2 raised both: one more block whole, and on 8 layers (fewer than 2A/I = 34)
# a larger rerun than the inputs they stop keeping. At the reported scale, GPT-3 13B's
# shape (40 layers, h = 5120, 40 heads, s = 2048, b = 1, bf16, no dropout), with the
# scores stored and with FlashAttention:

# %%
M13 = ModelSpec("GPT-3 13B", 40, 5120, 40, 4 * 5120, 51200, 2048)
W13 = 2 * M13.layer_parameters()  # one layer's bf16 weights, gathered whole
I13 = activation_bytes_per_layer(2048, 1, 5120, 40, "full", dropout=False)
incident13 = {}
for label, A13 in (("scores stored", activation_bytes_per_layer(2048, 1, 5120, 40,
                                                                 dropout=False)),
                   ("FlashAttention", activation_bytes_per_layer(2048, 1, 5120, 40, "selective",
                                                                  dropout=False)
                    + 4 * 40 * 2048)):
    row = {"A": A13, "k1": segments_activation_bytes(40, 1, A13, I13),
           "k2": segments_activation_bytes(40, 2, A13, I13),
           "z3_k1": segments_activation_bytes(40, 1, A13 + W13, I13),
           "z3_k2": segments_activation_bytes(40, 2, A13 + W13, I13),
           "best": best_segment(40, A13, I13), "best_z3": best_segment(40, A13 + W13, I13),
           "k_star": sqrt_rule(40, A13, I13), "k_star_z3": sqrt_rule(40, A13 + W13, I13)}
    incident13[label] = row
    print(f"  {label:<15} A = {A13 / I13:5.2f} I (I = {I13 / MiB:.0f} MiB), W = "
          f"{W13 / MiB:,.0f} MiB: activations per layer {row['k1'] / GiB:.3f} GiB, in groups "
          f"of 2 {row['k2'] / GiB:.3f} GiB ({(row['k2'] - row['k1']) / MiB:+,.0f} MiB); with "
          f"the weights under ZeRO-3 {(row['z3_k2'] - row['z3_k1']) / MiB:+,.0f} MiB")
    print(f"  {'':<15} best k {row['best']} (√(L·I/A) = {row['k_star']:.2f}); under ZeRO-3 "
          f"{row['best_z3']} (√(L·I/(A + W)) = {row['k_star_z3']:.2f})")

# %% [markdown]
# With the scores stored (A = 32 I), segments of 2 need L > 2A/I = 64 layers to pay, and
# the 13B has 40: they add 240 MiB. With FlashAttention (A ≈ 16 I) they would save 80 MiB —
# but under ZeRO-3 the second gathered block costs 600 MiB, so they add about 520 MiB
# there too. The best segment under ZeRO-3 is k = 1 either way (k* < 1). As a
# recomputation question the answer is: checkpointing per layer was already optimal;
# the groups of 2 could not have been the fix, and `limit_all_gathers` was. Checkpointing
# itself was not to blame either: it shrank the activations to (L − 1)·I + A; what grew
# was the gathered weights, and a per-layer rerun gathers each layer no more often than a
# backward without recomputation does (at its rerun, kept through its backward).

# %% [markdown]
# ## 8. A recomputation plan under a memory budget: the task of Exercise 12.4
#
# **Exercise 12.4** asks for the cheapest recomputation that fits. Given a GPT (bf16, no
# dropout), a micro-batch of b sequences and a budget for the activations' peak (the
# ledger's "activations" over one forward and backward on one device), return
# `{"recompute": ..., "recompute_segment": k}` whose peak is within the budget and whose
# FLOPs are the fewest among those that fit. The FLOPs order the modes: none (0) <
# selective (Q Kᵀ again) < full = segments of any k (one more forward). The grader runs
# your plan on the ledger and counts its FLOPs on the trace. The 64-layer model of
# section 4 with b = 1, every mode:

# %%
plans8 = {"none": {}, "selective": {}, "full": {},
          f"segments of {best4}": {"recompute_segment": best4}}
budget8 = {}
for label, extra in plans8.items():
    recompute = label.split()[0]
    with mp.device() as ctx:
        GPT(cfg4.with_(recompute=recompute, **extra)).loss_and_grad(ids4, np.roll(ids4, -1, 0))
        budget8[label] = (ctx.ledger.peak("activations"), sum(e.flops for e in ctx.trace.events))
for label, (peak, flops) in budget8.items():
    print(f"  {label:<14} activation peak {peak:>7,} B, FLOPs {flops:>11,.0f} "
          f"({flops / budget8['none'][1] - 1:+.1%})")

# %% [markdown]
# A budget of 40,000 bytes excludes none, selective and full, and admits segments of 2;
# 60,000 admits full recomputation. On this model (s = 8) the s² tensors are small and
# selective saves 3 %; on a longer sequence it is the one that fits, and then the plan
# costs Q Kᵀ again instead of a whole forward. The formulas of sections 1 to 4 (and
# `plan.training_memory`, which the section-4 table checked) predict none's, full's and the
# segments' peaks to the byte. Selective's peak is the larger of the forward's end and the
# first backward, whose rerun core adds one layer's s² tensors for a moment: work it out,
# or measure it as above.

# %% [markdown]
# ## Exercises
#
# Open `exercise.py`, replace each `raise NotImplementedError(...)` with your answer, and
# run `minipar grade 12`.
#
# - **12.1** `layer_activation_bytes(s, b, h, a, tp, sequence_parallel, recompute,
#   dropout)`: the bytes one layer keeps for its backward on a tensor-parallel rank, in
#   bf16, in each recomputation mode, with and without dropout and sequence parallelism
#   (Korthikanti et al.'s Table 2; sections 1–3), equal to `plan.activation_bytes_per_layer`.
# - **12.2** `segments_peak(num_layers, k, layer, kept)` and `best_segment_size(num_layers,
#   layer, kept)`: the most bytes checkpoint segments of k layers hold at once, the shorter
#   last segment included, and the k that makes it smallest (section 4).
# - **12.3** `hfu_from_mfu(mfu, B, s, l, h, V, recompute)`: a GPT step's HFU from its MFU
#   under each recomputation mode, as `plan.step_time` counts them (section 5).
# - **12.4** `plan_recompute(cfg, micro_batch, budget)`: the recomputation with the fewest
#   FLOPs whose activation peak fits a budget, graded on the ledger (section 8).
#
# ## Summary
#
# - A layer keeps sbh(34 + 5as/h) bytes for its backward (bf16, dropout): 34sbh of linear
#   inputs, Q, K, V, LayerNorm inputs, GeLU's and masks, and 5as²b of attention scores.
#   Without dropout 32sbh + 2as²b; under tensor parallelism the 10sbh between the blocks
#   stays whole unless sequence parallelism splits it: sbh(10 + 24/t + 5as/(ht)) or
#   sbh(34/t + 5as/(ht)). Measured to the byte on the ledger.
# - Full recomputation keeps 2sbh a layer (÷ t with SP) and runs every forward twice: the
#   blocks' FLOPs × 4/3, the step's 96(1 + s/6h + V/16lh)/72(1 + s/6h + V/12lh). The
#   rerun replays the dropout masks, so the gradients are bit for bit the same.
# - Selective recomputation drops the s² tensors and reruns Q Kᵀ (minipar; 2Bs²h a layer)
#   or the whole core (Megatron; 4Bs²h): 70 % of the bytes for under 1 % of the FLOPs at
#   s = 2048, h = 12288, but about s/(18h) of the step, a fifth at 128k tokens.
# - Segments of k hold (L/k − 1)·I + k·A, smallest at k* = √(L·I/A). A transformer layer
#   keeps 16–17 times its input and more, so k* ≈ √(L/17), not Chen et al.'s √L; the FLOPs
#   do not depend on k.
# - HFU/MFU is a property of the shape: 4/3 less the head's share under full
#   recomputation, 1 + s/(18h)/(…) under selective. HFU says how busy the GPUs were,
#   MFU how fast the model trained.
# - FlashAttention keeps what selective recomputation keeps (plus 4asb) and reruns the
#   same Q Kᵀ inside its kernel: with it, selective recomputation only costs time.
# - Incident C: under ZeRO-3 a segment's every layer also costs its gathered weights, so
#   k* = √(L·I/(A + W)) < 1 at 13B scale; groups of 2 raise the peak, per-layer
#   checkpointing was already optimal, and the limit on all-gathers was the fix.
