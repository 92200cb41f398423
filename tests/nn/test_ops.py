"""The single-device ops of minipar.nn, each against a plain NumPy formula and finite
differences (float64), with its saved bytes, its ledger and its FLOPs checked.

Every gradient test projects the op's output to a scalar with a fixed random r,
f = sum(y * r), so the backward is fed dy = r.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minipar as mp
from minipar.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward
from minipar.nn.dropout import dropout_backward, dropout_forward
from minipar.nn.embedding import Embedding, embedding_backward, embedding_forward
from minipar.nn.gelu import erf, gelu_backward, gelu_forward
from minipar.nn.gradcheck import gradcheck
from minipar.nn.layernorm import LayerNorm, layernorm_backward, layernorm_forward
from minipar.nn.linear import Linear, linear_backward, linear_forward
from minipar.nn.matmul import matmul
from minipar.nn.parameter import init_normal
from minipar.nn.softmax import softmax_backward, softmax_forward

dim = st.integers(1, 5)
seeds = st.integers(0, 2**32 - 1)


def randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def matmul_flops(ctx):
    return sum(e.flops for e in ctx.trace.of("compute", "matmul"))


def activations(ctx):
    return ctx.ledger.held("activations")


# ---- matmul ------------------------------------------------------------------------

@given(batch=st.lists(dim, max_size=2), m=dim, k=dim, n=dim, broadcast=st.booleans(),
       seed=seeds)
def test_matmul_equals_numpy_and_charges_2mnk_per_matrix(batch, m, k, n, broadcast, seed):
    a = randn(seed, *batch, m, k)
    b = randn(seed + 1, k, n) if broadcast else randn(seed + 1, *batch, k, n)
    with mp.device() as ctx:
        c = matmul(a, b, label="probe")
        np.testing.assert_array_equal(c, a @ b)  # float64 stays float64, same kernel
        assert c.dtype == np.float64
        expected = 2 * m * n * k * math.prod(batch)
        assert matmul_flops(ctx) == expected
        (event,) = ctx.trace.of("compute", "matmul")
        assert event.label == "probe"
        assert ctx.clock.now == pytest.approx(expected / ctx.device.peak("float64"))


def test_matmul_vector_operands_count_like_np_matmul():
    with mp.device() as ctx:
        c = matmul(np.ones(4), np.ones((4, 3)))  # [k] @ [k, n]: m = 1
        assert c.shape == (3,) and matmul_flops(ctx) == 2 * 1 * 3 * 4


# ---- linear ------------------------------------------------------------------------

@given(s=dim, b=dim, i=dim, o=dim, bias=st.booleans(), seed=seeds)
def test_linear_forward_backward(s, b, i, o, bias, seed):
    x, w, r = randn(seed, s, b, i), randn(seed + 1, o, i), randn(seed + 2, s, b, o)
    bb = randn(seed + 3, o) if bias else None
    with mp.device() as ctx:
        y, saved = linear_forward(x, w, bb, label="fc")
        np.testing.assert_allclose(y, x @ w.T + (bb if bias else 0), rtol=1e-13, atol=1e-13)
        assert y.shape == (s, b, o)
        assert saved.nbytes() == x.nbytes == activations(ctx)  # x only, never w
        assert matmul_flops(ctx) == 2 * s * b * i * o
        dx, dw, db = linear_backward(r, saved, w, bias)
        assert activations(ctx) == 0 and saved.released
        assert matmul_flops(ctx) == 3 * 2 * s * b * i * o  # forward + dgrad + wgrad
        assert [e.label for e in ctx.trace.events] == ["fc", "fc.dgrad", "fc.wgrad"]
    assert dx.shape == x.shape and dw.shape == w.shape and (db is None) == (not bias)

    def f(x, w, bb=None):
        return np.sum(linear_forward(x, w, bb)[0] * r)

    inputs, grads = {"x": x, "w": w}, {"x": dx, "w": dw}
    if bias:
        inputs["bb"], grads["bb"] = bb, db
    gradcheck(f, inputs, grads)


def test_linear_module_initialises_from_name_and_accumulates():
    with mp.device() as ctx:
        lin = Linear("blk.fc1", 3, 4, seed=7)
        np.testing.assert_array_equal(lin.weight.data,
                                      init_normal("blk.fc1.weight", (4, 3), 0.02, 7))
        np.testing.assert_array_equal(lin.bias.data, np.zeros(4))
        assert [p.name for p in lin.parameters()] == ["blk.fc1.weight", "blk.fc1.bias"]
        assert ctx.ledger.held("parameters") == (12 + 4) * 8
        x, dy = randn(0, 2, 2, 3), randn(1, 2, 2, 4)
        for _ in range(2):  # two micro-batches: gradients add up
            y, saved = lin.forward(x)
            dx = lin.backward(dy, saved)
        np.testing.assert_allclose(lin.weight.grad, 2 * np.einsum("sbo,sbi->oi", dy, x))
        np.testing.assert_allclose(lin.bias.grad, 2 * dy.sum(axis=(0, 1)))
        np.testing.assert_allclose(dx, dy @ lin.weight.data)
        assert activations(ctx) == 0 and ctx.ledger.held("gradients") == (12 + 4) * 8
        assert Linear("nb", 3, 4, bias=False).parameters()[0].name == "nb.weight"


# ---- embedding ---------------------------------------------------------------------

@given(s=dim, b=dim, V=dim, h=dim, seed=seeds)
def test_embedding_forward_backward(s, b, V, h, seed):
    ids = np.random.default_rng(seed).integers(0, V, size=(s, b))
    table, r = randn(seed + 1, V, h), randn(seed + 2, s, b, h)
    with mp.device() as ctx:
        y, saved = embedding_forward(ids, table)
        np.testing.assert_array_equal(y, np.stack([[table[ids[i, j]] for j in range(b)]
                                                   for i in range(s)]))
        assert y.shape == (s, b, h)
        assert saved.nbytes() == ids.nbytes == activations(ctx)
        dtable = embedding_backward(r, saved, V)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []  # a gather: no FLOPs
    onehot = np.eye(V)[ids]  # [s, b, V]: y = onehot @ table
    np.testing.assert_allclose(dtable, np.einsum("sbv,sbh->vh", onehot, r), atol=1e-13)
    gradcheck(lambda table: np.sum(embedding_forward(ids, table)[0] * r),
              {"table": table}, {"table": dtable})


def test_embedding_module_and_bad_ids():
    with mp.device():
        emb = Embedding("wte", 5, 3, seed=1)
        np.testing.assert_array_equal(emb.weight.data, init_normal("wte.weight", (5, 3), 0.02, 1))
        ids = np.array([[0, 4], [4, 4]])
        y, saved = emb.forward(ids)
        emb.backward(np.ones((2, 2, 3)), saved)
        np.testing.assert_array_equal(emb.weight.grad[:, 0], [1, 0, 0, 0, 3])
        with pytest.raises(IndexError, match=r"\[0, 5\)"):
            emb.forward(np.array([[5]]))
        with pytest.raises(IndexError):
            emb.forward(np.array([[-1]]))


# ---- layernorm ---------------------------------------------------------------------

@given(s=dim, b=dim, h=dim, seed=seeds)
def test_layernorm_forward_backward(s, b, h, seed):
    x, r = randn(seed, s, b, h) * 2 + 0.5, randn(seed + 1, s, b, h)
    gamma, beta = 1 + 0.3 * randn(seed + 2, h), randn(seed + 3, h)
    with mp.device() as ctx:
        y, saved = layernorm_forward(x, gamma, beta)
        ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(y, ref * gamma + beta, rtol=1e-12, atol=1e-12)
        assert saved.nbytes() == x.nbytes == activations(ctx)  # exactly its input
        dx, dgamma, dbeta = layernorm_backward(r, saved, gamma)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []
    gradcheck(lambda x, gamma, beta: np.sum(layernorm_forward(x, gamma, beta)[0] * r),
              {"x": x, "gamma": gamma, "beta": beta},
              {"x": dx, "gamma": dgamma, "beta": dbeta})


def test_layernorm_module():
    with mp.device() as ctx:
        ln = LayerNorm("ln_1", 4, eps=1e-5)
        assert ln.gamma is ln.weight and ln.beta is ln.bias
        np.testing.assert_array_equal(ln.weight.data, np.ones(4))
        np.testing.assert_array_equal(ln.bias.data, np.zeros(4))
        x, dy = randn(0, 2, 3, 4), randn(1, 2, 3, 4)
        y, saved = ln.forward(x)
        dx = ln.backward(dy, saved)
        np.testing.assert_allclose(ln.bias.grad, dy.sum(axis=(0, 1)))
        np.testing.assert_allclose(dx.sum(-1), 0, atol=1e-12)  # normalisation kills shifts
        assert activations(ctx) == 0 and len(ln.parameters()) == 2


# ---- gelu --------------------------------------------------------------------------

def gelu_reference(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)


@given(s=dim, b=dim, h=dim, approximate=st.sampled_from(["tanh", "none"]), seed=seeds)
def test_gelu_forward_backward(s, b, h, approximate, seed):
    x, r = randn(seed, s, b, h) * 2, randn(seed + 1, s, b, h)
    with mp.device() as ctx:
        y, saved = gelu_forward(x, approximate)
        np.testing.assert_allclose(y, gelu_reference(x, approximate), rtol=1e-14, atol=1e-15)
        assert saved.nbytes() == x.nbytes == activations(ctx)
        dx = gelu_backward(r, saved)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []
    gradcheck(lambda x: np.sum(gelu_forward(x, approximate)[0] * r), {"x": x}, {"x": dx})


def test_erf_is_accurate_to_1e15():
    """Tabulated values (Abramowitz & Stegun 7.1), symmetry, and mpmath if present."""
    table = {0.0: 0.0, 0.5: 0.5204998778130465, 1.0: 0.8427007929497149,
             2.0: 0.9953222650189527, 3.0: 0.9999779095030014}
    xs = np.array(list(table))
    np.testing.assert_allclose(erf(xs), list(table.values()), rtol=1e-15, atol=1e-16)
    np.testing.assert_array_equal(erf(-xs), -erf(xs))
    mpmath = pytest.importorskip("mpmath")
    grid = np.linspace(-6, 6, 241)
    exact = np.array([float(mpmath.erf(mpmath.mpf(float(v)))) for v in grid])
    np.testing.assert_allclose(erf(grid), exact, rtol=1e-15, atol=1e-16)
    assert erf(np.zeros((2, 3))).shape == (2, 3)


def test_gelu_rejects_unknown_form():
    with pytest.raises(ValueError, match="tanh"):
        gelu_forward(np.ones(2), approximate="exact")


# ---- softmax -----------------------------------------------------------------------

@given(shape=st.lists(dim, min_size=1, max_size=3), axis_pick=st.integers(0, 2), seed=seeds)
def test_softmax_forward_backward(shape, axis_pick, seed):
    axis = axis_pick % len(shape)
    x, r = randn(seed, *shape) * 3, randn(seed + 1, *shape)
    with mp.device() as ctx:
        y, saved = softmax_forward(x, axis=axis)
        e = np.exp(x)
        np.testing.assert_allclose(y, e / e.sum(axis, keepdims=True), rtol=1e-13)
        assert saved.nbytes() == y.nbytes == activations(ctx)  # the output, not the input
        dx = softmax_backward(r, saved)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []
    gradcheck(lambda x: np.sum(softmax_forward(x, axis=axis)[0] * r), {"x": x}, {"x": dx})


def test_softmax_is_stable_and_masks_minus_infinity():
    x = np.array([[1000.0, 1001.0, -np.inf], [-1000.0, -1000.0, -np.inf]])
    with mp.device():
        y, saved = softmax_forward(x)
        softmax_backward(np.ones_like(y), saved)
    e = math.exp(-1.0)
    np.testing.assert_allclose(y, [[e / (1 + e), 1 / (1 + e), 0], [0.5, 0.5, 0]])


# ---- dropout -----------------------------------------------------------------------

@given(s=dim, b=dim, h=dim, p=st.sampled_from([0.1, 0.5, 0.9]), seed=seeds)
def test_dropout_forward_backward(s, b, h, p, seed):
    x, r = randn(seed, s, b, h), randn(seed + 1, s, b, h)
    state = np.random.default_rng(seed).bit_generator.state
    with mp.device() as ctx:
        rng = np.random.default_rng(seed)
        y, saved = dropout_forward(x, p, rng)
        mask = np.random.default_rng(seed).random(x.shape) >= p  # the documented draw
        np.testing.assert_array_equal(saved.mask, mask)
        assert saved.mask.dtype == np.bool_
        np.testing.assert_array_equal(y, x * mask / (1 - p))
        assert saved.nbytes() == x.size == activations(ctx)  # 1 byte per element
        dx = dropout_backward(r, saved)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []
    np.testing.assert_array_equal(dx, r * mask / (1 - p))

    def f(x):
        gen = np.random.default_rng(0)
        gen.bit_generator.state = state  # the same state: the same mask
        return np.sum(dropout_forward(x, p, gen)[0] * r)

    gradcheck(f, {"x": x}, {"x": dx})


def test_dropout_mask_is_reproducible_from_generator_state():
    rng = np.random.default_rng(123)
    rng.random(7)  # some earlier use of the generator
    state = rng.bit_generator.state
    x = np.ones((4, 3, 8))
    with mp.device():
        y1, s1 = dropout_forward(x, 0.3, rng)
        y_next, s_next = dropout_forward(x, 0.3, rng)  # the generator has moved on
        replay = np.random.default_rng(0)
        replay.bit_generator.state = state  # recomputation: restore, run again
        y2, s2 = dropout_forward(x, 0.3, replay)
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(s1.mask, s2.mask)
        assert not np.array_equal(s1.mask, s_next.mask)
        for s in (s1, s2, s_next):
            s.release()


def test_dropout_scaling_keeps_the_expectation():
    x = np.full((200, 50, 10), 2.0)
    with mp.device():
        y, saved = dropout_forward(x, 0.25, np.random.default_rng(0))
        saved.release()
    kept = y != 0
    np.testing.assert_array_equal(y[kept], 2.0 / 0.75)  # survivors are scaled by 1/(1-p)
    assert abs(kept.mean() - 0.75) < 0.005  # about 1-p survive (100k draws: sd 0.0014)
    assert abs(y.mean() - 2.0) < 0.015  # so E[y] = x


def test_dropout_p0_is_the_identity_and_saves_nothing():
    x = randn(0, 2, 3, 4)
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    with mp.device() as ctx:
        y, saved = dropout_forward(x, 0.0, rng)
        assert y is x and saved.nbytes() == 0 and activations(ctx) == 0
        dy = randn(1, 2, 3, 4)
        assert dropout_backward(dy, saved) is dy
    assert rng.bit_generator.state == before  # no draws
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        dropout_forward(x, 1.0, rng)


# ---- cross-entropy -----------------------------------------------------------------

@given(s=dim, b=dim, V=dim, frac_ignored=st.sampled_from([0.0, 0.3, 1.0]), seed=seeds)
def test_cross_entropy_forward_backward(s, b, V, frac_ignored, seed):
    g = np.random.default_rng(seed)
    logits = g.standard_normal((s, b, V)) * 2
    targets = g.integers(0, V, size=(s, b))
    targets[g.random((s, b)) < frac_ignored] = -100
    with mp.device() as ctx:
        loss, saved = cross_entropy_forward(logits, targets)
        assert isinstance(loss, np.float64)
        counted = targets != -100
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        picked = np.array([-logp[i, j, targets[i, j]] for i in range(s) for j in range(b)
                           if counted[i, j]])
        assert loss == pytest.approx(picked.mean() if picked.size else 0.0, rel=1e-13, abs=1e-14)
        # documented: logits + lse (one float per token) + targets
        assert saved.nbytes() == logits.nbytes + s * b * 8 + targets.nbytes == activations(ctx)
        dlogits = cross_entropy_backward(1.0, saved)
        assert activations(ctx) == 0 and ctx.trace.of("compute") == []
    assert dlogits.dtype == np.float64 and dlogits.shape == logits.shape
    np.testing.assert_array_equal(dlogits[~counted], 0)  # ignored tokens get no gradient
    gradcheck(lambda logits: cross_entropy_forward(logits, targets)[0],
              {"logits": logits}, {"logits": dlogits})


def test_cross_entropy_ignore_index_and_dloss_scaling():
    logits = randn(0, 2, 2, 5)
    targets = np.array([[1, 7], [3, 0]])
    with mp.device():
        loss_all, s1 = cross_entropy_forward(logits, np.where(targets == 7, 4, targets))
        loss, s2 = cross_entropy_forward(logits, targets, ignore_index=7)
        d = cross_entropy_backward(3.0, s2)
        s1.release()
        lse = np.log(np.exp(logits).sum(-1))
        expected = np.mean([lse[0, 0] - logits[0, 0, 1], lse[1, 0] - logits[1, 0, 3],
                            lse[1, 1] - logits[1, 1, 0]])
        assert loss == pytest.approx(expected, rel=1e-14) and loss != loss_all
        soft = np.exp(logits - lse[..., None])
        np.testing.assert_allclose(d[1, 0], 3.0 * (soft[1, 0] - np.eye(5)[3]) / 3)
        np.testing.assert_array_equal(d[0, 1], 0)
        with pytest.raises(IndexError, match="ignore_index"):
            cross_entropy_forward(logits, np.array([[1, 5], [0, 0]]))
        with pytest.raises(ValueError, match="one per token"):
            cross_entropy_forward(logits, np.zeros((2,), int))


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[[1e4, 0.0, -1e4]]])
    with mp.device():
        loss, saved = cross_entropy_forward(logits, np.array([[1]]))
        d = cross_entropy_backward(1.0, saved)
    assert loss == pytest.approx(1e4) and np.isfinite(d).all()
