"""Lesson 12's numbers, as the lesson computes them, against hand-written formulas: a block's
saved tensors one by one and Korthikanti et al.'s Table 2 at t = 2, the FLOPs of full and
selective recomputation from the trace, the selective trade at GPT-3 175B's shape, the
segments' peak on the ledger against (L/k − 1)·I + k·A and the best k, HFU/MFU from the
closed forms, the attention cores with and without FlashAttention, incident C's segments
of 2 under ZeRO-3, and the budget task's plans. Then the exercises: what this lesson's
corpus must hold."""

import math

import pytest

from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps

LESSON = find_lesson("12")
GiB, MiB = 2**30, 2**20


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def flops(B, s, l, h, V):
    """72 B s l h² (1 + s/(6h) + V/(12 l h)): a GPT step's model FLOPs."""
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def flops_full(B, s, l, h, V):
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def test_a_block_keeps_34sbh_plus_5as2b_tensor_by_tensor(lesson):
    s, b, h, a = 24, 2, 40, 4
    sbh, as2b = s * b * h, a * s * s * b
    want = [2 * sbh, 2 * sbh, 2 * as2b, as2b, 6 * sbh, 2 * as2b, 2 * sbh, sbh, 2 * sbh,
            2 * sbh, 8 * sbh, 8 * sbh, sbh]
    assert [x.nbytes for x in lesson["kept1"]] == want
    assert lesson["measured1"] == sbh * (34 + 5 * a * s / h) == 34 * sbh + 5 * as2b
    assert lesson["by_unit"] == {"sbh": 34, "as²b": 5}


def test_table_2_at_t_2_with_and_without_sequence_parallelism(lesson):
    s, b, h, a, t = 24, 2, 40, 4, 2
    sbh, core = s * b * h, 5 * a * s * s * b / t
    want = {(False, "none"): sbh * (10 + 24 / t) + core, (False, "selective"): sbh * (10 + 24 / t),
            (False, "full"): 2 * sbh, (True, "none"): sbh * 34 / t + core,
            (True, "selective"): sbh * 34 / t, (True, "full"): 2 * sbh / t}
    for key, (got, formula) in lesson["table2"].items():
        assert got == formula == want[key], key


def test_full_and_selective_recomputation_in_flops_and_bytes(lesson):
    B, s, l, h, V, a = 3, 16, 4, 32, 64, 2
    runs = lesson["runs2"]
    total = {m: r["forward"] + r["backward"] for m, r in runs.items()}
    assert total["none"] == pytest.approx(flops(B, s, l, h, V), rel=1e-12)
    assert total["full"] == pytest.approx(flops_full(B, s, l, h, V), rel=1e-12)
    assert total["selective"] - total["none"] == l * 2 * B * s * s * h  # Q Kᵀ once more
    assert runs["full"]["blocks"] / runs["none"]["blocks"] == pytest.approx(4 / 3, rel=1e-12)
    assert runs["none"]["forward"] == runs["selective"]["forward"] == runs["full"]["forward"]
    assert (runs["none"]["qk"], runs["selective"]["qk"], runs["full"]["qk"]) == (l, 2 * l, 2 * l)
    assert lesson["same2"] is True
    sbh, as2b = s * B * h, a * s * s * B
    assert runs["none"]["kept"] - runs["selective"]["kept"] == l * 5 * as2b  # the scores
    assert runs["selective"]["kept"] - runs["full"]["kept"] == l * 32 * sbh  # 34 − 2 a layer
    assert runs["full"]["peak"] > runs["full"]["kept"]  # the rerun, in the backward
    assert lesson["extra_selective"] == l * 2 * B * s * s * h


def test_the_selective_trade_at_gpt3_shape(lesson):
    L, h, a, V = 96, 12288, 96, 51200
    for s, row in lesson["trade"].items():
        assert row["saved"] == pytest.approx(5 * a * s / h / (34 + 5 * a * s / h), rel=1e-12)
        assert row["megatron"] == pytest.approx(4 * s * s * h * L / flops(1, s, L, h, V),
                                                rel=1e-12)
        assert row["minipar"] == pytest.approx(row["megatron"] / 2, rel=1e-12)
    assert lesson["trade"][2048]["saved"] > 0.7 > lesson["trade"][1024]["saved"]
    assert lesson["trade"][2048]["megatron"] < 0.01 < lesson["trade"][4096]["megatron"]
    assert 0.2 < lesson["trade"][131072]["megatron"] < 0.22  # "a fifth of the step"
    for i, s in enumerate(lesson["lengths"]):
        sbh = s * h
        assert lesson["per_layer"]["none"][i] * GiB == pytest.approx(
            sbh * (34 / 8 + 5 * a * s / (8 * h)), rel=1e-12)
        assert lesson["per_layer"]["selective"][i] * GiB == pytest.approx(34 * sbh / 8, rel=1e-12)
        assert lesson["per_layer"]["full"][i] * GiB == pytest.approx(2 * sbh / 8, rel=1e-12)
    assert 34 * h / (5 * a) == pytest.approx(870.4)  # where the s² term overtakes the 34


def peak_by_hand(L, k, A, I):
    """max over the segments m of m·I + k_m·A, the segments cut from the bottom."""
    sizes = [min(k, L - start) for start in range(0, L, k)]
    return max(m * I + size * A for m, size in enumerate(sizes))


def test_segments_on_the_ledger_and_the_best_k(lesson):
    L, s, h, a = 64, 8, 32, 2
    I = 2 * s * h  # b = 1, bf16
    A = 32 * s * h + 2 * a * s * s  # no dropout: 32sbh + 2as²b
    assert A / I == 16.5
    seg = lesson["segments4"]
    for k, r in seg.items():
        assert r["ledger"] == r["planned"], k
        assert r["blocks"] == peak_by_hand(L, k, A, I), k
        assert r["ledger"] - r["blocks"] == 16 * s  # the int64 ids and positions
        assert r["flops"] == pytest.approx(flops_full(1, s, L, h, 16), rel=1e-12), k
    assert seg[2]["blocks"] == (L / 2 - 1) * I + 2 * A == 64 * I
    assert seg[3]["blocks"] == 20 * I + 3 * A  # 21 segments of 3, then one of 1
    by_k = {k: peak_by_hand(L, k, A, I) for k in range(1, L + 1)}
    assert lesson["best4"] == min(by_k, key=lambda k: (by_k[k], k)) == 2
    assert math.sqrt(L * I / A) == pytest.approx(1.9695, abs=1e-4)
    assert min(peak_by_hand(L, k, I, I) for k in range(1, L + 1)) == peak_by_hand(L, 8, I, I) \
        == peak_by_hand(L, 6, I, I) == 15 * I  # a chain: √64, and 6 ties
    assert seg[8]["blocks"] == 139 * I and seg[64]["blocks"] == 64 * A


def test_hfu_over_mfu_is_a_property_of_the_shape(lesson):
    s, L, h, V = 2048, 96, 12288, 51200
    x = 1 + s / (6 * h)
    full = 4 / 3 * (x + V / (16 * L * h)) / (x + V / (12 * L * h))
    selective = 1 + s / (18 * h) / (x + V / (12 * L * h))
    assert lesson["ratio175"]["full"] == pytest.approx(full, rel=1e-12)
    assert lesson["ratio175"]["selective"] == pytest.approx(selective, rel=1e-12)
    m = lesson["mfu175"]
    for label, row in m.items():
        want = full if label.startswith("full") else selective if label.startswith("sel") else 1
        assert row["hfu"] / row["mfu"] == pytest.approx(want, rel=1e-9), label
    assert not m["none, SP"]["fits"] and m["full, no SP"]["fits"] and m["selective, SP"]["fits"]
    assert m["full, no SP"]["mfu"] == pytest.approx(0.395, abs=0.001)  # docs/planner.md
    assert m["selective, SP"]["mfu"] == pytest.approx(0.535, abs=0.001)
    assert abs(m["full, no SP"]["hfu"] - m["selective, SP"]["hfu"]) < 0.02
    assert 1.3 < m["full, no SP"]["seconds"] / m["selective, SP"]["seconds"] < 1.4


def test_flash_attention_is_selective_recomputation_inside_the_kernel(lesson):
    s, b, h, a = 24, 2, 40, 4
    sbh, as2b = s * b * h, a * s * s * b
    c = lesson["cores6"]
    assert c["stored scores"] == {"kept": 6 * sbh + 2 * as2b, "forward": 2, "backward": 4}
    assert c["selective"] == {"kept": 6 * sbh, "forward": 2, "backward": 5}
    assert c["FlashAttention"] == {"kept": 8 * sbh + 4 * a * s * b, "forward": 2, "backward": 5}
    for s70, row in lesson["flash6"].items():
        by = row["bytes"]
        assert by["flash"] == by["selective"] < by["stored"]
        sbh70 = s70 * 8192
        assert by["stored"] - by["selective"] == 64 * s70 * s70 / 8 * 2  # e·a s² b / t
        assert by["selective"] == pytest.approx(
            sbh70 * (4 * 2 / 8) + s70 * 2 * (2 * 8192 + 2 * 1024) / 8 + 3 * 2 * s70 * 28672 / 8)
        t = row["times"]
        assert t["none", True] < t["selective", True] < t["none", False] < t["selective", False]
    extra = {s70: r["times"]["selective", True] / r["times"]["none", True] - 1
             for s70, r in lesson["flash6"].items()}
    assert extra[8192] == pytest.approx(0.06, abs=0.005)
    assert extra[32768] == pytest.approx(0.157, abs=0.005)


def test_incident_c_segments_of_2_under_zero3(lesson):
    h, s, a = 64, 16, 4  # the incident's small model, b = 1, no dropout
    I, A = 2 * s * h, 32 * s * h + 2 * a * s * s
    W = 2 * (12 * h * h + 13 * h)  # one bf16 block, whole
    assert lesson["W7"] == W and lesson["A7"] == A == 17 * I
    assert lesson["change7"]["parameters"] == W
    assert lesson["change7"]["activations"] == A - 4 * I  # (8/2 − 1)I + 2A − (7I + A)
    h, s, a, L = 5120, 2048, 40, 40  # GPT-3 13B
    I, W = 2 * s * h, 2 * (12 * h * h + 13 * h)
    assert lesson["W13"] == W and lesson["I13"] == I
    stored, flash = (lesson["incident13"][k] for k in ("scores stored", "FlashAttention"))
    assert stored["A"] == 32 * s * h + 2 * a * s * s == 32 * I
    assert flash["A"] == 32 * s * h + 4 * a * s
    for row in (stored, flash):
        assert row["k2"] - row["k1"] == pytest.approx(row["A"] - 20 * I)  # (20 − 39)I + A
        assert row["z3_k2"] - row["z3_k1"] == pytest.approx(row["A"] + W - 20 * I)
        assert row["best_z3"] == 1 and row["k_star_z3"] < 1
        assert row["k_star_z3"] == pytest.approx(math.sqrt(L * I / (row["A"] + W)))
    assert (stored["k2"] - stored["k1"]) / MiB == pytest.approx(240)
    assert (flash["k2"] - flash["k1"]) / MiB == pytest.approx(-80, abs=0.5)
    assert stored["best"] == 1 and flash["best"] == 2
    assert (flash["z3_k2"] - flash["z3_k1"]) / MiB == pytest.approx(520, abs=2)


def test_the_budget_tasks_plans(lesson):
    b8, seg = lesson["budget8"], lesson["segments4"]
    assert b8["full"][0] == seg[1]["ledger"] and b8["segments of 2"][0] == seg[2]["ledger"]
    assert b8["segments of 2"][0] < 40_000 < b8["full"][0] < 60_000 < b8["selective"][0]
    assert b8["selective"][0] < b8["none"][0]
    assert b8["none"][1] == pytest.approx(flops(1, 8, 64, 32, 16), rel=1e-12)
    assert b8["selective"][1] - b8["none"][1] == 64 * 2 * 8 * 8 * 32
    assert b8["full"][1] == b8["segments of 2"][1] == pytest.approx(flops_full(1, 8, 64, 32, 16))
    assert 1 - b8["selective"][0] / b8["none"][0] == pytest.approx(0.03, abs=0.002)


# ---- the exercises ---------------------------------------------------------------------
# That the solution passes, the generated exercise is all todo and every corpus case is
# graded as it says is checked for every lesson at once (tests/test_course.py,
# tests/course/test_corpus.py); here, what this lesson's corpus must hold.
def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"12.1", "12.2", "12.3", "12.4"}
    assert len(wrong) >= 20 and len(right) >= 3
