"""The load-balancing pieces of a mixture of experts (minipar.nn.moe.balancing): each loss's
gradient against finite differences (float64), its value at perfect balance, under
imbalance and on a small example worked by hand; the selection bias's update, alone and
in a routing loop; and the messages that refuse bad inputs."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minipar.nn.gradcheck import gradcheck
from minipar.nn.moe.balancing import (expert_counts, sequence_aux_loss, switch_aux_loss,
                                      update_expert_bias, z_loss)

seeds = st.integers(0, 2**32 - 1)
coeffs = st.sampled_from([1e-3, 1e-2, 0.1, 1.0, 3.0])


@st.composite
def experts_and_k(draw):
    E = draw(st.integers(1, 9))
    return E, draw(st.integers(1, E))


def random_routing(seed, T, E, k):
    """probs [T, E] normalised over experts, and k distinct random experts per token."""
    g = np.random.default_rng(seed)
    logits = g.standard_normal((T, E))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    topk = np.argsort(g.random((T, E)), axis=1)[:, :k]  # topk: [T, k], distinct per row
    return probs, topk


def balanced_routing(E, k, repeats=1):
    """T = repeats·E tokens; token t picks experts t, t+1, ..., t+k-1 (mod E): every expert
    is chosen repeats·k times; probs uniform 1/E."""
    t = np.arange(repeats * E)[:, None]
    topk = (t + np.arange(k)[None, :]) % E  # topk: [T, k]
    return np.full((repeats * E, E), 1.0 / E), topk


# ---- gradients against finite differences (topk held fixed) ---------------------------
@given(seeds, experts_and_k(), st.integers(1, 6), coeffs)
def test_switch_aux_loss_gradient(seed, ek, T, coeff):
    E, k = ek
    probs, topk = random_routing(seed, T, E, k)
    loss, dprobs = switch_aux_loss(probs, topk, coeff)
    assert dprobs.shape == probs.shape and dprobs.dtype == np.float64
    assert gradcheck(lambda probs: switch_aux_loss(probs, topk, coeff)[0], {"probs": probs},
                     {"probs": dprobs})


@given(seeds, experts_and_k(), st.integers(1, 4), st.integers(1, 4), coeffs)
def test_the_global_batch_loss_is_the_ranks_mean_with_summed_counts(seed, ek, T, ranks,
                                                                     coeff):
    """Megatron's global_aux_loss: each of `ranks` equal token groups passes the counts
    summed over all of them; the mean of the groups' losses is the loss of their union,
    and each group's gradient, divided by the number of groups, is the union's on its
    rows (gradients averaged over data-parallel ranks)."""
    E, k = ek
    probs, topk = random_routing(seed, ranks * T, E, k)
    whole, dwhole = switch_aux_loss(probs, topk, coeff)
    counts = expert_counts(topk, E)
    parts = [switch_aux_loss(probs[r * T:(r + 1) * T], topk[r * T:(r + 1) * T], coeff,
                             counts) for r in range(ranks)]
    np.testing.assert_allclose(np.mean([loss for loss, _ in parts]), whole, rtol=1e-13)
    np.testing.assert_allclose(np.concatenate([d for _, d in parts]) / ranks, dwhole,
                               rtol=1e-13)
    assert gradcheck(lambda probs: switch_aux_loss(probs, topk, coeff, counts)[0],
                     {"probs": probs}, {"probs": switch_aux_loss(probs, topk, coeff,
                                                                 counts)[1]})
    if ranks > 1:  # the groups' own counts: the mean of products is not the product of means
        local = [switch_aux_loss(probs[r * T:(r + 1) * T], topk[r * T:(r + 1) * T], coeff)
                 for r in range(ranks)]
        own = np.concatenate([d for _, d in local]) / ranks
        same = np.allclose(own, dwhole, rtol=1e-9, atol=0)
        assert same == all(np.array_equal(expert_counts(topk[r * T:(r + 1) * T], E) * ranks,
                                          counts) for r in range(ranks))


@given(seeds, st.integers(1, 5), st.integers(1, 6), coeffs)
def test_z_loss_gradient(seed, T, E, coeff):
    logits = 3.0 * np.random.default_rng(seed).standard_normal((T, E))
    loss, dlogits = z_loss(logits, coeff)
    assert dlogits.shape == logits.shape and dlogits.dtype == np.float64
    assert gradcheck(lambda logits: z_loss(logits, coeff)[0], {"logits": logits},
                     {"logits": dlogits})


@given(seeds, experts_and_k(), st.integers(1, 3), st.integers(1, 3), coeffs)
def test_sequence_aux_loss_gradient(seed, ek, s, b, coeff):
    E, k = ek
    probs, topk = random_routing(seed, s * b, E, k)
    loss, dprobs = sequence_aux_loss(probs, topk, s, coeff)
    assert dprobs.shape == probs.shape and dprobs.dtype == np.float64
    assert gradcheck(lambda probs: sequence_aux_loss(probs, topk, s, coeff)[0],
                     {"probs": probs}, {"probs": dprobs})


def test_z_loss_is_stable_for_large_logits():
    logits = np.array([[1000.0, 1000.0], [-1000.0, -1000.0 + math.log(3.0)]])
    loss, dlogits = z_loss(logits, 1.0)
    lse = np.array([1000.0 + math.log(2.0), -1000.0 + math.log(4.0)])
    assert loss == pytest.approx(np.mean(lse**2), rel=1e-12)
    assert np.all(np.isfinite(dlogits))


def test_float32_in_float32_out():
    probs, topk = random_routing(0, 6, 4, 2)
    p32 = probs.astype(np.float32)
    for loss, grad in (switch_aux_loss(p32, topk, 0.01), sequence_aux_loss(p32, topk, 3, 0.01),
                       z_loss(p32, 0.01)):
        assert isinstance(loss, float) and grad.dtype == np.float32
    assert switch_aux_loss(p32, topk, 0.01)[0] == pytest.approx(
        switch_aux_loss(probs, topk, 0.01)[0], rel=1e-6)


# ---- values: balance, imbalance, by hand ------------------------------------------------
@given(experts_and_k(), st.integers(1, 4), coeffs)
def test_switch_loss_is_coeff_at_perfect_balance(ek, repeats, coeff):
    E, k = ek
    probs, topk = balanced_routing(E, k, repeats)
    np.testing.assert_array_equal(expert_counts(topk, E), np.full(E, repeats * k))
    assert switch_aux_loss(probs, topk, coeff)[0] == pytest.approx(coeff, rel=1e-12)


@given(experts_and_k(), st.integers(1, 4), coeffs)
def test_sequence_loss_is_coeff_at_perfect_balance_in_every_sequence(ek, b, coeff):
    E, k = ek
    s = E
    # position i_s of sequence j picks (i_s + j + r) mod E, r < k: within each sequence of
    # s = E tokens every expert is chosen k times. Token t = i_s·b + j ([s, b] flattened).
    i_s, j = np.divmod(np.arange(s * b), b)
    topk = (i_s[:, None] + j[:, None] + np.arange(k)[None, :]) % E  # topk: [s·b, k]
    probs = np.full((s * b, E), 1.0 / E)
    assert sequence_aux_loss(probs, topk, s, coeff)[0] == pytest.approx(coeff, rel=1e-12)


@given(st.integers(2, 9), st.integers(1, 8), coeffs)
def test_all_tokens_on_one_expert_give_coeff_times_E(E, T, coeff):
    topk = np.zeros((T, 1), dtype=np.int64)
    probs = np.zeros((T, E))
    probs[:, 0] = 1.0  # all probability on the one chosen expert: f_0 = P_0 = 1
    assert switch_aux_loss(probs, topk, coeff)[0] == pytest.approx(coeff * E, rel=1e-12)
    assert sequence_aux_loss(probs, topk, T, coeff)[0] == pytest.approx(coeff * E, rel=1e-12)
    assert coeff * E > coeff


@given(st.integers(2, 9), st.data())
def test_concentrating_on_fewer_experts_raises_the_loss(E, data):
    m = data.draw(st.integers(1, E))  # tokens spread evenly over the first m experts, k = 1
    topk = (np.arange(m)[:, None]).astype(np.int64)
    probs = np.eye(E)[:m]  # each token's probability on its own expert
    loss = switch_aux_loss(probs, topk, 0.01)[0]
    assert loss == pytest.approx(0.01 * E / m, rel=1e-12)  # E·Σ (1/m)(1/m) over m experts
    assert loss > 0.01 or m == E


def test_switch_loss_by_hand():
    probs = np.array([[0.5, 0.3, 0.2],
                      [0.1, 0.6, 0.3]])
    topk = np.array([[0, 1], [1, 2]])
    # T = 2, E = 3, k = 2: counts c = [1, 2, 1], f = c / (T·k) = [1/4, 1/2, 1/4]
    # P = column means = [0.6/2, 0.9/2, 0.5/2] = [0.3, 0.45, 0.25]
    # Σ f·P = 0.075 + 0.225 + 0.0625 = 0.3625; L = 0.01 · 3 · 0.3625 = 0.010875
    # dprobs[t] = 0.01 · 3 · f / 2 = [0.00375, 0.0075, 0.00375] for both tokens
    loss, dprobs = switch_aux_loss(probs, topk, 0.01)
    assert loss == pytest.approx(0.010875, rel=1e-12)
    np.testing.assert_allclose(dprobs, [[0.00375, 0.0075, 0.00375]] * 2, rtol=1e-12)


def test_z_loss_by_hand():
    logits = np.array([[0.0, 0.0], [math.log(3.0), 0.0]])
    # lse = [log 2, log 4] = [ln2, 2 ln2]; L = 0.001 · (ln2² + 4 ln2²) / 2 = 0.0025 ln2²
    # softmax = [[1/2, 1/2], [3/4, 1/4]]; dlogits = 0.001 · 2 · lse · softmax / 2
    #         = 0.001 · ln2 · [[0.5, 0.5], [1.5, 0.5]]
    loss, dlogits = z_loss(logits, 0.001)
    ln2 = math.log(2.0)
    assert loss == pytest.approx(0.0025 * ln2**2, rel=1e-12)
    np.testing.assert_allclose(dlogits, 0.001 * ln2 * np.array([[0.5, 0.5], [1.5, 0.5]]),
                               rtol=1e-12)


def test_sequence_loss_by_hand_and_token_order():
    # s = 2, b = 2: token t = i_s·b + i_b, so sequence 0 is tokens 0, 2 and sequence 1 is
    # tokens 1, 3. E = 2, k = 1.
    probs = np.array([[0.7, 0.3], [0.4, 0.6], [0.9, 0.1], [0.2, 0.8]])
    topk = np.array([[0], [1], [0], [0]])
    # seq 0: c = [2, 0], f = E/(k·s)·c = [2, 0], P = [0.8, 0.2] -> L_0 = 0.1 · 1.6 = 0.16
    # seq 1: c = [1, 1], f = [1, 1],             P = [0.3, 0.7] -> L_1 = 0.1 · 1.0 = 0.10
    # L = (0.16 + 0.10) / 2 = 0.13; dprobs = 0.1 · f / (s·b): [0.05, 0] for tokens 0 and 2,
    # [0.025, 0.025] for tokens 1 and 3.
    # (Reading sequences as consecutive tokens 0, 1 and 2, 3 would give 0.105 instead.)
    loss, dprobs = sequence_aux_loss(probs, topk, 2, 0.1)
    assert loss == pytest.approx(0.13, rel=1e-12)
    np.testing.assert_allclose(dprobs, [[0.05, 0], [0.025, 0.025], [0.05, 0], [0.025, 0.025]],
                               rtol=1e-12)


@given(seeds, experts_and_k(), st.integers(1, 8), coeffs)
def test_one_sequence_is_the_switch_loss(seed, ek, T, coeff):
    E, k = ek
    probs, topk = random_routing(seed, T, E, k)
    seq, dseq = sequence_aux_loss(probs, topk, T, coeff)
    sw, dsw = switch_aux_loss(probs, topk, coeff)
    assert seq == pytest.approx(sw, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(dseq, dsw, rtol=1e-12, atol=1e-15)


def test_sequence_loss_sees_imbalance_that_the_batch_hides():
    # two sequences of 2 tokens, E = 2, k = 1: sequence 0 all on expert 0, sequence 1 all on
    # expert 1. Over the batch the experts are balanced; within each sequence they are not.
    topk = np.array([[0], [1], [0], [1]])  # tokens 0, 2 are sequence 0; 1, 3 sequence 1
    probs = np.eye(2)[topk[:, 0]]
    assert switch_aux_loss(probs, topk, 0.01)[0] == pytest.approx(0.01, rel=1e-12)
    assert sequence_aux_loss(probs, topk, 2, 0.01)[0] == pytest.approx(0.02, rel=1e-12)


@given(st.integers(2, 9), st.data(), coeffs)
def test_the_k_in_f_keeps_balance_at_coeff(E, data, coeff):
    k = data.draw(st.integers(2, E))
    probs, topk = balanced_routing(E, k)
    T = probs.shape[0]
    c = expert_counts(topk, E)
    P = probs.mean(axis=0)
    forgot_k = coeff * E * np.sum(c / T * P)  # f_i = c_i / T: each c_i / T is k/E at balance
    assert forgot_k == pytest.approx(coeff * k, rel=1e-12)
    assert switch_aux_loss(probs, topk, coeff)[0] == pytest.approx(coeff, rel=1e-12)


def test_expert_counts():
    topk = np.array([[0, 2], [2, 1], [2, 0]])
    c = expert_counts(topk, 4)
    np.testing.assert_array_equal(c, [2, 1, 3, 0])
    assert c.dtype == np.int64


# ---- the selection bias (auxiliary-loss-free balancing) ---------------------------------
def test_update_expert_bias_signs_and_input_unchanged():
    bias = np.array([0.5, 0.0, -0.2, 0.1], dtype=np.float32)
    before = bias.copy()
    new = update_expert_bias(bias, np.array([10, 2, 4, 4]), 0.25)  # mean 5
    np.testing.assert_array_equal(bias, before)
    assert new is not bias and new.dtype == np.float32
    # overloaded expert 0 goes down, the underloaded others go up
    np.testing.assert_allclose(new, [0.25, 0.25, 0.05, 0.35], rtol=1e-6)
    # an expert exactly at the mean keeps its bias; rate 0 changes nothing
    np.testing.assert_array_equal(update_expert_bias(np.zeros(3), np.array([1, 2, 3]), 0.1),
                                  [0.1, 0.0, -0.1])
    np.testing.assert_array_equal(update_expert_bias(before, np.array([9, 1, 1, 1]), 0.0),
                                  before)


def test_bias_updates_even_out_a_skewed_router():
    g = np.random.default_rng(0)
    T, E, k = 256, 8, 2
    scores = g.random((T, E))  # scores: [T, E]
    scores[:, 0] += 0.5  # expert 0 is favoured by every token
    bias = np.zeros(E)
    ratios = []
    for _ in range(50):
        topk = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]  # selection only
        c = expert_counts(topk, E)
        ratios.append(c.max() / max(c.min(), 1))
        bias = update_expert_bias(bias, c, 0.02)
    assert ratios[0] > 4.0  # expert 0 is picked by nearly every token at first
    assert max(ratios[-10:]) < 1.5
    assert ratios[-1] < ratios[0] / 3


# ---- refusals ---------------------------------------------------------------------------
def test_bad_inputs_are_refused_with_what_was_expected_and_received():
    probs, topk = random_routing(0, 4, 3, 2)
    cases = [
        (lambda: switch_aux_loss(probs[0], topk, 0.01), r"\[T, E\].*got shape \(3,\)"),
        (lambda: switch_aux_loss(probs, topk[:3], 0.01), r"\[4, k\].*got shape \(3, 2\)"),
        (lambda: switch_aux_loss(probs, topk[:, 0], 0.01), r"\[T, k\].*got shape \(4,\)"),
        (lambda: switch_aux_loss(probs, topk + 1, 0.01), r"0\.\.E-1 = 0\.\.2.*e\.g\. 3"),
        (lambda: switch_aux_loss(probs, topk - 3, 0.01), r"0\.\.E-1 = 0\.\.2.*e\.g\. -"),
        (lambda: switch_aux_loss(probs, np.zeros((4, 4), int), 0.01), r"1\.\.3.*k = 4"),
        (lambda: switch_aux_loss(probs, np.array([[0, 1], [2, 2], [0, 1], [0, 1]]), 0.01),
         r"distinct.*token 1 chose \[2, 2\]"),
        (lambda: switch_aux_loss(probs, topk.astype(float), 0.01), r"integer.*float64"),
        (lambda: switch_aux_loss(probs, topk, -0.01), r">= 0.*got -0\.01"),
        (lambda: switch_aux_loss(probs, topk, float("nan")), r"finite.*got nan"),
        (lambda: switch_aux_loss(probs.astype(int), topk, 0.01), r"floating.*int64"),
        (lambda: switch_aux_loss(probs, topk, 0.01, np.ones(4)),
         r"E = 3 experts' choices, \[3\].*got shape \(4,\)"),
        (lambda: switch_aux_loss(probs, topk, 0.01, np.zeros(3)), r"not all zero.*\[0\.0, "),
        (lambda: switch_aux_loss(probs, topk, 0.01, -np.ones(3)), r">= 0.*\[-1\.0, "),
        (lambda: z_loss(probs[0], 0.01), r"logits must be \[T, E\].*got shape \(3,\)"),
        (lambda: z_loss(probs, -1), r"coeff.*>= 0.*got -1"),
        (lambda: sequence_aux_loss(probs, topk, 3, 0.01), r"T = 4.*seq_len = 3.*4 % 3 = 1"),
        (lambda: sequence_aux_loss(probs, topk, 0, 0.01), r"positive int, got 0"),
        (lambda: expert_counts(topk, 0), r"positive int, got 0"),
        (lambda: expert_counts(topk, 2), r"0\.\.E-1 = 0\.\.1.*e\.g\. 2"),
        (lambda: update_expert_bias(np.zeros(3), np.zeros(4), 0.1),
         r"shape \(3,\).*got \(4,\)"),
        (lambda: update_expert_bias(np.zeros((3, 1)), np.zeros(3), 0.1),
         r"float array \[E\].*shape \(3, 1\)"),
        (lambda: update_expert_bias(np.zeros(3, int), np.zeros(3), 0.1), r"dtype int64"),
        (lambda: update_expert_bias(np.zeros(3), np.zeros(3), -0.1), r">= 0.*got -0\.1"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
