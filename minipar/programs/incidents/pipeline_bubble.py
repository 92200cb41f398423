"""Incident B: a deep pipeline with few micro-batches. idle = (p - 1)/(m + p - 1) of a step.

The rule: with p equal stages and m micro-batches, GPipe and 1F1B both run a step in
(m + p - 1)(t_F + t_B), of which each rank computes m(t_F + t_B). Two spellings of the
same bubble:

    bubble over ideal   (p - 1)/m            idle time over compute time (GPipe, Megatron)
    idle share          (p - 1)/(m + p - 1)  the part of the step a rank stands idle
    MFU bound           m/(m + p - 1)        times the MFU the stages reach with no bubble

Interleaving v model chunks per rank divides the bubble by v: (p - 1)/(v·m) over ideal,
(p - 1)/(v·m + p - 1) of the step, for v times the point-to-point messages.

The case: a 200B MoE on 512 H100s with PP = 64 and 4 micro-batches ran at 28 % MFU. The
write-up computed "bubble ratio = (64 - 1)/4 = 1575 %", and said that raising the
micro-batches to 32 brought the bubble to 200 % and MFU back to 51 %. The 1575 % and the
"200 %" (63/32 = 197 %) are the bubble over ideal, right as such; but a bubble of
(p - 1)/m over ideal leaves m/(m + p - 1) of the step to compute: 4/67 = 6.0 % at m = 4
and 32/95 = 33.7 % at m = 32. So 28 % at m = 4 would need 28/0.060 = 469 % MFU inside the
stages, and 51 % at m = 32 would need 151 %: neither can hold with 64 equal stages. What
51 % does take: m/(m + p - 1) >= 51/MFU_stage, so m >= (p - 1) r/(1 - r) with
r = 51/MFU_stage: m >= 66 if the stages ran at 100 % (the floor), m >= 357 at 60 %; or
interleaving, v·m in place of m.

How the run shows it: the schedules of p = 64 stages of a tiny GPT (one block a stage,
the durations a block's F and B took on the simulated device, measured by the runner)
are lowered and timed by the dry run for m = 4, 32, the m the claim needs and an
interleaved alternative; and at p = 4, m = 8, where it runs in a second, the runner's
clock on simulated devices equals the dry run's to the nanosecond.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from ...nn import GPT, GPTConfig
from ...parallel.pp import PipelineRunner, build_stages, dry_run, lower, placement, schedule
from ...runtime import cost
from ...runtime.launch import launch
from ...runtime.topology import DeviceSpec, Topology
from .planned import plan_b, report_b

P = 64                    # the seed's pipeline depth
SEED_M, SEED_FIX_M = 4, 32
SEED_MFU, SEED_FIX_MFU = 0.28, 0.51
MFU_STAGE = 0.60          # the no-bubble MFU assumed for "what it takes" (a good H100 stage)
SMALL_P, SMALL_M = 4, 8   # the runner's size
MODEL = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=2, num_layers=SMALL_P,
                  seed=0)
DEVICE = DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s: steps of milliseconds


def formulas(p: int, m: int, v: int = 1) -> dict[str, float]:
    """bubble over ideal (p - 1)/(v m), idle share (p - 1)/(v m + p - 1), MFU bound
    v m/(v m + p - 1), 1F1B's peak in flight min(p - r, m) on rank 0."""
    return {"over_ideal": (p - 1) / (v * m), "idle_share": (p - 1) / (v * m + p - 1),
            "mfu_bound": v * m / (v * m + p - 1), "peak_rank0": min(p, m) if v == 1 else None}


def needed_m(p: int, target: float, mfu_stage: float, v: int = 1) -> int:
    """The least m with v m/(v m + p - 1) >= target/mfu_stage: ceil((p-1) r/((1-r) v))."""
    r = target / mfu_stage
    if r >= 1:
        raise ValueError(f"a pipelined step reaches at most the stages' own MFU: target "
                         f"{target:.0%} needs stages above it, got mfu_stage={mfu_stage:.0%}")
    return math.ceil((p - 1) * r / ((1 - r) * v) - 1e-12)


def _batch(cfg: GPTConfig, m: int, b: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.integers(0, cfg.vocab_size, (cfg.seq_len, m * b)) for _ in range(2))


def runner_vs_dry_run(cfg: GPTConfig = MODEL, p: int = SMALL_P, m: int = SMALL_M) -> dict:
    """One 1F1B step on p simulated devices: each rank's clock at the end of the schedule,
    the dry run's prediction from the trace's F/B durations and the runtime's p2p costs,
    and the F and B time of a middle stage (one block)."""
    actions = schedule("1f1b", p, m)
    ids, tgt = _batch(cfg, m)
    topology = Topology.single_node(p, device=DEVICE)

    def program(ctx):
        runner = PipelineRunner(build_stages(GPT(cfg), placement(actions), ctx.rank), actions)
        runner.step(ids, tgt)
        return runner.last_step.schedule_end, [e for e in ctx.trace.events if "action" in e.meta]

    res = launch(program, p, topology=topology)
    durations: dict = {"F": [0.0] * p, "B": [0.0] * p}
    for _, events in res:
        for e in events:
            durations[e.meta["kind"]][e.meta["stage"]] = e.duration
    nbytes = cfg.seq_len * 2 * cfg.hidden * 8  # [s, b, h] float64
    link = {(a, c): cost.p2p_time(nbytes, topology.link(a, c))
            for a in range(p) for c in range(p) if a != c}
    predicted = dry_run(lower(actions), durations, lambda msg: link[msg.src, msg.dst])
    clock = [end for end, _ in res]
    return {"p": p, "m": m, "clock": clock, "predicted": list(predicted.finish),
            "makespan": predicted.makespan, "worst_ns": max(
                abs(c - f) for c, f in zip(clock, predicted.finish)) * 1e9,
            "t_F": durations["F"][p // 2], "t_B": durations["B"][p // 2]}


def case(name: str, p: int, m: int, v: int, t_F: float, t_B: float) -> dict:
    """The dry run of p·v equal stages (a rank's block split into v chunks), no p2p cost."""
    d = dry_run(lower(schedule(name, p, m, v)),  # Fractions: every ratio exact
                {"F": Fraction(t_F) / v, "B": Fraction(t_B) / v})
    return {"schedule": name, "p": p, "m": m, "v": v, "makespan": float(d.makespan),
            "over_ideal": float(d.bubble_over_ideal), "idle_share": float(d.bubble_over_total),
            "mfu_bound": float(1 - d.bubble_over_total), "peak_in_flight": list(d.peak_in_flight),
            "peak_activations": [float(x) for x in d.peak_activations]}


def run(out: Callable[[str], Any] = print, mfu_stage: float = MFU_STAGE) -> dict[str, Any]:
    """Time the seed's pipeline at m = 4, 32, what 51 % takes, and interleaved; print and
    return {"small": runner_vs_dry_run(), "cases": {key: case(...)}, "implied": {...},
    "needed": {...}}."""
    small = runner_vs_dry_run()
    t_F, t_B = small["t_F"], small["t_B"]
    floor_m = needed_m(P, SEED_FIX_MFU, 1.0)          # stages at 100 %: the least m there is
    real_m = needed_m(P, SEED_FIX_MFU, mfu_stage)     # stages at the assumed MFU
    v = 2
    inter_m = P * math.ceil(needed_m(P, SEED_FIX_MFU, 1.0, v) / P)  # Megatron: m % p == 0
    cases = {"seed": case("1f1b", P, SEED_M, 1, t_F, t_B),
             "seed_fix": case("1f1b", P, SEED_FIX_M, 1, t_F, t_B),
             "needed": case("1f1b", P, floor_m, 1, t_F, t_B),
             "interleaved": case("interleaved_1f1b", P, inter_m, v, t_F, t_B)}
    implied = {"at_seed": SEED_MFU / cases["seed"]["mfu_bound"],
               "at_fix": SEED_FIX_MFU / cases["seed_fix"]["mfu_bound"]}
    needed = {"floor": floor_m, "at_assumed": real_m, "assumed_mfu": mfu_stage,
              "interleaved_m": inter_m, "interleaved_v": v}
    planned = plan_b()
    for line in report(small, cases, implied, needed) + report_b(planned):
        out(line)
    return {"small": small, "cases": cases, "implied": implied, "needed": needed,
            "t_F": t_F, "t_B": t_B, "planned": planned}


def report(small: dict, cases: dict, implied: dict, needed: dict) -> list[str]:
    """The table and which of the seed's numbers cannot hold."""
    c = cases["seed"]
    lines = [
        "Incident B: pipeline parallelism with PP = 64 and 4 micro-batches",
        "the case: a 200B MoE on 512 H100s, PP = 64, m = 4 micro-batches, MFU 28 %; "
        "\"bubble ratio = (64 - 1)/4 = 1575 %\";",
        "  m = 32 \"brings the bubble to 200 % and MFU back to 51 %\"",
        f"the runner at p = {small['p']}, m = {small['m']} (1F1B, a tiny GPT on simulated "
        f"devices): its clock ends at {small['makespan'] * 1e3:.6f} ms, the dry run's "
        f"prediction on every rank (worst difference {small['worst_ns']:.1g} ns)",
        f"p = {c['p']} equal stages of one block (t_F = {small['t_F'] * 1e6:.2f} us, "
        f"t_B = {small['t_B'] * 1e6:.2f} us, as the runner measured), dry run, no p2p cost:",
        f"  {'':<30}{'m':>5}{'v':>3}{'step (ms)':>11}{'over ideal':>12}{'idle share':>12}"
        f"{'MFU bound':>11}{'peak in flight r0':>19}",
    ]
    labels = {"seed": "the seed's step", "seed_fix": "the seed's fix",
              "needed": "what 51 % needs (stages 100 %)",
              "interleaved": "interleaved 1F1B"}
    for key, r in cases.items():
        lines.append(f"  {labels[key]:<30}{r['m']:>5}{r['v']:>3}{r['makespan'] * 1e3:>11.3f}"
                     f"{100 * r['over_ideal']:>10.1f} %{100 * r['idle_share']:>10.1f} %"
                     f"{100 * r['mfu_bound']:>9.1f} %{r['peak_in_flight'][0]:>19}")
    f = cases["seed_fix"]
    lines += [
        "  (MFU bound: the share of the step a rank computes, m/(m + p - 1), times whatever "
        "MFU the stages reach alone;",
        "   peak in flight: micro-batches rank 0 holds, min(p - r, m) under 1F1B; interleaved "
        "counts (chunk, micro-batch) pairs, each 1/v of the rank's layers)",
        "what holds and what cannot:",
        f"  - \"1575 %\" is (p - 1)/m = 63/4, the bubble over the ideal time: right as that. "
        f"As a share of the step it is 63/67 = {100 * c['idle_share']:.1f} % idle.",
        f"  - MFU 28 % at m = 4 cannot hold with 64 equal stages: the bound is "
        f"{100 * c['mfu_bound']:.1f} % of the stages' own MFU, so 28 % implies stages at "
        f"{100 * implied['at_seed']:.0f} % MFU.",
        f"  - \"200 %\" at m = 32 is 63/32 = {100 * f['over_ideal']:.1f} % over ideal, "
        f"{100 * f['idle_share']:.1f} % of the step idle; MFU 51 % would need stages at "
        f"{100 * implied['at_fix']:.0f} %: m = 32 alone cannot bring 51 %.",
        f"  - 51 % needs m/(m + 63) >= 51 %/MFU_stage: m >= {needed['floor']} even if the "
        f"stages ran at 100 % MFU; at an assumed {100 * needed['assumed_mfu']:.0f} % "
        f"(a good H100 stage), m >= {needed['at_assumed']}.",
        f"  - or interleave: v = {needed['interleaved_v']} chunks at m = "
        f"{needed['interleaved_m']} (Megatron needs m % p == 0) gives an idle share of "
        f"{100 * cases['interleaved']['idle_share']:.1f} %, for v times the p2p messages.",
        "  1F1B does not shrink the bubble (GPipe's is the same); it caps the micro-batches "
        "in flight at p, so raising m past p adds no activation memory.",
    ]
    return lines
