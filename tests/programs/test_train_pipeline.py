"""`minipar train --pp N`: the same training as one device, on a pipeline of N devices."""

import numpy as np
import pytest

from minipar.cli import build_parser, main
from minipar.parallel.pp import SCHEDULES, dry_run, lower, schedule
from minipar.programs.train import TrainConfig, train
from minipar.programs.train_parallel import EQUAL_STAGES, train_parallel

# ~29k parameters, 8 x 16 characters a step, 4 micro-batches: about 0.3 s per pipeline run
TINY = dict(steps=6, global_batch=8, seq_len=16, num_layers=2, hidden=32, num_heads=2,
            lr=1e-2, warmup_steps=2, min_lr=1e-3, num_microbatches=4)
FLAGS = ["--steps", "6", "--batch", "8", "--seq-len", "16", "--layers", "2", "--hidden", "32",
         "--heads", "2", "--micro-batches", "4"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pp, name, chunks", [(2, "1f1b", 1), (2, "gpipe", 1),
                                              (1, "interleaved_1f1b", 2)])
def test_a_pipeline_trains_like_one_device(pp, name, chunks):
    """float64: the losses, learning rates and gradient norms of each step equal one
    device's accumulating the same 4 micro-batches (rtol 1e-12); the weights at the end
    too, to 1e-11 of the largest; the clock is charged the same matmul FLOPs."""
    cfg = dict(TINY, dtype="float64")
    one = train(TrainConfig(**cfg))
    r = train_parallel(TrainConfig(**cfg, pp=pp, schedule=name, chunks=chunks))
    np.testing.assert_allclose(r.losses, one.losses, rtol=1e-12)
    np.testing.assert_allclose(r.grad_norms, one.grad_norms, rtol=1e-12)
    assert r.lrs == one.lrs and r.world_size == pp
    for a, b in zip(r.model.parameters(), one.model.parameters()):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-12,
                                   atol=1e-11 * np.abs(b.data).max(), err_msg=a.name)
    assert r.clock_flops_per_step == pytest.approx(one.clock_flops_per_step, rel=1e-12)
    m, v = TINY["num_microbatches"], chunks
    assert r.bubble == pytest.approx((pp - 1) / (v * m + pp - 1), rel=1e-12)
    assert r.mfu <= (1 - r.bubble) * (1 + 1e-12)  # the bubble bounds it; messages take more


def test_the_command_runs_a_pipeline_and_names_its_schedule(capsys):
    assert main(["train", *FLAGS, "--pp", "2", "--schedule", "gpipe", "--quiet",
                 "--sample", "10"]) == 0
    out = capsys.readouterr().out
    for what in ("on 2 simulated H100-SXM-80GB devices, a pipeline of 2 stages",
                 "pipeline        gpipe, pp 2, 1 chunk per rank: with equal stages a rank "
                 "idles 20.0 % of a step (the bubble: idle / total; 25.0 % as idle / ideal, "
                 "the papers' bubble fraction)", "on each of 2 devices: the bubble alone bounds "
                 "it at 80.0 %", "(the busiest rank's)", "sample (greedy, 10 characters"):
        assert what in out, what


@pytest.mark.parametrize("kw, words", [
    (dict(pp=3, num_layers=2), ["3 stages need at least 3 layers"]),
    (dict(pp=2, schedule="zb"), ["unknown schedule 'zb'", "'gpipe', '1f1b'"]),
    (dict(pp=4, schedule="interleaved_1f1b", num_microbatches=2, num_layers=4),
     ["multiple of pp = 4", "microbatches = 4"]),
    (dict(pp=2, chunks=2), ["'1f1b' runs one stage per rank", "'interleaved_1f1b'"]),
    (dict(pp=2, dtype="float16"), ["float16 needs loss scaling", "bfloat16"]),
    (dict(dp=2, dtype="float16"), ["float16 needs loss scaling", "bfloat16"]),
])
def test_pipelines_that_cannot_run_are_refused_by_the_config(kw, words):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{**TINY, **kw})
    for w in words:
        assert w in str(e.value)


def test_train_and_train_parallel_refuse_each_others_configs():
    with pytest.raises(ValueError, match="train_parallel"):
        train(TrainConfig(**TINY, pp=2))
    with pytest.raises(ValueError, match=r"one device: train it with train\(cfg\)"):
        train_parallel(TrainConfig(**TINY))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["zb_h1", "zb_h2", "zbv", "dualpipev"])
def test_the_zero_bubble_schedules_train_like_one_device(name):
    """float64, chunks left to the schedule (2 in a V): one device's losses and norms
    (rtol 1e-12); the bubble reported is the dry run's of the schedule at t_F = t_I = t_W,
    t_B = t_I + t_W, in both spellings; ZB-H1's is (p - 1)(t_F + t_B - 2 t_W) = p - 1 of
    idle a rank over m (t_F + t_B) of work: 1/12 at p = 2, m = 4."""
    cfg = dict(TINY, dtype="float64", num_layers=4)
    one = train(TrainConfig(**cfg))
    c = TrainConfig(**cfg, pp=2, schedule=name)
    assert c.chunks == (2 if name in ("zbv", "dualpipev") else 1)
    r = train_parallel(c)
    np.testing.assert_allclose(r.losses, one.losses, rtol=1e-12)
    np.testing.assert_allclose(r.grad_norms, one.grad_norms, rtol=1e-12)
    run = dry_run(lower(schedule(name, 2, 4)), EQUAL_STAGES)
    assert (r.bubble, r.bubble_over_ideal) == (float(run.bubble_over_total),
                                               float(run.bubble_over_ideal))
    if name == "zb_h1":
        assert r.bubble_over_ideal == pytest.approx(1 / 12, rel=1e-12)
    assert r.bubble < 1 / 5  # less than 1F1B's (p - 1)/(m + p - 1) at p = 2, m = 4


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_the_command_runs_a_v_and_reports_its_bubble_both_ways(capsys, name):
    assert main(["train", *FLAGS, "--layers", "4", "--steps", "2", "--pp", "2",
                 "--schedule", name, "--quiet"]) == 0
    out = capsys.readouterr().out
    run = dry_run(lower(schedule(name, 2, 4)), EQUAL_STAGES)
    assert (f"pipeline        {name}, pp 2, 2 chunks per rank: with equal stages a rank "
            f"idles {100 * float(run.bubble_over_total):.1f} % of a step (the bubble: idle "
            f"/ total; {100 * float(run.bubble_over_ideal):.1f} % as idle / ideal") in out
    assert "a pipeline of 4 stages" in out


def test_the_command_takes_every_schedule_the_library_has():
    parser = build_parser()
    train_help = parser._subparsers._group_actions[0].choices["train"].format_help()
    for name in SCHEDULES:
        assert parser.parse_args(["train", "--pp", "2", "--schedule", name]).schedule == name
        assert name in train_help


@pytest.mark.parametrize("flags, words", [
    (["--pp", "4", "--layers", "8", "--schedule", "dualpipev"],
     ["--schedule dualpipev --pp 4 --micro-batches 4", "at least 2p = 8 micro-batches",
      "use --micro-batches >= 8"]),
    (["--pp", "2", "--layers", "4", "--schedule", "zbv", "--chunks", "3"],
     ["got --chunks 3", "leave --chunks out or pass --chunks 2"]),
    (["--pp", "2", "--layers", "4", "--schedule", "dualpipev", "--chunks", "1"],
     ["--schedule dualpipev places two chunks on each rank", "pass --chunks 2"]),
    (["--pp", "2", "--layers", "4", "--schedule", "zb_h1", "--chunks", "2"],
     ["--schedule zb_h1 runs one stage per rank, got --chunks 2", "--schedule interleaved_1f1b",
      "--schedule zbv"]),
    (["--pp", "3", "--layers", "5", "--schedule", "zbv"],
     ["--pp 3 x --chunks 2 = 6 stages need at least 6 --layers"]),
])
def test_a_schedules_own_rules_are_usage_errors_naming_the_fix(capsys, flags, words):
    """The schedule is built when the flags are parsed; what it refuses is a usage error
    (exit 2) in the command's flags."""
    with pytest.raises(SystemExit) as e:
        main(["train", *FLAGS, *flags])  # a flag given twice: argparse keeps the last
    assert e.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)


def test_a_v_takes_chunks_2_as_given():
    assert main(["train", *FLAGS, "--layers", "4", "--steps", "1", "--pp", "2", "--schedule",
                 "zbv", "--chunks", "2", "--quiet"]) == 0
