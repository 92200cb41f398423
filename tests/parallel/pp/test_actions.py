"""Actions in torch.distributed.pipelining's notation: `2F0`, `3SEND_F1`; parsed back exactly."""

import pytest
from hypothesis import given, strategies as st

from minipar.parallel.pp import (B, F, RECV_B, RECV_F, SEND_B, SEND_F, Action, Kind,
                                 ScheduleError, format_schedule, parse_schedule, placement,
                                 schedule)


def test_str_is_stage_kind_microbatch_with_nothing_between():
    assert str(Action(2, F, 0)) == "2F0"
    assert str(Action(12, B, 31)) == "12B31"
    assert [str(Action(3, k, 1)) for k in (SEND_F, RECV_F, SEND_B, RECV_B)] == [
        "3SEND_F1", "3RECV_F1", "3SEND_B1", "3RECV_B1"]  # torch's spellings
    assert Action(1, "W", 4) == Action(1, Kind.W, 4)  # a kind may be given as its letter


@given(stage=st.integers(0, 200), kind=st.sampled_from(list(Kind)),
       microbatch=st.integers(0, 200))
def test_parse_inverts_str(stage, kind, microbatch):
    a = Action(stage, kind, microbatch)
    assert Action.parse(str(a)) == a
    assert Action.parse(f"  {a} ") == a
    assert a.is_compute != a.is_communication


@pytest.mark.parametrize("text", ["F0", "2F", "2X0", "2 F 0", "-1F0", "2SEND0", "2F0B1", ""])
def test_a_string_that_is_no_action_is_refused_with_the_form(text):
    with pytest.raises(ScheduleError, match=r"cannot read .* e\.g\. 2F0"):
        Action.parse(text)


@pytest.mark.parametrize("args, words", [((-1, F, 0), "stage must be an integer >= 0"),
                                         ((0, F, 1.5), "microbatch must be an integer >= 0"),
                                         ((True, F, 0), "stage must be an integer"),
                                         ((0, "Q", 0), "kind must be one of F, B, I, W")])
def test_a_bad_action_is_refused(args, words):
    with pytest.raises(ScheduleError, match=words):
        Action(*args)


def test_a_schedule_round_trips_through_its_text():
    sched = schedule("1f1b", 3, 4)
    text = format_schedule(sched)
    assert text.splitlines()[2] == "rank 2: 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"
    assert parse_schedule(text) == sched
    assert parse_schedule(["0F0 0B0", "1F0 1B0"]) == [[Action(0, F, 0), Action(0, B, 0)],
                                                      [Action(1, F, 0), Action(1, B, 0)]]


def test_placement_reads_which_rank_holds_each_stage():
    assert placement(schedule("interleaved_1f1b", 2, 2, chunks=2)) == {0: 0, 1: 1, 2: 0, 3: 1}
    with pytest.raises(ScheduleError, match="rank 1: 0B0 puts stage 0 on rank 1, but rank 0 "
                                            "already runs 0F0"):
        placement(parse_schedule(["0F0", "0B0"]))
    with pytest.raises(ScheduleError, match="rank 0: '0F0' is not an Action"):
        placement([["0F0"]])
    with pytest.raises(ScheduleError, match="rank 1's actions are '1F0 1B0': give a list"):
        placement([[], "1F0 1B0"])
