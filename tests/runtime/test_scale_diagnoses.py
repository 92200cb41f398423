"""The diagnoses keep naming the right rank and call at 1,024 and 4,096 simulated ranks.

Wake-ups go only to the ranks a change can satisfy and the deadlock check is O(1) at a
sleep (runtime/backends/waits.py), so these must still see every rank: a deadlock, a
mismatch and a timeout in one group of 8 among N / 8, or in the world group. At 1,024
ranks in the suite; at 4,096 (about ten seconds each here) only in CI (`-m scale`).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.backends.sim import rank_list
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError)

SIZES = [1024, pytest.param(4096, marks=pytest.mark.scale)]


def launch_expecting(error_type, fn, n, **kw):
    """The error's text; a hang would be ended by the test's timeout."""
    with pytest.raises(error_type) as info:
        mp.launch(fn, n, **kw)
    return str(info.value)


def eights(ctx):
    """This rank's group of 8 consecutive ranks."""
    first = ctx.rank // 8 * 8
    return mp.new_group(range(first, first + 8), name="eight")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", SIZES)
def test_deadlock_in_one_group_of_8_names_the_missing_rank(n):
    gone, first = n - 3, n - 8  # the rank that leaves, the first of its group of 8

    def program(ctx):
        g = eights(ctx)
        if ctx.rank == gone:
            return "left early"
        return mp.all_reduce(np.ones(2), group=g)

    msg = launch_expecting(DeadlockError, program, n)
    assert f"rank {gone}: finished (returned from its program)" in msg
    members = ", ".join(map(str, range(first, n)))
    for r in (first, n - 1):
        assert (f"rank {r}: waiting in all_reduce on group eight[{members}] (call #0 of that "
                f"group)") in msg
    arrived = ", ".join(str(r) for r in range(first, n) if r != gone)
    assert f"arrived: [{arrived}], not yet arrived: [{gone}]" in msg
    assert "rank 0: finished (returned from its program)" in msg  # the other groups ended


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", SIZES)
def test_mismatch_on_the_world_group_names_the_odd_rank(n):
    odd_rank = n - 247

    def program(ctx):
        return mp.all_reduce(np.ones(3 if ctx.rank == odd_rank else 2))

    msg = launch_expecting(CollectiveMismatchError, program, n)
    assert msg.startswith("collective mismatch on group world[")
    lines = msg.splitlines()
    odd = [ln for ln in lines if ln.startswith(f"  rank {odd_rank}:")]
    assert len(odd) == 1 and "(3,)" in odd[0]
    assert all("(3,)" not in ln for ln in lines if ln.startswith("  rank ") and ln not in odd)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", SIZES)
def test_timeout_in_one_group_of_8_is_raised_by_a_rank_of_that_group(n):
    """The seven waiting ranks' timeouts race: the first to expire stops the run, and the
    others leave with the world's abort, so the report is one of theirs, not always the
    lowest's (docs/runtime.md, "Which failure is reported")."""
    gone, first = n - 3, n - 8

    def program(ctx):
        g = eights(ctx)
        if ctx.rank == gone:
            time.sleep(1.0)  # then returns, never joining its group's all_reduce
            return None
        w = mp.all_reduce(np.ones(2), group=g, async_op=True)
        return w.wait(timeout=0.3 if ctx.rank >= first else None)

    msg = launch_expecting(CollectiveTimeoutError, program, n)
    waiting = [r for r in range(first, n) if r != gone]
    assert any(msg.startswith(f"rank {r}: Work.wait(timeout=0.3) expired, still waiting in "
                              f"all_reduce on group eight[{first}, ") for r in waiting), msg
    assert f"not yet arrived: [{gone}]" in msg


def test_rank_list_writes_long_lists_as_runs():
    assert rank_list([3, 1, 2][:0] + [0, 1, 5]) == "[0, 1, 5]"
    ranks = list(range(1021)) + [1022, 1023]
    assert rank_list(ranks) == "[0..1020, 1022..1023] (1023 ranks)"
    assert rank_list(list(range(0, 80, 2))).endswith("... 24 more runs] (40 ranks)")
