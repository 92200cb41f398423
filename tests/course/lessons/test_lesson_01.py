"""Lesson 01's numbers: what the lesson computes with minipar, against arithmetic written out
here (the formula with the example's numbers in it), and Exercise 1.5's budget against
the simulated cluster it is graded on.
"""

from __future__ import annotations


import numpy as np
import pytest

import minipar as mp
from minipar.course import find_lesson
from minipar.course.grading import load_implementation

LESSON = find_lesson("01")
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU
MIB = 2**20


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson run as a learner runs it: (its variables, what it printed)."""
    run = run_lesson(str(LESSON.path("lesson")))
    return run.names, run.stdout


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


def prose() -> str:
    """The lesson's text with comment marks and line breaks taken out."""
    lines = LESSON.path("lesson").read_text(encoding="utf-8").splitlines()
    return " ".join(" ".join(line.lstrip("#").split()) for line in lines)


def test_the_ring_is_optimal_among_host_driven_all_reduces_only(lesson):
    names, printed = lesson
    S = 840 * 8
    assert names["S_small"] == S == 6720
    for n in range(2, 9):  # measured from the traces of the lesson's runs
        assert names["ring_sent"][n] == 2 * (n - 1) / n * S
        assert names["switch_sent"][n] == S  # each GPU sends its buffer once, whatever n
    assert names["ring_sent"][8] == 11760
    assert ("n = 8: 11,760 bytes per GPU around the ring, 6,720 through the switch "
            "(1.75x and 1.00x the buffer)") in printed
    text = prose()
    claim = text.index("Patarasuk and Yuan (2009) showed that no all-reduce")
    assert "host-driven" in text[claim:claim + 400]  # said where the claim is made
    assert "NVLink SHARP (NVLS" in text and "InfiniBand SHARP" in text
    assert "the least any host-driven all-reduce can" in text  # and in the summary


def test_the_design_exercise_states_the_budget_the_grader_checks(lesson, grader):
    names, printed = lesson
    assert names["BUDGET"] == grader.BUDGET == 55e-6
    assert names["BUCKET"] == grader.BUCKET == 2**20
    assert "**The budget: 55 us on the simulated clock**" in prose()
    S = 4 * MIB  # the bucket: 2^20 float32
    flat = 2 * 7 * IB_A + 2 * 7 / 8 * S / IB_B  # one ring of 8 at InfiniBand's pace
    assert names["t_flat"] == pytest.approx(flat, rel=1e-12)
    assert f"{flat * 1e6:,.2f} us, {flat / 55e-6:.1f}x the budget of 55.00 us" in printed
    assert f"over IB-NDR400: {(IB_A + S / IB_B) * 1e6:.2f} us" in printed
    assert flat > 55e-6 and IB_A + S / IB_B > 55e-6  # the bucket cannot cross IB whole
    assert f"a flat ring of 8 over two nodes takes {flat / 55e-6:.1f}x the 55 us budget" in prose()


def _time_on_the_cluster(fn, nodes=2, gpus=4, length=2**20):
    topology = mp.Topology.nodes(nodes, gpus_per_node=gpus)

    def program(ctx):
        grad = (100.0 * ctx.rank + np.arange(length) % 1000).astype(np.float32)
        t0 = ctx.clock.now
        out = fn(grad, topology)
        return out, ctx.clock.elapsed() - t0

    res = mp.launch(program, nodes * gpus, topology=topology, algorithm="ring")
    expected = sum(100.0 * r + np.arange(length) % 1000 for r in range(nodes * gpus))
    assert all(np.array_equal(out, expected) for out, _ in res)
    return max(t for _, t in res)


def test_the_budget_is_reachable_and_the_flat_ring_is_not_within_it():
    solution = load_implementation(LESSON.path("solution"))
    S, m, k = 4 * MIB, 4, 2
    in_node = (m - 1) * NV_A + (m - 1) / m * S / NV_B  # a reduce-scatter or all-gather
    across = 2 * (k - 1) * IB_A + 2 * (k - 1) / k * (S / m) / IB_B  # all-reduce of S/m
    t = _time_on_the_cluster(solution.all_reduce_across_nodes)
    assert t == pytest.approx(2 * in_node + across, rel=1e-12)  # 50.95 us
    assert t < 55e-6 < 1.1 * t  # within budget, by less than 10 %
    flat = _time_on_the_cluster(lambda grad, topology: mp.all_reduce(grad))
    assert flat == pytest.approx(2 * 7 * IB_A + 2 * 7 / 8 * S / IB_B, rel=1e-12)
