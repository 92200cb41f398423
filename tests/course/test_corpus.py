"""Every lesson's corpus of known answers: each wrong answer fails with its hint, each right
alternative passes, and no exercise lacks a misconception or a small-only wrong answer.
The corpus machinery itself is tested on a lesson made here."""

from __future__ import annotations

import textwrap

import pytest

from minipar.course import all_lessons
from minipar.course.corpus import (corpus_of, gaps, patched, right, run_case, run_corpus,
                                   touched, wrong)

LESSONS = all_lessons()
CASES = [pytest.param(lesson, case, id=f"{lesson.number}:{getattr(case, 'exercise', 'right')}:"
                      f"{case.title}")
         for lesson in LESSONS for case in sum(corpus_of(lesson), [])]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lesson, case", CASES)
def test_a_known_answer_is_graded_as_it_should(lesson, case, tmp_path):
    result = run_case(lesson, case, tmp_path)
    assert result.ok, f"{result.problem}; the report was:\n{result.report}"


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.number for lesson in LESSONS])
def test_every_exercise_has_both_kinds_of_wrong_answer_and_the_lesson_a_right_one(lesson):
    assert gaps(lesson, *corpus_of(lesson)) == []


# the wrong answers issue 12 found passing or misdiagnosed, each with the words of the
# diagnosis it must now get: (lesson, exercise, title, words its hints must include)
REQUIRED = [
    ("03", "3.1", "ignores `group`: the world's rank, size and collectives", "not over `group`"),
    ("03", "3.1", "the group's size but the global rank", "not its global rank"),
    ("01", "1.1", "a blocking send before the recv around the ring", "raised DeadlockError"),
    ("01", "1.2", "a blocking send before the recv around the ring", "raised DeadlockError"),
    ("01", "1.3", "calls mp.all_reduce instead of building it from 1.1 and 1.2",
     "called the built-in all_reduce"),
    ("04", "4.3", "no max subtracted: right while exp does not overflow",
     "exp overflows past 709.8"),
    ("03", "3.1", "updates the weights in place, in flat_params", "wrote into its input"),
    ("02", "2.4", "never leaves no_sync(), so nothing is all-reduced", "no all-reduce ran"),
    ("04", "4.3", "the vocabulary offset from the global rank", "not its global rank"),
    ("02", "2.1", "sums the gradients instead of averaging them",
     "received = 2× expected everywhere"),
    ("01", "1.1", "a schedule worked out on 2 ranks: always send the next chunk", "n=3"),
    ("02", "2.1", "hard-coded for 2 ranks: the sum divided by 2", "size=3"),
]


@pytest.mark.parametrize("lesson, exercise, title, words", REQUIRED,
                         ids=[f"{r[0]}:{r[1]}:{r[2]}" for r in REQUIRED])
def test_the_wrong_answers_the_review_found_are_in_the_corpus(lesson, exercise, title, words):
    wrongs, _ = corpus_of(next(le for le in LESSONS if le.number == lesson))
    found = [w for w in wrongs if w.exercise == exercise and w.title == title]
    assert found, f"lesson {lesson}'s corpus lost the wrong answer {title!r} of {exercise}"
    assert words and words in " ".join(found[0].hint)


# -- the machinery, on a lesson of one exercise -----------------------------------------

SOLUTION = '''\
def double(x):
    """2x."""
    # BEGIN SOLUTION Exercise 9.1: double it — see lesson.py, section 1
    return 2 * x
    # END SOLUTION
'''
GRADER = '''\
from hypothesis import given, strategies as st
from minipar.course.grading import SETTINGS, exercise, expect_close

@exercise("9.1", "double it")
@SETTINGS
@given(x=st.integers(-5, 5))
def check_double(impl, x):
    expect_close(impl.double(float(x)), 2.0 * x, what=f"double({x})",
                 ratios={"1/2": "returned x, not doubled"})
'''


@pytest.fixture
def tiny_lesson(make_lesson):
    return make_lesson(SOLUTION, GRADER)


def test_a_wrong_answer_with_its_hint_holds(tiny_lesson, tmp_path):
    case = wrong("9.1", "misconception", "forgets to double", old="2 * x", new="x",
                 hint=["received = ½ expected everywhere: returned x, not doubled",
                       "smallest failing configuration: x=1"])
    result = run_case(tiny_lesson, case, tmp_path)
    assert result.ok, result.report


def test_a_wrong_answer_that_passes_or_lacks_its_hint_does_not_hold(tiny_lesson, tmp_path):
    passes = wrong("9.1", "small-only", "x + x", old="2 * x", new="x + x", hint=["anything"])
    result = run_case(tiny_lesson, passes, tmp_path)
    assert not result.ok and "were reported passed" in result.problem
    no_hint = wrong("9.1", "misconception", "triples", old="2 * x", new="3 * x",
                    hint=["returned x, not doubled"])
    result = run_case(tiny_lesson, no_hint, tmp_path)
    assert not result.ok and "without the hint 'returned x, not doubled'" in result.problem


def test_a_right_answer_must_pass(tiny_lesson, tmp_path):
    assert run_case(tiny_lesson, right("x + x", old="2 * x", new="x + x"), tmp_path).ok
    assert not run_case(tiny_lesson, right("off by one", old="2 * x", new="2 * x + 1"),
                        tmp_path).ok


def test_patches_must_match_exactly_once_and_be_well_formed(tiny_lesson):
    with pytest.raises(ValueError, match="occurs 0 times"):
        patched(SOLUTION, right("nope", old="3 * x", new="x"))
    with pytest.raises(ValueError, match="occurs 2 times"):
        patched(SOLUTION + "# 2 * x\n", right("twice", old="2 * x", new="x"))
    with pytest.raises(ValueError, match="kind is one of"):
        wrong("9.1", "typo", "t", old="a", new="b", hint=["h"])
    with pytest.raises(ValueError, match="hint is a non-empty list"):
        wrong("9.1", "misconception", "t", old="a", new="b", hint="h")
    with pytest.raises(ValueError, match="give old= and new="):
        right("t", old="a")
    with pytest.raises(ValueError, match="different new text"):
        right("t", old="a", new="a")


def test_gaps_name_what_the_corpus_lacks(tiny_lesson):
    only = [wrong("9.1", "misconception", "halves", old="2 * x", new="x / 2", hint=["h"]),
            wrong("9.2", "small-only", "elsewhere", old="2 * x", new="x", hint=["h"])]
    assert gaps(tiny_lesson, only, []) == [
        "exercise 9.1 has no 'small-only' wrong answer",
        "'elsewhere' is for exercise 9.2, which lesson 99 does not have",
        "lesson 99 has no right alternative solution"]
    assert textwrap.dedent(SOLUTION)  # the fixture's solution is what the cases patch


def test_the_corpus_command_reports_a_stale_patch_as_that_case(tiny_lesson, tmp_path):
    (tiny_lesson.directory / "corpus.py").write_text(
        "from minipar.course.corpus import right, wrong\n"
        "WRONG = [wrong('9.1', 'misconception', 'stale', old='4 * x', new='x', hint=['h'])]\n"
        "RIGHT = [right('x + x', old='2 * x', new='x + x')]\n")
    lines: list[str] = []
    results = run_corpus(tiny_lesson, tmp_path, out=lines.append)
    assert [r.ok for r in results] == [False, True]
    assert lines[0] == "  [FAIL] 9.1 misconception: stale"
    assert "its old text occurs 0 times in solution.py" in lines[1]


def test_a_right_case_grades_the_exercises_it_changes():
    two = SOLUTION + SOLUTION.replace("double", "triple").replace("9.1", "9.2").replace(
        "2 * x", "3 * x")
    assert touched(two, two.replace("return 3 * x", "return x + x + x")) == ["9.2"]
    assert touched(two, two.replace('"""2x."""', '"""Twice x."""')) is None  # outside
    assert touched(two, two.replace("return 2 * x", "return x + x").replace(
        "return 3 * x", "return x * 3")) == ["9.1", "9.2"]
