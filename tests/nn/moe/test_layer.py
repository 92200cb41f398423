"""The MoE layer on one device: one expert is the dense MLP, the whole layer's gradients
(router, experts, shared experts, balancing losses weighted by the loss scale) against
finite differences, the split backward bit for bit, and what a dropped token gets."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.nn import MLP, WeightGradStore
from minipar.nn.gradcheck import gradcheck
from minipar.nn.moe import MoE

S, B, H, F = 3, 2, 4, 6


def layer(**kw):
    base = dict(name="moe", hidden=H, ffn_hidden=F, num_experts=4, top_k=2, std=0.5,
                out_std=0.5)
    base.update(kw)
    return MoE(**base)


def test_one_expert_chosen_always_is_the_dense_mlp_bit_for_bit():
    g = np.random.default_rng(0)
    x, r = g.standard_normal((S, B, H)), g.standard_normal((S, B, H))
    with mp.device():
        moe = layer(num_experts=1, top_k=1)
        y, saved = moe.forward(x)
        dx = moe.backward(r, saved)
    with mp.device():
        mlp = MLP("moe.experts.0", H, F, std=0.5, out_std=0.5)  # the same name: same weights
        want, s_mlp = mlp.forward(x)
        want_dx = mlp.backward(r, s_mlp)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(dx, want_dx)  # the router's share: exactly zero (w = 1)
    for p, q in zip(moe.experts.parameters(), mlp.parameters()):
        np.testing.assert_array_equal(p.grad, q.grad)
    np.testing.assert_array_equal(moe.router.linear.weight.grad, 0)


@pytest.mark.timeout(120)
@settings(max_examples=8)
@given(score=st.sampled_from(["softmax", "sigmoid"]), factor=st.sampled_from([None, 0.75]),
       shared=st.sampled_from([0, 5]), k=st.integers(1, 2), seed=st.integers(0, 30))
def test_layer_gradients_match_finite_differences(score, factor, shared, k, seed):
    g = np.random.default_rng(seed)
    x, r = g.standard_normal((S, B, H)), g.standard_normal((S, B, H))
    scale = 0.5  # the loss's weight in the backward: the balancing losses take it too
    with mp.device():
        moe = layer(score_function=score, capacity_factor=factor, shared_ffn_hidden=shared,
                    top_k=k, aux_loss_coeff=0.1, seq_aux_loss_coeff=0.2, z_loss_coeff=0.3)
        y, saved = moe.forward(x)
        dx = moe.backward(r, saved, loss_scale=scale)
    assert set(moe.aux_losses) == {"load_balancing", "seq_load_balancing", "z_loss"}
    params = moe.parameters()

    def f():  # the routing of the perturbed input: the same, away from ties
        with mp.device():
            out, _ = moe.forward(x)
        return np.sum(out * r) + scale * moe.total_aux_loss()

    inputs = {"x": x, **{p.name: p.data for p in params}}
    grads = {"x": dx, **{p.name: p.grad if p.grad is not None else np.zeros_like(p.data)
                         for p in params}}
    gradcheck(f, inputs, grads)


def test_a_split_backward_gives_the_fused_gradients_bit_for_bit():
    x, r = np.random.default_rng(4).standard_normal((2, S, B, H))
    out = []
    for split in (False, True):
        with mp.device():
            moe = layer(capacity_factor=1.0, shared_ffn_hidden=3, aux_loss_coeff=0.01,
                        z_loss_coeff=0.001)
            y, saved = moe.forward(x)
            store = WeightGradStore() if split else None
            dx = moe.backward(r, saved, store=store)
            if split:
                store.run()
            out.append((dx, [None if p.grad is None else p.grad.copy()
                             for p in moe.parameters()]))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    for a, b in zip(out[0][1], out[1][1]):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_a_token_whose_choices_are_all_dropped_gets_the_shared_experts_only():
    x = np.random.default_rng(5).standard_normal((4, 1, H))
    with mp.device():
        moe = layer(top_k=1, capacity_factor=0.25, drop_policy="position",
                    shared_ffn_hidden=3)  # capacity 1 per expert: 4 tokens, 4 slots at most
        moe.router.expert_bias[0] = 100.0  # every token picks expert 0: three are dropped
        y, _ = moe.forward(x)
        shared, _ = moe.shared.forward(x)
    assert moe.last_plan.kept[:, 0].tolist() == [True, False, False, False]
    np.testing.assert_array_equal(y[1:], shared[1:])
    assert not np.array_equal(y[0], shared[0])


def test_the_balancing_gradients_are_weighted_by_the_loss_scale():
    x = np.random.default_rng(6).standard_normal((S, B, H))
    grads = []
    for coeff, scale in ((0.0, 1.0), (0.5, 0.0), (0.5, 1.0), (0.5, 2.0)):
        with mp.device():
            moe = layer(aux_loss_coeff=coeff)
            y, saved = moe.forward(x)
            moe.backward(np.zeros_like(y), saved, loss_scale=scale)
            grads.append(moe.router.linear.weight.grad.copy())
    np.testing.assert_array_equal(grads[0], 0)  # no output gradient, no balancing loss
    np.testing.assert_array_equal(grads[1], 0)  # the loss weighted by 0
    np.testing.assert_allclose(grads[3], 2 * grads[2], rtol=1e-12)
    assert np.abs(grads[2]).max() > 0


def test_bad_layers_are_refused():
    with pytest.raises(ValueError, match="drop_policy must be one of"):
        layer(drop_policy="random")
    with pytest.raises(ValueError, match="pad_to_capacity pads"):
        layer(pad_to_capacity=True)
    with pytest.raises(ValueError, match="aux_loss_coeff is a loss's weight"):
        layer(aux_loss_coeff=-1.0)
