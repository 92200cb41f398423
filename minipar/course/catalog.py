"""The lessons: lessons/NN_topic/ directories beside the package, each with

    lesson.py     the lesson, a jupytext py:percent file (prose in `# %% [markdown]` cells,
                  code that runs with plain `python` and opens as a notebook in Jupyter)
    solution.py   the exercises' answers, between `# BEGIN SOLUTION` / `# END SOLUTION`
    exercise.py   generated from solution.py by `minipar lessons build`: the learner's file
    grader.py     the checks `minipar grade NN` runs on an implementation

A lesson's title is its first markdown heading (`# # Lesson 03 — ZeRO and FSDP`) and its
summary the first line of prose after it. The directory is found beside the package
(a source checkout, installed with `pip install -e .`) or at $MINIPAR_LESSONS.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_DIR = re.compile(r"^(\d\d)_[a-z0-9_]+$")


def lessons_root() -> Path:
    """Where the lessons are: $MINIPAR_LESSONS, or lessons/ beside the minipar package."""
    env = os.environ.get("MINIPAR_LESSONS")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "lessons"
    if not root.is_dir():
        raise FileNotFoundError(
            f"no lessons directory at {root}: the course ships with the source checkout. "
            "Clone the repository and install it with `pip install -e .`, or point "
            "MINIPAR_LESSONS at its lessons/ directory")
    return root


@dataclass(frozen=True)
class Lesson:
    number: str  # "00", "01", ...
    directory: Path

    @property
    def name(self) -> str:
        return self.directory.name

    def path(self, which: str) -> Path:
        """lesson.py, solution.py, exercise.py or grader.py of this lesson."""
        return self.directory / f"{which}.py"

    @property
    def title(self) -> str:
        return _heading(self.path("lesson"))[0]

    @property
    def summary(self) -> str:
        return _heading(self.path("lesson"))[1]


def _heading(path: Path) -> tuple[str, str]:
    """(title, first line of prose) from the first markdown cell of a py:percent file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("# %% [markdown]"))
    except StopIteration:
        raise ValueError(f"{path}: no `# %% [markdown]` cell; a lesson opens with one "
                         "whose first line is `# # Lesson NN — Title`") from None
    title, summary = "", ""
    for ln in lines[start + 1:]:
        if ln.startswith("# %%"):
            break
        text = ln[2:].strip() if ln.startswith("# ") else ""
        if not title and text.startswith("# "):
            title = text[2:].strip()
        elif title and text:
            summary = text
            break
    if not title:
        raise ValueError(f"{path}: the first markdown cell has no `# # Lesson NN — Title` line")
    return title, summary


def all_lessons() -> list[Lesson]:
    """Every lessons/NN_topic directory, in order."""
    root = lessons_root()
    found = [Lesson(_DIR.match(d.name).group(1), d) for d in sorted(root.iterdir())
             if d.is_dir() and _DIR.match(d.name)]
    return found


def find_lesson(number: str) -> Lesson:
    """The lesson numbered `number` ("3", "03" or "03_zero")."""
    key = str(number).split("_")[0].zfill(2)
    lessons = all_lessons()
    for lesson in lessons:
        if lesson.number == key:
            return lesson
    raise KeyError(f"no lesson {number!r}; the lessons are "
                   f"{', '.join(l.number for l in lessons) or 'none'} (`minipar lessons`)")
