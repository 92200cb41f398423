"""The router: its choice (ties, bias, groups), its weights (Mixtral's softmax over the
chosen, Switch's raw probability, DeepSeek-V3's normalised sigmoid) and their gradients
against finite differences, through the weights, with the choice held."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.nn import WeightGradStore
from minipar.nn.gradcheck import gradcheck
from minipar.nn.moe.router import TopKRouter, check_routing, select_topk
from minipar.nn.softmax import softmax

H, E = 6, 8


def router(**kw):
    base = dict(name="r", hidden=H, num_experts=E, top_k=2, std=0.5)
    base.update(kw)
    return TopKRouter(**base)


def test_ties_go_to_the_lower_expert():
    sel = np.array([[0.2, 0.5, 0.5, 0.1], [1.0, 1.0, 1.0, 1.0]])
    assert select_topk(sel, 2).tolist() == [[1, 2], [0, 1]]


def test_group_limited_routing_keeps_the_best_groups_by_their_top_two():
    # 4 groups of 2; the sums of each group's top two: 0.9, 1.0, 0.5, 1.05 -> keep 3 and 1
    sel = np.array([[0.9, 0.0, 0.5, 0.5, 0.3, 0.2, 0.6, 0.45]])
    assert select_topk(sel, 2, num_groups=4, topk_groups=2).tolist() == [[6, 2]]
    assert select_topk(sel, 3, num_groups=4, topk_groups=2).tolist() == [[6, 2, 3]]
    assert select_topk(sel, 2).tolist() == [[0, 6]]  # no groups: 0.9 wins


def test_softmax_normalised_weights_are_the_softmax_over_the_chosen_logits():
    x = np.random.default_rng(0).standard_normal((5, H))
    with mp.device():
        r = router()
        w, chosen, saved = r.forward(x)
    logits = x @ r.linear.weight.data.T
    want = softmax(np.take_along_axis(logits, chosen, axis=-1))  # Mixtral's order
    np.testing.assert_allclose(w, want, rtol=1e-12)
    np.testing.assert_array_equal(chosen, np.argsort(-logits, axis=-1, kind="stable")[:, :2])


def test_unnormalised_weights_are_the_raw_probabilities():
    x = np.random.default_rng(1).standard_normal((5, H))
    with mp.device():
        r = router(normalize=False, top_k=1)
        w, chosen, _ = r.forward(x)
    probs = softmax(x @ r.linear.weight.data.T)
    np.testing.assert_allclose(w[:, 0], probs.max(axis=-1), rtol=1e-12)  # Switch's gate


def test_the_bias_moves_the_choice_and_never_the_weights():
    x = np.random.default_rng(2).standard_normal((6, H))
    with mp.device():
        r = router(score_function="sigmoid", scaling_factor=2.5)
        r.expert_bias[:] = 0.0
        r.expert_bias[3] = 10.0  # everyone now picks expert 3
        w, chosen, saved = r.forward(x)
    assert (chosen[:, 0] == 3).all()
    scores = 1 / (1 + np.exp(-(x @ r.linear.weight.data.T)))
    g = np.take_along_axis(scores, chosen, axis=-1)  # the scores, not scores + bias
    np.testing.assert_allclose(w, 2.5 * g / g.sum(-1, keepdims=True), rtol=1e-12)


@pytest.mark.timeout(60)
@settings(max_examples=12)
@given(score=st.sampled_from(["softmax", "sigmoid"]), normalize=st.booleans(),
       k=st.integers(1, 3), scaling=st.sampled_from([1.0, 2.5]), groups=st.sampled_from([1, 4]),
       seed=st.integers(0, 50))
def test_router_gradients_match_finite_differences(score, normalize, k, scaling, groups, seed):
    g = np.random.default_rng(seed)
    x, r_w = g.standard_normal((5, H)), g.standard_normal((5, k))
    dscores_extra, dlogits_extra = g.standard_normal((5, E)), g.standard_normal((5, E))
    with mp.device():
        r = router(score_function=score, normalize=normalize, top_k=k, scaling_factor=scaling,
                   num_groups=groups, topk_groups=2 if groups > 1 else None)
        w, chosen, saved = r.forward(x)
        dx = r.backward(r_w, saved, dscores_extra, dlogits_extra)
    W = r.linear.weight.data

    def f():  # sum(w · r_w) + <scores, extra_s> + <logits, extra_l>, the choice held
        logits = x @ W.T
        scores = softmax(logits) if score == "softmax" else 1 / (1 + np.exp(-logits))
        gg = np.take_along_axis(scores, chosen, axis=-1)
        ww = (gg / gg.sum(-1, keepdims=True) if normalize else gg) * scaling
        return np.sum(ww * r_w) + np.sum(scores * dscores_extra) + np.sum(logits * dlogits_extra)

    gradcheck(f, {"x": x, "W": W}, {"x": dx, "W": r.linear.weight.grad})
    assert r.tokens_per_expert.sum() == 5 * k  # counted once, in the backward


def test_a_split_backward_defers_the_routers_weight_gradient():
    x, dw = np.random.default_rng(3).standard_normal((2, 4, H)), np.ones((4, 2))
    out = []
    for split in (False, True):
        with mp.device():
            r = router()
            w, chosen, saved = r.forward(x[0])
            store = WeightGradStore() if split else None
            dx = r.backward(dw, saved, store=store)
            if split:
                assert r.linear.weight.grad is None
                store.run()
            out.append((dx, r.linear.weight.grad.copy()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("args, match", [
    ((0, 1, "softmax"), "num_experts must be a positive int"),
    ((4, 5, "softmax"), r"top_k must be an int in 1..num_experts = 1..4, got 5"),
    ((4, 2, "relu"), "score_function must be one of"),
    ((6, 2, "softmax", 4), "num_groups must divide num_experts = 6"),
    ((8, 2, "softmax", 4, 5), r"topk_groups must be in 1..num_groups = 1..4"),
    ((8, 3, "softmax", 4, 1), "the 1 kept group"),
])
def test_bad_routings_are_refused_with_what_to_change(args, match):
    with pytest.raises(ValueError, match=match):
        check_routing(*args)
