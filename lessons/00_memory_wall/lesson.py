# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 00 — The memory wall
#
# Why one GPU cannot train a large model: count the bytes of weights, gradients, optimizer states and activations, then fit a training step into a budget.
#
# Before choosing any form of parallelism, compute what one training step must hold in
# memory. Everything else in this course — sharding optimizer states, splitting matrices,
# cutting the model into stages — exists because of the numbers in this lesson.
#
# Run this file with `python lessons/00_memory_wall/lesson.py`, or open it as a notebook
# (Jupyter with jupytext, or VS Code's Python cells). Every number below is computed by
# minipar; nothing is typed in by hand.

# %%
import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW, MixedPrecisionOptimizer
from minipar.parallel import ParallelDims, parallelize
from minipar.plan import (activation_bytes_per_layer, format_memory_report, memory_report,
                          model_state_bytes, zero_figure1)
from minipar.viz import figures

GB = 1e9  # decimal gigabytes, as GPU datasheets count them: an H100 has 80 GB

# %% [markdown]
# ## 1. Model states: 16 bytes per parameter
#
# Mixed-precision training with Adam keeps, for every one of the Ψ parameters:
#
# | what | dtype | bytes |
# | --- | --- | --- |
# | the weights the forward and backward use | bf16 | 2 |
# | their gradients | bf16 | 2 |
# | the float32 master copy of the weights | fp32 | 4 |
# | Adam's first moment m | fp32 | 4 |
# | Adam's second moment v | fp32 | 4 |
#
# so **16Ψ bytes** — the ZeRO paper's 2Ψ + 2Ψ + KΨ with K = 12. A common way of writing
# this memory is
#
#     M_total = 2P (parameters + gradients) + 12P (Adam) + 2·S·L·P (activations) + B_other
#
# and two of its terms need care. Parameters *and* gradients are 2 bytes each: together
# 4P, not 2P. And the activation term does not scale with P at all; section 3 replaces it
# with the formula that matches what a layer really saves.
#
# The ledger of a simulated device shows the 16 bytes directly: build a small bf16 GPT,
# take one optimizer step, and read what each category holds.

# %%
cfg = GPTConfig(vocab_size=64, seq_len=32, hidden=48, num_heads=4, num_layers=2,
                dtype="bfloat16")
with mp.device() as ctx:
    model = GPT(cfg)
    opt = MixedPrecisionOptimizer(AdamW, model.parameters(), dtype="bfloat16", lr=1e-3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (cfg.seq_len, 4))
    model.loss_and_grad(ids, ids)
    opt.step()
    psi = model.num_parameters()
    held = {c: ctx.ledger.held(c) for c in ("parameters", "gradients", "optimizer_states")}
print(f"Ψ = {psi:,} parameters")
for category, nbytes in held.items():
    print(f"  {category:<17} {nbytes:>10,} bytes = {nbytes / psi:g} bytes per parameter")
print(f"  total             {sum(held.values()):>10,} bytes = "
      f"{sum(held.values()) / psi:g} bytes per parameter")

# %% [markdown]
# Now scale it up. `model_state_bytes(Ψ, stage=0, dp=1)` is the same count for a model
# that exists only on paper:

# %%
for billions in (7, 70, 405):
    total = model_state_bytes(billions * 1e9, stage=0, dp=1)["total"]
    adam = model_state_bytes(billions * 1e9, stage=0, dp=1)["optimizer_states"]
    print(f"{billions:>4}B parameters: {total / GB:>8,.0f} GB of model states "
          f"({adam / GB:,.0f} GB of them Adam's), {total / (80 * GB):5.1f}x an 80 GB GPU")

# %% [markdown]
# A 7B model already needs 112 GB before a single activation is stored: it does not fit on
# one 80 GB GPU. Adam's 12 bytes alone for 405B parameters are 4.86 TB, sixty H100s' worth.
# (For a 671B model the 16 bytes give about 10.7 TB; figures of "2.7 TB" quoted for it
# count only 4 bytes a parameter.)
#
# **Megatron counts 18.** The 16 bytes are ZeRO's (and DeepSpeed's) accounting, with bf16
# gradients. Megatron-LM, training in bf16, accumulates and all-reduces the gradients in
# float32 (its `main_grad` buffers): 2 + 4 + 12 = 18 bytes a parameter. Its distributed
# optimizer shards the 12 bytes of master weights and moments over the d data-parallel
# ranks, as ZeRO-1 does, and keeps the 2 + 4 whole: 6 + 12/d. The same function counts it
# with 4-byte gradients:

# %%
d, psi_b = 8, 7e9
counts = {"ZeRO's 16 (bf16 gradients)": model_state_bytes(psi_b, stage=0, dp=1),
          "Megatron's 18 (fp32 gradients)": model_state_bytes(psi_b, 0, 1, grad_bytes=4),
          f"ZeRO-1 over d = {d}": model_state_bytes(psi_b, stage=1, dp=d),
          f"Megatron's distributed optimizer, d = {d}":
              model_state_bytes(psi_b, stage=1, dp=d, grad_bytes=4)}
for label, c in counts.items():
    print(f"7B, {label:<44} {c['total'] / psi_b:5.2f} bytes a parameter = "
          f"{c['total'] / GB:6.1f} GB per GPU")

# %%
figures.bars("00_bytes_per_parameter", "Model states of a 7B model, bytes a parameter",
             list(counts), {"bf16 weights": [c["parameters"] / psi_b for c in counts.values()],
                            "gradients": [c["gradients"] / psi_b for c in counts.values()],
                            "fp32 master, m, v": [c["optimizer_states"] / psi_b
                                                  for c in counts.values()]},
             ylabel="bytes a parameter", stacked=True, annotate="{:.2f}")

# %% [markdown]
# So compare like with like: a Megatron run of a 7B model holds 126 GB of states where
# ZeRO's formula says 112, and with its distributed optimizer over 8 ranks 7.5 bytes a
# parameter where ZeRO-1 holds 5.5.
#
# Data parallelism (DDP) does not help: each of its N ranks holds all 16Ψ. ZeRO (lesson
# 03) shards the states across the N ranks instead — first Adam's 12 bytes, then the
# gradients, then the weights. The ZeRO paper's Figure 1 shows a 7.5B model on 64 GPUs:

# %%
for row in zero_figure1():
    print(f"  {row['name']:<24} {row['formula']:<22} {row['gb']:>9.5f} GB  "
          f"(the paper prints {row['label']})")

# %% [markdown]
# And the same count for the three model sizes, at three data-parallel sizes (a `*` marks
# what does not fit in 80 GB):

# %%
print(format_memory_report(memory_report((7, 70, 405), dp=(8, 64, 1024))))

# %% [markdown]
# Even fully sharded, a model's states only fit once N is large enough, and they are not
# all: activations come on top.
#
# ## 2. Where activations come from
#
# The backward pass needs tensors the forward computed: every linear layer's input (for
# the weight gradient), the softmax output, the dropout masks, the GeLU input. They are
# kept from the forward until the backward uses them, so they grow with the batch,
# the sequence length and the number of layers. Korthikanti et al. (2022) count them per
# layer, with 2-byte activations and 1-byte masks:
#
#     activations per layer = s·b·h·(34 + 5·a·s/h)   bytes
#
# (s sequence length, b micro-batch, h hidden size, a heads). The 34 counts the linear
# inputs, LayerNorm inputs, Q, K, V, the GeLU input and masks; the 5as/h term is the
# attention matrix, s × s per head — quadratic in the sequence: per head, the softmax
# output (2 bytes an element), its dropout mask (1) and the dropped-out probabilities (2),
# 5as²b bytes in all.
#
# minipar's GPT saves exactly these tensors, and its ledger counts them. One layer's
# forward, measured:

# %%
s, b, h, a = 32, 2, 48, 4
cfg = GPTConfig(vocab_size=64, seq_len=s, hidden=h, num_heads=a, num_layers=1,
                dropout=0.1, dtype="bfloat16")
with mp.device() as ctx:
    model = GPT(cfg)
    before = {}  # the ledger's activations when each unit's forward starts
    model.hooks.register("forward_pre", lambda unit: before.__setitem__(
        unit, ctx.ledger.held("activations")))
    model.hooks.register("forward_post", lambda unit: before.__setitem__(
        unit, ctx.ledger.held("activations") - before[unit]))  # now: what the unit saved
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (s, b))
    loss, cache = model.forward(ids, ids)
    block_bytes = before["blocks.0"]  # what block 0 saved for its backward
print(f"block 0 saved {block_bytes:,} bytes; sbh(34 + 5as/h) = "
      f"{s * b * h * (34 + 5 * a * s / h):,.0f}; "
      f"activation_bytes_per_layer = {activation_bytes_per_layer(s, b, h, a):,.0f}")


# %% [markdown]
# ## 3. Activations at scale
#
# Now take the sizes of Llama 3's 8B-class, 70B and 405B models (hidden size, heads,
# layers) in the GPT layer above, for one sequence of 8,192 tokens (b = 1).
#
# The formula stores the attention scores. A modern run does not: FlashAttention (Dao et
# al. 2022) computes attention tile by tile and never writes the s × s matrices to memory.
# It keeps the attention's output (already among the 34) and, per head and token, one
# float32 log-sum-exp of the scores: 4asb bytes. Its backward recomputes the scores tile by
# tile from Q and K, and a dropout on them redraws its mask from the generator's state. So
# with FlashAttention a layer keeps 34sbh + 4asb bytes. Both, for every layer:

# %%
shapes = {"8B": dict(h=4096, a=32, layers=32), "70B": dict(h=8192, a=64, layers=80),
          "405B": dict(h=16384, a=128, layers=126)}
s, b = 8192, 1
print(f"{'':>5}{'scores stored':>16}{'FlashAttention':>17}   GB of activations, all layers")
for name, m in shapes.items():
    stored = activation_bytes_per_layer(s, b, m["h"], m["a"])  # sbh(34 + 5as/h)
    flash = activation_bytes_per_layer(s, b, m["h"], m["a"], recompute="selective") \
        + 4 * m["a"] * s * b  # 34sbh + the float32 log-sum-exp, 4asb
    print(f"{name:>5}{stored * m['layers'] / GB:>16,.1f}{flash * m['layers'] / GB:>17,.1f}")

# %% [markdown]
# At this length the stored scores are most of it: 5as/h = 5·32·8192/4096 = 320 against 34
# for the 8B shape. Figures of hundreds of GB of activations for such a model count
# matrices that FlashAttention never stores; with it, the same layers keep about a tenth.
#
# **Recomputation** trades memory for FLOPs. *Selective* recomputation (Korthikanti et al.)
# drops the s × s tensors and recomputes them in the backward from the saved Q and K:
# 34sbh a layer — what FlashAttention does inside its kernel, so with FlashAttention there
# is nothing left for it to drop. *Full* recomputation keeps only each layer's input,
# 2sbh, through the forward. But its backward reruns one layer's forward, saving all that
# layer saves, before it runs that layer's backward. While that happens the layer's whole
# A_layer is held on top of the other layers' inputs (its own input is part of A_layer):
#
#     peak with full recomputation = 2sbh·(L − 1) + A_layer,   not 2sbh·L
#
# The ledger shows it on a small model of 4 layers, forward then backward:

# %%
cfg = GPTConfig(vocab_size=64, seq_len=32, hidden=48, num_heads=4, num_layers=4,
                dropout=0.1, dtype="bfloat16", recompute="full")
with mp.device() as ctx:
    model = GPT(cfg)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (cfg.seq_len, 2))
    loss, cache = model.forward(ids, ids)
    kept = ctx.ledger.held("activations")  # after the forward: what waits for the backward
    model.backward(cache)
    peak = ctx.ledger.peak("activations")
sbh = cfg.seq_len * 2 * cfg.hidden
layer = activation_bytes_per_layer(cfg.seq_len, 2, cfg.hidden, cfg.num_heads)  # A_layer
inputs = activation_bytes_per_layer(cfg.seq_len, 2, cfg.hidden, cfg.num_heads, "full")
embedding = 2 * 8 * cfg.seq_len * 2 + sbh  # its int64 token ids and positions, its mask
# the head: ln_f's and lm_head's bf16 inputs, the bf16 logits s·b·V·2, a float32
# log-sum-exp per token and the int64 targets
head = cfg.seq_len * 2 * (2 * 2 * cfg.hidden + 2 * cfg.vocab_size + 4 + 8)
print(f"after the forward {kept:,} bytes = 4 inputs of 2sbh {4 * inputs:,.0f} + the "
      f"embedding's {embedding:,} + the head's {head:,}")
print(f"peak in the backward {peak:,} bytes = 2sbh·(L − 1) {3 * inputs:,.0f} + A_layer "
      f"{layer:,.0f} + the embedding's {embedding:,}")

# %% [markdown]
# At scale the recomputed layer is most of the peak, unless FlashAttention keeps it small:

# %%
for name, m in shapes.items():
    L = m["layers"]
    inputs = activation_bytes_per_layer(s, b, m["h"], m["a"], recompute="full")  # 2sbh
    stored = activation_bytes_per_layer(s, b, m["h"], m["a"])
    flash = activation_bytes_per_layer(s, b, m["h"], m["a"], "selective") + 4 * m["a"] * s * b
    print(f"{name:>5}: full recomputation keeps {L * inputs / GB:5.1f} GB of inputs; its peak "
          f"is {((L - 1) * inputs + stored) / GB:5.1f} GB with stored scores, "
          f"{((L - 1) * inputs + flash) / GB:5.1f} GB with FlashAttention")

# %%
# The 8B shape's activations, all 32 layers, from 1k to 128k tokens (the tables above are
# its 8,192-token column): stored scores grow as s², the rest as s
lengths, m8 = [2**k for k in range(10, 18)], shapes["8B"]
kept8 = {"scores stored": [activation_bytes_per_layer(n, 1, m8["h"], m8["a"]) * m8["layers"]
                           for n in lengths],
         "FlashAttention": [(activation_bytes_per_layer(n, 1, m8["h"], m8["a"], "selective")
                             + 4 * m8["a"] * n) * m8["layers"] for n in lengths],
         "full recomputation's peak, FlashAttention": [
             activation_bytes_per_layer(n, 1, m8["h"], m8["a"], "full") * (m8["layers"] - 1)
             + activation_bytes_per_layer(n, 1, m8["h"], m8["a"], "selective")
             + 4 * m8["a"] * n for n in lengths]}
figures.lines("00_activations", "Activations of the 8B shape (32 layers, b = 1) against s",
              lengths, {k: [v / GB for v in vs] for k, vs in kept8.items()},
              xlabel="sequence length s (tokens)", ylabel="GB of activations", logx=True,
              logy=True, hline=(80, "an H100's 80 GB"))

# %% [markdown]
# **The logits** are not in any layer's count. The head turns each of the s·b tokens into
# V scores, and training codes often compute the loss from float32 logits: s·b·V·4 bytes,
# held until the backward. (minipar's head keeps them in the model's dtype, s·b·V·2 in
# bf16.) With Llama 3's vocabulary:

# %%
V = 128_256
logits = s * b * V * 4  # float32 logits: s·b·V·4 bytes
one_layer = activation_bytes_per_layer(s, b, 4096, 32, recompute="selective")  # 34sbh
print(f"float32 logits of {s:,} tokens over a vocabulary of {V:,}: {logits / GB:.2f} GB, as "
      f"much as {logits / one_layer:.1f} layers of 34sbh at h = 4096")

# %% [markdown]
# Recomputation does not shrink them (they are the head's), and the gradient of the loss
# with respect to them is as large again unless it is written in place. Losses computed
# over chunks of the tokens avoid holding them whole.
#
# Tensor parallelism together with sequence parallelism (lesson 04) divides a layer's
# activations by the tensor-parallel size.
#
# ## 4. A training step under a budget
#
# **Exercise 0.4** is a design problem: there is no formula to copy, and more than one
# answer. The model is a small GPT, `GPTConfig(vocab_size=128, seq_len=s, hidden=64,
# num_heads=4, num_layers=4, dtype="bfloat16")`, trained with AdamW in mixed precision on
# 4 GPUs in data parallel, with a global batch of 16 sequences per optimizer step. Each GPU
# has **3 MB** (3,000,000 bytes: a toy GPU for a toy model), and recomputation may add at
# most **10 %** to a step's FLOPs. For each sequence length s in 32, 64 and 128, choose:
#
# - `zero`: 0 (DDP), 1, 2 or 3 (ZeRO-1/2/3);
# - `recompute`: "none", "selective" or "full";
# - `micro_batch`: sequences a GPU runs through one forward and backward, and
#   `accumulation`: micro-batches whose gradients are summed before the step.
#
# The grader runs one step of your plan on 4 simulated GPUs and checks, in this order:
#
# 1. it still trains on the global batch: its gradient equals one device's over all 16
#    sequences (a float64 twin of the same plan, on sequences of 8 tokens);
# 2. its FLOPs, counted by the simulated devices, are at most 1.1 × those of the same step
#    without recomputation;
# 3. every GPU's ledger, from the start of the step, peaks within 3,000,000 bytes.
#
# The formulas of exercises 0.1 and 0.2 give a first estimate. The ledger also counts what
# they leave out: the head and its logits, gradients kept whole while micro-batches
# accumulate, communication buffers, ZeRO-3's gathered weights. So measure. This is how:
# DDP with no recomputation at s = 32, one micro-batch of 4 sequences per GPU:

# %%
design = GPTConfig(vocab_size=128, seq_len=32, hidden=64, num_heads=4, num_layers=4,
                   dtype="bfloat16")
GPUS, GLOBAL_BATCH, BUDGET = 4, 16, 3_000_000
batch = np.random.default_rng(2).integers(0, design.vocab_size,
                                          (design.seq_len, GLOBAL_BATCH))  # [s, B]
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "comm_buffers")


def ddp_step(ctx):
    run = parallelize(design, ParallelDims(dp_replicate=GPUS), zero=0, lr=1e-3)
    ctx.ledger.reset_peak()  # the budget counts from the start of the step
    run.train_step(batch, np.roll(batch, -1, axis=0), micro_batches=1)
    return ctx.ledger.peak(), {c: ctx.ledger.peak(c) for c in CATEGORIES}


peak, parts = mp.launch(ddp_step, GPUS)[0]
states = model_state_bytes(design.num_parameters(), stage=0, dp=GPUS)["total"]
print(f"DDP, s = 32: the ledger peaks at {peak:,} bytes, {peak - BUDGET:,} over the budget")
print("  each category's own peak: " + ", ".join(f"{c} {parts[c]:,}" for c in CATEGORIES))
print(f"  16Ψ alone is {states:,.0f} bytes: DDP cannot fit, whatever the activations")

# %% [markdown]
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 00`. The grader compares your functions with
# minipar's own over many sizes and says which case fails first.
#
# - **Exercise 0.1** — `model_state_bytes_per_gpu(psi, stage, n)`: bytes of weights,
#   gradients and Adam states one GPU holds under DDP (stage 0) and ZeRO-1/2/3, with
#   bf16 weights and gradients and fp32 master, m and v (section 1).
# - **Exercise 0.2** — `activation_bytes(s, b, h, a, layers, recompute)`: bytes of
#   activations a whole model keeps for its backward, scores stored, for "none",
#   "selective" and "full" recomputation (sections 2 and 3).
# - **Exercise 0.3** — `min_gpus(psi, stage, gpu_bytes)`: the smallest number of GPUs on
#   which the model states fit at a stage (None when no number does).
# - **Exercise 0.4** — `plan_step(seq_len)`: a plan (ZeRO stage, recomputation,
#   micro-batch, accumulation) that trains the model of section 4 on the global batch
#   within 3 MB a GPU and 10 % of extra FLOPs, graded on simulated GPUs.
#
# ## Summary
#
# - Mixed-precision Adam costs 16 bytes a parameter: 2 (bf16 weights) + 2 (bf16
#   gradients) + 12 (fp32 master, m, v). A 7B model needs 112 GB before any activation.
#   Megatron keeps float32 gradients: 18 bytes, or 6 + 12/d with its distributed optimizer.
# - DDP replicates all 16; ZeRO shards 12, then 14, then all 16 of them over N ranks.
# - Activations per layer are sbh(34 + 5as/h) bytes with the attention scores stored:
#   linear in the batch, quadratic in the sequence, independent of the parameter count.
#   FlashAttention never stores the scores: 34sbh + 4asb.
# - Full recomputation keeps 2sbh a layer but peaks at 2sbh·(L − 1) + A_layer, one layer
#   recomputed; the float32 logits, s·b·V·4 bytes, come on top of every layer.
# - Recomputation and tensor/sequence parallelism are the levers on activations, sharding
#   the lever on model states, micro-batches with accumulation the lever on the batch a
#   GPU holds at once — and the ledger, not a formula, says whether a plan fits.
