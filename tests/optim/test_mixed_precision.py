"""bf16/fp16 parameters with float32 master weights: the ZeRO byte count, rounding, training."""

import ml_dtypes
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, AdamW, MixedPrecisionOptimizer, WarmupCosine

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = {"w1": (4, 6), "b1": (6,), "g": (3,)}
PSI = 4 * 6 + 6 + 3                       # Ψ = 33 parameter elements


def make_params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(n, rng.standard_normal(s).astype(dtype)) for n, s in SHAPES.items()]


def give_grads(params, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    for p in params:
        p.free_grad()
        p.accumulate((rng.standard_normal(p.shape) * scale).astype(np.float32))


def bits(a):
    return np.asarray(a).view(np.uint16)


def test_ledger_is_exactly_2_2_12_psi_for_bf16_adamw():
    """ZeRO (Rajbhandari et al. 2020, section 3.1): 2Ψ + 2Ψ + 12Ψ = 16Ψ bytes."""
    with minipar.device() as ctx:
        led = ctx.ledger
        params = make_params(BF16)
        opt = MixedPrecisionOptimizer(AdamW, params, dtype="bfloat16", lr=1e-2,
                                      weight_decay=0.1)
        assert led.held("parameters") == 2 * PSI == 66
        assert led.held("optimizer_states") == 4 * PSI == 132   # masters, made eagerly
        give_grads(params, seed=1)
        assert led.held("gradients") == 2 * PSI == 66
        assert opt.step() is True

        assert led.held("parameters") == 2 * PSI == 66          # bf16 p.data
        assert led.held("gradients") == 2 * PSI == 66           # bf16 p.grad
        assert led.held("optimizer_states") == 12 * PSI == 396  # master 4Ψ + m 4Ψ + v 4Ψ
        assert led.held() == 16 * PSI == 528
        # while stepping, one float32 gradient copy at a time was held too: the largest is
        # w1's 24 elements, so the peak is 2Ψ + 4·24 (not the 6Ψ = 198 of copying all at once)
        assert led.peak("gradients") == 2 * PSI + 4 * 24 == 162
        assert not any(a.name.endswith(".grad32") for a in led.live())
        kinds = sorted(a.name.rsplit(".", 1)[1] for a in led.live()
                       if a.category == "optimizer_states")
        assert kinds == ["m"] * 3 + ["master"] * 3 + ["v"] * 3
        assert "optim:w1.master" in {a.name for a in led.live()}
        # the ledger agrees with the arrays actually held
        held_arrays = (sum(m.data.nbytes for m in opt.masters.values())
                       + opt.inner.state_nbytes())
        assert led.held("optimizer_states") == held_arrays
        assert led.held("parameters") == sum(p.data.nbytes for p in params)

        opt.zero_grad()
        assert led.held("gradients") == 0
        opt.release()
        assert led.held("optimizer_states") == 0


def test_masters_stay_float32_and_params_are_their_rounding():
    with minipar.device():
        params = make_params(BF16)
        opt = MixedPrecisionOptimizer(AdamW, params, dtype="bfloat16", lr=1e-3)
        for s in range(3):
            give_grads(params, seed=s)
            opt.step()
            opt.zero_grad()
        for p in params:
            master = opt.masters[p.name]
            assert master.data.dtype == np.float32
            assert p.data.dtype == BF16
            assert_array_equal(bits(p.data), bits(master.data.astype(BF16)))
        # the masters hold information the bf16 copies cannot: they differ from them
        diffs = [np.abs(opt.masters[p.name].data - p.data.astype(np.float32)).max()
                 for p in params]
        assert max(diffs) > 0
        assert all(s["m"].dtype == np.float32 for s in opt.inner.state.values())


CURV = np.array([1.0, 10.0, 100.0], dtype=np.float32)
TARGET = np.array([1.5, -2.0, 0.25], dtype=np.float32)   # exactly representable in bf16


def quadratic_grad(p):
    """f = ½ Σ a_i (w_i − t_i)², evaluated on the 16-bit weights in float32."""
    return CURV * (p.data.astype(np.float32) - TARGET)


def test_bf16_training_of_a_quadratic_converges():
    with minipar.device():
        w = Parameter("w", np.zeros(3, dtype=BF16))
        opt = MixedPrecisionOptimizer(AdamW, [w], dtype="bfloat16", lr=0.0, weight_decay=0.0)
        sched = WarmupCosine(opt, max_lr=0.05, warmup_steps=10, total_steps=300)
        for _ in range(300):
            w.accumulate(quadratic_grad(w))
            assert opt.step()
            opt.zero_grad()
            sched.step()
        assert_allclose(w.data.astype(np.float32), TARGET, atol=1e-2)
        assert_allclose(opt.masters["w"].data, TARGET, atol=1e-2)
        assert opt.steps_taken == 300 and opt.steps_skipped == 0


def test_without_master_weights_small_updates_are_lost():
    """Near 1.0 a bf16 ulp is 2^-7; Adam's step of lr = 1e-3 is below half of it, so a bf16
    weight updated in place never moves, while the float32 master accumulates."""
    with minipar.device():
        pure = Parameter("pure", np.ones(4, dtype=BF16))
        mixed = Parameter("mixed", np.ones(4, dtype=BF16))
        o_pure = AdamW([pure], lr=1e-3, weight_decay=0.0)
        o_mixed = MixedPrecisionOptimizer(AdamW, [mixed], dtype="bfloat16", lr=1e-3,
                                          weight_decay=0.0)
        for _ in range(100):
            for p, o in ((pure, o_pure), (mixed, o_mixed)):
                p.accumulate(np.ones(4, dtype=np.float32))
                o.step()
                o.zero_grad()
        assert_array_equal(pure.data.astype(np.float32), 1.0)            # stuck
        assert_allclose(o_mixed.masters["mixed"].data, 0.9, atol=1e-4)   # 100 × 1e-3
        assert_allclose(mixed.data.astype(np.float32), 0.9, atol=2 ** -8)


def test_float32_parameters_are_stepped_directly():
    with minipar.device() as ctx:
        w = Parameter("w", np.zeros(8, dtype=BF16))
        gain = Parameter("ln.gain", np.ones(2, dtype=np.float32))
        opt = MixedPrecisionOptimizer(AdamW, [w, gain], dtype="bfloat16", lr=0.1)
        assert set(opt.masters) == {"w"}
        for p in (w, gain):
            p.accumulate(np.ones(p.shape, dtype=np.float32))
        opt.step()
        assert gain.data.dtype == np.float32 and gain.data[0] < 1.0
        assert ctx.ledger.held("optimizer_states") == 12 * 8 + 8 * 2


def test_wrong_dtype_is_refused_before_anything_is_charged():
    with minipar.device() as ctx:
        w = Parameter("w", np.zeros(4, dtype=BF16))
        h = Parameter("h", np.zeros(4, dtype=np.float16))
        with pytest.raises(TypeError, match="float16"):
            MixedPrecisionOptimizer(AdamW, [w, h], dtype="bfloat16")
        assert ctx.ledger.held("optimizer_states") == 0
        with pytest.raises(ValueError, match="bfloat16"):
            MixedPrecisionOptimizer(AdamW, [w], dtype="float32")


def test_clipping_sees_the_unscaled_gradient():
    """fp16 with loss scale 2^8: p.grad = 256·[3, 4]; the clip uses ‖[3, 4]‖ = 5."""
    from minipar.optim import DynamicLossScaler

    with minipar.device():
        w = Parameter("w", np.zeros(2, dtype=np.float16))
        opt = MixedPrecisionOptimizer(SGD, [w], dtype="float16", lr=1.0, max_grad_norm=1.0,
                                      loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8))
        w.accumulate(opt.loss_scale * np.array([3.0, 4.0], dtype=np.float32))
        assert opt.step()
        assert opt.last_grad_norm == pytest.approx(5.0, rel=1e-12)
        assert_allclose(opt.masters["w"].data, [-0.6, -0.8], rtol=1e-6)
