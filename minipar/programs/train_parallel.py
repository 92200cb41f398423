"""Training the GPT on dp x cp x pp x tp simulated devices: `minipar train --dp D --pp P
--tp T --cp C`.

    run = parallelize(model config, cfg.dims, zero=z, sequence_parallel=sp, schedule=...,
                      microbatches=m, chunks=v, max_grad_norm=clip, lr=..., ...)
    start = resume_at(run, scheduler, recovery)                 # --resume: its step
    for step in range(start, steps):                            # on every rank
        loss = run.forward_backward(*stream.batch(step, global_batch))  # this dp block's
        loss = all_reduce(loss, dp) / dp                        # the global batch's mean
        run.step(); scheduler.step()                            # AdamW, warmup then cosine
        save_if_due(run, step + 1, recovery)                    # --checkpoint-dir

The same data, optimizer (AdamW, weight decay on matrices and embeddings only), learning
rate schedule and clipping as `train` on one device (train.py), on the layout cfg.dims
(DDP's replicas as dp_replicate, ZeRO's as dp_shard) placed on cfg.topology(): ranks fill a
node before the next, tp fastest, pp slowest (ParallelDims). Each dp rank trains on its
block of the global batch (of each of the m micro-batches under a pipeline); the tp ranks
of a group hold 1/tp of every matrix; under a pipeline the model is cut into pp·v stages
(layers split evenly, the remainder on the first stages), each rank running its stages'
forwards and backwards in the schedule's order. The gradients are those of the global
batch's mean loss, so in float64 every layout's losses are one device's up to rounding (the
sums run in another order; tests/programs compare at rtol 1e-12).

Accounting: every rank is a simulated H100 with its own clock and ledger, charged by
cfg.compute_model as on one device (train.py). A step's simulated time T is the longest any
rank's clock advanced; MFU = model FLOPs / (T x peak x world). The last step's T is split
on each rank into compute, communication exposed on each link class and idle time
(train_timing.py); under a pipeline the schedule's own bubble with equal stages and free
messages is reported too, read from its dry run: (p - 1)/(m + p - 1) of a step for GPipe
and 1F1B, (p - 1)/(v·m + p - 1) interleaved, less under the zero-bubble schedules (ZB-H1,
ZB-H2, ZBV, DualPipeV), with `bubble_over_ideal`, the same idle over the busy time (the
papers' bubble fraction). Memory peaks are kept per rank, by the ledger's categories, over
the training steps: after the build (which initialises each weight at its full shape, then
keeps the rank's part) and before the end's gathering of the weights.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np

from ..data import CharTokenizer, TokenStream, load_corpus
from ..nn.gpt import GPT
from ..nn.moe import moe_layers
from ..optim import WarmupCosine, no_decay_for
from ..parallel import ParallelDims, parallelize
from ..parallel.pp import dry_run, lower, schedule
from ..runtime.collectives import all_reduce
from ..runtime.context import device, resolve_compute_model
from ..runtime.faults import inject, step_begins
from ..runtime.launch import RankFailedError, launch
from ..runtime.ledger import CATEGORIES
from .train import _params_summary
from .train_checks import TrainingDiverged, check_memory, diverged, host_available_bytes
from .train_config import NO_DECAY, StepInfo, TrainConfig, TrainResult, step_model_flops
from .train_report import peak_label
from .train_resume import Recovery, resume_at, save_if_due
from .train_timing import StepClock, split_step


EQUAL_STAGES = {"F": 1, "B": 2, "I": 1, "W": 1}  # t_F = t_I = t_W, t_B = t_I + t_W; a pair
# of DualPipeV with no "F&B" lasts t_F + t_B (dry_run.py: nothing of its compute overlaps)


def bubble_of(cfg: TrainConfig) -> tuple[float, float]:
    """The schedule's idle with equal stages (EQUAL_STAGES), no message cost, read from the
    dry run, in its two spellings: (idle / (p x makespan), idle / busy). GPipe and 1F1B:
    ((p - 1)/(m + p - 1), (p - 1)/m); interleaved: v·m in place of m; the zero-bubble
    schedules less (docs/zero_bubble.md)."""
    acts = schedule(cfg.schedule, cfg.pp, cfg.num_microbatches, cfg.chunks)
    run = dry_run(lower(acts), EQUAL_STAGES)
    return float(run.bubble_over_total), float(run.bubble_over_ideal)


def train_parallel(cfg: TrainConfig, on_step: Optional[Callable[[StepInfo], None]] = None,
                   recovery: Optional[Recovery] = None) -> TrainResult:
    """Train a GPT on the bundled corpus on the layout cfg.dims of fresh simulated devices
    (cfg.topology()); `on_step(StepInfo)` is called after every step (by rank 0).
    recovery: where to save and resume from, and the faults to plant (train_resume.py);
    the result then holds the steps this run trained (from the resumed step on)."""
    if not cfg.parallel and not (recovery is not None and recovery.active):
        raise ValueError("TrainConfig with every size 1 is one device: train it with "
                         "train(cfg)")
    if recovery is not None:
        recovery.check(cfg.steps)  # a save to resume from, short of cfg.steps
    wall0 = time.perf_counter()
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    stream = TokenStream(tok.encode(text), seq_len=cfg.seq_len, seed=cfg.seed)
    mcfg = cfg.model_config(tok.vocab_size)
    topo = cfg.topology()
    with device() as ctx:  # the whole model on one device bounds what any rank holds
        memory = check_memory(cfg, mcfg, ctx.device.name, ctx.ledger.capacity,
                              host_available_bytes())
        device_name, peak_flops = ctx.device.name, dict(ctx.device.peak_flops)
    compute = resolve_compute_model(cfg.compute_model, topo.device).describe()
    piped = dict(schedule=cfg.schedule, microbatches=cfg.num_microbatches,
                 chunks=cfg.chunks) if cfg.pipelined else {}
    if cfg.cp > 1:
        piped.update(cp_method=cfg.cp_method)  # the rows: zigzag, parallelize's default
    m = None if cfg.pipelined else cfg.num_microbatches  # a schedule brings its own m

    def program(ctx):
        run = parallelize(mcfg, cfg.dims, zero=cfg.zero,
                          sequence_parallel=cfg.sequence_parallel, max_grad_norm=cfg.clip,
                          lr=cfg.lr, weight_decay=cfg.weight_decay,
                          weight_decay_filter=no_decay_for(*NO_DECAY),
                          placement="any", **piped)  # the command printed the check
        sched = WarmupCosine(run.engine, max_lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                             total_steps=cfg.steps, min_lr=cfg.min_lr)
        # peaks from here on: the build initialises every weight at its full shape (so that
        # every layout starts from one device's model), then keeps this rank's part only
        ctx.ledger.reset_peak()
        start = resume_at(run, sched, recovery)  # 0, or the newest complete save's step
        dp = run.groups.dp
        losses, lrs, norms = [], [], []
        clock = StepClock(ctx)
        for step in range(start, cfg.steps):
            step_begins(step + 1)  # a fault planted at this step's start fires here
            clock.start()
            lr = run.engine.lr
            inputs, targets = stream.batch(step, cfg.global_batch)  # [s, B] each
            with np.errstate(over="ignore", invalid="ignore"):
                loss = run.forward_backward(inputs, targets, m)  # this dp block's mean
                if dp.size > 1:  # equal blocks: the global batch's mean (8 bytes)
                    loss = float(all_reduce(np.array([loss]), "sum", group=dp)[0]) / dp.size
                stop = dict(step=step + 1, steps=cfg.steps, lr=lr, dtype=cfg.dtype,
                            loss_scale=1.0)
                if not math.isfinite(loss):  # on every rank alike, before any update
                    raise diverged(what="loss", value=loss, **stop)
                run.step()
            norm = run.engine.last_grad_norm
            if not math.isfinite(norm):
                raise diverged(what="gradient norm", value=norm, **stop)
            sched.step()
            clock.stop()
            save_if_due(run, step + 1, recovery)  # after the clock: the step's time alone
            losses.append(loss)
            lrs.append(lr)
            norms.append(norm)
            if on_step is not None and ctx.rank == 0:
                wall = time.perf_counter() - wall0
                on_step(StepInfo(step + 1, cfg.steps, loss, lr, norm, False, 1.0, wall,
                                 (step + 1 - start) * cfg.tokens_per_step / wall))
        peaks = {c: ctx.ledger.peak(c) for c in CATEGORIES}
        peaks["total"] = ctx.ledger.peak()
        owned = [p.name for _, ps in getattr(run.engine, "units", ()) for p in ps]
        with run.engine.summon_full_params(writeback=False):  # ZeRO-3 keeps shards only
            full = run.model.full_parameters()  # gathered over tp
        params = {name: full[name] for name in owned}
        biases = {layer.name: layer.router.expert_bias.copy()  # not parameters: the
                  for layer in moe_layers(run.model)}  # routers' aux-loss-free biases
        return losses, lrs, norms, clock, params, peaks, biases

    try:
        faults = recovery.faults if recovery is not None else ()
        res = launch(inject(program, *faults), cfg.world_size, topology=topo,
                     compute_model=cfg.compute_model)
    except RankFailedError as e:  # a diverging run stops every rank alike: say why
        if isinstance(e.original, TrainingDiverged):
            raise e.original from None
        raise
    losses, lrs, norms = res[0][0], res[0][1], res[0][2]
    clocks = [r[3] for r in res]
    times = [max(ts) for ts in zip(*(c.times for c in clocks))]
    bandwidth = {topo.intra.name: topo.intra.bandwidth, topo.inter.name: topo.inter.bandwidth}
    links = [topo.intra.name] + ([topo.inter.name] if topo.num_nodes > 1 else [])
    split = [split_step(c.events, c.t0, times[-1], bandwidth, links) for c in clocks]
    bubble = bubble_of(cfg) if cfg.pipelined else (0.0, 0.0)
    model = _assemble(mcfg, [r[4] for r in res], {k: v for r in res for k, v in r[6].items()})
    rank_peaks = [{c: b for c, b in r[5].items() if b} for r in res]
    ledger_peak = {c: max(r[5][c] for r in res) for c in CATEGORIES}
    ledger_peak = {c: b for c, b in ledger_peak.items() if b}
    ledger_peak["total"] = max(r[5]["total"] for r in res)
    return TrainResult(
        config=cfg, losses=losses, lrs=lrs, grad_norms=norms, skipped=[False] * len(losses),
        sim_step_times=times,
        model_flops_per_step=step_model_flops(cfg, mcfg),
        clock_flops_per_step=sum(c.flops for c in clocks) / len(losses),
        peak_flops=peak_flops[cfg.dtype], peak_label=peak_label(peak_flops, cfg.dtype),
        ledger_peak=ledger_peak, final_loss_scale=1.0, wall_time=time.perf_counter() - wall0,
        device_name=device_name, num_parameters=model.num_parameters(),
        params_summary=_params_summary(model), memory_estimate=memory, model=model,
        tokenizer=tok, world_size=cfg.world_size, bubble=bubble[0], bubble_over_ideal=bubble[1],
        rank_peaks=rank_peaks, time_split=split, topology=topo.describe(), compute=compute)


def _assemble(mcfg, pieces: list[dict[str, np.ndarray]],
              biases: dict[str, np.ndarray]) -> GPT:
    """One GPT holding every stage's weights (a tied wte is on two ranks, equal), on a
    scratch device: what `generate` samples from."""
    with device():
        model = GPT(mcfg)
        for p in model.parameters():
            full = next(piece[p.name] for piece in pieces if p.name in piece)
            p.set_data(np.asarray(full).astype(p.data.dtype))
        for layer in moe_layers(model):  # the routers' biases, from the ranks holding them
            layer.router.expert_bias[...] = biases[layer.name]
    return model
