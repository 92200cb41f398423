"""Interview questions on lesson 11 (mixed precision), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 11`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the formats themselves
(ml_dtypes' finfo and casts, minipar.optim.half_dtype), minipar's optimizers
(MixedPrecisionOptimizer with and without main_grad, DynamicLossScaler), the planner's byte
counts (bytes_per_parameter, model_state_bytes), the runtime's cost model
(collective_cost), and runs on simulated devices (the ledger, all-reduces in bf16 and
float32).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig, Parameter
from minipar.optim import SGD, AdamW, DynamicLossScaler, MixedPrecisionOptimizer, half_dtype
from minipar.plan import Layout, model_state_bytes
from minipar.plan.rank_states import bytes_per_parameter
from minipar.runtime.cost import collective_cost
from minipar.runtime.topology import Topology

GB = 10**9
BF16, FP16 = half_dtype("bfloat16"), half_dtype("float16")
E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)


def stored(value: float, dtype) -> float:
    """`value` rounded to `dtype` (inf past its range), back as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.array([value]).astype(dtype)[0])


def relative(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


# ---- the questions' numbers ------------------------------------------------------------
def q107(g, a):
    """bf16 against fp16: epsilon, range, and what each stores of a gradient and an
    activation."""
    out = {}
    for tag, dt in (("bf", BF16), ("fp", FP16)):
        fi = ml_dtypes.finfo(dt)
        out[f"{tag}_eps"], out[f"{tag}_max"] = float(fi.eps), float(fi.max)
        out[f"{tag}_normal"] = float(fi.tiny)
        out[f"{tag}_g"], out[f"{tag}_a"] = stored(g, dt), stored(a, dt)
        out[f"{tag}_g_err"] = abs(out[f"{tag}_g"] - g) / g
    out["bf_a_err"] = abs(out["bf_a"] - a) / a
    out["fp_a"] = "inf" if math.isinf(out["fp_a"]) else out["fp_a"]
    return out


def q108(w, lr, steps):
    """An update below half a bf16 step at w: lost without a float32 master, kept with it."""
    w16 = np.array([w], dtype=BF16)
    for _ in range(steps):
        w16 = (w16.astype(np.float32) - np.float32(lr)).astype(BF16)
    with mp.device():
        p = Parameter("w", np.array([w], dtype=BF16))
        start = float(p.data[0])
        opt = MixedPrecisionOptimizer(SGD, [p], dtype="bfloat16", lr=lr)
        first = None
        for step in range(1, steps + 1):
            p.accumulate(np.array([1.0], dtype=BF16))
            opt.step()
            opt.zero_grad()
            if first is None and float(p.data[0]) != start:
                first = step
        master, model = float(opt.masters["w"].data[0]), float(p.data[0])
    half = 2.0 ** (math.floor(math.log2(start)) - 8)  # half the bf16 step at w
    return {"w16": start, "half": half, "alone": float(w16[0]), "master": master,
            "model": model, "first": first}


def q109(lo, hi):
    """The power-of-two loss scales that put gradients from lo to hi in fp16's normal range."""
    fi = ml_dtypes.finfo(FP16)
    s_min = 2 ** math.ceil(math.log2(float(fi.tiny) / lo))
    s_max = 2 ** math.floor(math.log2(float(fi.max) / hi))
    return {"lo_fp16": stored(lo, FP16), "normal": float(fi.tiny),
            "s_min_log": int(math.log2(s_min)), "s_max_log": int(math.log2(s_max)),
            "count": int(math.log2(s_max) - math.log2(s_min)) + 1,
            "over_log": int(math.log2(s_max)) + 1,
            "hi_over": stored(hi * 2 * s_max, FP16)}


def q110(interval, steps, overflows):
    """A dynamic loss scaler through a run of overflows: its scale, skips and count."""
    scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=interval)
    history = []
    for step in range(steps):
        scaler.update(step in overflows)
        history.append(int(math.log2(scaler.scale)))
    return {"final_log": history[-1], "skipped": scaler.overflows,
            "taken": steps - scaler.overflows, "count": scaler.growth_tracker,
            "lowest_log": min(history), "grew": sum(1 for a, b in zip(history, history[1:])
                                                    if b > a)}


def q111(psi_b, mp_, dp):
    """Megatron's bytes a parameter in bf16 and in fp32, with its distributed optimizer."""
    psi = psi_b * 1e9 / mp_
    out = {}
    for tag, lay in (("bf", Layout()), ("f32", Layout(precision="fp32"))):
        w, g, k = bytes_per_parameter(lay)
        whole = model_state_bytes(psi, 0, dp, k=k, param_bytes=w, grad_bytes=g)["total"]
        dist = model_state_bytes(psi, 1, dp, k=k, param_bytes=w, grad_bytes=g)["total"]
        out[f"{tag}_b"], out[f"{tag}_gb"] = whole / psi, whole / GB
        out[f"{tag}_dist_b"], out[f"{tag}_dist_gb"] = dist / psi, dist / GB
    return out


def q112(h, layers, vocab, s):
    """The ledger of a bf16 GPT with and without main_grad: held and peak gradient bytes."""
    cfg = GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=h // 8, num_layers=layers,
                    dtype="bfloat16")
    ids = np.random.default_rng(123).integers(0, vocab, (s + 1, 2))
    out = {"psi": cfg.num_parameters()}
    for tag, main in (("bf", False), ("mg", True)):
        with mp.device() as ctx:
            model = GPT(cfg)
            opt = MixedPrecisionOptimizer(AdamW, model.parameters(), lr=1e-3, main_grad=main)
            model.loss_and_grad(ids[:-1], ids[1:])
            opt.step()
            held = sum(ctx.ledger.held(c) for c in ("parameters", "gradients",
                                                     "optimizer_states"))
            out[f"{tag}_b"] = held / out["psi"]
            out[f"{tag}_peak_g"] = ctx.ledger.peak("gradients") / out["psi"]
            out["n_max"] = max(p.size for p in model.parameters())
    return out


def q113(k, elements):
    """k bf16 micro-batch gradients added into a bf16 buffer and into a float32 main_grad,
    against their exact (float64) sums, after k/2 and after k."""
    rng = np.random.default_rng(124)
    grads = [(rng.standard_normal(elements) + 0.4).astype(BF16) for _ in range(k)]
    exact = np.cumsum([g.astype(np.float64) for g in grads], axis=0)  # [k, elements]
    out = {}
    with mp.device():
        for tag, main in (("bf", False), ("mg", True)):
            p = Parameter(f"w_{tag}", np.zeros(elements, dtype=BF16))
            MixedPrecisionOptimizer(AdamW, [p], main_grad=main)
            for i, g in enumerate(grads, start=1):
                p.accumulate(g)  # what a backward does with its gradient
                if i == k // 2:
                    out[f"{tag}_half_err"] = relative(p.grad, exact[i - 1])
            out[f"{tag}_err"] = relative(p.grad, exact[-1])
    out["ratio"] = out["bf_err"] / out["mg_err"]
    return out


def q114(n, elements):
    """An all-reduce (average) of bf16 gradients over n ranks in bf16 and in float32: error
    against the float64 average, and bytes sent a rank."""
    def program(ctx):
        rng = np.random.default_rng([125, ctx.rank])
        g = (rng.standard_normal(elements) * 1e-3 + 2e-3).astype(BF16)
        start = ctx.trace.bytes_sent()
        in_bf16 = mp.all_reduce(g, "avg")
        middle = ctx.trace.bytes_sent()
        in_fp32 = mp.all_reduce(g.astype(np.float32), "avg")
        return (g.astype(np.float64), in_bf16.astype(np.float64), in_fp32.astype(np.float64),
                middle - start, ctx.trace.bytes_sent() - middle)

    res = mp.launch(program, n)
    exact = np.mean([r[0] for r in res], axis=0)
    return {"bf_err": relative(res[0][1], exact), "f32_err": relative(res[0][2], exact),
            "bf_kib": res[0][3] / 2**10, "f32_kib": res[0][4] / 2**10}


def q115(psi_r_b, dp, gpus_per_node):
    """A rank's gradient reduction over dp ranks on InfiniBand, bf16 against float32."""
    topo = Topology.nodes(dp, gpus_per_node)
    ranks = [i * gpus_per_node for i in range(dp)]  # one GPU a node: the dp group
    out = {}
    for tag, nbytes in (("bf", 2), ("f32", 4)):
        S = psi_r_b * 1e9 * nbytes
        out[f"{tag}_gb"] = S / GB
        out[f"{tag}_ar_s"] = collective_cost("all_reduce", S, ranks, topo).seconds
        out[f"{tag}_rs_s"] = collective_cost("reduce_scatter", S, ranks, topo).seconds
    out["ratio"] = out["f32_ar_s"] / out["bf_ar_s"]
    return out


def q116(amax):
    """E4M3 and E5M2's reach, and a per-tensor scaling factor for a tensor of amax."""
    out = {}
    for tag, dt in (("e4", E4M3), ("e5", E5M2)):
        fi = ml_dtypes.finfo(dt)
        out[f"{tag}_max"], out[f"{tag}_normal"] = float(fi.max), float(fi.tiny)
        out[f"{tag}_sub"], out[f"{tag}_eps"] = float(fi.smallest_subnormal), float(fi.eps)
        out[f"{tag}_binades"] = math.log2(float(fi.max) / float(fi.smallest_subnormal))
    out["scale"] = out["e4_max"] / amax
    out["kept_normal"] = out["e4_normal"] / out["scale"]  # below: E4M3's subnormals
    out["kept_any"] = out["e4_sub"] / 2 / out["scale"]  # below half a subnormal: zero
    return out


def q117(outlier, channels, tokens):
    """One outlier channel: E4M3 with one scaling factor per tensor, and per 1 x 128 tile."""
    rng = np.random.default_rng(128)
    x = rng.standard_normal((tokens, channels)).astype(np.float32)
    x[:, 5] *= outlier
    top = float(ml_dtypes.finfo(E4M3).max)
    s = top / np.abs(x).max()
    per_tensor = (x * s).astype(E4M3).astype(np.float32) / s
    tiles = x.reshape(tokens, channels // 128, 128)
    st = top / np.abs(tiles).max(axis=2, keepdims=True)
    per_tile = ((tiles * st).astype(E4M3).astype(np.float32) / st).reshape(tokens, channels)
    rest = np.ones(channels, bool)
    rest[5] = False
    out = {}
    for tag, q in (("tensor", per_tensor), ("tile", per_tile)):
        out[f"{tag}_err"] = relative(q[:, rest], x[:, rest])
        out[f"{tag}_zero"] = float(np.mean(q[:, rest] == 0))
    out["tiles"] = channels // 128
    return out


def q118(n):
    """float32 to bf16 by truncation against round-to-nearest-even: the bias of a sum."""
    x = np.random.default_rng(129).uniform(1.0, 2.0, n).astype(np.float32)
    bits = x.view(np.uint32)
    trunc = ((bits >> 16) << 16).view(np.float32).astype(np.float64)
    nearest = x.astype(BF16).astype(np.float64)
    x64 = x.astype(np.float64)
    return {"trunc_mean": float(np.mean(trunc - x64)), "rne_mean": float(np.mean(nearest - x64)),
            "trunc_sum": float(np.sum(trunc) - np.sum(x64)),
            "rne_sum": float(np.sum(nearest) - np.sum(x64)), "step": 2.0**-7}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="11", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q107", dict(g=3.3e-6, a=70000),
        "What are bf16's and fp16's machine epsilon, largest value and smallest normal number, "
        "and what does each store of a gradient of {g:g} and an activation of {a:,}?",
        "bf16 (8 exponent bits, 7 of mantissa): epsilon {bf_eps:g}, max {bf_max:.4g}, "
        "smallest normal {bf_normal:.4g} — float32's range. fp16 (5 and 10): epsilon "
        "{fp_eps:g}, max {fp_max:g}, smallest normal {fp_normal:.4g}. The gradient: bf16 "
        "stores {bf_g:.6g} (relative error {bf_g_err:.2e}, within half of 2⁻⁷), fp16 "
        "{fp_g:.6g} ({fp_g_err:.2e}: a subnormal, with fewer bits than its 11, so loss "
        "scaling). The activation: bf16 {bf_a:g} ({bf_a_err:.2e}), fp16 {fp_a} — past "
        "65,504. bf16 trades precision for range; training needs the range more.",
        q107),
    entry(
        "q108", dict(w=0.37, lr=2e-4, steps=300),
        "A bf16 weight at {w} receives updates of {lr:g} a step (SGD, lr {lr:g}, gradient 1). "
        "What is it after {steps} steps in bf16 alone, and with a float32 master?",
        "Stored in bf16 the weight is {w16:.9g}; half a bf16 step there is {half:g}, more "
        "than the update, so each update rounds back: after {steps} steps it is still "
        "{alone:.9g}. A float32 master (MixedPrecisionOptimizer) accumulates them: "
        "{master:.6f}, which the model sees as {model:.9g}; the bf16 weight first moves at "
        "step {first}, when the master has crossed half a step. That is why 4 of the 12 "
        "optimizer bytes are a master copy.",
        q108),
    entry(
        "q109", dict(lo=2.5e-9, hi=3e-3),
        "Gradients in an fp16 run span {lo:g} to {hi:g}. What happens to the smallest without "
        "loss scaling, and which power-of-two scales S put all of them in fp16's normal range?",
        "Unscaled, {lo:g} is below half fp16's smallest subnormal and is stored as "
        "{lo_fp16:g}. S·{lo:g} ≥ {normal:.4g} needs S ≥ 2^{s_min_log}; S·{hi:g} ≤ 65,504 "
        "allows S ≤ 2^{s_max_log}: {count} powers of two work (at 2^{over_log} the "
        "largest becomes {hi_over:g}). The window exists but moves with the gradients, hence a "
        "dynamic scaler; bf16's range makes it unnecessary.",
        q109),
    entry(
        "q110", dict(interval=4, steps=17, overflows=(0, 1, 2, 7, 12)),
        "A dynamic loss scaler starts at S = 2^16 (halve on overflow, double after "
        "{interval} clean steps in a row). Over {steps} steps, gradients overflow at steps "
        "{overflows}. What is S at the end, and how many steps were taken?",
        "Each overflow skips its step (weights and moments untouched) and halves S; "
        "{interval} clean steps in a row double it, and an overflow restarts the count. "
        "{skipped} steps skipped, {taken} taken; S fell to 2^{lowest_log}, grew {grew} "
        "time(s), and ends at 2^{final_log} with {count} clean step(s) counted toward the "
        "next doubling. (DynamicLossScaler; PyTorch's default interval is 2000.)",
        q110),
    entry(
        "q111", dict(psi_b=13, mp_=4, dp=12),
        "A {psi_b}B model trains with Megatron-LM on tp × pp = {mp_}, dp = {dp}. What do its "
        "model states take a GPU in bf16 (float32 main_grad) and in fp32, with and without "
        "the distributed optimizer?",
        "bf16: 2 + 4 + 12 = {bf_b:g} bytes a parameter, {bf_gb:.2f} GB a GPU; the "
        "distributed optimizer shards the 12 over dp: 6 + 12/dp = {bf_dist_b:g}, "
        "{bf_dist_gb:.2f} GB. fp32: 4 + 4 + 8 = {f32_b:g} (no master), {f32_gb:.2f} GB; "
        "sharded 8 + 8/dp = {f32_dist_b:.3f}, {f32_dist_gb:.2f} GB. Megatron's README lists "
        "the same rows; ZeRO's 16 for bf16 assumes bf16 gradients.",
        q111),
    entry(
        "q112", dict(h=24, layers=3, vocab=40, s=12),
        "On one device, a bf16 GPT (h = {h}, {layers} layers, V = {vocab}, s = {s}) steps with "
        "MixedPrecisionOptimizer. What does the ledger hold a parameter with and without "
        "main_grad, and why do the gradients peak the other way round?",
        "Ψ = {psi:,}. Without main_grad: {bf_b:g} bytes a parameter (2 + 2 + 12), but the "
        "gradients peak at {bf_peak_g:.3f}: the step makes a float32 copy of each bf16 "
        "gradient, one tensor at a time, 4 bytes × the largest ({n_max:,} elements). With "
        "main_grad: {mg_b:g} (2 + 4 + 12) and a peak of {mg_peak_g:g}: the gradients are "
        "float32 already and the step reads them as they are.",
        q112),
    entry(
        "q113", dict(k=96, elements=4096),
        "Gradient accumulation over {k} micro-batches in bf16 (a tensor of {elements:,} "
        "elements): how far is the accumulated gradient from the exact sum of the "
        "micro-batches' bf16 gradients, in a bf16 buffer and in Megatron's float32 main_grad?",
        "A bf16 buffer rounds every partial sum to 8 significant bits: {bf_half_err:.2e} of "
        "the norm after half of them, {bf_err:.2e} after {k} — growing with k. The float32 "
        "main_grad keeps 24: {mg_half_err:.2e} and {mg_err:.2e}, {ratio:.3g}x less. Two bytes a parameter "
        "(18 instead of 16) buy an error that does not grow with the micro-batches.",
        q113),
    entry(
        "q114", dict(n=48, elements=2048),
        "Data parallelism over {n} ranks all-reduces bf16 gradients ({elements:,} elements "
        "a rank). How large is the error of reducing them in bf16, against reducing float32 "
        "copies, and what does each send?",
        "Against the float64 average of the same bf16 gradients: {bf_err:.2e} reduced in "
        "bf16 (each running sum rounded after every addition, {n} − 1 times), "
        "{f32_err:.2e} in float32. A rank sends 2(n − 1)/n × the buffer: {bf_kib:.2f} KiB "
        "in bf16, {f32_kib:.2f} KiB in float32. Megatron reduces in float32 by default "
        "for bf16.",
        q114),
    entry(
        "q115", dict(psi_r_b=1.7, dp=16, gpus_per_node=8),
        "A rank's {psi_r_b}B gradients are reduced over dp = {dp}, one GPU on each node of "
        "{gpus_per_node} (InfiniBand NDR, 50 GB/s a GPU). How long in bf16 and in float32, as "
        "DDP's all-reduce and as the distributed optimizer's reduce-scatter?",
        "bf16: {bf_gb:.1f} GB, all-reduce {bf_ar_s:.4f} s, reduce-scatter {bf_rs_s:.4f} s. "
        "float32 (main_grad): {f32_gb:.1f} GB, {f32_ar_s:.4f} s and {f32_rs_s:.4f} s — "
        "{ratio:.3f}x: a ring moves 2(n − 1)/n·S (an all-reduce) or (n − 1)/n·S (a "
        "reduce-scatter), so the time follows the bytes, latency aside, and the distributed "
        "optimizer's float32 reduce-scatter costs about what DDP's bf16 all-reduce does. It "
        "hides only behind enough backward.",
        q115),
    entry(
        "q116", dict(amax=37.5),
        "FP8 training: what are E4M3's and E5M2's largest value, smallest normal and "
        "subnormal and epsilon, and with one scaling factor for a tensor whose largest "
        "magnitude is {amax}, which of its values keep full precision?",
        "E4M3: max {e4_max:g}, normal from {e4_normal:g}, subnormal {e4_sub:g}, epsilon "
        "{e4_eps:g} ({e4_binades:.1f} binades); E5M2: {e5_max:g}, {e5_normal:.4g}, "
        "{e5_sub:.4g}, {e5_eps:g} ({e5_binades:.1f}). The factor maps {amax} to 448: s = "
        "{scale:.4f}. Values of magnitude ≥ {kept_normal:.4g} stay normal (3 mantissa "
        "bits); below that they are subnormals, and below {kept_any:.3g} zero. One outlier "
        "sets s for the whole tensor — hence per-tile factors.",
        q116),
    entry(
        "q117", dict(outlier=4000, channels=1024, tokens=48),
        "Activations ({tokens} tokens × {channels} channels) have one outlier channel "
        "{outlier}x larger than the rest. Quantized to E4M3, how does one factor per tensor "
        "compare with DeepSeek-V3's one factor per 1 × 128 tile?",
        "The other channels' relative error: {tensor_err:.4f} per tensor, {tensor_zero:.2%} "
        "of them zero — the outlier pushes them toward E4M3's subnormals — against "
        "{tile_err:.4f} and {tile_zero:.2%} with {tiles} tiles a row, where only the "
        "outlier's own tile shares its factor. DeepSeek-V3 uses such tiles for activations "
        "(128 × 128 blocks for weights), E4M3 throughout, and float32 accumulation.",
        q117),
    entry(
        "q118", dict(n=20000),
        "A kernel converts float32 to bf16 by truncating the low 16 bits instead of "
        "rounding. Over {n:,} values drawn uniformly from [1, 2), what is the mean error of "
        "each conversion, and the error of their sum?",
        "Truncation always moves toward zero: mean error {trunc_mean:.3e} (about half the "
        "step {step:g}), so the sum is off by {trunc_sum:.2f}. Round to nearest, ties to "
        "even: mean {rne_mean:.2e}, sum off by {rne_sum:.3f} — unbiased. A bias adds up "
        "over a reduction or an accumulation; noise mostly cancels.",
        q118),
]
