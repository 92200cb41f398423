"""The compute model the clock charges: GEMM time 2MNK / (eff(M, N, K) · peak) with
eff = e_max · g(M) g(N) g(K), g(x) = x / (x + x_half), and elementwise work bytes / W.

The efficiency is the planner's (plan/gemm.py), moved into the runtime unchanged: the same
numbers for every shape. Under the peak model (the default of launch and mp.device) the
clock is what it always was: every matmul at peak, nothing else recorded.
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.nn.matmul import matmul
from minipar.runtime.compute_model import (A100_E_MAX, CALIBRATED_GEMM, PEAK, TILE,
                                           ComputeModel, GemmEfficiency)
from minipar.runtime.device import DeviceSpec
from minipar.runtime.topology import Topology

TOY = DeviceSpec("toy", {"float64": 1e12, "bfloat16": 4e12}, 10**12, memory_bandwidth=1e9)
CAL = ComputeModel.calibrated(TOY)
dim = st.integers(1, 4096)


def exactly(x):
    return pytest.approx(x, rel=1e-12, abs=1e-30)


# ---- the efficiency -------------------------------------------------------------------
def test_g_is_one_half_at_x_half_and_the_table_of_the_docstring():
    g = CALIBRATED_GEMM.g
    assert g(128) == 0.5 and TILE == 128
    assert [round(g(x), 2) for x in (128, 256, 768, 1536, 2048, 6144, 12288)] == \
        [0.50, 0.67, 0.86, 0.92, 0.94, 0.98, 0.99]
    assert CALIBRATED_GEMM(128, 128, 128) == pytest.approx(A100_E_MAX / 8, rel=1e-15)


@given(dim, dim, dim)
def test_the_efficiency_is_symmetric_and_below_e_max(M, N, K):
    e = CALIBRATED_GEMM(M, N, K)
    for perm in ((M, K, N), (N, M, K), (N, K, M), (K, M, N), (K, N, M)):
        assert CALIBRATED_GEMM(*perm) == pytest.approx(e, rel=1e-15)
    assert 0 < e < A100_E_MAX


@given(dim, dim, dim, st.integers(1, 4096))
def test_the_efficiency_never_falls_when_a_dimension_grows(M, N, K, grow):
    e = CALIBRATED_GEMM(M, N, K)
    assert CALIBRATED_GEMM(M + grow, N, K) >= e
    assert CALIBRATED_GEMM(M, N + grow, K) >= e
    assert CALIBRATED_GEMM(M, N, K + grow) >= e


@given(dim, dim, dim)
def test_the_runtime_efficiency_is_the_planners(M, N, K):
    """Moved, not changed: plan/gemm.py's A100_MEGATRON gives the same numbers."""
    from minipar.plan.gemm import A100_MEGATRON
    assert (A100_MEGATRON.e_max, A100_MEGATRON.x_half) == (A100_E_MAX, TILE)
    assert CALIBRATED_GEMM(M, N, K) == A100_MEGATRON(M, N, K)
    assert CALIBRATED_GEMM.seconds(M, N, K, 989e12, 3) == A100_MEGATRON.seconds(M, N, K,
                                                                                 989e12, 3)


def test_seconds_with_e_max_and_refusals():
    gemm = GemmEfficiency(0.5, 64)
    assert gemm.seconds(64, 64, 64, 1e12, count=2) == exactly(2 * 2 * 64**3 / (0.5 / 8 * 1e12))
    assert gemm.with_e_max(0.25)(64, 64, 64) == 0.25 / 8
    with pytest.raises(ValueError, match=r"e_max is a fraction of peak in \(0, 1\], got 1.5"):
        GemmEfficiency(1.5)
    with pytest.raises(ValueError, match="x_half is a size >= 0, got -1"):
        GemmEfficiency(0.5, -1)
    with pytest.raises(ValueError, match="dimensions are positive, got M=0, N=4, K=4"):
        gemm(0, 4, 4)


# ---- the model ------------------------------------------------------------------------
def test_peak_and_calibrated_models():
    assert ComputeModel.peak() is PEAK and PEAK == ComputeModel()
    assert PEAK.gemm is None and PEAK.memory_bandwidth is None and PEAK.is_peak
    assert PEAK.matmul_seconds(3e12, (8, 8, 8), 1e12) == 3.0  # flops / peak, any shape
    assert PEAK.elementwise_seconds(1e9) == 0.0
    h100 = ComputeModel.calibrated(DeviceSpec.h100_sxm())
    assert h100.gemm == CALIBRATED_GEMM and h100.memory_bandwidth == 3350e9
    assert h100.describe() == ("GEMM efficiency e_max 0.766 · g(M)g(N)g(K), g(x) = x/(x + 128), "
                               "elementwise over 3.35 TB/s HBM")
    assert PEAK.describe() == "every matmul at peak, elementwise free"
    assert CAL.elementwise_seconds(5e8) == 0.5
    assert CAL.matmul_seconds(0, (0, 4, 4), 1e12) == 0.0        # an empty product: no time
    assert CAL.matmul_seconds(1e12, None, 1e12) == exactly(1 / A100_E_MAX)  # no shape: e_max


def test_presets_carry_the_planners_memory_bandwidth():
    from minipar.plan.presets import CLUSTERS
    for key in ("a100", "h100", "h200"):
        c = CLUSTERS[key]
        assert DeviceSpec.preset(key).memory_bandwidth == c.memory_bandwidth
    assert DeviceSpec.h100_sxm().with_memory(10**9).memory_bandwidth == 3350e9


@pytest.mark.parametrize("make, error, match", [
    (lambda: ComputeModel.calibrated(DeviceSpec("bare", {"float64": 1e12}, 10**9)),
     ValueError, "'bare' has memory_bandwidth=None: give the DeviceSpec memory_bandwidth="),
    (lambda: ComputeModel(memory_bandwidth=0), ValueError,
     r"memory_bandwidth is the HBM bandwidth in bytes/s, a finite number > 0 .* got 0"),
    (lambda: ComputeModel(gemm=0.7), TypeError,
     "ComputeModel.gemm is a GemmEfficiency .* got float 0.7"),
    (lambda: CAL.matmul_seconds(1.0, (2, 3), 1e12), ValueError,
     r"dims are \(M, N, K\) of one GEMM, 3 numbers; got \(2, 3\)"),
    (lambda: DeviceSpec("x", {"float64": 1.0}, 10, memory_bandwidth=-1), ValueError,
     "memory_bandwidth .* must be a finite number > 0, got -1"),
    (lambda: mp.launch(lambda ctx: 0, 2, compute_model="fast"), ValueError,
     "unknown compute_model 'fast': expected 'peak'"),
    (lambda: mp.launch(lambda ctx: 0, 2, compute_model=1.0), TypeError,
     "compute_model must be a minipar ComputeModel .* got float 1.0"),
])
def test_refusals_say_what_was_expected_and_received(make, error, match):
    with pytest.raises(error, match=match):
        make()


# ---- on the clock -----------------------------------------------------------------------
SHAPES = [((64, 32), (32, 48)), ((3, 5, 7), (7, 2)), ((2, 4, 16, 8), (2, 4, 8, 16)),
          ((5,), (5, 3)), ((4, 5), (5,)), ((1, 200, 300), (300, 1))]


@pytest.mark.parametrize("a_shape, b_shape", SHAPES)
def test_a_matmul_takes_2mnk_over_eff_peak_per_matrix(a_shape, b_shape):
    a, b = np.ones(a_shape), np.ones(b_shape)
    M = a_shape[-2] if len(a_shape) > 1 else 1
    N = b_shape[-1] if len(b_shape) > 1 else 1
    K = a_shape[-1]
    count = np.matmul(a, b).size // (M * N)  # matrices in the broadcast batch
    with mp.device(TOY, compute_model=CAL) as ctx:
        matmul(a, b)
        (e,) = ctx.trace.events
    assert e.flops == 2 * M * N * K * count
    assert e.duration == exactly(2 * M * N * K * count / (CALIBRATED_GEMM(M, N, K) * 1e12))


@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_a_batched_matmul_is_count_gemms_at_one_matrixs_efficiency(batch, M, N, K):
    with mp.device(TOY, compute_model=CAL) as ctx:
        matmul(np.ones((batch, M, K)), np.ones((batch, K, N)))
        matmul(np.ones((M, K), dtype=np.float64), np.ones((K, N)), flops=123.0)  # cp's skip
        e, given_flops = ctx.trace.events
    assert e.duration == exactly(CALIBRATED_GEMM.seconds(M, N, K, 1e12, batch))
    assert given_flops.flops == 123.0
    assert given_flops.duration == exactly(123.0 / (CALIBRATED_GEMM(M, N, K) * 1e12))


def test_memory_bound_work_is_charged_only_with_a_bandwidth():
    with mp.device(TOY) as ctx:                      # the default: the peak model
        assert ctx.compute_model is PEAK
        assert ctx.memory_bound(10**9, "layernorm") is None
        assert ctx.trace.events == [] and ctx.clock.now == 0.0
    with mp.device(TOY, compute_model="calibrated") as ctx:
        assert ctx.compute_model == CAL
        e = ctx.memory_bound(10**9, "layernorm", label="ln1")
        assert (e.stream, e.name, e.label, e.meta, e.flops) == ("compute", "layernorm", "ln1",
                                                                {"bytes": 10**9}, 0.0)
        assert (e.start, e.end) == (0.0, 1.0) and ctx.clock.now == 1.0


def test_launch_gives_every_rank_the_model():
    res = mp.launch(lambda ctx: ctx.compute_model, 3, Topology.nodes(1, 3, TOY),
                    compute_model="calibrated")
    assert list(res) == [CAL] * 3
    res = mp.launch(lambda ctx: ctx.compute_model, 2, compute_model=CAL)
    assert list(res) == [CAL] * 2
    assert list(mp.launch(lambda ctx: ctx.compute_model, 2)) == [PEAK] * 2


def test_under_the_peak_model_a_gpt_step_is_matmuls_at_peak_as_before():
    """The trace of a GPT step on the default clock: matmul events only, back to back,
    each flops / peak, accumulated exactly as the clock always did."""
    from minipar.nn import GPT, GPTConfig
    from minipar.optim import AdamW
    cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=8, num_heads=2, num_layers=2,
                    dropout=0.1)
    ids = np.random.default_rng(0).integers(0, 16, (8, 3))
    for model in (None, "peak", PEAK):
        with mp.device(TOY, compute_model=model) as ctx:
            net = GPT(cfg)
            opt = AdamW(net.parameters())
            net.loss_and_grad(ids, ids)
            opt.step()
            t = 0.0
            for e in ctx.trace.events:
                assert (e.stream, e.name, e.meta) == ("compute", "matmul", {})
                assert e.start == t
                t = t + e.flops / 1e12
                assert e.end == t
            assert ctx.clock.now == t and len(ctx.trace.events) == 2 * 3 * 6 + 3
