"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import minipar as mp  # noqa: F401  (the cases below use it)

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
def _ring_of_blocking_sends(ctx):
    r, n = ctx.rank, ctx.world_size
    mp.send(np.ones(2), dst=(r + 1) % n)
    return mp.recv(src=(r - 1) % n)


def _isend_nobody_receives(ctx):
    if ctx.rank == 0:
        mp.isend(np.ones(2), dst=1)


def _one_rank_sleeps(ctx):
    if ctx.rank == 1:
        time.sleep(0.6)  # outside minipar, longer than the timeout
        return None
    return mp.all_reduce(np.ones(2))


def _wait_times_out(ctx):
    if ctx.rank == 1:
        time.sleep(0.4)
        return None
    return mp.irecv(src=1).wait(timeout=0.1)


def _two_ranks_fail(ctx):
    if ctx.rank == 1:
        time.sleep(0.1)  # fails later in time, but is the lower rank
        raise ValueError("the lower rank's own failure")
    if ctx.rank == 2:
        raise KeyError("first in time")
    mp.barrier()


RUNTIME_CASES: list[tuple[str, object, type, list[str]]] = [
    # (id, fn() that misuses the runtime, exception type, words in its message)
    ("sends: a ring of blocking sends before recvs",
     lambda: mp.launch(_ring_of_blocking_sends, 3), mp.DeadlockError,
     ["rank 0: waiting in send(dst=1", "rank 2: waiting in send(dst=0",
      "send blocks until the receiver posts its recv", "alternate by parity"]),
    ("sends: an isend nobody receives",
     lambda: mp.launch(_isend_nobody_receives, 2), mp.DeadlockError,
     ["rank 0: waiting in the end of its program", "send(dst=1, tag=0)",
      "rank 1: finished"]),
    ("sends: unknown mode", lambda: mp.launch(lambda ctx: None, 2, sends="buffered"),
     ValueError, ["sends='buffered'", "'rendezvous'", "'eager'"]),
    ("timeout: a rank sleeps outside minipar while the others wait",
     lambda: mp.launch(_one_rank_sleeps, 3, timeout=0.2), mp.CollectiveTimeoutError,
     ["rank 1: never arrived", "rank 0: waiting in all_reduce", "not yet arrived: [1]",
      "Ranks that never arrived: [1]"]),
    ("timeout: Work.wait(timeout=) on a recv nobody sends in time",
     lambda: mp.launch(_wait_times_out, 2), mp.CollectiveTimeoutError,
     ["rank 0: Work.wait(timeout=0.1) expired", "recv(src=1, tag=0)"]),
    ("timeout: zero", lambda: mp.launch(lambda ctx: None, 2, timeout=0), ValueError,
     ["timeout=...) got 0", "positive, finite number of seconds"]),
    ("timeout: nan", lambda: mp.launch(lambda ctx: None, 2, timeout=float("nan")),
     ValueError, ["got nan", "pass None for no timeout"]),
    ("timeout: a string", lambda: mp.launch(lambda ctx: None, 2, timeout="10"), ValueError,
     ["got '10'"]),
    ("timeout: Work.wait(timeout=-1)",
     lambda: mp.launch(lambda ctx: mp.all_reduce(np.ones(1), async_op=True).wait(timeout=-1),
                       2), ValueError, ["Work.wait(timeout=...) got -1"]),
    ("timeout: under the mpi backend",
     lambda: mp.launch(lambda ctx: None, 2, backend="mpi", timeout=5), ValueError,
     ["simulated backend's watchdog", "MPIEXEC_TIMEOUT"]),
    ("launch: several ranks fail, the lowest rank is reported",
     lambda: mp.launch(_two_ranks_fail, 4), mp.RankFailedError,
     ["the lower rank's own failure"]),
    ("launch: fn is not callable", lambda: mp.launch(42, 2), TypeError,
     ["needs a function of the rank's context", "got int 42"]),
    ("launch: topology is not a Topology", lambda: mp.launch(lambda ctx: None, 2, topology=2),
     TypeError, ["topology must be a minipar Topology", "got int 2"]),
    ("launch: world_size=True", lambda: mp.launch(lambda ctx: None, True), ValueError,
     ["world_size must be a positive integer, got True"]),
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
