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
# Why one GPU cannot train a large model: count the bytes of weights, gradients, optimizer states and activations.
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
from minipar.plan import (activation_bytes_per_layer, format_memory_report, memory_report,
                          model_state_bytes, zero_figure1)

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
# attention matrix, s × s per head — quadratic in the sequence.
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
# For Llama-like shapes, one sequence of 8,192 tokens (b = 1), every layer:

# %%
shapes = {"7B": dict(h=4096, a=32, layers=32), "70B": dict(h=8192, a=64, layers=80),
          "405B": dict(h=16384, a=128, layers=126)}
s, b = 8192, 1
for name, m in shapes.items():
    per_layer = activation_bytes_per_layer(s, b, m["h"], m["a"])
    selective = activation_bytes_per_layer(s, b, m["h"], m["a"], recompute="selective")
    print(f"{name:>5}: {per_layer * m['layers'] / GB:8.1f} GB of activations "
          f"({selective * m['layers'] / GB:6.1f} GB with selective recomputation, "
          f"{activation_bytes_per_layer(s, b, m['h'], m['a'], recompute='full') * m['layers'] / GB:5.1f}"
          f" GB with full)")

# %% [markdown]
# The attention matrices dominate at this length: 5as/h = 5·32·8192/4096 = 320 against
# 34 for the 7B shape. Recomputation trades them back for FLOPs (selective recomputation
# re-runs only the attention core; full recomputation re-runs the whole layer and keeps
# only its input, 2sbh). Tensor and sequence parallelism (lesson 04) divide what remains
# by the tensor-parallel size.
#
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 00`. The grader compares your functions with
# minipar's own over many sizes and says which case fails first.
#
# - **Exercise 0.1** — `model_state_bytes_per_gpu(psi, stage, n)`: bytes of weights,
#   gradients and Adam states one GPU holds under DDP (stage 0) and ZeRO-1/2/3, with
#   bf16 weights and gradients and fp32 master, m and v.
# - **Exercise 0.2** — `activation_bytes(s, b, h, a, layers, recompute)`: bytes of
#   activations a whole model keeps, for "none", "selective" and "full" recomputation.
# - **Exercise 0.3** — `min_gpus(psi, stage, gpu_bytes)`: the smallest number of GPUs on
#   which the model states fit at a stage (None when no number does).
#
# ## Summary
#
# - Mixed-precision Adam costs 16 bytes a parameter: 2 (bf16 weights) + 2 (bf16
#   gradients) + 12 (fp32 master, m, v). A 7B model needs 112 GB before any activation.
# - DDP replicates all 16; ZeRO shards 12, then 14, then all 16 of them over N ranks.
# - Activations per layer are sbh(34 + 5as/h) bytes: linear in the batch, quadratic in the
#   sequence through the attention matrix, and independent of the parameter count.
# - Recomputation and tensor/sequence parallelism are the levers on activations; sharding
#   is the lever on model states.
