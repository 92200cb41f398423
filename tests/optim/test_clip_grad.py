"""Clipping by the *global* gradient norm, and how a sharded version composes the pieces."""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import clip_coef, clip_grad_norm_, global_grad_norm, squared_grad_norm


def with_grad(name, grad, dtype=np.float64):
    p = Parameter(name, np.zeros(len(grad), dtype=dtype))
    p.accumulate(np.array(grad, dtype=dtype))
    return p


def test_clipping_is_global_not_per_tensor():
    """Each tensor has norm 5 < max_norm = 6, but together sqrt(50) ≈ 7.07 > 6: global
    clipping scales both by 6/sqrt(50); per-tensor clipping would leave both unchanged."""
    with minipar.device():
        a, b = with_grad("a", [3.0, 4.0]), with_grad("b", [4.0, 3.0])
        total = clip_grad_norm_([a, b], max_norm=6.0)
        assert total == pytest.approx(math.sqrt(50.0), rel=1e-15)   # the norm *before*
        coef = 6.0 / (math.sqrt(50.0) + 1e-6)
        assert_allclose(a.grad, [3.0 * coef, 4.0 * coef], rtol=1e-15)
        assert_allclose(b.grad, [4.0 * coef, 3.0 * coef], rtol=1e-15)
        assert global_grad_norm([a, b]) == pytest.approx(6.0, rel=1e-6)
        assert not np.allclose(a.grad, [3.0, 4.0])   # per-tensor clipping would fail here


def test_one_coefficient_keeps_the_direction():
    """Norms 5 and 12, global 13, max 6.5: both halve (per-tensor would clip only b)."""
    with minipar.device():
        a, b = with_grad("a", [3.0, 4.0]), with_grad("b", [0.0, 12.0])
        assert clip_grad_norm_([a, b], 6.5) == pytest.approx(13.0, rel=1e-15)
        assert_allclose(a.grad, [1.5, 2.0], rtol=1e-6)
        assert_allclose(b.grad, [0.0, 6.0], rtol=1e-6)


def test_below_the_threshold_nothing_changes_and_missing_grads_are_ignored():
    with minipar.device():
        a = with_grad("a", [0.6, 0.8])
        c = Parameter("c", np.zeros(3))             # no gradient
        assert clip_grad_norm_([a, c], max_norm=2.0) == pytest.approx(1.0, rel=1e-15)
        assert_array_equal(a.grad, [0.6, 0.8])
        assert c.grad is None


def test_norm_is_accumulated_in_float64():
    """1e20² overflows float32 (max ≈ 3.4e38); the float64 sum does not."""
    with minipar.device():
        a = with_grad("a", [1e20, 1e20], np.float32)
        total = clip_grad_norm_([a], max_norm=1.0)
        assert math.isfinite(total)
        assert total == pytest.approx(math.sqrt(2) * float(np.float32(1e20)), rel=1e-12)
        assert a.grad.dtype == np.float32
        assert_allclose(a.grad, [1 / math.sqrt(2)] * 2, rtol=1e-6)


def test_non_finite_norm_is_applied_as_torch_does_or_raises():
    """torch.nn.utils.clip_grad_norm_ (error_if_nonfinite=False) multiplies by the
    coefficient all the same: 0 for an inf norm (inf * 0 = nan), nan for a nan norm."""
    with minipar.device():
        a = with_grad("a", [1.0, np.inf])
        with pytest.raises(FloatingPointError, match="inf or nan"):
            clip_grad_norm_([a], 1.0, error_if_nonfinite=True)
        assert_array_equal(a.grad, [1.0, np.inf])  # refused: nothing touched
        b = with_grad("b", [3.0, -2.0])
        assert clip_grad_norm_([a, b], 1.0) == math.inf
        assert_array_equal(a.grad, [0.0, np.nan])
        assert_array_equal(b.grad, [0.0, -0.0])
        c, d = with_grad("c", [1.0, np.nan]), with_grad("d", [3.0, 4.0])
        assert math.isnan(clip_grad_norm_([c, d], 1.0))
        assert np.isnan(c.grad).all() and np.isnan(d.grad).all()
        e = with_grad("e", [1.0, np.inf])
        clip_grad_norm_([e], math.inf)  # inf / inf: nan, as torch computes it
        assert np.isnan(e.grad).all()


def test_clip_coef():
    assert clip_coef(10.0, 5.0) == 5.0 / (10.0 + 1e-6)
    assert clip_coef(1.0, 5.0) == 1.0
    assert clip_coef(0.0, 5.0) == 1.0
    with pytest.raises(ValueError):
        clip_coef(1.0, 0.0)
    assert clip_coef(math.inf, 5.0) == 0.0
    assert math.isnan(clip_coef(math.nan, 5.0))  # min(1.0, nan) would say 1.0
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        clip_coef(1.0, math.nan)  # would never clip


def _poisoned(grads):
    """The gradients of a step where one element overflowed: [inf, finite ...]."""
    grads[0].flat[0] = np.inf
    return grads


def test_mixed_precision_and_the_engines_clip_a_non_finite_norm_as_clip_grad_norm_():
    """One inf gradient element, max_grad_norm 1, AdamW without weight decay: the
    coefficient 0 zeroes every finite gradient (Adam's update of a zero gradient is 0), so
    every weight but the poisoned one is unchanged and that one is nan. Before, the step
    silently went ahead with the unclipped gradients."""
    from minipar.nn import GPT, GPTConfig
    from minipar.optim import AdamW, MixedPrecisionOptimizer
    from minipar.parallel import DistributedDataParallel, zero_engine

    cfg = GPTConfig(vocab_size=8, seq_len=4, hidden=8, num_heads=2, num_layers=1,
                    dtype="bfloat16")
    ids = np.arange(8).reshape(4, 2) % cfg.vocab_size

    with minipar.device():
        model = GPT(cfg)
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), dtype="bfloat16", lr=0.1,
                                      weight_decay=0.0, max_grad_norm=1.0, loss_scaler=None)
        before = [m.data.copy() for m in opt.masters.values()]
        model.loss_and_grad(ids, ids)
        _poisoned([p.grad for p in model.parameters()])
        assert opt.step() and opt.last_grad_norm == math.inf
        after = [m.data for m in opt.masters.values()]
        assert np.isnan(after[0].flat[0])
        after[0].flat[0] = before[0].flat[0]
        for a, b in zip(after, before):
            assert_array_equal(a, b)

    def program(ctx, make):
        model = GPT(cfg)
        engine = make(model)
        before = [p.data.astype(np.float32) for p in model.parameters()]
        model.loss_and_grad(ids, ids)
        owned = engine._owned_grads
        engine._owned_grads = lambda: _poisoned(owned()) if ctx.rank == 0 else owned()
        engine.step()
        with engine.summon_full_params(writeback=False):
            after = [p.data.astype(np.float32) for p in model.parameters()]
        return engine.last_grad_norm, before, after

    opt_kw = dict(lr=0.1, weight_decay=0.0, max_grad_norm=1.0)
    for make in (lambda m: DistributedDataParallel(m, AdamW, **opt_kw),
                 lambda m: zero_engine(m, stage=1, optimizer_cls=AdamW, **opt_kw)):
        norm, before, after = minipar.launch(lambda ctx: program(ctx, make), 1)[0]
        assert norm == math.inf
        changed = [i for i, (a, b) in enumerate(zip(after, before))
                   if not np.array_equal(a, b, equal_nan=False)]
        assert changed == [0] and np.isnan(after[0]).sum() == 1


def test_sharded_clipping_all_reduces_squared_norms():
    """Two ranks each hold half the gradients. All-reducing the squared norms and then
    taking the root gives every rank the single-device coefficient; clipping each shard
    by its own norm does not."""
    grads = {"a": [3.0, 4.0], "b": [0.0, 12.0]}
    with minipar.device():
        full = [with_grad(n, g) for n, g in grads.items()]
        clip_grad_norm_(full, 6.5)
        expected = {p.name: p.grad.copy() for p in full}

    def program(ctx):
        name = "ab"[ctx.rank]
        mine = [with_grad(name, grads[name])]
        local = squared_grad_norm(mine)
        total = math.sqrt(float(minipar.all_reduce(np.array(local), op="sum")))
        coef = clip_coef(total, 6.5)
        for p in mine:
            p.grad *= coef
        wrong = [with_grad(name + "_wrong", grads[name])]
        clip_grad_norm_(wrong, 6.5)                  # the bug: each shard by its own norm
        return name, total, mine[0].grad, wrong[0].grad

    for name, total, right, wrong in minipar.launch(program, world_size=2):
        assert total == pytest.approx(13.0, rel=1e-15)
        assert_allclose(right, expected[name], rtol=1e-15)
        if name == "b":
            assert not np.allclose(wrong, expected[name])
