"""Lesson 13's numbers, as the lesson computes them, against hand-written formulas and the
rules of the runs: a checkpoint's 14 bytes a parameter (measured in a file, and Llama 3's
sizes from its shape), the sharded files (one a rank, none holding the model), the
consolidated save's bound, the continued runs after a load at four layouts, Young's and
Daly's intervals with Llama 3's interruption rate, the loss a failure costs, the run
resumed at a smaller dp, the planner's recovery options, and the five failures — each run
and diagnosed as the lesson says. Then what this lesson's corpus must hold."""

import math

import pytest

from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps

LESSON = find_lesson("13")
DAY = 86400
# Llama 3 405B from its shape (Dubey et al. 2024): 126 layers, h 16384, 8 KV heads of 128,
# SwiGLU 53,248, V 128,256, untied
H, L, F, V, KV = 16384, 126, 53248, 128256, 8 * 128
PSI405 = L * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H) + 2 * V * H + H


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson run as a learner runs it: (its variables, what it printed)."""
    run = run_lesson(str(LESSON.path("lesson")))
    return run.names, run.stdout


def prose() -> str:
    """The lesson's text with comment marks and line breaks taken out."""
    lines = LESSON.path("lesson").read_text(encoding="utf-8").splitlines()
    return " ".join(" ".join(line.lstrip("#").split()) for line in lines)


def test_a_checkpoint_holds_14_bytes_a_parameter(lesson):
    names, printed = lesson
    params = names["BF16"].num_parameters()
    assert names["held"] == {"param": 2 * params, "m": 4 * params, "v": 4 * params,
                             "master": 4 * params, "step": 8}
    assert names["per_param16"] == 14 == names["w"] + names["k"]
    assert names["size"]["llama3-405b"] == PSI405 * 14
    assert names["save405"] == pytest.approx(PSI405 * 14 / 2e12, rel=1e-12)
    assert f"{PSI405 * 14 / 16384 / 1e6:,.0f} MB from each of 16,384 GPUs" in printed
    assert "5.7 TB for the 405B model, 347 MB a GPU" in prose()


def test_sharded_files_one_a_rank_and_none_holds_the_model(lesson):
    names, printed = lesson
    shards = names["shard_elems"]
    assert len(shards) == 8 and all(n.startswith("rank0000") for n in shards)
    # a flat unit's shard a dp rank; a tp rank's half, LayerNorms whole: about 1/8 each
    assert max(shards.values()) < names["CFG"].num_parameters() / 7
    sent = [r[1] for r in names["saved"]]
    assert max(s[0] for s in sent) < 0.05 * min(s[1] for s in sent[1:])  # nothing gathered
    assert names["one_rank"] == pytest.approx(PSI405 * 14 / 50e9, rel=1e-12)
    assert round(names["one_rank"]) == 114 and round(PSI405 * 14 / 80e9) == 71
    assert "At least 114 s and 71 devices' memory against 2.8 s" in prose()


def test_a_load_at_another_layout_continues_the_run(lesson):
    names, _ = lesson
    straight, resumed = names["straight"], names["resumed"]
    assert list(resumed["dp 2 x pp 2 x tp 2"]) == list(straight[2:])  # bit for bit
    for label in ("dp 4, ZeRO-2", "tp 2 x pp 2", "one device"):
        assert resumed[label] == pytest.approx(straight[2:], rel=1e-13, abs=0), label
    unit, S_new = names["unit"], names["S_new"]
    assert S_new == -(-unit["numel"] // 3) and names["S_old"] == -(-unit["numel"] // 2)


def test_young_and_daly_with_llama_3s_interruptions(lesson):
    names, printed = lesson
    M = 54 * DAY / 419
    assert names["M"] == M
    d = PSI405 * 14 / 2e12
    tau = math.sqrt(2 * d * M)
    delta, young, daly = names["interval"]["sharded"]
    assert (delta, young) == (pytest.approx(d, rel=1e-12), pytest.approx(tau, rel=1e-12))
    assert daly == pytest.approx(tau * (1 + math.sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d,
                                 rel=1e-12)
    over = d / tau + (tau + d) / (2 * M)
    assert f"overhead at Young {over:.2%}" in printed and f"{over:.1%}" == "2.3%"
    assert round(tau / 60, 1) == 4.2 and round(M / 3600, 2) == 3.09
    first = lambda t: d / t + t / (2 * M)  # noqa: E731 (the terms that depend on τ)
    assert first(2 * tau) / first(tau) == pytest.approx(1.25) == first(tau / 2) / first(tau)
    assert "twice or half Young's interval costs only a quarter more" in prose()
    d_c, y_c, _ = names["interval"]["consolidated"]
    over_c = d_c / y_c + (y_c + d_c) / (2 * M)
    assert d_c < y_c and 0.145 < over_c < 0.155 and d_c == names["one_rank"]
    lost = names["lost"]
    assert lost.mean() == pytest.approx((tau + d) / 2, rel=0.02)  # half a cycle
    r_max = (0.10 - over) * M / 60
    assert f"R <= {r_max:.0f} min" in printed and round(r_max) == 14


def test_the_run_resumed_at_a_smaller_dp_is_the_run_that_never_failed(lesson):
    names, printed = lesson
    assert "rank 5 raised InjectedFault: injected fault: rank 5 as step 3 begins" in printed
    assert names["last"].step == 2
    assert names["after"] == pytest.approx(names["never_failed"][2:], rel=1e-14, abs=0)
    assert names["B24"] // (3 * names["b"]) == 4 and names["B24"] // (4 * names["b"]) == 3


def test_dp_first_against_replanning(lesson):
    names, _ = lesson
    rec = names["recovery"]
    before, dp7, re = rec["before: dp 8"], rec["dp first: dp 7"], rec["replanned: pp 2, dp 15"]
    assert (before[0], dp7[0], re[0]) == (256, 224, 240)
    assert dp7[1] == pytest.approx(before[1] * 8 / 7, rel=1e-3)  # the optimizer shard: 1/dp
    assert round(dp7[5], 2) == 0.88 and round(re[5], 2) == 0.96
    assert re[2] > before[2] + 10 > dp7[2]
    text = prose()
    assert "keeps 88 % of the throughput" in text and "keep 96 %" in text
    assert f"({before[1]:.2f} to {dp7[1]:.2f} GiB)" in text


def test_a_skipped_collective_corrupts_then_hangs(lesson):
    names, printed = lesson
    assert names["entered"] == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4], 2: [1, 3, 4],
                                3: [1, 2, 3, 4]}
    # rank 2's step s + 1 meets the others' step s
    wrong = [300 * s + 0 + 1 + 3 + 100 * (s + 1) + 2 for s in (2, 3)]
    assert [float(x) for x in names["sums"][0]] == [406.0] + wrong
    assert "rank 2: finished (returned from its program)" in printed
    assert "not yet arrived: [2]" in printed and "(call #3 of that group)" in printed


def test_swapped_collectives_are_silent_with_equal_shapes_and_caught_otherwise(lesson):
    names, printed = lesson
    g, l_ = 1 + 2 + 3, 10 * (1 + 2 + 3)
    assert [(float(a), float(b)) for a, b, _ in names["same"]] == [
        (1 + 20 + 3, 10 + 2 + 30), (10 + 2 + 30, 1 + 20 + 3), (1 + 20 + 3, 10 + 2 + 30)]
    assert (g, l_) == (6, 60)
    wheres = [w for _, _, w in names["same"]]
    assert wheres[0] == wheres[2] != wheres[1]
    assert "collective mismatch on group world[0, 1, 2] at call #0" in printed
    assert "all_reduce(shape=(5,)" in printed


def test_an_unused_block_leaves_a_bucket_that_never_fires(lesson):
    _, printed = lesson
    assert "DDP's bucket" in printed and "never fired: unit(s) ['blocks.1']" in printed
    assert "find_unused_parameters=True" in printed


def test_the_straggler_is_the_rank_that_does_not_wait(lesson):
    names, _ = lesson
    T, extra = 0.2e12 / 989e12, 0.5 * 0.2e12 / 989e12
    ar = 2 * 3 * 1e-6 + 2 * 3 / 4 * 2**20 / 450e9  # a ring of 4 on NVLink
    steps = names["steps"]
    assert steps[:2] == pytest.approx([T + ar] * 2, rel=1e-9)
    assert steps[2:] == pytest.approx([T + extra + ar] * 2, rel=1e-9)
    waits = [names["strag"][r][1][2] for r in range(4)]
    assert waits[3] == 0 and waits[:3] == pytest.approx([extra] * 3, rel=1e-9)


def test_the_watchdog_names_the_stuck_rank_and_its_line(lesson):
    _, printed = lesson
    assert "rank 3: never arrived: running outside minipar, now at lesson.py:" in printed
    assert "in stuck; its last minipar call: all_reduce" in printed
    assert "Ranks that never arrived: [3]." in printed


# ---- the exercises ---------------------------------------------------------------------
# That the solution passes, the generated exercise is all todo and every corpus case is
# graded as it says is checked for every lesson at once (tests/test_course.py,
# tests/course/test_corpus.py); here, what this lesson's corpus must hold.
def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"13.1", "13.2", "13.3", "13.4"}
    assert len(wrong) >= 16 and len(right) >= 2
    titles = " ".join(w.title for w in wrong)
    for must in ("without the 2", "planned ones included", "numel // n",
                 "last rank to disagree"):
        assert must in titles
