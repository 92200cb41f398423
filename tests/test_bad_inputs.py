"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import pytest

import minipar as mp  # noqa: F401  (the cases below use it)

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
    # tour: a size the collectives cannot take, a timeline that cannot be drawn, a trace
    # that cannot be written -- before, a traceback after minutes of work, a MemoryError, a
    # hang, or nothing written without a word
    (["tour", "--megabytes", "nan"], ["--megabytes", "positive number of MiB", "nan"]),
    (["tour", "--megabytes", "inf"], ["--megabytes", "positive number of MiB", "inf"]),
    (["tour", "--megabytes", "-1"], ["--megabytes", "positive number of MiB"]),
    (["tour", "--megabytes", "1e12"], ["--megabytes", "at most 64 MiB", "80 copies"]),
    (["tour", "--width", "0"], ["--width", "positive number of columns", "0"]),
    (["tour", "--width", "-3"], ["--width", "positive number of columns"]),
    (["tour", "--width", "100000000"], ["--width", "at most 1,000 columns"]),
    (["tour", "--trace", ""], ["--trace", "empty"]),
    (["tour", "--trace", "/nonexistent-minipar-dir/t.json"], ["--trace", "no directory"]),
    (["tour", "--trace", "."], ["--trace", "is a directory", "trace.json"]),
    # grade and lessons: '' was lesson 00, a file that is not Python a traceback, the
    # wrong count of lessons exit status 1, flags that do nothing silently ignored
    (["grade", ""], ["NN", "lesson number such as 01"]),
    (["grade", "00", "--impl", "README.md"], ["--impl", "exercise, solution", ".py"]),
    (["grade", "00", "--impl", ""], ["--impl", "exercise, solution", ".py"]),
    (["lessons", "open", ""], ["NN", "lesson number such as 01"]),
    (["lessons", "open"], ["open takes one lesson number", "got 0"]),
    (["lessons", "open", "01", "02"], ["open takes one lesson number", "got 2"]),
    (["lessons", "list", "01"], ["list takes no lesson number", "lessons open NN"]),
    (["lessons", "--check"], ["--check and --force", "build"]),
    (["lessons", "--force"], ["--check and --force", "build"]),
    (["lessons", "build", "--check", "--force"], ["--check only compares", "--force"]),
    # train: runs that cannot end (10^20 steps ran for ever; so did 10^12 characters)
    (["train", "--steps", "99999999999999999999"], ["--steps", "at most 1,000,000"]),
    (["train", "--sample", "1000000000000"], ["--sample", "at most 100,000"]),
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
RUNTIME_CASES: list[tuple[str, object, type, list[str]]] = [
    # (id, fn() that misuses the runtime, exception type, words in its message)
]


# ---- the model, the optimizers and `minipar train` -----------------------------------------
MODEL_CASES: list[tuple[str, object, type, list[str]]] = [
]


# ---- checkpoints and files ----------------------------------------------------------------
CHECKPOINT_CASES: list[tuple[str, object, type, list[str]]] = [
]


def _cases(table):
    return [pytest.param(fn, exc, words, id=name) for name, fn, exc, words in table]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, words", [pytest.param(a, w, id=" ".join(a)) for a, w in CLI_CASES])
def test_the_cli_refuses(argv, words, capsys):
    from minipar.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn, exc, words",
                         _cases(RUNTIME_CASES + MODEL_CASES + CHECKPOINT_CASES))
def test_the_library_refuses(fn, exc, words):
    with pytest.raises(exc) as e:
        fn()
    msg = str(getattr(e.value, "original", e.value))
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
