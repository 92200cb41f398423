"""minipar's schedules beside torch.distributed.pipelining's (torch/distributed/pipelining/
schedules.py, read, not copied: the rules below are restated from reading it).

What torch does, in words:
- ScheduleGPipe: every rank runs F0..F(m-1), then B0..B(m-1). Same as minipar.
- Schedule1F1B runs (its `_step_microbatches`) min(m, p - r) forwards on rank r, then
  alternates "1B1F": B, then F while forwards remain, then the remaining B's. It calls its
  warm-up p - r forwards where Megatron says p - r - 1, but torch counts in its warm-up the
  forward Megatron runs first in its steady F-then-B loop: the two orders are the SAME list.
  So the difference costs nothing: same peak in flight (min(p - r, m)), same makespan, at
  any p2p cost (asserted below with the dry run). minipar follows Megatron's convention
  (warm-up min(p - r - 1, m), steady F then B). torch refuses m < p; minipar schedules it.
- Read literally, "p - r warm-up forwards, then Megatron's F-then-B loop" is a different
  schedule with one more forward before the first backward: peak min(p - r + 1, m), the
  same makespan with free messages, and with costly ones a different one (shorter when a
  message is cheaper than a forward, since the extra forward hides it; longer when it is
  dearer). Asserted below: memory is what that reading would cost.
- torch's *displayed* 1F1B order (`Schedule1F1B._get_pipeline_order`, the IR it prints,
  not what it runs) starts the last rank's forwards at micro-batch 1: its warm-up count is
  0 there and the steady loop increments the index before using it. The validator refuses
  that list (transcribed below for p = 2, m = 2).
- ScheduleInterleaved1F1B: rounds = max(1, m // p) of m // rounds micro-batches, warm-up
  (v - 1)·(m // rounds) + 2(p - 1 - r), chunk of the k-th forward (k // per) % v. When
  m % p == 0 it is exactly Megatron's rule, minipar's. Its relaxation (m % rounds == 0)
  passes the validator and the deadlock check on every size tried here and reaches
  (p - 1)/(v·m) when m >= p, not when m < p; minipar keeps Megatron's m % p == 0.
"""

from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from minipar.parallel.pp import (B, F, Action, ScheduleError, dry_run, lower, parse_schedule,
                                 schedule, validate_schedule)


def torch_gpipe(p, m):
    return [[Action(r, F, i) for i in range(m)] + [Action(r, B, i) for i in range(m)]
            for r in range(p)]


def torch_1f1b(p, m):
    """What Schedule1F1B executes: min(m, p - r) forwards, then B, F, B, F, ..., then B's."""
    if m < p:
        raise ValueError("torch: number of microbatches must be >= the number of stages")
    ranks = []
    for r in range(p):
        warm = min(m, p - r)
        row, f, b = [Action(r, F, i) for i in range(warm)], warm, 0
        while b < m:
            row.append(Action(r, B, b))
            b += 1
            if f < m:
                row.append(Action(r, F, f))
                f += 1
        ranks.append(row)
    return ranks


def warmup_p_minus_r_then_pairs(p, m):
    """The literal reading: min(p - r, m) warm-up forwards, then F-then-B pairs."""
    ranks = []
    for r in range(p):
        w = min(p - r, m)
        row = [Action(r, F, i) for i in range(w)]
        for i in range(m - w):
            row += [Action(r, F, w + i), Action(r, B, i)]
        ranks.append(row + [Action(r, B, i) for i in range(m - w, m)])
    return ranks


def torch_interleaved(p, m, v):
    rounds = max(1, m // p)
    per = m // rounds
    assert m % rounds == 0
    ranks = []
    for r in range(p):
        warm, n, done = min((v - 1) * per + 2 * (p - 1 - r), m * v), m * v, {}

        def act(kind, chunk):
            stage = chunk * p + r
            done[stage, kind] = done.get((stage, kind), -1) + 1
            return Action(stage, kind, done[stage, kind])

        def fwd(k):
            return act(F, (k // per) % v)

        def bwd(k):
            return act(B, v - 1 - (k // per) % v)

        row = [fwd(k) for k in range(warm)]
        for i in range(n - warm):
            row += [fwd(warm + i), bwd(i)]
        ranks.append(row + [bwd(k) for k in range(n - warm, n)])
    return ranks


@pytest.mark.parametrize("p, m", [(1, 1), (2, 2), (2, 4), (3, 3), (3, 5), (4, 4), (4, 8)])
def test_gpipe_and_1f1b_strings_equal_torchs(p, m):
    assert schedule("gpipe", p, m) == torch_gpipe(p, m)
    assert schedule("1f1b", p, m) == torch_1f1b(p, m)
    mine = [" ".join(map(str, row)) for row in schedule("1f1b", p, m)]
    assert mine == [" ".join(map(str, row)) for row in torch_1f1b(p, m)]


def test_fewer_microbatches_than_stages_torch_refuses_minipar_runs_gpipe_order_where_it_must():
    with pytest.raises(ValueError, match="microbatches must be >= the number of stages"):
        torch_1f1b(4, 2)
    mine = schedule("1f1b", 4, 2)
    assert mine[:3] == torch_gpipe(4, 2)[:3]  # p - r - 1 >= m: all forwards first
    validate_schedule(mine)


@given(p=st.integers(1, 6), extra=st.integers(0, 8),
       c=st.fractions(0, 3, max_denominator=8))
def test_torchs_warm_up_count_and_megatrons_cost_the_same(p, extra, c):
    m = p + extra
    mine = dry_run(lower(schedule("1f1b", p, m)), {"F": 1, "B": 2}, p2p=c)
    torch = dry_run(lower(torch_1f1b(p, m)), {"F": 1, "B": 2}, p2p=c)
    assert (torch.peak_in_flight, torch.makespan) == (mine.peak_in_flight, mine.makespan)
    assert mine.peak_in_flight == tuple(min(p - r, m) for r in range(p))


@given(p=st.integers(1, 8), m=st.integers(1, 16))
def test_one_more_warm_up_forward_costs_a_microbatch_of_memory_and_no_time(p, m):
    mine = dry_run(lower(schedule("1f1b", p, m)), {"F": 1, "B": 2})
    more = dry_run(lower(warmup_p_minus_r_then_pairs(p, m)), {"F": 1, "B": 2})
    assert more.peak_in_flight == tuple(min(p - r + 1, m) for r in range(p))
    assert more.makespan == mine.makespan == (m + p - 1) * 3


def test_with_costly_messages_the_extra_forward_hides_or_adds_time():
    def both(p, m, c):
        return [dry_run(lower(s), {"F": 1, "B": 2}, p2p=c).makespan
                for s in (schedule("1f1b", p, m), warmup_p_minus_r_then_pairs(p, m))]
    mine, more = both(4, 4, Fraction(1, 10))   # a message cheaper than a forward
    assert more < mine
    mine, more = both(2, 2, 3)                 # a message dearer than a forward
    assert more > mine


def test_torchs_displayed_1f1b_order_is_refused_by_the_validator():
    displayed = parse_schedule(["0F0 0F1 0B0 0B1",    # warm-up 1, then F1 B0, then B1
                                "1F1 1B0 1F2 1B1"])   # warm-up 0: the index starts at 1
    with pytest.raises(ScheduleError, match="rank 1: 1F2 is outside the schedule's 2 stages "
                                            "x 2 micro-batches"):
        validate_schedule(displayed, microbatches=2)
    with pytest.raises(ScheduleError, match="rank 0 never runs 0F2"):  # m read as 3
        validate_schedule(displayed)


@given(p=st.integers(1, 8), m=st.integers(1, 16), v=st.integers(1, 3))
def test_torchs_interleaved_is_megatrons_when_m_is_a_multiple_of_p(p, m, v):
    rounds = max(1, m // p)
    if m % p == 0:
        assert torch_interleaved(p, m, v) == schedule("interleaved_1f1b", p, m, v)
    elif m % rounds == 0:  # torch's relaxation: valid here; the bubble formula needs m >= p
        d = dry_run(lower(torch_interleaved(p, m, v)), {"F": Fraction(1, v), "B": Fraction(2, v)})
        if m >= p:
            assert d.bubble_over_ideal == Fraction(p - 1, v * m)
        elif v > 1:
            assert d.bubble_over_ideal > Fraction(p - 1, v * m)
