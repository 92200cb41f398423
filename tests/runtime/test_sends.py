"""Rendezvous and eager sends, the watchdog, Work.wait(timeout=), and which failure is
reported when several ranks fail.

- rendezvous (the default): a blocking send returns once the receiver has posted the
  matching recv; a ring of blocking sends before recvs is a DeadlockError naming every
  rank's send; isend never blocks; a send nobody receives keeps its rank from ending;
- eager: sends return at once; messages nobody received are warned about;
- both modes give the same results and the same simulated clocks to a correct program;
- launch(timeout=T): ranks waiting with no progress for T s end the run, naming the rank
  that never arrived and where it is; the waiting ranks leave, no thread is left behind
  once the stuck one returns;
- the lowest rank's own failure is reported, whichever thread failed first.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.algorithms import halving_doubling_all_reduce, ring_all_reduce
from minipar.runtime.errors import CollectiveTimeoutError, DeadlockError, RankFailedError
from minipar.runtime.launch import UnreceivedMessageWarning

FILE = "test_sends.py"


def here() -> int:
    return sys._getframe(1).f_lineno


def rank_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("minipar-")]


@pytest.fixture(autouse=True)
def no_threads_left_behind():
    assert rank_threads() == []
    yield
    for t in rank_threads():  # a stuck rank this test released: let it leave
        t.join(5)
    assert rank_threads() == [], "a minipar rank thread outlived its test"


# ---- rendezvous ---------------------------------------------------------------------------
@pytest.mark.timeout(10)
@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_ring_of_blocking_sends_before_recvs_is_a_deadlock(n):
    lines = {}

    def program(ctx):
        r = ctx.rank
        lines[r] = here() + 1
        mp.send(np.ones(3), dst=(r + 1) % n, tag=4)
        return mp.recv(src=(r - 1) % n, tag=4)

    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        mp.launch(program, n)
    assert time.monotonic() - start < 3.0  # at once: hundredths alone, < 3 s under load
    msg = str(info.value)
    for r in range(n):
        assert (f"rank {r}: waiting in send(dst={(r + 1) % n}, tag=4) at {FILE}:{lines[r]} in "
                f"program; send blocks until the receiver posts its recv (sends='rendezvous'), "
                f"and rank {(r + 1) % n} has posted no matching recv") in msg
    assert "alternate by parity" in msg and "isend, then recv, then wait on the send" in msg
    # eager sends buffer the message: the same program runs
    got = mp.launch(program, n, sends="eager")
    assert [g.tolist() for g in got] == [[1.0] * 3] * n


@pytest.mark.timeout(10)
def test_a_blocking_send_returns_once_the_recv_is_posted_not_before():
    order = []

    def program(ctx):
        if ctx.rank == 0:
            mp.send(np.arange(2.0), dst=1)
            order.append("send returned")
            return None
        time.sleep(0.2)  # rank 0 must still be in its send meanwhile
        order.append("recv posted")
        return mp.recv(src=0)

    res = mp.launch(program, 2)
    assert order == ["recv posted", "send returned"]
    assert res[1].tolist() == [0.0, 1.0]
    order.clear()
    mp.launch(program, 2, sends="eager")
    assert order == ["send returned", "recv posted"]


@pytest.mark.timeout(10)
def test_isend_never_blocks_and_completes_once_matched():
    def program(ctx):
        if ctx.rank == 0:
            w = mp.isend(np.ones(2), dst=1)
            before = w.is_completed()
            mp.barrier()  # rank 1 posts its irecv after the barrier
            mp.barrier()
            return before, w.is_completed(), w.wait()
        mp.barrier()
        r = mp.irecv(src=0)
        mp.barrier()
        return r.wait().tolist()

    res = mp.launch(program, 2)
    assert res[0] == (False, True, None)
    assert res[1] == [1.0, 1.0]


@pytest.mark.timeout(10)
def test_a_send_nobody_receives_keeps_its_rank_from_ending():
    lines = {}

    def program(ctx):
        if ctx.rank == 0:
            lines[0] = here() + 1
            mp.isend(np.ones(2), dst=1, tag=7)
        return ctx.rank

    with pytest.raises(DeadlockError) as info:
        mp.launch(program, 2)
    msg = str(info.value)
    assert (f"rank 0: waiting in the end of its program, for sends no rank has posted a recv "
            f"for (send(dst=1, tag=7) at {FILE}:{lines[0]} in program)") in msg
    assert "rank 1: finished (returned from its program)" in msg


@pytest.mark.timeout(10)
def test_eager_sends_nobody_receives_are_warned_about():
    def program(ctx):
        if ctx.rank == 1:
            mp.send(np.ones(2), dst=0, tag=3)
            mp.send(np.ones(2), dst=0, tag=3)
        return ctx.rank

    with pytest.warns(UnreceivedMessageWarning) as record:
        assert mp.launch(program, 2, sends="eager") == [0, 1]
    msg = str(record[0].message)
    assert msg.startswith("2 message(s) sent (sends='eager') and never received")
    assert "rank 1 -> rank 0, tag 3: message #0 sent at test_sends.py:" in msg
    assert "rank 1 -> rank 0, tag 3: message #1" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a program that receives everything: no warning
        mp.launch(lambda ctx: ctx.rank, 2, sends="eager")


def _everything(ctx):
    """Sends, receives, collectives and both send/recv algorithms, on the clock."""
    r, n = ctx.rank, ctx.world_size
    x = np.arange(8.0) + r
    ctx.compute(1e9 * (r + 1), "float64")
    w = mp.isend(x, dst=(r + 1) % n, tag=1)
    got = mp.recv(src=(r - 1) % n, tag=1)
    w.wait()
    if r % 2 == 0:
        mp.send(got * 2, dst=(r + 1) % n)
        back = mp.recv(src=(r - 1) % n)
    else:
        back = mp.recv(src=(r - 1) % n)
        mp.send(got * 2, dst=(r + 1) % n)
    return (got, back, mp.all_reduce(x), ring_all_reduce(x),
            halving_doubling_all_reduce(x), ctx.clock.now,
            [(e.stream, e.start, e.end) for e in ctx.trace.events])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", [2, 4])
def test_results_and_clocks_are_the_same_under_both_modes(n):
    rendezvous, eager = mp.launch(_everything, n), mp.launch(_everything, n, sends="eager")
    for a, b in zip(rendezvous, eager):
        for x, y in zip(a[:5], b[:5]):
            np.testing.assert_array_equal(x, y)
        assert a[5] == b[5] and a[6] == b[6]


# ---- the watchdog -------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_the_watchdog_names_the_rank_that_never_arrived_and_where_the_others_wait():
    release = threading.Event()
    lines = {}

    def program(ctx):
        if ctx.rank == 1:
            mp.barrier()
            lines[1] = here() + 1
            release.wait(10)  # outside minipar: a lock, a queue, a loop that never ends
            return None
        mp.barrier()
        lines[ctx.rank] = here() + 1
        return mp.all_reduce(np.ones(2))

    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        mp.launch(program, 3, timeout=0.3)
    took = time.monotonic() - start
    release.set()
    assert 0.3 <= took < 3.0
    msg = str(info.value)
    assert "with no progress (launch(..., timeout=0.3))" in msg
    for r in (0, 2):
        assert (f"rank {r}: waiting in all_reduce on group world[0, 1, 2] (call #1 of that "
                f"group) at {FILE}:{lines[r]} in program; arrived: [0, 2], not yet arrived: "
                "[1]") in msg
    assert (f"rank 1: never arrived: running outside minipar, now at {FILE}:{lines[1]} in "
            f"program; its last minipar call: barrier on group world[0, 1, 2] at "
            f"{FILE}:") in msg
    assert "Ranks that never arrived: [1]." in msg
    notes = getattr(info.value, "__notes__", [])
    assert any("rank(s) [1]: still running outside minipar" in n for n in notes), notes
    assert [t.name for t in rank_threads()] == ["minipar-abandoned-rank-1"]


@pytest.mark.timeout(20)
def test_the_watchdog_does_not_fire_while_ranks_make_progress_or_nobody_waits():
    def program(ctx):
        time.sleep(1.0)  # nobody waits: computing, however long, is not a hang
        for _ in range(20):  # 0.8 s of waits, each far shorter than the timeout (margin
            if ctx.rank == 1:  # for a loaded machine, where a thread may stall 0.1 s)
                time.sleep(0.04)
            mp.barrier()
        return ctx.rank

    assert mp.launch(program, 2, timeout=0.6) == [0, 1]


@pytest.mark.timeout(20)
def test_a_rank_that_never_returns_after_another_failed_is_left_behind_and_named():
    release = threading.Event()

    def program(ctx):
        if ctx.rank == 0:
            raise ValueError("rank 0 fails")
        release.wait(10)

    with pytest.raises(RankFailedError) as info:
        mp.launch(program, 2, timeout=0.2)
    release.set()
    assert info.value.rank == 0
    assert any("rank(s) [1]: still running outside minipar" in n
               for n in getattr(info.value, "__notes__", []))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("timeout", [0.2, datetime.timedelta(milliseconds=200)])
def test_work_wait_with_a_timeout_raises_in_the_waiting_rank(timeout):
    lines = {}

    def program(ctx):
        if ctx.rank == 1:
            time.sleep(0.5)  # then returns, never joining the all_reduce
            return None
        w = mp.all_reduce(np.ones(2), async_op=True)
        lines[0] = here() - 1
        return w.wait(timeout=timeout)

    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        mp.launch(program, 2)
    assert 0.2 <= time.monotonic() - start < 2.0
    msg = str(info.value)
    assert msg.startswith("rank 0: Work.wait(timeout=0.2) expired, still waiting in all_reduce "
                          f"on group world[0, 1] (call #0 of that group) at {FILE}:{lines[0]}")
    assert "(raised on rank 0)" in info.value.__notes__


@pytest.mark.timeout(10)
def test_work_wait_with_a_timeout_returns_the_result_when_in_time():
    def program(ctx):
        if ctx.rank == 1:
            time.sleep(0.05)
        return mp.all_reduce(np.ones(2) * ctx.rank, async_op=True).wait(timeout=5).tolist()

    assert mp.launch(program, 2) == [[1.0, 1.0]] * 2


@pytest.mark.timeout(10)
def test_a_deadlock_is_still_diagnosed_at_once_under_a_timeout():
    def program(ctx):
        return mp.recv(src=1 - ctx.rank)

    start = time.monotonic()
    with pytest.raises(DeadlockError):
        mp.launch(program, 2, timeout=30)
    assert time.monotonic() - start < 3.0  # at once, not after the 30 s (< 3 s under load)


# ---- which failure is reported ------------------------------------------------------------
@pytest.mark.timeout(10)
def test_the_lowest_rank_failure_is_reported_whichever_failed_first():
    def program(ctx):
        if ctx.rank == 3:
            raise KeyError("rank 3, first in time")
        if ctx.rank == 1:
            time.sleep(0.1)
            raise ValueError("rank 1, later")
        mp.barrier()

    for _ in range(3):
        with pytest.raises(RankFailedError) as info:
            mp.launch(program, 4)
        assert info.value.rank == 1 and isinstance(info.value.original, ValueError)
