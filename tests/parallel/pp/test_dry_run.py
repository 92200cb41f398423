"""The dry run: exact formulas on the clock (Fractions), memory in flight, deadlocks and
broken lowered lists refused before anything runs."""

from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from minipar.parallel.pp import (ScheduleDeadlockError, ScheduleError, dry_run, lower,
                                 parse_schedule, schedule)

p_ = st.integers(1, 8)
m_ = st.integers(1, 16)
t_ = st.fractions(min_value=Fraction(1, 8), max_value=8, max_denominator=16)


def run(name, p, m, v=1, **durations):
    return dry_run(lower(schedule(name, p, m, v)), durations or {"F": 1, "B": 2})


@given(p=p_, m=m_, tf=t_, tb=t_)
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(p, m, tf, tb):
    for name in ("gpipe", "1f1b"):
        d = run(name, p, m, F=tf, B=tb)
        assert d.makespan == (m + p - 1) * (tf + tb)
        assert d.busy == (m * (tf + tb),) * p
        assert d.idle == ((p - 1) * (tf + tb),) * p
        assert d.bubble_over_ideal == Fraction(p - 1, m)          # the papers' bubble
        assert d.bubble_over_total == Fraction(p - 1, m + p - 1)  # the idle share of a step


@given(p=p_, m=m_)
def test_1f1b_keeps_gpipes_bubble_and_holds_fewer_activations(p, m):
    """"1F1B compresses the bubble to a constant": no, it is GPipe's (p - 1)/m. What 1F1B
    buys is memory: min(p - r, m) micro-batches in flight on rank r instead of m."""
    gpipe, one = run("gpipe", p, m), run("1f1b", p, m)
    assert one.bubble_over_ideal == gpipe.bubble_over_ideal
    assert gpipe.peak_in_flight == (m,) * p
    assert one.peak_in_flight == tuple(min(p - r, m) for r in range(p))


@given(p=p_, k=st.integers(1, 16), v=st.integers(1, 3), tf=t_, tb=t_)
def test_interleaving_divides_the_bubble_by_the_chunks(p, k, v, tf, tb):
    m = p * max(1, k // p)                       # Megatron's rule: m a multiple of p
    d = run("interleaved_1f1b", p, m, v, F=tf / v, B=tb / v)   # a chunk is 1/v of a stage
    assert d.bubble_over_ideal == Fraction(p - 1, v * m)
    assert d.makespan == (m + Fraction(p - 1, v)) * (tf + tb)
    assert d.peak_activations == tuple(Fraction(n, v) for n in d.peak_in_flight)


@given(p=p_, m=m_, tf=t_, tb=t_, share=st.fractions(0, 1))
def test_gpipe_pays_each_hop_twice_when_messages_are_shorter_than_compute(p, m, tf, tb, share):
    c = share * min(tf, tb)
    d = dry_run(lower(schedule("gpipe", p, m)), {"F": tf, "B": tb}, p2p=c)
    assert d.makespan == (m + p - 1) * (tf + tb) + 2 * (p - 1) * c


@given(p=p_, m=m_, data=st.data())
def test_gpipe_with_uneven_stages_is_a_flow_shop(p, m, data):
    """Identical jobs through a flow shop: sum of the stages + (m - 1) x the slowest."""
    tf = data.draw(st.lists(t_, min_size=p, max_size=p))
    tb = data.draw(st.lists(t_, min_size=p, max_size=p))
    d = dry_run(lower(schedule("gpipe", p, m)), {"F": tf, "B": tb})
    assert d.makespan == sum(tf) + sum(tb) + (m - 1) * (max(tf) + max(tb))


def test_floats_are_exact_where_binary_fractions_are():
    d = run("1f1b", 4, 12, F=0.5, B=1.0)
    assert d.makespan == 22.5 and d.bubble_over_ideal == 0.25 and d.bubble_over_total == 0.2


def test_a_timeline_is_serial_on_each_rank_and_a_receive_waits_for_its_send():
    d = dry_run(lower(schedule("1f1b", 3, 4)), {"F": 1, "B": 2}, p2p=Fraction(1, 4))
    for spans in d.timeline:
        compute = [s for s in spans if s.action.is_compute]
        assert all(a.end <= b.start for a, b in zip(compute, compute[1:]))
    sent = {(s.action.stage, s.action.microbatch): s.end for spans in d.timeline
            for s in spans if s.action.kind.value == "SEND_F"}
    for spans in d.timeline:
        for s in spans:
            if s.action.kind.value == "RECV_F":
                assert s.end == max(s.start, sent[s.action.stage - 1, s.action.microbatch])


def test_a_split_backward_holds_activations_until_w():
    split = parse_schedule(["0F0 0F1 0I0 0I1 0W0 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"])
    lowered = lower(split)
    assert [str(a) for a in lowered[1]] == ["1RECV_F0", "1F0", "1I0", "1SEND_B0", "1RECV_F1",
                                            "1F1", "1I1", "1SEND_B1", "1W0", "1W1"]
    d = dry_run(lowered, {"F": 1, "I": 1, "W": 1})
    assert d.peak_in_flight == (2, 2)    # W reads the saved inputs: held until W
    assert d.makespan == 8               # rank 0: F F, waits for 1I0 (t = 3), I I W W
    with pytest.raises(ScheduleError, match="durations has no 'W'"):
        dry_run(lowered, {"F": 1, "I": 1})


# ---- refused before anything runs --------------------------------------------------------
def test_a_deadlocking_lowered_schedule_is_reported_with_who_waits_on_what():
    # rank 0 waits for a gradient before it sends the activation that would produce it
    lowered = parse_schedule(["0F0 0RECV_B0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"])
    with pytest.raises(ScheduleDeadlockError) as err:
        dry_run(lowered, {"F": 1, "B": 2})
    assert str(err.value).splitlines()[1:] == [
        "  rank 0 waits at 0RECV_B0 (position 1) for 1SEND_B0, which rank 1 runs at position 3 "
        "but is itself waiting at 1RECV_F0 (position 0)",
        "  rank 1 waits at 1RECV_F0 (position 0) for 0SEND_F0, which rank 0 runs at position 2 "
        "but is itself waiting at 0RECV_B0 (position 1)"]


def test_a_schedule_timed_again_is_timed_alike_and_an_edited_one_is_checked_again():
    """The dry run keeps the last schedules' structure (validation, messages, peaks), keyed
    by the lists' contents: the same lists under other durations give what a first run
    gives, and lists edited in place into a deadlock are refused, not served from before."""
    lowered = lower(schedule("1f1b", 3, 5))
    first = dry_run(lowered, {"F": 1, "B": 2})
    again = dry_run([list(row) for row in lowered], {"F": 3, "B": 1})
    fresh = dry_run(lower(schedule("1f1b", 3, 5)), {"F": 3, "B": 1})
    assert (again.makespan, again.timeline, again.peak_in_flight) == \
        (fresh.makespan, fresh.timeline, fresh.peak_in_flight) != \
        (first.makespan, first.timeline, first.peak_in_flight)
    rows = [list(r) for r in parse_schedule(GOOD)]
    dry_run(rows, {"F": 1, "B": 2})
    rows[0][1:3] = rows[0][2:0:-1]  # 0RECV_B0 before 0SEND_F0: the deadlock above
    with pytest.raises(ScheduleDeadlockError):
        dry_run(rows, {"F": 1, "B": 2})


GOOD = ["0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"]  # lower(1f1b, p=2, m=1)


@pytest.mark.parametrize("rows, words", [
    (["0F0 0SEND_F0 0RECV_B0 0B0", "1F0 1B0 1SEND_B0"],
     "rank 1: 1F0 (position 0) uses stage 0's tensor from another rank, but no 1RECV_F0 "
     "comes before it; lower the compute schedule with lower(actions)"),
    (["0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0"],
     "rank 0: 0RECV_B0 waits for 1SEND_B0, which rank 1 never runs"),
    (["0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0 1SEND_B0"],
     "rank 1: 1SEND_B0 appears twice (positions 3 and 4): one message each"),
    (["0SEND_F0 0F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"],
     "rank 0: 0SEND_F0 (position 0) sends what 0F0 makes, but 0F0 has not run before it"),
    (["0F0 0SEND_F0 0RECV_B0 0B0 1SEND_B0", "1RECV_F0 1F0 1B0"],
     "rank 0: 1SEND_B0 acts for stage 1, which lives on rank 1"),
    (["0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0 1SEND_F0"],
     "1SEND_F0 has no peer: stages are 0..1"),
    (["0F0 0SEND_F0 1RECV_F0 1F0 1B0 0B0"],
     "rank 0: 0SEND_F0 would send between stages 0 and 1, both on rank 0"),
])
def test_broken_lowered_lists_are_refused(rows, words):
    dry_run(parse_schedule(GOOD), {"F": 1, "B": 1})  # the unbroken lists run
    with pytest.raises(ScheduleError) as err:
        dry_run(parse_schedule(rows), {"F": 1, "B": 1})
    assert words in str(err.value), str(err.value)


@pytest.mark.parametrize("durations, words", [
    ({"F": 1}, "durations has no 'B' but the schedule runs B actions"),
    ({"F": [1, 2, 3], "B": 1}, "durations['F'] has 3 values; the schedule has 2 stages"),
    ({"F": -1, "B": 1}, "durations['F'] holds -1: a duration is a number of seconds >= 0"),
    ({"F": "1", "B": 1}, "durations['F'] holds '1'"),
    ([1, 2], "durations is a mapping like {'F': 1.0, 'B': 2.0}"),
])
def test_bad_durations_are_refused(durations, words):
    with pytest.raises(ScheduleError) as err:
        dry_run(lower(schedule("1f1b", 2, 2)), durations)
    assert words in str(err.value)


@pytest.mark.parametrize("p2p", [-1, "1", True, None])
def test_a_bad_p2p_cost_is_refused(p2p):
    with pytest.raises(ScheduleError, match="p2p is the seconds one message takes"):
        dry_run(lower(schedule("1f1b", 2, 2)), {"F": 1, "B": 1}, p2p=p2p)
