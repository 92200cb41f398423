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


def test_read_schedule_refuses_each_malformed_answer_in_the_learners_terms():
    from minipar.course.grading import GradeFailure, read_schedule
    from minipar.parallel.pp import Action, B, F, W

    def read(got):
        return read_schedule(got, 2, what="gen(2, 1)", kinds=(F, B),
                             rule="rank {r} runs stage {r}'s F and B only")

    good = [[Action(0, F, 0), Action(0, B, 0)], [Action(1, F, 0), Action(1, B, 0)]]
    assert read(tuple(tuple(row) for row in good)) == good  # lists back, copies
    for got, says in ((None, "returned None, expected a list of p = 2 lists"),
                      (good[:1], "expected a list of p = 2 lists"),
                      ([good[0], "1F0"], "rank 1's list is '1F0', expected Actions"),
                      ([good[0], [Action(0, F, 0)]], "rank 1 runs 0F0; rank 1 runs stage 1's"),
                      ([good[0], [Action(1, W, 0)]], "rank 1 runs 1W0; rank 1 runs stage 1's")):
        with pytest.raises(GradeFailure, match=r"gen\(2, 1\)") as info:
            read(got)
        assert says in str(info.value), (says, str(info.value))
