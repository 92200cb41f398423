"""`minipar train --experts`: a mixture of experts on one device and over dp x ep; the model
FLOPs of the report (moe_model_flops) equal what the clock was charged, dropless; the
balancing options reach the routers; the flags' refusals."""

import numpy as np
import pytest

from minipar.cli import main
from minipar.nn.moe import moe_layers
from minipar.programs.train import TrainConfig, train
from minipar.programs.train_parallel import train_parallel
from minipar.programs.train_report import summary

TINY = dict(steps=4, global_batch=8, seq_len=16, num_layers=2, hidden=32, num_heads=2,
            lr=1e-2, warmup_steps=2, min_lr=1e-3, dtype="float64", experts=4, top_k=2)
FLAGS = ["--steps", "3", "--batch", "8", "--seq-len", "16", "--layers", "2", "--hidden", "32",
         "--heads", "2", "--quiet"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [dict(), dict(moe_every=2, top_k=1, num_microbatches=2)])
def test_dropless_model_flops_are_what_the_clock_was_charged(kw):
    r = train(TrainConfig(**{**TINY, **kw}))
    assert r.clock_flops_per_step == pytest.approx(r.model_flops_per_step, rel=1e-12)
    dense = train(TrainConfig(**{**TINY, **kw, "experts": 0}))
    assert r.model_flops_per_step > dense.model_flops_per_step  # k = 2 experts and a router
    text = "\n".join(summary(r.config, r))
    m = r.model.cfg
    assert f"{m.num_active_parameters():,} of the {m.num_parameters():,} parameters" in text
    assert "exactly what the clock was charged" in text


@pytest.mark.timeout(60)
def test_dp_x_ep_trains_and_the_routers_biases_reach_the_trained_model():
    cfg = TrainConfig(**{**TINY, "steps": 6}, dp=2, ep=2, capacity_factor=1.0,
                      bias_update_rate=0.01, z_loss_coeff=1e-3)
    r = train_parallel(cfg)
    assert r.last_loss(2) < r.first_loss(2)
    assert np.isfinite(r.grad_norms).all()
    biases = [layer.router.expert_bias for layer in moe_layers(r.model)]
    assert biases and any(np.abs(b).max() > 0 for b in biases)  # not parameters: sent
    assert set(r.model.named_parameters()) == set(
        p.name for p in r.model.parameters())  # every expert came back from its owner


@pytest.mark.timeout(60)
def test_the_global_aux_loss_flag_reaches_the_moe_config_and_the_report(capsys):
    main(["train", *FLAGS, "--experts", "4", "--dp", "2", "--ep", "2", "--global-aux-loss",
          "--dtype", "float64"])
    out = capsys.readouterr().out
    assert "aux loss 0.01 (global batch)" in out
    cfg = TrainConfig(**{**TINY, "steps": 2}, dp=2, ep=2, global_aux_loss=True)
    assert cfg.moe_config().global_aux_loss
    r = train_parallel(cfg)
    assert np.isfinite(r.grad_norms).all()


@pytest.mark.parametrize("flags, match", [
    (["--ep", "2", "--dp", "2"], "--ep 2 spreads experts over ranks, and --experts is 0"),
    (["--experts", "2", "--top-k", "3"], "--top-k 3 is more than --experts 2"),
    (["--experts", "3", "--ep", "2", "--dp", "2"], r"try --ep in \[1\]"),
    (["--experts", "4", "--dp", "2", "--zero", "1"], "leave out --zero and --sp"),
    (["--global-aux-loss"], "--global-aux-loss balances experts, and --experts is 0"),
    (["--experts", "4", "--global-aux-loss", "--aux-loss-coeff", "0"],
     "--aux-loss-coeff is 0 \\(no aux loss\\)"),
    (["--experts", "4", "--ep", "2", "--dp", "2", "--checkpoint-dir", "x"],
     "checkpoints of experts spread over ranks are not written yet"),
])
def test_the_flags_refuse_what_is_not_composed(flags, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *FLAGS, *flags])
    assert e.value.code == 2
    assert __import__("re").search(match, capsys.readouterr().err)
