"""`minipar lessons`: list the course, show where a lesson's files are, build exercises,
run the corpus of known answers."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from ..course import all_lessons, build_exercises, find_lesson
from ..course.corpus import corpus_of, gaps, run_corpus


def run(action: str, numbers: Sequence[str], check: bool = False, force: bool = False) -> int:
    """Do `action` (list, open or build) on lessons `numbers`; returns the exit status."""
    if action == "list":
        lessons = all_lessons()
        for lesson in lessons:
            print(f"{lesson.number}  {lesson.title.split(' — ', 1)[-1]:<34} {lesson.summary}")
        bank = lessons[0].directory.parent / "interview" / "bank.py" if lessons else None
        if bank is not None and bank.is_file():
            print(f"    {'Interview bank':<34} questions on the lessons, answers computed by "
                  f"minipar: python {bank}")
        print(f"\n{len(lessons)} lessons in {lessons[0].directory.parent if lessons else '-'}; "
              "`minipar lessons open NN` shows one's files, `minipar grade NN` grades "
              "your exercise.py")
        return 0
    if action == "open":
        if len(numbers) != 1:
            raise SystemExit("minipar lessons open: name one lesson, e.g. `minipar lessons "
                             "open 01`")
        lesson = find_lesson(numbers[0])
        print(f"{lesson.title}\n{lesson.summary}\n")
        for which, what in (("lesson", "read and run it: python {p}  (or open it in Jupyter "
                                       "with jupytext, or in VS Code as cells)"),
                            ("exercise", "your answers go here; then: minipar grade "
                                         f"{lesson.number}"),
                            ("solution", "the answers, when you want them"),
                            ("grader", "what `minipar grade` checks")):
            p = lesson.path(which)
            print(f"  {which + '.py':<12} {p}\n  {'':<12} {what.format(p=p)}")
        return 0
    if action == "corpus":
        return corpus([find_lesson(n) for n in numbers] or all_lessons())
    lessons = [find_lesson(n) for n in numbers] or None
    results = build_exercises(lessons, check=check, force=force)
    words = {"unchanged": "up to date", "written": "written",
             "differs": "differs from what solution.py generates",
             "kept": "kept: it differs from what solution.py generates and may hold your "
                     "answers (--force overwrites it)"}
    for r in results:
        print(f"{r.lesson.path('exercise')}: {words[r.status]}")
    return 0 if all(r.ok for r in results) else 1


def corpus(lessons) -> int:
    """Grade each lesson's known wrong and right answers; exit 1 if one does not hold or the
    corpus lacks a case it needs."""
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for lesson in lessons:
            wrongs, rights = corpus_of(lesson)
            print(f"{lesson.title}: {len(wrongs)} wrong and {len(rights)} right answers")
            results = run_corpus(lesson, Path(tmp), out=print)
            missing = gaps(lesson, wrongs, rights)
            for m in missing:
                print(f"  [gap ] {m}")
            ok = ok and all(r.ok for r in results) and not missing
    return 0 if ok else 1
