# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 04 — Tensor and sequence parallelism
#
# Split every weight matrix across one node's GPUs (Megatron-LM), the activations between the blocks along the sequence, and choose a layout within a memory and a time budget.
#
# Data parallelism, with or without ZeRO (lesson 03), splits the *batch*: every rank still
# runs whole layers on its own sequences. When a layer's weights, or the activations of a
# single sequence, no longer fit one GPU, the layer itself has to be split. Tensor
# parallelism (Shoeybi et al. 2019, "Megatron-LM", section 3) gives each of t ranks 1/t of
# every weight matrix; all t ranks work on the *same* tokens and exchange partial results
# inside every layer. In the kitchen picture, data parallelism opens more kitchens; tensor
# parallelism puts t cooks around one pan too large for any of them, and they pass food to
# each other at every step of the recipe.
#
# Everything below runs on simulated devices in float64, so that a difference from one
# device can only be rounding. The parallel layers are minipar's own (`minipar/parallel/tp/`,
# described in `docs/tensor_parallel.md`); the exercises ask you to write their core.
#
# To see it: `minipar demo`'s **architecture** mode (`demo.html#architecture`) lights a
# GPU's tp group inside its node, and its **data** mode (`demo.html#data`) counts the tp
# all-gathers and reduce-scatters inside every forward and backward (docs/demo.md).

# %%
from collections import Counter

import numpy as np

import minipar as mp
from minipar.programs.incidents import tp_across_nodes
from minipar.nn import Block, Embedding, GPTConfig, Linear
from minipar.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward
from minipar.nn.gelu import gelu_backward, gelu_forward
from minipar.nn.linear import linear_backward_input, linear_forward
from minipar.parallel.tp.mappings import MAPPINGS
from minipar.parallel.tp.random import TensorParallelRNG
from minipar.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear, gather_parameter
from minipar.parallel.tp.block import ParallelTransformerLayer
from minipar.parallel.tp.vocab import (VocabParallelEmbedding, vocab_parallel_cross_entropy,
                                    vocab_parallel_cross_entropy_backward)
from minipar.parallel import ParallelDims, parallelize
from minipar.plan import activation_bytes_per_layer
from minipar.viz import figures

GB = 1e9
worst = lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max())  # max |a - b|

# %% [markdown]
# ## 1. Splitting an MLP: one all-reduce
#
# A transformer layer's MLP is Y = GeLU(X A) B, with X: [s, b, h], A: [h, f] and B: [f, h]
# (f = 4h). Cut A into t blocks of columns, A = [A_1 … A_t], and B into the matching blocks
# of rows:
#
#     Y = GeLU(X [A_1 … A_t]) [B_1; …; B_t] = [GeLU(X A_1) … GeLU(X A_t)] [B_1; …; B_t]
#       = Σ_r GeLU(X A_r) B_r
#
# The second step holds because GeLU acts on each element alone. Rank r holds A_r and B_r
# and computes the r-th term of the sum from the whole X with no communication at all;
# **one all-reduce** adds the t terms. Splitting A by columns makes a *column-parallel*
# linear layer (each rank owns f/t of its outputs), splitting B by rows a *row-parallel*
# one (each rank owns f/t of its inputs). The pairing matters: a column-parallel layer on
# its own ends with t slices of its output, which would have to be concatenated (an
# all-gather), not summed. Diagrams that draw an all-reduce right after the first, column-
# split matrix have the two steps mixed up.
#
# minipar stores a weight as PyTorch does, W: [out, in] with y = x W^T, so Megatron's
# column split of A is a split of `fc1.weight` along dim 0, and the row split of B a split
# of `fc2.weight` along dim 1. Each shard is a slice of the *full* initialisation: the layer
# draws the whole matrix from (seed, name), exactly as the single-device `Linear` does, and
# keeps its slice (Megatron's `_initialize_affine_weight_cpu`). The split model therefore
# starts from the single-device weights, and the two can be compared number by number.

# %%
h, f, s, b, t = 4, 8, 3, 2, 2
rng = np.random.default_rng(0)
x = rng.standard_normal((s, b, h))  # X: [s, b, h]
dy = rng.standard_normal((s, b, h))  # dL/dY, for the backward in section 2
fc2_bias = np.array([0.1, 0.2, 0.3, 0.4])
with mp.device():  # one device: the reference
    fc1, fc2 = Linear("fc1", h, f, std=0.5), Linear("fc2", f, h, std=0.5)
    fc2.bias.set_data(fc2_bias)
    u, s_fc1 = fc1.forward(x)
    g_out, s_gelu = gelu_forward(u)
    y_one, s_fc2 = fc2.forward(g_out)  # Y: [s, b, h]
    dx_one = fc1.backward(gelu_backward(fc2.backward(dy, s_fc2), s_gelu), s_fc1)
    W1, W2 = fc1.weight.data, fc2.weight.data  # [f, h] and [h, f]
    dW1, dW2, db2 = fc1.weight.grad, fc2.weight.grad, fc2.bias.grad


def mlp_program(ctx):
    tp = mp.new_group(range(t), "tp")
    fc1 = ColumnParallelLinear("fc1", h, f, tp, std=0.5)  # W1_r: [f/t, h]
    fc2 = RowParallelLinear("fc2", f, h, tp, std=0.5)  # W2_r: [h, f/t]
    fc2.bias.set_data(fc2_bias)
    # forward
    (u_r, _), s1 = fc1.forward(x)  # u_r: [s, b, f/t]; f is the identity here
    g_r, s_act = gelu_forward(u_r)  # no communication: GeLU is elementwise
    term, _ = linear_forward(g_r, fc2.weight.data)  # rank r's term GeLU(X A_r) B_r: [s, b, h]
    (y, _), s2 = fc2.forward(g_r)  # g: all-reduce the terms, then add the bias once
    forward_comm = [e.name for e in ctx.trace.of(stream="comm")]
    # backward (section 2)
    start = len(ctx.trace.events)
    du_r = gelu_backward(fc2.backward(dy, s2), s_act)  # du_r: [s, b, f/t]; g': identity
    dx_partial = linear_backward_input(du_r, fc1.weight.data)  # dX_r = dU_r W1_r: [s, b, h]
    dx = fc1.backward(du_r, s1)  # f': all-reduce of the dX_r
    backward_comm = [e.name for e in ctx.trace.events[start:] if e.stream == "comm"]
    return dict(w1=fc1.weight.data, w2=fc2.weight.data, term=term, y=y,
                forward_comm=forward_comm, dx_partial=dx_partial, dx=dx,
                backward_comm=backward_comm, dW1=gather_parameter(fc1.weight, tp, grad=True),
                dW2=gather_parameter(fc2.weight, tp, grad=True), db2=fc2.bias.grad)


mlp = mp.launch(mlp_program, t)
for r, out in enumerate(mlp):
    part = slice(r * f // t, (r + 1) * f // t)  # rank r's f/t hidden units
    print(f"rank {r}: W1_r {out['w1'].shape} is W1[{part.start}:{part.stop}, :]: "
          f"{np.array_equal(out['w1'], W1[part])};  W2_r {out['w2'].shape} is "
          f"W2[:, {part.start}:{part.stop}]: {np.array_equal(out['w2'], W2[:, part])}")
    print(f"        its term alone differs from Y by up to {worst(out['term'], y_one):.3f}; "
          f"after the all-reduce and the bias, by {worst(out['y'], y_one):.1e}; "
          f"collectives: {out['forward_comm']}")
print(f"term_0 + term_1 + bias against Y: "
      f"{worst(mlp[0]['term'] + mlp[1]['term'] + fc2_bias, y_one):.1e}")

# %% [markdown]
# ## 2. f and g: each collective comes with its conjugate
#
# Follow the block on rank r:
#
#     X → f → column-parallel → GeLU → row-parallel → g → Y
#
# - **g** sums the t partial products: an all-reduce in forward. Its backward is the
#   identity, because the sum passes dY unchanged to every one of its terms.
# - **f** is the identity in forward: every rank reads the same X. Its backward is an
#   all-reduce: X fed t different computations, so dL/dX is the sum of t gradients, each
#   of which only knows the path through one rank's slice.
#
# The forward of one is the backward of the other: f and g are *conjugate*. Megatron calls
# them `copy_to_tensor_model_parallel_region` (f) and
# `reduce_from_tensor_model_parallel_region` (g), and sequence parallelism (section 5)
# brings more such pairs. minipar keeps all seven as `Mapping(forward, backward)` objects.
# Here each half of each one runs on 2 ranks, on the input x_r = 10·r + [0, 1, 2, 3] shaped
# [s=2, b=1, h=2] (values, then the shape each rank gets back):

# %%
def halves_program(ctx):
    tp = mp.new_group(range(2), "tp")
    x_r = 10.0 * ctx.rank + np.arange(4.0).reshape(2, 1, 2)  # x_r: [s=2, b=1, h=2]
    return [(m.forward(x_r, tp), m.backward(x_r, tp)) for m in MAPPINGS]


res = mp.launch(halves_program, 2)
show = lambda a: f"{a.ravel().astype(int).tolist()} {list(a.shape)}"
for i, mapping in enumerate(MAPPINGS):
    print(mapping.name)
    for half, label in enumerate(("forward", "backward")):
        print(f"    {label:<9}" + "    ".join(f"rank {r}: {show(res[r][i][half]):<40}"
                                              for r in range(2)))

# %% [markdown]
# Read the table by pairs: a split's backward is an all-gather and an all-gather's backward
# is a split; an all-reduce pairs with the identity; reduce-scatter pairs with all-gather.
# Each backward is the *adjoint* of its forward, ⟨F(x), y⟩ = ⟨x, B(y)⟩ summed the right
# way over ranks, which is exactly what makes B the gradient of F
# (`tests/parallel/tp/test_mappings.py` checks that identity for all seven). On a group of
# one rank both halves are the identity and no collective is issued.
#
# Now the MLP's backward, from the program of section 1. In minipar's layout the weights
# are W1 = A^T and W2 = B^T, so rank r holds W1_r [f/t, h] and W2_r [h, f/t]. The row-
# parallel layer's input gradient dY W2_r needs no communication (g's backward is the
# identity); the column-parallel layer's dX_r = dU_r W1_r is only rank r's share of dX
# until f's all-reduce. Gathering each rank's weight gradients gives the single-device ones:

# %%
for r, out in enumerate(mlp):
    print(f"rank {r}: dX_r alone differs from dX by up to "
          f"{worst(out['dx_partial'], dx_one):.3f}; after f's all-reduce, by "
          f"{worst(out['dx'], dx_one):.1e}; backward collectives: "
          f"{out['backward_comm']}")
print(f"gathered dW1, dW2 and db2 against one device: {worst(mlp[0]['dW1'], dW1):.1e}, "
      f"{worst(mlp[0]['dW2'], dW2):.1e}, {worst(mlp[0]['db2'], db2):.1e}")

# %% [markdown]
# So the MLP costs one all-reduce of [s, b, h] in forward (g) and one in backward (f).
# Exercises 4.1 and 4.2 ask you to write both layers with their f and g.
#
# ## 3. Attention is split by heads; one layer does four all-reduces
#
# Self-attention is a column-parallel QKV projection, the attention core, and a row-
# parallel output projection. The core needs whole heads: a head's scores mix all d = h/a
# of its features, and distinct heads never meet. So the split is by heads: rank r keeps
# a/t whole heads, each with its q, k and v (each rank keeps a/t heads, not a/t of every
# head's features). minipar orders the QKV outputs [a, 3, d] (head, then q/k/v, then
# feature), so a contiguous block of the rows of W_qkv is exactly a/t heads, and the
# attention core runs on them without any communication.
#
# A whole layer on t = 2 ranks, against the single-device `Block` with the same weights,
# dropout on:

# %%
cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=1,
                dropout=0.1, seed=0)  # float64
s, b, h, a = cfg.seq_len, 2, cfg.hidden, cfg.num_heads
d, t = h // a, 2
rng = np.random.default_rng(1)
x, dy = rng.standard_normal((s, b, h)), rng.standard_normal((s, b, h))
with mp.device():
    block = Block("blocks.0", cfg)
    y_one, saved = block.forward(x, np.random.default_rng(7))
    dx_one = block.backward(dy, saved)
    qkv_one = block.attn.qkv.weight.data  # W_qkv: [3h, h], rows ordered [a, 3, d]
    grads_one = {p.name: p.grad for p in block.parameters()}


def layer_program(ctx, t, sp=False):
    """One ParallelTransformerLayer forward and backward; its collectives per phase."""
    tp = mp.new_group(range(t), "tp")
    r = tp.group_rank(ctx.rank)
    layer = ParallelTransformerLayer("blocks.0", cfg, tp, sp, recompute="none")
    masks = TensorParallelRNG(np.random.default_rng(7), r, t)  # the single device's masks
    x_in, dy_in = (np.split(x, t)[r], np.split(dy, t)[r]) if sp else (x, dy)  # [s/t, b, h]
    marks = [len(ctx.trace.events)]
    y, saved = layer.forward(x_in, masks)
    marks.append(len(ctx.trace.events))
    dx = layer.backward(dy_in, saved)
    partial = {p.name: g.copy() for p, g in layer.sp_grads.pending} if sp else {}
    if sp:
        layer.sp_grads.flush()  # the all-reduce of section 5
    marks.append(len(ctx.trace.events))
    calls = [Counter((e.name, e.nbytes) for e in ctx.trace.events[lo:hi] if e.stream == "comm")
             for lo, hi in zip(marks, marks[1:])]
    grads = {p.name: gather_parameter(p, tp, grad=True) for p in layer.parameters()}
    return dict(y=y, dx=dx, calls=calls, heads=layer.attn.heads, partial=partial,
                qkv=layer.attn.qkv.weight.data, grads=grads)


res = mp.launch(lambda ctx: layer_program(ctx, t), t)
per_head = qkv_one.reshape(a, 3 * d, h)  # W_qkv's rows, head by head
for r, out in enumerate(res):
    mine = list(range(r * out["heads"], (r + 1) * out["heads"]))
    print(f"rank {r}: {out['heads']} heads {mine}; its W_qkv shard {out['qkv'].shape} is "
          f"those heads' q, k, v rows: "
          f"{np.array_equal(out['qkv'], per_head[mine].reshape(-1, h))}")
print(f"output, input gradient, gathered weight gradients against one device: "
      f"{worst(res[0]['y'], y_one):.1e}, {worst(res[0]['dx'], dx_one):.1e}, "
      f"{max(worst(res[0]['grads'][k], g) for k, g in grads_one.items()):.1e}")
S = s * b * h * 8  # bytes of one [s, b, h] float64 tensor
for phase, calls in zip(("forward", "backward"), res[0]["calls"]):
    print(f"{phase:<9}" + ", ".join(f"{name} of {n} bytes x {k}"
                                    for (name, n), k in calls.items())
          + f"   (s·b·h·8 = {S} bytes)")

# %% [markdown]
# Four all-reduces of the whole activation per layer: g after the attention's output
# projection and after fc2 in forward, f before the QKV projection and before fc1 in
# backward. Each sits between two matmuls that need its result, so nothing can run while
# it travels. That is the cost of tensor parallelism, and the reason (section 6) it stays
# on the fastest links there are.
#
# The layer ran with dropout 0.1 and still matched one device: its dropout masks were the
# single device's. Megatron's rule is that dropout in a
# *replicated* region (the residual stream after an all-reduce, identical on every rank)
# must draw the same mask on every rank, and dropout in a *sharded* region (the attention
# probabilities, split by head) must draw a different mask on each. minipar's
# `TensorParallelRNG` keeps both and adds a third property: a sharded mask is the rank's
# slice of the single-device mask (`parallel/tp/random.py`), so equivalence tests can keep
# dropout on.
#
# ## 4. The vocabulary: embedding and cross-entropy without the full logits
#
# The embedding table E: [V, h] and the output layer's W: [V, h] are often the largest
# single matrices of a model (Llama 3's vocabulary has 128,256 entries), and they are split
# along the vocabulary: rank r holds rows [r·V/t, (r+1)·V/t).
#
# **Embedding.** A token whose id is in rank r's range looks its row up; every other token
# gets a zero vector on rank r. Each token is then non-zero on exactly one rank, and g (an
# all-reduce) assembles the lookup:

# %%
V, h, t = 8, 3, 2
ids = np.array([[0, 7], [3, 4], [5, 1]])  # [s=3, b=2]: ids from both ranks' ranges
with mp.device():
    emb_one, _ = Embedding("wte", V, h).forward(ids)  # [s, b, h]


def embedding_program(ctx):
    tp = mp.new_group(range(t), "tp")
    emb = VocabParallelEmbedding("wte", V, h, tp)  # E_r: rows [lo, hi) of E
    looked_up = ids[(ids >= emb.lo) & (ids < emb.hi)].tolist()  # the tokens it supplies
    y, _ = emb.forward(ids)  # masked lookup, then g
    return (emb.lo, emb.hi), looked_up, y


for r, ((lo, hi), looked_up, y) in enumerate(mp.launch(embedding_program, t)):
    print(f"rank {r}: rows [{lo}, {hi}) of E, looks up tokens {looked_up}; after the "
          f"all-reduce the embedding differs from one device's by {worst(y, emb_one):.1e}")

# %% [markdown]
# **Cross-entropy.** The output layer is column-parallel, so rank r ends with the logits of
# its own V/t words, [s, b, V/t]. Gathering the full [s, b, V] logits would move and hold
# the largest activation of the model. The loss only needs three numbers a token, and each
# comes from one all-reduce of [s, b]:
#
#     m     = all_reduce_max( max over this rank's words of logits_r )     the global max
#     z_t   = all_reduce_sum( logits_r[target] if rank r holds the target, else 0 )
#     sum_e = all_reduce_sum( Σ over this rank's words of exp(logits_r − m) )
#     loss  = mean over tokens of  m + log(sum_e) − z_t
#
# The gradient, softmax − one-hot, needs nothing more: rank r computes its own slice of it
# from its logits and the all-reduced log-sum-exp, m + log(sum_e). On 4 ranks, from the
# trace:

# %%
s, b, V, t = 4, 2, 16, 4
rng = np.random.default_rng(2)
logits = rng.standard_normal((s, b, V)) * 3  # the full logits, for the reference only
targets = rng.integers(0, V, (s, b))
with mp.device():
    loss_one, saved = cross_entropy_forward(logits, targets)
    dlogits_one = cross_entropy_backward(1.0, saved)  # [s, b, V]


def cross_entropy_program(ctx):
    tp = mp.new_group(range(t), "tp")
    r = tp.group_rank(ctx.rank)
    shard = np.ascontiguousarray(np.split(logits, t, axis=-1)[r])  # logits_r: [s, b, V/t]
    loss, saved = vocab_parallel_cross_entropy(shard, targets, tp)
    forward = [(e.name, e.nbytes) for e in ctx.trace.of(stream="comm")]
    dlogits = vocab_parallel_cross_entropy_backward(1.0, saved)  # [s, b, V/t]
    backward = len(ctx.trace.of(stream="comm")) - len(forward)
    return loss, forward, dlogits, backward


res = mp.launch(cross_entropy_program, t)
loss, forward, _, backward = res[0]
print(f"loss {loss:.12f}, one device {loss_one:.12f}")
print(f"forward collectives: {forward}; backward collectives: {backward}")
slices = np.split(dlogits_one, t, axis=-1)  # one device's gradient, cut by vocabulary
print(f"gradient slices against one device's: "
      f"{max(worst(out[2], slices[r]) for r, out in enumerate(res)):.1e}")
print(f"moved: 3 x {s * b * 8} bytes, where all-gathering the logits would hand every rank "
      f"{s * b * V * 8} bytes")
s_big, V_big, t_big = 8192, 128_256, 8
print(f"at s = {s_big}, b = 1, V = {V_big:,} (fp32 logits), t = {t_big}: 3 all-reduces of "
      f"{s_big * 4 / 1e3:.0f} KB, against {s_big * V_big * 4 / GB:.1f} GB of full logits on "
      f"every rank ({s_big * V_big // t_big * 4 / GB:.2f} GB is its own shard)")

# %% [markdown]
# **Why the global max.** Subtracting m changes nothing in exact arithmetic, since
# log Σ exp(z − m) + m = log Σ exp(z), but it keeps every exponent ≤ 0. Without it, exp
# overflows as soon as one logit passes the log of the largest finite number of its type,
# and it has to be the max over the *whole* vocabulary: each rank's own max differs from
# rank to rank, and a single max over all tokens sends a token whose logits all lie far
# below it to exp = 0 and log 0 = −∞. The same logits shifted by +1000:

# %%
overflow = {np.dtype(d).name: float(np.log(float(np.finfo(d).max)))
            for d in (np.float16, np.float32, np.float64)}
print("exp(z) is inf past z = " + ", ".join(f"{z:.1f} in {name}" for name, z in
                                            overflow.items()) + " (bfloat16: as float32)")
shifted = mp.launch(lambda ctx: vocab_parallel_cross_entropy(
    np.split(logits + 1000, t, axis=-1)[ctx.rank], targets, mp.new_group(range(t)))[0], t)[0]
with np.errstate(over="ignore"):
    unshifted = np.log(np.exp(logits + 1000).sum(axis=-1)).mean()  # no max subtracted
print(f"logits + 1000: the vocab-parallel loss {shifted:.12f} (unchanged: {loss:.12f}); "
      f"log Σ exp without the max: {unshifted}")

# %% [markdown]
# Exercise 4.3 asks you to write this loss; the grader watches the trace and accepts only
# all-reduces of one number a token, and feeds it logits near ±1000.
#
# ## 5. Sequence parallelism
#
# Between the two blocks, tensor parallelism leaves the residual stream [s, b, h] whole on
# every rank: the two LayerNorms, the dropouts and the residual adds run t times on
# identical data, and what they save for backward (10·s·b·h bytes a layer in bf16: the
# LayerNorm inputs, the QKV and fc1 inputs, the dropout masks) is not divided by t at all.
# Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", section 4.2.2) splits that stream along the sequence: rank r keeps
# tokens [r·s/t, (r+1)·s/t).
#
# LayerNorm normalises each token over its own h features, and dropout and the residual add
# act element by element, so none of them needs to talk to another rank. (Sequence
# parallelism does *not* all-reduce the LayerNorm across GPUs; only its parameters'
# gradients need a reduction, shown below.) Only the block boundaries change:
#
#     x_r [s/t, b, h] ─ LayerNorm ─ f̄ ─► column-parallel ─ … ─ row-parallel ─ ḡ ─ dropout ─ + x_r
#
#     f̄: all-gather along s in forward, reduce-scatter along s in backward
#     ḡ: reduce-scatter along s in forward, all-gather along s in backward
#
# An all-reduce is a reduce-scatter followed by an all-gather, so the forward moves the
# same bytes as before, in two halves placed around the blocks. The same layer as in
# section 3, now with `sequence_parallel=True` and each rank holding half the sequence:

# %%
s, b, h, t = cfg.seq_len, 2, cfg.hidden, 2
res = mp.launch(lambda ctx: layer_program(ctx, t, sp=True), t)
y_parts, dx_parts = np.split(y_one, t), np.split(dx_one, t)  # one device's, cut along s
print(f"rank r's output and input gradient against one device's rows r·s/t..(r+1)·s/t: "
      f"{max(worst(out['y'], y_parts[r]) for r, out in enumerate(res)):.1e}, "
      f"{max(worst(out['dx'], dx_parts[r]) for r, out in enumerate(res)):.1e}")
S = s * b * h * 8
for phase, calls in zip(("forward", "backward"), res[0]["calls"]):
    print(f"{phase:<9}" + ", ".join(f"{name} of {n} bytes x {k}"
                                    for (name, n), k in sorted(calls.items()))
          + f"   (s·b·h·8 = {S}, 6·h·8 = {6 * h * 8} bytes)")

# %% [markdown]
# The forward trades the two all-reduces for two all-gathers and two reduce-scatters (the
# trace counts the bytes of the whole [s, b, h] tensor for each). The backward runs the
# conjugates, plus two more all-gathers: each column-parallel layer saved only its
# sequence shard of its input and gathers it again to form its weight gradient, which is
# what lets that input's memory be divided by t too. And one small all-reduce of
# 6h numbers remains: the gradients of the parameters that every rank holds whole but now
# applies to only s/t of the tokens, both LayerNorms' γ and β and the two row-parallel
# biases. Each rank's gradient is a partial sum over its own tokens:
#
#     dγ = Σ over all tokens of dy·x̂ = Σ_r (Σ over rank r's tokens of dy·x̂)  → all-reduce
#
# Here is what each rank held before that all-reduce (`SequenceParallelGrads.flush()`), for
# the first LayerNorm:

# %%
name = "blocks.0.ln1.weight"
partials = [out["partial"][name] for out in res]
for r, p in enumerate(partials):
    print(f"rank {r}: its own dγ differs from one device's by up to "
          f"{worst(p, grads_one[name]):.3f}")
print(f"the ranks' two dγ differ from each other by up to "
      f"{worst(partials[0], partials[1]):.3f}; their sum against one device: "
      f"{worst(sum(partials), grads_one[name]):.1e}; after the "
      f"all-reduce: {worst(res[0]['grads'][name], grads_one[name]):.1e}")

# %% [markdown]
# Leave that all-reduce out and nothing crashes, and the loss is still right: the ranks
# simply apply different updates to what should be one LayerNorm, and the "same" parameter
# drifts apart across the tensor-parallel group from the first step on
# (`tests/parallel/tp/test_sequence_parallel.py` removes it and watches the equivalence with
# one device fail). Megatron tags these parameters `sequence_parallel = True` and
# all-reduces their gradients after the backward. Exercise 4.4 is this LayerNorm backward.
#
# **What it buys: activation memory.** Korthikanti et al.'s Table 2 gives the bytes one
# layer keeps for backward, per rank (2-byte activations, 1-byte dropout masks):
#
# | | per layer and rank |
# | --- | --- |
# | one device | sbh (34 + 5as/h) |
# | tensor parallel | sbh (10 + 24/t + 5as/(ht)) |
# | tensor + sequence parallel | sbh (34/t + 5as/(ht)) |
#
# The 24 (Q, K, V, the projection input, the GeLU input and the fc2 input) and the
# attention matrices were already split by tensor parallelism; sequence parallelism divides
# the remaining 10. The ledger of a bf16 layer with dropout, on 4 ranks, against the formula:

# %%
cfg16 = GPTConfig(vocab_size=16, seq_len=16, hidden=32, num_heads=4, num_layers=1,
                  dropout=0.1, dtype="bfloat16")
s, b, h, a, t = cfg16.seq_len, 2, cfg16.hidden, cfg16.num_heads, 4
x16 = np.random.default_rng(3).standard_normal((s, b, h)).astype(cfg16.np_dtype)
with mp.device() as ctx:
    before = ctx.ledger.held("activations")
    Block("blocks.0", cfg16).forward(x16, np.random.default_rng(0))
    kept = {"one device": (ctx.ledger.held("activations") - before, 1, False)}


def kept_program(ctx, sp):
    tp = mp.new_group(range(t), "tp")
    layer = ParallelTransformerLayer("blocks.0", cfg16, tp, sp, recompute="none")
    x_in = np.split(x16, t)[tp.group_rank(ctx.rank)] if sp else x16
    before = ctx.ledger.held("activations")
    layer.forward(x_in, TensorParallelRNG(np.random.default_rng(0), ctx.rank, t))
    return ctx.ledger.held("activations") - before


for label, sp in (("tensor parallel", False), ("tensor + sequence", True)):
    kept[label] = (mp.launch(lambda ctx: kept_program(ctx, sp), t)[0], t, sp)
for label, (nbytes, tp_size, sp) in kept.items():
    formula = activation_bytes_per_layer(s, b, h, a, tp=tp_size, sequence_parallel=sp)
    print(f"{label:<18} t={tp_size}: the ledger {nbytes:>7,} bytes, Table 2 {formula:>9,.0f}")

# %% [markdown]
# And at the scale where it matters, a 70B-like layer (h = 8192, a = 64, s = 4096, b = 1,
# 80 layers) on t = 8:

# %%
s, b, h, a, layers, t = 4096, 1, 8192, 64, 80, 8
rows = [("one device", 1, False, "none"), ("tensor parallel", t, False, "none"),
        ("tensor + sequence", t, True, "none"),
        ("t + s, selective recomputation", t, True, "selective")]
for label, tp_size, sp, recompute in rows:
    per_layer = activation_bytes_per_layer(s, b, h, a, recompute, tp=tp_size,
                                           sequence_parallel=sp)
    print(f"{label:<31} {per_layer / GB:6.2f} GB a layer, {layers * per_layer / GB:7.1f} GB "
          f"for {layers} layers, per GPU")
print(f"(in the tensor-parallel row, 10·sbh = {10 * s * b * h / GB:.2f} GB a layer, "
      f"{10 * s * b * h * layers / GB:.1f} GB in all, is the same on every GPU)")

# %%
figures.bars("04_activations", f"Activations per GPU of a 70B-like model ({layers} layers, "
             f"s = {s:,}), t = {t}", [label for label, *_ in rows],
             {"GB per GPU": [layers * activation_bytes_per_layer(
                 s, b, h, a, recompute, tp=tp_size, sequence_parallel=sp) / GB
                 for _, tp_size, sp, recompute in rows]},
             ylabel="GB of activations per GPU", annotate="{:,.1f}",
             hline=(80, "an H100's 80 GB"))

# %% [markdown]
# Tensor parallelism alone leaves the 10·sbh between the blocks whole on every GPU; with
# sequence parallelism every term divides by t, and with selective recomputation of the
# attention core on top (lesson 00), only 34·sbh/t a layer remains.
#
# **One name, three techniques.** "Sequence parallelism" names three different things, and
# papers, frameworks and interviews use it for each:
#
# - **Megatron-LM's sequence parallelism** (Korthikanti et al. 2022), this section: inside a
#   tensor-parallel group, only the regions tensor parallelism left whole (LayerNorm,
#   dropout, the residual stream) are split along s. Attention still sees the whole
#   sequence: f̄ gathers it before the QKV projection, and the heads are split as in
#   section 3. It divides activation memory by t, not the attention's s² cost.
# - **DeepSpeed-Ulysses** (Jacobs et al. 2023): every rank keeps s/t of the tokens and the
#   layer's whole weights (no tensor parallelism; ZeRO may shard them); an all-to-all before
#   attention turns the split by sequence into a split by heads, [s/t, b, a, d] →
#   [s, b, a/t, d], and another turns it back after. It needs a divisible by t.
# - **Ring self-attention** (Li et al. 2021) and **ring attention** (Liu et al. 2023): every
#   rank keeps s/t of the queries, keys and values, and the key/value blocks travel around
#   a ring of the t ranks in t − 1 steps while each rank accumulates its queries'
#   attention block by block; no rank ever holds the whole sequence. This is what
#   Megatron-LM now calls *context* parallelism, and what lesson 09 (context parallelism,
#   to come) builds.
#
# What each sends per rank for one attention block's forward, on t = 4 ranks, with S the
# bytes of the whole [s, b, h] activation (from the trace: the collectives and sends each
# technique issues, on data of the right shapes):

# %%
s, b, h, a, t = 16, 2, 32, 8, 4
d = h // a


def three_meanings_program(ctx):
    g = mp.new_group(range(t), "sp")
    r = g.group_rank(ctx.rank)
    x_r = np.full((s // t, b, h), float(r))  # this rank's tokens: [s/t, b, h]
    sent, held = {}, {}
    start = ctx.trace.bytes_sent()
    whole = mp.all_gather(x_r, axis=0, group=g)  # f̄ before the QKV projection: [s, b, h]
    mp.reduce_scatter(whole, axis=0, group=g)  # ḡ after the output projection: [s/t, b, h]
    sent["Megatron-LM SP"] = ctx.trace.bytes_sent() - start
    held["Megatron-LM SP"] = f"[s, b, h] {whole.shape}: every token, heads split by TP"
    start = ctx.trace.bytes_sent()
    by_tokens = x_r.reshape(s // t, b, a, d)  # [s/t, b, a, d]
    for _ in ("q", "k", "v"):  # sequence split -> head split
        by_heads = np.concatenate(mp.all_to_all(np.split(by_tokens, t, axis=2), group=g),
                                  axis=0)  # [s, b, a/t, d]
    back = np.concatenate(mp.all_to_all(np.split(by_heads, t, axis=0), group=g), axis=2)
    assert back.shape == by_tokens.shape  # the attention output, by tokens again
    sent["DeepSpeed-Ulysses"] = ctx.trace.bytes_sent() - start
    held["DeepSpeed-Ulysses"] = f"[s, b, a/t, d] {by_heads.shape}: every token, a/t heads"
    start = ctx.trace.bytes_sent()
    kv = np.stack([x_r, x_r])  # this rank's keys and values: [2, s/t, b, h]
    for _ in range(t - 1):  # pass the block on, receive the previous rank's
        work = mp.isend(kv, g.ranks[(r + 1) % t], group=g)
        kv = mp.recv(g.ranks[(r - 1) % t], group=g)
        work.wait()
    sent["ring attention"] = ctx.trace.bytes_sent() - start
    held["ring attention"] = f"[s/t, b, h] {x_r.shape}: s/t of the queries, all heads"
    return sent, held


S = s * b * h * 8
sent, held = mp.launch(three_meanings_program, t)[0]
for name in sent:
    print(f"{name:<18} sends {sent[name]:>6,.0f} bytes = {sent[name] / S:.2f} S; attention "
          f"sees {held[name]}")

# %% [markdown]
# Megatron's all-gather and reduce-scatter move (t − 1)/t · S each, which is exactly the
# all-reduce they replace; Ulysses' four all-to-alls move (t − 1)/t · S/t each, a volume
# that shrinks as t grows; the ring sends the keys and values of s/t tokens t − 1 times,
# overlappable with the blocks of attention it computes meanwhile. Megatron's kind lives
# inside tensor parallelism and needs its weight split; the other two split a layer's
# tokens without splitting its weights, and only the ring never gathers a whole sequence.
#
# ## 6. Incident A: tensor parallelism across nodes
#
# Four all-reduces of s·b·h a layer, on the critical path, are affordable on NVLink inside
# a node. Across nodes the same bytes cross InfiniBand, which gives each GPU a fraction of
# the bandwidth. First the mechanism: on 2 nodes of 4 A100s, the same 2 MiB all-reduce (an
# [s, b, h] activation in bf16) over 4 GPUs of one node, over 4 GPUs spread across both
# nodes, and over all 8; timed by the cost model's choice of algorithm ("auto": here a
# hierarchical all-reduce once a group spans nodes) and as one flat ring:

# %%
cluster = tp_across_nodes.CLUSTER  # 2 nodes x 4 A100, NVLink 3 inside, InfiniBand HDR across
print(f"{cluster.describe()}: {cluster.intra.bandwidth / cluster.inter.bandwidth:.0f}x "
      f"the bandwidth inside a node")
activation = np.ones((1024, 1, 1024), dtype=cfg16.np_dtype)  # [s, b, h] in bf16: 2 MiB


def placement_program(ctx):
    in_node = mp.new_group([q for q in range(8) if q // 4 == ctx.rank // 4], "in node")
    across = mp.new_group([q for q in range(8) if q % 2 == ctx.rank % 2], "across")
    for group in (in_node, across, mp.new_group(range(8), "all 8")):
        mp.all_reduce(activation, group=group)
    return [(e.label, e.group, e.meta["algorithm"], e.duration)
            for e in ctx.trace.of(stream="comm")]


auto = mp.launch(placement_program, 8, topology=cluster)[0]
ring = mp.launch(placement_program, 8, topology=cluster, algorithm="ring")[0]
base = auto[0][3]  # the all-reduce inside one node
for (label, group, algorithm, seconds), (*_, ring_seconds) in zip(auto, ring):
    print(f"  {label:<8} {str(list(group)):<25} {algorithm:<13}{seconds * 1e6:6.1f} us "
          f"({seconds / base:4.1f}x)   flat ring {ring_seconds * 1e6:6.1f} us "
          f"({ring_seconds / base:4.1f}x)")

# %%
figures.bars("04_placement", "A 2 MiB all-reduce on 2 nodes of 4 A100s, by where its GPUs are",
             [f"{label} ({algorithm})" for label, _, algorithm, _ in auto],
             {"the cost model's choice": [seconds * 1e6 for *_, seconds in auto],
              "a flat ring": [seconds * 1e6 for *_, seconds in ring]},
             ylabel="µs", annotate="{:.0f}")

# %% [markdown]
# A ring is as slow as the slowest link it crosses; a hierarchical all-reduce (reduce-
# scatter inside each node, all-reduce of a 1/m share across nodes, all-gather inside)
# softens the penalty but cannot remove it.
#
# The case behind this incident: a team trains a 70B model on 32 nodes of 8 GPUs with
# TP = 16, so every tensor-parallel group takes 4 GPUs from each of several nodes and every
# layer's all-reduces cross InfiniBand. MFU sits at 35 %, and once the fabric saturates,
# some steps run 8–10× slower. The fix is TP = 8 inside each node, with PP = 4 and DP = 8
# across nodes (8 × 4 × 8 = 256 GPUs): MFU goes back up to 48 %.
#
# `minipar incident a` reproduces it with one training step of a GPT in three layouts on
# the cluster above: tp over all 8 GPUs, tp = 4 placed across the nodes, and tp = 4 inside
# each node with data parallelism across. Here with a smaller model than the command's, to
# keep this lesson quick (the model is tiny, so every layout is latency-bound: compare the
# ratios, not the MFU):

# %%
small = GPTConfig(vocab_size=64, seq_len=64, hidden=64, num_heads=8, num_layers=1,
                  dropout=0.0, dtype="bfloat16", seed=0)
incident = tp_across_nodes.run(cfg=small, global_batch=4)
across, fix = incident["layouts"]["tp_across"], incident["layouts"]["tp_in_node"]
print(f"placement alone (tp = 4 either way): the TP all-reduces take "
      f"{across['tp_comm_seconds'] / fix['tp_comm_seconds']:.1f}x as long, the step "
      f"{across['vs_fix']:.2f}x")

# %% [markdown]
# Placement alone is enough to hurt: the middle row uses the same tp = 4 as the fix, only
# on the wrong GPUs (last line). The analytical lines at 70B scale show where the case's
# large factors come from: the same all-reduce takes several times (hierarchical) to more
# than ten times (flat ring) as long across nodes, and at TP = 16 across nodes the
# communication outweighs the layer's compute. The rule: **fix tp to the GPUs of one node**
# (8 on DGX-class machines), and put pipeline and data parallelism, which communicate once
# per micro-batch or once per step, across nodes.
#
# ## 7. A design exercise: a layout within two budgets
#
# Sections 1–6 are choices with prices: tensor parallelism divides the weights and most
# activations by t and pays four all-reduces a layer; sequence parallelism divides the
# rest and pays re-gathers in backward; recomputation (lesson 00) trades FLOPs for
# activations and, when it is full, repeats the forward's collectives; and every one of
# these collectives is cheap inside a node and dear across nodes. Exercise 4.5 asks you
# to choose, and grades the choice the way LLM-Training-Puzzles grades its puzzles: by
# running it. The grader trains your layout for two AdamW steps on the simulated cluster
# and reads the ledger and the clock.
#
# The puzzle: the GPT below, 2 sequences of 64 tokens a step, on incident A's cluster
# (2 nodes of 4 A100s). Every GPU trains, and a data-parallel rank trains whole
# sequences. Per GPU and step:
#
# - **activations**: the ledger's peak of the "activations" category during a step, at
#   most **700 kB** (a scaled-down GPU; a real one has ~80 GB for everything);
# - **tensor-parallel communication**: the time a GPU spends in collectives on its
#   tensor-parallel group, from the clock, at most **150 µs**;
# - **correctness**: the two losses equal one device's, training the same model on the
#   same batches.
#
# You return `ParallelDims` (tp, dp_replicate and their order), `sequence_parallel`, and the
# config to train with: `cfg.with_(recompute=...)` may change *how* the model computes its
# gradients, nothing it computes. More than one layout passes, and the grader asks the
# same question of a second cluster and model, so write the reasoning, not one answer.
# Here is a layout that misses, measured as the grader measures it, beside what
# `activation_bytes_per_layer` (section 5's Table 2, for float64) estimates for its layers:

# %%
puzzle = GPTConfig(vocab_size=64, seq_len=64, hidden=64, num_heads=8, num_layers=2,
                   dropout=0.1, seed=0)  # float64
PUZZLE = dict(global_batch=2, activation_budget=700e3, tp_comm_budget=150e-6)
batch = np.random.default_rng(1).integers(0, puzzle.vocab_size, (2, puzzle.seq_len, 2))


def layout_program(ctx, dims, sp):
    """One training step of `dims` on the cluster: peak activations, tp collective time."""
    run = parallelize(puzzle, dims, zero=0, sequence_parallel=sp, lr=1e-2)
    tp_ranks = tuple(run.groups.tp.ranks)
    mp.barrier()
    ctx.ledger.reset_peak()
    base, first = ctx.ledger.held("activations"), len(ctx.trace.events)
    run.train_step(*batch)
    ctx.resolve_pending()
    return ctx.ledger.peak("activations") - base, sum(
        e.duration for e in ctx.trace.events[first:] if e.stream == "comm" and e.group == tp_ranks)


naive = ParallelDims(dp_replicate=2, tp=4)  # tp = a node, dp across: incident A's fix
measured = mp.launch(lambda ctx: layout_program(ctx, naive, False), 8, topology=cluster)
peak, comm = max(m[0] for m in measured), max(m[1] for m in measured)
table2 = puzzle.num_layers * activation_bytes_per_layer(
    puzzle.seq_len, 1, puzzle.hidden, puzzle.num_heads, act_bytes=8, tp=4)
print(f"dp=2 x tp=4 in a node, no sequence parallelism, no recomputation: activations "
      f"{peak / 1e3:.1f} kB (budget {PUZZLE['activation_budget'] / 1e3:.0f} kB; Table 2 "
      f"for its 2 layers: {table2 / 1e3:.1f} kB), tp communication {comm * 1e6:.1f} us "
      f"(budget {PUZZLE['tp_comm_budget'] * 1e6:.0f} us)")

# %% [markdown]
# The ledger counts more than Table 2's layers (the embedding's output, the logits, the
# loss), so leave a margin when you estimate, or measure as above.
#
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 04`. Exercises 4.1–4.4 run on every rank of a
# tensor-parallel group, as a Megatron layer does; use minipar's collectives
# (`mp.all_reduce(x, "sum", group=group)`, ...). The grader runs them on a 2-D mesh of
# data × tensor parallelism, the tensor-parallel groups either consecutive ranks or ranks
# 2 apart, and passes your group as `group`: r is your rank *in the group*
# (`mp.get_rank(group)`), not the global rank. It compares your results with minipar's own
# layers and functions, counts the collectives you issue (and over which ranks) before it
# looks at values, hands you copies of your inputs and names any you write into, and names
# a failing rank as "tp rank 0 of 2 = global rank 2 of 4, the second tp group".
#
# - **Exercise 4.1** — `column_parallel_linear_forward(x, w_shard, b_shard, group)` and
#   `column_parallel_linear_backward(dy_shard, x, w_shard, group) -> (dx, dw_shard,
#   db_shard)`: the column-parallel layer with f. Graded against `ColumnParallelLinear`.
# - **Exercise 4.2** — `row_parallel_linear_forward(x_shard, w_shard, b, group)` and
#   `row_parallel_linear_backward(dy, x_shard, w_shard, group) -> (dx_shard, dw_shard, db)`:
#   the row-parallel layer with g. Graded against `RowParallelLinear`.
# - **Exercise 4.3** — `vocab_parallel_cross_entropy_loss(logits_shard, targets, group)`:
#   the mean cross-entropy from [s, b, V/t] logit shards, communicating one number a token
#   at most three times and never the logits. Graded against `cross_entropy_forward` on the
#   full logits, on logits near ±1000 too, and against the trace.
# - **Exercise 4.4** — `sequence_parallel_layernorm_grads(dy_shard, x_shard, gamma, group)
#   -> (dx_shard, dgamma, dbeta)`: LayerNorm's backward on a sequence shard, with γ's and
#   β's gradients for the whole sequence. Graded against `layernorm_backward` on the whole
#   sequence.
# - **Exercise 4.5** (design) — `choose_tensor_parallel_layout(cfg, topology, global_batch,
#   activation_budget, tp_comm_budget) -> {"dims", "sequence_parallel", "cfg"}`: section
#   7's puzzle, and the same question on a second cluster. Graded by training the layout
#   on the simulated cluster: the ledger, the clock and one device's losses.
#
# ## Summary
#
# - Tensor parallelism splits Y = GeLU(XA)B as a column-parallel A (no communication: GeLU
#   is elementwise) and a row-parallel B whose partial products one all-reduce sums; shards
#   are slices of the full initialisation.
# - f (identity forward, all-reduce backward) and g (all-reduce forward, identity backward)
#   are conjugate; a row-parallel bias is added once, after g.
# - Attention splits by whole heads; a layer does 2 all-reduces of s·b·h in forward and 2
#   in backward, all on the critical path.
# - The vocabulary splits by rows; the loss needs three all-reduces of [s, b] and never the
#   full [s, b, V] logits, and the max it subtracts must be each token's max over the whole
#   vocabulary, or exp overflows (past 88.7 in float32, 709.8 in float64).
# - Sequence parallelism runs LayerNorm and dropout on s/t of the tokens, turns the
#   all-reduces into all-gathers and reduce-scatters (same bytes), divides the remaining
#   10·sbh of activations by t, and needs one all-reduce of the LayerNorm and bias gradients.
# - "Sequence parallelism" also names DeepSpeed-Ulysses (all-to-all from a sequence split to
#   a head split) and ring attention (K/V blocks around a ring: context parallelism, lesson
#   09); those two split the tokens without splitting the weights.
# - Tensor parallelism stays inside a node's NVLink domain; across nodes its all-reduces
#   run at InfiniBand speed (incident A). Choosing tp, sequence parallelism and
#   recomputation is a budget of memory and time, measured on the simulated cluster
#   (exercise 4.5).
