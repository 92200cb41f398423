"""Mixed precision in minipar.nn: what bf16/fp16 inputs compute in and return, and the
activation bytes of an MLP sub-block against Korthikanti et al. 2022, to the byte.

Tolerances are stated against a float64 reference: one rounding to bf16 is a relative
error of at most 2^-8 (8 significant bits), to fp16 at most 2^-11 (11 bits).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minipar as mp
from minipar.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward
from minipar.nn.dropout import dropout_backward, dropout_forward
from minipar.nn.embedding import embedding_backward, embedding_forward
from minipar.nn.gelu import gelu_backward, gelu_forward
from minipar.nn.layernorm import layernorm_backward, layernorm_forward
from minipar.nn.linear import linear_backward, linear_forward
from minipar.nn.matmul import matmul
from minipar.nn.softmax import softmax_backward, softmax_forward

BF16 = np.dtype(ml_dtypes.bfloat16)
dim = st.integers(1, 5)
seeds = st.integers(0, 2**32 - 1)


def randn(seed, *shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@given(m=dim, k=st.integers(1, 64), n=dim, dtype=st.sampled_from([BF16, np.float16]),
       seed=seeds)
def test_low_precision_matmul_is_fp32_accumulation_rounded_once(m, k, n, dtype, seed):
    a, b = randn(seed, 2, m, k, dtype=dtype), randn(seed + 1, k, n, dtype=dtype)
    with mp.device() as ctx:
        c = matmul(a, b)
        assert c.dtype == dtype
        expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(c.astype(np.float32), expected.astype(np.float32))
        (event,) = ctx.trace.of("compute", "matmul")
        assert event.flops == 2 * 2 * m * n * k
        peak = ctx.device.peak(np.dtype(dtype).name)  # charged at the 16-bit rate
        assert ctx.clock.now == pytest.approx(event.flops / peak)


def test_bf16_matmul_differs_from_bf16_accumulation():
    """Rounding after every addition (what fp32 accumulation avoids) loses the small terms."""
    a = np.ones((1, 512), BF16)
    b = np.full((512, 1), 1.0, BF16)
    b[0, 0] = 256.0  # 256 + 511 ones
    with mp.device():
        c = matmul(a, b)
    assert float(c[0, 0]) == 768.0  # 767 rounded once to bf16 (spacing 4 above 512)
    naive = BF16.type(0.0)
    for v in b[:, 0]:
        naive = BF16.type(naive + v)
    assert float(naive) == 256.0  # stalls at 256: each +1 rounds away (spacing 2 there)


def test_float32_stays_float32_and_float64_stays_float64():
    with mp.device():
        for dtype in (np.float32, np.float64):
            x = randn(0, 2, 3, 4, dtype=dtype)
            assert matmul(x, randn(1, 4, 2, dtype=dtype)).dtype == dtype
            assert layernorm_forward(x, np.ones(4, dtype), np.zeros(4, dtype))[0].dtype == dtype
            assert softmax_forward(x)[0].dtype == dtype
            assert gelu_forward(x)[0].dtype == dtype


@pytest.mark.parametrize("dtype, unit", [(BF16, 2.0**-8), (np.float16, 2.0**-11)])
def test_16bit_layernorm_softmax_gelu_compute_in_fp32_and_return_the_input_dtype(dtype, unit):
    x64 = randn(0, 3, 2, 8) * 3
    x = x64.astype(dtype)
    xr = x.astype(np.float64)  # the 16-bit input, exactly
    gamma, beta = np.ones(8, dtype), np.zeros(8, dtype)
    with mp.device() as ctx:
        y_ln, s_ln = layernorm_forward(x, gamma, beta)
        y_sm, s_sm = softmax_forward(x)
        y_ge, s_ge = gelu_forward(x, "none")
        for y in (y_ln, y_sm, y_ge):
            assert y.dtype == dtype
        ref_ln = (xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)
        ref_sm = np.exp(xr) / np.exp(xr).sum(-1, keepdims=True)
        ref_ge = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(xr)
        # one final rounding (relative error <= unit) plus float32 noise
        for y, ref in ((y_ln, ref_ln), (y_sm, ref_sm), (y_ge, ref_ge)):
            np.testing.assert_allclose(y.astype(np.float64), ref, rtol=unit + 1e-6,
                                       atol=1e-6)
        assert s_sm.y.dtype == dtype and s_sm.nbytes() == y_sm.nbytes  # saved in input dtype
        dy = np.ones_like(x)
        assert layernorm_backward(dy, s_ln, gamma)[0].dtype == dtype
        assert softmax_backward(dy, s_sm).dtype == dtype
        assert gelu_backward(dy, s_ge).dtype == dtype
        assert ctx.ledger.held("activations") == 0


def test_bf16_linear_gradients_are_bf16():
    x, w, b = randn(0, 2, 3, 4, dtype=BF16), randn(1, 5, 4, dtype=BF16), randn(2, 5, dtype=BF16)
    with mp.device():
        y, saved = linear_forward(x, w, b)
        assert y.dtype == BF16
        dx, dw, db = linear_backward(np.ones_like(y), saved, w, True)
    assert dx.dtype == dw.dtype == db.dtype == BF16
    np.testing.assert_array_equal(db.astype(np.float32), np.full(5, 6.0))


def test_bf16_embedding_gradient_accumulates_in_fp32():
    ids = np.zeros((300, 1), np.int64)  # one token id, 300 times
    with mp.device():
        y, saved = embedding_forward(ids, np.zeros((2, 1), BF16))
        dtable = embedding_backward(np.ones((300, 1, 1), BF16), saved, 2)
    assert dtable.dtype == BF16
    assert float(dtable[0, 0]) == 300.0  # bf16 accumulation would stall at 256


def test_cross_entropy_dtypes():
    targets = np.array([[0, 2]])
    with mp.device():
        loss, saved = cross_entropy_forward(randn(0, 1, 2, 3, dtype=BF16), targets)
        assert isinstance(loss, np.float32)
        # bf16 logits (2 bytes) + float32 lse (4 bytes a token) + int64 targets
        assert saved.nbytes() == 2 * 3 * 2 + 2 * 4 + 2 * 8
        assert cross_entropy_backward(1.0, saved).dtype == BF16
        loss32, saved = cross_entropy_forward(randn(0, 1, 2, 3, dtype=np.float32), targets)
        assert isinstance(loss32, np.float32) and abs(loss32 - loss) < 0.05
        assert cross_entropy_backward(1.0, saved).dtype == np.float32


def test_bf16_dropout_returns_bf16():
    x = randn(0, 4, 4, dtype=BF16)
    with mp.device():
        y, saved = dropout_forward(x, 0.5, np.random.default_rng(0))
        assert y.dtype == BF16 and saved.nbytes() == x.size
        assert dropout_backward(np.ones_like(x), saved).dtype == BF16


def test_mlp_sub_block_activations_match_korthikanti_to_the_byte():
    """Korthikanti et al. 2022, section 4.1, in 16-bit precision (2 bytes an element):
    LayerNorm input 2sbh + first linear input 2sbh + GeLU input 8sbh + second linear input
    8sbh + dropout mask sbh = 21sbh (the MLP's 19sbh plus its LayerNorm's 2sbh)."""
    s, b, h = 4, 3, 8
    x = randn(0, s, b, h, dtype=BF16)
    w1 = (randn(1, 4 * h, h) * 0.1).astype(BF16)  # (bf16 * float gives float32: cast last)
    w2 = (randn(2, h, 4 * h) * 0.1).astype(BF16)
    gamma, beta = np.ones(h, BF16), np.zeros(h, BF16)
    with mp.device() as ctx:
        u, s_ln = layernorm_forward(x, gamma, beta)
        v, s_fc1 = linear_forward(u, w1)  # v: [s, b, 4h]
        g, s_gelu = gelu_forward(v)
        o, s_fc2 = linear_forward(g, w2)  # o: [s, b, h]
        _, s_drop = dropout_forward(o, 0.1, np.random.default_rng(0))
        assert ctx.ledger.held("activations") == 21 * s * b * h
        dy = np.ones_like(o)
        dg, _, _ = linear_backward(dropout_backward(dy, s_drop), s_fc2, w2, False)
        du, _, _ = linear_backward(gelu_backward(dg, s_gelu), s_fc1, w1, False)
        layernorm_backward(du, s_ln, gamma)
        assert ctx.ledger.held("activations") == 0
        assert ctx.ledger.peak("activations") == 21 * s * b * h
        # two linears, forward 2·sbh·4h each, backward twice that: 3 · 2 · 2 · 4sbh²
        assert sum(e.flops for e in ctx.trace.of("compute", "matmul")) == 48 * s * b * h * h
