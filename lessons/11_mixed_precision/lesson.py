# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 11 — Mixed precision
#
# Sixteen bits where they are enough, thirty-two where they are not: bf16, fp16 and fp32's ranges and spacing, float32 masters, fp16 loss scaling through a forced overflow, 16 or 18 bytes a parameter (Megatron's main_grad, the distributed optimizer's 6 + 12/d) on the ledger, float32 accumulation and reduction measured against float64, and what FP8 changes.
#
# Every lesson so far trained in bf16 with a float32 copy of the weights, and counted
# 16 or 18 bytes a parameter for it (lesson 00, section 1; lesson 10, section 3). This
# lesson opens the box: what a 16-bit number can and cannot hold, where a training step
# needs more, and what each remedy costs in bytes. The papers: Micikevicius et al. 2018
# ("Mixed Precision Training", ICLR) for float32 masters and loss scaling; Kalamkar et al.
# 2019 ("A Study of BFLOAT16 for Deep Learning Training") for bf16; Narayanan et al. 2021
# ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21)
# for the float32 `main_grad`; Micikevicius et al. 2022 ("FP8 Formats for Deep Learning")
# and DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report") for FP8. Every number below is
# computed by minipar or NumPy (`ml_dtypes` supplies bf16 and the FP8 types).

# %%
import math

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig, Parameter
from minipar.optim import SGD, AdamW, DynamicLossScaler, MixedPrecisionOptimizer, half_dtype
from minipar.parallel import DistributedDataParallel, zero_engine
from minipar.plan import Layout, model_state_bytes
from minipar.plan.rank_states import bytes_per_parameter
from minipar.viz import figures

BF16, FP16, FP32 = half_dtype("bfloat16"), half_dtype("float16"), np.dtype(np.float32)
E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}  # a float's bits, by its size

# %% [markdown]
# ## 1. Three formats: how far they reach, how finely they step
#
# A floating-point number is a sign, an exponent of e bits and a mantissa of m bits:
# (−1)^s · 1.f · 2^(E − bias). The exponent bits set the range, the mantissa bits the
# spacing between neighbours: in every binade [2^E, 2^(E+1)) there are 2^m evenly spaced
# values, so the relative step is 2^−m (machine epsilon, the step above 1) and a number
# rounds to within half of it. Below the smallest normal number the values go on evenly
# spaced as *subnormals*, down to one step above zero.

# %%
formats = {"fp32": FP32, "bf16": BF16, "fp16": FP16}
ranges = {}
print(f"{'':>5}{'bits s/e/m':>11}{'epsilon':>12}{'max':>12}{'smallest normal':>17}"
      f"{'smallest subnormal':>20}")
for name, dt in formats.items():
    fi = ml_dtypes.finfo(dt)
    ranges[name] = {"eps": float(fi.eps), "max": float(fi.max), "normal": float(fi.tiny),
                    "subnormal": float(fi.smallest_subnormal), "m": fi.nmant, "e": fi.nexp}
    r = ranges[name]
    bits = f"1/{r['e']}/{r['m']}"
    print(f"{name:>5}{bits:>11}{r['eps']:>12.4g}{r['max']:>12.4g}"
          f"{r['normal']:>17.4g}{r['subnormal']:>20.4g}")

# %% [markdown]
# bf16 is float32 with the last 16 bits of the mantissa cut off: the same 8-bit exponent,
# so the same range, 1.2·10⁻³⁸ to 3.4·10³⁸, but 7 mantissa bits: a relative step of 2⁻⁷ =
# 0.78 %. fp16 spends its 16 bits the other way, 5 exponent bits and 10 of mantissa: eight
# times finer than bf16, but it overflows past 65,504 and its normal numbers stop at
# 6.1·10⁻⁵. Kalamkar et al. 2019 trained a range of networks in bf16 with float32
# accumulation and masters, without loss scaling, to float32's accuracy: the range is what
# training needs most. The spacing against the magnitude, for all three:

# %%
exponents = list(range(-40, 41, 2))
spacing = {}
for name, dt in formats.items():
    x = np.array([2.0**k for k in exponents]) * 1.25  # inside each binade, not on its edge
    with np.errstate(over="ignore", invalid="ignore"):
        a = x.astype(dt)
        up = (a.view(UINT[dt.itemsize]) + 1).view(dt)  # the next representable number
        gap = up.astype(np.float64) - a.astype(np.float64)
    ok = np.isfinite(gap) & (a.astype(np.float64) > 0)
    spacing[name] = [float(g) if good else float("nan") for g, good in zip(gap, ok)]
for k, row in zip(exponents[::5], zip(*(spacing[n][::5] for n in formats))):
    print(f"  x = 1.25·2^{k:<4} " + "   ".join(f"{n} step {g:9.3g}"
                                            for n, g in zip(formats, row)))

# %%
figures.lines("11_spacing", "The step between neighbouring values, against the magnitude",
              [1.25 * 2.0**k for k in exponents], spacing, xlabel="magnitude x",
              ylabel="spacing at x", logx=True, logy=True)

# %% [markdown]
# Three parallel lines, 2⁻²³, 2⁻⁷ and 2⁻¹⁰ of the magnitude: the relative precision is the
# same at every scale. fp16's line bends flat below 6.1·10⁻⁵ (its subnormals keep the
# step 2⁻²⁴ while the numbers shrink, so they lose relative precision) and stops at
# 65,504.
#
# **Rounding a float32 to bf16** keeps its top 16 bits, rounded to the nearest bf16 value,
# ties to the even one (the one whose last kept bit is 0), as IEEE 754's default and as
# hardware does. In bits: add 0x7FFF plus the last kept bit to the 32-bit pattern and cut
# off the low 16 bits; a carry may run into the exponent, and that is right (the next
# binade, or infinity past the largest value). Exercise 11.1 writes it; here is what it
# must give:

# %%
tie_cases = {"1 + 2^-8 (a tie: halfway between 1 and 1 + 2^-7)": 1 + 2.0**-8,
             "1 + 3·2^-8 (a tie: between 1 + 2^-7 and 1 + 2^-6)": 1 + 3 * 2.0**-8,
             "1 + 2^-8 + 2^-20 (just above the tie)": 1 + 2.0**-8 + 2.0**-20,
             "-1.999 (the carry runs into the exponent)": -1.999,
             "the largest float32": float(np.finfo(np.float32).max)}
for label, value in tie_cases.items():
    x32 = np.array([value], dtype=FP32)
    b = x32.astype(BF16)
    print(f"  {label:<52} float32 0x{int(x32.view(np.uint32)[0]):08X} -> bf16 "
          f"0x{int(b.view(np.uint16)[0]):04X} = {float(b[0]):.9g}")

# %% [markdown]
# Both ties went to the neighbour with an even last bit (1, and 1 + 2⁻⁶: the carry ran
# through the mantissa), a value just above the tie rounded up, −1.999 rounded to −2 (the
# carry turned the mantissa's ones into zeros and added one to the exponent; the sign bit
# is never touched), and the largest float32 rounded to infinity: 3.4028235·10³⁸ lies
# above the largest bf16, 3.3895·10³⁸, by more than half a step. Truncating instead
# (keeping the top 16 bits) would move every value toward zero, by half a step on
# average: a bias, not noise.

# %% [markdown]
# ## 2. Why the optimizer keeps float32 masters
#
# An update smaller than half the spacing at the weight rounds back to the old weight and
# is lost. At w = 1 the bf16 step is 2⁻⁷, so an update of 10⁻⁴ — a learning rate of 10⁻⁴
# times a gradient of 1 — disappears, every step, for ever. Micikevicius et al. 2018 keep a
# float32 *master* copy that the optimizer updates, and round it to 16 bits for the next
# forward: the updates accumulate in the master until they show. One weight, 1000 steps
# of SGD at lr = 10⁻⁴ with a gradient of 1, in bf16 alone and through minipar's
# `MixedPrecisionOptimizer`:

# %%
lr, steps = 1e-4, 1000
w16 = np.array([1.0], dtype=BF16)
for _ in range(steps):
    w16 = (w16.astype(np.float32) - np.float32(lr)).astype(BF16)  # the update, rounded
with mp.device():
    p = Parameter("w", np.array([1.0], dtype=BF16))
    opt = MixedPrecisionOptimizer(SGD, [p], dtype="bfloat16", lr=lr)
    for _ in range(steps):
        p.accumulate(np.array([1.0], dtype=BF16))
        opt.step()
        opt.zero_grad()
    master_w, model_w = float(opt.masters["w"].data[0]), float(p.data[0])
print(f"bf16 weight alone after {steps} steps: {float(w16[0])!r} (every update rounded away)")
print(f"float32 master: {master_w:.6f}; the bf16 weight the model uses: {model_w!r}")
print(f"exact: {1 - steps * lr:.6f}")

# %% [markdown]
# Which weights ignore an update of a given size? Those whose half-step exceeds it:

# %%
update = 3e-4  # an Adam step is about lr a parameter: a typical lr
deaf = {}
for name in ("bf16", "fp16", "fp32"):
    m = ranges[name]["m"]
    # half the step in [2^E, 2^(E+1)) is 2^(E - m - 1); the smallest E where it exceeds u
    E = math.floor(math.log2(update)) + m + 1
    while 2.0**(E - m - 1) <= update:
        E += 1
    deaf[name] = 2.0**E
    print(f"  {name}: an update of {update:g} is lost on every weight of magnitude >= "
          f"{deaf[name]:g}")

# %% [markdown]
# In bf16, every weight of magnitude 0.125 or more ignores an update of 3·10⁻⁴: the
# LayerNorm gains, which start at 1, and any weight that has grown; fp16 does so from 1
# up, float32 only past 8192. The masters cost 4 bytes a parameter; Adam's m and v, 4 more
# each, are kept in float32 for the same reason (v holds squared gradients, which span a
# wide range). Those are the 12 bytes of "optimizer states".

# %% [markdown]
# ## 3. float16 and loss scaling: through an overflow and back
#
# fp16's normal numbers end at 6.1·10⁻⁵, and gradients are often smaller: in fp16 they
# lose their precision, and below 6·10⁻⁸ they become zero. Micikevicius et al. 2018 scale
# the loss by S before the backward: every gradient is S times larger (the backward is
# linear), inside fp16's range; the optimizer divides by S in float32 before using them. A
# spread of gradient magnitudes from 10⁻¹⁰ to 10⁻³, as fp16 stores them at several scales:

# %%
magnitudes = 10.0 ** np.random.default_rng(0).uniform(-10, -3, 100_000)  # log-uniform
scaled = {}
for S in (1.0, 2.0**8, 2.0**16, 2.0**24, 2.0**28):
    with np.errstate(over="ignore", under="ignore"):
        g16 = (magnitudes * S).astype(FP16)
    a16 = np.abs(g16.astype(np.float64))
    scaled[S] = {"zero": float(np.mean(a16 == 0)),
                 "subnormal": float(np.mean((a16 > 0) & (a16 < ranges["fp16"]["normal"]))),
                 "inf": float(np.mean(np.isinf(a16)))}
    print(f"  S = 2^{int(math.log2(S)):<3}: zero {scaled[S]['zero']:6.1%}, subnormal "
          f"{scaled[S]['subnormal']:6.1%}, overflowed {scaled[S]['inf']:6.1%}")

# %% [markdown]
# Unscaled, a third of these gradients are zero in fp16 and nearly half are subnormal
# (fewer than 11 significant bits); at S = 2²⁴ every one is a normal number. At 2²⁸ the
# largest overflow. The window is wide enough — 2⁻¹⁴ to 2¹⁶ — but it must be moved to where
# the gradients are, and they move as training goes. A scale too large overflows: S·g past
# 65,504 is infinite. So the scale is
# *dynamic* (PyTorch's `GradScaler`, Megatron's `DynamicGradScaler`, minipar's
# `DynamicLossScaler`): if any gradient is inf or nan, skip the step — weights and Adam's
# moments untouched — and halve S; after `growth_interval` clean steps in a row, double it
# (PyTorch starts at 2¹⁶ and waits 2000 steps). Here a float16 GPT starts far too high, at
# 2²⁴, with a growth interval of 3 to show the cycle in a few steps:

# %%
cfg16 = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=1,
                  dtype="float16")
ids16 = np.random.default_rng(0).integers(0, 32, (9, 4))
trace16 = []
with mp.device():
    model16 = GPT(cfg16)
    opt16 = MixedPrecisionOptimizer(AdamW, model16.parameters(), dtype="float16", lr=1e-3,
                                    loss_scaler=DynamicLossScaler(init_scale=2.0**24,
                                                                  growth_interval=3))
    for step in range(14):
        S = opt16.loss_scale
        with np.errstate(all="ignore"):
            loss16 = model16.loss_and_grad(ids16[:-1], ids16[1:], loss_scale=S)
            largest = max(float(np.max(np.abs(p.grad.astype(np.float64))))
                          for p in model16.parameters())
        taken = opt16.step()
        opt16.zero_grad()
        trace16.append((step, S, largest, taken, opt16.loss_scale, loss16))
for step, S, largest, taken, after, loss in trace16:
    print(f"  step {step:>2}: S = 2^{int(math.log2(S)):<3} largest S·g = {largest:>9.6g}  "
          f"{'taken  ' if taken else 'SKIPPED'}  next S = 2^{int(math.log2(after)):<3} "
          f"loss {loss:.6f}")
skipped16 = sum(not t for _, _, _, t, _, _ in trace16)

# %% [markdown]
# Seven steps skipped, the scale halving each time (the gradients held nan, then inf:
# overflows inside the backward), until S = 2¹⁷ puts the largest gradient at 46,592,
# under 65,504; the loss is the same through the skipped steps — nothing was updated.
# Three clean steps later the scaler tries 2¹⁸, overflows, skips, and comes back: with the
# default interval of 2000 it gives up at most one step in 2001 to probing. bf16 has float32's range and needs none
# of this, which is why large models train in bf16 (Megatron-LM's fp16 path keeps the
# scaler; its bf16 path has none).

# %% [markdown]
# ## 4. 16 or 18 bytes a parameter, measured
#
# Lesson 00 counted them: ZeRO's 2 (bf16 weights) + 2 (bf16 gradients) + 12 (float32
# master, m, v) = 16, and Megatron-LM's 2 + 4 + 12 = 18, because Megatron accumulates and
# reduces the gradients in a float32 `main_grad` buffer beside each bf16 weight (for bf16 it
# turns `accumulate_allreduce_grads_in_fp32` on by itself). Its distributed optimizer
# shards the 12 over the d data-parallel ranks and keeps 2 + 4 whole: 6 + 12/d. minipar's
# engines take that option, `main_grad=True` (docs/data_parallel.md): the gradient
# buffers become float32. The planner's count and the ledger of a bf16 GPT, one device:

# %%
for label, lay in (("bf16 gradients", Layout(fp32_grads=False)),
                   ("float32 main_grad", Layout()), ("fp32 training", Layout(precision="fp32"))):
    w, g, k = bytes_per_parameter(lay)
    print(f"  planner, {label:<18} {w} + {g} + {k:>2} = {w + g + k} bytes a parameter")
cfg = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                dtype="bfloat16")
psi = cfg.num_parameters()
ids = np.random.default_rng(1).integers(0, 32, (9, 8))
measured = {}
for main in (False, True):
    with mp.device() as ctx:
        model = GPT(cfg)
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), lr=1e-3, main_grad=main)
        model.loss_and_grad(ids[:-1, :2], ids[1:, :2])
        opt.step()
        measured[main] = {c: ctx.ledger.held(c) / psi for c in
                          ("parameters", "gradients", "optimizer_states")}
        measured[main]["peak gradients"] = ctx.ledger.peak("gradients") / psi
    print(f"  ledger, main_grad={main!s:<5}: " + ", ".join(
        f"{c} {v:.3f}" for c, v in measured[main].items())
        + f"; total {sum(list(measured[main].values())[:3]):g} bytes a parameter (Ψ = {psi:,})")

# %% [markdown]
# 16 and 18, to the byte. The peaks differ the other way round: without main_grad the
# optimizer makes a float32 copy of each bf16 gradient, one tensor at a time, so the
# gradients peak 4 bytes × the largest tensor above 2Ψ; with it the step reads the float32
# buffers as they are. Sharded over d ranks by ZeRO-1 with float32 gradients — Megatron's
# distributed optimizer — each rank holds 6 + 12/d:

# %%
def distributed_optimizer(ctx):
    model = GPT(cfg)
    engine = zero_engine(model, AdamW, stage=1, lr=1e-3, main_grad=True)
    cols = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]
    model.loss_and_grad(cols[:-1], cols[1:])
    engine.step()
    return sum(ctx.ledger.held(c) for c in ("parameters", "gradients", "optimizer_states"))


dist_held = {}
for d in (2, 4):
    dist_held[d] = [held / psi for held in mp.launch(distributed_optimizer, d)]
    print(f"  d = {d}: the ledger {dist_held[d][0]:.3f} bytes a parameter on every rank, "
          f"6 + 12/d = {6 + 12 / d:.3f}; the planner: "
          f"{model_state_bytes(psi, 1, d, grad_bytes=4)['total'] / psi:.3f}")
for d in (8, 64, 512):
    print(f"  d = {d:>3}: 6 + 12/d = {6 + 12 / d:6.3f} bytes, against ZeRO-1's 4 + 12/d = "
          f"{model_state_bytes(1, 1, d)['total']:6.3f}")

# %% [markdown]
# At large d the 12 bytes vanish into the shards and the 2 + 4 unsharded bytes dominate:
# a distributed-optimizer run holds 6 bytes a parameter where a ZeRO-1 count says 4. What
# do the two extra bytes buy?

# %% [markdown]
# ## 5. Accumulating micro-batches: what main_grad is for
#
# With gradient accumulation a rank adds k micro-batches' gradients before it reduces
# them (lesson 02). In a bf16 buffer every partial sum is rounded to 8 significant bits;
# as the sum grows, each new micro-batch's contribution is rounded more coarsely
# relative to itself, and the error grows with k. In float32 the sum keeps 24 bits. A
# bf16 GPT, micro-batches of one sequence, with and without main_grad, against two
# references: the exact (float64) sum of the same bf16 micro-batch gradients — the error
# the accumulation adds — and the float64 model's gradient — what training sees:

# %%
cfg1 = cfg.with_(num_layers=1)
K = 128
idsK = np.random.default_rng(2).integers(0, 32, (9, K))
checkpoints = [1, 2, 4, 8, 16, 32, 64, 128]
grads_at = {}
for label, dtype, main, each in (("exact sum", "bfloat16", False, True),
                                 ("float64 model", "float64", False, False),
                                 ("bf16 buffer", "bfloat16", False, False),
                                 ("float32 main_grad", "bfloat16", True, False)):
    with mp.device():
        model = GPT(cfg1.with_(dtype=dtype))
        opt = (MixedPrecisionOptimizer(AdamW, model.parameters(), main_grad=main)
               if dtype == "bfloat16" else None)
        total, grads_at[label] = 0.0, {}
        for i in range(K):
            model.loss_and_grad(idsK[:-1, i:i + 1], idsK[1:, i:i + 1], loss_scale=1 / K)
            flat = np.concatenate([p.grad.astype(np.float64).ravel() for p in model.parameters()])
            if each:  # this micro-batch's bf16 gradient alone, added in float64
                total = total + flat
                opt.zero_grad()
            if i + 1 in checkpoints:
                grads_at[label][i + 1] = total.copy() if each else flat
errors = {}
for label in ("bf16 buffer", "float32 main_grad"):
    for ref in ("exact sum", "float64 model"):
        errors[label, ref] = [float(np.linalg.norm(grads_at[label][k] - grads_at[ref][k])
                                    / np.linalg.norm(grads_at[ref][k])) for k in checkpoints]
print(f"{'k':>5}{'bf16 buffer':>14}{'main_grad':>12}  (against the exact sum)"
      f"{'bf16 buffer':>14}{'main_grad':>12}  (against the float64 model)")
for j, k in enumerate(checkpoints):
    print(f"{k:>5}{errors['bf16 buffer', 'exact sum'][j]:>14.2e}"
          f"{errors['float32 main_grad', 'exact sum'][j]:>12.2e}{'':>24}"
          f"{errors['bf16 buffer', 'float64 model'][j]:>14.2e}"
          f"{errors['float32 main_grad', 'float64 model'][j]:>12.2e}")

# %%
figures.lines("11_accumulation", "Accumulated gradient against the float64 model's",
              checkpoints, {"bf16 buffer": errors["bf16 buffer", "float64 model"],
                            "float32 main_grad": errors["float32 main_grad", "float64 model"]},
              xlabel="micro-batches accumulated k", ylabel="relative error (norm)", logx=True,
              logy=True)

# %% [markdown]
# Against the exact sum, the float32 buffer is exact up to k = 16 (the sum of a few bf16
# values fits in 24 bits) and within 10⁻⁸ at k = 128, while the bf16 buffer's error grows
# from 2·10⁻³ at k = 2 to 1.3·10⁻² at k = 128, a million times the float32 buffer's.
# Against the float64
# model, main_grad leaves what the bf16 forward and backward themselves round, 3.5 to
# 4.7·10⁻³ whatever k; the bf16 buffer adds its own on top, three times as much at
# k = 128. Two bytes a parameter buy a gradient whose error does not grow with the number
# of micro-batches — why Megatron turns it on for bf16, and why a pipeline, which
# accumulates m micro-batches by construction, needs it. With one micro-batch the two are
# the same bits (tests/optim/test_main_grad.py).

# %% [markdown]
# ## 6. Reducing over the ranks: bf16 against float32
#
# Data parallelism adds N ranks' gradients (lesson 02). A ring reduction in bf16 rounds
# each chunk's running sum after every hop: N − 1 roundings, like accumulating N
# micro-batches; minipar's all-reduce adds the ranks in order, the same count. Each rank
# below holds a bf16 gradient of 4096 elements with a common mean (ranks' gradients are
# correlated, so the sum grows); the average is all-reduced in bf16, and in float32 (the
# main_grad buffers), against the float64 average of the same bf16 inputs:

# %%
def reduce_both(ctx):
    rng = np.random.default_rng([11, ctx.rank])
    g16 = (rng.standard_normal(4096) * 1e-3 + 2e-3).astype(BF16)  # this rank's gradient
    in_bf16 = mp.all_reduce(g16, "avg")
    in_fp32 = mp.all_reduce(g16.astype(np.float32), "avg")
    return g16.astype(np.float64), in_bf16.astype(np.float64), in_fp32.astype(np.float64)


worlds = [2, 4, 8, 16, 32, 64]
reduction = {"bf16 all-reduce": [], "float32 all-reduce": []}
for n in worlds:
    out = mp.launch(reduce_both, n)
    exact = np.mean([o[0] for o in out], axis=0)
    for label, j in (("bf16 all-reduce", 1), ("float32 all-reduce", 2)):
        reduction[label].append(float(np.linalg.norm(out[0][j] - exact) / np.linalg.norm(exact)))
    print(f"  N = {n:>2}: bf16 {reduction['bf16 all-reduce'][-1]:.2e}, float32 "
          f"{reduction['float32 all-reduce'][-1]:.2e}")

# %%
figures.lines("11_reduction", "All-reduce of bf16 gradients against the float64 average",
              worlds, {k: [max(v, 1e-12) for v in vals] for k, vals in reduction.items()},
              xlabel="ranks N", ylabel="relative error (norm)", logx=True, logy=True)

# %% [markdown]
# The bf16 reduction's error grows with N, from 1.9·10⁻³ at N = 2 to 7.5·10⁻³ at 64: the
# same growth as accumulating micro-batches, for the same reason. The float32 one stays
# under 4·10⁻⁹ (exactly 0 up to 8 ranks, where the sums fit in 24 bits; the figure draws 0
# as 10⁻¹²). The price: every reduction sends float32, twice the bytes. DDP on 4 ranks,
# one backward of the GPT of section 4, with and without main_grad:

# %%
def ddp_step(ctx, main):
    model = GPT(cfg)
    engine = DistributedDataParallel(model, AdamW, lr=1e-3, main_grad=main)
    cols = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]
    sent = ctx.trace.bytes_sent()
    model.loss_and_grad(cols[:-1], cols[1:])
    return ctx.trace.bytes_sent() - sent, engine.full_grads()["blocks.0.attn.qkv.weight"].dtype


ddp_sent = {}
for main in (False, True):
    sent, dtype = ddp_sent[main] = mp.launch(lambda ctx: ddp_step(ctx, main), 4)[0]
    print(f"  main_grad={main!s:<5}: {dtype} buckets, {sent:,.0f} bytes sent a rank = "
          f"{sent / psi:.2f} a parameter (2(N − 1)/N × {4 if main else 2} bytes)")

# %% [markdown]
# Megatron pays it by default in bf16; newer versions accept `--grad-reduce-in-bf16`,
# which keeps the gradient buffers in bf16: half the bytes, and the errors above.

# %% [markdown]
# ## 7. What FP8 changes
#
# FP8 halves the bytes of bf16 again for the GEMMs' inputs. Micikevicius et al. 2022 define
# two 8-bit formats: E4M3 (4 exponent bits, 3 mantissa bits, no infinities, for weights
# and activations) and E5M2 (IEEE-like, for gradients). Their reach, from `ml_dtypes`:

# %%
fp8 = {}
for name, dt in (("E4M3", E4M3), ("E5M2", E5M2), ("bf16", BF16)):
    fi = ml_dtypes.finfo(dt)
    fp8[name] = {"eps": float(fi.eps), "max": float(fi.max), "normal": float(fi.tiny),
                 "subnormal": float(fi.smallest_subnormal),
                 "binades": math.log2(float(fi.max) / float(fi.smallest_subnormal))}
    r = fp8[name]
    print(f"  {name}: epsilon {r['eps']:g}, max {r['max']:g}, smallest normal {r['normal']:g}, "
          f"smallest subnormal {r['subnormal']:g}: {r['binades']:.1f} binades")

# %% [markdown]
# E4M3 reaches from 2⁻⁹ to 448, 17.8 binades, at a relative step of 2⁻³; bf16 spans 261.
# No tensor sits in such a window by luck, so every FP8 tensor carries a **scaling
# factor**: x ≈ q / s with q = round₈(x·s), s chosen so that the largest |x| maps to the
# format's max (Micikevicius et al. 2022: one factor per tensor). Activations of 64 tokens
# × 1024 channels, four of them outlier channels as large models have, quantized to E4M3
# with one factor per tensor and with DeepSeek-V3's fine-grained factors, one per 1 × 128
# tile of a row (a token's 128 channels; weights get 128 × 128 blocks), and
# gradient-sized values with no factor at all:

# %%
e4m3_max = fp8["E4M3"]["max"]
outliers = [7, 300, 301, 900]  # four outlier channels, in three of the eight tiles
quiet = np.ones(1024, bool)
quiet[outliers] = False
fp8_errors = {}
for factor in (1e2, 1e3, 1e4):
    acts = np.random.default_rng(3).standard_normal((64, 1024)).astype(np.float32)
    acts[:, outliers] *= factor  # [tokens, channels]
    s_tensor = e4m3_max / np.abs(acts).max()  # one factor: the largest value maps to 448
    per_tensor = (acts * s_tensor).astype(E4M3).astype(np.float32) / s_tensor
    tiles = acts.reshape(64, 8, 128)  # [tokens, tiles, 128]
    s_tile = e4m3_max / np.abs(tiles).max(axis=2, keepdims=True)  # one factor a tile
    per_tile = ((tiles * s_tile).astype(E4M3).astype(np.float32) / s_tile).reshape(64, 1024)
    for label, q in (("per tensor", per_tensor), ("1 x 128 tiles", per_tile)):
        a, b = acts[:, quiet], q[:, quiet]
        fp8_errors[factor, label] = (float(np.linalg.norm(b - a) / np.linalg.norm(a)),
                                     float(np.mean(b == 0)))
    print(f"  outliers x{factor:>6g}: the ordinary channels' relative error "
          + ", ".join(f"{label} {fp8_errors[factor, label][0]:.4f} "
                      f"({fp8_errors[factor, label][1]:.2%} flushed to zero)"
                      for label in ("per tensor", "1 x 128 tiles")))
small = np.random.default_rng(4).standard_normal(65536) * 1e-3  # gradient-sized, no factor
small8 = small.astype(E4M3).astype(np.float64)
no_factor = (float(np.linalg.norm(small8 - small) / np.linalg.norm(small)),
             float(np.mean(small8 == 0)))
print(f"  values of about 1e-3 with no factor: relative error {no_factor[0]:.3f}, "
      f"{no_factor[1]:.1%} flushed to zero")

# %% [markdown]
# One factor for the whole tensor is set by the outliers: the more they stand out, the
# lower the ordinary values land in E4M3's window, into its subnormals and below. At 10⁴×
# the ordinary channels' error rises from E4M3's own 2.6 % to 4.2 % and 5.6 % of them
# become zero. A factor per 1 × 128 tile confines an outlier to its own tile: the other
# tiles keep E4M3's full precision. Without any factor, values of 10⁻³ mostly fall off the
# bottom. DeepSeek-V3 (2024) trains with such fine-grained factors, computed online from
# the current tensor, and uses E4M3 for every GEMM input, gradients included, where the
# earlier recipe used E5M2 for gradients. Its report also says what FP8 does not change:
# the master weights and the gradients accumulated across micro-batches stay in float32
# (Adam's moments in bf16), and the GEMMs' partial sums, which the H800's tensor cores
# accumulate with about 14 bits, are promoted to float32 every 128 elements of the inner
# dimension. Sections 5 and 6 one level down: whatever the inputs' format, sums are kept
# wide.

# %% [markdown]
# ## Exercises
#
# - **11.1** `round_to_bf16_bits`: float32 values to the bit patterns of their bf16
#   rounding, nearest with ties to even, by integer arithmetic on the bits — subnormals,
#   infinities and the carry into the exponent included (section 1).
# - **11.2** `loss_scale_update`: one step of the dynamic loss scaler — skip and back off
#   on an overflow (not below the floor), grow after `growth_interval` clean steps in a
#   row (section 3), against `DynamicLossScaler` over drawn runs of overflows.
# - **11.3** `state_bytes_per_parameter`: the bytes a parameter of weights, gradients and
#   optimizer states under bf16 or fp32, bf16 or float32 gradients, a ZeRO stage or the
#   distributed optimizer over d ranks (section 4), against the planner.
# - **11.4** `fit_precision`: a plan — main_grad or not, a ZeRO stage, micro-batches — for
#   a bf16 GPT of 30,592 parameters on n = 2 to 4 ranks that peaks under 460,000 bytes a
#   rank (15 bytes a parameter) and whose reduced gradient stays within 10⁻⁵ of the exact
#   sum of its bf16 micro-batch gradients, run on simulated devices (sections 4–6).
#
# `minipar grade 11` grades `exercise.py`.
#
# ## Summary
#
# - bf16 keeps float32's range with 8 significant bits (a step of 2⁻⁷ relative); fp16
#   keeps 11 bits but ends at 65,504 and its normals at 6.1·10⁻⁵. Rounding to bf16 keeps
#   the top 16 bits, to nearest, ties to even.
# - Updates smaller than half a step are lost: in bf16, an update of 3·10⁻⁴ on any weight
#   of magnitude ≥ 0.125. A float32 master keeps them (4 bytes), beside Adam's float32
#   moments (8): the 12 bytes of optimizer states.
# - fp16 needs a dynamic loss scale: overflow → skip the step and halve S; growth_interval
#   clean steps → double it. bf16 needs none.
# - Megatron's float32 main_grad makes 16 bytes a parameter 18 (6 + 12/d with the
#   distributed optimizer), measured on the ledger with `main_grad=True`; it keeps the
#   accumulated gradient exact to float32 where a bf16 buffer's error grows with the
#   micro-batches, and the all-reduce's with the ranks, at twice the reduction's bytes.
# - FP8 (E4M3: 448 down to 2⁻⁹) needs a scaling factor per tensor, or per tile against
#   outliers (DeepSeek-V3's 1 × 128 and 128 × 128), and still accumulates in float32.
