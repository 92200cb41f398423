"""A training layout as the planner reads it: how a model is split, scheduled and stored.

    Layout(tp=8, pp=8, dp=8, schedule="interleaved_1f1b", chunks=3, micro_batch=1,
           global_batch=64, sequence_parallel=True, recompute="selective")

The sizes are ParallelDims' (dp data-parallel replicas or shards, cp context-parallel ranks,
ep expert-parallel ranks folded into dp x cp); the schedule is a name of
minipar.parallel.pp.SCHEDULES with its chunks; the memory knobs are Megatron-LM's and
DeepSpeed's:

    zero                  0 (DDP), 1, 2, 3 (ZeRO stages over dp x cp)
    distributed_optimizer Megatron's: the fp32 master and Adam's moments sharded over dp
                          (ZeRO-1 by another name); kept apart because Megatron reports
                          both ways
    fp32_grads            Megatron's main_grad: a float32 copy of the gradients beside the
                          bf16 weights (18 bytes a parameter with Adam, not 16)
    recompute             "none", "selective" (Korthikanti et al.'s attention core),
                          "full" (each layer's input kept, the layer rerun)
    precision             "bf16" (mixed, with float32 masters) or "fp32"

The planner's models (memory, time) take a ModelSpec (presets.py), a Layout and a
ClusterSpec; a Layout checks only its own consistency here (sizes, names); whether a model
splits under it (heads by tp, layers by pp x chunks) is the model's question.
"""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp32")


@dataclass(frozen=True)
class Layout:
    """dp x cp x tp x pp ranks (ep folded into dp x cp), one schedule, one memory plan."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    schedule: str = "1f1b"
    chunks: int = 1  # model chunks per pipeline rank (interleaved: v)
    micro_batch: int = 1  # sequences per micro-batch (b)
    global_batch: int = 1  # sequences per step (B); m = B / (b · dp) micro-batches
    sequence_parallel: bool = False
    recompute: str = "none"
    zero: int = 0
    distributed_optimizer: bool = False
    fp32_grads: bool = True
    precision: str = "bf16"

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "cp", "ep", "chunks", "micro_batch", "global_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Layout.{name} must be a positive int, got {v!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout.recompute must be one of {RECOMPUTE}, got "
                             f"{self.recompute!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Layout.precision must be one of {PRECISIONS}, got "
                             f"{self.precision!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout.zero is a ZeRO stage 0..3, got {self.zero!r}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"Layout.ep = {self.ep} must divide dp x cp = "
                             f"{self.dp * self.cp} (expert parallelism is folded into them)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("Layout.sequence_parallel splits over the tp group: give tp > 1")
        per = self.micro_batch * self.dp
        if self.global_batch % per:
            raise ValueError(f"Layout.global_batch = {self.global_batch} is not a multiple of "
                             f"micro_batch x dp = {per}: every rank runs whole micro-batches")

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        """m: micro-batches each pipeline runs a step."""
        return self.global_batch // (self.micro_batch * self.dp)

    def __str__(self) -> str:
        parts = [f"{n} {getattr(self, n)}" for n in ("tp", "pp", "dp", "cp", "ep")
                 if getattr(self, n) > 1]
        extra = [f"{self.schedule}" + (f" x{self.chunks}" if self.chunks > 1 else "")
                 if self.pp > 1 else "", "SP" if self.sequence_parallel else "",
                 f"recompute {self.recompute}" if self.recompute != "none" else "",
                 f"ZeRO-{self.zero}" if self.zero else "",
                 "distributed optimizer" if self.distributed_optimizer else ""]
        return (", ".join(parts) or "one GPU") + "".join(f", {e}" for e in extra if e) + \
            f"; b {self.micro_batch}, B {self.global_batch} ({self.gpus} GPUs)"
