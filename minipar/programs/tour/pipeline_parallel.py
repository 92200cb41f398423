"""Part 10 of `minipar tour`: a pipeline of pp = 4 stages under 1F1B, m = 8 micro-batches.

The tiny GPT cut into 4 stages (the first embeds, the last computes the loss), one
PipelineRunner a rank: the schedule as the trace recorded it, the activations each rank
held (min(p - r, m) micro-batches under 1F1B), the loss and gradients against one device,
and the bubble measured against (p - 1)/(m + p - 1).
"""

from __future__ import annotations

import numpy as np

from ... import runtime as mp
from ...nn import GPT, GPTConfig
from ...parallel.pp import PipelineRunner, build_stages, dry_run, lower, placement, schedule
from ...runtime import cost
from .common import Print, Record, no_recorder

PP, M = 4, 8
# 1 GFLOP/s: at this size an H100's compute takes less than one message's latency, and
# the bubble the schedule makes would drown in the messages
SLOW = mp.DeviceSpec("slow", {"float64": 1e9}, 10**12)


def _step(ctx: mp.Context, cfg: GPTConfig, actions, ids, tgt) -> dict:
    """One 1F1B step on this rank: its actions from the trace, clock, ledger and gradients."""
    runner = PipelineRunner(build_stages(GPT(cfg), placement(actions), ctx.rank), actions)
    ctx.ledger.reset_peak()
    loss = runner.step(ids, tgt)
    done = [e for e in ctx.trace.events if "action" in e.meta]
    return {"loss": loss, "actions": done, "end": runner.last_step.schedule_end,
            "peak": ctx.ledger.peak("activations"), "one": done[0].meta["activations"],
            "grads": {p.name: p.grad.copy() for p in runner.parameters()}}


def pipeline_parallel_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 10."""
    cfg = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=PP, seed=0)
    rng = np.random.default_rng(0)
    ids, tgt = (rng.integers(0, cfg.vocab_size, (cfg.seq_len, 2 * M)) for _ in range(2))
    actions = schedule("1f1b", PP, M)
    out(f"10. Pipeline parallelism: the GPT in pp = {PP} stages, 1F1B with m = {M} "
        f"micro-batches of {cfg.seq_len} x 2 tokens")
    out(f"   l={cfg.num_layers} (one block a stage; stage 0 also embeds, stage {PP - 1} "
        f"computes the loss), h={cfg.hidden}, float64, on devices of 1 GFLOP/s")
    topology = mp.Topology.single_node(PP, device=SLOW)
    res = record("10. pipeline, 1F1B", mp.launch(
        lambda ctx: _step(ctx, cfg, actions, ids, tgt), PP, topology=topology))
    out("   the schedule each rank ran, read from its trace (F i: forward of micro-batch i, "
        "B i: its backward)")
    for r, got in enumerate(res):
        out(f"   S{r}: " + " ".join(f"{e.meta['kind']}{e.meta['microbatch']}"
                                    for e in got["actions"]))
    held = [round(got["peak"] / got["one"], 6) for got in res]
    out(f"   activations held at the peak, in micro-batches (ledger peak / one F's): "
        f"{held}; min(p - r, m) = {[min(PP - r, M) for r in range(PP)]}")
    with mp.device() as one:
        model = GPT(cfg)
        loss0 = model.loss_and_grad(ids, tgt)
        ref = {p.name: p.grad for p in model.parameters()}
    record("10. one device", one)
    grads = {k: g for got in res for k, g in got["grads"].items()}
    worst = max(float(np.abs(grads[k] - g).max() / np.abs(g).max()) for k, g in ref.items())
    out(f"   loss {res[-1]['loss']:.12f} (one device {loss0:.12f}); every gradient against "
        f"one device's, worst relative difference {worst:.1e}")
    makespan = max(got["end"] for got in res)
    busy = [sum(e.duration for e in got["actions"]) for got in res]
    idle = 1 - sum(busy) / (PP * makespan)
    durations = {"F": [0.0] * PP, "B": [0.0] * PP}
    for got in res:
        for e in got["actions"]:
            durations[e.meta["kind"]][e.meta["stage"]] = e.duration
    nbytes = cfg.seq_len * 2 * cfg.hidden * 8  # [s, b, h] float64
    predicted = dry_run(lower(actions), durations, lambda msg: cost.p2p_time(
        nbytes, topology.link(msg.src, msg.dst)))
    formula = (PP - 1) / (M + PP - 1)
    out(f"   idle share of the step, measured: {100 * idle:.1f} %; (p - 1)/(m + p - 1) = "
        f"{PP - 1}/{M + PP - 1} = {100 * formula:.1f} % with equal stages; the dry run of "
        f"these stage times and messages: {100 * float(predicted.bubble_over_total):.1f} %")
    out("   (the stages are not equal: the first embeds, the last computes the logits and "
        "the loss; 1F1B has GPipe's bubble\n    and holds at most p - r micro-batches; "
        "`minipar incident b` takes it to p = 64)")
