"""Grading: run a lesson's checks on a learner's implementation and say what is wrong in the
learner's terms.

A grader (lessons/NN_topic/grader.py) is a module of checks. Each check is a function of
the implementation module, marked with the exercise it grades and usually driven by
hypothesis over a space of configurations:

    @exercise("1.3", "ring all-reduce from send/recv")
    @SETTINGS
    @given(world_size=st.integers(1, 5), n=st.integers(1, 7))
    def check_ring_all_reduce(impl, world_size, n):
        def program(ctx):
            x = asymmetric(ctx.rank, n)
            expect_close(impl.ring_all_reduce(x), mp.all_reduce(x), rank=ctx.rank,
                         what="ring_all_reduce(x)")
        on_ranks(program, world_size)

`grade(lesson, impl)` runs every check of the lesson on `impl` ("exercise", "solution" or a
path to any .py file) and reports each as passed, not implemented yet (the exercise still
raises NotImplementedError), failed (an expectation did not hold: which rank, what was
expected, what was received, and the smallest failing configuration hypothesis shrank the
failure to) or raised (the implementation crashed: the exception and where).

What a check states lives in expect.py (expect_close and its summaries of differences and
named ratios); how it runs the learner's code — on a 2-D mesh with an explicit group,
rendezvous sends, inputs copied and mutation named, the collectives that ran recorded —
in spmd.py. Both are re-exported here, so a grader imports from one place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from hypothesis import HealthCheck, Phase, settings

from .catalog import Lesson, find_lesson
from .expect import (GradeFailure, describe_ratio, expect_close, expect_equal, expect_keys,
                     expect_number, expect_within, learner)
from .schedules import read_schedule
from .spmd import (LAUNCH, Call, Spmd, calls, forbid_collectives, mesh_of,
                   on_mesh, on_ranks, rank_words, world_sizes)

#: what a grader imports from here: the runner's marks and settings, and (re-exported)
#: the expectations of expect.py, the SPMD harness of spmd.py and schedules.py's reader
__all__ = ["SETTINGS", "TIME_LIMIT", "exercise", "grade", "GradeReport", "Outcome",
           "load_implementation", "GradeFailure", "describe_ratio", "expect_close",
           "expect_equal", "expect_within", "expect_number", "expect_keys", "learner", "read_schedule", "LAUNCH", "Call", "Spmd", "calls",
           "forbid_collectives", "mesh_of", "on_mesh", "on_ranks", "rank_words", "world_sizes"]

#: what every check runs under: reproducible, no deadline, small; a failure is shrunk to
#: the smallest configuration (no "explain" phase: it reruns the check many times more)
SETTINGS = settings(max_examples=20, derandomize=True, deadline=None, database=None,
                    print_blob=False, suppress_health_check=list(HealthCheck),
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                    report_multiple_bugs=False)  # one failure, shrunk, not an ExceptionGroup


def exercise(number: str, title: str) -> Callable:
    """Mark a grader function as the check of exercise `number`."""
    def mark(fn: Callable) -> Callable:
        fn.exercise, fn.title = number, title
        return fn
    return mark


_counter = itertools.count()


def load_implementation(path: Union[str, Path]):
    """Import a .py file as a fresh module (a learner's exercise.py, a solution, any file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no implementation file at {path}")
    name = f"minipar_impl_{next(_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


class CheckTimeout(BaseException):
    """A check ran longer than its time limit (an endless loop in the implementation?).
    A BaseException, like KeyboardInterrupt, so that hypothesis stops instead of shrinking."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise CheckTimeout in the main thread after `seconds` (no limit off the main thread
    or where SIGALRM does not exist)."""
    usable = (seconds and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def checks_of(grader) -> list[Callable]:
    """The grader's checks, in the order the module defines them."""
    return [f for f in vars(grader).values() if callable(f) and hasattr(f, "exercise")]


@dataclass
class Outcome:
    exercise: str
    title: str
    status: str  # "passed" | "todo" | "failed" | "raised"
    message: str = ""


@dataclass
class GradeReport:
    lesson: Lesson
    implementation: Path
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.status == "passed" for o in self.outcomes)

    def summary(self) -> str:
        done = sum(o.status == "passed" for o in self.outcomes)
        return f"{done} of {len(self.outcomes)} exercises pass"


def _falsifying(exc: BaseException) -> str:
    """hypothesis's shrunk example, as `name=value, ...` without the implementation."""
    for note in getattr(exc, "__notes__", []):
        if note.startswith(("Falsifying example", "Failing test case")):  # old, new wording
            args = [ln.split("  #")[0].strip().rstrip(",") for ln in note.splitlines()[1:]]
            args = [a for a in args if a and a != ")" and not a.startswith(("impl=", "#"))]
            return ", ".join(args)
    return ""


def _where(exc: BaseException, impl_path: Path) -> str:
    """The last line of the learner's file in the traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == impl_path.resolve()]
    return f" (at {impl_path.name}:{frames[-1].lineno}: {frames[-1].line})" if frames else ""


def _resolve(lesson: Lesson, impl: Union[str, Path]) -> Path:
    if str(impl) in ("exercise", "solution"):
        return lesson.path(str(impl))
    return Path(impl)


#: how long one check may run before it is stopped (`minipar grade --time-limit`)
TIME_LIMIT = 30.0


def grade(lesson: Union[str, Lesson], impl: Union[str, Path] = "exercise",
          out: Callable[[str], None] = print, seconds_per_check: float = TIME_LIMIT,
          only: Optional[Iterable[str]] = None, grader=None) -> GradeReport:
    """Run lesson's grader on `impl`; print each exercise's outcome through `out`. A check
    that runs longer than `seconds_per_check` is stopped and reported. only: grade these
    exercise numbers ("1.3", ...) and skip the others. grader: the lesson's grader module
    already loaded (the corpus grades many answers with one, keeping its cached references)."""
    lesson = lesson if isinstance(lesson, Lesson) else find_lesson(lesson)
    if not (isinstance(seconds_per_check, (int, float)) and seconds_per_check > 0):
        raise ValueError(f"seconds_per_check is a positive number of seconds, got "
                         f"{seconds_per_check!r}")
    path = _resolve(lesson, impl)
    grader = grader if grader is not None else load_implementation(lesson.path("grader"))
    module = load_implementation(path)
    report = GradeReport(lesson, path)
    checks = checks_of(grader)
    if only is not None:
        wanted = set(only)
        unknown = wanted - {c.exercise for c in checks}
        if unknown:
            raise KeyError(f"lesson {lesson.number} has no exercise {', '.join(sorted(unknown))}; "
                           f"its exercises are {', '.join(c.exercise for c in checks)}")
        checks = [c for c in checks if c.exercise in wanted]
    out(f"{lesson.title}: grading {path}")
    for check in checks:
        try:
            with time_limit(seconds_per_check):
                check(module)
            outcome = Outcome(check.exercise, check.title, "passed")
        except CheckTimeout as e:
            outcome = Outcome(check.exercise, check.title, "raised",
                              f"stopped: {e}{_where(e, path)}; is there a loop that never "
                              "ends, or a collective some rank never joins? (`minipar grade "
                              "--time-limit SECONDS` gives a check longer)")
        except NotImplementedError as e:
            outcome = Outcome(check.exercise, check.title, "todo", str(e))
        except AssertionError as e:
            config = _falsifying(e)
            notes = [n for n in getattr(e, "__notes__", []) if n.startswith("(raised on ")]
            msg = str(e) + (f"\n    {notes[0]}" if notes else "")
            if config:
                msg += f"\n    smallest failing configuration: {config}"
            outcome = Outcome(check.exercise, check.title, "failed", msg)
        except Exception as e:  # the implementation crashed
            config = _falsifying(e)
            msg = f"raised {type(e).__name__}: {e}{_where(e, path)}"
            if config:
                msg += f"\n    smallest failing configuration: {config}"
            outcome = Outcome(check.exercise, check.title, "raised", msg)
        report.outcomes.append(outcome)
        mark = {"passed": "ok  ", "todo": "todo", "failed": "FAIL", "raised": "FAIL"}
        out(f"  [{mark[outcome.status]}] Exercise {outcome.exercise}: {outcome.title}")
        if outcome.status == "todo":
            out("         not implemented yet: replace the `raise NotImplementedError` in "
                f"{path.name}")
        elif outcome.message:
            out("         " + outcome.message.replace("\n", "\n         "))
    out(report.summary())
    return report
