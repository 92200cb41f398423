"""Incident C: ZeRO-3 with activation checkpointing peaks above ZeRO-2.

The rule: ZeRO-3 saves memory only while few units are whole at once. Without a bound on
its all-gathers, the gathered weights of the units ahead pile up on top of the shards, the
recomputed forward's activations and the unit's full gradient, and the peak passes
ZeRO-2's, which keeps the whole model all along. `limit_all_gathers` restores the bound.

The case: a 13B model under ZeRO-3 with activation checkpointing peaked about 20 % above
ZeRO-2; `limit_all_gathers=True` and checkpointing in groups of 2 layers brought it back. The rate
limiter is PyTorch FSDP's (Zhao et al. 2023, "PyTorch FSDP"; the `limit_all_gathers`
documentation: without it the CPU thread issues all-gathers with no synchronization, so
they run ahead of the GPU's compute and their outputs stay allocated).

How the run reproduces it (one training step of one GPT, bf16, dp = 4 on one node):

    ZeRO-2            whole weights on every rank, full recomputation
    ZeRO-3            full recomputation, forward and backward prefetch, no limit, and the
                      host running ahead: each prefetch reaches every later unit
                      (prefetch_depth = layers), as FSDP's CPU thread does when nothing
                      holds it back
    + limit           limit_all_gathers=True: at most 2 blocks whole or in flight
    + every 2nd       recompute_every=2 alone: only every second block recomputes
    + both            the seed's fix: the limit and recompute_every=2

Peaks are read from each rank's ledger (reset after the engine is built, so the full model
every rank builds before sharding is not counted) and the largest rank is shown. Sizes are
chosen for the mechanism: many thin layers and a short micro-batch, so that, as on a 13B
model with checkpointing, the weights dwarf the activations. What accounting alone gives:
a run-ahead holds about the whole model gathered plus its 2 Psi / N of shards, so at
N = 4 ZeRO-3 can pass ZeRO-2 by at most ~ (2/4) / (2 + 14/4) = 9 % of model state; the
seed's 20 % needs more than the ledger models (allocator fragmentation, for one).

The seed's second fix does not lower the peak by itself, and the run shows it: a block
that does not recompute keeps all its activations from its forward to its backward
(tests/nn/test_recompute_every.py) where a recomputing one keeps its input only, so at
every moment at least as much is held, and the gathered weights are the same. It buys half
the recomputation (the FLOPs column; this tiny model's simulated step time is all
communication latency, so the clock does not show it), and the limiter's headroom pays
for it: with both, the peak stays below ZeRO-2's.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...nn import GPT, GPTConfig
from ...optim import AdamW
from ...parallel import zero_engine
from ...runtime.launch import launch
from ...runtime.ledger import CATEGORIES, fmt_bytes
from ...runtime.topology import Topology

DP = 4
MICRO_BATCH = 1  # sequences per rank
MODEL = GPTConfig(vocab_size=64, seq_len=16, hidden=64, num_heads=4, num_layers=32,
                  dtype="bfloat16", recompute="full", seed=0)
OPT = dict(lr=1e-3, weight_decay=0.1)


def scenarios(cfg: GPTConfig = MODEL) -> dict[str, tuple[str, GPTConfig, dict]]:
    """key -> (label, model config, engine kwargs)."""
    run_ahead = dict(forward_prefetch=True, backward_prefetch=True,
                     prefetch_depth=cfg.num_layers, limit_all_gathers=False)
    limited = dict(run_ahead, limit_all_gathers=True)
    every2 = cfg.with_(recompute_every=2)
    return {
        "zero2": ("ZeRO-2, full recompute", cfg, dict(stage=2)),
        "zero3": ("ZeRO-3, no limit, run-ahead", cfg, dict(stage=3, **run_ahead)),
        "zero3_limit": ("ZeRO-3 + limit_all_gathers", cfg, dict(stage=3, **limited)),
        "zero3_every2": ("ZeRO-3 + recompute every 2nd", every2, dict(stage=3, **run_ahead)),
        "zero3_both": ("ZeRO-3 + both (seed's fix)", every2, dict(stage=3, **limited)),
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


def run(out: Callable[[str], Any] = print, cfg: GPTConfig = MODEL) -> dict[str, Any]:
    """Run every scenario, print the table and the explanation through `out`, and return
    {"model": {...}, "scenarios": {key: {"label", "peak", "total", "vs_zero2",
    "step_seconds", "flops"}}}."""
    results: dict[str, dict[str, Any]] = {}
    for key, (label, model_cfg, kwargs) in scenarios(cfg).items():
        r = measure(model_cfg, kwargs)
        results[key] = {"label": label, **r, "total": r["peak"]["total"]}
    base = results["zero2"]["total"]
    for r in results.values():
        r["vs_zero2"] = r["total"] / base
    model = {"layers": cfg.num_layers, "hidden": cfg.hidden, "heads": cfg.num_heads,
             "seq_len": cfg.seq_len, "vocab": cfg.vocab_size, "micro_batch": MICRO_BATCH,
             "dp": DP, "dtype": cfg.dtype, "parameters": cfg.num_parameters()}
    for line in report(model, results):
        out(line)
    return {"model": model, "scenarios": results}


def report(model: dict, results: dict[str, dict]) -> list[str]:
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
    saved = 100 * (1 - results["zero3_both"]["flops"] / results["zero3_limit"]["flops"])
    lines += [
        "",
        f"Why: ZeRO-3 holds 1/{model['dp']} of the weights, but with no limit the host runs "
        "ahead: every later block's",
        "all-gather is in flight at once (comm), so the whole model is whole again on top of "
        "the shards, under",
        f"the recomputed forward's activations and two blocks' full gradients "
        f"({pct['zero3']:+.1f} % vs ZeRO-2). limit_all_gathers=True",
        f"admits 2 blocks at a time ({pct['zero3_limit']:+.1f} %). Recomputing every 2nd "
        f"block alone keeps the other blocks' activations",
        f"({pct['zero3_every2']:+.1f} %); with the limit it fits ({pct['zero3_both']:+.1f} %) "
        f"for {saved:.0f} % fewer FLOPs than recomputing every block.",
    ]
    return lines
