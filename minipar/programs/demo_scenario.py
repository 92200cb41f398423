"""What the demo's data, state and performance modes show: one `Scenario` per setting of the
page's controls, and the ones `minipar demo` embeds.

    Scenario(model, dp, tp, pp, microbatches, chunks, schedule, zero, recompute)

Two models, two sources, and the page says which:
  "tiny"  a GPT small enough to execute (8 layers, hidden 32, 16 sequences of 16 tokens),
          trained for one step on simulated A100s by `parallelize(...).train_step`: the
          real trace and every rank's ledger (demo_run.py). Up to MAX_RUN_GPUS GPUs.
  "70b"   Llama 3 70B's size as a GPT (plan.sized.as_gpt), 8,192 tokens a sequence, one a
          micro-batch, on DGX A100 nodes: the dry run of the same train_step (plan/timeline.py, held equal to
          the real run event by event), one rank per pipeline stage; with ZeRO, which the
          dry run does not model, the planner's per-rank memory (demo_plan.py).
Sequence parallelism is on whenever tp > 1 (Megatron's usual setting).

The embedded set is each model's base scenario and every scenario one control away from it
(the layouts, schedules, micro-batch counts, ZeRO stages, recompute modes the page offers):
changing one control from the base shows a computed picture without a server. `minipar
demo --serve` computes any other combination when the page asks (demo_serve.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..parallel.pp.schedules import schedule as pipeline_schedule

MODELS = ("tiny", "70b")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")
RECOMPUTE = ("none", "selective", "full")
#: the tiny model's shape and batch (a GPT small enough to run a step in a fraction of a second)
TINY = dict(vocab_size=64, seq_len=16, hidden=32, num_heads=4, num_layers=8)
TINY_BATCH = 16
#: the largest tiny run the page or the server asks for (simulated ranks are threads)
MAX_RUN_GPUS = 16
#: the 70B-sized model's sequences a micro-batch, and its layers and heads (Llama 3 70B)
BIG_LAYERS, BIG_HEADS = 80, 64


@dataclass(frozen=True)
class Scenario:
    """One setting of the page's controls (schedule and chunks matter only when pp > 1)."""

    model: str = "tiny"
    dp: int = 2
    tp: int = 2
    pp: int = 2
    microbatches: int = 4
    chunks: int = 1
    schedule: str = "1f1b"
    zero: int = 0
    recompute: str = "none"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def key(self) -> str:
        """'tiny/2x2x2/1f1b/m4/v1/z0/none': the page looks scenarios up by this."""
        return (f"{self.model}/{self.dp}x{self.tp}x{self.pp}/{self.schedule}/"
                f"m{self.microbatches}/v{self.chunks}/z{self.zero}/{self.recompute}")

    @property
    def global_batch(self) -> int:
        """Sequences a step: the tiny model's fixed batch; the 70B's one a micro-batch a dp
        replica (B = m · dp)."""
        return TINY_BATCH if self.model == "tiny" else self.microbatches * self.dp

    def as_dict(self) -> dict:
        return dict(asdict(self), key=self.key, gpus=self.gpus,
                    global_batch=self.global_batch)


def check(s: Scenario) -> Scenario:
    """`s` if minipar can build it, else a ValueError that says which control to change."""
    if s.model not in MODELS:
        raise ValueError(f"model {s.model!r}: expected one of {MODELS}")
    for name in ("dp", "tp", "pp", "microbatches", "chunks"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if s.schedule not in SCHEDULES:
        raise ValueError(f"schedule {s.schedule!r}: expected one of {SCHEDULES}")
    if s.zero not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {s.zero!r}: expected 0, 1, 2 or 3")
    if s.recompute not in RECOMPUTE:
        raise ValueError(f"recompute {s.recompute!r}: expected one of {RECOMPUTE}")
    if s.zero and s.dp == 1:
        raise ValueError(f"ZeRO-{s.zero} shards over the dp group, which is 1: give dp > 1")
    if (s.chunks > 1) != (s.schedule == "interleaved_1f1b"):
        raise ValueError(f"chunks = {s.chunks} with schedule {s.schedule}: the interleaved "
                         f"1F1B takes chunks >= 2, the others chunks = 1")
    heads, layers = ((TINY["num_heads"], TINY["num_layers"]) if s.model == "tiny"
                     else (BIG_HEADS, BIG_LAYERS))
    if heads % s.tp:
        raise ValueError(f"tp = {s.tp} does not divide the {heads} attention heads")
    if layers < s.pp * s.chunks:
        raise ValueError(f"pp x chunks = {s.pp * s.chunks} stages but only {layers} layers")
    if s.model == "70b" and s.zero and layers % (s.pp * s.chunks):
        raise ValueError(f"ZeRO on the 70B comes from the planner, which splits the {layers} "
                         f"layers evenly: pp x chunks = {s.pp * s.chunks} does not divide "
                         f"them (pick pp 2 or 4)")
    if s.model == "tiny":
        if s.gpus > MAX_RUN_GPUS:
            raise ValueError(f"{s.gpus} GPUs: the tiny model is executed, on at most "
                             f"{MAX_RUN_GPUS}; pick the 70B model for larger layouts")
        if TINY_BATCH % (s.dp * (s.microbatches if s.pp > 1 else 1)):
            raise ValueError(f"the tiny model's {TINY_BATCH} sequences do not split into dp "
                             f"= {s.dp} x {s.microbatches} micro-batches")
    if s.pp > 1:
        pipeline_schedule(s.schedule, s.pp, s.microbatches, s.chunks)  # its own errors
    elif s.schedule != "1f1b" or s.microbatches != 1 or s.chunks != 1:
        raise ValueError("pp = 1 runs no pipeline: give microbatches = 1, chunks = 1 and "
                         "the schedule '1f1b' (the page's controls do)")
    return s


def normal(s: Scenario) -> Scenario:
    """The same scenario with the pipeline controls at their pp = 1 values when pp = 1."""
    return replace(s, microbatches=1, chunks=1, schedule="1f1b") if s.pp == 1 else s


#: each model's base scenario (the page opens on it) and the seed's layouts for the 70B
BASE = {"tiny": Scenario("tiny", 2, 2, 2, 4),
        "70b": Scenario("70b", 8, 4, 2, 4)}
SEED_LAYOUTS = {"tiny": [(1, 1, 1), (2, 1, 1), (4, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1),
                         (2, 1, 2), (1, 2, 2), (2, 2, 2), (1, 1, 4), (1, 2, 4), (2, 1, 4)],
                "70b": [(8, 4, 2), (2, 4, 3), (16, 4, 2), (8, 8, 2), (4, 4, 4)]}
CHOICES = {"microbatches": {"tiny": (2, 4, 8), "70b": (2, 4, 8)},
           "zero": (0, 1, 2, 3), "recompute": RECOMPUTE, "schedule": SCHEDULES}


def neighbours(base: Scenario) -> list[Scenario]:
    """`base` and every valid scenario one control away from it (module docstring)."""
    out = [base]
    for dp, tp, pp in SEED_LAYOUTS[base.model]:
        out.append(normal(replace(base, dp=dp, tp=tp, pp=pp)))
    for name in SCHEDULES:
        out.append(replace(base, schedule=name,
                           chunks=2 if name == "interleaved_1f1b" else 1))
    out += [replace(base, microbatches=m) for m in CHOICES["microbatches"][base.model]]
    out += [replace(base, zero=z) for z in CHOICES["zero"]]
    out += [replace(base, recompute=r) for r in RECOMPUTE]
    seen, keep = set(), []
    for s in out:
        try:
            check(s)
        except ValueError:
            continue
        if s.key not in seen:
            seen.add(s.key)
            keep.append(s)
    return keep


#: three more sets, beyond one control from the base: the 70B's four schedules on the
#: kitchen (three stations: schedules side by side), and the tiny model's ZeRO stages on
#: dp 4 with no pipeline (where ZeRO-2's gradients shrink; with a pipeline they cannot,
#: every micro-batch accumulates into the full gradient before the step's reduce-scatter)
KITCHEN_SCHEDULES = [Scenario("70b", 2, 4, 3, 6, 2 if n == "interleaved_1f1b" else 1, n)
                     for n in SCHEDULES]
ZERO_WITHOUT_PIPELINE = [Scenario("tiny", 4, 1, 1, 1, zero=z) for z in (0, 1, 2, 3)]
#: and what fits the 70B's base layout in 80 GB: no ZeRO stage alone does (8,192-token
#: sequences' activations), no recompute mode alone does; these pairs do (the planner's)
WHAT_FITS = [replace(BASE["70b"], zero=z, recompute=r)
             for z, r in ((1, "full"), (2, "full"), (3, "selective"), (3, "full"))]


def embedded() -> list[Scenario]:
    """Everything `minipar demo` computes into the page: both models' neighbourhoods, then
    KITCHEN_SCHEDULES, ZERO_WITHOUT_PIPELINE and WHAT_FITS."""
    out = neighbours(BASE["tiny"]) + neighbours(BASE["70b"])
    out += KITCHEN_SCHEDULES + ZERO_WITHOUT_PIPELINE + WHAT_FITS
    seen, keep = set(), []
    for s in out:
        if s.key not in seen:
            check(s)
            seen.add(s.key)
            keep.append(s)
    return keep
