"""Part 11 of `minipar tour`: zero-bubble pipelines, 1F1B against ZB-H1 and DualPipeV.

The same 8-block GPT, the same m = 8 micro-batches, on pp = 4 ranks three ways: 1F1B (four
stages of two blocks), ZB-H1 (the same stages, each backward split into I, the input's
gradient the previous stage waits for, and W, the weights' gradient, deferred into the
bubble: Qi et al. 2023) and DualPipeV (eight stages of one block in a V, rank r holding
stages r and 7 - r, overlapped forward-and-backward pairs: DeepSeek-AI 2024). Each is a
real step of PipelineRunners on the simulated mesh: its clock drawn by render_pipeline
from the trace, its bubble and peak activations read from the run (the ledger's), its loss
and gradients against one device's. On this model a pair's two halves run one after the
other; what it overlaps is each half's p2p message with the other half's compute.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ... import runtime as mp
from ...nn import GPT, GPTConfig
from ...parallel.pp import PipelineRunner, build_stages, dry_run, lower, placement, schedule
from ...viz import render_pipeline
from .common import Print, Record, no_recorder

PP, M, LAYERS = 4, 8, 8
SCHEDULES = (("1f1b", "1F1B"), ("zb_h1", "ZB-H1"), ("dualpipev", "DualPipeV"))
SLOW = mp.DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s, as part 10
WIDTH = 66


def _step(ctx: mp.Context, cfg: GPTConfig, actions, ids, tgt) -> dict:
    """One step on this rank: its actions from the trace, clock, ledger and gradients."""
    runner = PipelineRunner(build_stages(GPT(cfg), placement(actions), ctx.rank), actions)
    ctx.ledger.reset_peak()
    loss = runner.step(ids, tgt)
    done = [e for e in ctx.trace.events if "action" in e.meta]
    return {"loss": loss, "actions": done, "end": runner.last_step.schedule_end,
            "peak": ctx.ledger.peak("activations"), "loss_rank": runner.loss_rank,
            "grads": {p.name: p.grad.copy() for p in runner.parameters()}}


def _one_microbatch(actions: list) -> int:
    """Bytes one micro-batch holds through all of a rank's layers: each stage's forward
    adds its saved activations to the ledger (the held bytes after it minus before)."""
    per_stage, before = {}, 0
    for e in actions:
        held = e.meta["activations"]
        if e.meta["kind"] == "F":
            per_stage.setdefault(e.meta["stage"], held - before)
        before = held
    return sum(per_stage.values())


def measured(res: list) -> dict:
    """What the run's clock and ledger say: makespan, both bubbles, peak micro-batches."""
    makespan = max(got["end"] for got in res)
    busy = sum(e.duration for got in res for e in got["actions"])
    return {"makespan": makespan, "bubble": 1 - busy / (PP * makespan),
            "over_ideal": (PP * makespan - busy) / busy,
            "held": [got["peak"] / _one_microbatch(got["actions"]) for got in res]}


def zero_bubble_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 11."""
    cfg = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=LAYERS,
                    seed=0)
    rng = np.random.default_rng(0)
    ids, tgt = (rng.integers(0, cfg.vocab_size, (cfg.seq_len, 2 * M)) for _ in range(2))
    out(f"11. Zero-bubble pipelines: 1F1B, ZB-H1 and DualPipeV on pp = {PP}, m = {M} "
        f"micro-batches of {cfg.seq_len} x 2 tokens")
    out(f"   l={LAYERS}, h={cfg.hidden}, float64, devices of 1 GFLOP/s. ZB-H1 splits each "
        f"backward into I (the input's gradient,\n   what the previous stage waits for) and "
        f"W (the weights', which can wait) and runs the W's in 1F1B's idle slots;\n"
        f"   DualPipeV puts stages r and {2 * PP - 1} - r on rank r and runs a forward and a "
        f"backward as one pair (F, then B,\n   each half's message overlapping the other "
        f"half's compute)")
    with mp.device() as one:
        model = GPT(cfg)
        loss0 = model.loss_and_grad(ids, tgt)
        ref = {p.name: p.grad for p in model.parameters()}
    record("11. one device", one)
    topology = mp.Topology.single_node(PP, device=SLOW)
    rows = []
    for name, title in SCHEDULES:
        actions = schedule(name, PP, M)
        res = record(f"11. pipeline, {title}", mp.launch(
            lambda ctx: _step(ctx, cfg, actions, ids, tgt), PP, topology=topology))
        stages = len(placement(actions))
        out(f"\n   {title}: {stages} stages of {LAYERS // stages} block"
            f"{'s' if LAYERS > stages else ''}, the runner's trace on the clock")
        drawing = render_pipeline([e for got in res for e in got["actions"]], width=WIDTH)
        for line in drawing.splitlines():
            out("   " + line)
        grads = {k: g for got in res for k, g in got["grads"].items()}
        worst = max(float(np.abs(grads[k] - g).max() / np.abs(g).max())
                    for k, g in ref.items())
        in_flight = dry_run(lower(actions), {"F": 1, "B": 2, "I": 1, "W": 1}).peak_activations
        rows.append((title, measured(res), max(in_flight), res[res[0]["loss_rank"]]["loss"],
                     worst))
    out(f"\n   {'schedule':<10} {'step':>9}  {'bubble: idle/total':>18}  {'idle/ideal':>10}  "
        f"{'peak activations, micro-batches':>31}  loss")
    for title, got, counted, loss, worst in rows:
        held = max(got["held"])
        out(f"   {title:<10} {got['makespan'] * 1e3:6.3f} ms  {100 * got['bubble']:17.1f} %  "
            f"{100 * got['over_ideal']:9.1f} %  {held:16.2f} (counted {_frac(counted):>5})  "
            f"   {loss:.12f}")
    worst = max(r[4] for r in rows)
    out(f"   one device's loss {loss0:.12f}; every gradient of the three against one "
        f"device's, worst relative difference {worst:.1e}")
    out("   (peak activations: the busiest rank's ledger peak over one micro-batch through "
        "its layers; counted: the dry run's\n    micro-batches in flight. ZB-H1 keeps "
        "1F1B's memory and fills its bubble with W's; DualPipeV holds a little more and\n"
        "    idles least, its ramps shortened by the V. The stages are not equal: the "
        "first embeds, the last computes the loss)")


def _frac(x: Fraction) -> str:
    return str(x) if x.denominator > 1 else str(x.numerator)
