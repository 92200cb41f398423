"""Lesson 03's numbers, as the lesson computes them, against formulas written out here; and
Exercise 3.4's budget, as its grader runs plans: the obvious single levers miss it."""


import numpy as np
import pytest

from minipar.course.catalog import find_lesson
from minipar.course.grading import load_implementation
from minipar.plan import dp_comm_elements, model_state_bytes

LESSON = find_lesson("03")


@pytest.fixture(scope="module")
def lesson(run_lesson) -> dict:
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def test_section_2_the_zero1_step_by_hand_is_the_one_device_step_at_ddps_traffic(lesson):
    psi, n, padded = lesson["psi"], 4, 12  # section 2: Ψ = 10 on 4 ranks pads to 12
    assert lesson["padded"] == padded
    for w, state, sent in lesson["res"]:
        assert np.array_equal(w, lesson["one_device"])  # bit for bit
        assert state == 2 * 8 * padded // n  # m and v of a 3-element shard, float64
        assert sent["reduce_scatter"] == sent["all_gather"] == 8 * padded * (n - 1) / n
        assert sent["all_reduce"] == 8 * 2 * 10 * (n - 1) / n  # DDP's, unpadded
    assert lesson["one_device_state"] == 2 * 8 * 10


def test_section_3_the_ledger_holds_the_formulas_and_the_peaks_the_text_names(lesson):
    runs, psi, pad, n = lesson["runs"], lesson["psi"], lesson["pad"], lesson["n"]
    assert n == 3 and pad > 0  # a block does not divide by 3: padding is on show
    for stage, ranks in runs.items():
        formula = model_state_bytes(psi, stage, n, padding=pad if stage else 0)  # bf16 + Adam
        for r in ranks:
            assert r["held"] == {c: formula[c] for c in lesson["CATS"]}
    units = runs[1][0]["units"]
    root, block, shards = units[0][2], units[1][2], 2 * (psi + pad) // n
    assert runs[2][0]["peak"]["gradients"] == shards + 2 * root + 2 * 2 * block
    assert runs[3][0]["peak"]["parameters"] == shards + 2 * root + 2 * block


def test_section_4_zero3_sends_three_passes_less_the_roots_backward_gather(lesson):
    runs, psi, pad, n = lesson["runs"], lesson["psi"], lesson["pad"], lesson["n"]
    root = runs[1][0]["units"][0][2]
    for stage in (0, 1, 2):
        padding = pad if stage else 0
        assert runs[stage][0]["sent"] == pytest.approx(2 * 2 * (psi + padding) * (n - 1) / n,
                                                       rel=1e-12)
    zero3 = 2 * (3 * (psi + pad) - root) * (n - 1) / n
    assert runs[3][0]["sent"] == pytest.approx(zero3, rel=1e-12)
    assert 2 * dp_comm_elements(psi, 3, n, padding=pad) > runs[3][0]["sent"]
    assert 1.4 < runs[3][0]["sent"] / runs[0][0]["sent"] < 1.5  # "below 1.5 by the root"


def test_section_6_ddp_is_over_three_budgets_mostly_in_activations(lesson):
    peaks, peak, sent = lesson["ddp_peaks"], lesson["ddp_peak"], lesson["ddp_sent"]
    psi, n = lesson["psi6"], lesson["n6"]
    assert peak > 3 * lesson["budget"]
    assert max(peaks, key=peaks.get) == "activations"
    assert peaks["optimizer_states"] == 16 * psi and peaks["parameters"] == 8 * psi
    assert sent == pytest.approx(8 * 2 * psi * (n - 1) / n, rel=1e-12)
    assert sent <= lesson["traffic_budget"]


def test_section_6_accumulation_under_no_sync_keeps_whole_gradients_and_shards(lesson):
    psi, padded, n = lesson["psi6"], lesson["padded6"], lesson["n6"]
    (quiet, _, quiet_sent), (loud, _, loud_sent) = (lesson["accumulated"][True],
                                                    lesson["accumulated"][False])
    assert quiet["gradients"] == 8 * psi + 8 * padded // n  # whole gradients + shards
    assert loud["gradients"] < quiet["gradients"]
    k = 2
    assert quiet_sent == pytest.approx(lesson["traffic_budget"], rel=1e-12)
    assert loud_sent == pytest.approx(8 * (k + 1) * padded * (n - 1) / n, rel=1e-12)


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


@pytest.mark.parametrize("plan, over", [
    ({"stage": 0, "recompute": "full", "micro_batches": 8}, "memory"),  # activations only
    ({"stage": 1}, "memory"),  # model state only
    ({"stage": 3, "recompute": "full", "micro_batches": 8}, "traffic"),  # ZeRO-3's gathers
    ({"stage": 3, "recompute": "full", "micro_batches": 8, "no_sync": False}, "traffic"),
])
def test_exercise_3_4_one_lever_alone_misses_a_budget(grader, plan, over):
    n, batch = 2, 8
    ranks = grader.run_plan(grader.read_plan(plan, batch), n, batch)
    peak, sent = max(r["peak"] for r in ranks), max(r["sent"] for r in ranks)
    missed = {"memory": peak > grader.MEMORY_BUDGET,
              "traffic": sent > grader.traffic_budget(n) * (1 + 1e-12)}
    assert missed[over], (peak, sent)


def test_exercise_3_4_the_traffic_budget_is_one_all_reduce_of_the_padded_gradients(grader):
    for n in (2, 3, 4):
        ranks = grader.run_plan(grader.read_plan({"stage": 1}, 1), n, 1)
        assert all(r["sent"] == pytest.approx(grader.traffic_budget(n), rel=1e-12)
                   for r in ranks)


def test_exercise_3_4_is_graded_on_the_task_section_6_states(lesson, grader):
    assert lesson["cfg6"] == grader.CFG and lesson["budget"] == grader.MEMORY_BUDGET
    assert lesson["traffic_budget"] == grader.traffic_budget(lesson["n6"])
