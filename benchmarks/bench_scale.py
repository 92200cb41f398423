"""The simulated backend at scale: one training step of a tiny GPT on 16 ... 4,096 ranks.

    python benchmarks/bench_scale.py                 # the curve, both layouts
    python benchmarks/bench_scale.py --sizes 4096    # one size
    python benchmarks/bench_scale.py --profile       # and a cProfile at the largest size

Each run is one `launch` of a program that builds the model with `parallelize` and takes
one `train_step` (float32 AdamW; placement="any": the placement check is
parallelize's, not the runtime's), timed from before `launch` to its return (thread start
and join included, nothing warmed up). The GPT is tiny, so the time is the runtime's own:
h = 16, a = 8 heads (so tp = 8 divides them), s = 4, V = 16, l = pp blocks. Two layouts:

    dp x tp        tp = 8, dp = N / 8                    one sequence per dp rank
    dp x pp x tp   tp = 8, pp = 8, dp = N / 64 (at 16: tp = 4, pp = 2, dp = 2),
                   1F1B, m = pp micro-batches of one sequence per dp rank

The exponent between successive sizes is log(t2 / t1) / log(N2 / N1): 1 is linear in the
world size, 2 quadratic. Nothing here is asserted in tests: wall times depend on the
machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import time

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize

SIZES = (16, 64, 256, 1024, 2048, 4096)
TARGET = 60.0  # seconds for one step at 4,096 ranks (issue 15)


def layout(name: str, n: int) -> tuple[ParallelDims, int]:
    """(dims, micro-batches) of layout `name` on `n` ranks."""
    if name == "dp x tp":
        return ParallelDims(dp_replicate=n // 8, tp=8), 1
    tp, pp = (4, 2) if n < 64 else (8, 8)
    return ParallelDims(dp_replicate=n // (tp * pp), pp=pp, tp=tp), pp


def one_step(name: str, n: int) -> float:
    """Wall seconds of launch + parallelize + one train_step of layout `name` on n ranks."""
    dims, m = layout(name, n)
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=16, num_heads=8, num_layers=dims.pp,
                    dtype="float32")
    rng = np.random.default_rng(0)
    b = dims.dp * m
    ids, tgt = rng.integers(0, 16, (4, b)), rng.integers(0, 16, (4, b))
    pipe = dict(schedule="1f1b", microbatches=m) if dims.pp > 1 else {}

    def program(ctx):
        run = parallelize(cfg, dims, lr=1e-3, placement="any", **pipe)  # the runtime only
        return run.train_step(ids, tgt)

    t0 = time.perf_counter()
    losses = mp.launch(program, n, topology=mp.Topology.nodes(max(1, n // 8), 8)
                       if n >= 8 else None)
    dt = time.perf_counter() - t0
    assert all(np.isfinite(x) for x in losses)
    return dt


def curve(name: str, sizes) -> list[str]:
    lines = [f"{name}:", f"  {'ranks':>6} {'seconds':>9} {'exponent':>9}"]
    prev = None
    for n in sizes:
        t = one_step(name, n)
        exp = "" if prev is None else f"{math.log(t / prev[1]) / math.log(n / prev[0]):9.2f}"
        lines.append(f"  {n:6d} {t:9.2f} {exp}")
        print(lines[-1], flush=True)
        prev = (n, t)
    if sizes[-1] >= 4096:
        lines.append(f"  at {sizes[-1]}: {prev[1]:.1f} s against the {TARGET:.0f} s target")
    return lines


def profile(name: str, n: int, top: int = 25) -> str:
    """cProfile top list (by own time, summed over every rank's thread and the main
    thread) of one step at n ranks."""
    import threading

    profiles = []
    orig = threading.Thread.run

    def run(self):
        prof = cProfile.Profile(time.thread_time)  # CPU, not time spent waiting
        profiles.append(prof)
        prof.enable()
        try:
            orig(self)
        finally:
            prof.disable()

    main_prof = cProfile.Profile(time.thread_time)  # CPU, not time spent waiting
    threading.Thread.run = run
    try:
        main_prof.enable()
        one_step(name, n)
        main_prof.disable()
    finally:
        threading.Thread.run = orig
    out = io.StringIO()
    stats = pstats.Stats(main_prof, stream=out)
    for prof in profiles:
        stats.add(prof)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--layouts", nargs="+", default=["dp x tp", "dp x pp x tp"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    lines = ["One step (launch + parallelize + train_step) of a tiny GPT, wall seconds:"]
    print(lines[0], flush=True)
    for name in args.layouts:
        print(f"{name}:", flush=True)
        lines += curve(name, args.sizes)
    if args.profile:
        for name in args.layouts:
            text = profile(name, max(args.sizes))
            print(f"profile of {name} at {max(args.sizes)} ranks:\n{text}")
    return lines


if __name__ == "__main__":
    main()
