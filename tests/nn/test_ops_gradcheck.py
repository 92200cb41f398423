"""The gradient checker itself: it passes right gradients, and a wrong one fails with a
message that tells a learner which input, which entry, and by how much."""

import re

import numpy as np
import pytest

import minipar as mp
from minipar.nn.gradcheck import gradcheck, numeric_gradient
from minipar.nn.linear import linear_backward, linear_forward


def _linear_case():
    g = np.random.default_rng(0)
    x, w, r = g.standard_normal((2, 3, 4)), g.standard_normal((5, 4)), g.standard_normal((2, 3, 5))
    with mp.device():
        y, saved = linear_forward(x, w)
        dx, dw, _ = linear_backward(r, saved, w, False)

    def f(x, w):
        return np.sum(linear_forward(x, w)[0] * r)

    return f, x, w, dx, dw


def test_right_gradients_pass():
    f, x, w, dx, dw = _linear_case()
    assert gradcheck(f, {"x": x, "w": w}, {"x": dx, "w": dw}) is True


def test_numeric_gradient_of_a_quadratic():
    a = np.array([[1.0, -2.0], [0.5, 3.0]])
    n = numeric_gradient(lambda a: np.sum(a**2), {"a": a}, "a")
    np.testing.assert_allclose(n, 2 * a, rtol=1e-9)


def test_wrong_gradient_names_input_index_and_both_values():
    f, x, w, dx, dw = _linear_case()
    bad = dw.copy()
    bad[3, 1] += 0.5  # one wrong entry
    with pytest.raises(AssertionError) as info:
        gradcheck(f, {"x": x, "w": w}, {"x": dx, "w": bad})
    msg = str(info.value)
    assert "input 'w'" in msg and "(5, 4)" in msg
    assert "1 of 20 entries" in msg
    assert "index (3, 1)" in msg
    received = float(re.search(r"Received derivative (\S+)", msg).group(1))
    expected = float(re.search(r"but was expecting (\S+) \(finite differences\)", msg).group(1))
    assert received == pytest.approx(bad[3, 1]) and expected == pytest.approx(dw[3, 1])
    assert "relative error" in msg


def test_transposed_gradient_fails_on_shape_with_a_hint():
    f, x, w, dx, dw = _linear_case()
    with pytest.raises(AssertionError, match=r"shape \(4, 5\).*\(5, 4\).*transpose"):
        gradcheck(f, {"x": x, "w": w}, {"w": dw.T})


def test_nan_gradient_fails():
    f, x, w, dx, dw = _linear_case()
    bad = dx.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(AssertionError, match=r"input 'x'.*\n.*index \(0, 0, 0\)"):
        gradcheck(f, {"x": x, "w": w}, {"x": bad})


def test_misuse_is_explained():
    f, x, w, dx, dw = _linear_case()
    with pytest.raises(ValueError, match="not among the inputs"):
        gradcheck(f, {"x": x, "w": w}, {"W": dw})
    with pytest.raises(ValueError, match="scalar"):
        gradcheck(lambda x: x * 2, {"x": x}, {"x": 2 * np.ones_like(x)})


def test_evaluations_are_not_charged_to_the_caller():
    f, x, w, dx, dw = _linear_case()
    with mp.device() as ctx:
        gradcheck(f, {"x": x, "w": w}, {"x": dx, "w": dw})
        assert ctx.trace.events == [] and ctx.clock.now == 0.0
        assert ctx.ledger.peak() == 0


def test_closure_style_sees_in_place_perturbations_and_inputs_are_restored():
    f, x, w, dx, dw = _linear_case()
    x0, w0 = x.copy(), w.copy()
    assert gradcheck(lambda: f(x, w), {"x": x, "w": w}, {"x": dx, "w": dw})
    np.testing.assert_array_equal(x, x0)  # bit for bit
    np.testing.assert_array_equal(w, w0)
    with pytest.raises(AssertionError, match="input 'w'"):
        gradcheck(lambda: f(x, w), {"w": w}, {"w": 2 * dw})
    np.testing.assert_array_equal(w, w0)
    with pytest.raises(ValueError, match="float64"):
        gradcheck(lambda: f(x, w), {"w": w.astype(np.float32)}, {"w": dw})
