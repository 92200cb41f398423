"""Data parallelism, measured side by side in one run: wall-time overhead and simulated MFU.

    python benchmarks/bench_dp.py              # both parts
    python benchmarks/bench_dp.py --profile    # and a cProfile of one rank's DP step

1. Wall time. One float32 training step of a GPT on a global batch of B sequences
   (`loss_and_grad`, the optimizer step, `zero_grad`) on one simulated device, against the
   same step data-parallel over 4 simulated ranks, each on its B/4 sequences, under
   DistributedDataParallel and under ZeRO-3 (Zero3Engine, default knobs). The GPT is the
   one of bench_model.py (l=4, h=512, a=8, s=128, V=256; 12.9M parameters), B = 8. Each
   DP step is timed on rank 0 between two barriers, so it lasts until the slowest rank is
   done. Single-device and DP runs alternate; the medians are compared as ratios (target:
   at most 1.5x). The 4 ranks share this machine's cores with each other, as threads,
   where the single device has them to itself. A fourth line runs the 4 rank threads with
   no engine at all (each steps its own AdamW on its own gradients, no communication):
   what the threads cost before any data-parallel code runs.

2. Simulated MFU and communication share. A GPT with l=4, h=512, a=8, s=1024, V=1024
   (14.2M parameters) in bfloat16, data-parallel over one node of 4 H100s
   (`Topology.nodes(1, 4)`: NVLink 4, 450 GB/s a direction), one 1,024-token sequence a
   rank, AdamW with float32 masters. One step under DDP with PyTorch's default 25 MiB
   buckets and with 4 MiB buckets, and under ZeRO-3 with FSDP's defaults (backward
   prefetch, limit_all_gathers) and with forward_prefetch too; from the simulated clock
   and the trace:
       MFU        = model FLOPs of a rank's step / (simulated step time x bf16 peak)
       comm share = time the rank communicated / step time  (viz.timeline.measure)
       exposed    = communication not overlapped with compute / step time
   The clock charges matmuls at the device's peak and nothing else, so 1 - MFU is the
   time lost to communication the compute did not hide: the step's critical path.

Nothing here is asserted in tests: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from typing import Optional

import numpy as np

import minipar as mp
from minipar.data import split_data_parallel
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import zero_engine
from minipar.plan import model_flops
from minipar.viz import measure

OPT = dict(lr=1e-3, weight_decay=0.1)
WORLD = 4

# part 1: the model of bench_model.py, float32, global batch 8 (2 sequences a rank)
WALL_CONFIG = GPTConfig(vocab_size=256, seq_len=128, hidden=512, num_heads=8, num_layers=4,
                        dtype="float32")
WALL_BATCH = 8

# part 2: bf16, one 1,024-token sequence a rank, one node of 4 H100s
MFU_CONFIG = GPTConfig(vocab_size=1024, seq_len=1024, hidden=512, num_heads=8,
                       num_layers=4, dtype="bfloat16")
MFU_TOPOLOGY = mp.Topology.nodes(1, gpus_per_node=WORLD)
MFU_ENGINES = {"DDP, 25 MiB buckets": dict(stage=0),  # PyTorch's default bucket_cap_mb
               "DDP, 4 MiB buckets": dict(stage=0, bucket_cap_mb=4),
               "ZeRO-3": dict(stage=3),  # FSDP's defaults: backward prefetch, limited gathers
               "ZeRO-3 + forward_prefetch": dict(stage=3, forward_prefetch=True)}


def batch(cfg: GPTConfig, b: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, targets), each [s, b] int64."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)),
            rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)))


# ---- part 1: wall time ----------------------------------------------------------------
def blas_threads() -> str:
    """The BLAS thread settings in the environment (the benchmark never changes them)."""
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith(("OPENBLAS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")))
    return (f"numpy {np.__version__}, {os.cpu_count()} CPUs, "
            f"{env or 'no OPENBLAS_*/OMP_NUM_THREADS set'}")


def single_device_steps(cfg: GPTConfig, ids, tgt, steps: int) -> list[float]:
    """Wall seconds of `steps` single-device steps on the whole batch (after a warm-up)."""
    times = []
    with mp.device():
        model = GPT(cfg)
        opt = AdamW(model.parameters(), **OPT)
        for i in range(steps + 1):
            t0 = time.perf_counter()
            model.loss_and_grad(ids, tgt)
            opt.step()
            opt.zero_grad()
            if i:
                times.append(time.perf_counter() - t0)
    return times


def timed_steps(model, engine, x, y, steps: int, profile: bool) -> tuple[list, str]:
    """Wall seconds of `steps` training steps on this rank, each between two barriers (so
    a step lasts until the slowest rank is done), after one untimed warm-up step; with
    `profile`, also a cProfile of the timed steps (by cumulative and by own time)."""
    prof = cProfile.Profile() if profile else None
    times = []
    for i in range(steps + 1):
        mp.barrier()
        if prof is not None and i:
            prof.enable()
        t0 = time.perf_counter()
        model.loss_and_grad(x, y)
        engine.step()
        engine.zero_grad()
        mp.barrier()
        if i:
            times.append(time.perf_counter() - t0)
        if prof is not None and i:
            prof.disable()
    if prof is None:
        return times, ""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
    out.write("\n  by own time:\n")
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    return times, out.getvalue()


def dp_steps(cfg: GPTConfig, ids, tgt, steps: int, stage: Optional[int],
             profile: bool = False) -> tuple[list[float], str]:
    """Wall seconds of `steps` data-parallel steps on WORLD ranks (after a warm-up), timed
    on rank 0 from a barrier to a barrier; with `profile`, rank 0's cProfile of them.
    stage None: no engine, each rank steps its own AdamW on its own gradients (the same
    computation as DDP without any communication: the floor of the threads themselves)."""
    def program(ctx):
        model = GPT(cfg)
        engine = (AdamW(model.parameters(), **OPT) if stage is None
                  else zero_engine(model, stage=stage, **OPT))
        x, y = split_data_parallel(ids, tgt, ctx.rank, WORLD)
        return timed_steps(model, engine, x, y, steps, profile and ctx.rank == 0)

    return mp.launch(program, WORLD)[0]


def wall_time(repeats: int, steps: int, profile: bool = False) -> str:
    ids, tgt = batch(WALL_CONFIG, WALL_BATCH)
    single, alone, ddp, zero3 = [], [], [], []
    for _ in range(repeats):  # interleaved, so all four see the same machine state
        single += single_device_steps(WALL_CONFIG, ids, tgt, steps)
        alone += dp_steps(WALL_CONFIG, ids, tgt, steps, stage=None)[0]
        ddp += dp_steps(WALL_CONFIG, ids, tgt, steps, stage=0)[0]
        zero3 += dp_steps(WALL_CONFIG, ids, tgt, steps, stage=3)[0]
    s, a, d, z = (statistics.median(t) for t in (single, alone, ddp, zero3))
    with mp.device():
        psi = GPT(WALL_CONFIG).num_parameters()
    lines = [f"DP step wall time, {WORLD} simulated ranks x {WALL_BATCH // WORLD} sequences "
             f"against one device x {WALL_BATCH} (GPT, {psi:,} params, float32; medians of "
             f"{len(single)} steps, interleaved):",
             f"  one device {s * 1e3:.0f} ms; DDP {d * 1e3:.0f} ms = {d / s:.2f}x; "
             f"ZeRO-3 {z * 1e3:.0f} ms = {z / s:.2f}x (target <= 1.5x)",
             f"  the {WORLD} rank threads alone, each stepping its own AdamW with no engine and "
             f"no communication: {a * 1e3:.0f} ms = {a / s:.2f}x",
             f"  spread (min..max): one device {min(single) * 1e3:.0f}..{max(single) * 1e3:.0f}"
             f" ms, DDP {min(ddp) * 1e3:.0f}..{max(ddp) * 1e3:.0f} ms, ZeRO-3 "
             f"{min(zero3) * 1e3:.0f}..{max(zero3) * 1e3:.0f} ms",
             f"  {blas_threads()}"]
    if profile:
        for name, stage in (("DDP", 0), ("ZeRO-3", 3)):
            lines.append(f"\ncProfile of rank 0's {name} step (wall clock, cumulative):")
            lines.append(dp_steps(WALL_CONFIG, ids, tgt, 1, stage, profile=True)[1])
    return "\n".join(lines)


# ---- part 2: simulated MFU and communication share --------------------------------------
def simulated_step(cfg: GPTConfig, engine_kwargs: dict) -> dict:
    """One data-parallel step on MFU_TOPOLOGY; times from the simulated clock and trace."""
    ids, tgt = batch(cfg, WORLD)

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, **engine_kwargs, **OPT)
        x, y = split_data_parallel(ids, tgt, ctx.rank, WORLD)
        mp.barrier()  # every rank's clock at the same time
        start, first = ctx.clock.now, len(ctx.trace.events)
        model.loss_and_grad(x, y)
        engine.step()
        flops = sum(e.flops for e in ctx.trace.events[first:] if e.stream == "compute")
        sent = sum(float(e.meta.get("sent_bytes", 0)) for e in ctx.trace.events[first:])
        return start, ctx.clock.elapsed(), flops, sent

    res = mp.launch(program, WORLD, topology=MFU_TOPOLOGY)
    start = res[0][0]
    end = max(r[1] for r in res)  # the step ends when the last rank is done
    times = measure(res, WORLD, start=start, end=end)
    return {"time": end - start, "flops": res[0][2], "sent": res[0][3],
            "comm_share": statistics.mean(t.comm_share for t in times),
            "exposed_share": statistics.mean(t.exposed_comm / t.window for t in times)}


def simulated_mfu() -> str:
    cfg = MFU_CONFIG
    peak = MFU_TOPOLOGY.device.peak(cfg.dtype)
    flops = model_flops(1, cfg.seq_len, cfg.num_layers, cfg.hidden, cfg.vocab_size)
    with mp.device():
        psi = GPT(cfg).num_parameters()
    lines = [f"simulated MFU on {MFU_TOPOLOGY.describe()}, DP = {WORLD}:",
             f"  GPT l={cfg.num_layers}, h={cfg.hidden}, a={cfg.num_heads}, s={cfg.seq_len}, "
             f"V={cfg.vocab_size}: {psi:,} params, bf16 + float32 AdamW; 1 sequence a rank; "
             f"{flops / 1e9:.1f} GFLOP a rank a step = {flops / peak * 1e6:.1f} us of "
             f"compute at the bf16 peak ({peak / 1e12:g} TFLOP/s)"]
    for name, kw in MFU_ENGINES.items():
        t0 = time.perf_counter()
        r = simulated_step(cfg, kw)
        wall = time.perf_counter() - t0
        # the clock charges exactly the model FLOPs (up to the formula's float rounding)
        assert abs(r["flops"] - flops) <= 1e-9 * flops, (r["flops"], flops)
        mfu = flops / (r["time"] * peak)
        lines.append(f"  {name:<26} step {r['time'] * 1e6:7.1f} us  MFU {100 * mfu:5.1f} %  "
                     f"comm share {100 * r['comm_share']:5.1f} % (exposed "
                     f"{100 * r['exposed_share']:4.1f} %)  sent {r['sent'] / 1e6:5.1f} MB a rank"
                     f"  [{wall:.0f} s wall]")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    """Print both parts. argv: the command-line arguments (None: sys.argv[1:]; run.py
    passes [] for the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (3)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (2)")
    ap.add_argument("--profile", action="store_true",
                    help="also print cProfile of rank 0's DDP and ZeRO-3 steps")
    ap.add_argument("--skip-mfu", action="store_true", help="only the wall-time ratios")
    args = ap.parse_args(argv)
    print(wall_time(args.repeats, args.steps, args.profile))
    if not args.skip_mfu:
        print(simulated_mfu())


if __name__ == "__main__":
    main()
