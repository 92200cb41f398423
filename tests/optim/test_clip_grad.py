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


def test_non_finite_norm_leaves_gradients_alone_or_raises():
    with minipar.device():
        a = with_grad("a", [1.0, np.inf])
        assert clip_grad_norm_([a], 1.0) == math.inf
        assert_array_equal(a.grad, [1.0, np.inf])
        with pytest.raises(FloatingPointError, match="inf or nan"):
            clip_grad_norm_([a], 1.0, error_if_nonfinite=True)


def test_clip_coef():
    assert clip_coef(10.0, 5.0) == 5.0 / (10.0 + 1e-6)
    assert clip_coef(1.0, 5.0) == 1.0
    assert clip_coef(0.0, 5.0) == 1.0
    with pytest.raises(ValueError):
        clip_coef(1.0, 0.0)


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
