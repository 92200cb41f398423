"""Training the GPT as a pipeline of pp simulated devices: `minipar train --pp N`.

    run = parallelize(model config, ParallelDims(pp=N), schedule=..., microbatches=m,
                      chunks=v, max_grad_norm=clip, lr=..., weight_decay=..., ...)
    for step in range(steps):                                   # on every rank
        loss = run.train_step(*stream.batch(step, global_batch))  # the schedule, then AdamW
        scheduler.step()                                        # warmup, then cosine

The same data, optimizer (AdamW, weight decay on matrices and embeddings only), learning
rate schedule and clipping as `train` on one device (train.py); the model is cut into
pp·v stages (the first embeds, the last computes the loss; layers split evenly, the
remainder on the first stages), each rank runs its stages' forwards and backwards in the
schedule's order, and the step's gradients are those of the m micro-batches' mean loss.
In float32 and bfloat16 (float32 masters) the losses are one device's up to rounding:
the micro-batches' gradients are summed in another order (tests/programs compare).

Accounting: every rank is a simulated H100 with its own clock and ledger. A step's
simulated time is the longest any rank's clock advanced (the pipeline's makespan plus the
optimizer step); MFU = model FLOPs / (step time x peak x pp), which the bubble bounds: with
equal stages and free messages a schedule leaves each rank idle (p - 1)/(m + p - 1) of
the step (GPipe, 1F1B) or (p - 1)/(v·m + p - 1) (interleaved), less under the zero-bubble
schedules (ZB-H1, ZB-H2, ZBV, DualPipeV: their W's fill it), the `bubble` reported with
`bubble_over_ideal`, the same idle over the busy time (the papers' bubble fraction), both
read from the dry run of the schedule itself. Memory peaks are the busiest rank's.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np

from ..data import CharTokenizer, TokenStream, load_corpus
from ..nn.gpt import GPT
from ..optim import WarmupCosine, no_decay_for
from ..parallel import ParallelDims, parallelize
from ..parallel.pp import dry_run, lower, schedule
from ..plan import model_flops
from ..runtime.context import device
from ..runtime.launch import RankFailedError, launch
from ..runtime.ledger import CATEGORIES
from .train import NO_DECAY, StepInfo, TrainConfig, TrainResult, _params_summary
from .train_checks import TrainingDiverged, check_memory, diverged, host_available_bytes
from .train_report import peak_label


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


def train_pipeline(cfg: TrainConfig, on_step: Optional[Callable[[StepInfo], None]] = None
                   ) -> TrainResult:
    """Train a GPT on the bundled corpus as a pipeline of cfg.pp fresh simulated devices;
    `on_step(StepInfo)` is called after every step (by rank 0)."""
    if not cfg.pipelined:
        raise ValueError("TrainConfig(pp=1, chunks=1) is one device: train it with train(cfg)")
    wall0 = time.perf_counter()
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    stream = TokenStream(tok.encode(text), seq_len=cfg.seq_len, seed=cfg.seed)
    mcfg = cfg.model_config(tok.vocab_size)
    with device() as ctx:  # the whole model on one device bounds what any stage holds
        memory = check_memory(cfg, mcfg, ctx.device.name, ctx.ledger.capacity,
                              host_available_bytes())
        device_name, peak_flops = ctx.device.name, dict(ctx.device.peak_flops)

    def program(ctx):
        run = parallelize(mcfg, ParallelDims(pp=cfg.pp), schedule=cfg.schedule,
                          microbatches=cfg.num_microbatches, chunks=cfg.chunks,
                          max_grad_norm=cfg.clip, lr=cfg.lr, weight_decay=cfg.weight_decay,
                          weight_decay_filter=no_decay_for(*NO_DECAY))
        sched = WarmupCosine(run.engine, max_lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                             total_steps=cfg.steps, min_lr=cfg.min_lr)
        losses, lrs, norms, times = [], [], [], []
        for step in range(cfg.steps):
            t0, lr = ctx.clock.now, run.engine.lr
            inputs, targets = stream.batch(step, cfg.global_batch)  # [s, B] each
            with np.errstate(over="ignore", invalid="ignore"):
                loss = run.forward_backward(inputs, targets)  # the last stage's, broadcast
                stop = dict(step=step + 1, steps=cfg.steps, lr=lr, dtype=cfg.dtype,
                            loss_scale=1.0)
                if not math.isfinite(loss):  # on every rank alike, before any update
                    raise diverged(what="loss", value=loss, **stop)
                run.step()
            norm = run.engine.last_grad_norm
            if not math.isfinite(norm):
                raise diverged(what="gradient norm", value=norm, **stop)
            sched.step()
            losses.append(loss)
            lrs.append(lr)
            norms.append(norm)
            times.append(ctx.clock.now - t0)
            if on_step is not None and ctx.rank == 0:
                wall = time.perf_counter() - wall0
                on_step(StepInfo(step + 1, cfg.steps, loss, lr, norm, False, 1.0, wall,
                                 (step + 1) * cfg.tokens_per_step / wall))
        params = {k[len("param/"):]: a for k, a in run.engine.full_state_dict().items()
                  if k.startswith("param/")}
        peaks = {c: ctx.ledger.peak(c) for c in CATEGORIES}
        peaks["total"] = ctx.ledger.peak()
        flops = sum(e.flops for e in ctx.trace.of("compute"))
        return losses, lrs, norms, times, params, peaks, flops

    try:
        res = launch(program, cfg.pp)
    except RankFailedError as e:  # a diverging run stops every rank alike: say why
        if isinstance(e.original, TrainingDiverged):
            raise e.original from None
        raise
    losses, lrs, norms = res[0][0], res[0][1], res[0][2]
    bubble = bubble_of(cfg)
    model = _assemble(mcfg, [r[4] for r in res])
    ledger_peak = {c: max(r[5][c] for r in res) for c in CATEGORIES}
    ledger_peak = {c: b for c, b in ledger_peak.items() if b}
    ledger_peak["total"] = max(r[5]["total"] for r in res)
    return TrainResult(
        config=cfg, losses=losses, lrs=lrs, grad_norms=norms, skipped=[False] * cfg.steps,
        sim_step_times=[max(ts) for ts in zip(*(r[3] for r in res))],
        model_flops_per_step=model_flops(cfg.global_batch, cfg.seq_len, cfg.num_layers,
                                         cfg.hidden, tok.vocab_size),
        clock_flops_per_step=sum(r[6] for r in res) / cfg.steps,
        peak_flops=peak_flops[cfg.dtype], peak_label=peak_label(peak_flops, cfg.dtype),
        ledger_peak=ledger_peak, final_loss_scale=1.0, wall_time=time.perf_counter() - wall0,
        device_name=device_name, num_parameters=model.num_parameters(),
        params_summary=_params_summary(model), memory_estimate=memory, model=model,
        tokenizer=tok, world_size=cfg.pp, bubble=bubble[0], bubble_over_ideal=bubble[1])


def _assemble(mcfg, pieces: list[dict[str, np.ndarray]]) -> GPT:
    """One GPT holding every stage's weights (a tied wte is on two ranks, equal), on a
    scratch device: what `generate` samples from."""
    with device():
        model = GPT(mcfg)
        for p in model.parameters():
            full = next(piece[p.name] for piece in pieces if p.name in piece)
            p.set_data(np.asarray(full).astype(p.data.dtype))
    return model
