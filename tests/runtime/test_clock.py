"""The simulated clock, through real launches: when work starts, how long it lasts.

A toy device with round peak rates makes compute times exact: 1e9 float64 FLOPs at
1e12 FLOP/s is 1 ms. Links are the NVLink 4 (450e9 B/s, 1 us) and IB NDR (50e9 B/s, 5 us)
presets, so each expected time is the cost formula written out by hand.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.clock import Clock
from minipar.runtime.device import DeviceSpec
from minipar.runtime.topology import Topology

TOY = DeviceSpec("toy", {"float64": 1e12, "bfloat16": 4e12}, 10**12)
MS = 1e9  # float64 FLOPs that take 1 ms on TOY
ONE_MB = 125_000  # float64 elements in 1e6 bytes


def exactly(x):
    return pytest.approx(x, rel=1e-12, abs=1e-18)


def one_node(n):
    return Topology.nodes(1, n, device=TOY)


def comm_events(ctx, name=None):
    return ctx.trace.of("comm", name)


# ---- the Clock itself ---------------------------------------------------------------
def test_clock_streams_start_at_zero_and_compute_advances():
    c = Clock()
    assert (c.compute, c.comm, c.p2p, c.now) == (0.0, 0.0, 0.0, 0.0)
    assert c.advance_compute(0.5) == (0.0, 0.5)
    assert c.advance_compute(0.25) == (0.5, 0.75)
    assert c.now == 0.75


def test_clock_refuses_negative_compute():
    with pytest.raises(ValueError, match="cannot be negative"):
        Clock().advance_compute(-1e-3)


def test_wait_until_never_moves_the_clock_back():
    c = Clock()
    c.advance_compute(2.0)
    c.wait_until(1.0)
    assert c.now == 2.0
    c.wait_until(3.0)
    assert c.now == 3.0


def test_elapsed_is_the_latest_stream():
    c = Clock()
    c.advance_compute(1.0)
    c.comm_free[("dp", (0, 1))], c.comm_free[("tp", (0, 1))], c.p2p = 4.0, 3.0, 2.0
    assert c.comm == 4.0 and c.comm_stream(("tp", (0, 1))) == 3.0
    assert c.elapsed() == 4.0


# ---- compute: FLOPs / peak(dtype) -------------------------------------------------------
def test_device_presets_published_numbers():
    a100, h100, h200 = DeviceSpec.a100_80gb(), DeviceSpec.h100_sxm(), DeviceSpec.h200()
    assert a100.peak("bfloat16") == 312e12 and a100.peak("float16") == 312e12
    assert a100.memory_bytes == 80 * 10**9
    assert h100.peak("bfloat16") == 989e12 and h100.peak(np.float16) == 989e12
    assert h100.memory_bytes == 80 * 10**9
    assert h200.memory_bytes == 141 * 10**9
    assert h200.peak("bfloat16") == 989e12  # an H100 with more (and faster) memory
    assert DeviceSpec.preset("H100-SXM").name == h100.name
    assert DeviceSpec.preset("a100").peak("bfloat16") == 312e12
    with pytest.raises(ValueError, match="unknown device preset"):
        DeviceSpec.preset("tpu")
    with pytest.raises(KeyError, match="no peak rate for dtype 'int4'"):
        h100.peak("int4")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("device, dtype, peak", [
    (DeviceSpec.a100_80gb(), "bfloat16", 312e12),
    (DeviceSpec.h100_sxm(), "bfloat16", 989e12),
    (DeviceSpec.h100_sxm(), "float32", 494e12),
    (DeviceSpec.h200(), "float16", 989e12),
    (TOY, "float64", 1e12),
])
def test_compute_advances_by_flops_over_peak_of_the_dtype(device, dtype, peak):
    def prog(ctx):
        e1 = ctx.compute(2 * peak, dtype, name="matmul")  # two seconds of work
        e2 = ctx.compute(peak / 4, dtype)
        return e1.start, e1.end, e2.end, ctx.clock.now

    res = mp.launch(prog, 2, topology=Topology.nodes(1, 2, device=device))
    for start, end1, end2, now in res:
        assert start == 0.0
        assert end1 == exactly(2.0)
        assert end2 == exactly(2.25)
        assert now == exactly(2.25)
    ev = res.contexts[0].trace.of("compute", "matmul")[0]
    assert ev.flops == 2 * peak


@pytest.mark.timeout(20)
def test_compute_uses_the_dtype_rate():
    def prog(ctx):
        ctx.compute(4e12, "bfloat16")  # 1 s at 4e12
        ctx.compute(1e12, "float64")  # 1 s at 1e12
        return ctx.clock.now

    assert mp.launch(prog, 1, topology=one_node(1)) == [exactly(2.0)]


# ---- collectives ---------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_blocking_all_reduce_starts_at_the_latest_arrival():
    def prog(ctx):
        ctx.compute((ctx.rank + 1) * MS, "float64")  # rank r arrives at (r + 1) ms
        out = mp.all_reduce(np.full(ONE_MB, float(ctx.rank)))
        return out[0], ctx.clock.now

    res = mp.launch(prog, 4, topology=one_node(4))
    duration = 2 * 3 * 1e-6 + 2 * 3 / 4 * 1e6 / 450e9  # ring, n = 4, S = 1 MB, NVLink 4
    for r, (value, now) in enumerate(res):
        assert value == 0 + 1 + 2 + 3
        (ev,) = comm_events(res.contexts[r], "all_reduce")
        assert ev.start == exactly(4e-3)  # the last rank arrives at 4 ms
        assert ev.end == exactly(4e-3 + duration)
        assert ev.meta["issued"] == exactly((r + 1) * 1e-3)
        assert (ev.meta["algorithm"], ev.meta["link"]) == ("ring", "NVLink4")
        assert now == exactly(4e-3 + duration)  # blocking: compute waited for it
    assert res.elapsed() == exactly(4e-3 + duration)


@pytest.mark.timeout(20)
def test_a_second_collective_queues_behind_the_first_on_the_comm_stream():
    t_big = 2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9  # ring all_reduce, n = 2, 1 MB
    t_small = 2 * 1 * 1e-6 + 2 * 1 / 2 * 8 / 450e9  # 8 bytes

    def prog(ctx):
        w1 = mp.all_reduce(np.ones(ONE_MB), async_op=True)  # issued at 0
        ctx.compute(1e6, "float64")  # 1 us, less than t_big
        out = mp.all_reduce(np.ones(1))  # issued at 1 us, but the comm stream is busy
        w1.wait()
        return out, ctx.clock.now

    res = mp.launch(prog, 2, topology=one_node(2))
    for ctx, (out, now) in zip(res.contexts, res):
        first, second = sorted(comm_events(ctx), key=lambda e: e.start)
        assert first.start == 0.0 and first.end == exactly(t_big)
        assert second.meta["issued"] == exactly(1e-6)
        assert second.start == exactly(t_big)  # not 1 us: it queued
        assert second.end == exactly(t_big + t_small)
        assert now == exactly(t_big + t_small)
        assert out.tolist() == [2.0]


@pytest.mark.timeout(20)
def test_two_async_collectives_in_a_row_run_back_to_back():
    t = 2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9

    def prog(ctx):
        w1 = mp.all_reduce(np.ones(ONE_MB), async_op=True)
        w2 = mp.all_reduce(np.ones(ONE_MB), async_op=True)
        assert ctx.clock.now == 0.0  # issuing costs the compute stream nothing
        w2.wait()
        w1.wait()
        return ctx.clock.now, w1.end_time, w2.end_time

    for now, end1, end2 in mp.launch(prog, 2, topology=one_node(2)):
        assert end1 == exactly(t) and end2 == exactly(2 * t) and now == exactly(2 * t)


@pytest.mark.timeout(20)
def test_async_all_reduce_overlaps_compute_and_wait_moves_the_clock_only_forward():
    t = 2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9  # 4.22 us

    def prog(ctx):
        w = mp.all_reduce(np.ones(ONE_MB), async_op=True)
        ctx.compute(1e6, "float64")  # 1 us of compute while communicating
        before = ctx.clock.now
        w.wait()  # the communication ends later: compute waits for it
        short = (before, ctx.clock.now)

        w = mp.all_reduce(np.ones(ONE_MB), async_op=True)  # issued at t
        ctx.compute(1 * MS, "float64")  # 1 ms of compute hides the whole transfer
        before = ctx.clock.now
        w.wait()  # already finished: the clock does not move
        long = (before, ctx.clock.now)
        return short, long

    res = mp.launch(prog, 2, topology=one_node(2))
    for ctx, (short, long) in zip(res.contexts, res):
        assert short == (exactly(1e-6), exactly(t))
        assert long == (exactly(t + 1e-3), exactly(t + 1e-3))
        second = comm_events(ctx)[1]
        assert (second.start, second.end) == (exactly(t), exactly(2 * t))
        compute = ctx.trace.of("compute")[1]
        assert compute.start == exactly(t) and compute.end == exactly(t + 1e-3)


@pytest.mark.timeout(20)
def test_async_work_of_ranks_arriving_late_starts_when_the_last_one_issues():
    t = 2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9

    def prog(ctx):
        if ctx.rank == 1:
            ctx.compute(2 * MS, "float64")
        w = mp.all_reduce(np.ones(ONE_MB), async_op=True)
        ctx.compute(1 * MS, "float64")
        w.wait()
        return ctx.clock.now

    res = mp.launch(prog, 2, topology=one_node(2))
    # rank 0 computes until 1 ms, then waits for the collective that started at 2 ms
    assert res[0] == exactly(2e-3 + t)
    # rank 1 issued at 2 ms and computed until 3 ms, long after the collective ended
    assert res[1] == exactly(3e-3)


# ---- topology: which link a collective crosses ---------------------------------------
@pytest.mark.timeout(20)
def test_a_collective_on_a_group_spanning_nodes_uses_the_inter_node_link():
    topo = Topology.nodes(2, 2, device=TOY)  # ranks 0, 1 on node 0; 2, 3 on node 1

    def prog(ctx):
        across = mp.new_group([ctx.rank % 2, ctx.rank % 2 + 2], name="across")
        within = mp.new_group([ctx.rank - ctx.rank % 2, ctx.rank - ctx.rank % 2 + 1],
                              name="within")
        mp.all_reduce(np.ones(ONE_MB), group=across)
        mp.all_reduce(np.ones(ONE_MB), group=within)
        mp.all_reduce(np.ones(ONE_MB))  # the world: 2 nodes of 2, hierarchical
        return ctx.clock.now

    res = mp.launch(prog, 4, topology=topo)
    t_across = 2 * 1 * 5e-6 + 2 * 1 / 2 * 1e6 / 50e9
    t_within = 2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9
    t_world = ((1 * 1e-6 + 1 / 2 * 1e6 / 450e9)  # reduce-scatter inside the node
               + (2 * 1 * 5e-6 + 2 * 1 / 2 * 0.5e6 / 50e9)  # all_reduce of S/2 across
               + (1 * 1e-6 + 1 / 2 * 1e6 / 450e9))  # all-gather inside the node
    for ctx in res.contexts:
        a, w, g = comm_events(ctx)
        assert (a.meta["link"], a.meta["algorithm"]) == ("IB-NDR400", "ring")
        assert a.duration == exactly(t_across)
        assert (w.meta["link"], w.meta["algorithm"]) == ("NVLink4", "ring")
        assert w.duration == exactly(t_within)
        assert (g.meta["link"], g.meta["algorithm"]) == ("NVLink4+IB-NDR400", "hierarchical")
        assert g.duration == exactly(t_world)
    assert res == [exactly(t_across + t_within + t_world)] * 4


@pytest.mark.timeout(20)
def test_launch_algorithm_selects_the_formula():
    def prog(ctx):
        mp.all_reduce(np.ones(ONE_MB))
        return ctx.clock.now

    res = mp.launch(prog, 4, topology=one_node(4), algorithm="tree")
    assert res == [exactly(2 * 2 * (1e-6 + 1e6 / 450e9))] * 4  # ceil(log2 4) = 2
    res = mp.launch(prog, 4, topology=one_node(4), algorithm="halving_doubling")
    assert res == [exactly(2 * 2 * 1e-6 + 2 * 3 / 4 * 1e6 / 450e9)] * 4


@pytest.mark.timeout(20)
def test_all_to_all_with_uneven_pieces_is_timed_from_the_traffic_matrix():
    topo = Topology.nodes(2, 2, device=TOY)
    # bytes rank i sends to rank j (as float64 element counts: MB * 125_000)
    T = [[0, 10, 1, 1], [10, 0, 1, 1], [20, 1, 0, 10], [20, 1, 10, 0]]

    def prog(ctx):
        pieces = [np.full(T[ctx.rank][j] * ONE_MB, float(ctx.rank)) for j in range(4)]
        got = mp.all_to_all(pieces)
        return [g.size for g in got]

    res = mp.launch(prog, 4, topology=topo)
    assert res[0] == [T[j][0] * ONE_MB for j in range(4)]
    # rank 0 receives 20 + 20 MB from the other node: 40e6 / 50e9 on its NIC
    for ctx in res.contexts:
        (ev,) = comm_events(ctx, "all_to_all")
        assert ev.duration == exactly(3 * 5e-6 + 40e6 / 50e9)
        assert ev.meta["sent_bytes"] == sum(T[ctx.rank][j] * 1e6 for j in range(4)
                                            if j != ctx.rank)


# ---- point to point -------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_blocking_send_costs_the_sender_alpha_plus_v_over_b():
    t = 1e-6 + 1e6 / 450e9

    def prog(ctx):
        if ctx.rank == 0:
            ctx.compute(1 * MS, "float64")
            mp.send(np.arange(ONE_MB, dtype=np.float64), dst=1)
            return ctx.clock.now
        got = mp.recv(src=0)  # posted at 0, long before the message arrives
        assert np.array_equal(got, np.arange(ONE_MB, dtype=np.float64))
        return ctx.clock.now

    res = mp.launch(prog, 2, topology=one_node(2))
    assert res[0] == exactly(1e-3 + t)
    assert res[1] == exactly(1e-3 + t)  # the receiver completes when the message arrives
    (send,) = res.contexts[0].trace.of("p2p", "send")
    assert (send.start, send.end) == (exactly(1e-3), exactly(1e-3 + t))
    assert send.meta["link"] == "NVLink4"
    (recv,) = res.contexts[1].trace.of("recv", "recv")
    assert (recv.start, recv.end) == (exactly(1e-3), exactly(1e-3 + t))


@pytest.mark.timeout(20)
def test_a_receive_posted_after_the_arrival_completes_at_once():
    t = 1e-6 + 1e6 / 450e9

    def prog(ctx):
        if ctx.rank == 0:
            mp.send(np.ones(ONE_MB), dst=1)
        else:
            ctx.compute(5 * MS, "float64")  # busy until 5 ms; the message arrived at t
            mp.recv(src=0)
        return ctx.clock.now

    res = mp.launch(prog, 2, topology=one_node(2))
    assert res[0] == exactly(t)
    assert res[1] == exactly(5e-3)  # max(posted at 5 ms, arrived at t)


@pytest.mark.timeout(20)
def test_send_between_nodes_crosses_infiniband():
    def prog(ctx):
        if ctx.rank == 0:
            mp.send(np.ones(ONE_MB), dst=1)
        else:
            mp.recv(src=0)
        return ctx.clock.now

    res = mp.launch(prog, 2, topology=Topology.nodes(2, 1, device=TOY))
    assert res == [exactly(5e-6 + 1e6 / 50e9)] * 2
    assert res.contexts[0].trace.of("p2p")[0].meta["link"] == "IB-NDR400"


@pytest.mark.timeout(20)
def test_isend_runs_on_the_p2p_stream_while_compute_goes_on():
    t = 1e-6 + 1e6 / 450e9

    def prog(ctx):
        if ctx.rank == 0:
            w1 = mp.isend(np.ones(ONE_MB), dst=1)
            w2 = mp.isend(np.ones(ONE_MB), dst=1)  # queues behind the first on p2p
            ctx.compute(1e6, "float64")  # 1 us
            before = ctx.clock.now
            w1.wait()
            w2.wait()
            return before, ctx.clock.now, ctx.clock.p2p
        mp.recv(src=0)
        mp.recv(src=0)
        return ctx.clock.now

    res = mp.launch(prog, 2, topology=one_node(2))
    before, now, p2p = res[0]
    assert before == exactly(1e-6)
    assert now == exactly(2 * t) and p2p == exactly(2 * t)
    assert res[1] == exactly(2 * t)


# ---- one comm stream per process group ------------------------------------------------
@pytest.mark.timeout(20)
def test_collectives_of_different_groups_overlap_and_of_one_group_queue():
    """An async all_reduce on the dp group does not delay a tp all_reduce issued after it,
    while a second dp all_reduce queues behind the first."""
    nbytes = 8 * 1_000_000

    def prog(ctx):
        mesh = mp.init_device_mesh((2, 2), ("dp", "tp"))
        dp, tp = mesh.get_group("dp", ctx.rank), mesh.get_group("tp", ctx.rank)
        w1 = mp.all_reduce(np.ones(nbytes // 8), group=dp, async_op=True)
        w2 = mp.all_reduce(np.ones(nbytes // 8), group=dp, async_op=True)
        mp.all_reduce(np.ones(nbytes // 8), group=tp)
        w1.wait(), w2.wait()
        return [(e.label, e.start, e.end) for e in ctx.trace.of("comm")]

    t = mp.Link.nvlink4().latency * 2 + 2 * (1 / 2) * nbytes / mp.Link.nvlink4().bandwidth
    for events in mp.launch(prog, 4):
        by_label = sorted(events, key=lambda e: (e[0], e[1]))
        dp1, dp2, tp1 = by_label[0], by_label[1], by_label[2]
        assert dp1[1] == 0.0 and dp1[2] == pytest.approx(t)
        assert dp2[1] == pytest.approx(t) and dp2[2] == pytest.approx(2 * t)  # queued
        assert tp1[1] == 0.0 and tp1[2] == pytest.approx(t)  # ran alongside dp1


@pytest.mark.timeout(20)
def test_an_unmatched_collective_of_one_group_does_not_block_another_group():
    """Rank 0 issues an async all_reduce on {0, 2}, then a blocking one on {0, 1}; rank 2
    joins the first only after hearing from rank 1, who first needs the second. With one
    stream per group (as in PyTorch's NCCL backend) this completes."""
    def prog(ctx):
        a, b = mp.new_group([0, 2], name="a"), mp.new_group([0, 1], name="b")
        if ctx.rank == 0:
            w = mp.all_reduce(np.array([1.0]), group=a, async_op=True)
            got_b = mp.all_reduce(np.array([1.0]), group=b)
            return float(w.wait()[0]), float(got_b[0])
        if ctx.rank == 1:
            got_b = mp.all_reduce(np.array([2.0]), group=b)
            mp.send(np.array([7.0]), dst=2)
            return float(got_b[0])
        token = mp.recv(src=1)
        return float(mp.all_reduce(np.array([10.0]) + token, group=a)[0])

    assert mp.launch(prog, 3) == [(18.0, 3.0), 3.0, 18.0]


@pytest.mark.timeout(20)
def test_is_completed_tells_without_blocking():
    def prog(ctx):
        if ctx.rank == 0:
            w = mp.all_reduce(np.ones(2), async_op=True)
            before = w.is_completed()  # rank 1 has not arrived: it waits for our token
            mp.send(np.ones(1), dst=1)
            w.wait()
            return before, w.is_completed()
        mp.recv(src=0)
        return mp.all_reduce(np.ones(2)).tolist()

    res = mp.launch(prog, 2)
    assert res[0] == (False, True) and res[1] == [2.0, 2.0]
