"""The course's machinery: finding the lessons, generating exercises, grading answers.

    catalog.py    the lessons under lessons/NN_topic/: title, one-line summary, files
    exercises.py  exercise.py generated from solution.py (BEGIN/END SOLUTION regions)
    grading.py    what graders use (expect_close, on_ranks, @exercise) and `grade`, which
                  runs a lesson's grader on any implementation and reports in the learner's
                  terms: which rank, what was expected, what was received, and the smallest
                  failing configuration hypothesis found

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
