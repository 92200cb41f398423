"""minipar's all_reduce on the MPI backend against a bare mpi4py Allreduce, side by side.

    mpiexec -n 4 python benchmarks/bench_mpi.py [--mib 16] [--reps 41]

Both reduce the same float32 buffers in one run, in alternating order: raw
`comm.Allreduce(x, out)` into a preallocated `out`, and `mp.all_reduce(x)`, the whole
front end (validation, ledger, simulated clock and trace) returning a new result array.
Each time is the slowest rank's. The ratio is the median over repetitions of minipar's
time over the raw time measured next to it, which a busy machine disturbs less than a
ratio of medians taken apart; rank 0 prints it with its spread (the per-repetition
ratios' quartiles), the ratio of the fastest times, the median times and the machine's load (the 1-minute load average;
on 2 cores, anything above 4 means the 4 ranks share them with other work).
Nothing is asserted: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import minipar as mp


def slowest(comm, seconds: float) -> float:
    return comm.allreduce(seconds, op=MPI.MAX)


def bench(ctx, nbytes: int, reps: int) -> tuple[float, float, list[float], float]:
    """(median raw seconds, median minipar seconds, the per-repetition ratios sorted, the
    ratio of the two fastest times: what each costs when nothing else interferes)."""
    comm = MPI.COMM_WORLD
    x = np.full(nbytes // 4, ctx.rank + 1, np.float32)
    out = np.empty_like(x)
    raw, ours = [], []
    y = None
    for k in range(reps + 2):  # the first two are warm-up
        t = {}
        for who in ("raw", "minipar") if k % 2 else ("minipar", "raw"):  # alternate order
            comm.Barrier()
            t0 = time.perf_counter()
            if who == "raw":
                comm.Allreduce(x, out)
            else:
                y = mp.all_reduce(x)
            t[who] = slowest(comm, time.perf_counter() - t0)
        if k >= 2:
            raw.append(t["raw"])
            ours.append(t["minipar"])
    assert np.array_equal(y, out), "minipar and mpi4py disagree"
    return (statistics.median(raw), statistics.median(ours),
            sorted(o / r for o, r in zip(ours, raw)), min(ours) / min(raw))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16, help="buffer size in MiB")
    parser.add_argument("--reps", type=int, default=41, help="timed repetitions")
    args = parser.parse_args()
    n = MPI.COMM_WORLD.Get_size()
    res = mp.launch(lambda ctx: bench(ctx, args.mib << 20, args.reps), world_size=n,
                    backend="mpi")
    raw, ours, ratios, best = res[0]
    if res.contexts[0].rank == 0:
        q1, q2, q3 = statistics.quantiles(ratios, n=4)
        print(f"mpi all_reduce {args.mib} MiB x {n} ranks: minipar / raw mpi4py = "
              f"{statistics.median(ratios):.3f} (quartiles {q1:.2f}-{q3:.2f}; fastest / fastest "
              f"{best:.3f})  (minipar "
              f"{ours * 1e3:.2f} ms, raw mpi4py {raw * 1e3:.2f} ms, medians of {args.reps}; "
              f"load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
