"""The validator refuses every broken schedule with the rank, the action and the rule."""

import pytest

from minipar.parallel.pp import (ScheduleDeadlockError, ScheduleError, format_schedule,
                                 parse_schedule, schedule, validate_schedule)


def _refused(rows, *words, error=ScheduleError, **kw):
    with pytest.raises(error) as err:
        validate_schedule(parse_schedule(rows) if isinstance(rows[0], str) else rows, **kw)
    for w in words:
        assert w in str(err.value), str(err.value)
    return str(err.value)


def _swap(sched, rank, i, j):
    rows = [list(row) for row in sched]
    rows[rank][i], rows[rank][j] = rows[rank][j], rows[rank][i]
    return rows


def test_swapping_a_backward_before_its_forward_is_refused():
    good = schedule("1f1b", 2, 2)
    assert format_schedule(good).splitlines()[1] == "rank 1: 1F0 1B0 1F1 1B1"
    _refused(_swap(good, 1, 0, 1), "rank 1: 1B0 (compute position 0) comes before 1F0 "
                                   "(position 1): a backward needs its own forward's activations")


def test_swapping_two_actions_into_a_cycle_across_ranks_is_refused():
    good = schedule("gpipe", 2, 2)                  # rank 0: 0F0 0F1 0B0 0B1
    message = _refused(_swap(good, 0, 1, 2), error=ScheduleDeadlockError)  # 0F0 0B0 0F1 0B1
    assert message.splitlines()[1:] == [
        "  rank 0 waits at 0B0 (compute position 1) for 1B0 (the backward of stage s follows "
        "the backward of stage s + 1), which rank 1 has not reached: it waits at 1F1",
        "  rank 1 waits at 1F1 (compute position 1) for 0F1 (the forward of stage s follows "
        "the forward of stage s - 1), which rank 0 has not reached: it waits at 0B0"]


def test_a_later_stage_first_on_its_own_rank_is_refused():
    # p = 1 with two chunks: stage 1's forward needs stage 0's, on the same rank
    text = _refused(["1F0 0F0 1B0 0B0"], error=ScheduleDeadlockError)
    assert "rank 0 waits at 1F0 (compute position 0) for 0F0" in text
    assert "which rank 0 would run only later in its own list" in text


def test_each_stage_and_microbatch_is_computed_once_per_kind():
    assert "rank 0: 0F0 appears twice (compute positions 0 and 1)" in _refused(["0F0 0F0 0B0"])
    assert "rank 1 never runs 1B1" in _refused(["0F0 0F1 0B0 0B1", "1F0 1F1 1B0"])
    assert "rank 1 never runs 1F0" in _refused(["0F0 0B0", "1B0"])
    assert "rank 0 never runs 0F1" in _refused(["0F0 0B0 0F2 0B2"])  # micro-batches 0..m-1
    assert ("rank 0: 0F1 is outside the schedule's 1 stages x 1 micro-batches"
            in _refused(["0F0 0B0 0F1 0B1"], microbatches=1))


def test_every_stage_has_a_rank_and_every_rank_a_stage():
    _refused(["0F0 0B0", "2F0 2B0"], "stage 1 appears on no rank")
    _refused([parse_schedule(["0F0 0B0"])[0], []], "rank 1 runs no compute action")
    _refused(["0F0", "0B0"], "rank 1: 0B0 puts stage 0 on rank 1")
    with pytest.raises(ScheduleError, match="non-empty list with one list of actions per rank"):
        validate_schedule([])


def test_a_split_backward_needs_i_then_w_and_no_b():
    split = parse_schedule(["0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"])
    info = validate_schedule(split)
    assert info.split_backward and info.counts == ({"F": 2, "I": 2, "W": 2},) * 2
    _refused(["0F0 0W0 0I0"], "rank 0: 0W0 (compute position 1) comes before 0I0 (position "
                              "2): W (weight gradients) follows I (input gradients)")
    _refused(["0F0 0F1 0I0 0W0 0I1"], "rank 0 never runs 0W1: every (stage, micro-batch) "
                                      "is computed once per kind (F, and B, or I and W); "
                                      "write 0W1, or 0B1 alone")
    _refused(["0F0 0F1 0I0 0W0 0I1 0W1 0B1"], "rank 0: 0B1 runs a full backward of "
                                              "micro-batch 1 on stage 0, which its I or W also "
                                              "computes: one of 0B1, or 0I1 and 0W1")
    # each (stage, micro-batch) chooses (DualPipeV runs some backwards whole, some split)
    mixed = validate_schedule(parse_schedule(["0F0 0F1 0I0 0B1 0W0"]))
    assert mixed.split == {(0, 0)} and mixed.split_backward
    assert mixed.counts == ({"B": 1, "F": 2, "I": 1, "W": 1},)
    # I of stage s waits for I (not B) of stage s + 1
    _refused(["0F0 0I0 0W0", "1F0 1W0 1I0"], "rank 1: 1W0 (compute position 1) comes before 1I0")


def test_the_info_names_stages_placement_and_counts():
    info = validate_schedule(schedule("interleaved_1f1b", 2, 4, chunks=3))
    assert (info.stages, info.microbatches, info.split_backward) == (6, 4, False)
    assert info.stages_of(1) == [1, 3, 5]
    assert info.counts == ({"B": 12, "F": 12},) * 2
