"""Dynamic loss scaling for float16: skip on overflow, back off, grow after clean steps."""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, AdamW, DynamicLossScaler, MixedPrecisionOptimizer


def test_scaler_backs_off_and_grows():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    s.update(True)
    assert s.scale == 4.0 and s.growth_tracker == 0 and s.overflows == 1
    s.update(False)
    s.update(False)
    assert s.scale == 4.0 and s.growth_tracker == 2
    s.update(False)                                   # the 3rd clean step in a row
    assert s.scale == 8.0 and s.growth_tracker == 0
    s.update(False)
    s.update(True)                                    # an overflow resets the count
    s.update(False)
    s.update(False)
    assert s.scale == 4.0 and s.growth_tracker == 2


def test_scale_never_drops_below_min_scale():
    s = DynamicLossScaler(init_scale=2.0, min_scale=1.0)
    for _ in range(3):
        s.update(True)
    assert s.scale == 1.0


def test_unscale_and_check():
    with minipar.device():
        s = DynamicLossScaler(init_scale=4.0)
        a = Parameter("a", np.zeros(2, dtype=np.float32))
        a.accumulate(np.array([2.0, 8.0], dtype=np.float32))
        assert s.unscale_and_check([a]) is False
        assert_array_equal(a.grad, [0.5, 2.0])
        assert a.grad.dtype == np.float32
        b = Parameter("b", np.zeros(1, dtype=np.float32))
        b.accumulate(np.array([np.nan], dtype=np.float32))
        assert s.unscale_and_check([a, b]) is True
        h = Parameter("h", np.zeros(1, dtype=np.float16))
        h.accumulate(np.ones(1, dtype=np.float16))
        with pytest.raises(ValueError, match="float32 copies"):
            s.unscale_and_check([h])


def snapshot(opt, params):
    return {
        "params": {p.name: p.data.copy() for p in params},
        "masters": {n: m.data.copy() for n, m in opt.masters.items()},
        "state": {n: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                  for n, s in opt.inner.state.items()},
    }


def assert_same(a, b):
    for part in ("params", "masters"):
        assert a[part].keys() == b[part].keys()
        for n in a[part]:
            assert_array_equal(a[part][n].view(np.uint8), b[part][n].view(np.uint8))
    assert a["state"].keys() == b["state"].keys()
    for n in a["state"]:
        assert a["state"][n]["step"] == b["state"][n]["step"]
        for k in ("m", "v"):
            assert_array_equal(a["state"][n][k], b["state"][n][k])


def test_overflow_skips_the_step_backs_off_and_grows_again():
    psi = 6 + 4
    with minipar.device() as ctx:
        params = [Parameter("w", np.linspace(-1, 1, 6).astype(np.float16)),
                  Parameter("b", np.zeros(4, dtype=np.float16))]
        scaler = DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=3)
        opt = MixedPrecisionOptimizer(AdamW, params, dtype="float16", lr=1e-2,
                                      loss_scaler=scaler)
        assert opt.loss_scaler is scaler

        def backward(inject_inf=False):
            for k, p in enumerate(params):
                g = opt.loss_scale * np.full(p.shape, 0.5 + k, dtype=np.float32)
                if inject_inf and k == 1:
                    g[2] = np.inf
                p.accumulate(g)

        backward()
        assert opt.step() is True
        opt.zero_grad()
        before = snapshot(opt, params)

        backward(inject_inf=True)
        assert opt.step() is False                          # skipped
        assert_same(snapshot(opt, params), before)          # nothing moved, step not counted
        assert all(s["step"] == 1 for s in opt.inner.state.values())
        assert scaler.scale == 2.0 ** 9                     # backed off
        assert (opt.steps_taken, opt.steps_skipped) == (1, 1)
        assert ctx.ledger.held("gradients") == 2 * psi      # float32 copies given back
        assert ctx.ledger.held("optimizer_states") == 12 * psi
        opt.zero_grad()

        for k in range(3):
            backward()
            assert opt.step() is True
            opt.zero_grad()
            assert scaler.scale == (2.0 ** 9 if k < 2 else 2.0 ** 10)   # grows after 3
        assert all(s["step"] == 4 for s in opt.inner.state.values())
        assert (opt.steps_taken, opt.steps_skipped) == (4, 1)


def test_a_too_large_scale_overflows_fp16_and_is_found():
    """Gradients of size up to 1.5 times a scale of 2^16 exceed fp16's max (65504) and
    become inf; the scaler halves until 2^15 (1.5 · 2^15 = 49152 fits), then training runs."""
    target = np.array([1.5, -1.25, 0.75], dtype=np.float32)
    with minipar.device():
        w = Parameter("w", np.zeros(3, dtype=np.float16))
        opt = MixedPrecisionOptimizer(AdamW, [w], dtype="float16", lr=0.05, weight_decay=0.0,
                                      loss_scaler=DynamicLossScaler(init_scale=2.0 ** 20))
        taken = []
        for _ in range(300):
            g = w.data.astype(np.float32) - target          # ∇ ½‖w − t‖²
            with np.errstate(over="ignore"):                 # the fp16 cast overflows
                w.accumulate(opt.loss_scale * g)
            taken.append(opt.step())
            opt.zero_grad()
        assert taken[:5] == [False] * 5 and taken[5] is True   # 2^20 .. 2^16 overflowed
        assert opt.steps_skipped == 5 and opt.loss_scale == 2.0 ** 15
        assert_allclose(w.data.astype(np.float32), target, atol=2e-3)


def test_loss_scaling_saves_gradients_that_underflow_fp16():
    """A gradient of 2e-8 is below fp16's smallest subnormal (2^-24 ≈ 6e-8): unscaled it
    flushes to zero; scaled by 2^16 it survives and is recovered in float32."""
    with minipar.device():
        plain = Parameter("plain", np.zeros(1, dtype=np.float16))
        scaled = Parameter("scaled", np.zeros(1, dtype=np.float16))
        o_plain = MixedPrecisionOptimizer(SGD, [plain], dtype="float16", lr=1.0,
                                          loss_scaler=None)
        o_scaled = MixedPrecisionOptimizer(SGD, [scaled], dtype="float16", lr=1.0)
        assert o_plain.loss_scale == 1.0 and o_scaled.loss_scale == 2.0 ** 16
        for p, o in ((plain, o_plain), (scaled, o_scaled)):
            p.accumulate(o.loss_scale * np.array([2e-8], dtype=np.float32))
            assert o.step()
        assert o_plain.masters["plain"].data[0] == 0.0
        assert_allclose(o_scaled.masters["scaled"].data, [-2e-8], rtol=1e-3)


def test_bfloat16_has_no_loss_scaler_by_default():
    import ml_dtypes

    with minipar.device():
        p = Parameter("p", np.zeros(2, dtype=ml_dtypes.bfloat16))
        opt = MixedPrecisionOptimizer(AdamW, [p], dtype="bfloat16")
        assert opt.loss_scaler is None and opt.loss_scale == 1.0
