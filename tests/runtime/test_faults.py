"""Fault injection (runtime/faults.py): the planned rank raises at the planned step and
point, every other rank is woken out of what it waits in (WorldAborted), and launch
raises RankFailedError with that rank's traceback; a fault never reached is an error; a
launch without a plan never fails on purpose."""

import threading

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.errors import RankFailedError, WorldAborted
from minipar.runtime.faults import (Fault, FaultNotReached, InjectedFault, fault_point, inject,
                                    step_begins)


def steps_of_all_reduce(steps, done, aborted, lock):
    """A program of `steps` steps, each an all-reduce; records steps done and aborts seen."""
    def program(ctx):
        try:
            for n in range(1, steps + 1):
                step_begins(n)
                fault_point("after the step began")
                total = mp.all_reduce(np.array([float(ctx.rank)]))  # total: [1]
                assert total[0] == sum(range(ctx.world_size))
                with lock:
                    done.append((ctx.rank, n))
        except WorldAborted:
            with lock:
                aborted.append(ctx.rank)
            raise
        return ctx.rank
    return program


@pytest.mark.timeout(30)
@pytest.mark.parametrize("at", ["step", "after the step began"])
def test_the_planned_rank_fails_at_its_step_and_the_others_are_woken(at):
    done, aborted, lock = [], [], threading.Lock()
    program = inject(steps_of_all_reduce(4, done, aborted, lock), Fault(rank=2, step=3, at=at))
    with pytest.raises(RankFailedError) as info:
        mp.launch(program, 4)
    err = info.value
    assert err.rank == 2 and isinstance(err.original, InjectedFault)
    assert f"rank 2 {'as step 3 begins' if at == 'step' else 'at ' + at + ' of step 3'}" \
        in str(err)
    assert "in program" in err.traceback_text  # the rank's own frames
    # rank 2 finished step 2's all-reduce, so every rank had finished step 1; the others
    # are woken out of step 2's (a rank that had not yet woken from it) or step 3's
    assert {(r, 1) for r in range(4)} | {(2, 2)} <= set(done)
    assert not any(n == 3 for _, n in done)
    assert sorted(aborted) == [0, 1, 3]  # none left hanging


@pytest.mark.timeout(30)
def test_a_peer_waiting_in_a_rendezvous_recv_is_woken():
    def program(ctx):
        step_begins(1)
        if ctx.rank == 0:
            return mp.recv(1)
        fault_point("before send")
        mp.send(np.ones(2), 0)

    with pytest.raises(RankFailedError, match="rank 1 raised InjectedFault"):
        mp.launch(inject(program, Fault(1, 1, "before send")), 2)


@pytest.mark.timeout(30)
def test_a_fault_never_reached_is_an_error_naming_what_the_rank_passed():
    done, aborted, lock = [], [], threading.Lock()
    with pytest.raises(FaultNotReached, match=r"rank 1 finished without reaching rank 1 as "
                                              r"step 5 begins.*train at least 5 steps \(the "
                                              r"last step begun was 2\)"):
        mp.launch(inject(steps_of_all_reduce(2, done, aborted, lock), Fault(1, 5)), 2)
    with pytest.raises(FaultNotReached, match=r"at step 2 it passed \['after the step began', "
                                              r"'step'\]; plan the fault at a point this rank "
                                              r"reaches"):
        mp.launch(inject(steps_of_all_reduce(2, done, aborted, lock), Fault(0, 2, "2F1")), 2)


def test_without_a_plan_fault_points_do_nothing():
    done, aborted, lock = [], [], threading.Lock()
    assert list(mp.launch(steps_of_all_reduce(2, done, aborted, lock), 2)) == [0, 1]
    assert list(mp.launch(inject(steps_of_all_reduce(2, done, aborted, lock)), 2)) == [0, 1]
    step_begins(1)  # outside any launch: the default device has no plan either
    fault_point("save")


def test_faults_are_checked_when_planned():
    for kw in [dict(rank=-1, step=1), dict(rank=0, step=0), dict(rank=True, step=1),
               dict(rank=0, step=1, at="")]:
        with pytest.raises(ValueError, match="Fault"):
            Fault(**kw)
    with pytest.raises(TypeError, match=r"Fault\(rank, step, at\)"):
        inject(lambda ctx: None, (3, 1))
    with pytest.raises(RankFailedError, match=r"planned \['rank 4 as step 1 begins'\], but "
                                              r"the world has ranks 0..1"):
        mp.launch(inject(lambda ctx: None, Fault(4, 1)), 2)
