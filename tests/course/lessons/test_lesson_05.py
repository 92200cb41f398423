"""Lesson 05's numbers, as the lesson computes them, against hand-written formulas: the naive
pipeline's idle share, GPipe's and 1F1B's bubble in both spellings and their micro-batches
in flight (the seed's two claims about 1F1B, as measured), torch's warm-up, blocking sends,
interleaving's bubble and messages, incident B, the 3-D composition and the design puzzle
(the plans the lesson measures against the grader's budgets, and both budgets
satisfiable)."""

import math
from fractions import Fraction

import pytest

from minipar.course import find_lesson
from minipar.course.grading import load_implementation
from minipar.parallel.pp import dry_run, lower, schedule

LESSON = find_lesson("05")
P = 4  # the lesson's pipeline


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


def test_the_naive_pipeline_talks_to_neighbours_only_and_idles_three_quarters(lesson):
    s, b, h = 8, 2, 16
    for r, got in enumerate(lesson["naive"]):
        peers = sorted(dst for (src, dst), n in got["sends"])
        assert all(src == r and n == s * b * h * 8 for (src, dst), n in got["sends"])
        assert peers == [q for q in (r - 1, r + 1) if 0 <= q < P]
    assert lesson["one_mb"].bubble_over_total == Fraction(P - 1, P)


def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_p_minus_r(lesson):
    m = 8
    assert lesson["gpipe_held"] == [m] * P  # from the ledger of a real run
    assert lesson["f1b_held"] == [min(P - r, m) for r in range(P)]
    first_b = lesson["first_b"]  # the backward wave starts at the last stage
    assert all(first_b[r] > first_b[r + 1] for r in range(P - 1))


def test_the_seeds_claims_about_1f1b_as_measured(lesson):
    """"1F1B compresses the bubble to a constant": GPipe's idle time is the same constant,
    and both bubbles are (p - 1)/m. "1F1B holds every micro-batch's activations": GPipe
    does, 1F1B holds min(p - r, m)."""
    t = 1 + 2  # t_F + t_B
    for m, got in lesson["claims"].items():
        for name in ("gpipe", "1f1b"):
            makespan, idle, bubble, _ = got[name]
            assert makespan == (m + P - 1) * t
            assert idle == (P - 1) * t
            assert bubble == Fraction(P - 1, m)
        assert got["gpipe"][3] == (m,) * P
        assert got["1f1b"][3] == tuple(min(P - r, m) for r in range(P))


def test_torchs_warm_up_is_megatrons_list_and_the_literal_reading_costs_a_micro_batch(lesson):
    m = 8
    assert lesson["torch_order"] == schedule("1f1b", P, m)
    for c, (mine, literal, held, literal_held) in lesson["torch_cost"].items():
        assert held == tuple(min(P - r, m) for r in range(P))
        assert literal_held == tuple(min(P - r + 1, m) for r in range(P))
        if c == 0:
            assert mine == literal == (m + P - 1) * 3
        else:  # the lesson says: with costly messages it ends a little sooner
            assert literal < mine


def test_blocking_sends_deadlock_1f1b_not_gpipe(lesson):
    assert lesson["blocking"]["gpipe"] == ["finished", "finished"]
    assert lesson["blocking"]["1f1b"].startswith("DeadlockError: rank 0: waiting in send(")


def test_interleaving_divides_the_bubble_by_v_for_the_messages_of_pv_stages(lesson):
    m = 8
    for v, (bubble, sends, _) in lesson["interleaved"].items():
        assert bubble == Fraction(P - 1, v * m)
        assert sends == 2 * m * (P * v - 1)
    assert lesson["interleaved"][1][2] == P  # 1F1B: rank 0 holds p micro-batches
    assert lesson["interleaved"][2][2] > P  # a longer warm-up holds more
    assert "microbatches must be a multiple of pp = 4, got 6" in lesson["refusal"]
    assert "use microbatches = 4 or 8" in lesson["refusal"]


def test_incident_b_numbers(lesson):
    p = 64
    cases = lesson["cases"]
    assert sorted(cases) == [4, 32, 66]
    for m, c in cases.items():
        assert c["over_ideal"] == pytest.approx((p - 1) / m, rel=1e-12)
        assert c["idle_share"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
        assert c["mfu_bound"] == pytest.approx(m / (m + p - 1), rel=1e-12)
        assert c["peak_in_flight"][0] == min(p, m)
    assert cases[4]["over_ideal"] == 15.75  # the seed's 1575 %, right as a ratio to ideal
    assert cases[32]["mfu_bound"] < 0.34 < 0.51  # 63 idle slots in 95: 51 % cannot hold
    assert lesson["implied"]["at 4"] == pytest.approx(0.28 * 67 / 4, rel=1e-12)
    assert lesson["implied"]["at 32"] == pytest.approx(0.51 * 95 / 32, rel=1e-12)
    r = 0.51 / 0.6
    assert lesson["at_60"] == math.ceil((p - 1) * r / (1 - r) - 1e-12) == 357
    assert 66 / (66 + 63) >= 0.51 > 65 / (65 + 63)  # 66 is the least m at 100 %
    assert lesson["inter"]["idle_share"] == pytest.approx(63 / (2 * 64 + 63), rel=1e-12)


def test_the_composed_run_equals_one_device_and_reduces_after_the_last_backward(lesson):
    blocks = lesson["blocks"]
    assert sorted(blocks) == [0, 1]
    assert sum(blocks.values()) / 2 == pytest.approx(lesson["loss_one"], rel=1e-12)
    for loss, last_b, starts, coord in lesson["composed"]:
        assert starts and min(starts) >= last_b  # the dp all-reduce after the last B


def test_the_puzzle_is_the_graders_and_the_lessons_plans_miss_as_it_says(lesson, grader):
    first = grader.SCENARIOS[0]
    assert lesson["puzzle"] == first.cfg
    assert lesson["PUZZLE"] == {"pp": first.pp, "global_batch": first.global_batch,
                                "bubble_target": first.bubble_target,
                                "activation_cap": first.activation_cap}
    bubble, peak, estimate = lesson["missed"]["gpipe"]  # meets the bubble, misses memory
    assert bubble == 3 / 32 <= first.bubble_target and peak > first.activation_cap
    bubble, peak, estimate = lesson["missed"]["1f1b"]  # m = 8 misses both
    assert bubble == 3 / 8 > first.bubble_target and peak > first.activation_cap
    # Table 2 in float64 without dropout (k = 4): 32k sbh + 2k a s^2 b a layer, one sequence
    s, h, a, k = 16, 16, 2, 4
    per_layer = 32 * k * s * h + 2 * k * a * s * s
    assert lesson["per_layer"] == per_layer == 36_864
    assert estimate == 4 * 2 * per_layer * 4  # 4 in flight on rank 0, 2 layers, b = 4
    assert estimate < peak < 1.01 * estimate  # the ledger counts a little more


@pytest.mark.parametrize("index, plan", [(0, ("1f1b", 16, 1)), (0, ("1f1b", 32, 1)),
                                         (1, ("interleaved_1f1b", 16, 2))])
def test_each_puzzle_has_a_plan_within_both_budgets(grader, index, plan):
    sc = grader.SCENARIOS[index]
    name, m, v = plan
    d = dry_run(lower(schedule(name, sc.pp, m, v)), {"F": Fraction(1, v), "B": Fraction(2, v)})
    assert d.bubble_over_ideal == Fraction(sc.pp - 1, v * m) <= sc.bubble_target
    assert max(grader.measure(sc, name, m, v)["peaks"]) <= sc.activation_cap


def test_the_second_puzzle_needs_interleaving(grader):
    """With 16 sequences, 1F1B's smallest bubble (m = 16) is 3/16 > 10 %."""
    sc = grader.SCENARIOS[1]
    assert Fraction(sc.pp - 1, sc.global_batch) > sc.bubble_target
