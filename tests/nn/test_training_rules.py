"""Training rules on the real GPT: gradient accumulation, mixed-precision bytes, fp16 overflow."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import minipar as mp
from minipar.data import loss_scale_for_accumulation, split_microbatches
from minipar.nn.config import GPTConfig
from minipar.nn.gpt import GPT
from minipar.optim import AdamW, MixedPrecisionOptimizer

BF16 = np.dtype(ml_dtypes.bfloat16)


def batch(cfg, s, b, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (s, b))
    return ids, rng.integers(0, cfg.vocab_size, (s, b))


def grads(model):
    return {p.name: p.grad.copy() for p in model.parameters()}


# ---- the gradient-accumulation trap --------------------------------------------------------
# float64 throughout: the accumulated and the full-batch gradient differ only in the order of
# the additions over samples, so they agree to rtol 1e-10 (atol 1e-15 for entries that are
# near zero). Measured over a grid of these configurations: at most 3e-16 absolute, 6e-12
# relative (on entries of size ~1e-12; ~1e-15 on typical ones).
RTOL, ATOL = 1e-10, 1e-15


@settings(max_examples=20)
@given(k=st.sampled_from([1, 2, 4]), micro=st.integers(1, 3), s=st.integers(2, 6),
       tie=st.booleans(), seed=st.integers(0, 2**16))
def test_accumulated_gradients_equal_the_global_batch_gradient(k, micro, s, tie, seed):
    """Σ_i grad((1/k) L_i) = grad L for a global batch cut into k micro-batches; without the
    1/k every gradient is k times too large (Adam would hide it; clipping and SGD do not)."""
    cfg = GPTConfig(vocab_size=11, seq_len=6, hidden=8, num_heads=2, num_layers=2,
                    tie_embeddings=tie, init_std=0.3, seed=seed % 7)
    with mp.device():
        model = GPT(cfg)
        ids, tgt = batch(cfg, s, k * micro, seed)

        full_loss = model.loss_and_grad(ids, tgt)
        full = grads(model)
        model.zero_grad()

        parts = split_microbatches(ids, tgt, k)
        losses = [model.loss_and_grad(i, t, loss_scale=loss_scale_for_accumulation(k))
                  for i, t in parts]
        accumulated = grads(model)
        model.zero_grad()

        for i, t in parts:  # the trap: each micro-batch's backward starts from L_i itself
            model.loss_and_grad(i, t)
        unscaled = grads(model)

    assert np.mean(losses) == pytest.approx(full_loss, rel=1e-12)
    for name, g in full.items():
        assert_allclose(accumulated[name], g, rtol=RTOL, atol=ATOL, err_msg=name)
        assert_allclose(unscaled[name], k * g, rtol=RTOL, atol=ATOL, err_msg=name)
    if k > 1:
        norm = lambda gs: np.sqrt(sum(np.sum(v ** 2) for v in gs.values()))  # noqa: E731
        assert norm(unscaled) == pytest.approx(k * norm(full), rel=1e-10)


# ---- mixed precision: 2 + 2 + 12 bytes per parameter, and the step's transient ---------------
def test_bf16_gpt_with_mixed_precision_adamw_holds_2_2_12_psi():
    cfg = GPTConfig(vocab_size=29, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                    dtype="bfloat16")
    with mp.device() as ctx:
        led = ctx.ledger
        model = GPT(cfg)
        psi = model.num_parameters()
        n_max = max(p.size for p in model.parameters())  # the MLP's [4h, h] weights here
        assert all(p.data.dtype == BF16 for p in model.parameters())
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), dtype="bfloat16", lr=1e-3)
        ids, tgt = batch(cfg, 8, 3, seed=0)
        model.loss_and_grad(ids, tgt)
        assert opt.step() is True

        assert led.held("parameters") == 2 * psi
        assert led.held("gradients") == 2 * psi
        assert led.held("optimizer_states") == 12 * psi          # master + m + v, float32
        assert led.held("activations") == 0
        # the float32 gradient copies were made one tensor at a time (item of the optimizer's
        # docstring): the peak is 2Ψ + 4·n_max, well under the 6Ψ of copying all at once
        assert led.peak("gradients") == 2 * psi + 4 * n_max
        assert 2 * psi + 4 * n_max < 6 * psi
        assert not any(a.name.endswith(".grad32") for a in led.live())
        opt.zero_grad()
        assert led.held("gradients") == 0


# ---- float16: an overflow skips the step and backs the scale off -----------------------------
def snapshot(model, opt):
    return ({p.name: p.data.copy() for p in model.parameters()},
            {n: m.data.copy() for n, m in opt.masters.items()})


@pytest.mark.parametrize("how", ["huge loss scale", "inf in one gradient"])
def test_fp16_overflow_skips_the_step_and_backs_off(how):
    cfg = GPTConfig(vocab_size=29, seq_len=8, hidden=16, num_heads=2, num_layers=1,
                    dtype="float16")
    with mp.device() as ctx:
        model = GPT(cfg)
        psi = model.num_parameters()
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), dtype="float16", lr=1e-3)
        s0 = opt.loss_scale
        assert s0 == 2.0 ** 16
        before = snapshot(model, opt)
        ids, tgt = batch(cfg, 8, 2, seed=1)
        with np.errstate(over="ignore", invalid="ignore"):
            if how == "huge loss scale":  # S · 1e6 · L: fp16 gradients overflow to inf
                model.loss_and_grad(ids, tgt, loss_scale=s0 * 1e6)
                assert any(not np.isfinite(p.grad).all() for p in model.parameters())
            else:
                model.loss_and_grad(ids, tgt, loss_scale=s0)
                model.parameters()[3].grad.flat[0] = np.inf
            assert opt.step() is False
        opt.zero_grad()

        after = snapshot(model, opt)
        for b, a in zip(before, after):  # nothing moved, bit for bit
            for name in b:
                assert_array_equal(a[name].view(np.uint8), b[name].view(np.uint8), name)
        assert opt.inner.state == {}                  # no moments made, no step counted
        assert ctx.ledger.held("optimizer_states") == 4 * psi   # the masters only
        assert opt.loss_scale == s0 / 2
        assert (opt.steps_taken, opt.steps_skipped) == (0, 1)

        model.loss_and_grad(ids, tgt, loss_scale=opt.loss_scale)  # the scale that fits
        assert opt.step() is True
        assert (opt.steps_taken, opt.steps_skipped) == (1, 1)
        assert ctx.ledger.held("optimizer_states") == 12 * psi
