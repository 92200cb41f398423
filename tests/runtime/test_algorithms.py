"""Ring and halving-doubling all-reduce built from send/recv: schedules, results, time."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.runtime import cost
from minipar.runtime.algorithms import (halving_doubling_all_reduce, halving_doubling_schedule,
                                        ring_all_reduce, ring_schedule)
from minipar.runtime.errors import CollectiveUsageError


def test_ring_schedule_for_three_ranks_by_hand():
    # reduce-scatter step 0: rank r sends chunk r, receives chunk r-1 from r-1
    rs0 = [(s.rank, s.send_to, s.send_chunk, s.recv_from, s.recv_chunk)
           for s in ring_schedule(3) if s.phase == "reduce-scatter" and s.step == 0]
    assert rs0 == [(0, 1, 0, 2, 2), (1, 2, 1, 0, 0), (2, 0, 2, 1, 1)]
    # all-gather step 0: rank r sends its reduced chunk r+1
    ag0 = [(s.rank, s.send_chunk, s.recv_chunk)
           for s in ring_schedule(3) if s.phase == "all-gather" and s.step == 0]
    assert ag0 == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]
    assert len(ring_schedule(3)) == 2 * (3 - 1) * 3


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_schedule_messages_match(n):
    """Every chunk a rank receives is the chunk its left neighbour sends in that step."""
    steps = {(s.phase, s.step, s.rank): s for s in ring_schedule(n)}
    for (phase, k, r), s in steps.items():
        left = steps[(phase, k, s.recv_from)]
        assert left.send_to == r and left.send_chunk == s.recv_chunk


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_halving_doubling_schedule_messages_match(n):
    steps = {(s.phase, s.step, s.rank): s for s in halving_doubling_schedule(n)}
    for (phase, k, r), s in steps.items():
        partner = steps[(phase, k, s.send_to)]
        assert partner.send_to == r
    assert len(steps) == 2 * int(np.log2(n)) * n


def test_halving_doubling_refuses_non_power_of_two():
    with pytest.raises(CollectiveUsageError, match="power-of-two"):
        halving_doubling_schedule(6)


@pytest.mark.timeout(60)
@given(n=st.integers(1, 8), size=st.integers(1, 13), seed=st.integers(0, 2**16))
def test_ring_equals_direct_all_reduce(n, size, seed):
    """Integer-valued floats: every order of addition is exact, so results are identical."""
    def prog(ctx):
        rng = np.random.default_rng(seed + ctx.rank)
        x = rng.integers(-50, 50, size).astype(np.float64)
        hd = halving_doubling_all_reduce(x) if n & (n - 1) == 0 else None
        return mp.all_reduce(x), ring_all_reduce(x), hd, x

    res = mp.launch(prog, n)
    expected = sum(r[3] for r in res)
    for direct, ring, hd, _ in res:
        np.testing.assert_array_equal(direct, expected)
        np.testing.assert_array_equal(ring, expected)
        if hd is not None:
            np.testing.assert_array_equal(hd, expected)


@pytest.mark.timeout(30)
def test_ring_on_random_floats_agrees_within_rounding():
    def prog(ctx):
        x = np.random.default_rng(ctx.rank).standard_normal(257)
        return mp.all_reduce(x), ring_all_reduce(x), halving_doubling_all_reduce(x)

    for direct, ring, hd in mp.launch(prog, 8):
        np.testing.assert_allclose(ring, direct, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(hd, direct, rtol=1e-13, atol=1e-13)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_time_equals_formula(n):
    """2(n-1) steps of S/n bytes: the clock shows 2(n-1) a + 2(n-1)/n S/B exactly."""
    S = 8 * 1024 * n  # divisible into n chunks

    def prog(ctx):
        t0 = ctx.clock.now
        ring_all_reduce(np.ones(S // 8))
        return ctx.clock.now - t0

    link = mp.Link.nvlink4()
    expected = 2 * (n - 1) * link.latency + 2 * (n - 1) / n * S / link.bandwidth
    for t in mp.launch(prog, n):
        assert t == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(cost.ring_all_reduce_time(S, n, link), rel=1e-12)


@pytest.mark.timeout(30)
def test_ring_steps_are_recorded_in_the_trace():
    def prog(ctx):
        ring_all_reduce(np.arange(8.0))
        return [(e.name, e.meta.get("phase"), e.meta.get("step"), e.meta.get("send_chunk"))
                for e in ctx.trace.events if e.meta.get("algorithm") == "ring"]

    res = mp.launch(prog, 4)
    sends = [r for r in res[1] if r[0] == "send"]
    assert len(sends) == 2 * 3
    mine = [s for s in ring_schedule(4) if s.rank == 1]
    assert [(p, k, c) for _, p, k, c in sends] == [(s.phase, s.step, s.send_chunk) for s in mine]
