"""`minipar train --cp N --cp-method ring|ulysses`: context-parallel layouts train like one
device; the clock's FLOPs say what the ring skips; the flags' refusals."""

import re

import numpy as np
import pytest

from minipar.cli import main
from minipar.programs.train import TrainConfig, train
from minipar.programs.train_parallel import train_parallel
from minipar.programs.train_report import layout

TINY = dict(steps=3, global_batch=8, seq_len=16, num_layers=2, hidden=32, num_heads=4,
            lr=1e-2, warmup_steps=1, min_lr=1e-3, num_microbatches=2, dtype="float64")
FLAGS = ["--steps", "2", "--batch", "8", "--seq-len", "16", "--layers", "2", "--hidden", "32",
         "--heads", "4", "--quiet"]
LAYOUTS = {"cp 2 ring": dict(cp=2), "cp 4 Ulysses": dict(cp=4, cp_method="ulysses"),
           "dp 2 x cp 2": dict(dp=2, cp=2),
           "cp 2 x tp 2 + SP, ZeRO-1 over dp 2": dict(cp=2, tp=2, dp=2, zero=1,
                                                      sequence_parallel=True),
           "cp 2 x pp 2": dict(cp=2, pp=2),
           "ZeRO-2 over cp 2 alone": dict(cp=2, zero=2)}


@pytest.fixture(scope="module")
def one():
    return train(TrainConfig(**TINY))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_context_parallel_layout_trains_like_one_device_in_float64(one, name):
    """Losses and norms rtol 1e-12, the weights 1e-11 of the largest. The ring charges its
    blocks' FLOPs: half of the s x s pairs (the causal ones, a diagonal block half) in 7
    products of 2·b·s²·h where one device charges 12 dense ones (2 forward, 4 backward;
    the ring's backward recomputes the scores): 5·B·s²·h a layer less. Ulysses runs nn's
    dense core on its heads: the same FLOPs as one device."""
    cfg = TrainConfig(**TINY, **LAYOUTS[name])
    r = train_parallel(cfg)
    np.testing.assert_allclose(r.losses, one.losses, rtol=1e-12)
    np.testing.assert_allclose(r.grad_norms, one.grad_norms, rtol=1e-12)
    for a, b in zip(r.model.parameters(), one.model.parameters()):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-12,
                                   atol=1e-11 * np.abs(b.data).max(), err_msg=a.name)
    B, s, h, L = TINY["global_batch"], TINY["seq_len"], TINY["hidden"], TINY["num_layers"]
    skipped = 0 if cfg.cp_method == "ulysses" else 5 * B * s * s * h * L
    assert r.clock_flops_per_step == one.clock_flops_per_step - skipped
    assert f"cp {cfg.cp} ({cfg.cp_method}, zigzag rows)" in layout(cfg)


@pytest.mark.timeout(60)
def test_the_command_runs_a_cp_layout_and_says_so(capsys):
    assert main(["train", *FLAGS, "--cp", "2", "--dp", "2"]) == 0
    out = capsys.readouterr().out
    assert "dp 2 (DDP) x cp 2 (ring, zigzag rows) x pp 1 x tp 1 = 4 ranks" in out


@pytest.mark.parametrize("flags, match", [
    (["--cp", "3"], r"--seq-len 16 cannot be split over --cp 3: zigzag cuts the sequence "
                    r"into 6 chunks; expected a multiple of 6"),
    (["--cp", "8", "--cp-method", "ulysses"], r"4 heads .* not divisible by 8: choose cp in "
                                              r"\[1, 2, 4\], or --cp-method ring"),
    (["--cp", "2", "--experts", "4"], "--cp 2 with --experts is not composed"),
    (["--cp", "2", "--cp-method", "flash"], "invalid choice: 'flash'"),
    (["--cp", "0"], "--cp"),
])
def test_the_flags_refuse_what_cp_cannot_split(flags, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *FLAGS, *flags])
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)
