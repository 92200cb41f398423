"""Benchmarks of the runtime, as ratios measured side by side in one run.

    python benchmarks/run.py

prints every ratio: the simulated backend's all_reduce against bare NumPy, the barrier
latency against a bare threading.Barrier, a single-device GPT training step's model
FLOP/s against bare np.matmul's (benchmarks/bench_model.py), the wall time of a
data-parallel step on 4 simulated ranks against one device (benchmarks/bench_dp.py), the
wall time of a 2 x 2 (dp x tp) tensor-parallel step against one device
(benchmarks/bench_tp.py), the wall time of a pp = 4 and a 2 x 2 x 2 (dp x pp x tp)
pipeline step against one device (benchmarks/bench_pp.py), the dry run of a
Llama-3-405B-sized step on 16,384 GPUs against its 10 s target and a small layout's dry run
against its real simulated step (benchmarks/bench_dry_run.py), and, when mpi4py and mpiexec are installed (the [mpi] extra),
the MPI backend's all_reduce against raw mpi4py, by running
`mpiexec -n 4 python benchmarks/bench_mpi.py`.

`--only scale` runs benchmarks/bench_scale.py instead: one step of a tiny GPT at 16 ...
4,096 simulated ranks, the wall time and its growth (minutes, so not in the default run).

Nothing here is asserted in tests: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import minipar as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import main as dp_benchmark  # noqa: E402  (benchmarks/bench_dp.py)
from bench_dry_run import main as dry_run_benchmark  # noqa: E402  (bench_dry_run.py)
from bench_model import gpt_step_efficiency  # noqa: E402  (benchmarks/bench_model.py)
from bench_pp import main as pp_benchmark  # noqa: E402  (benchmarks/bench_pp.py)
from bench_scale import main as scale_benchmark  # noqa: E402  (benchmarks/bench_scale.py)
from bench_tp import main as tp_benchmark  # noqa: E402  (benchmarks/bench_tp.py)


def allreduce_sim(world: int, nbytes: int, iters: int) -> float:
    """Seconds per all_reduce of `nbytes` float32 on `world` simulated ranks."""
    def prog(ctx):
        x = np.full(nbytes // 4, ctx.rank + 1, np.float32)
        mp.all_reduce(x)  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            mp.all_reduce(x)
        return time.perf_counter() - t0

    return max(mp.launch(prog, world)) / iters


def allreduce_numpy(world: int, nbytes: int, iters: int) -> float:
    """The bare NumPy baseline: sum the `world` arrays and make `world` result copies."""
    xs = [np.full(nbytes // 4, r + 1, np.float32) for r in range(world)]
    t0 = time.perf_counter()
    for _ in range(iters):
        total = xs[0] + xs[1]
        for x in xs[2:]:
            total += x
        outs = [total.copy() for _ in range(world)]
    del outs
    return (time.perf_counter() - t0) / iters


def barrier_latency(world: int, iters: int) -> float:
    def prog(ctx):
        mp.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            mp.barrier()
        return time.perf_counter() - t0

    return max(mp.launch(prog, world)) / iters


def barrier_floor(world: int, iters: int) -> float:
    """The floor of any thread rendezvous in CPython: a bare threading.Barrier."""
    import threading

    b = threading.Barrier(world)
    times: list[float] = []

    def run() -> None:
        b.wait()
        t0 = time.perf_counter()
        for _ in range(iters):
            b.wait()
        times.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=run) for _ in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(times) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("runtime", "model", "dp", "tp", "pp", "dry-run", "mpi",
                                         "scale"),
                    help="run one group of benchmarks (default: all but scale, which "
                    "takes minutes: one step at 16 ... 4,096 simulated ranks)")
    args = ap.parse_args()
    if args.only in (None, "runtime"):
        runtime_benchmarks(args.repeats)
    if args.only in (None, "model"):
        print(gpt_step_efficiency(max(args.repeats, 7)))
    if args.only in (None, "dp"):
        dp_benchmark([])
    if args.only in (None, "tp"):
        tp_benchmark([])
    if args.only in (None, "pp"):
        pp_benchmark([])
    if args.only in (None, "dry-run"):
        dry_run_benchmark([])
    if args.only in (None, "mpi"):
        print(mpi_benchmark())
    if args.only == "scale":
        scale_benchmark([])


def runtime_benchmarks(repeats: int) -> None:
    """The simulated backend's all_reduce and barrier against their bare baselines."""
    world, nbytes = 8, 16 << 20
    sim, base = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine state
        base.append(allreduce_numpy(world, nbytes, 5))
        sim.append(allreduce_sim(world, nbytes, 5))
    s, b = statistics.median(sim), statistics.median(base)
    print(f"all_reduce 8 ranks x 16 MiB float32, sim backend: {s * 1e3:.2f} ms; "
          f"bare NumPy sum + 8 copies: {b * 1e3:.2f} ms; ratio {s / b:.2f} (target <= 1.3)")
    lat, floor = [], []
    for _ in range(repeats):
        floor.append(barrier_floor(world, 1000))
        lat.append(barrier_latency(world, 1000))
    lat_m, floor_m = statistics.median(lat), statistics.median(floor)
    print(f"empty barrier among 8 ranks: {lat_m * 1e6:.1f} us (aim < 100 us); a bare "
          f"threading.Barrier(8): {floor_m * 1e6:.1f} us; ratio {lat_m / floor_m:.2f}")


def mpi_benchmark() -> str:
    """Run bench_mpi.py under mpiexec -n 4 and return what it printed (or why not)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi: skipped (pip install -e \".[mpi]\" to measure the MPI backend)"
    here = os.path.dirname(os.path.abspath(__file__))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec") or ""
    if not mpiexec:
        return "mpi: skipped (no mpiexec found next to python or on PATH)"
    proc = subprocess.run([mpiexec, "-n", "4", sys.executable,
                           os.path.join(here, "bench_mpi.py")],
                          capture_output=True, text=True, timeout=600)
    return proc.stdout.strip() if proc.returncode == 0 else f"mpi: failed\n{proc.stderr}"


if __name__ == "__main__":
    main()
