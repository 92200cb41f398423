"""The lowering: sends and receives derived from the compute actions, one message per
cross-rank dependency, each placed so that isend/irecv under rendezvous sends cannot hang.

The contract is checked on the runtime itself: executing the lowered lists with isend
(waited at the end) and irecv (waited at once) finishes for every schedule, on the clock the
dry run predicts to the last bit; with blocking rendezvous sends 1F1B hangs, and the runtime
diagnoses it, which is why the contract says isend.
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.parallel.pp import (RECV_B, RECV_F, SEND_B, SEND_F, Action, ScheduleError,
                                 check_deadlock, dry_run, format_schedule, lower, message,
                                 placement, schedule, validate_schedule)
from minipar.runtime import cost
from minipar.runtime.errors import DeadlockError as RuntimeDeadlock

# (name, p, m, chunks) over the whole space: interleaving takes m a multiple of p
configs = st.one_of(
    st.tuples(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 16),
              st.just(1)),
    st.tuples(st.just("interleaved_1f1b"), st.integers(1, 8), st.integers(1, 16),
              st.integers(1, 3)).map(lambda c: (c[0], c[1], c[1] * max(1, c[2] // c[1]), c[3])))


def test_1f1b_on_two_ranks_lowered_by_hand():
    assert format_schedule(lower(schedule("1f1b", 2, 2))) == (
        "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
        "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1")


@given(config=configs)
def test_each_message_sits_beside_the_action_that_makes_or_uses_it(config):
    name, p, m, v = config
    compute = schedule(name, p, m, v)
    lowered = lower(compute)
    where = placement(compute)
    assert [[a for a in row if a.is_compute] for row in lowered] == compute
    messages = {}
    for r, row in enumerate(lowered):
        for k, a in enumerate(row):
            if not a.is_communication:
                continue
            msg = message(a, where)
            if a.kind in (SEND_F, SEND_B):   # just after the compute action that produced it
                assert row[k - 1] == Action(a.stage, "F" if a.kind == SEND_F else "B",
                                            a.microbatch) and msg.src == r
            else:                             # just before the one that consumes it
                assert row[k + 1] == Action(a.stage, "F" if a.kind == RECV_F else "B",
                                            a.microbatch) and msg.dst == r
            assert msg.src != msg.dst and abs(msg.src_stage - msg.dst_stage) == 1
            messages.setdefault(msg, []).append(a)
    # one send and one receive per message: activations and gradients across each of the
    # S - 1 boundaries for each micro-batch, all on other ranks once p > 1; none at p = 1
    S = p * v
    assert len(messages) == (2 * m * (S - 1) if p > 1 else 0)
    assert all(sorted(a.kind.value[:4] for a in pair) == ["RECV", "SEND"]
               for pair in messages.values())
    assert len({msg.tag for msg in messages}) == len(messages)  # tags tell them apart
    check_deadlock(lowered, validate_schedule(lowered))          # and nothing waits forever


def test_stages_on_one_rank_pass_tensors_without_messages():
    lowered = lower(schedule("interleaved_1f1b", 1, 2, chunks=3))
    assert not any(a.is_communication for a in lowered[0])


def test_a_message_knows_its_peers_and_tag():
    where = {0: 0, 1: 1, 2: 0, 3: 1}              # two chunks on two ranks
    send = message(Action(1, SEND_F, 2), where)  # stage 1 -> stage 2, rank 1 -> rank 0
    assert (send.src, send.dst, send.src_stage, send.dst_stage) == (1, 0, 1, 2)
    assert send == message(Action(2, RECV_F, 2), where)
    assert send.recv == Action(2, RECV_F, 2) and send.send == Action(1, SEND_F, 2)
    grad = message(Action(2, RECV_B, 2), where)  # stage 3's input gradient -> stage 2
    assert (grad.src, grad.dst, grad.tag) == (1, 0, 2 * (2 * 4 + 2) + 1)
    with pytest.raises(ScheduleError, match="0SEND_B0 has no peer"):
        message(Action(0, SEND_B, 0), where)
    with pytest.raises(ScheduleError, match="message\\(\\) takes SEND_F"):
        message(Action(0, "F", 0), where)


def test_lower_takes_valid_compute_schedules_only():
    with pytest.raises(ScheduleError, match="already lowered"):
        lower(lower(schedule("1f1b", 2, 2)))
    with pytest.raises(ScheduleError, match="rank 0: 0B0 .* comes before 0F0"):
        lower([[Action(0, "B", 0), Action(0, "F", 0)]])


# ---- the contract, on the runtime ----------------------------------------------------------
FLOPS = {"F": 3e12, "B": 6e12}
NBYTES = 4096


def execute(lowered, blocking_sends=False, topology=None):
    """Run lowered lists on simulated devices: compute charges FLOPS on the clock, a SEND
    isends NBYTES (waited at the end of the list, or sent blocking), a RECV is waited at once."""
    where = placement(lowered)

    def program(ctx):
        pending = []
        for a in lowered[ctx.rank]:
            if a.is_compute:
                ctx.compute(FLOPS[a.kind.value])
            elif a.kind in (SEND_F, SEND_B):
                msg = message(a, where)
                x = np.zeros(NBYTES // 8)
                if blocking_sends:
                    mp.send(x, msg.dst, tag=msg.tag)
                else:
                    pending.append(mp.isend(x, msg.dst, tag=msg.tag))
            else:
                msg = message(a, where)
                mp.irecv(msg.src, tag=msg.tag).wait()
        for work in pending:
            work.wait()
        return ctx.clock.compute

    return mp.launch(program, len(lowered), topology=topology)


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1),
                                           ("1f1b", 4, 2, 1), ("interleaved_1f1b", 2, 4, 2),
                                           ("interleaved_1f1b", 3, 3, 2)])
def test_isend_and_irecv_finish_on_the_clock_the_dry_run_predicts(name, p, m, v):
    topology = mp.Topology.nodes(2, gpus_per_node=2) if p == 4 else None
    lowered = lower(schedule(name, p, m, v))
    finish = execute(lowered, topology=topology)
    ctx = finish.contexts[0]
    seconds = {k: f / ctx.device.peak("float32") for k, f in FLOPS.items()}
    links = {(a, b): cost.p2p_time(NBYTES, ctx.topology.link(a, b))
             for a in range(p) for b in range(p) if a != b}
    predicted = dry_run(lowered, seconds, lambda msg: links[msg.src, msg.dst])
    assert list(finish) == list(predicted.finish)  # bit for bit, floats included
    assert finish.elapsed() == predicted.makespan


def test_blocking_rendezvous_sends_hang_1f1b_and_the_runtime_says_so():
    # rank 0 sends the activations of micro-batch 1 while rank 1 sends the gradient of
    # micro-batch 0: each waits for the other's receive (Megatron batches the two instead)
    lowered = lower(schedule("1f1b", 2, 3))
    with pytest.raises(RuntimeDeadlock):
        execute(lowered, blocking_sends=True)
    assert len(execute(lowered)) == 2                       # isend: it finishes
    assert len(execute(lower(schedule("gpipe", 2, 3)), blocking_sends=True)) == 2
