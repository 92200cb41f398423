"""grade's time limit and its `only=`: a check that never ends is stopped after the limit,
and a corpus case grades only the exercises it is about."""

from __future__ import annotations

import time

import pytest

from minipar.course.grading import grade

SOLUTION = '''\
def double(x):
    """2x."""
    # BEGIN SOLUTION Exercise 9.1: double it — see lesson.py, section 1
    return 2 * x
    # END SOLUTION


def triple(x):
    """3x."""
    # BEGIN SOLUTION Exercise 9.2: triple it — see lesson.py, section 1
    return 3 * x
    # END SOLUTION
'''
GRADER = '''\
from minipar.course.grading import exercise, expect_close

@exercise("9.1", "double it")
def check_double(impl):
    expect_close(impl.double(2.0), 4.0, what="double(2)")

@exercise("9.2", "triple it")
def check_triple(impl):
    expect_close(impl.triple(2.0), 6.0, what="triple(2)")
'''


@pytest.fixture
def tiny(make_lesson):
    return make_lesson(SOLUTION, GRADER)


@pytest.mark.timeout(30)
def test_a_check_that_never_ends_is_stopped_after_the_limit(tiny, tmp_path):
    endless = tmp_path / "endless.py"
    endless.write_text(SOLUTION.replace("    return 2 * x\n", "    while True:\n        x = x + 0\n"))
    lines: list[str] = []
    t0 = time.perf_counter()
    report = grade(tiny, endless, out=lines.append, seconds_per_check=0.5)
    took = time.perf_counter() - t0
    first, second = report.outcomes
    assert first.status == "raised" and second.status == "passed"
    assert first.message.startswith("stopped: still running after 0.5 s (at endless.py:")
    assert "--time-limit SECONDS" in first.message
    assert took < 10


def test_only_grades_the_exercises_named(tiny):
    report = grade(tiny, "solution", out=lambda s: None, only=["9.2"])
    assert [o.exercise for o in report.outcomes] == ["9.2"]
    with pytest.raises(KeyError, match="no exercise 9.7; its exercises are 9.1, 9.2"):
        grade(tiny, "solution", out=lambda s: None, only=["9.7"])
    with pytest.raises(ValueError, match="positive number of seconds"):
        grade(tiny, "solution", out=lambda s: None, seconds_per_check=0)
