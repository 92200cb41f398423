"""Ring attention against one device: forward and backward of both layouts equal nn's
core_attention_forward / core_attention_backward to 1e-12 for cp in {1, 2, 4}; the
transfers overlap the block compute on the clock; the mask on the diagonal block off by one
and dK/dV that never come home both fail; bad inputs are refused with what to change."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.parallel.cp import ring, ring_attention_backward, ring_attention_forward, shard

FWD, BWD = ring_attention_forward, ring_attention_backward


@pytest.mark.timeout(120)
@settings(max_examples=25)
@given(layout=st.sampled_from(["contiguous", "zigzag"]), cp=st.sampled_from([1, 2, 4]),
       per_chunk=st.integers(1, 3), b=st.integers(1, 2), heads=st.integers(1, 3),
       d=st.integers(1, 4), seed=st.integers(0, 999))
def test_ring_attention_equals_one_device(cpkit, layout, cp, per_chunk, b, heads, d, seed):
    s = (2 if layout == "zigzag" else 1) * cp * per_chunk
    qkv, dctx = cpkit.inputs(s, b, heads, d, seed)
    want_ctx, want_dqkv = cpkit.one_device(qkv, dctx, heads)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, heads, cp, layout)
    cpkit.assert_close(run.context, want_ctx, what="context")
    cpkit.assert_close(run.dqkv, want_dqkv, what="dqkv")  # dq, and dk, dv come home


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sends", ["rendezvous", "eager"])
def test_both_send_modes_finish_with_the_same_answer(cpkit, sends):
    qkv, dctx = cpkit.inputs(16, 2, 2, 3, 0)
    want_ctx, want_dqkv = cpkit.one_device(qkv, dctx, 2)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, 2, 4, "zigzag", sends=sends)
    cpkit.assert_close(run.context, want_ctx)
    cpkit.assert_close(run.dqkv, want_dqkv)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_diagonal_mask_off_by_one_differs(cpkit, layout, monkeypatch):
    """The planted error: the diagonal block lets query i see key i + 1."""
    qkv, dctx = cpkit.inputs(16, 1, 2, 3, 1)
    want_ctx, _ = cpkit.one_device(qkv, dctx, 2)
    monkeypatch.setattr(ring, "causal_allowed", lambda q, k: k[None, :] <= q[:, None] + 1)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, 2, 4, layout)
    assert not np.allclose(run.context, want_ctx, atol=1e-6)


@pytest.mark.timeout(60)
def test_dk_dv_that_never_come_home_differ(cpkit, monkeypatch):
    """The planted error: the dK/dV accumulators are not passed on (every message arrives
    as zeros), so no rank's K/V gradient gathers the other ranks' queries' shares."""
    qkv, dctx = cpkit.inputs(8, 1, 1, 2, 2)
    _, want_dqkv = cpkit.one_device(qkv, dctx, 1)
    real_irecv = ring.irecv

    def stale(src, group=None, tag=0):
        work = real_irecv(src, group, tag)
        if tag != ring.DKV_TAG:
            return work
        return type("Stale", (), {"wait": lambda self: work.wait() * 0})()

    monkeypatch.setattr(ring, "irecv", stale)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, 1, 2, "contiguous")
    assert not np.allclose(run.dqkv, want_dqkv, atol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("peak", [1e8, 1e15])  # compute-bound, then transfer-bound steps
def test_the_transfers_overlap_the_block_compute(cpkit, peak):
    """Zigzag: every step computes 2 chunk-pair units (T_c) and sends one K/V shard (T_s).
    Each send starts with its step's compute, so the forward takes
    (cp − 1) · max(T_c, T_s) + T_c, not cp · T_c + (cp − 1) · T_s."""
    cp, s, b, heads, d = 4, 16, 2, 2, 4
    device = mp.DeviceSpec("slow", {"float64": peak}, 80 * 10**9)
    topo = mp.Topology.nodes(1, cp, device)
    qkv, dctx = cpkit.inputs(s, b, heads, d, 0)

    def program(ctx):
        group = mp.new_group(range(cp))
        ring_attention_forward(shard(qkv, "zigzag", ctx.rank, cp), heads, group, "zigzag")
        return ctx.clock.now

    times = mp.launch(program, cp, topology=topo)
    c = s // (2 * cp)
    t_c = 2 * (2 * b * heads * c * c * d) * 2 / peak  # 2 matmuls of 2 units
    t_s = topo.intra.time(2 * (s // cp) * b * heads * d * 8)  # K and V, float64
    for t in times:
        assert t == pytest.approx((cp - 1) * max(t_c, t_s) + t_c, rel=1e-12)
        assert t < cp * t_c + (cp - 1) * t_s


@pytest.mark.timeout(60)
def test_dropout_and_bad_inputs_are_refused(cpkit):
    qkv, _ = cpkit.inputs(8, 1, 2, 2, 0)

    def attempt(ctx):
        if ctx.rank >= 2:
            return []
        g = mp.new_group([0, 1], "cp")
        x = shard(qkv, "contiguous", ctx.rank, 2)
        errors = []
        for call in (lambda: FWD(x, 2, g, p=0.1),
                     lambda: FWD(x[:3], 2, g, "zigzag"),
                     lambda: FWD(x, 5, g),
                     lambda: FWD(x, 2, mp.new_group([2, 3], "other")),
                     lambda: FWD(x, 2, [0, 1])):
            try:
                call()
            except (ValueError, TypeError) as e:
                errors.append(str(e))
        return errors

    errors = mp.launch(attempt, 4)[0]
    assert len(errors) == 5
    assert "rank 0" in errors[0] and "received attention dropout p = 0.1" in errors[0]
    assert "expected p = 0" in errors[0] and "cp group" in errors[0]
    assert "(3, 1, 12)" in errors[1] and "multiple of 4" in errors[1]
    assert "num_heads = 5" in errors[2]
    assert "not a member" in errors[3] and "ProcessGroup" in errors[4]
