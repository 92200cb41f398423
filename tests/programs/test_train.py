"""The single-device training loop and `minipar train`: deterministic, learning, accounted."""

import functools
import math
import re

import numpy as np
import pytest

import minipar as mp
import minipar.programs.train as train_mod
from minipar.cli import main
from minipar.optim import DynamicLossScaler, MixedPrecisionOptimizer
from minipar.plan import model_flops
from minipar.programs.train import TrainConfig, generate, train

# a GPT of ~16k parameters on 8 x 16 characters a step: about 0.1 s per 10 steps (one thread)
TINY = dict(steps=20, global_batch=8, seq_len=16, num_layers=1, hidden=32, num_heads=2,
            lr=1e-2, warmup_steps=3, min_lr=1e-3)
TINY_FLAGS = ["--steps", "10", "--batch", "8", "--seq-len", "16", "--layers", "1",
              "--hidden", "32", "--heads", "2"]


@pytest.fixture(scope="module")
def runs():
    """Each dtype trained twice from the same seed (shared by the tests below), on the
    calibrated clock (the default); "peak": bfloat16 once more, every matmul at peak."""
    out = {dt: (train(TrainConfig(**TINY, dtype=dt)), train(TrainConfig(**TINY, dtype=dt)))
           for dt in ("float64", "bfloat16")}
    out["peak"] = train(TrainConfig(**TINY, dtype="bfloat16", compute_model="peak"))
    return out


# ---- the loop ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_training_is_deterministic_and_the_loss_falls(runs, dtype):
    a, b = runs[dtype]
    assert a.losses == b.losses                       # bit for bit
    assert a.params_summary == b.params_summary       # including a hash of every weight
    assert len(a.losses) == TINY["steps"] and a.skipped_steps == 0
    assert a.first_loss() == pytest.approx(math.log(a.model.cfg.vocab_size), abs=0.2)
    assert a.last_loss() < a.first_loss() - 0.5       # 3.76 -> 2.93 here
    assert a.params_summary["finite"] and a.params_summary["dtype"] == dtype


def test_a_different_seed_gives_a_different_run_on_its_own_device(runs):
    here = mp.current()
    held, now = here.ledger.held(), here.clock.now
    other = train(TrainConfig(**{**TINY, "steps": 3}, dtype="float64", seed=1))
    assert other.losses != runs["float64"][0].losses[:3]
    assert (here.ledger.held(), here.clock.now) == (held, now)  # a fresh device did the work


def test_the_schedule_warms_up_then_decays(runs):
    lrs = runs["float64"][0].lrs
    assert lrs[0] == 0.0 and lrs[3] == pytest.approx(TINY["lr"])   # lr(0) = 0, peak at W
    assert all(x >= y for x, y in zip(lrs[3:], lrs[4:]))            # then cosine down
    assert lrs[-1] > TINY["min_lr"]


def test_flops_time_and_mfu_are_accounted(runs):
    """The peak compute model: every matmul at peak and nothing else on the clock."""
    r = runs["peak"]
    c = TINY
    expected = model_flops(c["global_batch"], c["seq_len"], c["num_layers"], c["hidden"],
                           r.model.cfg.vocab_size)
    assert r.model_flops_per_step == pytest.approx(expected, rel=1e-12)
    assert r.clock_flops_per_step == pytest.approx(expected, rel=1e-12)  # matmuls only
    assert r.sim_step_time == pytest.approx(expected / 989e12, rel=1e-9)  # H100 bf16 peak
    assert r.mfu == pytest.approx(1.0, rel=1e-9)      # 100 % on one device, by construction
    assert r.losses == runs["bfloat16"][0].losses     # the clock never changes the numbers


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_calibrated_clock_is_the_planners_compute_time_of_the_step(runs, dtype):
    """The default, calibrated clock: each GEMM at the planner's efficiency of its shape,
    elementwise work over the H100's HBM. A step on one device is the planner's compute
    time of every layer's forward and backward, the embedding, the head and the loss
    (plan/compute_time.py), plus AdamW's bytes per parameter over the bandwidth: to
    rounding. MFU is then well below 100 %, and still model FLOPs / (time x peak)."""
    from minipar.plan.compute_time import (Shape, embedding_work, head_work, layer_work,
                                           optimizer_bytes_per_parameter)
    from minipar.runtime.compute_model import CALIBRATED_GEMM
    r, c = runs[dtype][0], TINY
    m = r.model.cfg
    e = np.dtype(m.np_dtype).itemsize
    sh = Shape(b=c["global_batch"], s=c["seq_len"], s_c=c["seq_len"], h=m.hidden,
               a=m.num_heads, a_kv=m.num_heads, d=m.hidden // m.num_heads, f=m.ffn,
               V=m.vocab_size, t=1, e=e, split=1, dropout=False, swiglu=False, rotary=False)
    W, peak = 3350e9, r.peak_flops
    layer = layer_work(sh, CALIBRATED_GEMM, peak, W)
    head = head_work(sh, CALIBRATED_GEMM, peak, W)
    emb = embedding_work(sh, W)
    # AdamW's bytes: the planner's for bf16 (16-bit gradients) and float32; float64 is
    # float32's count at 8 bytes an element
    per_param = (optimizer_bytes_per_parameter("bf16", fp32_grads=False)
                 if dtype == "bfloat16" else 2 * optimizer_bytes_per_parameter("fp32", True))
    step = (m.num_layers * (layer.forward + layer.backward) + head.forward + head.backward
            + emb.forward + emb.backward + r.num_parameters * per_param / W)
    if dtype == "float64":  # the loss's softmax in float64: 8 bytes, the planner's 4 + 4
        step += 2 * 4 * sh.T * sh.V / W
    assert r.sim_step_time == pytest.approx(step, rel=1e-12)
    assert r.mfu == pytest.approx(r.model_flops_per_step / (r.sim_step_time * peak), rel=1e-12)
    assert r.mfu < 0.05  # these GEMMs are tiny (K = 32: g = 0.2) and the bytes many
    assert r.clock_flops_per_step == pytest.approx(r.model_flops_per_step, rel=1e-12)


def test_ledger_peaks_follow_the_byte_counts(runs):
    r64, r16 = runs["float64"][0], runs["bfloat16"][0]
    psi = r64.num_parameters
    assert r64.ledger_peak["parameters"] == 8 * psi
    assert r64.ledger_peak["gradients"] == 8 * psi
    assert r64.ledger_peak["optimizer_states"] == 16 * psi           # AdamW m and v
    n_max = max(p.size for p in r16.model.parameters())
    assert r16.ledger_peak["parameters"] == 2 * psi
    assert r16.ledger_peak["optimizer_states"] == 12 * psi           # master, m, v
    assert r16.ledger_peak["gradients"] == 2 * psi + 4 * n_max       # one float32 copy at a time
    for r in (r64, r16):
        assert r.ledger_peak["activations"] > 0
        by_category = [v for k, v in r.ledger_peak.items() if k != "total"]
        assert max(by_category) <= r.ledger_peak["total"] <= sum(by_category)


def test_micro_batches_give_the_same_training_in_float64():
    """End to end: k = 4 micro-batches with loss scale 1/4 train like one global batch."""
    cfg = dict(TINY, steps=5, dtype="float64")
    one = train(TrainConfig(**cfg))
    four = train(TrainConfig(**cfg, num_microbatches=4))
    np.testing.assert_allclose(four.losses, one.losses, rtol=1e-9)
    np.testing.assert_allclose(four.grad_norms, one.grad_norms, rtol=1e-9)


def test_fp16_overflows_are_skipped_and_counted(monkeypatch):
    """Start float16 loss scaling at 2^20: the first steps overflow and are skipped (the
    schedule does not advance), the scale halves each time, then training proceeds."""
    monkeypatch.setattr(train_mod, "MixedPrecisionOptimizer", functools.partial(
        MixedPrecisionOptimizer, loss_scaler=DynamicLossScaler(init_scale=2.0 ** 20)))
    r = train(TrainConfig(**{**TINY, "steps": 12}, dtype="float16"))
    n = r.skipped_steps
    assert 3 <= n < 10 and r.skipped[:n] == [True] * n and not any(r.skipped[n:])
    assert r.final_loss_scale == 2.0 ** (20 - n)
    assert all(math.isnan(g) for g in r.grad_norms[:n])
    assert r.lrs[:n + 1] == [0.0] * (n + 1)           # skipped steps keep lr(0)
    assert r.lrs[n + 1] > 0
    assert np.isfinite(r.losses).all() and r.params_summary["finite"]


@pytest.mark.parametrize("bad, match", [
    (dict(global_batch=10, num_microbatches=4), r"cannot be cut into 4 equal micro-batches"),
    (dict(hidden=30, num_heads=4), "num_heads=4 must divide hidden=30"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(steps=0), "steps must be >= 1"),
    (dict(steps=5, warmup_steps=6), "longer than the run"),
    (dict(lr=0.0), "lr must be a positive number"),
    (dict(min_lr=1.0), r"min_lr must be in \[0, lr"),
    (dict(clip=0.0), "clip must be > 0"),
    (dict(steps=2.5), "steps must be an integer"),
])
def test_bad_configs_are_refused_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**bad)


def test_generate(runs):
    r = runs["float64"][0]
    with mp.device() as ctx:
        g1 = generate(r.model, r.tokenizer, "The ", 40)
        g2 = generate(r.model, r.tokenizer, "The ", 40)
        t1 = generate(r.model, r.tokenizer, "The ", 40, temperature=1.0, seed=3)
        t2 = generate(r.model, r.tokenizer, "The ", 40, temperature=1.0, seed=3)
        assert ctx.ledger.held() == 0 and ctx.clock.now == 0.0  # a scratch device did the work
    assert g1 == g2 and t1 == t2                                # greedy; seeded sampling
    assert len(g1) == len(t1) == 44 and g1.startswith("The ") and t1.startswith("The ")
    long = generate(r.model, r.tokenizer, "a" * 40, 3)          # longer than seq_len: windowed
    assert len(long) == 43
    with pytest.raises(ValueError, match="non-empty prompt"):
        generate(r.model, r.tokenizer, "", 5)


# ---- the command ---------------------------------------------------------------------------
def test_train_command_prints_the_summary(capsys):
    assert main(["train", *TINY_FLAGS, "--sample", "30", "--compute-model", "peak"]) == 0
    cap = capsys.readouterr()
    out = cap.out
    for what in ("parameters in float32", "simulated time", "model FLOPs",
                 "compute model   peak: every matmul at peak, elementwise free",
                 "simulated MFU   100.0 %", "by construction", "memory peak",
                 "optimizer_states", "wall time",
                 "sample (greedy, 30 characters after 'The ')"):
        assert what in out, what
    m = re.search(r"loss +([\d.]+) \(mean of the first 5 steps\) -> ([\d.]+) "
                  r"\(mean of the last 5\)", out)
    assert m and float(m.group(2)) < float(m.group(1))
    # not a terminal: plain log lines on stderr, every log_every steps and the last
    lines = cap.err.strip().splitlines()
    assert lines[0].startswith("step  1/10") and lines[-1].startswith("step 10/10")
    assert "\r" not in cap.err and "tok/s" in lines[-1]


def test_train_command_says_its_compute_model_and_mfu_is_not_100_percent(capsys):
    """The default clock is the calibrated one: the summary says so, and one device's MFU
    is model FLOPs / (step time x peak), below 100 %."""
    assert main(["train", *TINY_FLAGS, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("compute model   calibrated: GEMM efficiency e_max 0.766 · g(M)g(N)g(K), "
            "g(x) = x/(x + 128), elementwise over 3.35 TB/s HBM") in out
    step = re.search(r"simulated time +([\d.]+) us a step on the device clock: matmuls "
                     r"([\d.]+) us, elementwise work ([\d.]+) us", out)
    time_us, matmuls, elementwise = (float(step.group(i)) for i in (1, 2, 3))
    assert elementwise > 0 and matmuls + elementwise == pytest.approx(time_us, abs=2e-3)
    flops = float(re.search(r"model FLOPs +([\d,]+) a step", out).group(1).replace(",", ""))
    mfu = float(re.search(r"simulated MFU +([\d.]+) %", out).group(1))
    assert 0 < mfu < 100 and "by construction" not in out
    assert mfu == pytest.approx(100 * flops / (time_us * 1e-6 * 494e12), rel=2e-3)  # printed


def test_train_command_quiet_and_mixed_precision(capsys):
    assert main(["train", *TINY_FLAGS, "--quiet", "--dtype", "float16",
                 "--micro-batches", "2"]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert "parameters in float16" in cap.out and "2 micro-batches" in cap.out
    assert "skipped steps   0 of 10" in cap.out


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "argument --steps: must be a positive integer"),
    (["--batch", "x"], "argument --batch: expected a positive integer"),
    (["--lr", "-1"], "argument --lr: must be a positive number"),
    (["--dtype", "int8"], "argument --dtype: invalid choice"),
    (["--heads", "5"], "--heads 5 must divide --hidden 64"),
    (["--batch", "10", "--micro-batches", "4"], "--micro-batches 4 must divide --batch 10"),
    (["--steps", "5", "--warmup", "6"], "--warmup 6 is longer than the run"),
    (["--seq-len", "100000"], "too long for the bundled corpus"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_flags_exit_with_code_2(capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        main(["train", *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: minipar" in err and message in err


# ---- what train refuses, and what stops it -------------------------------------------------
def test_the_memory_estimate_is_each_ledger_peak_to_the_byte(runs):
    """The course's formulas (plan/training_memory.py) applied to the flags equal what the
    ledger records per category; the peak total is at most their sum."""
    for r in (runs["float64"][0], runs["bfloat16"][0]):
        m = r.memory_estimate
        for category in ("parameters", "gradients", "optimizer_states", "activations"):
            assert getattr(m, category) == r.ledger_peak[category], category
        assert r.ledger_peak["total"] <= m.total


def test_too_large_for_the_device_is_refused_before_allocating():
    import time
    from minipar.programs.train_checks import TrainingRefused
    t0 = time.perf_counter()
    with pytest.raises(TrainingRefused) as e:
        train(TrainConfig(hidden=16384, num_heads=128, num_layers=48, seq_len=2048))
    assert time.perf_counter() - t0 < 5  # nothing of the 8 TiB was allocated
    msg = str(e.value)
    for words in ("needs about 8.26 TiB", "the simulated H100-SXM-80GB holds 74.51 GiB",
                  "optimizer states  1.13 TiB", "attention scores a s^2 b are 3.00 TiB",
                  "--micro-batches"):
        assert words in msg, words


def test_too_large_for_this_machine_is_refused_with_its_figure():
    from minipar.programs.train_checks import TrainingRefused, check_memory
    cfg = TrainConfig(**TINY)
    mcfg = cfg.model_config(50)
    m = check_memory(cfg, mcfg, "H100", 80 * 10**9, 10**9)  # fits both
    with pytest.raises(TrainingRefused, match=r"this machine has 1\.00 KiB available"):
        check_memory(cfg, mcfg, "H100", 80 * 10**9, 1024)
    with pytest.raises(TrainingRefused, match="the simulated H100 holds 1.00 KiB"):
        check_memory(cfg, mcfg, "H100", 1024, None)
    assert m.total > 1024


@pytest.mark.parametrize("dtype, step, cause", [
    ("float32", 7, "the learning rate 9.25e+03 is likely too high"),
    ("bfloat16", 7, "the learning rate 9.25e+03 is likely too high"),
    ("float16", 3, "float16 overflowed in the forward"),
])
def test_a_diverging_loss_stops_the_run_with_the_step_and_the_cause(dtype, step, cause):
    from minipar.programs.train_checks import TrainingDiverged
    with pytest.raises(TrainingDiverged) as e:
        train(TrainConfig(**{**TINY, "lr": 1e4, "min_lr": 0.0}, dtype=dtype))
    assert e.value.step == step and math.isnan(e.value.value)
    assert f"the loss became nan at step {step} of 20" in str(e.value)
    assert cause in str(e.value)


def test_an_infinite_gradient_norm_stops_before_the_optimizer_steps(monkeypatch):
    from minipar.programs.train_checks import TrainingDiverged
    real = train_mod.clip_grad_norm_
    calls = []

    def poisoned(params, max_norm):
        calls.append(1)
        if len(calls) == 2:
            params[0].grad.flat[0] = np.inf
        return real(params, max_norm)

    monkeypatch.setattr(train_mod, "clip_grad_norm_", poisoned)
    with pytest.raises(TrainingDiverged, match="gradient norm became inf at step 2 of 20"):
        train(TrainConfig(**TINY))


def test_the_train_command_exits_1_on_divergence_and_2_when_too_large(capsys):
    assert main(["train", *TINY_FLAGS, "--lr", "10000", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "minipar train: training diverged: the loss became nan at step" in err
    assert "Traceback" not in err and "RuntimeWarning" not in err
    with pytest.raises(SystemExit) as e:
        main(["train", "--hidden", "16384", "--heads", "128", "--layers", "48"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "this run needs about" in err and "Traceback" not in err


def test_configurations_that_cannot_learn_are_refused():
    with pytest.raises(ValueError, match="hidden = 1 cannot learn: LayerNorm"):
        TrainConfig(**{**TINY, "hidden": 1, "num_heads": 1})
    with pytest.raises(ValueError, match="the only step uses it"):
        TrainConfig(**{**TINY, "steps": 1, "warmup_steps": 1})


def test_the_summary_names_the_peak_it_divides_by(runs):
    assert runs["float64"][0].peak_label == "67 TFLOP/s, the FP64 tensor-core peak"
    assert runs["bfloat16"][0].peak_label == "989 TFLOP/s, the dense BF16 tensor-core peak"
    r = train(TrainConfig(**{**TINY, "steps": 3}))
    assert r.peak_label.startswith("494 TFLOP/s, the TF32 tensor-core peak")
    assert "plain FP32 is 67 TFLOP/s" in r.peak_label
    from minipar.programs.train_report import summary
    assert "of 494 TFLOP/s, the TF32" in "\n".join(summary(r.config, r))
