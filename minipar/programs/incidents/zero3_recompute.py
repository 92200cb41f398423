"""Incident C: ZeRO-3 with activation checkpointing peaks above ZeRO-2.

The rule: ZeRO-3 saves memory only while few units are whole at once. Without a bound on
its all-gathers, the gathered weights of the units ahead pile up on top of the shards, the
recomputed forward's activations and the unit's full gradient, and the peak passes
ZeRO-2's, which keeps the whole model all along. `limit_all_gathers` restores the bound.

The case: a 13B model under ZeRO-3 with activation checkpointing peaked about 20 % above
ZeRO-2; `limit_all_gathers=True` and changing the checkpoint granularity "from per layer
to groups of 2 layers" brought it back. The rate limiter is PyTorch FSDP's (Zhao et al.
2023, "PyTorch FSDP"; the `limit_all_gathers` documentation: without it the CPU thread
issues all-gathers with no synchronization, so they run ahead of the GPU's compute and
their outputs stay allocated). Groups of 2 layers are checkpoint segments (Chen et al.
2016; nn/segments.py): keep the input of every second layer, and in the backward rerun
two layers at a time.

How the run reproduces it (one training step of one GPT, bf16, dp = 4 on one node, 40
layers as a 13B has):

    ZeRO-2            whole weights on every rank, per-layer checkpoints (recompute="full")
    ZeRO-3            per-layer checkpoints, forward and backward prefetch, no limit, and
                      the host running ahead: each prefetch reaches every later unit
                      (prefetch_depth = layers), as FSDP's CPU thread does when nothing
                      holds it back
    + limit           limit_all_gathers=True: at most 2 blocks whole or in flight
    + segments of 2   recompute="segments", recompute_segment=2, no limit
    + both            the seed's fix: the limit and segments of 2

Peaks are read from each rank's ledger (reset after the engine is built, so the full model
every rank builds before sharding is not counted) and the largest rank is shown. Sizes are
chosen for the mechanism: many thin layers and a short micro-batch, so that, as on a 13B
model with checkpointing, the weights dwarf the activations. What accounting alone gives:
a run-ahead holds about the whole model gathered plus its 2 Psi / N of shards, so at
N = 4 ZeRO-3 can pass ZeRO-2 by at most ~ (2/4) / (2 + 14/4) = 9 % of model state; the
seed's 20 % needs more than the ledger models (allocator fragmentation, for one).

Segments of 2 trade the two terms of the checkpointed activations (plan/memory.py): they
keep half as many inputs I = 2sbh, but rerun two layers of A bytes at once, so
(L/2 - 1) I + 2A against per layer (L - 1) I + A: lower only when L > 2A/I (34 layers on
this model, A = 17 I), by at most L I / 2 - A. The run prints what the ledger measures
beside the formula; under ZeRO-3 a segment's 2 blocks are also whole together for its
rerun. The FLOPs do not change: every layer is rerun once either way.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...nn import GPT, GPTConfig
from ...optim import AdamW
from ...parallel import zero_engine
from ...plan import activation_bytes_per_layer, best_segment, segments_activation_bytes, sqrt_rule
from ...plan.training_memory import training_memory
from ...runtime.launch import launch
from ...runtime.ledger import CATEGORIES, fmt_bytes
from ...runtime.topology import Topology
from .planned import plan_c, report_c

DP = 4
MICRO_BATCH = 1  # sequences per rank
SEGMENT = 2  # layers per checkpoint segment: the seed's "groups of 2 layers"
MODEL = GPTConfig(vocab_size=64, seq_len=16, hidden=64, num_heads=4, num_layers=40,
                  dtype="bfloat16", recompute="full", seed=0)
OPT = dict(lr=1e-3, weight_decay=0.1)


def scenarios(cfg: GPTConfig = MODEL) -> dict[str, tuple[str, GPTConfig, dict]]:
    """key -> (label, model config, engine kwargs)."""
    run_ahead = dict(forward_prefetch=True, backward_prefetch=True,
                     prefetch_depth=cfg.num_layers, limit_all_gathers=False)
    limited = dict(run_ahead, limit_all_gathers=True)
    segments = cfg.with_(recompute="segments", recompute_segment=SEGMENT)
    return {
        "zero2": ("ZeRO-2, per-layer checkpoints", cfg, dict(stage=2)),
        "zero3": ("ZeRO-3, no limit, run-ahead", cfg, dict(stage=3, **run_ahead)),
        "zero3_limit": ("ZeRO-3 + limit_all_gathers", cfg, dict(stage=3, **limited)),
        "zero3_segments": (f"ZeRO-3 + segments of {SEGMENT}", segments,
                           dict(stage=3, **run_ahead)),
        "zero3_both": ("ZeRO-3 + both (seed's fix)", segments, dict(stage=3, **limited)),
    }


def measure(cfg: GPTConfig, engine_kwargs: dict) -> dict[str, Any]:
    """One training step on DP ranks; the largest rank's ledger peaks (bytes, per category
    and "total"), its simulated step time and the FLOPs its clock was charged."""

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, AdamW, **engine_kwargs, **OPT)
        ctx.ledger.reset_peak()  # count from the sharded state, not the model built whole
        t0, n0 = ctx.clock.now, len(ctx.trace.events)
        rng = np.random.default_rng(ctx.rank)  # this rank's micro-batch
        ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, MICRO_BATCH))
        model.loss_and_grad(ids, np.roll(ids, -1, axis=0))
        engine.step()
        engine.zero_grad()
        ctx.resolve_pending()
        peak = {c: ctx.ledger.peak(c) for c in CATEGORIES}
        peak["total"] = ctx.ledger.peak()
        flops = sum(e.flops for e in ctx.trace.events[n0:])
        return {"peak": peak, "step_seconds": ctx.clock.elapsed() - t0, "flops": flops}

    per_rank = launch(program, DP, topology=Topology.single_node(DP))
    return max(per_rank, key=lambda r: r["peak"]["total"])


def planned_activations(cfg: GPTConfig, micro_batch: int = MICRO_BATCH) -> float:
    """The step's activation peak by the course's formula (plan/training_memory.py)."""
    return training_memory(cfg.num_parameters(), 1, micro_batch, cfg.seq_len, cfg.num_layers,
                           cfg.hidden, cfg.num_heads, cfg.vocab_size, cfg.dtype,
                           cfg.recompute, cfg.recompute_segment).activations


def segment_terms(layers: int, s: int, b: int, h: int, a: int, dropout: bool = False,
                  segment: int = SEGMENT) -> dict[str, float]:
    """I (a kept input), A (a layer rerun, everything kept), the blocks' peak per layer and
    in segments of k, the depth above which those beat per-layer checkpoints (kA/I: the
    difference is (k - 1)(L I / k - A)), the best k and sqrt(L I / A); bf16, plan/memory.py."""
    A = activation_bytes_per_layer(s, b, h, a, "none", dropout=dropout)
    I = activation_bytes_per_layer(s, b, h, a, "full", dropout=dropout)
    return {"I": I, "A": A, "per_layer": segments_activation_bytes(layers, 1, A, I),
            "segments": segments_activation_bytes(layers, segment, A, I),
            "threshold": segment * A / I, "best": best_segment(layers, A, I),
            "sqrt_rule": sqrt_rule(layers, A, I), "sqrt_l": layers ** 0.5}


def run(out: Callable[[str], Any] = print, cfg: GPTConfig = MODEL) -> dict[str, Any]:
    """Run every scenario, print the table and the explanation through `out`, and return
    {"model": {...}, "scenarios": {key: {"label", "peak", "total", "vs_zero2",
    "step_seconds", "flops", "planned_activations"}}, "terms": segment_terms(...)}."""
    results: dict[str, dict[str, Any]] = {}
    for key, (label, model_cfg, kwargs) in scenarios(cfg).items():
        r = measure(model_cfg, kwargs)
        results[key] = {"label": label, **r, "total": r["peak"]["total"],
                        "planned_activations": planned_activations(model_cfg)}
    base = results["zero2"]["total"]
    for r in results.values():
        r["vs_zero2"] = r["total"] / base
    model = {"layers": cfg.num_layers, "hidden": cfg.hidden, "heads": cfg.num_heads,
             "seq_len": cfg.seq_len, "vocab": cfg.vocab_size, "micro_batch": MICRO_BATCH,
             "dp": DP, "dtype": cfg.dtype, "parameters": cfg.num_parameters()}
    terms = segment_terms(cfg.num_layers, cfg.seq_len, MICRO_BATCH, cfg.hidden,
                          cfg.num_heads, cfg.dropout > 0)
    planned = plan_c()
    for line in report(model, results, terms) + report_c(planned):
        out(line)
    return {"model": model, "scenarios": results, "terms": terms, "planned": planned}


def report(model: dict, results: dict[str, dict], terms: dict) -> list[str]:
    """The table and the explanation, with the measured numbers."""
    shown = ["parameters", "gradients", "optimizer_states", "activations", "comm_buffers"]
    heads = ["params", "grads", "optim", "activ", "comm", "TOTAL", "vs ZeRO-2", "GFLOP"]
    lines = [
        "Incident C: ZeRO-3 + activation checkpointing peaks above ZeRO-2",
        f"GPT, {model['layers']} layers, hidden {model['hidden']}, {model['heads']} heads, "
        f"vocabulary {model['vocab']}: {model['parameters']:,} parameters in "
        f"{model['dtype']}; dp = {model['dp']} on one node, {model['micro_batch']} x "
        f"{model['seq_len']} tokens per rank, one step with AdamW",
        "peak bytes per rank (each category's own peak; TOTAL is the peak of the sum):",
        f"  {'':<30}" + "".join(f"{h:>11}" for h in heads),
    ]
    for r in results.values():
        cells = [fmt_bytes(r["peak"][c]) for c in shown] + [fmt_bytes(r["total"])]
        cells += [f"{100 * r['vs_zero2']:.1f} %", f"{r['flops'] / 1e9:.3f}"]
        lines.append(f"  {r['label']:<30}" + "".join(f"{c:>11}" for c in cells))
    pct = {k: 100 * (r["vs_zero2"] - 1) for k, r in results.items()}
    lines += [
        "",
        f"Why: ZeRO-3 holds 1/{model['dp']} of the weights, but with no limit the host runs "
        "ahead: every later block's",
        "all-gather is in flight at once (comm), so the whole model is whole again on top of "
        "the shards, under",
        f"the recomputed forward's activations and two blocks' full gradients "
        f"({pct['zero3']:+.1f} % vs ZeRO-2). limit_all_gathers=True",
        f"admits 2 blocks at a time ({pct['zero3_limit']:+.1f} %).",
        "",
    ]
    return lines + segments_report(model, results, terms, pct)


def segments_report(model: dict, results: dict[str, dict], terms: dict,
                    pct: dict[str, float]) -> list[str]:
    """What segments of 2 do to the activations, measured and by the formula."""
    L, k, I, A = model["layers"], SEGMENT, terms["I"], terms["A"]
    per, seg = (results[key] for key in ("zero3", "zero3_segments"))
    act = {key: r["peak"]["activations"] for key, r in (("per", per), ("seg", seg))}
    block = seg["peak"]["parameters"] - per["peak"]["parameters"]
    change = act["seg"] - act["per"]
    kept_fewer = L - len(range(0, L, k))
    verb = "lower" if change < 0 else "raise" if change > 0 else "leave"
    share = abs(change) / results["zero3_limit"]["total"]
    return [
        f"Checkpoint segments of {k} layers (Chen et al. 2016) keep the input of every "
        f"{k}nd layer and rerun {k} layers at a time:",
        f"  {'activation peak':<24}{'ledger':>12}{'formula':>12}",
        f"  {'per layer':<24}{act['per']:>10,} B{per['planned_activations']:>10,.0f} B"
        f"   (L-1) I + A + the token ids",
        f"  {f'segments of {k}':<24}{act['seg']:>10,} B{seg['planned_activations']:>10,.0f} B"
        f"   (L/{k}-1) I + {k}A + the token ids",
        f"with I = 2sbh = {I:,.0f} B a kept input and A = {A:,.0f} B = {A / I:g} I a layer "
        f"rerun keeping everything: {kept_fewer} fewer inputs",
        f"kept ({-kept_fewer * I:+,.0f} B), {k - 1} more layer rerun at once ({(k - 1) * A:+,.0f} "
        f"B). Segments of {k} lower the activation peak only when",
        f"L > {k}A/I = {terms['threshold']:g} layers; this model has {L}: they {verb} it "
        f"({change:+,} B). The best segment is k = {terms['best']}: sqrt(L I / A) = "
        f"{terms['sqrt_rule']:.2f},",
        f"not Chen et al.'s sqrt(L) = {terms['sqrt_l']:.1f}, which holds when a layer keeps "
        f"no more than its input (A = I). Under ZeRO-3 a segment's",
        f"{k} blocks are whole together for its rerun (params {block:+,} B, one block); the "
        "FLOPs are the same (every layer rerun once).",
        "",
        f"What holds of the seed's claim: limit_all_gathers brings the peak back "
        f"({pct['zero3_limit']:+.1f} % vs ZeRO-2). Segments of {k} {verb} the",
        f"activations by {share:.2%} of that peak (both fixes: {pct['zero3_both']:+.1f} %): "
        f"checkpoints in groups of {k} pay off only in models deeper",
        f"than {k}A/I layers, and by at most L I / {k} - A; the 20 % is the limit's to win "
        "back.",
    ]
