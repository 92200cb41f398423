"""What every interview question must satisfy, shared by tests/test_interview.py (lessons
00-10) and tests/test_interview_design.py (the open design questions); both load this file
by path, as they load the bank.

    bank = load(BANK_PATH, "name")         lessons/interview/bank.py, loaded by path
    values = LazyValues(by_id)            each question's values, computed when first asked,
                                          once per process (computed(q))
    check_shown(q, values)                every placeholder filled, every value shown
    check_worked(q, values)               a short worked answer: 2 to 9 sentences
    check_numbers(qid, values, expected)  every number equals its independent route
    check_distinct(q, values, allowed)    no two quantities print the same number by chance
"""

from __future__ import annotations

import collections
import fcntl
import importlib.util
import os
import pickle
import string
import sys
import tempfile
from pathlib import Path

import pytest


BANK_PATH = Path(__file__).resolve().parents[1] / "lessons" / "interview" / "bank.py"


def load(path: Path, name: str):
    """The Python file at `path` as a module called `name` (registered in sys.modules:
    dataclasses look their module up while a class is built). Loaded once per process:
    every test file that loads the bank gets the same module, and so shares the values its
    questions computed (computed(q))."""
    shared = f"interview_checks.loaded:{Path(path).resolve()}"
    if shared in sys.modules:
        return sys.modules[shared]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    sys.modules[shared] = module
    return module


def computed(q) -> dict:
    """What q.compute(**q.given) returns, computed once for every test file (kept beside
    the bank's module, which all of them share) and, under pytest-xdist, once for every
    worker: the first to ask computes it under a lock and leaves it in a file of the run's,
    the others read it."""
    store = vars(sys.modules[type(q).__module__]).setdefault("_computed_by_the_tests", {})
    if q.id not in store:
        store[q.id] = _shared(q)
    return store[q.id]


def _shared(q) -> dict:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of a run
    if not run:
        return q.compute(**q.given)
    folder = Path(tempfile.gettempdir()) / f"minipar-interview-{run}"
    folder.mkdir(exist_ok=True)
    saved = folder / f"{q.id}.pickle"
    with open(folder / f"{q.id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if saved.exists():
            return pickle.loads(saved.read_bytes())
        values = q.compute(**q.given)
        saved.write_bytes(pickle.dumps(values))
        return values


class LazyValues(dict):
    """Each question's values, computed when a test first asks (so each xdist worker
    computes only its tests' questions, not the whole bank at collection)."""

    def __init__(self, by_id: dict):
        super().__init__()
        self.by_id = by_id

    def __missing__(self, qid):
        q = self.by_id[qid]
        self[qid] = {**q.given, **computed(q)}  # Question.values(), computed once
        return self[qid]


def placeholders(fmt: str) -> list:
    return [(name, spec) for _, name, spec, _ in string.Formatter().parse(fmt) if name]


def check_shown(q, values: dict) -> None:
    in_question = {name for name, _ in placeholders(q.question)}
    in_answer = {name for name, _ in placeholders(q.answer)}
    results = set(values) - set(q.given)
    assert in_question <= set(q.given), "the question shows only the example data"
    assert set(q.given) <= in_question | in_answer, "unused example data"
    assert results <= in_answer, f"computed but not shown: {results - in_answer}"
    assert in_question | in_answer <= set(values), "a placeholder with no value"
    assert not set(computed(q)) & set(q.given), "compute shadows the example data"
    question, answer = q.render(values)
    for text in (question, answer):
        assert "{" not in text and "}" not in text


def check_worked(q, values: dict) -> None:
    """A short worked answer: two to nine sentences."""
    answer = q.render(values)[1].replace("e.g.", "eg")
    sentences = [s for s in answer.split(". ") if s.strip()]
    assert 2 <= len(sentences) <= 9, "a short worked answer"


def check_numbers(qid: str, values: dict, expected: dict) -> None:
    assert set(values) == set(expected), (set(values) ^ set(expected))
    for key, want in expected.items():
        got = values[key]
        if callable(want):
            assert want(got), f"{qid}.{key} = {got!r} is out of its expected range"
        elif isinstance(want, (str, list)):
            assert got == want, f"{qid}.{key}: expected {want!r}, got {got!r}"
        elif isinstance(want, int) and isinstance(got, int):
            assert got == want, f"{qid}.{key}: expected {want}, got {got}"
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), \
                f"{qid}.{key}: expected {want!r}, got {got!r}"


def check_distinct(q, values: dict, allowed: list) -> None:
    shown = collections.defaultdict(set)
    for name, spec in placeholders(q.question) + placeholders(q.answer):
        v = values[name]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            shown[format(v, spec)].add(name)
    for text, names in shown.items():
        if len(names) > 1:
            assert any(names <= group for group in allowed), \
                f"{q.id}: {sorted(names)} all print as {text}"
