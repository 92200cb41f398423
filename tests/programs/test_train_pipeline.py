"""`minipar train --pp N`: the same training as one device, on a pipeline of N devices."""

import numpy as np
import pytest

from minipar.cli import main
from minipar.programs.train import TrainConfig, train
from minipar.programs.train_pipeline import train_pipeline

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
    r = train_pipeline(TrainConfig(**cfg, pp=pp, schedule=name, chunks=chunks))
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
                 "idles 20.0 % of a step", "on each of 2 devices: the bubble alone bounds "
                 "it at 80.0 %", "(the busiest rank's)", "sample (greedy, 10 characters"):
        assert what in out, what


@pytest.mark.parametrize("kw, words", [
    (dict(pp=3, num_layers=2), ["3 stages need at least 3 layers"]),
    (dict(pp=2, schedule="zb"), ["unknown schedule 'zb'", "'gpipe', '1f1b'"]),
    (dict(pp=4, schedule="interleaved_1f1b", num_microbatches=2, num_layers=4),
     ["multiple of pp = 4", "microbatches = 4"]),
    (dict(pp=2, chunks=2), ["'1f1b' runs one stage per rank", "'interleaved_1f1b'"]),
    (dict(pp=2, dtype="float16"), ["float16 needs loss scaling", "bfloat16"]),
])
def test_pipelines_that_cannot_run_are_refused_by_the_config(kw, words):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{**TINY, **kw})
    for w in words:
        assert w in str(e.value)


def test_train_and_train_pipeline_refuse_each_others_configs():
    with pytest.raises(ValueError, match="train_pipeline"):
        train(TrainConfig(**TINY, pp=2))
    with pytest.raises(ValueError, match=r"one device: train it with train\(cfg\)"):
        train_pipeline(TrainConfig(**TINY))
