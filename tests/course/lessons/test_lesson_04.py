"""Lesson 04's numbers, as the lesson computes them, against hand-written formulas: the three
techniques called sequence parallelism, the overflow the softmax's max prevents, and the
design exercise's puzzle (the layout the lesson measures, and the budgets the grader uses)."""

import math

import numpy as np
import pytest

from minipar.course import find_lesson
from minipar.course.grading import load_implementation

LESSON = find_lesson("04")


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def test_the_three_sequence_parallelisms_send_what_their_collectives_cost(lesson):
    s, b, h, a, t = 16, 2, 32, 8, 4  # the lesson's shapes for the comparison
    S = s * b * h * 8  # the whole [s, b, h] activation in float64
    sent, held = lesson["sent"], lesson["held"]
    assert sent["Megatron-LM SP"] == 2 * (t - 1) / t * S  # all-gather + reduce-scatter
    assert sent["DeepSpeed-Ulysses"] == 4 * (t - 1) / t * S / t  # four all-to-alls
    assert sent["ring attention"] == (t - 1) * 2 * S / t  # K and V, t - 1 hops
    assert (sent["Megatron-LM SP"], sent["DeepSpeed-Ulysses"], sent["ring attention"]) == (
        1.5 * S, 0.75 * S, 1.5 * S)
    assert str((s, b, h)) in held["Megatron-LM SP"]  # attention sees every token
    assert str((s, b, a // t, h // a)) in held["DeepSpeed-Ulysses"]  # every token, a/t heads
    assert str((s // t, b, h)) in held["ring attention"]  # s/t of the queries


def test_exp_overflows_where_the_lesson_says_and_the_max_absorbs_a_shift(lesson):
    assert lesson["overflow"] == pytest.approx(
        {"float16": math.log(65504.0), "float32": math.log(3.4028234663852886e38),
         "float64": math.log(1.7976931348623157e308)}, rel=1e-12)
    assert [round(v, 1) for v in lesson["overflow"].values()] == [11.1, 88.7, 709.8]
    assert lesson["shifted"] == pytest.approx(lesson["loss"], rel=1e-12, abs=1e-12)
    assert lesson["unshifted"] == np.inf


def test_the_puzzle_is_the_graders_and_its_measured_layout_misses_the_memory_budget(lesson):
    grader = load_implementation(LESSON.path("grader"))
    first = grader.SCENARIOS[0]
    assert lesson["puzzle"] == first.cfg
    assert lesson["PUZZLE"] == {"global_batch": first.global_batch,
                                "activation_budget": first.activation_budget,
                                "tp_comm_budget": first.tp_comm_budget}
    assert lesson["cluster"] == first.topology
    # Table 2 in float64 (k = 8/2 = 4 times the 2-byte terms, 1-byte masks), tp = 4, b = 1:
    # sbh (8k + 2 + 24k/t) + (4k + 1) a s^2 b / t per layer, 2 layers
    s, h, a, t, k = 64, 64, 8, 4, 4
    per_layer = s * h * (8 * k + 2 + 24 * k / t) + (4 * k + 1) * a * s * s / t
    assert lesson["table2"] == 2 * per_layer == 753_664
    # the ledger holds more (embedding output, logits, loss), and over the budget
    assert lesson["table2"] < lesson["peak"] and lesson["peak"] > first.activation_budget
    assert 0 < lesson["comm"] < first.tp_comm_budget  # in one node: the time budget holds
