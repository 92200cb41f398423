"""Lesson 10's numbers, as the lesson computes them, against hand-written formulas: the first
pipeline rank of Llama 3 70B (its parameters, bytes a parameter, activations a layer and
micro-batches in flight), Korthikanti et al.'s Figure 1 from 12h² and sbh(10 + 24/t +
5as/(ht)), the ZeRO table, recomputation, a step's terms, the GEMM efficiency and the
elementwise bytes, the bubble against (p − 1)/m, MFU and HFU from the FLOP counts, the
checklist's findings, the three incidents at scale against the reported numbers, and
`minipar plan`'s answer. Then the exercises: the solution passes every check, the generated
exercise is all todo, each corpus case holds."""

from fractions import Fraction

import pytest

from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps

LESSON = find_lesson("10")
GiB = 2**30
PEAK, HBM = 989e12, 3.35e12  # H100 bf16 dense, HBM3
# Llama 3 70B (Dubey et al. 2024, Table 3): layers, hidden, heads, KV heads, head dim, MLP, V, s
L, H, A, KV, D, F, V, S = 80, 8192, 64, 8, 128, 28672, 128256, 8192


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def g(x):
    return x / (x + 128)


def test_the_first_rank_of_llama_3_70b_by_hand(lesson):
    t, p, dp, m = 8, 4, 8, 512 // 8
    layer = (H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F) // t + 2 * H  # + 2 RMSNorms
    psi = L // p * layer + -(-V // t) * H
    hand = lesson["by_hand70"]
    assert hand["psi_r"] == psi == lesson["mem70"].params.total
    assert hand["states"] == pytest.approx(psi * (2 + 4 + 12 / dp), rel=1e-12)
    a_layer = S * (4 * 2 * H + 2 * (2 * A * D + 2 * KV * D) + 3 * 2 * F) / t  # bf16, SP, no core
    assert hand["A"] == pytest.approx(a_layer, rel=1e-12) and hand["n"] == min(p, m) == 4
    mem = lesson["mem70"]
    states = mem.parameters.steady + mem.gradients.steady + mem.optimizer_states.steady
    assert states == pytest.approx(hand["states"], rel=1e-12)
    assert mem.activations.steady == pytest.approx(4 * L // p * a_layer, rel=1e-12)
    assert mem.fits and 30 * GiB < mem.peak < 40 * GiB


def test_figure_1_is_the_layers_alone_and_the_model_adds(lesson):
    shapes = {"22b": (48, 6144, 64), "175b": (96, 12288, 96), "530b": (105, 20480, 128),
              "1t": (128, 25600, 160)}
    for key, (layers, h, a) in shapes.items():
        t, pp, v, B, b = lesson["TABLE3"][key]
        fig = lesson["figure1"][key]
        published = lesson["FIGURE1"][key]
        states = 18 * 12 * layers * h**2 / (t * pp) / GiB  # 18 bytes a weight, 12h² a layer
        m = B // b
        n = min(pp * v + pp - 1, m * v) if v > 1 else min(pp, m)  # passes held on rank 0
        held = n * layers // (pp * v)  # layers' worth
        sbh = 2048 * b * h
        none = held * sbh * (10 + 24 / t + 5 * a * 2048 / (h * t)) / GiB
        sp_sel = held * sbh * 34 / t / GiB
        for mine, hand, pub, (lo, hi) in ((fig["states"], states, published[0], (3, 11.1)),
                                          (fig["none"], none, published[1], (0.5, 2.5)),
                                          (fig["sp_selective"], sp_sel, published[2], (0.3, 2.4))):
            assert mine[0] == pytest.approx(hand, rel=1e-12) == pytest.approx(pub, rel=1e-9)
            assert lo < 100 * (mine[1] / mine[0] - 1) < hi, key


def test_bytes_a_parameter_by_zero_stage_and_the_recomputation_trade(lesson):
    n = 8
    want = {"DDP": (18, 16), "distributed optimizer": (6 + 12 / n, 4 + 12 / n),
            "ZeRO-1": (6 + 12 / n, 4 + 12 / n), "ZeRO-2": (2 + 16 / n, 2 + 14 / n),
            "ZeRO-3": (18 / n, 16 / n)}
    for label, (b18, b16) in want.items():
        assert lesson["zero_table"][label, True][0] == pytest.approx(b18, rel=1e-12)
        assert lesson["zero_table"][label, False][0] == pytest.approx(b16, rel=1e-12)
    rec = lesson["recompute70"]
    assert not rec["none"][2] and rec["selective"][2] and rec["full"][2]
    assert rec["none"][0] > rec["selective"][0] > rec["full"][0]
    assert rec["none"][3] < rec["selective"][3] < rec["full"][3]  # seconds
    assert rec["selective"][3] / rec["none"][3] == pytest.approx(1.10, abs=0.01)
    assert rec["full"][3] / rec["none"][3] == pytest.approx(1.37, abs=0.01)
    assert lesson["core70"]["scores"] == 2 * A * S / (H * 8) == 16
    assert lesson["core70"]["rest"] == pytest.approx((8 + 2 * (2 * A * D + 2 * KV * D) / H
                                                      + 6 * F / H) / 8, rel=1e-12)


def test_the_step_is_its_terms(lesson):
    st = lesson["st70"]
    assert sum(st.terms.values()) == pytest.approx(st.seconds, rel=1e-12)
    assert max(st.terms, key=st.terms.get) == "matmul"
    assert st.terms["elementwise"] / st.seconds == pytest.approx(0.12, abs=0.01)


def test_gemm_efficiency_and_the_elementwise_bytes(lesson):
    T, t = S, 8
    shapes = {"qkv": (T, (A + 2 * KV) * D / t, H, 1), "scores": (S, S, D, A / t),
              "context": (S, D, S, A / t), "projection": (T, H, A * D / t, 1),
              "mlp up": (T, F / t, H, 2), "mlp down": (T, H, F / t, 1)}
    for name, (M, N, K, count) in shapes.items():
        got = lesson["gemms70"][name]
        assert got[:4] == (M, N, K, count)
        eff = 0.766 * g(M) * g(N) * g(K)
        assert got[4] == pytest.approx(eff, rel=1e-12)
        assert got[5] == pytest.approx(2 * M * N * K * count / (eff * PEAK), rel=1e-12)
    assert lesson["gemms70"]["scores"][4] == pytest.approx(0.37, abs=0.005)  # g(128) = 1/2
    flops = {k: 2 * M * N * K * c for k, (M, N, K, c) in shapes.items()}
    assert lesson["s2_share"]["flops"] == pytest.approx(
        (flops["scores"] + flops["context"]) / sum(flops.values()), rel=1e-12)
    for (T_, t_), eff in lesson["small_gemms"].items():
        assert eff == pytest.approx(0.766 * g(T_) * g(2 * F / t_) * g(H), rel=1e-12)
    e, N_, Ft, Q = 2, T * H / t, T * F / t, T * (2 * A + 2 * KV) * D / t  # SP: N split by t
    rope = 2 * e * T * (A + KV) * D / t
    S_el = A / t * S * S
    fwd = 2 * 2 * e * N_ + 2 * 3 * e * N_ + 3 * e * Ft + 2 * e * Q + rope + 2 * e * S_el
    bwd = 2 * 5 * e * N_ + 2 * 6 * e * N_ + 5 * e * Ft + 2 * e * Q + rope + 3 * e * S_el
    ew = lesson["elementwise70"]
    assert ew["bytes"] == pytest.approx(fwd + bwd, rel=1e-12)
    assert ew["seconds"] == pytest.approx((fwd + bwd) / HBM, rel=1e-12)
    assert ew["ridge"] == pytest.approx(PEAK / HBM)


def test_overlap_and_the_bubble_of_the_real_schedule(lesson):
    raw, exposed, serial = lesson["overlap70"]["tp"]
    assert exposed < raw == pytest.approx(serial)
    assert lesson["overlap70"]["dp"][1] == 0 < lesson["overlap70"]["dp"][0]
    assert lesson["st70_serial"].seconds > lesson["st70"].seconds
    b = lesson["bubble70"]
    assert b["closed"] == Fraction(3, 64)
    assert 1.3 * float(b["closed"]) < b["dry_run"] < 1.7 * float(b["closed"])
    assert b["F"][-1] > b["F"][1] and b["B"][-1] > b["B"][1]  # the logits' stage


def test_mfu_and_hfu_from_the_flop_counts(lesson):
    tokens = 512 * S
    per_token = 2 * L * (H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F) + 2 * H * V \
        + 4 * S * H * L
    assert lesson["flops70"] == 3 * tokens * per_token == pytest.approx(
        lesson["st70"].model_flops, rel=1e-12)
    for rec, (mfu, hfu, planner_mfu, planner_hfu) in lesson["mfu70"].items():
        seconds = lesson["recompute70"][rec][3]
        extra = {"none": 0, "selective": tokens * 4 * S * H * L,
                 "full": tokens * (per_token - 2 * H * V)}[rec]
        assert mfu == pytest.approx(3 * tokens * per_token / (seconds * 256 * PEAK), rel=1e-12)
        assert hfu == pytest.approx((3 * tokens * per_token + extra) / (seconds * 256 * PEAK),
                                    rel=1e-12)
        assert (mfu, hfu) == pytest.approx((planner_mfu, planner_hfu), rel=1e-12)
    m70 = lesson["mfu70"]
    assert m70["none"][0] > m70["selective"][0] > m70["full"][0]
    assert max(h for _, h, _, _ in m70.values()) - min(h for _, h, _, _ in m70.values()) < 0.03
    assert lesson["shortcut70"] / lesson["flops70"] == pytest.approx(0.879, abs=0.002)


def test_the_checklist_against_the_planner(lesson):
    rule = lesson["memory_rule"]
    assert rule["candidates"] == rule["refused"] + rule["too_big"] + rule["fit"]
    assert rule["refused"] > 0 and rule["too_big"] > 0
    tp = lesson["tp_rule"]
    assert tp[16, "none"][1] < tp[8, "none"][1] and tp[16, "none"][2] > 3 * tp[8, "none"][2]
    assert not tp[4, "none"][4] and tp[4, "selective"][0] == pytest.approx(
        tp[8, "none"][0], rel=0.01)
    by_pp = lesson["by_pp"]
    assert sorted(by_pp) == [1, 2, 4, 8, 16] and lesson["best"].layout.pp == 1
    times = [by_pp[pp].time.seconds for pp in sorted(by_pp)]
    assert times == sorted(times) and times[-1] / times[0] > 1.15
    assert lesson["dp_rule"]["zero3"][1] < 0.02 * lesson["best"].time.seconds
    comm = lesson["comm_rule"]
    assert all(comm[16, pp][0] > 0.3 for pp in (4, 2, 1)) and comm[8, 4][0] < 0.3
    small = lesson["small_rule"]
    assert small["DDP"][0] is None
    fastest = lesson["fastest7"]
    assert small["DDP + ZeRO-2"][0] < 1.05 * fastest
    assert small["pp 2, distributed optimizer"][0] > 1.1 * fastest
    assert small["pp 4, distributed optimizer"][0] > small["pp 2, distributed optimizer"][0]


def test_the_incidents_against_the_reported_numbers(lesson):
    a = lesson["incident_a"]
    for rec, row in a.items():
        gain = row["tp8"][1] / row["tp16"][1]
        assert gain == pytest.approx(48 / 35, abs=0.05), rec  # the ratio holds
        assert row["tp16"][1] < 0.35 and row["tp8"][1] < 0.48  # the levels run lower
    b = lesson["incident_b"]
    assert b[4]["closed"] == Fraction(63, 4) and b[32]["closed"] == Fraction(63, 32)
    for m, row in b.items():
        assert row["bubble"] >= float(row["closed"])
        assert row["mfu"] < row["bound"]
    assert b[4]["bound"] == 4 / 67 and b[32]["bound"] == 32 / 95
    assert b[4]["mfu"] < 0.05 < 0.28 and b[32]["mfu"] < 0.51 * 32 / 95 < 0.51
    assert b[32]["peak"] < 16 * GiB
    c = lesson["incident_c"]
    z3 = c["ZeRO-3 + checkpointing"].peak
    assert z3 < c["ZeRO-2 + checkpointing"].peak < c["ZeRO-2"].peak
    layer = 12 * 5120**2 / 1 + 13 * 5120  # a GPT-3 13B layer, whole (dp only)
    assert lesson["gathered_layer"] == 2 * layer
    assert lesson["run_ahead"] == pytest.approx(z3 + 39 * 2 * layer)
    assert min(lesson["need"].values()) > 40  # more layers than the model has
    assert lesson["run_ahead"] < 1.2 * c["ZeRO-2 + checkpointing"].peak


def test_minipar_plan_answers_the_question(lesson):
    assert lesson["plan_status"] == 0
    out = lesson["plan_out"].getvalue()
    assert out.startswith("minipar plan: Llama 3 70B") and "  3. " in out and "  4. " not in out
    best, answer = lesson["best"], lesson["answer10"]
    assert f"  1. {best.layout}" in out
    plans = lesson["plans"]
    first = next(i for i, p in enumerate(plans) if (p.layout.tp, p.layout.pp) == (8, 8))
    assert answer["rank"] == first + 1 and answer["rank"] > 3
    assert answer["tokens_per_second"] == pytest.approx(1024 * S / answer["seconds"])
    assert len(lesson["refused"]) == 2 and all(lay.recompute == "none" for lay in lesson["refused"])
    assert answer["slower"] == pytest.approx(answer["seconds"] / best.time.seconds - 1)


def test_the_validation_rows(lesson):
    for key, (seconds, published, error) in lesson["table5"].items():
        assert error == pytest.approx(seconds / published - 1) and abs(error) < 0.09, key
    assert lesson["check_flops"] == pytest.approx(
        72 * 64 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288)))


# ---- the exercises ---------------------------------------------------------------------
# That the solution passes, the generated exercise is all todo and every corpus case is
# graded as it says is checked for every lesson at once (tests/test_course.py,
# tests/course/test_corpus.py); here, what this lesson's corpus must hold.
def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"10.1", "10.2", "10.3"}
    assert len(wrong) >= 12 and len(right) >= 1
