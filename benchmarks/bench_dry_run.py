"""The dry run at full scale against the real simulated run: one step, wall seconds.

    python benchmarks/bench_dry_run.py

Two measurements, side by side in one run:

    full scale   plan.timeline of a Llama-3-405B-sized GPT (plan.sized.as_gpt) on 16,384
                 H100s: dp 128 x pp 16 x tp 8, interleaved 1F1B (2 chunks, m = 16),
                 sequence parallelism, B = 2048 sequences of 8,192 tokens; target < 10 s
    contract     a small layout both ways, dp 2 x pp 2 x tp 2 (1F1B, m = 4, SP) of a tiny
                 GPT: the real simulated step (launch + parallelize + train_step) and its
                 dry run; the ratio says how much cheaper the dry run is for the same events

Nothing here is asserted in tests: wall times depend on the machine.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.plan.layout import Layout
from minipar.plan.presets import CLUSTERS, MODELS, ModelSpec
from minipar.plan.sized import as_gpt
from minipar.plan.timeline import timeline

TARGET = 10.0  # seconds for the 16,384-GPU dry run (issue 18)


def full_scale() -> tuple[float, int, float]:
    """(wall seconds, events, simulated step seconds) of the 405B-sized dry run."""
    layout = Layout(dp=128, pp=16, tp=8, schedule="interleaved_1f1b", chunks=2,
                    global_batch=2048, sequence_parallel=True)
    t0 = time.perf_counter()
    tl = timeline(as_gpt(MODELS["llama3-405b"]), layout, CLUSTERS["h100"].topology(2048))
    return time.perf_counter() - t0, sum(len(r.events) for r in tl.ranks), tl.step_time


def small(repeats: int = 3) -> tuple[float, float]:
    """(real step, dry run) wall seconds, medians, of dp 2 x pp 2 x tp 2."""
    cfg = GPTConfig(vocab_size=64, seq_len=16, hidden=32, num_heads=4, num_layers=4)
    dims, B, m = ParallelDims(dp_replicate=2, pp=2, tp=2), 8, 4
    rng = np.random.default_rng(0)
    ids, tgt = (rng.integers(0, 64, (16, B)) for _ in range(2))

    def program(ctx):
        run = parallelize(cfg, dims, schedule="1f1b", microbatches=m,
                          sequence_parallel=True, lr=1e-3)
        return run.train_step(ids, tgt)

    model = ModelSpec("tiny", 4, 32, 4, 128, 64, 16)
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=B // (m * 2), global_batch=B,
                    sequence_parallel=True)
    real, dry = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mp.launch(program, 8)
        real.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        timeline(model, layout, mp.Topology.nodes(1, 8), dtype="float64")
        dry.append(time.perf_counter() - t0)
    return statistics.median(real), statistics.median(dry)


def main(argv=None) -> list[str]:
    wall, events, step = full_scale()
    lines = [f"dry run, Llama-3-405B-sized GPT on 16,384 H100s (dp 128 x pp 16 x tp 8, "
             f"interleaved x2, m = 16, SP): {wall:.2f} s for {events:,} events, a "
             f"{step:.2f} s step (target < {TARGET:.0f} s)"]
    real, dry = small()
    lines.append(f"dp 2 x pp 2 x tp 2, one step: the real simulated run {real * 1e3:.0f} ms, "
                 f"its dry run {dry * 1e3:.1f} ms: {real / dry:.0f}x cheaper")
    for line in lines:
        print(line, flush=True)
    return lines


if __name__ == "__main__":
    main()
