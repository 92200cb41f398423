"""Who wakes whom on the simulated backend (runtime/backends/waits.py).

- a blocked rank is woken only by the change that satisfies its wait: a receiver by its
  own message, however much else happens in the world meanwhile; the members of a
  collective once, when it completes; every sleep ends with exactly one wake-up;
- a failure still wakes every blocked rank, which leaves with WorldAborted;
- a deadlock among 3 of 8 ranks, while the other 5 communicate and finish, is reported
  with every rank's state;
- the last arrival computes a collective's results outside the world's lock: other
  ranks' sends and receives go on meanwhile, and the watchdog does not count it as idle.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.backends import sim
from minipar.runtime.errors import DeadlockError, RankFailedError

FILE = "test_wakeups.py"


def here() -> int:
    return sys._getframe(1).f_lineno


def wait_until_blocked(world, rank: int, seconds: float = 5.0) -> None:
    """Poll (outside minipar) until `rank` sleeps in a minipar wait."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with world.lock:
            if rank in world.waiting:
                return
        time.sleep(1e-3)
    raise AssertionError(f"rank {rank} never blocked within {seconds} s")


@pytest.mark.timeout(20)
def test_a_receiver_is_woken_only_by_its_own_message():
    """Rank 2 sleeps in recv from 0 while ranks 0 and 1 exchange 2 x 20 messages and make
    5 all-reduces on their own group (85 changes of state: each send, posted recv and
    completion): rank 2 is woken once."""
    def program(ctx):
        pair = mp.new_group([0, 1])
        world = ctx.backend
        if ctx.rank == 2:
            return mp.recv(src=0, tag=9).tolist()
        if ctx.rank == 0:
            wait_until_blocked(world, 2)
        for i in range(20):
            if ctx.rank == 0:
                mp.send(np.full(3, i, float), dst=1)
                mp.recv(src=1)
            else:
                mp.send(mp.recv(src=0) + 1, dst=0)
        for _ in range(5):
            mp.all_reduce(np.ones(2), group=pair)
        if ctx.rank == 0:
            mp.send(np.arange(3.0), dst=2, tag=9)
        return None

    result = mp.launch(program, 3)
    assert result[2] == [0.0, 1.0, 2.0]
    assert result.contexts[2].backend.wakeups[2] == 1


@pytest.mark.timeout(20)
def test_the_members_of_a_collective_are_woken_once_when_it_completes():
    """Ranks 0..2 wait in an all-reduce for rank 3, which first sends 10 messages to rank
    4 (changes of state that satisfy none of their waits): each is woken once, by the
    all-reduce's completion."""
    def program(ctx):
        group = mp.new_group([0, 1, 2, 3])
        if ctx.rank == 4:
            return [mp.recv(src=3, tag=i)[0] for i in range(10)]
        if ctx.rank == 3:
            for r in (0, 1, 2):
                wait_until_blocked(ctx.backend, r)
            for i in range(10):
                mp.send(np.full(2, float(i)), dst=4, tag=i)
        return mp.all_reduce(np.full(2, float(ctx.rank)), group=group)[0]

    result = mp.launch(program, 5, sends="eager")
    assert result == [6.0] * 4 + [[float(i) for i in range(10)]]
    assert result.contexts[0].backend.wakeups[:3] == [1, 1, 1]


@pytest.mark.timeout(30)
def test_every_sleep_ends_with_exactly_one_wake_up_in_a_pipeline_like_program():
    """4 ranks: a chain of p2p (0 -> 1 -> 2 -> 3 and back, as a pipeline's forward and
    backward) with an all-reduce over {0, 2} and one over {1, 3} after each round, 10
    rounds. Many waits sleep; each is woken once, never to find its wait unsatisfied."""
    def program(ctx):
        r = ctx.rank
        g = mp.new_group([0, 2] if r % 2 == 0 else [1, 3])
        x = np.full(4, float(r))
        for _ in range(10):
            if r > 0:
                x = mp.recv(src=r - 1)
            if r < 3:
                mp.send(x + 1, dst=r + 1)
                x = mp.recv(src=r + 1)
            if r > 0:
                mp.send(x * 2, dst=r - 1)
            x = mp.all_reduce(x, group=g) / 2
        return x[0]

    result = mp.launch(program, 4)
    world = result.contexts[0].backend
    assert sum(world.sleeps) > 0
    assert world.wakeups == world.sleeps


@pytest.mark.timeout(20)
def test_a_failure_still_wakes_every_blocked_rank():
    def program(ctx):
        if ctx.rank == 0:
            for r in range(1, 4):
                wait_until_blocked(ctx.backend, r)
            raise ValueError("rank 0 gives up")
        return mp.recv(src=ctx.rank % 3 + 1)  # 1 <- 2 <- 3 <- 1, alive while 0 runs

    with pytest.raises(RankFailedError, match="rank 0 gives up"):
        mp.launch(program, 4)


@pytest.mark.timeout(20)
def test_a_deadlock_among_3_of_8_ranks_is_reported_with_every_rank():
    """Ranks 0, 1, 2 each receive from the next (a cycle nobody can break) while ranks
    3..7 make collectives and p2p among themselves and return."""
    lines = {}
    def program(ctx):
        others = mp.new_group([3, 4, 5, 6, 7])
        if ctx.rank < 3:
            lines[ctx.rank] = here() + 1
            return mp.recv(src=(ctx.rank + 1) % 3, tag=7)
        for _ in range(3):
            mp.all_reduce(np.ones(4), group=others)
        if ctx.rank == 3:
            mp.send(np.ones(2), dst=4)
        if ctx.rank == 4:
            mp.recv(src=3)
        return ctx.rank

    with pytest.raises(DeadlockError) as info:
        mp.launch(program, 8)
    msg = str(info.value)
    for r in range(3):
        assert (f"rank {r}: waiting in recv(src={(r + 1) % 3}, tag=7) at {FILE}:{lines[r]} "
                f"in program; rank {(r + 1) % 3} has sent no such message") in msg
    for r in range(3, 8):
        assert f"rank {r}: finished (returned from its program)" in msg


def _slow_reference(monkeypatch, seconds: float, event: threading.Event | None = None):
    """Make sim's all_reduce reference slow: it sleeps `seconds`, or until `event` is set
    (recording whether it was)."""
    fast = sim.REFERENCES["all_reduce"]
    seen = {}

    def slow(blocks, **params):
        if event is None:
            time.sleep(seconds)
        else:
            seen["set"] = event.wait(seconds)
        return fast(blocks, **params)

    monkeypatch.setitem(sim.REFERENCES, "all_reduce", slow)
    return seen


@pytest.mark.timeout(30)
def test_sends_and_receives_go_on_while_a_last_arrival_computes(monkeypatch):
    """Ranks 0 and 1 all-reduce; its reference waits until rank 3 has received a message
    from rank 2. Were the results computed under the world's lock, rank 2's send would
    wait for it, and the reference for rank 3 (5 s, then `seen` says no)."""
    got = threading.Event()
    seen = _slow_reference(monkeypatch, 5.0, got)
    def program(ctx):
        pair = mp.new_group([0, 1])
        if ctx.rank < 2:
            return mp.all_reduce(np.full(2, ctx.rank + 1.0), group=pair).tolist()
        if ctx.rank == 2:
            mp.send(np.ones(2), dst=3)
            return None
        out = mp.recv(src=2).tolist()
        got.set()
        return out

    result = mp.launch(program, 4)
    assert seen == {"set": True}
    assert result == [[3.0, 3.0], [3.0, 3.0], None, [1.0, 1.0]]


@pytest.mark.timeout(30)
def test_the_watchdog_waits_for_a_last_arrival_that_computes(monkeypatch):
    """A reference that takes 1.5 s, under launch(timeout=0.5): the members wait that long
    with no change of state, but the run is computing, not hung; it ends normally."""
    _slow_reference(monkeypatch, 1.5)

    def program(ctx):
        return mp.all_reduce(np.full(2, float(ctx.rank)))[0]

    assert mp.launch(program, 3, timeout=0.5) == [3.0] * 3
