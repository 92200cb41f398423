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
  peak). Only matmuls are charged to the clock, and every matmul of this model is a
  model FLOP, so on one device MFU is 100 % by construction: it drops below only when
  there is something else on the clock (communication, pipeline bubbles, recomputation),
  which is what the parallel layouts add.

- Checks (train_checks.py): before allocating, the run's memory by the course's formulas
  against the device's capacity and this machine's available memory (`TrainingRefused`
  with the figures); hidden = 1 refused (its LayerNorms output constants); an inf/nan loss
  or gradient norm stops the run at that step with the likely cause (`TrainingDiverged`).

`train(TrainConfig(...))` is deterministic in the seed: the data of step n depends only on
(seed, n), the weights on (seed, parameter name). `TrainConfig(pp=N, schedule=...,
chunks=V)` describes a pipeline of N simulated devices instead, trained by
`train_pipeline` (train_pipeline.py) on the same data, with the same optimizer, schedule
of learning rates and clipping.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..data import (CharTokenizer, TokenStream, load_corpus, loss_scale_for_accumulation,
                   split_microbatches)
from ..nn.config import GPTConfig
from ..nn.gpt import GPT
from ..nn.saved import release_all
from ..optim import (AdamW, MixedPrecisionOptimizer, WarmupCosine, clip_grad_norm_,
                    no_decay_for)
from ..parallel.pp import own_chunks, schedule, split_layers
from ..plan import model_flops
from ..plan.training_memory import TrainingMemory
from ..runtime.context import device
from ..runtime.ledger import CATEGORIES
from .train_report import peak_label
from .train_checks import check_can_learn, check_memory, diverged, host_available_bytes

TRAIN_DTYPES = ("float32", "bfloat16", "float16", "float64")
MIXED = ("bfloat16", "float16")
NO_DECAY = ("*.bias", "*ln*")  # biases and LayerNorm gains/shifts are not decayed (GPT-2/3)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"TrainConfig.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"TrainConfig.{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how. The defaults (108,544 parameters, 1,024 tokens a step, 200
    steps) take 15-20 s on two CPU cores and bring the corpus loss from ln(50) ≈ 3.9 to
    about 1.9.

    Model: a GPT with `num_layers` blocks of width `hidden` and `num_heads` heads over
    windows of `seq_len` characters (the vocabulary is the corpus's characters).
    Batch: `global_batch` sequences per step, cut into `num_microbatches` equal parts.
    Optimizer: AdamW, lr warmed up linearly from 0 over `warmup_steps`, then cosine down to
    `min_lr` at `steps`; `weight_decay` on matrices and embeddings only; gradients clipped
    to a global norm of `clip` (math.inf: never clip, but still measure the norm).
    Pipeline: `pp` ranks (1: one device) running `schedule` (a name of minipar.parallel.pp
    .SCHEDULES: "gpipe", "1f1b", "interleaved_1f1b" with `chunks` stages per rank, the
    zero-bubble "zb_h1", "zb_h2", and the V schedules "zbv", "dualpipev" with two) over the
    `num_microbatches`; `chunks` None is the schedule's own (1, or 2 in a V).
    """

    steps: int = 200
    global_batch: int = 32
    num_microbatches: int = 1
    seq_len: int = 32
    num_layers: int = 2
    hidden: int = 64
    num_heads: int = 4
    lr: float = 1e-2
    warmup_steps: int = 20
    min_lr: float = 1e-3
    weight_decay: float = 0.1
    clip: float = 1.0
    dtype: str = "float32"
    seed: int = 0
    log_every: int = 10
    pp: int = 1
    schedule: str = "1f1b"
    chunks: Optional[int] = None

    def __post_init__(self):
        if self.chunks is None:  # the schedule's own: 1, or 2 in a V
            object.__setattr__(self, "chunks", own_chunks(self.schedule))
        for name, minimum in (("steps", 1), ("global_batch", 1), ("num_microbatches", 1),
                              ("warmup_steps", 0), ("seed", 0), ("log_every", 1), ("pp", 1),
                              ("chunks", 1)):
            _check_int(name, getattr(self, name), minimum)
        if self.global_batch % self.num_microbatches:
            ks = [d for d in range(1, self.global_batch + 1) if self.global_batch % d == 0]
            raise ValueError(
                f"a global batch of {self.global_batch} sequences cannot be cut into "
                f"{self.num_microbatches} equal micro-batches; use a number of micro-batches "
                f"in {ks}, or a global batch that is a multiple of {self.num_microbatches}")
        if self.warmup_steps > self.steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} is longer than "
                             f"the run (steps={self.steps}); use at most {self.steps}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"TrainConfig.lr must be a positive number, got {self.lr}")
        if not 0.0 <= self.min_lr <= self.lr:
            raise ValueError(f"TrainConfig.min_lr must be in [0, lr={self.lr}], "
                             f"got {self.min_lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not self.clip > 0:  # also refuses nan
            raise ValueError(f"TrainConfig.clip must be > 0 (math.inf turns clipping off), "
                             f"got {self.clip}")
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"TrainConfig.dtype must be one of {TRAIN_DTYPES}, "
                             f"got {self.dtype!r}")
        self.model_config(vocab_size=1)  # the model's own checks (heads divide hidden, ...)
        check_can_learn(self.hidden, self.steps, self.warmup_steps)
        if self.pipelined:
            self._check_pipeline()

    @property
    def pipelined(self) -> bool:
        """Whether this run is a pipeline (train_pipeline), not one device (train)."""
        return self.pp > 1 or self.chunks > 1

    def _check_pipeline(self) -> None:
        """The schedule's and the split's own refusals (ScheduleError is a ValueError)."""
        schedule(self.schedule, self.pp, self.num_microbatches, self.chunks)
        split_layers(self.num_layers, self.pp * self.chunks)
        if self.dtype == "float16":
            raise ValueError("a pipeline trains through the data-parallel engines, which do "
                             "not scale the loss, and float16 needs loss scaling: use "
                             "dtype='bfloat16' (float32's range) or 'float32'")

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The GPT this run trains, for a tokenizer with `vocab_size` symbols."""
        return GPTConfig(vocab_size=vocab_size, seq_len=self.seq_len, hidden=self.hidden,
                         num_heads=self.num_heads, num_layers=self.num_layers,
                         dtype=self.dtype, seed=self.seed)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class StepInfo:
    """What `train` tells `on_step` after each step (`step` counts from 1)."""

    step: int
    steps: int
    loss: float
    lr: float                 # the learning rate this step used
    grad_norm: float          # before clipping; nan for a skipped step
    skipped: bool             # float16 overflow: the optimizer did not step
    loss_scale: float         # S (1.0 unless float16)
    wall_seconds: float       # since training began
    tokens_per_second: float  # wall-clock throughput so far


@dataclass
class TrainResult:
    """Everything a run measured. Lists have one entry per step."""

    config: TrainConfig
    losses: list[float]
    lrs: list[float]
    grad_norms: list[float]
    skipped: list[bool]
    sim_step_times: list[float]          # simulated seconds the clock advanced per step
    model_flops_per_step: float          # 72 B s l h^2 (1 + s/6h + V/12lh), Narayanan et al.
    clock_flops_per_step: float          # what the clock was charged (matmuls only)
    peak_flops: float                    # the device's peak FLOP/s for the dtype
    peak_label: str                      # which peak that is: "494 TFLOP/s, the TF32 ..."
    ledger_peak: dict[str, int]          # peak bytes per category (non-zero ones) and total
    final_loss_scale: float              # float16's dynamic loss scale at the end (else 1.0)
    wall_time: float                     # seconds, set-up included
    device_name: str
    num_parameters: int
    params_summary: dict[str, Any]
    memory_estimate: TrainingMemory      # what was checked before allocating (train_checks)
    model: GPT = field(repr=False)
    tokenizer: CharTokenizer = field(repr=False)
    world_size: int = 1                  # simulated devices (a pipeline's pp)
    bubble: float = 0.0                  # the schedule's idle share with equal stages:
    #                                      idle / (p x makespan), a share of the step
    bubble_over_ideal: float = 0.0       # the same idle / busy: the papers' bubble fraction

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)

    @property
    def sim_step_time(self) -> float:
        """Mean simulated seconds per step (every step has the same shapes, so the same)."""
        return float(np.mean(self.sim_step_times))

    @property
    def mfu(self) -> float:
        """Model FLOPs / (simulated step time × peak × devices): 1.0 on one device by
        construction."""
        return self.model_flops_per_step / (self.sim_step_time * self.peak_flops
                                            * self.world_size)

    def first_loss(self, n: int = 5) -> float:
        """Mean loss of the first n steps."""
        return float(np.mean(self.losses[:n]))

    def last_loss(self, n: int = 5) -> float:
        """Mean loss of the last n steps."""
        return float(np.mean(self.losses[-n:]))


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
    if cfg.pipelined:
        raise ValueError(f"TrainConfig(pp={cfg.pp}, chunks={cfg.chunks}) is a pipeline of "
                         f"{cfg.pp} devices: train it with minipar.programs.train_pipeline."
                         f"train_pipeline(cfg), or give pp=1, chunks=1 for one device")
    wall0 = time.perf_counter()
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    stream = TokenStream(tok.encode(text), seq_len=cfg.seq_len, seed=cfg.seed)
    mcfg = cfg.model_config(tok.vocab_size)
    k = cfg.num_microbatches
    mixed = cfg.dtype in MIXED
    losses, lrs, norms, skipped, sim_times = [], [], [], [], []

    with device() as ctx:
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

        for step in range(cfg.steps):
            t0 = ctx.clock.now
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
            if taken:  # a skipped step does not advance the schedule
                sched.step()

            losses.append(float(np.mean(micro)))  # equal micro-batches: the batch mean
            lrs.append(lr)
            norms.append(float(norm))
            skipped.append(not taken)
            sim_times.append(ctx.clock.now - t0)
            if on_step is not None:
                wall = time.perf_counter() - wall0
                on_step(StepInfo(step + 1, cfg.steps, losses[-1], lr, norms[-1], not taken,
                                 scale, wall, (step + 1) * cfg.tokens_per_step / wall))

        clock_flops = sum(e.flops for e in ctx.trace.of("compute"))
        ledger_peak = {c: ctx.ledger.peak(c) for c in CATEGORIES if ctx.ledger.peak(c)}
        ledger_peak["total"] = ctx.ledger.peak()
        peak = ctx.device.peak(cfg.dtype)
        label = peak_label(dict(ctx.device.peak_flops), cfg.dtype)
        final_scale = float(getattr(opt, "loss_scale", 1.0))
        device_name = ctx.device.name

    return TrainResult(
        config=cfg, losses=losses, lrs=lrs, grad_norms=norms, skipped=skipped,
        sim_step_times=sim_times,
        model_flops_per_step=model_flops(cfg.global_batch, cfg.seq_len, cfg.num_layers,
                                         cfg.hidden, tok.vocab_size),
        clock_flops_per_step=clock_flops / cfg.steps, peak_flops=peak, peak_label=label,
        ledger_peak=ledger_peak, final_loss_scale=final_scale,
        wall_time=time.perf_counter() - wall0,
        device_name=device_name, num_parameters=model.num_parameters(),
        params_summary=_params_summary(model), memory_estimate=memory, model=model,
        tokenizer=tok)


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
            release_all(cache)
            if temperature == 0:
                ids.append(int(np.argmax(logits)))
            else:
                z = logits / temperature
                p = np.exp(z - z.max())
                ids.append(int(rng.choice(p.size, p=p / p.sum())))
    return tokenizer.decode(np.array(ids, dtype=np.int64))

