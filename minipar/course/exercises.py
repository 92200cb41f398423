"""exercise.py = solution.py with every answer replaced by a NotImplementedError.

In solution.py an answer sits between two marker comments at the same indentation:

    def ring_all_reduce(x):
        # BEGIN SOLUTION Exercise 1.3: all-reduce as reduce-scatter + all-gather — see lesson.py, section 4
        ...the answer...
        # END SOLUTION

and exercise.py gets, in its place,

        raise NotImplementedError("Exercise 1.3: all-reduce as reduce-scatter + all-gather — see lesson.py, section 4")

Everything else is copied as it is, so the learner's file has the same signatures,
docstrings and imports as the solution. `minipar lessons build` writes every lesson's
exercise.py; `--check` only compares (CI runs it: the committed exercises must be what the
solutions generate). An exercise.py that differs from the generated one may hold a
learner's answers: it is kept unless `force=True`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .catalog import Lesson, all_lessons

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<what>Exercise \d+\.\d+: .+)$")
END = re.compile(r"^(?P<indent>\s*)# END SOLUTION\s*$")
HEADER = ("# Your file for lesson {number}, generated from solution.py by `minipar lessons build`.\n"
          "# Replace each `raise NotImplementedError(...)` with your answer, then run\n"
          "# `minipar grade {number}`.\n")


def generate_exercise(solution: str, number: str = "NN", source: str = "solution.py") -> str:
    """The exercise text for a solution text (see the module docstring)."""
    out, open_at = [], None
    for i, line in enumerate(solution.splitlines(keepends=True), start=1):
        begin, end = BEGIN.match(line.rstrip("\n")), END.match(line.rstrip("\n"))
        if open_at is not None:
            if begin:
                raise ValueError(f"{source}:{i}: BEGIN SOLUTION inside the region opened at "
                                 f"line {open_at[0]}; close it with `# END SOLUTION` first")
            if end:
                if end["indent"] != open_at[1]["indent"]:
                    raise ValueError(f"{source}:{i}: END SOLUTION is indented "
                                     f"{len(end['indent'])} spaces, its BEGIN at line "
                                     f"{open_at[0]} {len(open_at[1]['indent'])}; align them")
                what = open_at[1]["what"].replace("\\", "\\\\").replace('"', '\\"')
                out.append(f'{open_at[1]["indent"]}raise NotImplementedError("{what}")\n')
                open_at = None
            continue
        if end:
            raise ValueError(f"{source}:{i}: END SOLUTION with no BEGIN SOLUTION before it")
        if begin:
            open_at = (i, begin)
            continue
        if "BEGIN SOLUTION" in line:
            raise ValueError(f"{source}:{i}: a BEGIN SOLUTION marker reads `# BEGIN SOLUTION "
                             "Exercise N.M: what to write — see lesson.py, section ...`")
        out.append(line)
    if open_at is not None:
        raise ValueError(f"{source}:{open_at[0]}: BEGIN SOLUTION is never closed; add "
                         "`# END SOLUTION` at the same indentation")
    return HEADER.format(number=number) + "".join(out)


def exercises_in(solution: str) -> list[str]:
    """The `Exercise N.M: ...` texts of a solution, in order."""
    return [m["what"] for m in (BEGIN.match(ln) for ln in solution.splitlines()) if m]


@dataclass
class BuildResult:
    lesson: Lesson
    status: str  # "unchanged" | "written" | "differs" (check) | "kept" (learner's edits)

    @property
    def ok(self) -> bool:
        return self.status in ("unchanged", "written")


def build_exercises(lessons: Optional[Iterable[Lesson]] = None, check: bool = False,
                    force: bool = False) -> list[BuildResult]:
    """Generate each lesson's exercise.py from its solution.py (check: compare only)."""
    results = []
    for lesson in (all_lessons() if lessons is None else lessons):
        src = lesson.path("solution")
        text = generate_exercise(src.read_text(encoding="utf-8"), lesson.number, str(src))
        target: Path = lesson.path("exercise")
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            results.append(BuildResult(lesson, "unchanged"))
        elif check:
            results.append(BuildResult(lesson, "differs"))
        elif current is not None and not force:
            results.append(BuildResult(lesson, "kept"))
        else:
            target.write_text(text, encoding="utf-8")
            results.append(BuildResult(lesson, "written"))
    return results
