"""What `minipar train` trains, on which layout, and what it measured: TrainConfig, StepInfo,
TrainResult.

A layout is dp x cp x pp x tp simulated devices (ParallelDims; tp fastest, pp slowest, as
Megatron orders them) on `nodes` nodes of `gpus_per_node` (Topology.nodes): every size 1 is
one device, trained by train.py; any other layout by train_parallel.py, from the same
weights, data, optimizer, learning rates and clipping. The configuration refuses what the
library refuses (ParallelDims, check_tensor_parallel, the schedule, the split of the layers,
a tied embedding under ZeRO-2/3 on one rank twice), before anything is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..data import CharTokenizer, load_corpus
from ..nn.config import GPTConfig
from ..nn.gpt import GPT
from ..nn.moe import MoEConfig
from ..parallel.mesh import CP_METHODS, DEFAULT_ORDER, ParallelDims, check_context
from ..parallel.mesh.pipeline import check_tied_on_one_rank
from ..parallel.pp import own_chunks, schedule, split_layers
from ..parallel.tp import check_tensor_parallel, padded_vocab_size
from ..plan.flops import model_flops, moe_model_flops
from ..plan.training_memory import TrainingMemory
from ..runtime.topology import Topology
from .train_checks import check_can_learn

TRAIN_DTYPES = ("float32", "bfloat16", "float16", "float64")
MIXED = ("bfloat16", "float16")
COMPUTE_MODELS = ("calibrated", "peak")  # runtime/compute_model.py; the first is the default
NO_DECAY = ("*.bias", "*ln*")  # biases and LayerNorm gains/shifts are not decayed (GPT-2/3)


def gpt_config(vocab_size: int, vocab_divisible_by: int = 1, **fields: Any) -> GPTConfig:
    """The GPT a run trains: a tokenizer's `vocab_size` padded to a multiple of
    `vocab_divisible_by` (Megatron's make-vocab-size-divisible-by; the padded rows are never
    a target), and GPTConfig's other `fields`."""
    return GPTConfig(vocab_size=padded_vocab_size(vocab_size, 1, vocab_divisible_by),
                     **fields)


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
    Layout: `dp` data-parallel ranks (`zero` 0: DDP, 1-3: ZeRO-1/2/3 over them, or over
    dp / `dp_replicate` of them, replicated `dp_replicate` times: HYBRID_SHARD's split), `tp`
    tensor-parallel ranks (`sequence_parallel` splits the sequence over them too), `cp`
    context-parallel ranks (each sequence's zigzag rows through `cp_method` "ring" or
    "ulysses" attention; gradients over dp x cp), `pp` stages, on `nodes` x
    `gpus_per_node` (None: derived from the other, or one node), ranks
    laid out in Megatron's `order`, fastest first (ParallelDims; default tp-cp-ep-dp-pp).
    `vocab_divisible_by`: the vocabulary padded to a multiple of it (Megatron's
    make-vocab-size-divisible-by) on every layout alike, so that tp can split it.
    Mixture of experts (`experts` > 0): every `moe_every`-th block routes each token to
    `top_k` of `experts` MLPs (dropless, or `capacity_factor`), with the auxiliary loss
    (`aux_loss_coeff`, over every dp rank's tokens with `global_aux_loss`), the z-loss and
    the aux-loss-free bias (`bias_update_rate`); the
    experts spread over `ep` data-parallel ranks (nn/moe, parallel/ep; DDP, no SP).
    Clock: `compute_model` "calibrated" charges each GEMM at the planner's efficiency of its
    shape and elementwise work by the bytes it moves over the device's HBM; "peak" charges
    every matmul at peak and nothing else, so one device's MFU is 100 % by construction
    (runtime/compute_model.py).
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
    dp: int = 1
    tp: int = 1
    cp: int = 1
    cp_method: str = "ring"
    sequence_parallel: bool = False
    zero: int = 0
    dp_replicate: int = 1
    order: str = DEFAULT_ORDER
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    vocab_divisible_by: int = 1
    experts: int = 0
    top_k: int = 2
    ep: int = 1
    capacity_factor: Optional[float] = None
    moe_every: int = 1
    aux_loss_coeff: float = 0.01
    global_aux_loss: bool = False
    z_loss_coeff: float = 0.0
    bias_update_rate: float = 0.0
    compute_model: str = "calibrated"

    def __post_init__(self):
        if self.chunks is None:  # the schedule's own: 1, or 2 in a V
            object.__setattr__(self, "chunks", own_chunks(self.schedule))
        for name, minimum in (("steps", 1), ("global_batch", 1), ("num_microbatches", 1),
                              ("warmup_steps", 0), ("seed", 0), ("log_every", 1), ("pp", 1),
                              ("chunks", 1), ("dp", 1), ("tp", 1), ("cp", 1), ("zero", 0),
                              ("dp_replicate", 1), ("vocab_divisible_by", 1),
                              ("experts", 0), ("top_k", 1), ("ep", 1), ("moe_every", 1)):
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
        if self.cp_method not in CP_METHODS:
            raise ValueError(f"TrainConfig.cp_method must be one of {CP_METHODS}, got "
                             f"{self.cp_method!r}")
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"TrainConfig.dtype must be one of {TRAIN_DTYPES}, "
                             f"got {self.dtype!r}")
        if self.compute_model not in COMPUTE_MODELS:
            raise ValueError(f"TrainConfig.compute_model must be one of {COMPUTE_MODELS}, "
                             f"got {self.compute_model!r}")
        self.model_config(vocab_size=1)  # the model's own checks (heads divide hidden, ...)
        check_can_learn(self.hidden, self.steps, self.warmup_steps)
        if self.pipelined:
            self._check_pipeline()
        self._check_layout()

    @property
    def pipelined(self) -> bool:
        """Whether this run has a pipeline schedule (pp > 1, or chunks > 1 at pp = 1)."""
        return self.pp > 1 or self.chunks > 1

    @property
    def world_size(self) -> int:
        """Simulated devices: dp x cp x pp x tp."""
        return self.dp * self.cp * self.pp * self.tp

    @property
    def parallel(self) -> bool:
        """Whether this run needs train_parallel (several devices or stages), not train."""
        return self.world_size > 1 or self.pipelined

    @property
    def dims(self) -> ParallelDims:
        """The layout: DDP's replicas are dp_replicate, ZeRO's shards dp_shard (replicated
        dp_replicate times)."""
        rep = self.dp if self.zero == 0 else self.dp_replicate
        shard = 1 if self.zero == 0 else self.dp // self.dp_replicate
        return ParallelDims(dp_replicate=rep, dp_shard=shard, pp=self.pp, tp=self.tp,
                            cp=self.cp, ep=self.ep, order=self.order)

    def topology(self) -> Topology:
        """nodes x gpus_per_node devices: both given, one derived from world_size, or one
        node of every device."""
        n, g = self.nodes, self.gpus_per_node
        if n is None and g is None:
            n, g = 1, self.world_size
        elif g is None:
            g = self.world_size // n
        elif n is None:
            n = self.world_size // g
        return Topology.nodes(n, g)

    def _check_layout(self) -> None:
        """The library's own refusals of this layout, before anything runs."""
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"TrainConfig.zero is a ZeRO stage, 0 (DDP) to 3, got {self.zero}")
        if self.zero and self.dp * self.cp == 1:
            raise ValueError(f"zero={self.zero} partitions states over the data- (and "
                             f"context-) parallel ranks, and dp = cp = 1: give dp > 1, or "
                             f"zero=0")
        if self.dp_replicate > 1 and (self.zero == 0 or self.dp % self.dp_replicate):
            raise ValueError(f"dp_replicate={self.dp_replicate} replicates ZeRO's shards: it "
                             f"needs zero >= 1 and must divide dp = {self.dp}")
        dims = self.dims  # ParallelDims' own checks
        per = self.dp * self.num_microbatches
        if self.global_batch % per:
            raise ValueError(
                f"a global batch of {self.global_batch} sequences cannot be shared by dp = "
                f"{self.dp} ranks x {self.num_microbatches} micro-batches ({self.global_batch}"
                f" % {per} = {self.global_batch % per}); use a global batch that is a "
                f"multiple of {per}")
        for what, size in (("nodes", self.nodes), ("gpus_per_node", self.gpus_per_node)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                     or size < 1 or self.world_size % size):
                raise ValueError(f"{what}={size!r} must be a positive divisor of the world "
                                 f"dp x cp x pp x tp = {self.world_size}")
        topo = self.topology()
        if topo.world_size != self.world_size:
            raise ValueError(f"nodes={topo.num_nodes} x gpus_per_node={topo.gpus_per_node} = "
                             f"{topo.world_size} devices, but dp x cp x pp x tp = "
                             f"{self.world_size}: make the two products equal")
        self._check_experts()
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel splits the sequence over the tensor-parallel "
                             "group, and tp = 1: give tp > 1, or leave it off")
        if self.parallel and self.dtype == "float16":
            raise ValueError("a parallel layout trains through the data-parallel engines, "
                             "which do not scale the loss, and float16 needs loss scaling: "
                             "use dtype='bfloat16' (float32's range) or 'float32'")
        mcfg = self.model_config(CharTokenizer.from_text(load_corpus()).vocab_size)
        check_tensor_parallel(mcfg, self.tp, self.sequence_parallel)
        check_context(mcfg, dims, self.cp_method, "zigzag", self.sequence_parallel)
        if self.pipelined:
            acts = schedule(self.schedule, self.pp, self.num_microbatches, self.chunks)
            check_tied_on_one_rank(mcfg, acts, self.zero, None)
        dims.check_implemented()

    def _check_experts(self) -> None:
        """What a mixture of experts needs of the layout (parallel/mesh/experts.py)."""
        if self.experts == 0:
            if self.ep > 1:
                raise ValueError(f"ep={self.ep} spreads experts over ranks, and experts=0: "
                                 f"give experts > 0, or ep=1")
            return
        if self.dp % self.ep or self.experts % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp={self.dp} (expert parallelism is "
                             f"folded into the data-parallel ranks) and experts="
                             f"{self.experts} (each rank holds experts / ep)")
        if self.zero or self.sequence_parallel:
            raise ValueError("a mixture of experts trains with DDP (zero=0) and without "
                             "sequence parallelism here")

    def moe_config(self) -> Optional[MoEConfig]:
        """The MoEConfig of the run (None: dense)."""
        if self.experts == 0:
            return None
        return MoEConfig(num_experts=self.experts, top_k=self.top_k, moe_every=self.moe_every,
                         capacity_factor=self.capacity_factor,
                         aux_loss_coeff=self.aux_loss_coeff,
                         global_aux_loss=self.global_aux_loss, z_loss_coeff=self.z_loss_coeff,
                         bias_update_rate=self.bias_update_rate)

    def _check_pipeline(self) -> None:
        """The schedule's and the split's own refusals (ScheduleError is a ValueError)."""
        schedule(self.schedule, self.pp, self.num_microbatches, self.chunks)
        split_layers(self.num_layers, self.pp * self.chunks)

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The GPT this run trains, for a tokenizer with `vocab_size` symbols (padded to a
        multiple of vocab_divisible_by)."""
        return gpt_config(vocab_size, self.vocab_divisible_by, seq_len=self.seq_len,
                          hidden=self.hidden, num_heads=self.num_heads,
                          num_layers=self.num_layers, dtype=self.dtype, seed=self.seed,
                          moe=self.moe_config())

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def step_model_flops(cfg: TrainConfig, mcfg: GPTConfig) -> float:
    """Model FLOPs of one step (Narayanan et al.'s formula; with experts, the k a token runs
    and the router: plan/flops.py's moe_model_flops)."""
    args = (cfg.global_batch, cfg.seq_len, cfg.num_layers, cfg.hidden, mcfg.vocab_size)
    m = mcfg.moe
    if m is None:
        return model_flops(*args)
    layers = sum(m.is_moe_block(i) for i in range(mcfg.num_layers))
    return moe_model_flops(*args, layers, m.num_experts, m.top_k, m.expert_ffn(mcfg.ffn),
                           m.shared_ffn_hidden, mcfg.ffn)


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
    world_size: int = 1                  # simulated devices: dp x cp x pp x tp
    bubble: float = 0.0                  # the schedule's idle share with equal stages:
    #                                      idle / (p x makespan), a share of the step
    bubble_over_ideal: float = 0.0       # the same idle / busy: the papers' bubble fraction
    rank_peaks: list = field(default_factory=list)   # per rank: {category: peak bytes}
    time_split: list = field(default_factory=list)   # per rank: the last step's split
    #                                      (train_timing.split_step: compute, link classes, idle)
    topology: str = ""                   # Topology.describe() of the run
    compute: str = ""                    # ComputeModel.describe() of the clock's model
    elementwise_time: float = 0.0        # one device: the last step's memory-bound seconds

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
        construction under the peak compute model, less under the calibrated one."""
        return self.model_flops_per_step / (self.sim_step_time * self.peak_flops
                                            * self.world_size)

    def first_loss(self, n: int = 5) -> float:
        """Mean loss of the first n steps."""
        return float(np.mean(self.losses[:n]))

    def last_loss(self, n: int = 5) -> float:
        """Mean loss of the last n steps."""
        return float(np.mean(self.losses[-n:]))
