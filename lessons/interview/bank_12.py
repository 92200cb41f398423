"""Interview questions on lesson 12 (activation recomputation), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 12`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the planner (minipar.plan: a
layer's activation bytes, checkpoint segments and the best segment, the FLOP counts,
rank_memory and step_time) and from runs on simulated devices (the trace's FLOPs under
recomputation, the gradients when a rerun replays its dropout masks and when it does not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from types import SimpleNamespace
from unittest import mock

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.plan import (CLUSTERS, MODELS, Layout, activation_bytes_per_layer, best_segment,
                          model_flops, model_flops_full_recompute, rank_memory,
                          segments_activation_bytes, selective_recompute_extra_flops,
                          sqrt_rule, step_time)
from minipar.plan.rank_memory import layer_activation_bytes

GB, GiB, MiB = 10**9, 2**30, 2**20
H100, A100 = CLUSTERS["h100"], CLUSTERS["a100"]


def layer(s, b, h, a, recompute="none", **kw) -> float:
    """Bytes a GPT layer keeps, bf16 (Korthikanti et al.; plan.activation_bytes_per_layer)."""
    return activation_bytes_per_layer(s, b, h, a, recompute, **kw)


# ---- runs on simulated devices ----------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def trace_flops(layers: int, h: int, a: int, s: int, vocab: int, B: int, recompute: str) -> dict:
    """One forward and backward of a bf16 GPT on one device: the trace's FLOPs in all, of
    the blocks (every matmul but the head's) and of the backward."""
    cfg = GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=a, num_layers=layers,
                    dtype="bfloat16", recompute=recompute)
    ids = np.random.default_rng(130).integers(0, vocab, (s, B))
    with mp.device() as ctx:
        model = GPT(cfg)
        loss, cache = model.forward(ids, np.roll(ids, -1, axis=0))
        middle = len(ctx.trace.events)
        model.backward(cache)
        events = ctx.trace.events
        return {"total": sum(e.flops for e in events),
                "blocks": sum(e.flops for e in events if not e.label.startswith("lm_head")),
                "backward": sum(e.flops for e in events[middle:])}


@functools.lru_cache(maxsize=None)
def gradients(layers: int, h: int, a: int, s: int, vocab: int, B: int, dropout: float,
              recompute: str, fresh_masks: bool) -> tuple[float, dict]:
    """(the loss, every parameter's gradient) of one float64 step on one device; with
    fresh_masks, a full recomputation whose rerun draws new dropout masks (the block's copy
    of the generator replaced by a new one: the bug)."""
    cfg = GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=a, num_layers=layers,
                    dropout=dropout, recompute=recompute)
    ids = np.random.default_rng(141).integers(0, vocab, (s, B))
    fresh = SimpleNamespace(deepcopy=lambda rng: np.random.default_rng(1410))
    with mp.device(), (mock.patch("minipar.nn.block.copy", fresh) if fresh_masks
                       else contextlib.nullcontext()):
        model = GPT(cfg)
        loss = model.loss_and_grad(ids, np.roll(ids, -1, axis=0), np.random.default_rng(7))
        return loss, {n: p.grad.copy() for n, p in model.named_parameters().items()}


def relative_error(grads: dict, reference: dict) -> float:
    """||g − g_ref|| / ||g_ref|| over every parameter's gradient."""
    diff = sum(float(np.sum((grads[n] - g) ** 2)) for n, g in reference.items())
    return math.sqrt(diff / sum(float(np.sum(g ** 2)) for g in reference.values()))


# ---- the questions' numbers ---------------------------------------------------------------------
def q119(s, b, h, a, t):
    """Korthikanti et al.'s Table 2: a layer's bytes on a tp rank, without and with SP."""
    one = layer(s, b, h, a)
    tp = {r: layer(s, b, h, a, r, tp=t) for r in ("none", "selective")}
    sp = {r: layer(s, b, h, a, r, tp=t, sequence_parallel=True) for r in ("none", "selective")}
    between = (tp["selective"] - sp["selective"]) * t / (t - 1)  # the 10sbh SP splits
    return {"one_gb": one / GB, "none_tp_gb": tp["none"] / GB, "x_tp": one / tp["none"],
            "sel_tp_gb": tp["selective"] / GB, "share": between / tp["selective"],
            "none_sp_gb": sp["none"] / GB, "sel_sp_gb": sp["selective"] / GB}


def q120(s, b, h, a):
    """A layer without dropout: 32sbh + 2as²b against the paper's 34sbh + 5as²b."""
    w, wo = layer(s, b, h, a), layer(s, b, h, a, dropout=False)
    sel_w, sel_wo = layer(s, b, h, a, "selective"), layer(s, b, h, a, "selective", dropout=False)
    return {"with_gb": w / GB, "without_gb": wo / GB, "less": 1 - wo / w,
            "share": (wo - sel_wo) / wo, "sel_gb": sel_wo / GB, "sel_drop_gb": sel_w / GB,
            "over": w / wo - 1}


def q121(sim_layers, sim_h, sim_s, sim_b, l, h, s, V):
    """Full recomputation's FLOPs: the trace of a simulated GPT, and the formula at scale."""
    run = {r: trace_flops(sim_layers, sim_h, 2, sim_s, 48, sim_b, r) for r in ("none", "full")}
    return {"sim_none": run["none"]["total"], "sim_full": run["full"]["total"],
            "sim_ratio": run["full"]["total"] / run["none"]["total"],
            "blocks_ratio": run["full"]["blocks"] / run["none"]["blocks"],
            "bwd_ratio": run["full"]["backward"] / run["none"]["backward"],
            "ratio": model_flops_full_recompute(1, s, l, h, V) / model_flops(1, s, l, h, V)}


def q122(s_short, s_long):
    """Selective recomputation's transient: one layer's scores rerun in its backward."""
    out = {}
    for tag, s in (("short", s_short), ("long", s_long)):
        model = dataclasses.replace(MODELS["llama3-70b"], seq_len=s)
        lay = Layout(tp=8, pp=4, dp=8, global_batch=512, sequence_parallel=True,
                     recompute="selective", distributed_optimizer=True)
        r = rank_memory(model, lay, H100, dropout=False)
        out[f"steady_{tag}"] = r.activations.steady / GiB
        out[f"rerun_{tag}"] = (r.activations.peak - r.activations.steady) / GiB
        if tag == "long":
            core = (layer_activation_bytes(model, s, 1, 8, True, "none", dropout=False)
                    - layer_activation_bytes(model, s, 1, 8, True, "selective", dropout=False))
            out["core_long"] = core / GiB
            out["freed_long"] = core / GiB - out["rerun_long"]
            out["total_long"] = r.peak / GiB
            out["fits_long"] = "fits" if r.fits else "does not fit in 80 GB"
    out["growth"] = out["rerun_long"] / out["rerun_short"]
    return out


def q123(h, a, l, V, target):
    """The sequence length at which Megatron's selective recomputation costs `target` of the
    step's FLOPs, by bisection on the planner's FLOP counts."""
    def share(s):
        return 2 * selective_recompute_extra_flops(1, s, l, h) / model_flops(1, s, l, h, V)

    lo, hi = 1.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) < target else (lo, mid)
    s = (lo + hi) / 2
    return {"s_star": s, "approx": 18 * h * target, "saved": 1 - layer(s, 1, h, a, "selective")
            / layer(s, 1, h, a), "qk": share(s) / 2}


def segment_rows(layers, s, b, h, a, A) -> dict:
    I = layer(s, b, h, a, "full")
    chen = max(1, round(math.sqrt(layers)))
    k = best_segment(layers, A, I)
    return {"r": A / I, "kstar": sqrt_rule(layers, A, I), "best": k,
            "best_gb": segments_activation_bytes(layers, k, A, I) / GB,
            "per_gb": segments_activation_bytes(layers, 1, A, I) / GB, "chen": chen,
            "chen_gb": segments_activation_bytes(layers, chen, A, I) / GB}


def q124(layers, s, b, h, a):
    """Checkpoint segments in a deep model, scores stored and with FlashAttention."""
    stored = segment_rows(layers, s, b, h, a, layer(s, b, h, a))
    flash = segment_rows(layers, s, b, h, a, layer(s, b, h, a, "selective") + 4 * a * s * b)
    return {"r_stored": stored["r"], "kstar_stored": stored["kstar"],
            "best_stored": stored["best"], "best_stored_gb": stored["best_gb"],
            "chen_stored_gb": stored["chen_gb"], "r_flash": flash["r"],
            "kstar_flash": flash["kstar"], "best_flash": flash["best"],
            "best_flash_gb": flash["best_gb"], "per_flash_gb": flash["per_gb"],
            "chen": stored["chen"], "chen_flash_gb": flash["chen_gb"]}


def q125(s, b, h, a):
    """The depths from which segments of 2, 3 and 4 are the best (FlashAttention, no
    dropout: A = 32sbh + 4asb), against the closed form's k(k − 1)·A/I."""
    A = layer(s, b, h, a, "selective", dropout=False) + 4 * a * s * b
    I = layer(s, b, h, a, "full", dropout=False)
    first, L = {}, 1
    while len(first) < 3:
        k = best_segment(L, A, I)
        for want in (2, 3, 4):
            if k >= want and want not in first:
                first[want] = L
        L += 1
    return {"r": A / I, "l2": first[2], "l3": first[3], "l4": first[4], "t2": 2 * A / I,
            "t3": 6 * A / I, "t4": 12 * A / I}


def q126(hfu, l, h, s, V):
    """MFU from a reported HFU, under full and under selective recomputation."""
    F = model_flops(1, s, l, h, V)
    full = model_flops_full_recompute(1, s, l, h, V) / F
    sel = 1 + 2 * selective_recompute_extra_flops(1, s, l, h) / F
    return {"ratio_full": full, "mfu_full": hfu / full, "ratio_sel": sel, "mfu_sel": hfu / sel}


def q127(batch):
    """Korthikanti et al.'s 22B on 8 A100s: full recomputation against SP + selective."""
    out = {}
    for tag, rec, sp in (("full", "full", False), ("sel", "selective", True),
                         ("none", "none", True)):
        lay = Layout(tp=8, micro_batch=batch, global_batch=batch, sequence_parallel=sp,
                     recompute=rec)
        st = step_time(MODELS["22b"], lay, A100)
        out[f"{tag}_s"], out[f"{tag}_mfu"], out[f"{tag}_hfu"] = st.seconds, st.mfu, st.hfu
        if tag == "none":
            out["none_gib"] = rank_memory(MODELS["22b"], lay, A100).peak / GiB
            del out["none_mfu"], out["none_hfu"]
    out["d_hfu"] = 100 * (out["sel_hfu"] - out["full_hfu"])
    out["slower"] = out["full_s"] / out["sel_s"] - 1
    return out


def q128(s, tp, dp):
    """FlashAttention with and without Megatron's selective recomputation, Llama 3 8B."""
    model = dataclasses.replace(MODELS["llama3-8b"], seq_len=s)
    out = {"stored_gib": layer_activation_bytes(model, s, 1, tp, True, "none", dropout=False)
           / GiB,
           "flash_gib": layer_activation_bytes(model, s, 1, tp, True, "none", dropout=False,
                                               core=False) / GiB,
           "sel_gib": layer_activation_bytes(model, s, 1, tp, True, "selective",
                                             dropout=False) / GiB}
    for rec in ("none", "selective"):
        for flash in (False, True):
            lay = Layout(tp=tp, dp=dp, global_batch=8 * dp, sequence_parallel=True,
                         recompute=rec, distributed_optimizer=True)
            st = step_time(model, lay, H100, dropout=False, flash_attention=flash)
            out[f"{'sel' if rec == 'selective' else 'none'}_{'fa' if flash else 'std'}_s"] = \
                st.seconds
    out["extra"] = out["sel_fa_s"] / out["none_fa_s"] - 1
    return out


def q129(layers, h, a, s):
    """Incident C as a recomputation question: groups of 2 layers under ZeRO-3."""
    I = layer(s, 1, h, a, "full", dropout=False)
    W = 2 * (12 * h * h + 13 * h)  # one GPT layer's bf16 weights, gathered whole
    out = {"i_mib": I / MiB, "w_mib": W / MiB}
    for tag, A in (("stored", layer(s, 1, h, a, dropout=False)),
                   ("flash", layer(s, 1, h, a, "selective", dropout=False) + 4 * a * s)):
        out[f"r_{tag}"] = A / I
        out[f"d_{tag}"] = (segments_activation_bytes(layers, 2, A, I)
                           - segments_activation_bytes(layers, 1, A, I)) / MiB
        out[f"z3_{tag}"] = (segments_activation_bytes(layers, 2, A + W, I)
                            - segments_activation_bytes(layers, 1, A + W, I)) / MiB
        out[f"k_{tag}"] = sqrt_rule(layers, A + W, I)
    out["best_flash"] = best_segment(layers, layer(s, 1, h, a, "selective", dropout=False)
                                     + 4 * a * s, I)
    return out


def q130(layers, h, s, B, p):
    """A rerun that draws fresh dropout masks: the loss the same, the gradients not."""
    shape = (layers, h, 2, s, 24, B)
    loss0, g0 = gradients(*shape, p, "none", False)
    loss1, g1 = gradients(*shape, p, "full", False)
    loss2, g2 = gradients(*shape, p, "full", True)
    loss3, g3 = gradients(*shape, 0.0, "full", True)
    _, g4 = gradients(*shape, 0.0, "none", False)
    return {"loss": loss0, "same_loss": "the same" if loss0 == loss1 == loss2 else "different",
            "err_right": relative_error(g1, g0), "err_bug": relative_error(g2, g0),
            "err_nodrop": relative_error(g3, g4)}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="12", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q119", dict(s=3000, b=2, h=6144, a=48, t=8),
        "A GPT layer (s = {s}, b = {b}, h = {h}, a = {a}, bf16, dropout) runs on tp = {t}. Why "
        "does each rank not keep 1/{t} of the layer's activations, and what does sequence "
        "parallelism change?",
        "On one device the layer keeps sbh(34 + 5as/h) = {one_gb:.2f} GB. Tensor parallelism "
        "splits what lies inside the column- and row-parallel blocks (Q, K, V, the "
        "projection's input, the MLP's 16sbh and the s² scores: 24sbh + 5as²b), but the 10sbh "
        "between them (the LayerNorms' inputs, the QKV and fc1 inputs, the residual masks) is "
        "whole on every rank: sbh(10 + 24/t + 5as/(ht)) = {none_tp_gb:.2f} GB, {x_tp:.2f}x "
        "less, not {t}x. With selective recomputation the unsplit 10sbh is {share:.0%} of a "
        "rank's {sel_tp_gb:.3f} GB. Sequence parallelism splits it along s: "
        "sbh(34/t + 5as/(ht)) = {none_sp_gb:.2f} GB, and {sel_sp_gb:.3f} GB selective.",
        q119),
    entry(
        "q120", dict(s=4096, b=3, h=5120, a=40),
        "Llama-style models train without dropout. What does a layer (s = {s}, b = {b}, h = "
        "{h}, a = {a}, bf16) keep then, against Korthikanti et al.'s sbh(34 + 5as/h)?",
        "No dropout, no masks (the residual dropouts' 2sbh and the attention dropout's "
        "as²b), and the dropped probabilities are the softmax output itself, kept once: "
        "32sbh + 2as²b. Here {without_gb:.2f} GB a layer instead of {with_gb:.2f} GB "
        "({less:.0%} less), the scores {share:.0%} of it. Selective recomputation keeps 32sbh "
        "= {sel_gb:.3f} GB ({sel_drop_gb:.3f} GB, 34sbh, with dropout). The paper's formula "
        "overstates a dropout-free model by {over:.0%}.",
        q120),
    entry(
        "q121", dict(sim_layers=3, sim_h=24, sim_s=12, sim_b=5, l=60, h=7168, s=4096,
                     V=100000),
        "\"Full recomputation costs one more forward.\" By how much does it raise a training "
        "step's FLOPs? Count it on a simulated GPT ({sim_layers} layers, h = {sim_h}, "
        "2 heads, s = {sim_s}, b = {sim_b}, V = 48) and for l = {l}, h = {h}, s = {s}, V = {V}.",
        "A layer's forward is 24Bsh² + 4Bs²h FLOPs and its backward twice that, so "
        "rerunning the forward multiplies the layers' FLOPs by exactly 4/3; the logits layer "
        "(2BshV) is not rerun, so the step grows by less. The simulated step's trace counts "
        "{sim_none:,.0f} FLOPs without recomputation and {sim_full:,.0f} with it: "
        "x{sim_ratio:.4f} for the step, x{blocks_ratio:.4f} for the blocks, x{bwd_ratio:.4f} "
        "for the backward. At scale, 96Bslh²(1 + s/(6h) + V/(16lh)) over "
        "72Bslh²(1 + s/(6h) + V/(12lh)) = x{ratio:.4f}.",
        q121),
    entry(
        "q122", dict(s_short=8192, s_long=32768),
        "Llama 3 70B on tp 8, pp 4, dp 8 with SP, selective recomputation and the "
        "distributed optimizer (512 sequences a step): selective recomputation keeps no "
        "attention scores, so why does the first rank's activation peak grow faster than its "
        "kept activations from {s_short} to {s_long} tokens?",
        "Each layer's backward reruns its core and holds that layer's scores, e·a·s²·b/t, "
        "until it is done with them. The planner counts {steady_short:.1f} GiB kept at "
        "{s_short} tokens and +{rerun_short:.2f} GiB at the peak. At {s_long} the kept "
        "activations grow 4x ({steady_long:.1f} GiB) but the transient {growth:.0f}x: "
        "+{rerun_long:.1f} GiB, one layer's scores {core_long:.1f} GiB less the "
        "{freed_long:.2f} GiB its backward freed before reaching them. The rank peaks at "
        "{total_long:.0f} GiB: it {fits_long}. FlashAttention has no such moment: the scores "
        "never exist whole.",
        q122),
    entry(
        "q123", dict(h=5120, a=40, l=48, V=50257, target=0.1),
        "For a GPT with h = {h}, a = {a}, l = {l}, V = {V}, from what sequence length does "
        "Megatron's selective recomputation cost {target:.0%} of a step's FLOPs?",
        "It reruns the attention core, 4Bs²h a layer, against 72Bslh²(1 + s/(6h) + "
        "V/(12lh)) for the step: about s/(18h) while s ≪ 6h ({approx:,.0f} tokens by that "
        "rule). Solved on the planner's counts: s = {s_star:,.0f} tokens, where it drops "
        "{saved:.1%} of a layer's bytes. minipar's rerun of Q Kᵀ alone would cost "
        "{qk:.1%}. At long context use FlashAttention: the same bytes kept, its own Q Kᵀ "
        "rerun inside the kernel, no s² traffic through memory.",
        q123),
    entry(
        "q124", dict(layers=88, s=3000, b=3, h=8192, a=64),
        "A model of {layers} layers (s = {s}, b = {b}, h = {h}, a = {a}, bf16, dropout) "
        "checkpoints segments of k layers. Which k, with the scores stored and with "
        "FlashAttention, and what does Chen et al.'s √L give?",
        "Segments of k hold (L/k − 1)·I + k·A at the worst moment (I = 2sbh a kept input, A a "
        "layer that keeps everything), smallest near k* = √(L·I/A). Scores stored: A = "
        "{r_stored:.1f} I, k* = {kstar_stored:.2f}, best k = {best_stored} "
        "({best_stored_gb:.2f} GB). FlashAttention: A = {r_flash:.2f} I, k* = "
        "{kstar_flash:.2f}, best k = {best_flash}: {best_flash_gb:.2f} GB against "
        "{per_flash_gb:.2f} GB per layer. Chen's √L = {chen} layers would hold "
        "{chen_stored_gb:.1f} GB and {chen_flash_gb:.1f} GB: √L is the optimum only when a "
        "layer keeps no more than its input.",
        q124),
    entry(
        "q125", dict(s=4096, b=1, h=5120, a=40),
        "With FlashAttention and no dropout (s = {s}, b = {b}, h = {h}, a = {a}), from how "
        "many layers are checkpoint segments of 2, 3 or 4 layers the best?",
        "Segments of k beat segments of k − 1 when L > k(k − 1)·A/I (k dividing L; the "
        "shorter last segment shifts it a little). Here A = 32sbh + 4asb = {r:.3f} I, so "
        "segments of 2 are the best from L = {l2} layers (2A/I = {t2:.1f}), of 3 from {l3} "
        "(6A/I = {t3:.1f}), of 4 from {l4} (12A/I = {t4:.0f}). Real models (up to ~126 layers) "
        "want per-layer checkpoints or segments of 2.",
        q125),
    entry(
        "q126", dict(hfu=0.58, l=80, h=8192, s=4096, V=64000),
        "A report quotes {hfu:.0%} HFU for a GPT (l = {l}, h = {h}, s = {s}, V = {V}) trained "
        "with full recomputation. What is its MFU, and what would the same HFU mean under "
        "selective recomputation?",
        "Both divide by the same step · GPUs · peak, so MFU = HFU × model / hardware FLOPs, "
        "a property of the shape. Full recomputation: F_full/F = {ratio_full:.4f}, so "
        "{hfu:.0%} HFU is {mfu_full:.1%} MFU. Selective (Megatron's 4Bs²h a layer): "
        "{ratio_sel:.4f}, {mfu_sel:.1%} MFU.",
        q126),
    entry(
        "q127", dict(batch=4),
        "Korthikanti et al.'s 22B on 8 A100s (tp 8, b = B = {batch}): full recomputation, or "
        "sequence parallelism with selective recomputation? Compare HFU, MFU and the step.",
        "Full recomputation steps in {full_s:.2f} s at {full_hfu:.1%} HFU but {full_mfu:.1%} "
        "MFU; SP with selective in {sel_s:.2f} s at {sel_hfu:.1%} HFU, {sel_mfu:.1%} MFU. "
        "The HFUs differ by {d_hfu:.1f} points, the steps by {slower:.0%}: HFU says the GPUs "
        "are as busy, MFU that a quarter of full recomputation's work is the forward again. "
        "Without recomputation the rank peaks at {none_gib:.0f} GiB and would step in "
        "{none_s:.2f} s, but does not fit.",
        q127),
    entry(
        "q128", dict(s=16384, tp=4, dp=2),
        "A Llama 3 8B run at {s} tokens (tp = {tp} with SP, dp = {dp}) uses FlashAttention "
        "and Megatron's selective recomputation. What does the selective recomputation buy?",
        "Nothing: a layer keeps {stored_gib:.2f} GiB with the scores stored, {sel_gib:.3f} "
        "GiB with selective recomputation and {flash_gib:.3f} GiB with FlashAttention alone, "
        "which never writes the scores and reruns Q Kᵀ inside its kernel. The step: "
        "{none_std_s:.2f} s with stored scores ({sel_std_s:.2f} s selective), "
        "{none_fa_s:.2f} s with FlashAttention and {sel_fa_s:.2f} s with both: {extra:.1%} "
        "for no memory. Turn it off; keep full recomputation for when even the 34sbh does "
        "not fit.",
        q128),
    entry(
        "q129", dict(layers=44, h=6144, a=48, s=2048),
        "Incident C, as a recomputation question: a model of {layers} layers (h = {h}, "
        "a = {a}, s = {s}, b = 1, no dropout) under ZeRO-3 checkpoints \"in groups of 2 "
        "layers\" instead of per layer. Does that lower the peak?",
        "Segments of 2 keep half the inputs (I = {i_mib:.0f} MiB each) and rerun 2 layers at "
        "once; under ZeRO-3 both layers' weights are whole during the rerun (W = {w_mib:,.0f} "
        "MiB each), so each layer a segment adds costs A + W: k* = √(L·I/(A + W)). Scores "
        "stored (A = {r_stored:.1f} I): {d_stored:+,.0f} MiB of activations, {z3_stored:+,.0f} "
        "MiB with the weights, k* = {k_stored:.2f}. FlashAttention (A = {r_flash:.2f} I): "
        "{d_flash:+,.0f} MiB alone (best k {best_flash} without ZeRO-3), {z3_flash:+,.0f} MiB "
        "with the weights, k* = {k_flash:.2f}. Per-layer checkpoints were already optimal; "
        "the fix was limit_all_gathers.",
        q129),
    entry(
        "q130", dict(layers=2, h=16, s=8, B=3, p=0.1),
        "After turning on full recomputation, a run's loss matches the old run but its "
        "gradients do not. On a simulated GPT ({layers} layers, h = {h}, s = {s}, b = {B}, "
        "dropout {p}, float64), what is the bug and how big is it?",
        "The rerun drew fresh dropout masks: the backward differentiated a different network "
        "than the forward ran. The loss is {same_loss} in all runs ({loss:.6f}): the forward "
        "is untouched, so the loss curve cannot show it. Replaying the generator's copy, the "
        "gradients differ from no recomputation by {err_right:.1e} (bit for bit the same); "
        "with fresh masks by {err_bug:.0%}; with dropout off by {err_nodrop:.1e}, which is why "
        "a dropout-free test misses it. Save the generator's state with the input and restore "
        "it for the rerun (Megatron's RNG tracker).",
        q130),
]
