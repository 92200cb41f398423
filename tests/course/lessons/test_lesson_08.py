"""Lesson 08's numbers, as the lesson computes them, against hand-written formulas: the
router's choices and weights (softmax, sigmoid, the selection bias, group-limited), the
capacity and the pairs each policy drops on the skewed batch, the balancing losses at and
away from balance, the bias evening the load, the router's gradient under accumulation
against a finite difference, the all-to-all's splits and bytes from the trace and the
cost model, the 1/ep of dp × ep, and the parameter counts. Then the exercises: the
solution passes every check, the generated exercise is all todo, each corpus case holds."""

import math

import numpy as np
import pytest

from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps

LESSON = find_lesson("08")
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_router_chooses_by_score_and_weighs_by_the_chosen_scores(lesson):
    k = lesson["K"]
    logits = lesson["logits"]
    best = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    for name in ("top_soft", "top_sig"):  # both scores increase with the logit
        np.testing.assert_array_equal(lesson[name], best)
    chosen = np.take_along_axis(logits, best, axis=1)
    np.testing.assert_allclose(lesson["w_soft"], softmax(chosen), rtol=1e-12)
    sig = 1 / (1 + np.exp(-chosen))
    np.testing.assert_allclose(lesson["w_sig"], sig / sig.sum(axis=1, keepdims=True), rtol=1e-12)
    # the bias: chosen by score + bias, weighed by the score alone
    bias, scores = lesson["bias"].astype(np.float64), softmax(logits)
    top = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(lesson["top_bias"], top)
    g = np.take_along_axis(scores, top, axis=1)
    np.testing.assert_allclose(lesson["w_bias"], g / g.sum(axis=1, keepdims=True), rtol=1e-12)
    assert (lesson["top_bias"] != lesson["top_soft"]).any()  # the bias moved some choice
    # groups of two, the best group by its two scores' sum, the k inside it
    for t, row in enumerate(scores):
        group = int(np.argmax(row.reshape(4, 2).sum(axis=1)))
        assert sorted(lesson["top_grouped"][t]) == [2 * group, 2 * group + 1]


def test_capacity_and_the_pairs_each_policy_drops(lesson):
    T, E, k = 12, 4, 2
    assert lesson["C"] == math.ceil(k * T / E * 1.0) == 6
    top, w = lesson["top_skew"], lesson["w_skew"]
    counts = np.bincount(top.reshape(-1), minlength=E)
    assert counts.tolist() == [11, 6, 7, 0]  # expert 0 over C, the last one unchosen
    for policy, plan in lesson["plans"].items():
        for e in range(E):
            t, j = np.nonzero(top == e)
            if policy == "probs":
                keep = sorted(zip(-w[t, j], t))[:6]
                want = sorted(int(tok) for _, tok in keep)
            else:
                want = sorted(int(tok) for tok in t[:6])
            assert sorted(int(x) for x in t[plan.kept[t, j]]) == want
        assert plan.dropped == counts.sum() - np.minimum(counts, 6).sum()
    position = lesson["plans"]["position"].kept
    assert np.flatnonzero(~position.any(axis=1)).tolist() == [11]  # loses both experts
    assert lesson["plans"]["probs"].kept.any(axis=1).all()
    assert lesson["dropless"].rows_per_expert.tolist() == counts.tolist()
    assert lesson["padded"].rows_per_expert.tolist() == [6] * 4
    assert (lesson["padded"].tokens < 0).sum() == 4 * 6 - np.minimum(counts, 6).sum()


def test_the_balancing_losses(lesson):
    alpha, k, s = lesson["ALPHA"], 2, 4
    assert lesson["aux_balanced"] == pytest.approx(alpha, rel=1e-12)
    assert lesson["seq_balanced"] == pytest.approx(alpha, rel=1e-12)
    assert lesson["without_k"] == pytest.approx(alpha * k, rel=1e-12)
    # batch-even, sequence-skewed: each sequence puts its 2s choices on 2 experts
    p = math.exp(3) / (2 * math.exp(3) + 2)  # the probability of a chosen expert
    f = 4 / (k * s) * s  # f_ij = E/(k s) c_ij with c_ij = s
    assert lesson["aux_split"] == pytest.approx(alpha, rel=1e-12)
    assert lesson["seq_split"] == pytest.approx(alpha * 2 * f * p, rel=1e-12)
    assert lesson["seq_split"] > 1.5 * lesson["aux_split"]


def test_the_bias_evens_the_load_over_steps(lesson):
    ratios = lesson["load_ratio"]
    assert ratios[0] > 20 and max(ratios[-10:]) < 1.5
    assert lesson["biased"].expert_bias[0] < 0 < lesson["biased"].expert_bias[1:].min()


def test_the_router_gradient_under_accumulation(lesson):
    right, planted = lesson["grads"][False], lesson["grads"][True]
    at = lesson["at"]
    assert lesson["fd"] == pytest.approx(right[at], rel=1e-7)
    assert abs(planted[at] - lesson["fd"]) > 0.5 * abs(lesson["fd"])
    assert lesson["accum_err"] > 0.5
    from minipar.nn.moe import MoE
    assert MoE.takes_loss_scale is True  # the lesson restored the class


def test_the_all_to_all_splits_and_bytes(lesson):
    h, E, ep, L = 8, 8, 4, 2
    runs = lesson["a2a"]
    rows = np.stack([r[0] for r in runs])  # [source, global expert]
    for p, (mine, sends, receives, per_local, events) in enumerate(runs):
        R = int(mine.sum())
        assert R == 12 * 2
        assert sends.tolist() == mine.reshape(ep, L).sum(axis=1).tolist()
        np.testing.assert_array_equal(per_local, rows[:, p * L:(p + 1) * L])
        assert receives.tolist() == rows[:, p * L:(p + 1) * L].sum(axis=1).tolist()
        (n1, s1, b1, f1), (n2, s2, b2, f2), (n3, s3, b3, f3) = events
        assert (n1, n2, n3) == ("all_to_all", "all_to_all_single", "all_to_all_single")
        assert (s1, b1) == (E * 8, (ep - 1) * L * 8)  # the counts: E int64s, L kept
        assert (s2, b2) == (R * h * 8, (R - sends[p]) * h * 8)  # my rows out
        got = int(receives.sum())
        assert (s3, b3) == (got * h * 8, (got - receives[p]) * h * 8)  # their rows back
        assert f1 == f2 == f3 == pytest.approx((ep - 1) / ep)


def test_the_cost_model_at_scale(lesson):
    S = 4096 * 8 * 7168 * 2
    sent, t = lesson["ep_cost"][8]
    assert sent == pytest.approx(7 / 8 * S)
    assert t == pytest.approx(7 * NV_A + 7 / 8 * S / NV_B, rel=1e-12)
    sent, t = lesson["ep_cost"][32]
    assert sent == pytest.approx(31 / 32 * S)  # 7 peers on NVLink, 24 across
    assert t == pytest.approx(31 * IB_A + max(7 / 32 * S / NV_B, 24 / 32 * S / IB_B), rel=1e-12)


def test_dp_times_ep_needs_the_one_over_ep(lesson):
    ep = lesson["DIMS"].ep
    for r, (where, _, _) in enumerate(lesson["runs"][1 / ep]):
        ep_group, edp, experts = where
        assert ep_group == [r - r % ep + i for i in range(ep)]
        assert edp == [r % ep + ep * i for i in range(4 // ep)]
        assert experts == [2 * (r % ep) + i for i in range(2)]
    np.testing.assert_allclose(lesson["ratio"][1 / ep], 1.0, rtol=1e-10)
    np.testing.assert_allclose(lesson["ratio"][1.0], ep, rtol=1e-10)
    assert lesson["drift"][1 / ep] < 1e-9 < 1e-5 < lesson["drift"][1.0]


def test_the_global_batch_aux_loss_is_the_mean_with_summed_counts(lesson):
    assert lesson["global_"] == pytest.approx(lesson["whole"], rel=1e-12)
    assert lesson["local"] > 1.2 * lesson["whole"]  # the blocks each favour an expert


def test_total_and_active_parameters(lesson):
    def count(V, s, h, layers, moe_blocks, f, f_expert, E, k, shared=0, active=False):
        attn = 4 * h * h + 4 * h + 4 * h  # qkv and proj with biases, two LayerNorms
        mlp = lambda width: 2 * h * width + width + h  # two linears with biases
        moe = E * h + (k if active else E) * mlp(f_expert) + (mlp(shared) if shared else 0)
        blocks = layers * attn + moe_blocks * moe + (layers - moe_blocks) * mlp(f)
        return 2 * V * h + s * h + blocks + 2 * h

    total, active, dense = lesson["tiny"]
    assert total == count(32, 8, 16, 4, 2, 64, 64, 8, 2)
    assert active == count(32, 8, 16, 4, 2, 64, 64, 8, 2, active=True)
    assert dense == count(32, 8, 16, 4, 0, 64, 64, 8, 2)
    args = (129280, 4096, 7168, 61, 58, 27648, 3072, 256, 8, 3072)
    assert lesson["v3_gpt"][0] == pytest.approx(count(*args) / 1e9, rel=1e-12)
    assert lesson["v3_gpt"][1] == pytest.approx(count(*args, active=True) / 1e9, rel=1e-12)
    # the published architecture, counted by plan.moe: the report's 671B and 37B
    assert (lesson["v3_total"], lesson["v3_active"]) == (671_026_404_352, 37_552_282_624)
    assert lesson["v3_states"] == pytest.approx(16 * 671_026_404_352 / 1e12, rel=1e-12)
    assert lesson["v3_flops"] == 6 * 37_552_282_624


# ---- the exercises ---------------------------------------------------------------------
# That the solution passes, the generated exercise is all todo and every corpus case is
# graded as it says is checked for every lesson at once (tests/test_course.py,
# tests/course/test_corpus.py); here, what this lesson's corpus must hold.
def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"8.1", "8.2", "8.3"}
    assert len(wrong) >= 12 and len(right) >= 1
