"""Gradient checks of the layers (attention, MLP, block) over shapes, in float64."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.nn import MLP, Block, CausalSelfAttention, GPTConfig
from minipar.nn.gradcheck import gradcheck


def check_layer(layer, x, run):
    """Finite differences of sum(y * r) against layer.backward(r), for x and every param."""
    r = np.random.default_rng(1).standard_normal(run(x)[0].shape)

    def f():
        y, saved = run(x)
        _release(saved)
        return np.sum(y * r)

    y, saved = run(x)
    dx = layer.backward(r, saved)
    params = {p.name: p for p in layer.parameters()}
    inputs = {"x": x, **{n: p.data for n, p in params.items()}}
    analytic = {"x": dx, **{n: p.grad for n, p in params.items()}}
    gradcheck(f, inputs, analytic, rtol=1e-5, atol=1e-8)


def _release(saved):
    if hasattr(saved, "release"):
        saved.release()
    elif isinstance(saved, (tuple, list)):
        for s in saved:
            _release(s)


shapes = st.tuples(st.integers(1, 4), st.integers(1, 2), st.sampled_from([(4, 1), (4, 2), (6, 3)]))


@pytest.mark.timeout(60)
@settings(max_examples=8)
@given(shape=shapes, p=st.sampled_from([0.0, 0.4]), selective=st.booleans(), seed=st.integers(0, 50))
def test_attention_gradients(shape, p, selective, seed):
    s, b, (h, a) = shape
    with mp.device():
        layer = CausalSelfAttention("attn", h, a, dropout=p, seed=seed, std=0.5, out_std=0.5)
        x = np.random.default_rng(seed).standard_normal((s, b, h))
        check_layer(layer, x, lambda x: layer.forward(x, np.random.default_rng(seed), selective))


@pytest.mark.timeout(60)
@settings(max_examples=8)
@given(shape=shapes, gelu=st.sampled_from(["tanh", "none"]), seed=st.integers(0, 50))
def test_mlp_gradients(shape, gelu, seed):
    s, b, (h, _) = shape
    with mp.device():
        layer = MLP("mlp", h, 3 * h, gelu=gelu, seed=seed, std=0.5, out_std=0.5)
        x = np.random.default_rng(seed).standard_normal((s, b, h))
        check_layer(layer, x, lambda x: layer.forward(x))


@pytest.mark.timeout(60)
@settings(max_examples=8)
@given(shape=shapes, p=st.sampled_from([0.0, 0.3]),
       recompute=st.sampled_from(["none", "selective", "full"]), seed=st.integers(0, 50))
def test_block_gradients(shape, p, recompute, seed):
    s, b, (h, a) = shape
    with mp.device():
        cfg = GPTConfig(hidden=h, num_heads=a, num_layers=1, dropout=p, recompute=recompute,
                        init_std=0.5, seed=seed)
        layer = Block("block", cfg)
        x = np.random.default_rng(seed).standard_normal((s, b, h))
        check_layer(layer, x, lambda x: layer.forward(x, np.random.default_rng(seed)))
