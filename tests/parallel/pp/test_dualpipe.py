"""DualPipeV as data: torch's published order, DualPipe's README formulas on the clock, and
the overlapped pairs read by the validator, the lowering and the dry run."""

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from minipar.parallel.pp import (B, F, I, W, Action, ScheduleDeadlockError, ScheduleError,
                                 check_deadlock, dry_run, lower, parse_schedule, placement,
                                 schedule, validate_schedule)
from minipar.parallel.pp.actions import OverlapFB, parse_action, parts

# torch's test/distributed/pipelining/artifacts/dualpipev_4rank_10mb.csv, the order its
# test_schedule.py (TestScheduleCsv) holds ScheduleDualPipeV to at 4 ranks x 10 micro-
# batches. Translated into minipar's text: torch writes one CSV row per rank with commas
# between actions; here one line per rank with spaces. Every action and every pair is
# spelled the same in both (`7I0`, `(0F7;7B3)OVERLAP_F_B`), and the file holds compute
# actions only, no empty slots, so nothing else changes.
TORCH_DUALPIPEV_4x10 = """
rank 0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3
        (0F7;7B3)OVERLAP_F_B (7F4;0B0)OVERLAP_F_B (0F8;7B4)OVERLAP_F_B (7F5;0B1)OVERLAP_F_B
        (0F9;7B5)OVERLAP_F_B (7F6;0B2)OVERLAP_F_B 7B6 (7F7;0B3)OVERLAP_F_B 7B7
        (7F8;0B4)OVERLAP_F_B 7B8 (7F9;0B5)OVERLAP_F_B 7B9 0I6 0W6 0I7 0W7 0I8 0W8 0I9 0W9
rank 1: 1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B
        (6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B (1F8;6B4)OVERLAP_F_B
        (6F6;1B2)OVERLAP_F_B (1F9;6B5)OVERLAP_F_B (6F7;1B3)OVERLAP_F_B 6B6
        (6F8;1B4)OVERLAP_F_B 6B7 (6F9;1B5)OVERLAP_F_B 6B8 1B6 6I9 1I7 6W9 1I8 1W7 1I9 1W8 1W9
rank 2: 2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B
        (5F4;2B0)OVERLAP_F_B (2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B (2F7;5B3)OVERLAP_F_B
        (5F6;2B2)OVERLAP_F_B (2F8;5B4)OVERLAP_F_B (5F7;2B3)OVERLAP_F_B (2F9;5B5)OVERLAP_F_B
        (5F8;2B4)OVERLAP_F_B 5B6 (5F9;2B5)OVERLAP_F_B 5B7 2B6 5B8 2I7 5I9 2I8 2W7 2I9 5W9
        2W8 2W9
rank 3: 3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B (3F5;4B1)OVERLAP_F_B
        (4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B
        (4F7;3B3)OVERLAP_F_B (3F8;4B4)OVERLAP_F_B (4F8;3B4)OVERLAP_F_B (3F9;4B5)OVERLAP_F_B
        (4F9;3B5)OVERLAP_F_B 4B6 3B6 4B7 3B7 4I8 3I8 4I9 3I9 4W8 3W8 4W9 3W9
"""


def torch_rows(text):
    """One rank a `rank N:` line, its continuation lines joined to it."""
    rows, current = [], None
    for line in text.strip().splitlines():
        if line.startswith("rank"):
            current = [line]
            rows.append(current)
        else:
            current.append(line)
    return [" ".join(r) for r in rows]


def test_dualpipev_at_4_ranks_and_10_microbatches_is_torchs_published_order():
    torch = parse_schedule(torch_rows(TORCH_DUALPIPEV_4x10))
    for row in torch:  # 2 stages x 10 micro-batches a rank: one F, one B or I + W each
        kinds = Counter(x.kind for a in row for x in parts(a))
        assert kinds[F] == kinds[B] + kinds[I] == 20 and kinds[W] == kinds[I] > 0
    assert schedule("dualpipev", 4, 10) == torch
    assert [str(a) for a in schedule("dualpipev", 4, 10)[0][17:19]] == [
        "(0F7;7B3)OVERLAP_F_B", "(7F4;0B0)OVERLAP_F_B"]


p_ = st.integers(1, 5)


@given(p=p_, extra=st.integers(0, 8))
def test_dualpipev_validates_and_never_deadlocks_in_a_v(p, extra):
    m = 2 * p + extra
    sched = schedule("dualpipev", p, m)
    info = validate_schedule(sched, microbatches=m, stages=2 * p)
    assert info.placement == {s: s if s < p else 2 * p - 1 - s for s in range(2 * p)}
    check_deadlock(lower(sched), info)


@given(p=p_, extra=st.integers(0, 8), t=st.fractions(Fraction(1, 4), 4, max_denominator=8),
       overlap=st.fractions(0, 1, max_denominator=8))
def test_dualpipev_bubble_is_the_readmes_at_equal_chunk_times(p, extra, t, overlap):
    """DualPipe's README: bubble (PP/2 - 1)(F&B + B - 3W), 2x parameters, PP + 1 activations,
    on PP/2 devices, PP = 2p stages. Measured at F = I = W = t (B = 2t) and any F&B from B
    (the pair as long as its backward: full overlap) to F + B (no overlap at all): the worst
    rank idles exactly the formula, and so do ranks p - 2 and p - 1. Rank r < p - 2 idles
    less by (p - 2 - r)(F + B - F&B): it runs that many more overlapped pairs, each of
    which saves F + B - F&B of compute, so the formula is the bubble of the last ranks.
    Every rank holds 2p + 1 = PP + 1 chunk-micro-batches at its peak, and 2 stages (the
    parameters of two chunks, against one stage per device for 1F1B over PP devices).
    At unequal F, I, W the README's formula is an idealisation the clock does not give
    (for instance F = 1, I = 2, W = 1, F&B = 4: 11 per rank, not 12)."""
    m, B_ = 2 * p + extra, 2 * t
    fb = B_ + overlap * t                    # from B (full overlap) to F + B (none)
    d = dry_run(lower(schedule("dualpipev", p, m)), {"F": t, "B": B_, "I": t, "W": t, "F&B": fb})
    formula = (p - 1) * (fb + B_ - 3 * t)
    assert max(d.idle) == formula
    assert d.idle == tuple(formula - max(0, p - 2 - r) * (t + B_ - fb) for r in range(p))
    assert d.peak_in_flight == (2 * p + 1,) * p
    assert [len(d.info.stages_of(r)) for r in range(p)] == [2] * p


def test_at_unequal_times_the_readme_formula_is_not_the_clocks():
    d = dry_run(lower(schedule("dualpipev", 4, 10)), {"F": 1, "B": 3, "I": 2, "W": 1, "F&B": 4})
    assert d.idle == (11,) * 4 and (4 - 1) * (4 + 3 - 3 * 1) == 12


def test_dualpipev_needs_2p_microbatches():
    schedule("dualpipev", 3, 6)
    with pytest.raises(ScheduleError, match=r"dualpipev needs at least 2p = 6 micro-batches "
                                            r"for pp = 3 .* got 5: use microbatches >= 6"):
        schedule("dualpipev", 3, 5)


# ---- the pair as data --------------------------------------------------------------------
def test_a_pair_is_torchs_string_and_reads_back():
    pair = OverlapFB(Action(0, F, 7), Action(7, B, 3))
    assert str(pair) == "(0F7;7B3)OVERLAP_F_B" and parse_action(str(pair)) == pair
    assert parts(pair) == (Action(0, F, 7), Action(7, B, 3)) and pair.is_compute
    assert parse_action("2F0") == Action(2, F, 0)     # an Action stays the 3-tuple
    with pytest.raises(ScheduleError, match="an overlapped pair is .a forward, a backward"):
        OverlapFB(Action(7, B, 3), Action(0, F, 7))
    with pytest.raises(ScheduleError, match="pairs a backward with its own forward"):
        OverlapFB(Action(1, F, 0), Action(1, I, 0))


def test_the_lowering_puts_both_receives_before_a_pair_and_both_sends_after():
    """p = 2: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (the V's turn, 1 -> 2, is
    in memory). (0F;3B) receives nothing (stage 0 reads the batch, stage 3 the loss) and
    sends twice; (3F;0B) receives twice and sends nothing."""
    sched = schedule("dualpipev", 2, 4)
    assert placement(sched) == {0: 0, 1: 1, 2: 1, 3: 0}
    row = lower(sched)[0]
    for k, a in enumerate(row):
        if not isinstance(a, OverlapFB):
            continue
        f, b = a.forward.microbatch, a.backward.microbatch
        if a.forward.stage == 0:
            assert [str(x) for x in row[k:k + 3]] == [str(a), f"0SEND_F{f}", f"3SEND_B{b}"]
        else:
            assert [str(x) for x in row[k - 2:k + 1]] == [f"3RECV_F{f}", f"0RECV_B{b}", str(a)]


def test_a_pair_takes_t_fb_when_given_and_its_two_halves_when_not():
    """t_F&B given: every pair lasts it. Not given: t_F + t_B of its halves, plus the wait
    of its B half for its gradient (which starts after its F half, not before it)."""
    sched = lower(schedule("dualpipev", 2, 4))
    one = {"F": 1, "B": 2, "I": 1, "W": 1}
    for fb in (Fraction(5, 2), None):
        run = dry_run(sched, {**one, **({"F&B": fb} if fb else {})})
        pairs = [s for row in run.timeline for s in row if isinstance(s.action, OverlapFB)]
        assert pairs and all(s.end - s.start == fb for s in pairs) if fb else \
            all(s.end - s.start >= 3 for s in pairs) and any(s.end - s.start == 3 for s in pairs)
        for r, row in enumerate(sched):
            assert run.busy[r] == sum(fb if fb and isinstance(a, OverlapFB) else
                                      sum(one[x.kind.value] for x in parts(a))
                                      for a in row if a.is_compute)


def test_a_pairs_messages_overlap_the_other_half_by_hand():
    """Rank 0 runs 0F0 (0F1;0B0) 0B1, rank 1 1F0 1B0 1F1 1B1; t_F = 1, t_B = 2, each
    message 1. Per half: 0F0 [0, 1] sends 0F0's output (arrives 2); the pair's F half
    [1, 2] posts 0F1's output at 2 (arrives 3) while its B half waits for 1B0's gradient:
    1F0 [2, 3], 1B0 [3, 5], arriving 6, so the B half runs [6, 8]; rank 1 finds 0F1's
    output there at 5: 1F1 [5, 6], 1B1 [6, 8], its gradient arrives at 9; 0B1 [9, 11].
    As one block of t_F&B = 3 (the pair's messages around it), the pair waits for 1B0's
    gradient before its F half: [6, 9], 0F1's output arrives 10, 1F1 [10, 11], 1B1
    [11, 13], 0B1 [14, 16]: 5 of 16 lost to messages the halves could have hidden."""
    sched = lower(parse_schedule(["0F0 (0F1;0B0)OVERLAP_F_B 0B1", "1F0 1B0 1F1 1B1"]))
    assert [str(a) for a in sched[0]] == ["0F0", "0SEND_F0", "0RECV_B0",
                                          "(0F1;0B0)OVERLAP_F_B", "0SEND_F1", "0RECV_B1",
                                          "0B1"]
    halves = dry_run(sched, {"F": 1, "B": 2}, 1)
    block = dry_run(sched, {"F": 1, "B": 2, "F&B": 3}, 1)
    span = lambda run, r, text: next((s.start, s.end) for s in run.timeline[r]
                                     if str(s.action) == text)
    assert span(halves, 0, "(0F1;0B0)OVERLAP_F_B") == (1, 8)
    assert span(halves, 0, "0SEND_F1") == (2, 3) and span(halves, 0, "0RECV_B0") == (2, 6)
    assert span(halves, 1, "1F1") == (5, 6) and span(halves, 0, "0B1") == (9, 11)
    assert halves.makespan == 11 and halves.finish == (11, 9)
    assert span(block, 0, "(0F1;0B0)OVERLAP_F_B") == (6, 9)
    assert span(block, 0, "0SEND_F1") == (9, 10) and span(block, 0, "0B1") == (14, 16)
    assert block.makespan == 16 and halves.busy == block.busy == (6, 6)


def test_a_pair_waits_for_both_inputs_and_pairing_can_deadlock():
    """A pair is one item: it starts once both actions' inputs are done. Pairing rank 0's
    0F1 with 0B0 is fine while rank 1 runs 1B0 before 1F1; once rank 1 pairs 1F1 with 1B0
    too, each pair waits for the other (0B0 needs 1B0, 1F1 needs 0F1): the validator
    names the deadlock the same lists without pairs would not have."""
    good = parse_schedule(["0F0 (0F1;0B0)OVERLAP_F_B 0B1", "1F0 1B0 1F1 1B1"])
    assert validate_schedule(good).counts[0] == {"B": 2, "F": 2, "OVERLAP_F_B": 1}
    validate_schedule(parse_schedule(["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"]))
    with pytest.raises(ScheduleDeadlockError, match=r"rank 1 waits at \(1F1;1B0\)OVERLAP_F_B "
                                                    r"\(compute position 1\) for 0F1"):
        validate_schedule(parse_schedule(["0F0 (0F1;0B0)OVERLAP_F_B 0B1",
                                          "1F0 (1F1;1B0)OVERLAP_F_B 1B1"]))
    with pytest.raises(ScheduleError, match=r"rank 0: 0B1 \(compute position 0\) comes "
                                            r"before 0F1 \(position 1\)"):
        validate_schedule(parse_schedule(["(0F0;0B1)OVERLAP_F_B 0F1 0B0"]))


def test_a_pair_counts_its_forward_before_its_backward_releases():
    one = parse_schedule(["0F0 (0F1;0B0)OVERLAP_F_B 0B1"])
    assert dry_run(lower(one), {"F": 1, "B": 2, "F&B": 2}).peak_in_flight == (2,)
    split = parse_schedule(["0F0 (0F1;0I0)OVERLAP_F_B 0W0 0I1 0W1"])  # I leaves them to W
    assert dry_run(lower(split), {"F": 1, "I": 1, "W": 1, "F&B": 2}).peak_in_flight == (2,)
