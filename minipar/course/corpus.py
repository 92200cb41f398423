"""The corpus of known answers: wrong ones a grader must reject with the intended hint, and
right alternatives it must accept. A grader is only as good as the wrong answers it rejects.

Each lesson keeps lessons/NN_topic/corpus.py:

    from minipar.course.corpus import right, wrong

    WRONG = [
        wrong("1.1", "misconception", "a blocking send before the recv around the ring",
              old="...text that occurs once in solution.py...", new="...what a learner writes...",
              hint=["raised DeadlockError", "alternate by parity"], also={"1.3"}),
        wrong("1.1", "small-only", "right on 2 ranks only", edits=[(old1, new1), (old2, new2)],
              hint=[...]),
    ]
    RIGHT = [right("a ring that alternates send and recv by parity", old=..., new=...)]

A case is a patch of solution.py: one or more exact replacements, each of text that occurs
exactly once. A wrong case must make its exercise, and every exercise in `also`, fail (be
reported failed or raised), and every string of `hint` must be in its exercise's report.
Kinds: "misconception" — a common wrong idea — and "small-only" — right on small sizes but
wrong in general; every exercise needs one of each. A right case is another correct
solution: the whole lesson must pass with it. `minipar lessons corpus NN` runs the cases;
CI runs every lesson's (tests/course/test_corpus.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from .catalog import Lesson
from .exercises import exercises_in
from .grading import GradeReport, grade

KINDS = ("misconception", "small-only")
Edits = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Wrong:
    """A wrong answer: `edits` to solution.py make `exercise` (and `also`) fail with `hint`."""

    exercise: str
    kind: str
    title: str
    edits: Edits
    hint: tuple[str, ...]
    also: frozenset[str] = frozenset()

    @property
    def failing(self) -> set[str]:
        return {self.exercise, *self.also}


@dataclass(frozen=True)
class Right:
    """A right alternative: `edits` to solution.py with which every exercise passes."""

    title: str
    edits: Edits


def _edits(what: str, old: Optional[str], new: Optional[str],
           edits: Optional[Iterable[tuple[str, str]]]) -> Edits:
    if (old is None) != (new is None) or (old is None) == (edits is None):
        raise ValueError(f"{what}: give old= and new= (one replacement) or edits=[(old, new), "
                         "...], not both")
    pairs = ((old, new),) if edits is None else tuple((o, n) for o, n in edits)
    if not pairs or any(not isinstance(o, str) or not isinstance(n, str) or not o or o == n
                        for o, n in pairs):
        raise ValueError(f"{what}: every edit is (old, new): non-empty old text and a "
                         "different new text")
    return pairs


def wrong(exercise: str, kind: str, title: str, old: Optional[str] = None,
          new: Optional[str] = None, *, edits: Optional[Iterable[tuple[str, str]]] = None,
          hint: Sequence[str] = (), also: Iterable[str] = ()) -> Wrong:
    """A wrong answer of `exercise` (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"wrong answer {title!r}: kind is one of {KINDS}, got {kind!r}")
    if isinstance(hint, str) or not hint:
        raise ValueError(f"wrong answer {title!r}: hint is a non-empty list of strings the "
                         f"report must contain, got {hint!r}")
    return Wrong(exercise, kind, title, _edits(f"wrong answer {title!r}", old, new, edits),
                 tuple(hint), frozenset(also))


def right(title: str, old: Optional[str] = None, new: Optional[str] = None, *,
          edits: Optional[Iterable[tuple[str, str]]] = None) -> Right:
    """A right alternative solution of the lesson."""
    return Right(title, _edits(f"right answer {title!r}", old, new, edits))


def corpus_of(lesson: Lesson) -> tuple[list[Wrong], list[Right]]:
    """(WRONG, RIGHT) of lessons/NN_topic/corpus.py (empty lists if it has none)."""
    path = lesson.directory / "corpus.py"
    if not path.is_file():
        return [], []
    spec = importlib.util.spec_from_file_location(f"minipar_corpus_{lesson.number}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(getattr(module, "WRONG", [])), list(getattr(module, "RIGHT", []))


def patched(solution: str, case: Union[Wrong, Right]) -> str:
    """solution.py's text with the case's edits applied."""
    for old, new in case.edits:
        count = solution.count(old)
        if count != 1:
            raise ValueError(f"corpus case {case.title!r}: its old text occurs {count} times in "
                             f"solution.py (it must occur exactly once): {old[:120]!r}")
        solution = solution.replace(old, new)
    return solution


@dataclass
class CaseResult:
    case: Union[Wrong, Right]
    ok: bool
    problem: str  # why the case does not hold ("" when ok)
    report: str  # what grading printed

    @property
    def label(self) -> str:
        c = self.case
        return (f"{c.exercise} {c.kind}: {c.title}" if isinstance(c, Wrong)
                else f"right: {c.title}")


def run_case(lesson: Lesson, case: Union[Wrong, Right], directory: Path,
             seconds_per_check: float = 30.0) -> CaseResult:
    """Grade the patched solution (a wrong case: only its failing exercises) and say whether
    it did what the case claims."""
    text = patched(lesson.path("solution").read_text(encoding="utf-8"), case)
    stem = "answer_" + "".join(ch if ch.isalnum() else "_" for ch in case.title.lower())[:40]
    path = Path(directory) / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    lines: list[str] = []
    only = sorted(case.failing) if isinstance(case, Wrong) else None
    report = grade(lesson, path, out=lines.append, seconds_per_check=seconds_per_check,
                   only=only)
    shown = "\n".join(lines)
    return CaseResult(case, *_verdict(case, report), shown)


def _verdict(case: Union[Wrong, Right], report: GradeReport) -> tuple[bool, str]:
    if isinstance(case, Right):
        bad = [o.exercise for o in report.outcomes if o.status != "passed"]
        return (not bad, f"a right answer, but exercise(s) {', '.join(bad)} did not pass"
                if bad else "")
    status = {o.exercise: o for o in report.outcomes}
    passed = sorted(e for e in case.failing if status[e].status not in ("failed", "raised"))
    if passed:
        return False, (f"a wrong answer, but exercise(s) {', '.join(passed)} were reported "
                       f"{', '.join(status[e].status for e in passed)}")
    message = status[case.exercise].message
    missing = [h for h in case.hint if h not in message]
    if missing:
        return False, f"exercise {case.exercise} failed without the hint {missing[0]!r}"
    return True, ""


def run_corpus(lesson: Lesson, directory: Path, out: Callable[[str], None] = print
               ) -> list[CaseResult]:
    """Run every case of the lesson's corpus, printing one line each (and why one fails)."""
    wrongs, rights = corpus_of(lesson)
    results = []
    for case in [*wrongs, *rights]:
        try:
            result = run_case(lesson, case, directory)
        except ValueError as e:  # its patch no longer matches solution.py
            result = CaseResult(case, False, str(e), "")
        results.append(result)
        out(f"  [{'ok  ' if result.ok else 'FAIL'}] {result.label}")
        if not result.ok:
            out(f"         {result.problem}" + ("; the report was:" if result.report else ""))
            if result.report:
                out("           " + result.report.replace("\n", "\n           "))
    return results


def gaps(lesson: Lesson, wrongs: Sequence[Wrong], rights: Sequence[Right]) -> list[str]:
    """What the lesson's corpus lacks: a kind of wrong answer for an exercise, a right one."""
    numbers = sorted({w.split(":")[0].split()[1]
                      for w in exercises_in(lesson.path("solution").read_text(encoding="utf-8"))})
    missing = [f"exercise {e} has no {kind!r} wrong answer" for e in numbers for kind in KINDS
               if not any(w.exercise == e and w.kind == kind for w in wrongs)]
    missing += [f"{w.title!r} is for exercise {w.exercise}, which lesson {lesson.number} does "
                "not have" for w in wrongs if w.exercise not in numbers]
    if not rights:
        missing.append(f"lesson {lesson.number} has no right alternative solution")
    return missing
