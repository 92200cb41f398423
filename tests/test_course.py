"""The course stays honest: every lesson runs, every grader passes on the solution and fails
with NotImplementedError on the generated exercise, the committed exercises are what the
solutions generate, and lessons define no library code."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from minipar.cli import main
from minipar.course import all_lessons, build_exercises, find_lesson, generate_exercise, grade
from minipar.course.exercises import exercises_in
from minipar.course.grading import checks_of, expect_close, load_implementation, on_ranks

ROOT = Path(__file__).resolve().parents[1]
LESSONS = all_lessons()
IDS = [lesson.name for lesson in LESSONS]


def test_the_course_has_its_lessons():
    assert [lesson.number for lesson in LESSONS][:8] == ["00", "01", "02", "03", "04", "05",
                                                         "06", "07"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_lesson_runs_with_plain_python_in_under_10_seconds(lesson, run_lesson):
    """Under 10 s of the processor (user + system time of the lesson's process: what it
    costs, whatever else the machine runs; on a quiet machine that is its wall time),
    figures included: every lesson draws at least one, each a PNG in $MINIPAR_FIGURES
    whose path the lesson printed (without matplotlib, a line saying it was not drawn)."""
    run = run_lesson(str(lesson.path("lesson")))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "a lesson prints what it computes"
    assert run.cpu < 10, (f"{lesson.name} took {run.cpu:.1f} s of processor time ({run.wall:.1f} "
                          "s wall); lessons must run in under 10 s")
    printed = [ln[len("[figure: "):-1] for ln in run.stdout.splitlines()
               if ln.startswith("[figure: ") and ln.endswith("]")]
    written = sorted(run.figures.glob("*.png")) if run.figures.is_dir() else []
    # the paths it printed (relative to the root it ran in, or absolute) are what it wrote
    assert sorted(ROOT / p for p in printed) == written, (printed, written)
    if importlib.util.find_spec("matplotlib") is None:  # the lesson ran without it
        assert "[figure not drawn: " in run.stdout
        return
    assert written, f"{lesson.name} drew no figure"
    for png in written:
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 2000, png
        assert png.stem.startswith(f"{lesson.number}_"), f"{png.name}: {lesson.number}_..."


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_lesson_is_a_jupytext_percent_file_with_exercises_and_a_summary(lesson):
    text = lesson.path("lesson").read_text(encoding="utf-8")
    assert text.startswith("# ---\n# jupyter:\n#   jupytext:\n")
    assert "format_name: percent" in text.split("# ---", 2)[1]
    assert lesson.title.startswith(f"Lesson {lesson.number} — ") and lesson.summary
    markdown = [c for c in text.split("# %%") if c.startswith(" [markdown]")]
    headings = [ln for c in markdown for ln in c.splitlines() if ln.startswith("# ## ")]
    assert "# ## Exercises" in headings and headings[-1] == "# ## Summary"
    assert "Out[" not in text and "execution_count" not in text  # no stored outputs


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_lessons_define_no_library_code(lesson):
    """The only functions a lesson defines are SPMD programs for mp.launch (first argument
    ctx); it defines no classes. What it teaches is what minipar does."""
    tree = ast.parse(lesson.path("lesson").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        assert fn.args.args and fn.args.args[0].arg == "ctx", (
            f"{lesson.name}: {fn.name}() is not a program for mp.launch; lessons import "
            "minipar and define no library code")


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_exercise_has_a_check_and_every_check_an_exercise(lesson):
    solution = lesson.path("solution").read_text(encoding="utf-8")
    marked = [w.split(":")[0].removeprefix("Exercise ") for w in exercises_in(solution)]
    checks = [c.exercise for c in checks_of(load_implementation(lesson.path("grader")))]
    assert len(set(checks)) >= 2, "each lesson has at least two graded exercises"
    assert sorted(set(marked)) == sorted(checks)
    assert all(m.startswith(f"{int(lesson.number)}.") for m in marked)
    for what in exercises_in(solution):
        assert "— see lesson.py, section" in what, what


@pytest.mark.timeout(240)
@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_grader_passes_on_the_solution(lesson):
    lines = []
    report = grade(lesson, "solution", out=lines.append)
    assert report.passed, "\n".join(lines)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_grader_fails_with_not_implemented_on_the_exercise(lesson):
    report = grade(lesson, "exercise", out=lambda line: None)
    assert report.outcomes and all(o.status == "todo" for o in report.outcomes), [
        (o.exercise, o.status, o.message) for o in report.outcomes]
    for o in report.outcomes:
        assert o.message.startswith(f"Exercise {o.exercise}: ")


def test_the_committed_exercises_are_what_the_solutions_generate():
    results = build_exercises(check=True)
    assert [r.status for r in results] == ["unchanged"] * len(LESSONS), [
        (r.lesson.name, r.status) for r in results]
    assert main(["lessons", "build", "--check"]) == 0


# ---- the machinery, on made-up lessons ------------------------------------------------
SOLUTION = '''"""doc"""
import numpy as np


def f(x):
    """Double it."""
    # BEGIN SOLUTION Exercise 9.1: double x — see lesson.py, section 2
    y = 2 * x
    return y
    # END SOLUTION


class K:
    def g(self):
        # BEGIN SOLUTION Exercise 9.2: say "hi" — see lesson.py, section 3
        return "hi"
        # END SOLUTION
'''


def test_generate_replaces_each_region_with_its_not_implemented_error():
    text = generate_exercise(SOLUTION, "09")
    assert "minipar grade 09" in text.splitlines()[2]
    body = text.split("\n", 3)[3]
    assert body == SOLUTION.replace(
        '    # BEGIN SOLUTION Exercise 9.1: double x — see lesson.py, section 2\n'
        '    y = 2 * x\n    return y\n    # END SOLUTION\n',
        '    raise NotImplementedError("Exercise 9.1: double x — see lesson.py, section 2")\n'
    ).replace(
        '        # BEGIN SOLUTION Exercise 9.2: say "hi" — see lesson.py, section 3\n'
        '        return "hi"\n        # END SOLUTION\n',
        '        raise NotImplementedError("Exercise 9.2: say \\"hi\\" — see lesson.py, '
        'section 3")\n')
    ns = {}
    exec(compile(text, "exercise.py", "exec"), ns)
    with pytest.raises(NotImplementedError, match=r'Exercise 9.2: say "hi"'):
        ns["K"]().g()


@pytest.mark.parametrize("broken, match", [
    ("    # BEGIN SOLUTION Exercise 1.1: a — see x\n    pass\n", r"never closed"),
    ("    pass\n    # END SOLUTION\n", r"END SOLUTION with no BEGIN"),
    ("    # BEGIN SOLUTION Exercise 1.1: a\n  # END SOLUTION\n", r"indented 2 spaces"),
    ("    # BEGIN SOLUTION Exercise 1.1: a\n    # BEGIN SOLUTION Exercise 1.2: b\n",
     r"inside the region opened at line 1"),
    ("    # BEGIN SOLUTION\n", r"reads `# BEGIN SOLUTION Exercise N.M"),
])
def test_malformed_markers_are_refused_with_the_line(broken, match):
    with pytest.raises(ValueError, match=match):
        generate_exercise(broken, source="solution.py")


def test_build_keeps_a_learners_edited_exercise_unless_forced(tmp_path, monkeypatch):
    lesson_dir = tmp_path / "09_demo"
    lesson_dir.mkdir()
    (lesson_dir / "lesson.py").write_text("# %% [markdown]\n# # Lesson 09 — Demo\n#\n# One line.\n")
    (lesson_dir / "solution.py").write_text(SOLUTION)
    monkeypatch.setenv("MINIPAR_LESSONS", str(tmp_path))
    assert [r.status for r in build_exercises()] == ["written"]
    assert [r.status for r in build_exercises(check=True)] == ["unchanged"]
    (lesson_dir / "exercise.py").write_text("my answers\n")
    assert [r.status for r in build_exercises()] == ["kept"]
    assert (lesson_dir / "exercise.py").read_text() == "my answers\n"
    assert [r.status for r in build_exercises(check=True)] == ["differs"]
    assert main(["lessons", "build", "--check"]) == 1
    assert main(["lessons", "build", "--check", "09"]) == 1  # a number after the flag
    assert main(["lessons", "build", "--force", "9"]) == 0
    assert (lesson_dir / "exercise.py").read_text() != "my answers\n"
    (lesson_dir / "exercise.py").write_text("my answers\n")
    assert [r.status for r in build_exercises(force=True)] == ["written"]
    assert find_lesson("9").title == "Lesson 09 — Demo" and find_lesson("9").summary == "One line."


def test_the_lessons_command_lists_and_opens(capsys):
    assert main(["lessons"]) == 0
    out = capsys.readouterr().out
    for lesson in LESSONS:
        assert out.count(f"\n{lesson.number}  ") + out.startswith(f"{lesson.number}  ") == 1
    assert main(["lessons", "open", "1"]) == 0
    out = capsys.readouterr().out
    for which in ("lesson", "exercise", "solution", "grader"):
        assert str(find_lesson("01").path(which)) in out
    assert main(["lessons", "open", "77"]) == 2
    assert "no lesson '77'" in capsys.readouterr().err
    for bad, says in ((["lessons", "build", "--check", "x"], "expected a lesson number"),
                      (["lessons", "build", "--check", "01", "--bogus"], "unrecognized"),
                      (["grade", "01", "02"], "unrecognized arguments: 02")):
        with pytest.raises(SystemExit) as stop:
            main(bad)
        assert stop.value.code == 2 and says in capsys.readouterr().err


def test_grade_reports_rank_expected_received_and_the_smallest_case(tmp_path, capsys):
    """A wrong ring all-reduce, graded: the report names the exercise, the rank, both
    values and the configuration hypothesis shrank the failure to."""
    lesson = find_lesson("01")
    wrong = tmp_path / "wrong.py"
    wrong.write_text(lesson.path("solution").read_text().replace(
        "def ring_all_reduce(", "def _right(") + "\n\ndef ring_all_reduce(x, group=None):\n"
        "    import minipar as mp\n    return _right(x, group) + (mp.get_rank(group) == 1)\n")
    assert main(["grade", "01", "--impl", str(wrong)]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] Exercise 1.3" in out
    assert "tp rank 1 of 2 = global rank 1 of 4, the first tp group [0, 1]: " in out
    assert "expected [" in out and "but received [" in out
    assert "smallest failing configuration: n=2, shape=(3,), strided=False" in out
    assert main(["grade", "01", "--impl", "solution"]) == 0


def test_on_ranks_hands_back_the_learners_exception_with_its_rank():
    def program(ctx):
        expect_close(np.ones(2) * ctx.rank, np.ones(2), rank=ctx.rank, what="x")

    with pytest.raises(AssertionError, match=r"rank 0: x: expected") as info:
        on_ranks(program, 2)
    assert "(raised on rank 0 of 2)" in info.value.__notes__


def test_the_course_map_is_the_lessons():
    """docs/course.md's map: one row a lesson, in order; its reading time is the prose's
    words at 200 a minute, rounded up; its exercises are the solution's; the lessons it
    names as coming first are earlier ones."""
    import math
    import re

    from minipar.course.exercises import exercises_in
    text = (ROOT / "docs" / "course.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d\d) [^|]+\| ([^|]+) \| (\d+) min \| (\d+) \|", text, re.M)
    assert [r[0] for r in rows] == [lesson.number for lesson in LESSONS]
    for lesson, (number, after, minutes, exercises) in zip(LESSONS, rows):
        cells = lesson.path("lesson").read_text(encoding="utf-8").split("# %%")
        prose = " ".join(c for c in cells if c.startswith(" [markdown]"))
        words = [w for w in prose.replace("#", " ").split() if any(ch.isalpha() for ch in w)]
        assert int(minutes) == math.ceil(len(words) / 200), (number, len(words))
        solution = lesson.path("solution").read_text(encoding="utf-8")
        # one exercise may fill several functions (a region each): count the exercises
        assert int(exercises) == len({e.split(":")[0] for e in exercises_in(solution)}), number
        needs = [] if after.strip() == "—" else [n.strip() for n in after.split(",")]
        assert all(n < number for n in needs), (number, needs)


def test_every_section_the_checklist_table_names_exists():
    """docs/course.md's table of the tuning checklist and incidents: each 'lesson NN §k'
    (and '§k–m', 'and §k') names a numbered section '# ## k.' of that lesson."""
    import re
    text = (ROOT / "docs" / "course.md").read_text(encoding="utf-8")
    table = text.split("## Where the tuning checklist", 1)[1].split("\n## ", 1)[0]
    named = 0
    for number, sections in re.findall(r"lesson (\d\d)((?: §\d+(?:–\d+)?(?: and)?)*)", table):
        if not sections:  # a whole lesson, or one still to be written
            continue
        lesson = find_lesson(number)
        heads = re.findall(r"^# ## (\d+)\.", lesson.path("lesson").read_text(encoding="utf-8"),
                           re.M)
        for lo, hi in re.findall(r"§(\d+)(?:–(\d+))?", sections):
            for k in range(int(lo), int(hi or lo) + 1):
                assert str(k) in heads, f"lesson {number} has no section {k}"
                named += 1
    assert named >= 25
