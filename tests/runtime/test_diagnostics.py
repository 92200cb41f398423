"""Misuse is diagnosed, never hung.

- ranks of a group that call different collectives (or the same one with different shapes,
  dtypes, ops, roots, axes) get a CollectiveMismatchError listing every rank's call and
  the file:line it came from;
- programs where every live rank waits on another get a DeadlockError at once, naming each
  rank and what it waits in;
- an exception on one rank stops the run with a RankFailedError carrying its traceback;
- bad arguments raise CollectiveUsageError naming the rank and the shapes;
- nothing is left behind (no minipar thread) and nobody busy-waits.
"""

from __future__ import annotations

import re
import sys
import threading
import time

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveUsageError,
                                    DeadlockError, RankFailedError, WorldAborted)

FILE = "test_diagnostics.py"


def here() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def minipar_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("minipar-rank-")]


@pytest.fixture(autouse=True)
def no_threads_left_behind():
    assert minipar_threads() == []
    yield
    assert minipar_threads() == [], "a minipar rank thread outlived launch"


def launch_expecting(error_type, fn, world_size: int, within: float = 3.0, **launch_kw):
    """Run `fn`, expect `error_type`, and check it came quickly and left no thread: within
    3 s of wall time, a bound for a loaded machine (it takes a few hundredths of a second
    alone; a diagnosis that waited for a timeout would take the timeout, 10 s or more)."""
    start = time.monotonic()
    with pytest.raises(error_type) as info:
        mp.launch(fn, world_size, **launch_kw)
    elapsed = time.monotonic() - start
    assert elapsed < within, f"the diagnosis took {elapsed:.2f} s"
    assert minipar_threads() == []
    return info.value


X = np.zeros((2, 3))
X32 = np.zeros((2, 3), np.float32)
Y = np.zeros((3, 2))
PIECES = [np.zeros(2), np.ones(2), np.full(2, 2.0)]

# name: (call of ranks 0 and 2, call of rank 1, what ranks 0/2 did, what rank 1 did)
MISMATCHES = {
    "different collectives": (
        lambda ctx: mp.all_reduce(X),
        lambda ctx: mp.all_gather(X),
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=sum\)",
        r"all_gather\(shape=\(2, 3\), dtype=float64, axis=0\)"),
    "barrier vs all_reduce": (
        lambda ctx: mp.barrier(),
        lambda ctx: mp.all_reduce(X),
        r"barrier\(\)",
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=sum\)"),
    "shape": (
        lambda ctx: mp.all_reduce(X),
        lambda ctx: mp.all_reduce(Y),
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=sum\)",
        r"all_reduce\(shape=\(3, 2\), dtype=float64, op=sum\)"),
    "dtype": (
        lambda ctx: mp.all_reduce(X),
        lambda ctx: mp.all_reduce(X32),
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=sum\)",
        r"all_reduce\(shape=\(2, 3\), dtype=float32, op=sum\)"),
    "op": (
        lambda ctx: mp.all_reduce(X, op="sum"),
        lambda ctx: mp.all_reduce(X, op="max"),
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=sum\)",
        r"all_reduce\(shape=\(2, 3\), dtype=float64, op=max\)"),
    "reduce_scatter op": (
        lambda ctx: mp.reduce_scatter(np.zeros(6), op="min"),
        lambda ctx: mp.reduce_scatter(np.zeros(6), op="prod"),
        r"reduce_scatter\(shape=\(6,\), dtype=float64, op=min, axis=0\)",
        r"reduce_scatter\(shape=\(6,\), dtype=float64, op=prod, axis=0\)"),
    "all_gather axis": (
        lambda ctx: mp.all_gather(X, axis=0),
        lambda ctx: mp.all_gather(X, axis=1),
        r"all_gather\(shape=\(2, 3\), dtype=float64, axis=0\)",
        r"all_gather\(shape=\(2, 3\), dtype=float64, axis=1\)"),
    "broadcast src": (
        lambda ctx: mp.broadcast(X, src=0),
        lambda ctx: mp.broadcast(X, src=1),
        r"broadcast\(src=0\)",
        r"broadcast\(src=1\)"),
    "reduce dst": (
        lambda ctx: mp.reduce(X, dst=2),
        lambda ctx: mp.reduce(X, dst=1),
        r"reduce\(shape=\(2, 3\), dtype=float64, op=sum, dst=2\)",
        r"reduce\(shape=\(2, 3\), dtype=float64, op=sum, dst=1\)"),
    "gather dst": (
        lambda ctx: mp.gather(X, dst=0),
        lambda ctx: mp.gather(X, dst=2),
        r"gather\(shape=\(2, 3\), dtype=float64, dst=0\)",
        r"gather\(shape=\(2, 3\), dtype=float64, dst=2\)"),
    "scatter src": (
        lambda ctx: mp.scatter(PIECES if ctx.rank == 2 else None, src=2),
        lambda ctx: mp.scatter(PIECES, src=1),
        r"scatter\(src=2\)",
        r"scatter\(src=1\)"),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_collective_mismatch_lists_every_rank_call_and_line(case):
    usual, odd, usual_text, odd_text = MISMATCHES[case]

    calling = {0: threading.Event(), 2: threading.Event()}

    def program(ctx):
        if ctx.rank == 1:
            # arrive last, so that the diagnosis sees every rank's call
            assert calling[0].wait(5) and calling[2].wait(5)
            time.sleep(0.05)
            return odd(ctx)
        calling[ctx.rank].set()
        return usual(ctx)

    err = launch_expecting(CollectiveMismatchError, program, 3)
    msg = str(err)
    assert "collective mismatch on group world[0, 1, 2] at call #0" in msg
    for rank, fn, text in [(0, usual, usual_text), (1, odd, odd_text), (2, usual, usual_text)]:
        line = fn.__code__.co_firstlineno
        pattern = (rf"rank {rank}: {text} on group world\[0, 1, 2\] "
                   rf"at {FILE}:{line} in <lambda>")
        assert re.search(pattern, msg), f"no match for {pattern!r} in\n{msg}"
    assert "not arrived yet" not in msg


@pytest.mark.timeout(10)
def test_mismatch_after_matching_calls_names_the_call_index_and_subgroup():
    lines = {}

    def program(ctx):
        g = mp.new_group([1, 3])
        if ctx.rank not in g:
            return None
        mp.all_reduce(np.ones(2), group=g)  # call #0 agrees
        mp.barrier(group=g)  # call #1 agrees
        if ctx.rank == 3:
            lines[3] = here() + 1
            return mp.all_reduce(np.ones(3, np.int32), group=g)
        lines[1] = here() + 1
        return mp.all_reduce(np.ones(2), group=g)

    err = launch_expecting(CollectiveMismatchError, program, 4)
    msg = str(err)
    assert "collective mismatch on group group[1, 3] at call #2 of that group" in msg
    assert (f"rank 1: all_reduce(shape=(2,), dtype=float64, op=sum) on group group[1, 3] at "
            f"{FILE}:{lines[1]} in program") in msg
    assert (f"rank 3: all_reduce(shape=(3,), dtype=int32, op=sum) on group group[1, 3] at "
            f"{FILE}:{lines[3]} in program") in msg
    assert "rank 0" not in msg and "rank 2" not in msg


# ---- deadlocks ----------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_deadlock_two_ranks_in_blocking_recv_from_each_other():
    lines = {}

    def program(ctx):
        lines[ctx.rank] = here() + 1
        return mp.recv(src=1 - ctx.rank, tag=5)

    err = launch_expecting(DeadlockError, program, 2)
    msg = str(err)
    assert "deadlock" in msg
    for r in (0, 1):
        assert (f"rank {r}: waiting in recv(src={1 - r}, tag=5) at {FILE}:{lines[r]} "
                f"in program") in msg


@pytest.mark.timeout(10)
def test_deadlock_a_rank_returns_while_others_wait_in_a_collective():
    lines = {}

    def program(ctx):
        if ctx.rank == 2:
            time.sleep(0.05)
            return "done"
        lines[ctx.rank] = here() + 1
        return mp.all_reduce(np.ones(4))

    err = launch_expecting(DeadlockError, program, 3)
    msg = str(err)
    assert "rank 2: finished (returned from its program)" in msg
    for r in (0, 1):
        assert (f"rank {r}: waiting in all_reduce on group world[0, 1, 2] (call #0 of that "
                f"group) at {FILE}:{lines[r]} in program; arrived: [0, 1], not yet arrived: "
                f"[2]") in msg


@pytest.mark.timeout(10)
def test_deadlock_collectives_on_different_groups_in_crossing_order():
    """Rank 0 waits on {0,1}, rank 1 on {1,2}, rank 2 on {0,2}: a cycle."""
    lines = {}

    def program(ctx):
        a, b, c = mp.new_group([0, 1]), mp.new_group([1, 2]), mp.new_group([0, 2])
        first, second = {0: (a, c), 1: (b, a), 2: (c, b)}[ctx.rank]
        lines[ctx.rank] = here() + 1
        mp.all_reduce(np.ones(2), group=first)
        mp.all_reduce(np.ones(2), group=second)

    err = launch_expecting(DeadlockError, program, 3)
    msg = str(err)
    waits = {0: ("group[0, 1]", "[0]", "[1]"), 1: ("group[1, 2]", "[1]", "[2]"),
             2: ("group[0, 2]", "[2]", "[0]")}
    for r, (g, arrived, missing) in waits.items():
        assert (f"rank {r}: waiting in all_reduce on group {g} (call #0 of that group) at "
                f"{FILE}:{lines[r]} in program; arrived: {arrived}, not yet arrived: "
                f"{missing}") in msg


@pytest.mark.timeout(10)
def test_deadlock_two_named_groups_over_the_same_ranks_in_crossing_order():
    def program(ctx):
        a = mp.new_group([0, 1], name="a")
        b = mp.new_group([0, 1], name="b")
        for g in ((a, b) if ctx.rank == 0 else (b, a)):
            mp.barrier(group=g)

    msg = str(launch_expecting(DeadlockError, program, 2))
    assert "rank 0: waiting in barrier on group a[0, 1]" in msg
    assert "rank 1: waiting in barrier on group b[0, 1]" in msg


@pytest.mark.timeout(10)
def test_deadlock_recv_against_a_collective():
    def program(ctx):
        if ctx.rank == 0:
            return mp.recv(src=1)
        return mp.barrier()

    msg = str(launch_expecting(DeadlockError, program, 2))
    assert "rank 0: waiting in recv(src=1, tag=0)" in msg
    assert "rank 1: waiting in barrier on group world[0, 1]" in msg


@pytest.mark.timeout(10)
def test_deadlock_an_async_collective_left_unwaited_at_the_end():
    """launch finishes the last un-waited collective of each rank; if a rank never joined
    it, that is a deadlock, not a silent success."""
    lines = {}

    def program(ctx):
        if ctx.rank == 0:
            lines[0] = here() + 1
            mp.all_gather(np.ones(2), async_op=True)
        return ctx.rank

    msg = str(launch_expecting(DeadlockError, program, 2))
    assert (f"rank 0: waiting in all_gather on group world[0, 1] (call #0 of that group) at "
            f"{FILE}:{lines[0]} in program") in msg
    assert "rank 1: finished" in msg


@pytest.mark.timeout(10)
def test_deadlock_wrong_tag_and_unmatched_irecv():
    def program(ctx):
        if ctx.rank == 0:
            mp.send(np.ones(2), dst=1, tag=1)
            return mp.irecv(src=1).wait()
        return mp.recv(src=0, tag=2)

    # eager: rank 0's send returns, and the deadlock is in the two recvs (under rendezvous
    # rank 0 waits in the send: tests/runtime/test_sends.py)
    msg = str(launch_expecting(DeadlockError, program, 2, sends="eager"))
    assert "rank 0: waiting in recv(src=1, tag=0)" in msg
    assert "rank 1: waiting in recv(src=0, tag=2)" in msg


@pytest.mark.timeout(10)
def test_no_deadlock_reported_while_a_rank_is_still_computing():
    def program(ctx):
        if ctx.rank == 0:
            time.sleep(0.2)  # the others are blocked, but rank 0 is not: no deadlock
            mp.send(np.arange(3.0), dst=1)
        elif ctx.rank == 1:
            got = mp.recv(src=0)
            mp.barrier(group=mp.new_group([1, 2]))
            return got
        else:
            mp.barrier(group=mp.new_group([1, 2]))

    results = mp.launch(program, 3)
    np.testing.assert_array_equal(results[1], np.arange(3.0))


# ---- a rank that raises -----------------------------------------------------------------
@pytest.mark.timeout(10)
def test_exception_on_one_rank_raises_rank_failed_error_with_its_traceback():
    seen: dict[int, BaseException] = {}
    line = {}

    calling = {r: threading.Event() for r in (0, 1, 3)}

    def program(ctx):
        if ctx.rank == 2:
            for e in calling.values():
                assert e.wait(5)
            time.sleep(0.05)  # the others are blocked in the all_reduce by now
            line[2] = here() + 1
            raise KeyError("boom on purpose")
        try:
            calling[ctx.rank].set()
            return mp.all_reduce(np.ones(2))
        except BaseException as exc:
            seen[ctx.rank] = exc
            raise

    err = launch_expecting(RankFailedError, program, 4)
    assert err.rank == 2
    assert isinstance(err.original, KeyError) and err.__cause__ is err.original
    msg = str(err)
    assert msg.startswith("rank 2 raised KeyError: 'boom on purpose'")
    assert "--- traceback of rank 2 ---" in msg
    assert f'{FILE}", line {line[2]}, in program' in msg
    assert f'{FILE}", line {line[2]}, in program' in err.traceback_text
    # the other ranks were woken out of the collective, not left hanging
    assert sorted(seen) == [0, 1, 3]
    assert all(isinstance(e, WorldAborted) for e in seen.values())
    assert all("boom on purpose" in str(e) for e in seen.values())


@pytest.mark.timeout(10)
def test_exception_while_others_wait_in_recv_and_barrier():
    def program(ctx):
        if ctx.rank == 0:
            return mp.recv(src=1)
        if ctx.rank == 1:
            time.sleep(0.05)
            raise RuntimeError("sender crashed")
        return mp.barrier(group=mp.new_group([2, 3]))

    err = launch_expecting(RankFailedError, program, 4)
    assert err.rank == 1 and "sender crashed" in str(err)


@pytest.mark.timeout(10)
def test_runtime_diagnosis_on_one_rank_is_raised_as_itself_with_the_rank_noted():
    def program(ctx):
        if ctx.rank == 1:
            return mp.all_gather(np.ones((2, 3)), axis=5)
        return mp.all_gather(np.ones((2, 3)))

    err = launch_expecting(CollectiveUsageError, program, 2)
    assert "(raised on rank 1)" in getattr(err, "__notes__", [])


# ---- no busy waiting ----------------------------------------------------------------------
@pytest.mark.timeout(10)
@pytest.mark.parametrize("wait_in", ["barrier", "recv", "all_reduce"])
def test_blocked_ranks_do_not_busy_wait(wait_in):
    def program(ctx):
        if ctx.rank == 0:
            time.sleep(0.3)  # plain Python: the others are blocked meanwhile
            if wait_in == "recv":
                for r in range(1, ctx.world_size):
                    mp.send(np.ones(2), dst=r)
                return None
        if wait_in == "barrier":
            return mp.barrier()
        if wait_in == "recv":
            return mp.recv(src=0)
        return mp.all_reduce(np.ones(2))

    wall0, cpu0 = time.perf_counter(), time.process_time()
    mp.launch(program, 4)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert wall >= 0.3
    # three blocked threads spinning would burn the GIL for the whole wait: a CPU second per
    # second of waiting; blocked, they cost the launch's own work, which a loaded machine
    # stretches along with the wall time
    assert cpu < 0.05 + 0.3 * wall, f"{cpu:.3f} s of CPU during {wall:.3f} s of waiting"


# ---- bad arguments ------------------------------------------------------------------------
def _only_rank_misbehaves(bad_rank: int, bad, good):
    def program(ctx):
        return bad(ctx) if ctx.rank == bad_rank else good(ctx)
    return program


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind, bad, good, message", [
    ("broadcast",
     lambda ctx, g: mp.broadcast(np.ones(2), src=2, group=g),
     lambda ctx, g: mp.broadcast(np.ones(2), src=0, group=g),
     r"rank 0: broadcast got src=2, which is not in group group\[0, 1\]; src is a global "
     r"rank and must be one of \[0, 1\]"),
    ("reduce",
     lambda ctx, g: mp.reduce(np.ones(2), dst=3, group=g),
     lambda ctx, g: mp.reduce(np.ones(2), dst=1, group=g),
     r"rank 0: reduce got dst=3, which is not in group group\[0, 1\]"),
    ("gather",
     lambda ctx, g: mp.gather(np.ones(2), dst=2, group=g),
     lambda ctx, g: mp.gather(np.ones(2), dst=1, group=g),
     r"rank 0: gather got dst=2, which is not in group group\[0, 1\]"),
    ("scatter",
     lambda ctx, g: mp.scatter(None, src=-1, group=g),
     lambda ctx, g: mp.scatter([np.ones(2)] * 2 if ctx.rank == 0 else None, src=0, group=g),
     r"rank 0: scatter got src=-1, which is not in group group\[0, 1\]"),
])
def test_root_not_in_group(kind, bad, good, message):
    def program(ctx):
        g = mp.new_group([0, 1])
        if ctx.rank not in g:
            return None
        return bad(ctx, g) if ctx.rank == 0 else good(ctx, g)

    err = launch_expecting(CollectiveUsageError, program, 3)
    assert re.search(message, str(err)), str(err)


@pytest.mark.timeout(10)
def test_non_member_calling_a_group_collective():
    def program(ctx):
        g = mp.new_group([0, 1])
        return mp.all_reduce(np.ones((2, 2)), group=g)  # rank 2 is not a member

    err = launch_expecting(CollectiveUsageError, program, 3)
    assert re.search(r"rank 2 called all_reduce on group group\[0, 1\], which it is not a "
                     r"member of", str(err)), str(err)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("world, bad_rank, bad, good, message", [
    (2, 1,
     lambda ctx: mp.reduce_scatter(np.ones((5, 3))),
     lambda ctx: mp.reduce_scatter(np.ones((4, 3))),
     r"rank 1: reduce_scatter over group world\[0, 1\] \(2 ranks\) splits axis 0 of shape "
     r"\(5, 3\) into 2 equal chunks, but 5 is not divisible by 2"),
    (2, 1,
     lambda ctx: mp.reduce_scatter(np.ones((4, 3)), axis=1),
     lambda ctx: mp.reduce_scatter(np.ones((4, 3)), axis=0),
     r"rank 1: reduce_scatter .* splits axis 1 of shape \(4, 3\) .* 3 is not divisible by 2"),
    (2, 0,
     lambda ctx: mp.all_gather(np.ones((2, 3)), axis=2),
     lambda ctx: mp.all_gather(np.ones((2, 3))),
     r"rank 0: all_gather along axis 2 of an array of shape \(2, 3\): axis must be in "
     r"\[-2, 2\)"),
    (2, 1,
     lambda ctx: mp.all_gather(np.ones(4), axis=-2),
     lambda ctx: mp.all_gather(np.ones(4)),
     r"rank 1: all_gather along axis -2 of an array of shape \(4,\)"),
    (3, 0,
     lambda ctx: mp.all_to_all([np.ones(2), np.ones(3)]),
     lambda ctx: mp.all_to_all([np.ones(1)] * 3),
     r"rank 0: all_to_all on group world\[0, 1, 2\] needs one piece per rank \(3\), got 2"),
    (3, 2,
     lambda ctx: mp.all_to_all_single(np.ones((5, 2)), [1, 1, 1]),
     lambda ctx: mp.all_to_all_single(np.ones((3, 2)), [1, 1, 1]),
     r"rank 2: input_split_sizes \[1, 1, 1\] must have 3 non-negative entries summing to "
     r"x.shape\[0\] = 5"),
    (3, 1,
     lambda ctx: mp.all_to_all_single(np.ones(4)),
     lambda ctx: mp.all_to_all_single(np.ones(3)),
     r"rank 1: all_to_all_single splits axis 0 of shape \(4,\) equally over 3 ranks"),
    (3, 1,
     lambda ctx: mp.scatter([np.ones(2), np.ones(2)], src=1),
     lambda ctx: mp.scatter(None, src=1),
     r"rank 1: scatter source must pass one piece per rank of group world\[0, 1, 2\] "
     r"\(3\), got 2 pieces"),
    (3, 1,
     lambda ctx: mp.scatter([np.ones(2), np.ones(3), np.ones(2)], src=1),
     lambda ctx: mp.scatter(None, src=1),
     r"rank 1: scatter pieces must share one shape and dtype, got \[\(\(2,\), \S*float64"
     r"\S*\), \(\(3,\)"),
    (3, 2,
     lambda ctx: mp.broadcast(np.ones(3), src=0),
     lambda ctx: mp.broadcast(np.ones((2, 2)) if ctx.rank == 0 else None, src=0),
     r"rank 2: broadcast from rank 0 on group world\[0, 1, 2\] sent \(2, 2\) float64, but "
     r"this rank passed a buffer of \(3,\) float64"),
    (2, 1,
     lambda ctx: mp.broadcast(np.ones(4, np.float32), src=0),
     lambda ctx: mp.broadcast(np.ones(4), src=0),
     r"rank 1: broadcast from rank 0 .* sent \(4,\) float64, but this rank passed a buffer "
     r"of \(4,\) float32"),
    (2, 1,
     lambda ctx: mp.broadcast(None, src=1),
     lambda ctx: mp.broadcast(None, src=1),
     r"rank 1 is the broadcast source but passed None"),
    (2, 0,
     lambda ctx: mp.all_reduce(None),
     lambda ctx: mp.all_reduce(np.ones(2)),
     r"rank 0: all_reduce needs an array, got None"),
    (3, 1,
     lambda ctx: mp.send(np.ones(2), dst=1),
     lambda ctx: None,
     r"rank 1: send\(dst=1\) needs another member of group world\[0, 1, 2\]; dst is a "
     r"global rank other than 1"),
    (3, 2,
     lambda ctx: mp.recv(src=2),
     lambda ctx: None,
     r"rank 2: recv\(src=2\) needs another member"),
    (3, 0,
     lambda ctx: mp.isend(np.ones(2), dst=3),
     lambda ctx: None,
     r"rank 0: send\(dst=3\) needs another member of group world\[0, 1, 2\]"),
    (2, 0,
     lambda ctx: mp.all_reduce(np.ones(2), op="median"),
     lambda ctx: mp.all_reduce(np.ones(2)),
     r"unknown reduction op 'median'"),
])
def test_bad_arguments_name_the_rank_and_the_shapes(world, bad_rank, bad, good, message):
    err = launch_expecting(CollectiveUsageError, _only_rank_misbehaves(bad_rank, bad, good),
                           world)
    assert re.search(message, str(err)), str(err)
    assert f"(raised on rank {bad_rank})" in getattr(err, "__notes__", [])
