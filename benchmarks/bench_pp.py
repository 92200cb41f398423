"""Pipeline parallelism (pp = 4, and dp x pp x tp = 2 x 2 x 2): wall time against one device.

    python benchmarks/bench_pp.py              # the ratios
    python benchmarks/bench_pp.py --profile    # and a cProfile of rank 0's pipeline steps

One float32 training step of a GPT on a global batch of B sequences (forward and backward
of the m micro-batches, the optimizer step, `zero_grad`) on one simulated device, against
the same step on simulated ranks built by `parallelize(cfg, dims, schedule="1f1b",
microbatches=m, ...)` and run by `run.train_step`:

    pp = 4                 ParallelDims(pp=4), 1F1B, m = 8: one block a stage (the first
                           also embeds, the last holds the head and the loss), each rank
                           steps AdamW on its stage's parameters
    2 x 2 x 2 ZeRO-1       ParallelDims(dp_shard=2, pp=2, tp=2), zero=1, 1F1B, m = 4: two
                           blocks a stage, each a tensor-parallel half, gradients
                           reduce-scattered over dp after the last micro-batch's backward
    2 x 2 x 2 DDP          the same with dp_replicate=2, zero=0 (gradients all-reduced)

The GPT is the one of bench_model.py, bench_dp.py and bench_tp.py (l=4, h=512, a=8, s=128,
V=256; 12.9M parameters), B = 8: a pp = 4 micro-batch is one sequence, a 2 x 2 x 2
rank's block of a micro-batch one sequence too. Each pipeline step is timed on rank 0
between two barriers (so it lasts until the slowest rank is done), after an untimed
warm-up step. Single-device and pipeline runs alternate; the best and the median step of
each are compared as ratios (target: at most 1.3x). The ranks are threads sharing this
machine's cores (`launch` caps each rank's BLAS at max(1, cores // world) threads,
runtime/blas.py), where the single device has them all. A pipeline rank idles in the
bubble, (p - 1)/(m + p - 1) of the step on the simulated clock, but on fewer cores than
ranks another rank's work fills that core; the printout gives the bubble beside the ratio.

Beside the wall times it prints what depends less on other work on the machine: the CPU
seconds the process used a step (all its threads, `os.times`), against the same
single-device step on one BLAS thread (its work on one core, without the second BLAS
thread's busy-waiting), and, for the pipelines, how many waits of the simulated backend
slept a step (summed over the ranks) and how many wake-ups ended them
(runtime/backends/waits.py wakes a rank only once its wait is satisfied, so the two agree
but for the waits that straddle a step's ends).

Nothing here is asserted in tests: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Optional

import minipar as mp
from minipar.nn import GPT
from minipar.parallel import ParallelDims, parallelize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import OPT, WALL_BATCH, WALL_CONFIG, batch, blas_threads  # noqa: E402
from bench_tp import _cpu_seconds, other_load  # noqa: E402
from minipar.optim import AdamW  # noqa: E402
from minipar.runtime.blas import limit_blas_threads  # noqa: E402

TARGET = 1.3

# name: (dims, zero, micro-batches)
VARIANTS = {
    "pp = 4 (1F1B, m = 8)": (ParallelDims(pp=4), 0, 8),
    "2 x 2 x 2 ZeRO-1 (1F1B, m = 4)": (ParallelDims(dp_shard=2, pp=2, tp=2), 1, 4),
    "2 x 2 x 2 DDP (1F1B, m = 4)": (ParallelDims(dp_replicate=2, pp=2, tp=2), 0, 4),
}


def _cpu() -> float:
    """CPU seconds of this process so far, all threads."""
    t = os.times()
    return t.user + t.system


def single_device_steps(cfg, ids, tgt, steps: int,
                        blas: Optional[int] = None) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of `steps` single-device steps on the whole
    batch, after a warm-up; on `blas` BLAS threads if given (else as numpy is set up)."""
    times, cpu = [], []
    limit = limit_blas_threads(blas) if blas else contextlib.nullcontext()
    with limit, mp.device():
        model = GPT(cfg)
        opt = AdamW(model.parameters(), **OPT)
        for i in range(steps + 1):
            t0, c0 = time.perf_counter(), _cpu()
            model.loss_and_grad(ids, tgt)
            opt.step()
            opt.zero_grad()
            if i:
                times.append(time.perf_counter() - t0)
                cpu.append(_cpu() - c0)
    return times, cpu


def pipeline_steps(cfg, ids, tgt, steps: int, dims: ParallelDims, zero: int, m: int,
                   profile: bool = False) -> dict:
    """`steps` pipeline training steps (after a warm-up), each timed on rank 0 from a
    barrier to a barrier: {"times": wall seconds, "cpu": process CPU seconds, "sleeps" and
    "wakeups": the backend's waits that slept and the wake-ups that ended them (summed
    over the ranks, the closing barrier included), "build": the wall seconds
    `parallelize` took on rank 0 (building the stages, the dry-run check), "profile":
    rank 0's cProfile of the steps with `profile`}."""
    import cProfile
    import io
    import pstats

    def program(ctx):
        t0 = time.perf_counter()
        run = parallelize(cfg, dims, zero=zero, schedule="1f1b", microbatches=m, **OPT)
        out = {"build": time.perf_counter() - t0, "times": [], "cpu": [], "sleeps": [],
               "wakeups": [], "profile": ""}
        world = ctx.backend
        prof = cProfile.Profile() if profile and ctx.rank == 0 else None
        for i in range(steps + 1):
            mp.barrier()
            if prof is not None and i:
                prof.enable()
            t0, c0 = time.perf_counter(), _cpu()
            s0, w0 = sum(world.sleeps), sum(world.wakeups)
            run.train_step(ids, tgt)
            mp.barrier()
            if i:
                out["times"].append(time.perf_counter() - t0)
                out["cpu"].append(_cpu() - c0)
                out["sleeps"].append(sum(world.sleeps) - s0)
                out["wakeups"].append(sum(world.wakeups) - w0)
            if prof is not None and i:
                prof.disable()
        if prof is not None:
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
            text.write("\n  by own time:\n")
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            out["profile"] = text.getvalue()
        return out

    return mp.launch(program, dims.world_size)[0]


def wall_time(repeats: int, steps: int, profile: bool = False) -> str:
    cfg = WALL_CONFIG
    before, t_start = _cpu_seconds(), time.perf_counter()
    ids, tgt = batch(cfg, WALL_BATCH)
    single: list[float] = []
    single_cpu: list[float] = []
    one_core_cpu: list[float] = []
    keys = ("times", "cpu", "sleeps", "wakeups", "build")
    runs: dict[str, dict[str, list]] = {name: {k: [] for k in keys} for name in VARIANTS}
    for _ in range(repeats):  # interleaved, so all see the same machine state
        times, cpu = single_device_steps(cfg, ids, tgt, steps)
        single += times
        single_cpu += cpu
        one_core_cpu += single_device_steps(cfg, ids, tgt, 1, blas=1)[1]
        for name, (dims, zero, m) in VARIANTS.items():
            out = pipeline_steps(cfg, ids, tgt, steps, dims, zero, m)
            for k in keys:
                runs[name][k] += out[k] if k != "build" else [out[k]]
    pipe = {name: r["times"] for name, r in runs.items()}
    med = statistics.median
    load = other_load(before, _cpu_seconds(), time.perf_counter() - t_start)
    s_best, s_med = min(single), statistics.median(single)
    with mp.device():
        psi = GPT(cfg).num_parameters()
    lines = [f"PP step wall time against one device x {WALL_BATCH} sequences (GPT, {psi:,} "
             f"params, float32; best and median of {len(single)} steps, interleaved):",
             f"  one device: best {s_best * 1e3:.0f} ms, median {s_med * 1e3:.0f} ms; "
             f"CPU {med(single_cpu):.2f} s a step; on one BLAS thread CPU "
             f"{med(one_core_cpu):.2f} s a step"]
    for name, (dims, _, m) in VARIANTS.items():
        t, r = pipe[name], runs[name]
        bubble = (dims.pp - 1) / (m + dims.pp - 1)
        lines.append(f"  {name}, {dims.world_size} ranks: best {min(t) * 1e3:.0f} ms = "
                     f"{min(t) / s_best:.2f}x, median {med(t) * 1e3:.0f} ms = "
                     f"{med(t) / s_med:.2f}x (target <= {TARGET}x); bubble "
                     f"{100 * bubble:.0f} % of the simulated step; parallelize "
                     f"{med(r['build']) * 1e3:.0f} ms")
        lines.append(f"      CPU {med(r['cpu']):.2f} s a step "
                     f"({med(r['cpu']) / med(one_core_cpu):.2f}x the one device's on one BLAS "
                     f"thread); waits that slept {med(r['sleeps']):.0f} a step, wake-ups "
                     f"{med(r['wakeups']):.0f}")
    lines.append(f"  spread (min..max): one device {min(single) * 1e3:.0f}.."
                 f"{max(single) * 1e3:.0f} ms, " + ", ".join(
                     f"{name.split(' (')[0]} {min(t) * 1e3:.0f}..{max(t) * 1e3:.0f} ms"
                     for name, t in pipe.items()))
    lines.append(f"  {blas_threads()}; {load}")
    if profile:
        for name, (dims, zero, m) in VARIANTS.items():
            lines.append(f"\ncProfile of rank 0's {name} step (wall clock):")
            lines.append(pipeline_steps(cfg, ids, tgt, 1, dims, zero, m,
                                        profile=True)["profile"])
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    """Print the ratios. argv: the command-line arguments (None: sys.argv[1:]; run.py
    passes [] for the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (3)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (2)")
    ap.add_argument("--profile", action="store_true",
                    help="also print cProfile of rank 0's pipeline steps")
    args = ap.parse_args(argv)
    print(wall_time(args.repeats, args.steps, args.profile))


if __name__ == "__main__":
    main()
