"""Schedules as data: GPipe, 1F1B and interleaved 1F1B, each valid for every (p, m, v), each
as its rule says, and every bad argument refused with the fix."""

import pytest
from hypothesis import given, strategies as st

from minipar.parallel.pp import (SCHEDULES, ScheduleError, format_schedule, parse_schedule,
                                 peak_in_flight, schedule, validate_schedule)

sizes = dict(pp=st.integers(1, 8), m=st.integers(1, 16), chunks=st.integers(1, 3))
# interleaving needs m % p == 0: (p, m) with m a multiple of p, at most 16
grouped = st.integers(1, 8).flatmap(
    lambda p: st.tuples(st.just(p), st.integers(1, 16 // p).map(lambda k: k * p)))


def _valid(name, pp, m, chunks=1):
    sched = schedule(name, pp, m, chunks)
    info = validate_schedule(sched, microbatches=m, stages=pp * chunks)
    assert len(sched) == pp
    assert info.placement == {s: s % pp for s in range(pp * chunks)}
    assert info.counts == tuple({"B": chunks * m, "F": chunks * m} for _ in range(pp))
    return sched


@given(pp=sizes["pp"], m=sizes["m"])
def test_gpipe_and_1f1b_validate_for_every_size(pp, m):
    for name in ("gpipe", "1f1b"):
        assert sum(map(len, _valid(name, pp, m))) == 2 * pp * m  # one F and one B each


@given(pm=grouped, chunks=sizes["chunks"])
def test_interleaved_validates_for_every_size_it_accepts(pm, chunks):
    pp, m = pm
    assert sum(map(len, _valid("interleaved_1f1b", pp, m, chunks))) == 2 * pp * chunks * m


def test_gpipe_is_all_forwards_then_all_backwards():
    assert format_schedule(schedule("gpipe", 2, 3)) == ("rank 0: 0F0 0F1 0F2 0B0 0B1 0B2\n"
                                                       "rank 1: 1F0 1F1 1F2 1B0 1B1 1B2")


def test_1f1b_warms_up_p_minus_r_minus_1_forwards_then_alternates():
    assert format_schedule(schedule("1f1b", 3, 4)) == (
        "rank 0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3\n"   # warm-up 2 = p - 0 - 1, then F3 B0 ...
        "rank 1: 1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3\n"   # warm-up 1
        "rank 2: 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3")    # warm-up 0: the last stage alternates
    # fewer micro-batches than stages: the warm-up is cut to m, which is GPipe's order
    assert schedule("1f1b", 4, 2)[0] == schedule("gpipe", 4, 2)[0]


def test_interleaved_follows_megatrons_groups_of_p_microbatches():
    # p = 2, v = 2, m = 4, derived by hand from the rule in schedules.py: virtual forwards
    # k = 0..7 are (chunk, mb) (0,0) (0,1) (1,0) (1,1) (0,2) (0,3) (1,2) (1,3); stage =
    # chunk·p + r; rank 0 warms up 2(p-1) + (v-1)p = 4, rank 1 warms up (v-1)p = 2
    assert schedule("interleaved_1f1b", 2, 4, chunks=2) == parse_schedule([
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"])


@given(pp=sizes["pp"], m=sizes["m"])
def test_activations_in_flight_gpipe_m_1f1b_p_minus_r(pp, m):
    """The claim that 1F1B holds every micro-batch's activations is wrong: rank r holds at
    most min(p - r, m) of them, against GPipe's m on every rank."""
    assert peak_in_flight(schedule("gpipe", pp, m)) == [m] * pp
    assert peak_in_flight(schedule("1f1b", pp, m)) == [min(pp - r, m) for r in range(pp)]


@given(pm=grouped, chunks=sizes["chunks"])
def test_interleaved_holds_its_warm_up_plus_one(pm, chunks):
    pp, m = pm
    n = m * chunks
    warm = [min(2 * (pp - r - 1) + (chunks - 1) * pp, n) for r in range(pp)]
    assert peak_in_flight(schedule("interleaved_1f1b", pp, m, chunks)) == [
        min(w + 1, n) for w in warm]


@pytest.mark.parametrize("args, words", [
    (("gpipe", 0, 4), "pp >= 1 (an integer), got 0"),
    (("1f1b", 2, 0), "microbatches >= 1 (an integer), got 0"),
    (("interleaved_1f1b", 2, 4, 0), "chunks >= 1 (an integer), got 0"),
    (("1f1b", 2.0, 4), "pp >= 1 (an integer), got 2.0"),
    (("gpipe", True, 4), "pp >= 1 (an integer), got True"),
    (("zb", 2, 4), "unknown schedule 'zb'; the schedules are 'gpipe', '1f1b', "
                   "'interleaved_1f1b', 'zb_h1', 'zb_h2', 'zbv', 'dualpipev'"),
    (("zbv", 2, 4, 0), "chunks >= 1 (an integer), got 0"),
    (("gpipe", 2, 4, 2), "'gpipe' runs one stage per rank, got chunks=2; for 2 chunks per "
                         "rank use 'interleaved_1f1b'"),
    (("interleaved_1f1b", 4, 6, 2), "microbatches must be a multiple of pp = 4, got 6; use "
                                    "microbatches = 4 or 8, or chunks=1 with '1f1b'"),
    (("interleaved_1f1b", 4, 3, 2), "use microbatches = 4, or"),
])
def test_bad_arguments_are_refused_with_the_fix(args, words):
    with pytest.raises(ScheduleError) as err:
        schedule(*args)
    assert words in str(err.value)


def test_every_schedule_is_named():
    assert sorted(SCHEDULES) == ["1f1b", "dualpipev", "gpipe", "interleaved_1f1b", "zb_h1",
                                 "zb_h2", "zbv"]
