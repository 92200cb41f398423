"""The log-sum-exp merge against the softmax over the concatenated key blocks: merging the
blocks' partial answers in any order gives the one softmax; it stays finite where the
exponentials overflow; the planted wrong sign and the unstable form both fail."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipar.parallel.cp import logsigmoid, merge, merge_ref, sigmoid


def partial(scores, v):
    """One block's (out, lse) from its scores [b, a, m, n] and values [b, a, n, d]."""
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - top)
    return (e @ v) / e.sum(axis=-1, keepdims=True), (top + np.log(e.sum(-1, keepdims=True)))[..., 0]


def softmax_attention(scores, v):
    """The definition: softmax over every key at once, then the weighted values."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def blocks(seed, widths, scale):
    g = np.random.default_rng(seed)
    n = sum(widths)
    scores = scale * g.standard_normal((2, 3, 4, n))  # scores: [b, a, m, n]
    v = g.standard_normal((2, 3, n, 5))  # v: [b, a, n, d]
    cuts = np.cumsum(widths)[:-1]
    parts = [partial(s_, v_) for s_, v_ in zip(np.split(scores, cuts, -1), np.split(v, cuts, -2))]
    return scores, v, parts


@settings(max_examples=25)
@given(widths=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       order=st.randoms(use_true_random=False), scale=st.sampled_from([1.0, 30.0]),
       seed=st.integers(0, 999))
def test_merging_blocks_in_any_order_is_the_softmax_over_all_keys(widths, order, scale, seed):
    scores, v, parts = blocks(seed, widths, scale)
    order.shuffle(parts)
    out, lse = parts[0]
    for out_b, lse_b in parts[1:]:
        out, lse = merge(out, lse, out_b, lse_b)
    want = softmax_attention(scores, v)
    top = scores.max(-1)
    want_lse = top + np.log(np.exp(scores - top[..., None]).sum(-1))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-13)
    ref_out, ref_lse = merge_ref([p[0] for p in parts], [p[1] for p in parts])
    np.testing.assert_allclose(ref_out, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ref_lse, want_lse, rtol=1e-13)


def test_the_merge_stays_finite_where_exponentials_overflow():
    """Scores near 1e4 (float64's exp overflows past ~709): the sigmoid form is exact; the
    direct form exp(lse_1) out_1 + exp(lse_2) out_2 over exp(lse) is inf / inf."""
    scores, v, parts = blocks(0, [3, 2], 1.0)
    scores = scores + 1e4
    parts = [partial(s_, v_) for s_, v_ in zip(np.split(scores, [3], -1), np.split(v, [3], -2))]
    (o1, l1), (o2, l2) = parts
    out, lse = merge(o1, l1, o2, l2)
    np.testing.assert_allclose(out, softmax_attention(scores, v), rtol=1e-11, atol=1e-12)
    with np.errstate(over="ignore", invalid="ignore"):
        lse_naive = np.log(np.exp(l1) + np.exp(l2))
        naive = (np.exp(l1)[..., None] * o1 + np.exp(l2)[..., None] * o2) / \
            np.exp(lse_naive)[..., None]
    assert np.isfinite(out).all() and not np.isfinite(naive).any()


def test_a_merge_with_the_wrong_sign_differs():
    """The planted error: sigmoid(lse − lse_b), the other block's weight."""
    scores, v, ((o1, l1), (o2, l2)) = blocks(1, [3, 2], 1.0)
    wrong = o1 - sigmoid(l1 - l2)[..., None] * (o1 - o2)
    assert not np.allclose(wrong, softmax_attention(scores, v), atol=1e-6)
    right, _ = merge(o1, l1, o2, l2)
    np.testing.assert_allclose(right, softmax_attention(scores, v), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("x", [-800.0, -30.0, -1.0, 0.0, 1.0, 30.0, 800.0])
def test_sigmoid_and_logsigmoid_are_finite_and_exact(x):
    want = 1 / (1 + np.exp(np.float64(-x))) if x > -700 else 0.0
    assert sigmoid(np.array(x)) == pytest.approx(want, rel=1e-15, abs=1e-300)
    assert np.isfinite(logsigmoid(np.array(x)))
    assert logsigmoid(np.array(x)) == pytest.approx(-np.log1p(np.exp(-x)) if x > -700 else x,
                                                    rel=1e-15)
