"""The diagnoses keep naming the right rank and call at 1,024 simulated ranks, quickly.

Wake-ups go only to the ranks a change can satisfy and the deadlock check is O(1) at a
sleep (runtime/backends/waits.py), so these must still see every rank: a deadlock, a
mismatch and a timeout in one group of 8 among 128, or in the world group.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.backends.sim import rank_list
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError)

N = 1024
WITHIN = 15.0  # seconds (about 2-4 s here, on a loaded 2-core machine); a hang is endless


def launch_expecting(error_type, fn, **kw):
    start = time.monotonic()
    with pytest.raises(error_type) as info:
        mp.launch(fn, N, **kw)
    assert time.monotonic() - start < WITHIN
    return str(info.value)


def eights(ctx):
    """This rank's group of 8 consecutive ranks."""
    first = ctx.rank // 8 * 8
    return mp.new_group(range(first, first + 8), name="eight")


@pytest.mark.timeout(120)
def test_deadlock_in_one_group_of_8_among_1024_ranks_names_the_missing_rank():
    def program(ctx):
        g = eights(ctx)
        if ctx.rank == 1021:
            return "left early"
        return mp.all_reduce(np.ones(2), group=g)

    msg = launch_expecting(DeadlockError, program)
    assert "rank 1021: finished (returned from its program)" in msg
    for r in (1016, 1023):
        assert (f"rank {r}: waiting in all_reduce on group eight[1016, 1017, 1018, 1019, "
                f"1020, 1021, 1022, 1023] (call #0 of that group)") in msg
    assert "arrived: [1016, 1017, 1018, 1019, 1020, 1022, 1023], not yet arrived: [1021]" in msg
    assert "rank 0: finished (returned from its program)" in msg  # the other groups ended


@pytest.mark.timeout(120)
def test_mismatch_on_the_world_group_of_1024_names_the_odd_rank():
    def program(ctx):
        return mp.all_reduce(np.ones(3 if ctx.rank == 777 else 2))

    msg = launch_expecting(CollectiveMismatchError, program)
    assert msg.startswith("collective mismatch on group world[")
    lines = msg.splitlines()
    odd = [ln for ln in lines if ln.startswith("  rank 777:")]
    assert len(odd) == 1 and "(3,)" in odd[0]
    assert all("(3,)" not in ln for ln in lines if ln.startswith("  rank ") and ln not in odd)


@pytest.mark.timeout(120)
def test_timeout_in_one_group_of_8_among_1024_ranks_is_raised_by_its_lowest_rank():
    def program(ctx):
        g = eights(ctx)
        if ctx.rank == 1021:
            time.sleep(1.0)  # then returns, never joining its group's all_reduce
            return None
        w = mp.all_reduce(np.ones(2), group=g, async_op=True)
        return w.wait(timeout=0.3 if ctx.rank >= 1016 else None)

    msg = launch_expecting(CollectiveTimeoutError, program)
    assert msg.startswith("rank 1016: Work.wait(timeout=0.3) expired, still waiting in "
                          "all_reduce on group eight[1016, ")
    assert "not yet arrived: [1021]" in msg


def test_rank_list_writes_long_lists_as_runs():
    assert rank_list([3, 1, 2][:0] + [0, 1, 5]) == "[0, 1, 5]"
    ranks = list(range(1021)) + [1022, 1023]
    assert rank_list(ranks) == "[0..1020, 1022..1023] (1023 ranks)"
    assert rank_list(list(range(0, 80, 2))).endswith("... 24 more runs] (40 ranks)")
