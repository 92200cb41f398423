"""Capacity, which pairs are dropped (by weight or by position), the rows each expert gets,
and permute / unpermute with their gradients."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.nn.gradcheck import gradcheck
from minipar.nn.moe.dispatch import (capacity, permute, permute_backward, plan_routing,
                                     unpermute, unpermute_backward)


def choice(T, E, k, seed):
    """k distinct experts and k positive weights for each of T tokens."""
    g = np.random.default_rng(seed)
    experts = np.stack([g.permutation(E)[:k] for _ in range(T)])  # [T, k]
    return experts, g.uniform(0.1, 1.0, (T, k))


def test_capacity_is_the_even_share_times_the_factor_rounded_up():
    assert capacity(10, 4, 2, 1.0) == 5  # 2·10/4
    assert capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    assert capacity(16, 8, 2, 1.25) == 5  # ceil(4 · 1.25)
    with pytest.raises(ValueError, match="capacity_factor must be a positive number"):
        capacity(10, 4, 2, 0)


def test_position_keeps_the_first_tokens_and_probs_the_heaviest():
    experts = np.array([[0], [0], [0], [1]])  # three tokens want expert 0, capacity 2
    weights = np.array([[0.2], [0.9], [0.5], [1.0]])
    by_pos = plan_routing(experts, weights, 2, capacity=2, drop_policy="position")
    by_prob = plan_routing(experts, weights, 2, capacity=2, drop_policy="probs")
    assert by_pos.kept[:, 0].tolist() == [True, True, False, True]
    assert by_prob.kept[:, 0].tolist() == [False, True, True, True]
    assert by_pos.dropped == by_prob.dropped == 1
    assert by_prob.tokens.tolist() == [1, 2, 3]  # expert 0's rows in token order, then 1's
    assert by_prob.counts.tolist() == [2, 1]


@settings(max_examples=30)
@given(T=st.integers(1, 12), E=st.integers(1, 5), k=st.integers(1, 3),
       factor=st.sampled_from([None, 0.5, 1.0, 1.5]), policy=st.sampled_from(["probs", "position"]),
       pad=st.booleans(), seed=st.integers(0, 100))
def test_the_plan_keeps_min_of_routed_and_capacity_and_groups_rows_by_expert(
        T, E, k, factor, policy, pad, seed):
    k = min(k, E)
    experts, weights = choice(T, E, k, seed)
    C = None if factor is None else capacity(T, E, k, factor)
    pad = pad and C is not None
    plan = plan_routing(experts, weights, E, C, policy, pad)
    routed = np.bincount(experts.reshape(-1), minlength=E)
    want = routed if C is None else np.minimum(routed, C)
    assert plan.counts.tolist() == want.tolist()
    assert plan.rows_per_expert.tolist() == ([C] * E if pad else want.tolist())
    start = 0
    for e in range(E):  # each expert's block: its kept tokens in order, then padding
        block = plan.tokens[start:start + plan.rows_per_expert[e]]
        real = block[block >= 0]
        assert len(real) == want[e] and (np.diff(real) > 0).all()
        assert (block[len(real):] == -1).all()
        assert all(e in experts[t] for t in real)
        start += plan.rows_per_expert[e]
    rows = plan.row[plan.kept]
    assert sorted(rows.tolist()) == sorted(np.flatnonzero(plan.tokens >= 0).tolist())
    if policy == "probs" and C is not None:  # a dropped pair weighs no more than a kept one
        for e in range(E):
            at = experts == e
            kept_w, dropped_w = weights[at & plan.kept], weights[at & ~plan.kept]
            if len(dropped_w):
                assert dropped_w.max() <= kept_w.min()


def test_dropless_identity_experts_give_back_the_weighted_tokens():
    experts, weights = choice(6, 4, 2, 0)
    x = np.random.default_rng(1).standard_normal((6, 3))
    with mp.device():
        plan = plan_routing(experts, weights, 4)
        y, _ = unpermute(permute(x, plan), plan, weights)
    np.testing.assert_allclose(y, x * weights.sum(-1, keepdims=True), rtol=1e-14)


@pytest.mark.parametrize("pad", [False, True])
def test_permute_and_unpermute_gradients_match_finite_differences(pad):
    T, E, k, h = 7, 3, 2, 4
    experts, weights = choice(T, E, k, 2)
    g = np.random.default_rng(3)
    x, r = g.standard_normal((T, h)), g.standard_normal((T, h))
    a = g.standard_normal((h, h))  # a stand-in expert: ys = tanh(xs a), one for all
    plan = plan_routing(experts, weights, E, capacity(T, E, k, 0.8), "probs", pad)
    assert plan.dropped > 0

    def f(x, weights):
        with mp.device():
            return np.sum(unpermute(np.tanh(permute(x, plan) @ a), plan, weights)[0] * r)

    with mp.device():
        xs = permute(x, plan)
        ys = np.tanh(xs @ a)
        y, saved = unpermute(ys, plan, weights)
        dys, dw = unpermute_backward(r, saved, plan)
        dxs = (dys * (1 - ys ** 2)) @ a.T
        dx = permute_backward(dxs, plan, T)
    assert (dw[~plan.kept] == 0).all()
    gradcheck(f, {"x": x, "weights": weights}, {"x": dx, "weights": dw})


def test_refusals_say_what_to_change():
    experts, weights = choice(4, 3, 1, 0)
    with pytest.raises(ValueError, match="drop_policy must be one of"):
        plan_routing(experts, weights, 3, 2, drop_policy="random")
    with pytest.raises(ValueError, match="pad=True fills each expert's block up to its capacity"):
        plan_routing(experts, weights, 3, None, pad=True)
