"""Training the GPT on one simulated device: the loop every parallel layout starts from.

    stream = TokenStream(CharTokenizer(corpus).encode(corpus), seq_len, seed)
    for step in range(steps):
        inputs, targets = stream.batch(step, global_batch)          # [s, B] each
        for inp, tgt in split_microbatches(inputs, targets, k):     # [s, B/k] each
            model.loss_and_grad(inp, tgt, rng, loss_scale=S / k)    # gradients add up
        clip by the global norm;  taken = opt.step()                # False: fp16 overflow
        opt.zero_grad()
        if taken: scheduler.step()                                  # warmup, then cosine

- Gradient accumulation: the loss of a global batch is the mean of its k equal
  micro-batch losses, L = (1/k) Σ L_i, so each micro-batch's backward starts from L_i / k
  and the accumulated gradient is the full batch's (see `loss_scale_for_accumulation`).
- Precision: float32 and float64 train with `AdamW` directly, and the loop clips. bfloat16
  and float16 train with `MixedPrecisionOptimizer(AdamW)` (float32 master weights), whose
  `step()` clips, since only it sees the unscaled gradients: for float16 the loss is
  multiplied by its `DynamicLossScaler`'s scale S (S = 1 otherwise), and `step()` divides
  by S, skips the step if a gradient overflowed (the schedule then does not advance; the
  skipped steps are counted) and clips what is left.
- Accounting: everything runs on a fresh simulated H100 (`minipar.device()`), so the
  ledger holds every byte and the clock every matmul FLOP. The simulated step time is
  what the clock advanced during one step; simulated MFU = model FLOPs / (step time ×
  peak). Every matmul of this model is a model FLOP. Under cfg.compute_model "calibrated"
  (the default) each GEMM runs at the planner's efficiency of its shape, well below peak
  for this small model's, and the elementwise work (LayerNorm, GeLU, softmax, dropout and
  the residual adds, the embedding, the loss, AdamW) takes the bytes it moves over the
  H100's HBM, so MFU is what such a step would reach; under "peak" only matmuls are
  charged, at peak, and on one device MFU is 100 % by construction: it drops below only
  when there is something else on the clock (communication, pipeline bubbles,
  recomputation), which is what the parallel layouts add.

- Checks (train_checks.py): before allocating, the run's memory by the course's formulas
  against the device's capacity and this machine's available memory (`TrainingRefused`
  with the figures); hidden = 1 refused (its LayerNorms output constants); an inf/nan loss
  or gradient norm stops the run at that step with the likely cause (`TrainingDiverged`).

`train(TrainConfig(...))` is deterministic in the seed: the data of step n depends only on
(seed, n), the weights on (seed, parameter name). `TrainConfig(dp=, pp=, tp=, ...)`
(train_config.py) describes a layout of dp x pp x tp simulated devices instead, trained by
`train_parallel` (train_parallel.py) on the same data, with the same optimizer, schedule of
learning rates and clipping; every size 1 is this loop.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Callable, Optional

import numpy as np

from ..data import (CharTokenizer, TokenStream, load_corpus, loss_scale_for_accumulation,
                   split_microbatches)
from ..nn.gpt import GPT
from ..nn.moe import update_routers
from ..nn.saved import release_all
from ..optim import (AdamW, MixedPrecisionOptimizer, WarmupCosine, clip_grad_norm_,
                    no_decay_for)
from ..runtime.context import device
from ..runtime.ledger import CATEGORIES
from .train_config import (MIXED, NO_DECAY, TRAIN_DTYPES, StepInfo, TrainConfig,  # noqa: F401
                           TrainResult, step_model_flops)
from .train_checks import check_memory, diverged, host_available_bytes
from .train_report import peak_label
from .train_timing import StepClock, split_step

def _params_summary(model: GPT) -> dict[str, Any]:
    """Count, dtype, global L2 norm and a SHA-256 of every parameter's bytes (in order)."""
    ps = model.parameters()
    digest = hashlib.sha256()
    sq = 0.0
    for p in ps:
        digest.update(np.ascontiguousarray(p.data).tobytes())
        sq += float(np.sum(p.data.astype(np.float64) ** 2))
    return {"tensors": len(ps), "elements": model.num_parameters(),
            "dtype": str(ps[0].data.dtype), "l2_norm": math.sqrt(sq),
            "finite": all(bool(np.isfinite(p.data.astype(np.float64)).all()) for p in ps),
            "sha256": digest.hexdigest()[:16]}


def train(cfg: TrainConfig, on_step: Optional[Callable[[StepInfo], None]] = None
          ) -> TrainResult:
    """Train a GPT on the bundled corpus on one fresh simulated device (see the module
    docstring for the loop); `on_step(StepInfo)` is called after every step."""
    if cfg.parallel:
        raise ValueError(f"TrainConfig(dp={cfg.dp}, pp={cfg.pp}, tp={cfg.tp}, chunks="
                         f"{cfg.chunks}) is a layout of {cfg.world_size} devices: train it "
                         f"with minipar.programs.train_parallel.train_parallel(cfg), or give "
                         f"every size 1 for one device")
    wall0 = time.perf_counter()
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    stream = TokenStream(tok.encode(text), seq_len=cfg.seq_len, seed=cfg.seed)
    mcfg = cfg.model_config(tok.vocab_size)
    k = cfg.num_microbatches
    mixed = cfg.dtype in MIXED
    losses, lrs, norms, skipped = [], [], [], []

    with device(compute_model=cfg.compute_model) as ctx:
        # refuse before allocating what neither the device nor this machine can hold
        memory = check_memory(cfg, mcfg, ctx.device.name, ctx.ledger.capacity,
                              host_available_bytes())
        model = GPT(mcfg)
        params = model.parameters()
        adamw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay,
                     weight_decay_filter=no_decay_for(*NO_DECAY))
        if mixed:  # float32 masters; float16 also gets a DynamicLossScaler; clips unscaled
            opt = MixedPrecisionOptimizer(AdamW, params, dtype=cfg.dtype,
                                          max_grad_norm=cfg.clip, **adamw)
        else:
            opt = AdamW(params, **adamw)
        sched = WarmupCosine(opt, max_lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                             total_steps=cfg.steps, min_lr=cfg.min_lr)
        rng = np.random.default_rng(cfg.seed)  # for dropout, were it on (it is off here)
        # float16 gradients may overflow: expected, found and handled by the loss scaler;
        # any other overflow ends as an inf/nan loss or norm, which stops the run below
        quiet = dict(over="ignore", invalid="ignore")

        steps = StepClock(ctx)
        for step in range(cfg.steps):
            steps.start()
            inputs, targets = stream.batch(step, cfg.global_batch)  # [s, B] each
            scale = getattr(opt, "loss_scale", 1.0)  # S: float16's loss scale, else 1
            dloss = scale * loss_scale_for_accumulation(k)  # S/k
            lr = opt.lr
            with np.errstate(**quiet):
                # backward of (S/k)·L_i for each micro-batch [s, B/k]: the gradients add up
                # to S times the gradient of the global batch's loss
                micro = [model.loss_and_grad(inp, tgt, rng, loss_scale=dloss)
                         for inp, tgt in split_microbatches(inputs, targets, k)]
                stop = dict(step=step + 1, steps=cfg.steps, lr=lr, dtype=cfg.dtype,
                            loss_scale=scale)
                if not math.isfinite(float(np.mean(micro))):  # before any update
                    raise diverged(what="loss", value=float(np.mean(micro)), **stop)
                if mcfg.moe is not None:  # an expert no token chose: a zero gradient, which
                    for p in params:  # AdamW decays, as the data-parallel engines' buffers
                        if p.grad is None:
                            p.accumulate(np.zeros_like(p.data))
                if mixed:  # unscale, skip on overflow, clip, step the float32 masters
                    taken = opt.step()
                    norm = opt.last_grad_norm if taken else math.nan
                    if taken and not math.isfinite(norm):  # bfloat16: no scaler skips it
                        raise diverged(what="gradient norm", value=norm, **stop)
                else:
                    norm = clip_grad_norm_(params, cfg.clip)
                    if not math.isfinite(norm):  # stop before the nan reaches the weights
                        raise diverged(what="gradient norm", value=norm, **stop)
                    opt.step()
                    taken = True
            opt.zero_grad()
            if mcfg.moe is not None:  # the routers' aux-loss-free bias, once a step
                update_routers(model, mcfg.moe.bias_update_rate)
            if taken:  # a skipped step does not advance the schedule
                sched.step()

            losses.append(float(np.mean(micro)))  # equal micro-batches: the batch mean
            lrs.append(lr)
            norms.append(float(norm))
            skipped.append(not taken)
            steps.stop()
            if on_step is not None:
                wall = time.perf_counter() - wall0
                on_step(StepInfo(step + 1, cfg.steps, losses[-1], lr, norms[-1], not taken,
                                 scale, wall, (step + 1) * cfg.tokens_per_step / wall))

        clock_flops = steps.flops
        sim_times = steps.times
        topo = ctx.topology
        split = split_step(steps.events, steps.t0, sim_times[-1],
                           {topo.intra.name: topo.intra.bandwidth}, [])
        ledger_peak = {c: ctx.ledger.peak(c) for c in CATEGORIES if ctx.ledger.peak(c)}
        ledger_peak["total"] = ctx.ledger.peak()
        peak = ctx.device.peak(cfg.dtype)
        label = peak_label(dict(ctx.device.peak_flops), cfg.dtype)
        final_scale = float(getattr(opt, "loss_scale", 1.0))
        device_name = ctx.device.name
        compute = ctx.compute_model.describe()
        elementwise = sum(e.duration for e in steps.events if "bytes" in e.meta)

    return TrainResult(
        config=cfg, losses=losses, lrs=lrs, grad_norms=norms, skipped=skipped,
        sim_step_times=sim_times,
        model_flops_per_step=step_model_flops(cfg, mcfg),
        clock_flops_per_step=clock_flops / cfg.steps, peak_flops=peak, peak_label=label,
        ledger_peak=ledger_peak, final_loss_scale=final_scale,
        wall_time=time.perf_counter() - wall0,
        device_name=device_name, num_parameters=model.num_parameters(),
        params_summary=_params_summary(model), memory_estimate=memory, model=model,
        tokenizer=tok, rank_peaks=[ledger_peak], time_split=[split],
        topology=f"one {device_name}", compute=compute, elementwise_time=elementwise)


# ---- sampling ---------------------------------------------------------------------------
def generate(model: GPT, tokenizer: CharTokenizer, prompt: str, num_chars: int,
             temperature: float = 0.0, seed: int = 0) -> str:
    """`prompt` followed by `num_chars` characters, one forward per character.

    Each character comes from the logits of the last position of a forward over the last
    `seq_len` characters so far: the argmax when `temperature` is 0 (greedy), else a draw
    from softmax(logits / temperature). The model's forward wants targets; it gets zeros
    and its loss is ignored. Runs on a scratch simulated device, so the training device's
    ledger and clock are left as they were.
    """
    if not prompt:
        raise ValueError("generate needs a non-empty prompt (the model predicts from it)")
    if num_chars < 0:
        raise ValueError(f"num_chars must be >= 0, got {num_chars}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    ids = [int(i) for i in tokenizer.encode(prompt)]
    rng = np.random.default_rng(seed)
    s_max = model.cfg.seq_len
    with device():
        for _ in range(num_chars):
            window = np.array(ids[-s_max:], dtype=np.int64)[:, None]  # [s, 1]
            _, cache = model.forward(window, np.zeros_like(window), rng)
            # cache.head.loss is the cross-entropy's Saved: its logits, at the last position: [V]
            logits = cache.head.loss.logits[-1, 0].astype(np.float64)
            logits = logits[:tokenizer.vocab_size]  # a padded vocabulary's extra rows: never
            release_all(cache)
            if temperature == 0:
                ids.append(int(np.argmax(logits)))
            else:
                z = logits / temperature
                p = np.exp(z - z.max())
                ids.append(int(rng.choice(p.size, p=p / p.sum())))
    return tokenizer.decode(np.array(ids, dtype=np.int64))

