"""What `minipar train` refuses before allocating, and what stops it: M ≤ capacity, finite loss.

Before anything is allocated, the run's memory is estimated with the course's formulas
(plan/training_memory.py: parameters, gradients, optimizer states, activations with the
attention scores) and compared with the simulated device's capacity and with this
machine's available memory (MemAvailable of /proc/meminfo, else os.sysconf): every
simulated byte is a real NumPy byte here, so a run that does not fit either is refused with
the figures and what to change, instead of dying in an out-of-memory error (simulated or
real) after minutes of allocation.

A configuration that cannot learn is refused too: hidden = 1, where every LayerNorm maps
its one feature to (x - mean) / std = 0, so the model's output is a constant; one step
whose warmup keeps the learning rate at 0.

`minipar train --pp N --schedule NAME --chunks V`: the schedule is built from the flags
before anything runs, and what it refuses (a V's two chunks, interleaving's m % p,
DualPipeV's m >= 2p, ...) is the command's usage error, its advice in flag names
(pipeline_flag_error): the rules live in the schedules, not restated here. Likewise the
layout's flags (layout_flag_error): --tp through check_tensor_parallel, the world against
--nodes x --gpus-per-node, the batch against --dp x --micro-batches.

While it runs, a loss or gradient norm that is inf or nan stops the run at that step
(`TrainingDiverged`), with the likely cause, before the optimizer writes nan into the
weights. float16's skipped overflow steps are not divergence: the loss scaler handles them.
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

from ..parallel.mesh import ParallelDims, check_context
from ..parallel.pp import SCHEDULES, ScheduleError, own_chunks, schedule
from ..parallel.tp import check_tensor_parallel
from ..plan.training_memory import TrainingMemory, training_memory
from ..runtime.checks import MAX_RANKS
from ..runtime.ledger import fmt_bytes


class TrainingRefused(ValueError):
    """A configuration that cannot run on this device or machine, or cannot learn."""


class TrainingDiverged(FloatingPointError):
    """The loss or the gradient norm became inf or nan at `step` (counted from 1)."""

    def __init__(self, message: str, step: int, value: float):
        super().__init__(message)
        self.step, self.value = step, value


def check_can_learn(hidden: int, steps: int, warmup_steps: int) -> None:
    """Refuse a run that cannot learn anything, with the reason."""
    if hidden == 1:
        raise TrainingRefused(
            "hidden = 1 cannot learn: LayerNorm normalises each token over its hidden "
            "features, and with one feature (x - mean) / std is 0 for every token, so every "
            "LayerNorm's output, and the model's prediction, is a constant; use hidden >= 2")
    if steps == 1 and warmup_steps == 1:
        raise TrainingRefused(
            "steps = 1 with warmup_steps = 1 cannot learn: the warmup starts at lr 0 and the "
            "only step uses it; use warmup_steps = 0 or more steps")


def host_available_bytes() -> Optional[int]:
    """This machine's available memory: /proc/meminfo's MemAvailable, else the free
    physical pages (os.sysconf); None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def estimate(cfg, mcfg) -> TrainingMemory:
    """The memory of training `mcfg` (a GPTConfig) the way TrainConfig `cfg` says."""
    h, V, s = mcfg.hidden, mcfg.vocab_size, mcfg.seq_len
    largest = max(V * h, s * h, 3 * h * h, h * mcfg.ffn)  # wte/lm_head, wpe, qkv, fc1/fc2
    return training_memory(mcfg.num_parameters(), largest,
                           cfg.global_batch // cfg.num_microbatches, s, mcfg.num_layers, h,
                           mcfg.num_heads, V, cfg.dtype)


def check_memory(cfg, mcfg, device_name: str, capacity: Optional[int],
                 available: Optional[int]) -> TrainingMemory:
    """The estimate, or TrainingRefused with its figures if it exceeds the device's
    `capacity` or this machine's `available` bytes (None: not checked)."""
    m = estimate(cfg, mcfg)
    over = []
    if capacity is not None and m.total > capacity:
        over.append(f"the simulated {device_name} holds {fmt_bytes(capacity)}")
    if available is not None and m.total > available:
        over.append(f"this machine has {fmt_bytes(available)} available (every simulated "
                    "byte is a real NumPy byte here)")
    if over:
        b = cfg.global_batch // cfg.num_microbatches
        raise TrainingRefused(
            f"this run needs about {fmt_bytes(m.total)} but {' and '.join(over)}:\n"
            f"  parameters        {fmt_bytes(m.parameters)}  ({mcfg.num_parameters():,} "
            f"parameters in {cfg.dtype})\n"
            f"  gradients         {fmt_bytes(m.gradients)}\n"
            f"  optimizer states  {fmt_bytes(m.optimizer_states)}  (AdamW"
            f"{': float32 master, m, v' if cfg.dtype in ('bfloat16', 'float16') else ': m, v'})\n"
            f"  activations       {fmt_bytes(m.activations)}  ({mcfg.num_layers} layers of a "
            f"micro-batch of {b} x {mcfg.seq_len} tokens; the attention scores a s^2 b are "
            f"{fmt_bytes(m.attention_scores)} of it)\n"
            "Lower --hidden or --layers (model states grow with hidden^2 x layers), --seq-len "
            "(the scores grow with its square), or split --batch into more --micro-batches "
            "(activations are one micro-batch's)")
    return m


def diverged(step: int, steps: int, what: str, value: float, lr: float, dtype: str,
             loss_scale: float) -> TrainingDiverged:
    """The error that stops a run whose `what` ("loss", "gradient norm") became `value`."""
    if dtype == "float16":
        cause = (f"float16 overflowed in the forward (its range ends at 65504; the loss scale "
                 f"{loss_scale:g} protects only the gradients): lower --lr, or train in "
                 "bfloat16, which has float32's range")
    else:
        cause = (f"the learning rate {lr:.3g} is likely too high: the updates grew the "
                 f"weights until the {'logits' if what == 'loss' else 'gradients'} "
                 "overflowed; lower --lr (a tenth, say) or lengthen the warmup")
    kind = "inf" if math.isinf(value) else "nan"
    return TrainingDiverged(f"training diverged: the {what} became {kind} at step {step} of "
                            f"{steps}. Likely cause: {cause}", step, value)


def pipeline_flag_error(pp: int, name: Optional[str], chunks: Optional[int],
                        microbatches: int, layers: int, dtype: str) -> Optional[str]:
    """What `minipar train` must refuse in --pp, --schedule, --chunks (None: not given),
    said in flag names, or None."""
    if pp == 1 and (name is not None or chunks is not None):
        return ("--schedule and --chunks shape a pipeline: give --pp N (N > 1 simulated "
                "devices), or leave them out to train on one device")
    name = name or "1f1b"
    if pp > 1:
        try:
            schedule(name, pp, microbatches, chunks)
        except ScheduleError as e:
            given = f" --chunks {chunks}" if chunks else ""
            return (f"--schedule {name} --pp {pp} --micro-batches {microbatches}{given}: "
                    f"{in_flags(str(e))}")
    stages = pp * (chunks or own_chunks(name))
    if stages > layers:
        return (f"--pp {pp} x --chunks {stages // pp} = {stages} stages need at least "
                f"{stages} --layers (one block each), got {layers}")
    if pp > 1 and dtype == "float16":
        return ("--dtype float16 needs loss scaling, which the pipeline's engine does not "
                "do: use --dtype bfloat16 (float32's range) or float32")
    return None


def in_flags(text: str) -> str:
    """A ScheduleError's advice in the command's flags: microbatches = 4 -> --micro-batches
    4, chunks=2 -> --chunks 2, pp = 4 -> --pp 4, 'zbv' -> --schedule zbv."""
    text = re.sub(r"\bmicrobatches( = | )", r"--micro-batches ", text)
    text = re.sub(r"\bchunks=(\d+)", r"--chunks \1", text)
    text = re.sub(r"\bleave chunks out\b", "leave --chunks out", text)
    text = re.sub(r"\bpp = (\d+)", r"--pp \1", text)
    return re.sub(r"'(%s)'" % "|".join(map(re.escape, SCHEDULES)), r"--schedule \1", text)


def layout_flag_error(dp: int, pp: int, tp: int, zero: int, sp: bool, nodes: Optional[int],
                      gpus_per_node: Optional[int], batch: int, microbatches: int,
                      dtype: str, mcfg, dp_replicate: int = 1, cp: int = 1) -> Optional[str]:
    """What `minipar train` must refuse in --dp, --dp-replicate, --tp, --zero, --sp, --nodes,
    --gpus-per-node, said in flag names, or None. `mcfg`: the GPTConfig the flags describe
    (its vocabulary padded as --make-vocab-size-divisible-by says); the tensor-parallel
    split is the library's own check (check_tensor_parallel)."""
    world = dp * cp * pp * tp
    sizes = (f"--dp {dp} x " + (f"--cp {cp} x " if cp > 1 else "") +
             f"--pp {pp} x --tp {tp} = {world} ranks")
    if world > MAX_RANKS:
        return f"{sizes}, more than minipar lays out ({MAX_RANKS}); lower one of them"
    if zero and dp * cp == 1:
        return (f"--zero {zero} partitions the training state over the data-parallel ranks "
                f"(and the context-parallel ones), and --dp is 1: give --dp N (N > 1), or "
                f"leave --zero out (DDP)")
    if dp_replicate > 1 and (zero == 0 or dp % dp_replicate):
        return (f"--dp-replicate {dp_replicate} replicates ZeRO's shards over groups of --dp "
                f"{dp} / {dp_replicate} ranks: give --zero 1, 2 or 3 and a --dp-replicate in "
                f"{divisors(dp)}" + ("" if zero else " (--zero 0, DDP, replicates already)"))
    if sp and tp == 1:
        return ("--sp splits each sequence over the tensor-parallel group, and --tp is 1: "
                "give --tp N (N > 1), or leave --sp out")
    per = dp * microbatches
    if batch % per:
        return (f"--batch {batch} cannot be shared by --dp {dp} x --micro-batches "
                f"{microbatches} = {per} equal blocks ({batch} % {per} = {batch % per}): "
                f"use a --batch that is a multiple of {per}, or fewer --dp or --micro-batches")
    for flag, n in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if n is not None and world % n:
            return f"{flag} {n} does not divide the {sizes}: use {flag} in {divisors(world)}"
    if nodes is not None and gpus_per_node is not None and nodes * gpus_per_node != world:
        return (f"--nodes {nodes} x --gpus-per-node {gpus_per_node} = "
                f"{nodes * gpus_per_node} devices, but {sizes}: make the two products "
                f"equal, or give only one of --nodes and --gpus-per-node")
    if world > 1 and dtype == "float16":
        return ("--dtype float16 needs loss scaling, which the parallel engines do not do: "
                "use --dtype bfloat16 (float32's range) or float32")
    if mcfg.vocab_size % tp:
        V = mcfg.vocab_size
        return (f"--tp {tp} cannot split the vocabulary of {V} entries ({V} % {tp} = "
                f"{V % tp}): pad it with --make-vocab-size-divisible-by {tp} (Megatron's flag; "
                f"one device then trains the same padded model), or use --tp in "
                f"{divisors(V)}")
    try:
        check_tensor_parallel(mcfg, tp, sp)
    except ValueError as e:
        return f"--tp {tp}{' --sp' if sp else ''}: {tp_in_flags(str(e))}"
    return None


def divisors(n: int) -> str:
    """'{1, 2, 4, 8}'."""
    return "{" + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0) + "}"


def tp_in_flags(text: str) -> str:
    """check_tensor_parallel's advice in the command's flags: num_heads -> --heads, seq_len
    -> --seq-len, tensor-parallel size 4 -> --tp 4, ffn_hidden -> the MLP's 4 x --hidden."""
    text = re.sub(r"tensor-parallel size (\d+)", r"--tp \1", text)
    text = re.sub(r"\b(by|into) tp\b", r"\1 --tp", text)
    text = re.sub(r"\bnum_heads\b", "--heads", text)
    text = re.sub(r"\bseq_len\b", "--seq-len", text)
    return re.sub(r"\bffn_hidden\b", "the MLP's width (4 x --hidden)", text)


def cp_flag_error(args, mcfg) -> Optional[str]:
    """What `minipar train` must refuse in --cp and --cp-method, in flag names: the
    library's check (parallel/mesh/context.py) on the run's model and layout."""
    if args.cp == 1:
        return None
    if args.experts:
        return (f"--cp {args.cp} with --experts is not composed: a mixture of experts' "
                f"capacity and balancing losses are per sequence; use --cp 1 with --experts")
    dims = ParallelDims(dp_replicate=args.dp, cp=args.cp, tp=args.tp, pp=args.pp)
    try:
        check_context(mcfg, dims, args.cp_method, "zigzag", args.sp)
    except ValueError as e:
        text = re.sub(r"\bseq_len = ", "--seq-len ", str(e))
        text = re.sub(r"\bcp = (\d+)", r"--cp \1", text)
        text = re.sub(r"\btp = (\d+)", r"--tp \1", text)
        text = text.replace("choose seq_len accordingly", "choose --seq-len accordingly")
        return text.replace("cp_method='ring'", "--cp-method ring")
    return None


def moe_flag_error(args) -> Optional[str]:
    """What `minipar train` must refuse in the mixture-of-experts flags, in flag names."""
    if args.experts == 0:
        if args.global_aux_loss:
            return "--global-aux-loss balances experts, and --experts is 0: give --experts E"
        return None if args.ep == 1 else (f"--ep {args.ep} spreads experts over ranks, and "
                                          f"--experts is 0: give --experts E")
    if args.global_aux_loss and args.aux_loss_coeff == 0:
        return ("--global-aux-loss measures the aux loss over the global batch, and "
                "--aux-loss-coeff is 0 (no aux loss): give --aux-loss-coeff > 0")
    if args.top_k > args.experts:
        return f"--top-k {args.top_k} is more than --experts {args.experts}"
    if args.dp % args.ep or args.experts % args.ep:
        return (f"--ep {args.ep} must divide --dp {args.dp} (expert parallelism is folded into "
                f"the data-parallel ranks) and --experts {args.experts}; try --ep in "
                f"{[d for d in range(1, args.dp + 1) if args.dp % d == 0 == args.experts % d]}")
    if args.zero or args.sp:
        return ("--experts trains with DDP and no sequence parallelism here: leave out "
                "--zero and --sp")
    return None
