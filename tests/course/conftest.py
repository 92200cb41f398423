"""A lesson made in a test: lesson.py, solution.py and grader.py in a temporary directory."""

import pytest

from minipar.course.catalog import Lesson


@pytest.fixture
def make_lesson(tmp_path):
    """make_lesson(solution, grader) -> Lesson 99 in tmp_path/99_tiny."""
    def make(solution: str, grader: str) -> Lesson:
        d = tmp_path / "99_tiny"
        d.mkdir()
        (d / "lesson.py").write_text("# %% [markdown]\n# # Lesson 99 — Tiny\n#\n# One line.\n")
        (d / "solution.py").write_text(solution)
        (d / "grader.py").write_text(grader)
        return Lesson("99", d)
    return make
