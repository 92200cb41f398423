"""The course's machinery: finding the lessons, generating exercises, grading answers.

    catalog.py    the lessons under lessons/NN_topic/: title, one-line summary, files
    exercises.py  exercise.py generated from solution.py (BEGIN/END SOLUTION regions)
    expect.py     what a check states: expect_close (differences summarised, constant
                  ratios named: 2×, ½, n×, 1/n), expect_equal, expect_within (budgets)
    spmd.py       how a check runs the learner's code: on_mesh (a 2-D mesh, an explicit
                  group, one rank vocabulary), rendezvous sends, calls (inputs copied,
                  mutation named, the collectives that ran recorded), world_sizes
    grading.py    `grade`, which runs a lesson's grader on any implementation and reports
                  in the learner's terms: which rank, what was expected, what was received,
                  and the smallest failing configuration hypothesis found
    corpus.py     the known wrong answers each grader must reject with its hint, and the
                  right alternatives it must accept (lessons/NN_topic/corpus.py)

The lessons themselves (lessons/, beside the package) import minipar and define no library
code: what they teach is what the library does.
"""

from .catalog import Lesson, all_lessons, find_lesson, lessons_root
from .exercises import BuildResult, build_exercises, generate_exercise
from .grading import (GradeFailure, GradeReport, exercise, expect_close, expect_equal, grade,
                      load_implementation, on_ranks)

__all__ = ["Lesson", "all_lessons", "find_lesson", "lessons_root", "BuildResult",
           "build_exercises", "generate_exercise", "GradeFailure", "GradeReport", "exercise",
           "expect_close", "expect_equal", "grade", "load_implementation", "on_ranks"]
