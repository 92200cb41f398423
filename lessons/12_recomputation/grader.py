"""Grader for lesson 12: your count of a layer's activation bytes against
plan.activation_bytes_per_layer (tensor and sequence parallelism, each recomputation mode,
with and without dropout); your checkpoint segments' peak and best segment size against
plan.segments_activation_bytes over every k; your HFU from MFU against the planner's FLOP
counts; and your recomputation plan run on the ledger of a simulated device, against its
budget and the fewest FLOPs a plan that fits can take.
A wrong answer is compared with the known mistakes, on the drawn case and on a few fixed
ones, and the one it makes is named."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from hypothesis import example, given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_number,
                                    expect_within, learner)
from minipar.nn import GPT, GPTConfig
from minipar.plan import (activation_bytes_per_layer, model_flops, model_flops_full_recompute,
                          segments_activation_bytes, selective_recompute_extra_flops,
                          sqrt_rule)
from minipar.plan.training_memory import training_memory


def relative(got: float, want: float) -> float:
    return abs(got - want) / abs(want) if want else abs(got)


def diagnose(impl_call, variants: dict, probes: list, case, got: float, truth,
             close) -> str:
    """The hint of the first known mistake (variants: name -> (value(case), hint)) that
    your value makes on the drawn case and on every probe where that mistake shows."""
    for name, (value, hint) in variants.items():
        wrong = value(case)
        if wrong is None or close(wrong, truth(case)) or not close(got, wrong):
            continue
        if all(close(impl_call(p), value(p)) for p in probes
               if value(p) is not None and not close(value(p), truth(p))):
            return hint
    return ""


# ---- exercise 12.1: a layer's activation bytes ---------------------------------------------

def layer_variant(s, b, h, a, t, sp, rec, dropout, bug=None) -> float:
    """A layer's bytes on one tp rank (Korthikanti et al.'s Table 2) with one mistake of
    LAYER_MISTAKES switched on (None: the right count)."""
    split = t if sp else 1
    if bug == "sp_ignored":
        split = 1
    elif bug == "all_split":
        split = t
    elif bug == "no_tp":
        t = split = 1
    sbh = s * b * h
    if rec == "full":
        if bug == "full_split":
            return 2 * sbh / t
        if bug == "full_whole":
            return 2 * sbh
        return 2 * sbh / split
    drops = dropout or bug in ("dropout_ignored", "masks_always")
    between = (8 + (2 if drops else 0)) * sbh / split
    inside = 24 * sbh / (1 if bug == "core_only_tp" else t)
    if rec == "selective" and bug != "selective_core":
        return between + inside
    five = dropout or bug in ("dropout_ignored", "core5_always")
    core = (5 if five else 2) * a * s * s * b / (1 if bug == "core_whole" else t)
    return between + inside + core


LAYER_MISTAKES = {
    "core_only_tp": "you divided only the attention scores by t: tensor parallelism splits "
                    "everything inside the column- and row-parallel blocks — Q, K, V, the "
                    "projection's input, GeLU's and fc2's inputs, 24sbh in all — by t as "
                    "well: sbh(10 + 24/t + 5as/(ht))",
    "all_split": "you divided the 10sbh between the blocks by t without sequence parallelism: "
                 "the LayerNorms' inputs, the QKV and fc1 inputs and the residual masks are "
                 "whole on every tp rank unless sequence parallelism splits them along s",
    "sp_ignored": "sequence parallelism also splits the 10sbh between the blocks along s: "
                  "sbh(34/t + 5as/(ht)) with SP, and a full recomputation's kept input 2sbh/t",
    "dropout_ignored": "without dropout a layer keeps no masks, and the dropped probabilities "
                       "are the softmax output itself, kept once: 32sbh + 2as²b on one "
                       "device, not 34sbh + 5as²b",
    "masks_always": "without dropout there are no dropout masks (the 2sbh of the residual "
                    "dropouts): the layer keeps 32sbh besides its scores, not 34sbh",
    "core5_always": "without dropout the attention core keeps the softmax output alone, "
                    "2as²b/t (no mask, no dropped copy), not 5as²b/t",
    "selective_core": "selective recomputation drops exactly the attention core's s² tensors "
                      "(5as²b/t, or 2as²b/t without dropout): they are rerun in the backward",
    "full_split": "full recomputation keeps the layer's input, which is whole on every tp "
                  "rank without sequence parallelism: 2sbh (2sbh/t only with SP)",
    "full_whole": "under sequence parallelism the kept input is the rank's s/t rows: 2sbh/t",
    "core_whole": "the attention core is split by heads: each tp rank keeps its a/t heads' "
                  "scores, 5as²b/t",
    "no_tp": "you returned one device's count: tensor parallelism over t ranks divides the "
             "24sbh inside the blocks and the scores by t (and sequence parallelism the "
             "10sbh between them)",
}
FORMULA_12_1 = ("per layer and tp rank, bf16: none sbh(10/sp + 24/t) + 5as²b/t, the 10 being "
                "8 + 2 masks and the 5 2 + 1 + 2 with dropout (8 and 2 without), sp = t "
                "under sequence parallelism else 1; selective without the scores; full 2sbh/sp")
LAYER_PROBES = [  # (s, b, h, a, t, sp, recompute, dropout)
    (2048, 1, 4096, 32, 4, False, "none", True), (2048, 1, 4096, 32, 4, True, "none", True),
    (1024, 2, 2048, 16, 2, False, "selective", True), (1024, 2, 2048, 16, 2, True, "selective", True),
    (4096, 1, 4096, 32, 8, False, "full", True), (4096, 1, 4096, 32, 8, True, "full", True),
    (2048, 3, 6144, 48, 4, False, "none", False), (2048, 3, 6144, 48, 4, True, "selective", False),
    (512, 1, 1024, 8, 1, False, "none", False), (512, 1, 1024, 8, 1, False, "selective", False),
]


def layer_truth(case) -> float:
    s, b, h, a, t, sp, rec, dropout = case
    return activation_bytes_per_layer(s, b, h, a, rec, 2, dropout, t, sp)


def layer_call(impl, case) -> float:
    s, b, h, a, t, sp, rec, dropout = case
    what = (f"layer_activation_bytes(s={s}, b={b}, h={h}, a={a}, tp={t}, "
            f"sequence_parallel={sp}, recompute={rec!r}, dropout={dropout})")
    got = learner(what, impl.layer_activation_bytes, s, b, h, a, t, sp, rec, dropout)
    return expect_number(got, what=what)


def exact(x: float, y: float) -> bool:
    return relative(x, y) <= 1e-9


@exercise("12.1", "a layer's activation bytes per rank and mode")
@SETTINGS
@example(s=2048, b=1, h=4096, a=32, t=1, sp=False, rec="none", dropout=True)
@example(s=2048, b=2, h=4096, a=32, t=4, sp=False, rec="none", dropout=True)
@example(s=1024, b=1, h=2048, a=16, t=2, sp=True, rec="selective", dropout=False)
@example(s=4096, b=1, h=4096, a=32, t=8, sp=False, rec="full", dropout=True)
@given(s=st.sampled_from([2048, 512, 4096, 3000]), b=st.sampled_from([1, 2, 3]),
       h=st.sampled_from([4096, 1024, 6144, 12288]), a=st.sampled_from([32, 8, 48, 96]),
       t=st.sampled_from([2, 4, 8, 1]), sp=st.booleans(),
       rec=st.sampled_from(["none", "selective", "full"]), dropout=st.booleans())
def check_layer_activation_bytes(impl, s, b, h, a, t, sp, rec, dropout):
    case = (s, b, h, a, t, sp, rec, dropout)
    want, got = layer_truth(case), layer_call(impl, case)
    if exact(got, want):
        return
    variants = {bug: (lambda c, bug=bug: layer_variant(*c, bug=bug), hint)
                for bug, hint in LAYER_MISTAKES.items()}
    hint = diagnose(lambda c: layer_call(impl, c), variants, LAYER_PROBES, case, got,
                    layer_truth, exact) or FORMULA_12_1
    sbh = s * b * h
    raise GradeFailure(
        f"layer_activation_bytes(s={s}, b={b}, h={h}, a={a}, tp={t}, sequence_parallel={sp}, "
        f"recompute={rec!r}, dropout={dropout}): expected {want:,.0f} B = {want / sbh:.4g} sbh "
        f"(plan.activation_bytes_per_layer), received {got:,.0f} B = {got / sbh:.4g} sbh. "
        f"{hint}")


# ---- exercise 12.2: checkpoint segments' peak and the best segment size --------------------

def sizes_of(L: int, k: int) -> list[int]:
    return [min(k, L - start) for start in range(0, L, k)]


PEAK_MISTAKES = {  # name -> (peak(L, k, A, I), hint)
    "no_rerun": (lambda L, k, A, I: (len(sizes_of(L, k)) - 1) * I,
                 "you forgot the k·A of the segment being recomputed: in the backward the "
                 "top segment's k layers are rerun keeping everything, on top of the inputs "
                 "of the segments below it: (L/k − 1)·I + k·A"),
    "inputs_only": (lambda L, k, A, I: len(sizes_of(L, k)) * I,
                    "you counted the inputs the forward keeps and forgot the k·A of the "
                    "segment being recomputed: the peak is in the backward, (L/k − 1)·I + k·A"),
    "all_inputs": (lambda L, k, A, I: len(sizes_of(L, k)) * I + min(k, L) * A,
                   "the rerun segment's own input is inside its first layer's A: the peak is "
                   "(L/k − 1)·I + k·A, not (L/k)·I + k·A"),
    "even": (lambda L, k, A, I: (L / k - 1) * I + k * A,
             "when k does not divide L the last segment is shorter: the peak is the largest "
             "m·I + k_m·A over the segments m = 0, 1, ... (k_m layers in segment m), and one "
             "segment of all L layers when k ≥ L"),
    "ceil": (lambda L, k, A, I: (len(sizes_of(L, k)) - 1) * I + min(k, L) * A,
             "when k does not divide L the last segment is shorter: the peak is the largest "
             "m·I + k_m·A over the segments m = 0, 1, ... (k_m layers in segment m), and the "
             "top segment need not be the worst"),
}


def best_of(L: int, A: float, I: float) -> set:
    """Every k in 1..L whose peak is the smallest."""
    peaks = {k: segments_activation_bytes(L, k, A, I) for k in range(1, L + 1)}
    low = min(peaks.values())
    return {k for k, v in peaks.items() if v == low}


BEST_MISTAKES = {  # name -> (k(L, A, I), hint)
    "chen": (lambda L, A, I: max(1, min(L, round(math.sqrt(L)))),
             "Chen et al.'s √L is the best segment only for a chain whose layers keep no more "
             "than their inputs (A = I); a transformer layer keeps A ≫ I, and the best k is "
             "near √(L·I/A)"),
    "rounded": (lambda L, A, I: max(1, min(L, round(math.sqrt(L * I / A)))),
                "rounding √(L·I/A) is not enough: compare the peaks of the integer k around it "
                "(the shorter last segment included); segments of k beat k − 1 when "
                "L > k(k − 1)·A/I"),
    "floor": (lambda L, A, I: max(1, min(L, math.floor(math.sqrt(L * I / A)))),
              "flooring √(L·I/A) is not enough: compare the peaks of the integer k around it "
              "(the shorter last segment included)"),
    "ceil_sqrt": (lambda L, A, I: max(1, min(L, math.ceil(math.sqrt(L * I / A)))),
                  "rounding √(L·I/A) up is not enough: compare the peaks of the integer k "
                  "around it (the shorter last segment included)"),
    "one": (lambda L, A, I: 1,
            "segments of 1 (full recomputation) are best only while L ≤ 2A/I: segments of k "
            "beat segments of k − 1 when L > k(k − 1)·A/I, so a deep model wants k > 1"),
    "all": (lambda L, A, I: L,
            "one segment of all L layers reruns them all at once, as much as no "
            "recomputation keeps: you forgot the k·A of the segment being recomputed"),
}
SHAPES = {  # name -> (A, I) of a layer in bf16, b = 1: the kept input I = 2sbh
    "GPT-3 175B, s = 2048, scores stored": (
        activation_bytes_per_layer(2048, 1, 12288, 96), activation_bytes_per_layer(
            2048, 1, 12288, 96, "full")),
    "a 13B layer, s = 2048, FlashAttention, no dropout": (
        activation_bytes_per_layer(2048, 1, 5120, 40, "selective", dropout=False)
        + 4 * 40 * 2048, activation_bytes_per_layer(2048, 1, 5120, 40, "full", dropout=False)),
    "a 7B layer, s = 4096, selective": (
        activation_bytes_per_layer(4096, 1, 4096, 32, "selective"),
        activation_bytes_per_layer(4096, 1, 4096, 32, "full")),
    "a chain whose layers keep their input alone": (1000.0, 1000.0),
    "a layer keeping 3 times its input": (3000.0, 1000.0),
}
SEGMENT_PROBES = [(40, 3), (96, 4), (7, 3), (128, 5), (64, 6), (10, 12), (300, 3), (36, 2),
                  (104, 4), (118, 5)]


@exercise("12.2", "checkpoint segments' peak and the best segment size")
@SETTINGS
@example(L=8, k=2, shape="a chain whose layers keep their input alone")
@example(L=40, k=3, shape="a 13B layer, s = 2048, FlashAttention, no dropout")
@example(L=35, k=3, shape="a 7B layer, s = 4096, selective")
@given(L=st.integers(1, 160), k=st.integers(1, 24), shape=st.sampled_from(sorted(SHAPES)))
def check_segments(impl, L, k, shape):
    A, I = SHAPES[shape]
    ratio = f"A = {A / I:.4g} I ({shape})"

    def peak_of(L_, k_):
        what = f"segments_peak({L_}, {k_}, layer={A:,.0f}, kept={I:,.0f})"
        return expect_number(learner(what, impl.segments_peak, L_, k_, A, I), what=what)

    want, got = segments_activation_bytes(L, k, A, I), peak_of(L, k)
    if not exact(got, want):
        variants = {n: (lambda c, f=f: f(c[0], c[1], A, I), hint)
                    for n, (f, hint) in PEAK_MISTAKES.items()}
        hint = diagnose(lambda c: peak_of(*c), variants, SEGMENT_PROBES, (L, k), got,
                        lambda c: segments_activation_bytes(c[0], c[1], A, I), exact)
        sizes = sizes_of(L, k)
        raise GradeFailure(
            f"segments_peak({L}, {k}, layer={A:,.0f}, kept={I:,.0f}) with {ratio}: expected "
            f"{want:,.0f} B = {want / I:.4g} I (plan.segments_activation_bytes: segments of "
            f"{sizes[0]} layers" + (f", the last of {sizes[-1]}" if sizes[-1] != sizes[0] else "")
            + f"), received {got:,.0f} B = {got / I:.4g} I. "
            + (hint or "the peak is the largest m·I + k_m·A over the segments m"))
    what = f"best_segment_size({L}, layer={A:,.0f}, kept={I:,.0f})"
    got_k = learner(what, impl.best_segment_size, L, A, I)
    if isinstance(got_k, (bool, np.bool_)) or not isinstance(got_k, (int, np.integer)) \
            or not 1 <= got_k <= L:
        raise GradeFailure(f"{what} with {ratio} returned {got_k!r}; expected an int k in "
                           f"1..{L}")
    best = best_of(L, A, I)
    if int(got_k) in best:
        return
    kb = min(best)
    hint = ""
    for f, text in BEST_MISTAKES.values():
        if f(L, A, I) == got_k and all(
                learner(f"best_segment_size({L_}, ...)", impl.best_segment_size, L_, A, I)
                == f(L_, A, I) for L_, _ in SEGMENT_PROBES if f(L_, A, I) not in best_of(L_, A, I)):
            hint = text
            break
    raise GradeFailure(
        f"{what} with {ratio}: returned k = {got_k}, whose segments hold "
        f"{segments_activation_bytes(L, int(got_k), A, I):,.0f} B = "
        f"{segments_activation_bytes(L, int(got_k), A, I) / I:.4g} I; expected k = "
        f"{kb}{' (or ' + ', '.join(map(str, sorted(best - {kb}))) + ')' if len(best) > 1 else ''}"
        f": {segments_activation_bytes(L, kb, A, I):,.0f} B = "
        f"{segments_activation_bytes(L, kb, A, I) / I:.4g} I (√(L·I/A) = "
        f"{sqrt_rule(L, A, I):.3g}). " + (hint or "compare the peaks of every k"))


# ---- exercise 12.3: HFU from MFU -------------------------------------------------------------

TOLERANCE_12_3 = 1e-3  # utilisations are quoted to three digits


def hfu_truth(c) -> float:
    """plan.step_time's HFU/MFU for a GPT: the model FLOPs, and what recomputation adds —
    Megatron's whole core (4Bs²h a layer: Q Kᵀ and P·V), or every layer's forward."""
    mfu, B, s, l, h, V, rec = c
    model = model_flops(B, s, l, h, V)
    extra = {"none": 0.0, "selective": 2 * selective_recompute_extra_flops(B, s, l, h),
             "full": model_flops_full_recompute(B, s, l, h, V) - model}[rec]
    return mfu * (model + extra) / model


def hfu_variant(c, bug: str):
    mfu, B, s, l, h, V, rec = c
    model = model_flops(B, s, l, h, V)
    core = 4 * B * s * s * h * l
    extra = {"none": 0.0, "selective": core, "full": 24 * B * s * h * h * l + core}[rec]
    if bug == "same":
        return mfu
    if bug == "inverted":
        return mfu * model / (model + extra)
    if bug == "four_thirds":
        return mfu * 4 / 3 if rec == "full" else None
    if bug == "qk_only":
        return mfu * (model + core / 2) / model if rec == "selective" else None
    if bug == "full_no_core":
        return mfu * (model + 24 * B * s * h * h * l) / model if rec == "full" else None
    if bug == "selective_free":
        return mfu if rec == "selective" else None
    raise KeyError(bug)


HFU_MISTAKES = {
    "same": "HFU counts the recomputed FLOPs as well as the model's: HFU = MFU × (model + "
            "recomputed FLOPs) / model FLOPs; you returned the MFU",
    "inverted": "HFU is at least the MFU: the same step, GPUs and peak divide more FLOPs, "
                "MFU × (model + recomputed) / model",
    "four_thirds": "the logits layer is not rerun: F_full/F = (4/3)(1 + s/(6h) + V/(16lh)) / "
                   "(1 + s/(6h) + V/(12lh)), below 4/3 by the head's share",
    "qk_only": "plan.step_time counts Megatron-LM's selective recomputation, which reruns the "
               "whole attention core, Q Kᵀ and P·V: 4Bs²h a layer (2Bs²h is Q Kᵀ alone, "
               "minipar's own rerun)",
    "full_no_core": "full recomputation reruns each layer's whole forward, its two s² "
                    "matmuls (4Bs²h) with the 24Bsh² of its linears",
    "selective_free": "selective recomputation is not free: it reruns 4Bs²h a layer, about "
                      "s/(18h) of the step — negligible only while s ≪ h",
}
HFU_PROBES = [(0.45, 8, 8192, 32, 4096, 51200, "selective"),
              (0.45, 8, 8192, 4, 1024, 128256, "full"),
              (0.45, 8, 512, 24, 2048, 51200, "none"),
              (0.3, 1, 32768, 2, 512, 32000, "full")]


@exercise("12.3", "HFU from MFU under each recomputation mode")
@SETTINGS
@example(mfu=0.41, B=64, s=128, l=96, h=12288, V=51200, rec="selective")
@example(mfu=0.41, B=64, s=2048, l=96, h=12288, V=51200, rec="full")
@given(mfu=st.sampled_from([0.5, 0.21, 0.537]), B=st.sampled_from([8, 1, 64, 1536]),
       s=st.sampled_from([2048, 128, 8192, 32768]), l=st.sampled_from([24, 2, 96, 126]),
       h=st.sampled_from([4096, 512, 12288, 16384]), V=st.sampled_from([51200, 32000, 128256]),
       rec=st.sampled_from(["selective", "full", "none"]))
def check_hfu_from_mfu(impl, mfu, B, s, l, h, V, rec):
    def call(c):
        what = "hfu_from_mfu(mfu={}, B={}, s={}, l={}, h={}, V={}, recompute={!r})".format(*c)
        return expect_number(learner(what, impl.hfu_from_mfu, *c), what=what)

    case = (mfu, B, s, l, h, V, rec)
    want, got = hfu_truth(case), call(case)

    def close(x, y):
        return relative(x, y) <= TOLERANCE_12_3

    if close(got, want):
        return
    variants = {bug: (lambda c, bug=bug: hfu_variant(c, bug), hint)
                for bug, hint in HFU_MISTAKES.items()}
    hint = diagnose(call, variants, HFU_PROBES, case, got, hfu_truth, close)
    raise GradeFailure(
        f"hfu_from_mfu(mfu={mfu}, B={B}, s={s}, l={l}, h={h}, V={V}, recompute={rec!r}): "
        f"expected {want:.5f} (HFU/MFU = {want / mfu:.5f}, plan.step_time's FLOP counts), "
        f"received {got:.5f}: {100 * relative(got, want):.2f} % off. "
        + (hint or "HFU = MFU × (model + recomputed FLOPs) / model FLOPs"))


# ---- exercise 12.4: the cheapest recomputation within a memory budget -----------------------

def gpt(layers: int, s: int, h: int, a: int, vocab: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=a, num_layers=layers,
                     dtype="bfloat16")


# (the model, b, what the budget admits first): "none" fits; "selective" fits, none does not;
# "full": full recomputation fits, selective does not; "best": only the best segment size fits
PLAN_CASES = [
    (gpt(4, 16, 32, 2, 32), 2, "none"),
    (gpt(6, 64, 16, 4, 32), 1, "selective"),
    (gpt(6, 64, 16, 4, 32), 2, "full"),
    (gpt(4, 16, 32, 2, 32), 1, "selective"),
    (gpt(40, 8, 16, 2, 16), 2, "full"),
    (gpt(40, 8, 16, 2, 16), 1, "best"),
    (gpt(112, 4, 16, 2, 16), 1, "best"),
]


@lru_cache(maxsize=None)
def run_plan(cfg: GPTConfig, b: int, recompute: str, k: int) -> tuple[int, float]:
    """(the ledger's activation peak, the trace's FLOPs) of one forward and backward."""
    ids = np.random.default_rng(12).integers(0, cfg.vocab_size, (cfg.seq_len, b))
    with mp.device() as ctx:
        GPT(cfg.with_(recompute=recompute, recompute_segment=k)).loss_and_grad(
            ids, np.roll(ids, -1, axis=0))
        return ctx.ledger.peak("activations"), sum(e.flops for e in ctx.trace.events)


def planned(cfg: GPTConfig, b: int, recompute: str, k: int = 1) -> float:
    """The activation peak by the formulas (plan.training_memory: exact on the ledger)."""
    return training_memory(cfg.num_parameters(), 1, b, cfg.seq_len, cfg.num_layers, cfg.hidden,
                           cfg.num_heads, cfg.vocab_size, cfg.dtype, recompute,
                           k).activations


@lru_cache(maxsize=None)
def plan_reference(index: int) -> dict:
    """The case's budget, each mode's peak and FLOPs, and the fewest FLOPs that fit."""
    cfg, b, target = PLAN_CASES[index]
    L = cfg.num_layers
    seg = {k: planned(cfg, b, "segments", k) for k in range(1, L + 1)}
    ranked = sorted(seg, key=lambda k: (seg[k], k))
    none_peak = planned(cfg, b, "none")
    sel_peak = run_plan(cfg, b, "selective", 1)[0]
    budget = {"none": none_peak + 4096, "selective": (sel_peak + none_peak) // 2,
              "full": (seg[1] + sel_peak) // 2,
              "best": (seg[ranked[0]] + seg[ranked[1]]) // 2}[target]
    s, h, V = cfg.seq_len, cfg.hidden, cfg.vocab_size
    flops = {"none": model_flops(b, s, L, h, V),
             "selective": model_flops(b, s, L, h, V) + selective_recompute_extra_flops(b, s, L, h),
             "full": model_flops_full_recompute(b, s, L, h, V)}
    fits = [m for m, p in (("none", none_peak), ("selective", sel_peak),
                           ("full", seg[ranked[0]])) if p <= budget]
    A = activation_bytes_per_layer(s, b, h, cfg.num_heads, "none", dropout=False)
    I = activation_bytes_per_layer(s, b, h, cfg.num_heads, "full", dropout=False)
    return {"budget": int(budget), "peaks": {"none": none_peak, "selective": sel_peak},
            "segments": seg, "best_k": ranked[0], "flops": flops, "cheapest": fits[0],
            "A": A, "I": I}


def read_plan(plan, cfg: GPTConfig, what: str) -> tuple[str, int]:
    if not isinstance(plan, dict) or "recompute" not in plan:
        raise GradeFailure(f"{what} returned {plan!r:.100}; expected a dict like "
                           f"{{'recompute': 'segments', 'recompute_segment': 2}}")
    extra = set(plan) - {"recompute", "recompute_segment"}
    if extra:
        raise GradeFailure(f"{what} returned the keys {sorted(extra)}: a plan sets "
                           f"'recompute' and 'recompute_segment' only (the model is given)")
    rec, k = plan["recompute"], plan.get("recompute_segment", 1)
    try:
        cfg.with_(recompute=rec, recompute_segment=k)
    except (ValueError, TypeError) as e:
        raise GradeFailure(f"{what} returned {plan}, which GPTConfig refuses: {e}") from None
    return rec, int(k)


def over_budget_advice(cfg: GPTConfig, ref: dict, rec: str, k: int) -> str:
    L, A, I = cfg.num_layers, ref["A"], ref["I"]
    best, seg = ref["best_k"], ref["segments"]
    tail = (f". The k with the smallest peak is {best} (√(L·I/A) = {sqrt_rule(L, A, I):.2f}): "
            f"the step's activations peak at {seg[best]:,.0f} B, within the budget")
    if rec in ("none", "selective"):
        kept = ("keeps every layer's A = 32sbh + 2as²b" if rec == "none" else
                "still keeps 32sbh a layer (the scores go, the linears' inputs stay)")
        return (f"{'no recomputation' if rec == 'none' else 'selective recomputation'} {kept}: "
                f"it does not fit this budget; full recomputation or segments do" + tail)
    text = ("full recomputation (segments of 1) holds (L − 1)·I + A = " if k == 1 else
            f"segments of {k} hold (L/k − 1)·I + k·A = ")
    text += (f"{segments_activation_bytes(L, k, A, I):,.0f} B of the blocks' activations here "
             f"(L = {L}, I = 2sbh = {I:,.0f} B, A = {A / I:g} I)")
    if k >= L:
        text += (f"; one segment of all {L} layers reruns them all at once, as much as no "
                 f"recomputation keeps")
    if k != 1 and k == round(math.sqrt(L)):
        text += (f"; Chen et al.'s √L = {math.sqrt(L):.2f} is the best segment for a chain whose "
                 f"layers keep no more than their inputs (A = I), not for a transformer layer")
    return text + tail


@exercise("12.4", "the cheapest recomputation within a memory budget")
def check_plan_recompute(impl):
    for index, (cfg, b, _) in enumerate(PLAN_CASES):
        ref = plan_reference(index)
        budget = ref["budget"]
        what = (f"plan_recompute(GPTConfig(num_layers={cfg.num_layers}, seq_len={cfg.seq_len}, "
                f"hidden={cfg.hidden}, num_heads={cfg.num_heads}), micro_batch={b}, "
                f"budget={budget:,})")
        plan = learner(what, impl.plan_recompute, cfg, b, budget)
        rec, k = read_plan(plan, cfg, what)
        peak, flops = run_plan(cfg, b, rec, k)
        expect_within(peak, budget, unit="B", what=f"{what} = {plan}: the activation peak",
                      hint=over_budget_advice(cfg, ref, rec, k))
        cheapest = ref["cheapest"]
        least = ref["flops"][cheapest]
        if flops > least * (1 + 1e-12):
            label = {"none": "no recomputation", "selective": "selective recomputation",
                     "full": "full recomputation"}[cheapest]
            peak_c = (ref["peaks"][cheapest] if cheapest != "full"
                      else ref["segments"][ref["best_k"]])
            raise GradeFailure(
                f"{what} = {plan}: its step runs {flops:,.0f} FLOPs, {flops / least - 1:.1%} "
                f"more than {label}, which fits the budget too (peak {peak_c:,.0f} B ≤ "
                f"{budget:,} B) with {least:,.0f} FLOPs. Recompute only what the budget "
                f"needs: no recomputation costs nothing, selective reruns Q Kᵀ (2Bs²h a "
                f"layer), full recomputation and segments of any k rerun every forward")
