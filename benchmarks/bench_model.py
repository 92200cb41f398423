"""The single-device GPT step against np.matmul, as a ratio measured side by side in one run.

    python benchmarks/bench_model.py             # the ratio (run.py prints it too)
    python benchmarks/bench_model.py --profile   # and where one step's time goes

A GPT of about 13M parameters in float32 runs forward and backward (`loss_and_grad`) on
one simulated device. Its rate is the step's model FLOPs (`minipar.plan.flops.model_flops`,
the matmul FLOPs of Narayanan et al. 2021) over the step's wall time, median of several
steps after a warm-up. The baseline is what bare `np.matmul` reaches on this machine in
float32 for the same GEMMs: the forward, dgrad and wgrad products of every linear layer of
one step ([s*b, h] x [h, 3h], [s*b, h] x [h, 4h], [s*b, 4h] x [4h, h], ...), on
contiguous operands, timed in the same run, interleaved with the steps. The ratio is the
fraction of that matmul rate the whole model keeps; the target is at least 0.5.

NumPy is measured as configured: whatever BLAS it was built with, and whatever
OPENBLAS_* variables the environment sets (printed with the result).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import math
import os
import pstats
import statistics
import sys
import time

import numpy as np

import minipar as mp
from minipar.nn.config import GPTConfig
from minipar.nn.gpt import GPT
from minipar.plan.flops import model_flops

# l=4, h=512, a=8, s=128, b=8, V=256: 12.9M parameters, 81.3 GFLOP a step
CONFIG = GPTConfig(vocab_size=256, seq_len=128, hidden=512, num_heads=8, num_layers=4,
                   dtype="float32")
BATCH = 8


def blas_info() -> str:
    """Which BLAS numpy uses (numpy.show_config), its threads and OPENBLAS_* settings."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no mode="dicts"
        name = "unknown (see numpy.show_config())"
    try:
        from threadpoolctl import threadpool_info
        pools = [f"{p['internal_api']} {p['num_threads']} threads"
                 for p in threadpool_info() if p.get("user_api") == "blas"]
        threads = ", ".join(pools) or "no BLAS pool found"
    except ImportError:
        threads = f"{os.cpu_count()} CPUs (threadpoolctl not installed)"
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith(("OPENBLAS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")))
    return f"numpy {np.__version__}, BLAS {name}; {threads}; {env or 'no OPENBLAS_* set'}"


def linear_gemms(cfg: GPTConfig, b: int) -> list[tuple[int, int, int, int]]:
    """(count, m, k, n) of the GEMMs of one step's linear layers: forward, dgrad, wgrad."""
    N, h, V, f = cfg.seq_len * b, cfg.hidden, cfg.vocab_size, cfg.ffn
    layers = [(cfg.num_layers, h, 3 * h), (cfg.num_layers, h, h), (cfg.num_layers, h, f),
              (cfg.num_layers, f, h), (1, h, V)]  # (count, in, out): qkv, proj, fc1, fc2, head
    gemms = []
    for count, i, o in layers:
        gemms += [(count, N, i, o),  # forward   [N, in] x [in, out]
                  (count, N, o, i),  # dgrad     [N, out] x [out, in]
                  (count, o, N, i)]  # wgrad     [out, N] x [N, in]
    return gemms


class MatmulBaseline:
    """Bare np.matmul on contiguous float32 operands of the model's linear GEMM shapes."""

    def __init__(self, cfg: GPTConfig, b: int):
        rng = np.random.default_rng(0)
        self.gemms = [(count, rng.standard_normal((m, k), dtype=np.float32),
                       rng.standard_normal((k, n), dtype=np.float32))
                      for count, m, k, n in linear_gemms(cfg, b)]
        self.flops = sum(count * 2 * x.shape[0] * x.shape[1] * y.shape[1]
                         for count, x, y in self.gemms)

    def seconds(self) -> float:
        """Time for the GEMMs of one step: each shape timed once, times its count."""
        total = 0.0
        for count, x, y in self.gemms:
            t0 = time.perf_counter()
            np.matmul(x, y)
            total += count * (time.perf_counter() - t0)
        return total


def make_model(cfg: GPTConfig = CONFIG, b: int = BATCH):
    model = GPT(cfg)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, b))
    targets = rng.integers(0, cfg.vocab_size, (cfg.seq_len, b))
    return model, ids, targets


def step_seconds(model: GPT, ids: np.ndarray, targets: np.ndarray) -> float:
    """Wall time of one forward + backward (gradients freed afterwards, untimed)."""
    t0 = time.perf_counter()
    model.loss_and_grad(ids, targets)
    dt = time.perf_counter() - t0
    model.zero_grad()
    return dt


def gpt_step_efficiency(repeats: int = 7) -> str:
    """The report line: model FLOP/s of a GPT step over np.matmul FLOP/s, and both rates."""
    cfg, b = CONFIG, BATCH
    flops = model_flops(b, cfg.seq_len, cfg.num_layers, cfg.hidden, cfg.vocab_size)
    base = MatmulBaseline(cfg, b)
    with mp.device() as ctx:
        model, ids, targets = make_model(cfg, b)
        step_seconds(model, ids, targets)  # warm-up
        base.seconds()
        steps, mm = [], []
        for _ in range(max(repeats, 3)):  # interleaved, so both see the same machine state
            mm.append(base.seconds())
            steps.append(step_seconds(model, ids, targets))
        params = model.num_parameters()
        charged = sum(e.flops for e in ctx.trace.of("compute", "matmul")) / (len(steps) + 1)
    if not math.isclose(charged, flops, rel_tol=1e-9):  # the formula's FLOPs, exactly
        print(f"warning: the step charged {charged:.6g} FLOPs, model_flops says {flops:.6g}")
    t, tb = statistics.median(steps), statistics.median(mm)
    model_rate, mm_rate = flops / t, base.flops / tb
    return (f"GPT step (Ψ = {params:,} params, float32): model FLOP/s / np.matmul FLOP/s = "
            f"{model_rate / mm_rate:.2f} (target >= 0.5); model {model_rate / 1e9:.1f} "
            f"GFLOP/s ({flops / 1e9:.1f} GFLOP in {t * 1e3:.0f} ms), np.matmul "
            f"{mm_rate / 1e9:.1f} GFLOP/s on the step's linear GEMM shapes\n"
            f"  l={cfg.num_layers}, h={cfg.hidden}, a={cfg.num_heads}, s={cfg.seq_len}, "
            f"b={b}, V={cfg.vocab_size}; {len(steps)} steps, {min(steps) * 1e3:.0f} to "
            f"{max(steps) * 1e3:.0f} ms; {blas_info()}")


ELEMENTWISE = ("gelu", "layernorm", "softmax", "cross_entropy", "embedding", "dropout")


def profile_step(top: int = 15) -> str:
    """Where one step's wall time goes: matmul time by FLOP-charging label (summed over
    layers), then cProfile's functions by their own time."""
    out = io.StringIO()
    linear, attention = sys.modules["minipar.nn.linear"], sys.modules["minipar.nn.attention"]
    real = linear.matmul
    spent: collections.Counter = collections.Counter()

    def timed(a, b, label=""):
        t0 = time.perf_counter()
        c = real(a, b, label=label)
        key = label.split(".", 2)[-1] if label.startswith("blocks.") else label
        spent[key] += time.perf_counter() - t0
        return c

    with mp.device():
        model, ids, targets = make_model()
        step_seconds(model, ids, targets)  # warm-up
        linear.matmul = attention.matmul = timed
        try:
            total = step_seconds(model, ids, targets)
        finally:
            linear.matmul = attention.matmul = real
        prof = cProfile.Profile()
        prof.enable()
        step_seconds(model, ids, targets)
        prof.disable()
    mm_total = sum(spent.values())
    print(f"one step: {total * 1e3:.0f} ms, of which matmul {mm_total * 1e3:.0f} ms "
          f"({mm_total / total:.0%}); matmul time by label, all layers:", file=out)
    for key, sec in spent.most_common():
        print(f"  {sec * 1e3:7.1f} ms {sec / total:6.1%}  {key}", file=out)
    stats = pstats.Stats(prof, stream=out)
    cum: collections.Counter = collections.Counter()  # the ops that are not matmuls
    for (path, _, func), (_, _, _, cumtime, _) in stats.stats.items():
        module = os.path.splitext(os.path.basename(path))[0]
        if module in ELEMENTWISE and func in (f"{module}_forward", f"{module}_backward"):
            cum[module] += cumtime
    step = stats.total_tt
    print(f"profiled step (cProfile): {step * 1e3:.0f} ms; elementwise ops (cumulative, "
          f"forward + backward):", file=out)
    for module, sec in cum.most_common():
        print(f"  {sec * 1e3:7.1f} ms {sec / step:6.1%}  {module}", file=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="also profile one step")
    args = ap.parse_args()
    print(gpt_step_efficiency(args.repeats))
    if args.profile:
        print(profile_step())


if __name__ == "__main__":
    main()
