"""Megatron tensor parallelism on a 2 x 2 (dp x tp) mesh: wall time against one device.

    python benchmarks/bench_tp.py              # the ratios
    python benchmarks/bench_tp.py --profile    # and a cProfile of rank 0's 2 x 2 steps

One float32 training step of a GPT on a global batch of B sequences (`loss_and_grad`, the
optimizer step, `zero_grad`) on one simulated device, against the same step on 4 simulated
ranks built by `parallelize(cfg, ParallelDims(dp_replicate=2, tp=2), zero=0)` (ZeRO:
`dp_shard=2`): each rank
runs `TensorParallelGPT` on the tp group (half of every weight matrix, half the heads) and
on its data-parallel block of B/2 sequences, and a data-parallel engine over the dp group
steps AdamW. Three 2 x 2 variants:

    DDP          zero=0: gradients all-reduced over dp in buckets
    ZeRO-1       zero=1: gradients reduce-scattered, Adam on half, all-gathered
    DDP + SP     DDP with sequence_parallel=True: the residual stream, LayerNorms and
                 dropout split along s over tp (all-gather / reduce-scatter instead of the
                 tensor-parallel all-reduces)

The GPT is the one of bench_model.py and bench_dp.py (l=4, h=512, a=8, s=128, V=256;
12.9M parameters), B = 8. Each 2 x 2 step is timed on rank 0 between two barriers, so it
lasts until the slowest rank is done. Single-device and 2 x 2 runs alternate; the medians
are compared as ratios (target: at most 1.5x). The 4 rank threads share this machine's
cores (`launch` caps each rank's BLAS at max(1, cores // 4) threads, runtime/blas.py),
where the single device has them all. Another run has the same 2 x 2 tensor-parallel
model with no data-parallel engine (each rank steps its own AdamW on its own shard's
gradients, no dp communication): what tensor parallelism and the threads cost before any
data-parallel code runs.

Nothing here is asserted in tests: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Optional

import minipar as mp
from minipar.data import split_data_parallel
from minipar.nn import GPT
from minipar.optim import AdamW
from minipar.parallel import ParallelDims, ParallelGroups, build_model, parallelize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import (OPT, WALL_BATCH, WALL_CONFIG, batch, blas_threads,  # noqa: E402
                      single_device_steps, timed_steps)

DP, TP = 2, 2
TARGET = 1.5

# name: (engine stage or None for no engine, sequence_parallel)
VARIANTS = {"DDP": (0, False), "ZeRO-1": (1, False), "DDP + SP": (0, True),
            "no engine": (None, False)}


def mesh_steps(cfg, ids, tgt, steps: int, stage: Optional[int], sequence_parallel: bool,
               profile: bool = False) -> tuple[list[float], str]:
    """Wall seconds of `steps` 2 x 2 (dp x tp) steps (after a warm-up), timed on rank 0
    from a barrier to a barrier; with `profile`, rank 0's cProfile of them. stage None: no
    engine, each rank steps its own AdamW on its own gradients (no dp communication)."""
    # DDP's dp ranks are replicas (dp_replicate); ZeRO partitions over them (dp_shard)
    dims = (ParallelDims(dp_replicate=DP, tp=TP) if stage in (None, 0)
            else ParallelDims(dp_shard=DP, tp=TP))

    def program(ctx):
        groups = ParallelGroups(dims)
        if stage is None:  # the tensor-parallel model alone: each rank steps its own shards
            model = build_model(cfg, groups, sequence_parallel)
            engine = AdamW(model.parameters(), **OPT)
        else:
            run = parallelize(cfg, dims, zero=stage, sequence_parallel=sequence_parallel,
                              groups=groups, **OPT)
            model, engine = run.model, run.engine
        x, y = split_data_parallel(ids, tgt, *groups.batch_shard)
        return timed_steps(model, engine, x, y, steps, profile and ctx.rank == 0)

    return mp.launch(program, DP * TP)[0]


def _cpu_seconds() -> Optional[tuple[float, float]]:
    """(busy seconds of all CPUs from /proc/stat, this process's CPU seconds), or None
    off Linux: their difference over a run is what other processes took."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    t = os.times()
    return busy / hz, t.user + t.system


def other_load(before, after, wall: float) -> str:
    """What other processes took of the machine's CPUs during the run."""
    if before is None or after is None or wall <= 0:
        return "other processes' CPU use: unknown (no /proc/stat)"
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    cpus = os.cpu_count() or 1
    return (f"other processes used {others:.0f} CPU-s of the {cpus * wall:.0f} available "
            f"during the run ({100 * others / (cpus * wall):.0f} %; near 0 % = a quiet machine)")


def wall_time(repeats: int, steps: int, profile: bool = False) -> str:
    cfg = WALL_CONFIG
    before, t_start = _cpu_seconds(), time.perf_counter()
    ids, tgt = batch(cfg, WALL_BATCH)
    single: list[float] = []
    mesh: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):  # interleaved, so all see the same machine state
        single += single_device_steps(cfg, ids, tgt, steps)
        for name, (stage, sp) in VARIANTS.items():
            mesh[name] += mesh_steps(cfg, ids, tgt, steps, stage, sp)[0]
    load = other_load(before, _cpu_seconds(), time.perf_counter() - t_start)
    s = statistics.median(single)
    med = {name: statistics.median(t) for name, t in mesh.items()}
    with mp.device():
        psi = GPT(cfg).num_parameters()
    lines = [f"TP step wall time, {DP} x {TP} (dp x tp) simulated ranks x "
             f"{WALL_BATCH // DP} sequences against one device x {WALL_BATCH} (GPT, "
             f"{psi:,} params, float32; medians of {len(single)} steps, interleaved):",
             f"  one device {s * 1e3:.0f} ms; " + "; ".join(
                 f"{name} {med[name] * 1e3:.0f} ms = {med[name] / s:.2f}x"
                 for name in VARIANTS if name != "no engine")
             + f" (target <= {TARGET}x)",
             f"  the same {DP} x {TP} tensor-parallel model with no data-parallel engine "
             f"(each rank steps its own AdamW, no dp communication): "
             f"{med['no engine'] * 1e3:.0f} ms = {med['no engine'] / s:.2f}x",
             f"  spread (min..max): one device {min(single) * 1e3:.0f}..{max(single) * 1e3:.0f}"
             " ms, " + ", ".join(f"{name} {min(t) * 1e3:.0f}..{max(t) * 1e3:.0f} ms"
                                 for name, t in mesh.items()),
             f"  {blas_threads()}; {load}"]
    if profile:
        for name, (stage, sp) in VARIANTS.items():
            if stage is None:
                continue
            lines.append(f"\ncProfile of rank 0's {DP} x {TP} {name} step (wall clock):")
            lines.append(mesh_steps(cfg, ids, tgt, 1, stage, sp, profile=True)[1])
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    """Print the ratios. argv: the command-line arguments (None: sys.argv[1:]; run.py
    passes [] for the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (3)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (2)")
    ap.add_argument("--profile", action="store_true",
                    help="also print cProfile of rank 0's 2 x 2 steps")
    args = ap.parse_args(argv)
    print(wall_time(args.repeats, args.steps, args.profile))


if __name__ == "__main__":
    main()
