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
