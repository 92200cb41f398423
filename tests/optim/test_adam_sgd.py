"""SGD, Adam and AdamW: hand-computed steps, decay semantics, the ledger, a loop reference."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, Adam, AdamW, WarmupCosine, no_decay_for


def param(name, values, dtype=np.float64):
    return Parameter(name, np.array(values, dtype=dtype))


def set_grad(p, values):
    p.free_grad()
    p.accumulate(np.array(values, dtype=p.data.dtype))


# ---- SGD by hand ----------------------------------------------------------------------

def test_sgd_plain_step():
    with minipar.device():
        w = param("w", [1.0, -2.0])
        opt = SGD([w], lr=0.1)
        set_grad(w, [0.5, 0.25])
        opt.step()
        assert_allclose(w.data, [1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25], rtol=0, atol=0)
        assert opt.state == {}  # plain SGD keeps nothing


def test_sgd_momentum_two_steps():
    with minipar.device():
        w = param("w", [0.0, 0.0])
        opt = SGD([w], lr=0.1, momentum=0.9)
        set_grad(w, [1.0, 2.0])
        opt.step()                         # b1 = g1 = [1, 2];  w = -0.1 * b1
        assert_allclose(w.data, [-0.1, -0.2], rtol=1e-15)
        set_grad(w, [0.5, -1.0])
        opt.step()                         # b2 = 0.9 * [1, 2] + [0.5, -1] = [1.4, 0.8]
        assert_allclose(opt.state["w"]["momentum"], [1.4, 0.8], rtol=1e-15)
        assert_allclose(w.data, [-0.1 - 0.1 * 1.4, -0.2 - 0.1 * 0.8], rtol=1e-15)


def test_sgd_nesterov_and_weight_decay():
    with minipar.device():
        w = param("w", [2.0])
        opt = SGD([w], lr=0.5, weight_decay=0.1)
        set_grad(w, [1.0])
        opt.step()                         # g = 1 + 0.1 * 2 = 1.2;  w = 2 - 0.5 * 1.2
        assert_allclose(w.data, [1.4], rtol=1e-15)

        v = param("v", [0.0])
        opt = SGD([v], lr=0.1, momentum=0.9, nesterov=True)
        set_grad(v, [1.0])
        opt.step()                         # b1 = 1;  step = g + 0.9 * b1 = 1.9
        assert_allclose(v.data, [-0.19], rtol=1e-15)


# ---- Adam by hand ---------------------------------------------------------------------

def test_adam_one_and_two_steps_by_hand():
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    g1 = np.array([0.1, -0.2])
    g2 = np.array([0.3, 0.1])
    with minipar.device():
        w = param("w", [1.0, -1.0])
        opt = Adam([w], lr=lr, betas=(b1, b2), eps=eps)

        set_grad(w, g1)
        opt.step()
        m1 = (1 - 0.9) * g1                       # [0.01, -0.02]
        v1 = (1 - 0.999) * g1 ** 2                # [1e-5, 4e-5]
        m1_hat = m1 / (1 - 0.9 ** 1)              # = g1: bias correction undoes the 0.1
        v1_hat = v1 / (1 - 0.999 ** 1)            # = g1**2
        w1 = np.array([1.0, -1.0]) - lr * m1_hat / (np.sqrt(v1_hat) + eps)
        assert_allclose(opt.state["w"]["m"], m1, rtol=1e-14)
        assert_allclose(opt.state["w"]["v"], v1, rtol=1e-14)
        assert_allclose(w.data, w1, rtol=1e-14)
        # the first Adam step moves every coordinate by ~lr, whatever the gradient's size
        assert_allclose(w.data, [0.99, -0.99], atol=1e-6)
        assert opt.state["w"]["step"] == 1

        set_grad(w, g2)
        opt.step()
        m2 = 0.9 * m1 + (1 - 0.9) * g2
        v2 = 0.999 * v1 + (1 - 0.999) * g2 ** 2
        m2_hat = m2 / (1 - 0.9 ** 2)              # 1 - 0.81 = 0.19
        v2_hat = v2 / (1 - 0.999 ** 2)            # 1 - 0.998001 = 0.001999
        w2 = w1 - lr * m2_hat / (np.sqrt(v2_hat) + eps)
        assert_allclose(opt.state["w"]["m"], m2, rtol=1e-14)
        assert_allclose(opt.state["w"]["v"], v2, rtol=1e-14)
        assert_allclose(w.data, w2, rtol=1e-14)
        assert opt.state["w"]["step"] == 2


def test_adamw_decay_is_decoupled_and_adam_decay_is_l2():
    """Zero gradient, wd = 0.1, lr = 0.01, w = 2:
    AdamW shrinks w by lr*wd*w = 0.002;  Adam feeds wd*w = 0.2 through the adaptive step,
    whose first step has size ~lr whatever the gradient, so w drops by ~0.01."""
    with minipar.device():
        a, b = param("a", [2.0]), param("b", [2.0])
        adam = Adam([a], lr=0.01, weight_decay=0.1)
        adamw = AdamW([b], lr=0.01, weight_decay=0.1)
        set_grad(a, [0.0])
        set_grad(b, [0.0])
        adam.step()
        adamw.step()
        g = 0.1 * 2.0                                          # L2 term in the gradient
        m_hat = (1 - 0.9) * g / (1 - 0.9)
        v_hat = (1 - 0.999) * g * g / (1 - 0.999)
        assert_allclose(a.data, [2.0 - 0.01 * m_hat / (math.sqrt(v_hat) + 1e-8)], rtol=1e-14)
        assert_allclose(a.data, [1.99], atol=1e-7)
        assert_allclose(b.data, [2.0 - 0.01 * 0.1 * 2.0], rtol=1e-15)   # 1.998
        assert_array_equal(adamw.state["b"]["m"], [0.0])  # decay never enters AdamW's moments


def test_adam_and_adamw_agree_without_weight_decay():
    rng = np.random.default_rng(0)
    with minipar.device():
        a = param("a", rng.standard_normal(5))
        b = param("b", a.data.copy())
        oa, ob = Adam([a], lr=0.05, weight_decay=0.0), AdamW([b], lr=0.05, weight_decay=0.0)
        for _ in range(3):
            g = rng.standard_normal(5)
            set_grad(a, g)
            set_grad(b, g)
            oa.step()
            ob.step()
        assert_array_equal(a.data, b.data)


def test_weight_decay_filter_skips_biases():
    with minipar.device():
        w, bias = param("l.weight", [1.0, 1.0]), param("l.bias", [1.0])
        opt = AdamW([w, bias], lr=0.1, weight_decay=0.5,
                    weight_decay_filter=no_decay_for("*.bias"))
        set_grad(w, [0.0, 0.0])
        set_grad(bias, [0.0])
        opt.step()
        assert_allclose(w.data, [1.0 - 0.1 * 0.5] * 2, rtol=1e-15)
        assert_array_equal(bias.data, [1.0])
        assert opt.decays(w) and not opt.decays(bias)


def test_param_without_grad_is_skipped():
    with minipar.device() as ctx:
        a, b = param("a", [1.0, 2.0]), param("b", [3.0])
        opt = AdamW([a, b], lr=0.1, weight_decay=0.1)
        set_grad(a, [1.0, 1.0])
        opt.step()
        assert_array_equal(b.data, [3.0])               # no update, no decay either
        assert "b" not in opt.state
        assert ctx.ledger.held("optimizer_states") == 2 * a.data.nbytes   # only a's m, v
        opt.zero_grad()
        assert a.grad is None and ctx.ledger.held("gradients") == 0


# ---- optimizer states on the ledger -----------------------------------------------------

@pytest.mark.parametrize("dtype, state_bytes", [(np.float32, 4), (np.float64, 8)])
def test_adam_states_on_the_ledger_lazily(dtype, state_bytes):
    with minipar.device() as ctx:
        ps = [param("x", np.ones((3, 4)), dtype), param("y", np.ones(5), dtype)]
        n = 12 + 5
        opt = AdamW(ps, lr=1e-3)
        assert ctx.ledger.held("optimizer_states") == 0    # lazy: nothing before a step
        for p in ps:
            set_grad(p, np.ones(p.shape))
        opt.step()
        assert ctx.ledger.held("optimizer_states") == 2 * state_bytes * n   # m and v
        names = {a.name for a in ctx.ledger.live() if a.category == "optimizer_states"}
        assert names == {"optim:x.m", "optim:x.v", "optim:y.m", "optim:y.v"}
        assert opt.state["x"]["m"].dtype == np.dtype(np.float32 if dtype == np.float32
                                                      else np.float64)
        assert ctx.ledger.held("optimizer_states") == opt.state_nbytes()
        assert all(p.data.dtype == dtype for p in ps)
        opt.release()
        assert ctx.ledger.held("optimizer_states") == 0


def test_sgd_momentum_buffer_on_the_ledger():
    with minipar.device() as ctx:
        w = param("w", np.zeros(10), np.float32)
        opt = SGD([w], lr=0.1, momentum=0.9)
        set_grad(w, np.ones(10))
        opt.step()
        assert ctx.ledger.held("optimizer_states") == 4 * 10
        assert [a.name for a in ctx.ledger.live() if a.category == "optimizer_states"] == \
            ["optim:w.momentum"]


def test_bad_hyperparameters_are_refused():
    with minipar.device():
        w = param("w", [1.0])
        with pytest.raises(ValueError, match="betas"):
            Adam([w], betas=(0.9, 1.0))
        with pytest.raises(ValueError, match="learning rate"):
            SGD([w], lr=-1.0)
        with pytest.raises(ValueError, match="unique"):
            SGD([w, w], lr=0.1)
        with pytest.raises(ValueError, match="empty"):
            AdamW([], lr=0.1)


# ---- against a straightforward loop reference ------------------------------------------

def adam_loop_reference(w0, grads, lr, b1, b2, eps, wd, decoupled):
    """Adam/AdamW element by element, in Python floats. grads[s][k] is None: no grad."""
    ws = [[float(x) for x in w.ravel()] for w in w0]
    ms = [[0.0] * len(w) for w in ws]
    vs = [[0.0] * len(w) for w in ws]
    ts = [0] * len(ws)
    for step_grads in grads:
        for k, g in enumerate(step_grads):
            if g is None:
                continue
            ts[k] += 1
            t = ts[k]
            for i, gi in enumerate(float(x) for x in g.ravel()):
                wi = ws[k][i]
                if wd and not decoupled:
                    gi = gi + wd * wi
                ms[k][i] = b1 * ms[k][i] + (1 - b1) * gi
                vs[k][i] = b2 * vs[k][i] + (1 - b2) * gi * gi
                m_hat = ms[k][i] / (1 - b1 ** t)
                v_hat = vs[k][i] / (1 - b2 ** t)
                if decoupled:
                    wi = wi - lr * wd * wi
                ws[k][i] = wi - lr * m_hat / (math.sqrt(v_hat) + eps)
    return ws, ms, vs, ts


def sgd_loop_reference(w0, grads, lr, momentum, wd, nesterov):
    ws = [[float(x) for x in w.ravel()] for w in w0]
    bs = [None] * len(ws)
    for step_grads in grads:
        for k, g in enumerate(step_grads):
            if g is None:
                continue
            gs = [float(x) + wd * ws[k][i] for i, x in enumerate(g.ravel())]
            if momentum:
                bs[k] = list(gs) if bs[k] is None else [momentum * b + gi
                                                        for b, gi in zip(bs[k], gs)]
                gs = [gi + momentum * b for gi, b in zip(gs, bs[k])] if nesterov else bs[k]
            ws[k] = [w - lr * gi for w, gi in zip(ws[k], gs)]
    return ws


shapes = st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
                  min_size=1, max_size=3)


def draw_problem(data):
    shp = data.draw(shapes)
    steps = data.draw(st.integers(1, 4))
    seed = data.draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    w0 = [rng.standard_normal(s) for s in shp]
    grads = [[rng.standard_normal(s) if rng.random() < 0.8 else None for s in shp]
             for _ in range(steps)]
    return w0, grads


def run(opt_factory, w0, grads):
    ps = [Parameter(f"p{k}", w.copy()) for k, w in enumerate(w0)]
    opt = opt_factory(ps)
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            if g is not None:
                p.accumulate(g)
        opt.step()
        opt.zero_grad()
    return ps, opt


@settings(max_examples=40)
@given(data=st.data(), lr=st.floats(1e-4, 1.0), b1=st.floats(0.0, 0.99),
       b2=st.floats(0.5, 0.9999), eps=st.sampled_from([1e-8, 1e-6, 1e-3]),
       wd=st.sampled_from([0.0, 0.01, 0.3]), decoupled=st.booleans())
def test_adam_matches_loop_reference(data, lr, b1, b2, eps, wd, decoupled):
    w0, grads = draw_problem(data)
    cls = AdamW if decoupled else Adam
    with minipar.device():
        ps, opt = run(lambda ps: cls(ps, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd),
                      w0, grads)
    ws, ms, vs, ts = adam_loop_reference(w0, grads, lr, b1, b2, eps, wd, decoupled)
    for k, p in enumerate(ps):
        assert_allclose(p.data.ravel(), ws[k], rtol=1e-12, atol=1e-14)
        if ts[k]:
            st_ = opt.state[p.name]
            assert st_["step"] == ts[k]
            assert_allclose(st_["m"].ravel(), ms[k], rtol=1e-12, atol=1e-15)
            assert_allclose(st_["v"].ravel(), vs[k], rtol=1e-12, atol=1e-15)
        else:
            assert p.name not in opt.state


@settings(max_examples=30)
@given(data=st.data(), lr=st.floats(1e-3, 1.0), momentum=st.sampled_from([0.0, 0.5, 0.9]),
       wd=st.sampled_from([0.0, 0.1]), nesterov=st.booleans())
def test_sgd_matches_loop_reference(data, lr, momentum, wd, nesterov):
    nesterov = nesterov and momentum > 0
    w0, grads = draw_problem(data)
    with minipar.device():
        ps, _ = run(lambda ps: SGD(ps, lr=lr, momentum=momentum, weight_decay=wd,
                                   nesterov=nesterov), w0, grads)
    ws = sgd_loop_reference(w0, grads, lr, momentum, wd, nesterov)
    for k, p in enumerate(ps):
        assert_allclose(p.data.ravel(), ws[k], rtol=1e-12, atol=1e-14)


# ---- convergence ------------------------------------------------------------------------

CURV = np.array([1.0, 10.0, 100.0])      # f(w) = ½ Σ a_i (w_i − t_i)², condition number 100
TARGET = np.array([1.5, -2.0, 0.25])


def quadratic_grad(w):
    return CURV * (w - TARGET)


def test_adamw_with_warmup_cosine_converges_on_a_quadratic():
    with minipar.device():
        w = param("w", [0.0, 0.0, 0.0])
        opt = AdamW([w], lr=0.0, weight_decay=0.0)
        sched = WarmupCosine(opt, max_lr=0.1, warmup_steps=20, total_steps=400)
        for _ in range(400):
            w.accumulate(quadratic_grad(w.data))
            opt.step()
            opt.zero_grad()
            sched.step()
        assert opt.lr == 0.0
        assert_allclose(w.data, TARGET, atol=1e-5)


def test_sgd_momentum_converges_on_a_quadratic():
    with minipar.device():
        w = param("w", [0.0, 0.0, 0.0])
        opt = SGD([w], lr=0.01, momentum=0.9)
        for _ in range(400):
            w.accumulate(quadratic_grad(w.data))
            opt.step()
            opt.zero_grad()
        assert_allclose(w.data, TARGET, atol=1e-6)
