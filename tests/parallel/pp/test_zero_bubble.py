"""Zero-bubble schedules on the clock: ZB-H1, ZB-H2 and ZB-V against 1F1B and the papers'
formulas (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; Qi et al. 2024, ZB-V), with
t_B = t_I + t_W the full backward, as DualPipe's README writes it. Every duration is a
Fraction, so every figure is exact; "idle" is per rank, makespan - busy."""

from fractions import Fraction

import pytest
from hypothesis import assume, given, strategies as st

from minipar import device
from minipar.nn import GPT, GPTConfig
from minipar.parallel.pp import (F, I, W, Action, ScheduleError, build_stages, check_deadlock,
                                 dry_run, format_schedule, lower, placement, schedule,
                                 validate_schedule)

p_ = st.integers(1, 6)
t_ = st.fractions(min_value=Fraction(1, 4), max_value=4, max_denominator=8)
ZB = ("zb_h1", "zb_h2", "zbv")


def run(name, p, m, **durations):
    return dry_run(lower(schedule(name, p, m)), durations)


def v_placement(p):
    """Rank r holds stages r and 2p - 1 - r."""
    return {s: s if s < p else 2 * p - 1 - s for s in range(2 * p)}


@given(p=p_, m=st.integers(1, 16))
def test_every_zero_bubble_schedule_validates_and_never_deadlocks(p, m):
    for name in ZB:
        sched = schedule(name, p, m)
        v = 2 if name == "zbv" else 1
        info = validate_schedule(sched, microbatches=m, stages=v * p)
        assert info.placement == (v_placement(p) if v == 2 else {s: s for s in range(p)})
        assert info.split == {(s, i) for s in range(v * p) for i in range(m)}  # all split
        assert info.counts == ({"F": v * m, "I": v * m, "W": v * m},) * p
        check_deadlock(lower(sched), info)


@given(p=p_, extra=st.integers(0, 10), tf=t_, ti=t_, tw=t_)
def test_zb_h1_idles_p_minus_1_times_tf_plus_tb_minus_2tw(p, extra, tf, ti, tw):
    """ZB-H1: (p - 1)(t_F + t_B - 2t_W) on every rank, against 1F1B's (p - 1)(t_F + t_B),
    at 1F1B's peak activation memory (p micro-batches; 1F1B holds p - r on rank r, ZB-H1
    holds p on every rank: it spends the last ranks' spare memory on deferred W's). The
    formula needs m >= p and t_W <= t_F, t_I: a deferred W must fit in the slot it fills
    (test_zb_h1_with_a_long_w_idles_more_than_the_formula shows the other case)."""
    assume(tw <= min(tf, ti))
    m, tb = p + extra, ti + tw
    one = run("1f1b", p, m, F=tf, B=tb)
    zb = run("zb_h1", p, m, F=tf, I=ti, W=tw)
    assert one.idle == ((p - 1) * (tf + tb),) * p
    assert zb.idle == ((p - 1) * (tf + tb - 2 * tw),) * p
    assert zb.peak_in_flight == (p,) * p == (max(one.peak_in_flight),) * p


@given(p=p_, extra=st.integers(0, 10), t=t_)
def test_zb_h1_is_a_third_of_1f1bs_bubble_at_equal_times(p, extra, t):
    m = p + extra
    one = run("1f1b", p, m, F=t, B=2 * t)
    zb = run("zb_h1", p, m, F=t, I=t, W=t)
    assert 3 * zb.idle[0] == one.idle[0] == 3 * (p - 1) * t
    assert 3 * zb.bubble_over_ideal == one.bubble_over_ideal == Fraction(p - 1, m)


def test_zb_h1_with_a_long_w_idles_more_than_the_formula():
    """t_W = 2 > t_F = t_I = 1: the formula says (p - 1)(1 + 3 - 4) = 0, but a deferred W no
    longer fits the slot 1F1B left: each rank idles (p - 1)·t_F = 3."""
    d = run("zb_h1", 4, 8, F=1, I=1, W=2)
    assert d.idle == (3,) * 4 and (4 - 1) * (1 + 3 - 2 * 2) == 0


def test_zb_h1_below_p_microbatches_keeps_a_longer_ramp():
    """m < p: every rank holds m, and the bubble is more than (p - 1)·t at equal times."""
    for m in (1, 2, 3):
        d = run("zb_h1", 4, m, F=1, I=1, W=1)
        assert d.peak_in_flight == (m,) * 4 and d.idle[0] > 3


@given(p=p_, extra=st.integers(0, 10), t=t_)
def test_zb_h2_has_no_bubble_between_back_to_back_steps_at_twice_the_memory(p, extra, t):
    """ZB-H2 at t_F = t_I = t_W: each rank busy from its first action to its last (a
    parallelogram), so back-to-back steps with post-validation (no flush) leave no bubble;
    it holds 2p - 1 micro-batches, about twice ZB-H1's p. A flushed step still pays the
    ramp (p - 1)·t_F, which is ZB-H1's whole bubble at equal times: ZB-H2's gain is the
    steady state, where ZB-H1 still idles (p - 1)(t_F + t_B - 2t_W) a step."""
    m = 2 * p - 1 + extra
    h2 = run("zb_h2", p, m, F=t, I=t, W=t)
    h1 = run("zb_h1", p, m, F=t, I=t, W=t)
    assert h2.steady_period == 3 * m * t and h2.steady_bubble_over_ideal == 0
    assert h2.idle == ((p - 1) * t,) * p
    assert h2.peak_in_flight == (2 * p - 1,) * p
    assert h1.steady_period * p - sum(h1.busy) == p * (p - 1) * t


@given(p=p_, m=st.integers(1, 16))
def test_zb_h2_warms_up_with_2p_minus_2r_minus_1_forwards(p, m):
    for r, row in enumerate(schedule("zb_h2", p, m)):
        kinds = [a.kind for a in row]
        warm = kinds.index(I)
        assert warm == min(2 * (p - r) - 1, m) and set(kinds[:warm]) == {F}
        assert max(run("zb_h2", p, m, F=1, I=1, W=1).peak_in_flight) == min(2 * p - 1, m)


@given(p=p_, extra=st.integers(0, 10), t=t_)
def test_zbv_has_no_steady_bubble_at_1f1bs_memory_and_twice_its_messages(p, extra, t):
    """ZB-V (the zero-bubble repository's table: bubble 0 and 1F1B's activation memory at
    T_F = T_B = T_W, twice the pipeline communication). Per chunk, t_F = t_I = t_W = t: a
    chunk is half a rank's layers, so 1F1B's stage takes 2t forward and 4t backward. The
    flushed step idles (p - 1)·t (the ramp), a sixth of 1F1B's (p - 1)·6t; in flight 2p
    chunk-micro-batches = p of a rank's layers, 1F1B's rank 0."""
    m = 2 * p - 1 + extra
    zbv = run("zbv", p, m, F=t, I=t, W=t)
    one = run("1f1b", p, m, F=2 * t, B=4 * t)
    assert zbv.steady_bubble_over_ideal == 0 and zbv.idle == ((p - 1) * t,) * p
    assert 6 * zbv.idle[0] == one.idle[0]
    assert zbv.peak_in_flight == (2 * p,) * p
    assert zbv.peak_activations == (p,) * p == (max(one.peak_activations),) * p
    sends = [sum(a.kind.value.startswith("SEND") for row in lower(schedule(n, p, m))
                 for a in row) for n in ("zbv", "1f1b")]
    assert sends == [4 * m * (p - 1), 2 * m * (p - 1)]  # the V's turn is in memory


def test_zbv_is_torchs_order_on_a_small_case():
    """torch's ScheduleZBVZeroBubble at p = 2, m = 3, worked by hand from its rule (n = 3):
    rank 0 (stages 0, 3): 3 chunk-0 F's; 2 x (3F, 3I, 3W); steady 0I0 0W0 3F2 3I2 3W2 (no
    chunk-0 F left); cool-down 2 x (0I, 0W). Rank 1 (stages 1, 2): 1F0; (2F0, 1F1);
    (2F1, 2I0, 2W0); steady 1F2 1I0 1W0 2F2 2I1 2W1; cool-down (1I1, 2I2), (1I2, 1W1),
    then the deferred 2W2, 1W2."""
    assert format_schedule(schedule("zbv", 2, 3)) == (
        "rank 0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2\n"
        "rank 1: 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2")


def torch_zb1p(p, m):
    """torch's _get_1f1b_rank_ops with enable_zero_bubble, one stage a rank, transcribed in
    its own terms: warm-up ops p - 1 - r; fwd_bwd ops m - warm-up, each F then I, and a W
    (of the oldest I) once op - warm-up >= r; cool-down I's likewise; then the W's left."""
    ranks = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        ops, backward_ids, weights, f, b = [], [], 0, 0, 0
        for op in range(warm + (m - warm) + warm):
            if op < warm:
                ops.append(Action(r, F, f))
                f += 1
                continue
            if op < m:
                ops.append(Action(r, F, f))
                f += 1
            ops.append(Action(r, I, b))
            backward_ids.append(b)
            b += 1
            if op - warm >= r:
                ops.append(Action(r, W, backward_ids[weights]))
                weights += 1
        ops += [Action(r, W, i) for i in backward_ids[weights:]]
        ranks.append(ops)
    return ranks


@pytest.mark.parametrize("p, m", [(1, 1), (2, 2), (2, 5), (3, 3), (4, 4), (4, 8), (5, 3)])
def test_zb_h1_is_torchs_zb1p_with_one_stage_a_rank(p, m):
    assert schedule("zb_h1", p, m) == torch_zb1p(p, m)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_a_v_schedule_refuses_other_chunk_counts(name):
    assert schedule(name, 2, 4, chunks=2) == schedule(name, 2, 4)
    with pytest.raises(ScheduleError, match=rf"'{name}' places two chunks on each rank in a V "
                                            r".*leave chunks out or pass chunks=2"):
        schedule(name, 2, 4, chunks=1)
    with pytest.raises(ScheduleError, match=r"at pp = 3, rank 0 holds stages 0 and 5"):
        schedule(name, 3, 6, chunks=3)


@pytest.mark.parametrize("name", ["zb_h1", "zb_h2"])
def test_one_stage_zero_bubble_schedules_refuse_chunks(name):
    with pytest.raises(ScheduleError, match=rf"'{name}' runs one stage per rank, got chunks=2"):
        schedule(name, 2, 4, chunks=2)


# the manual order drawn in a comment of the zero-bubble repository's scheduler (sail-sg,
# megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py), p = 4, m = 12: f = F,
# b = I, w = W, one rank a line
SAIL_MANUAL_ORDER = """fffffffbfbfbfbfbfbwbwbwbwbwbwbwwwwww
fffffbfbfbfbfbfbfbfbwbwbwbwbwwwwwwww
fffbfbfbfbfbfbfbfbfbfbwbwbwwwwwwwwww
fbfbfbfbfbfbfbfbfbfbfbfbwwwwwwwwwwww"""


def test_zb_h2_reaches_the_manual_orders_zero_bubble_in_2p_minus_1_not_m():
    """The repository's manual order has the same warm-up (2(p - r) - 1 forwards) and the
    same zero steady bubble at equal times, but runs every F as soon as it can and defers
    W's to the end, so every rank holds all m micro-batches; zb_h2 caps them at 2p - 1
    (the paper's ZB-H2 memory) and keeps the zero."""
    rows = []
    for r, text in enumerate(SAIL_MANUAL_ORDER.split()):
        seen = {"f": 0, "b": 0, "w": 0}
        row = []
        for ch in text:
            row.append(Action(r, {"f": F, "b": I, "w": W}[ch], seen[ch]))
            seen[ch] += 1
        rows.append(row)
    equal = {"F": 1, "I": 1, "W": 1}
    manual, h2 = dry_run(lower(rows), equal), run("zb_h2", 4, 12, **equal)
    assert manual.steady_bubble_over_ideal == h2.steady_bubble_over_ideal == 0
    assert manual.makespan == h2.makespan == 3 * 12 + 3
    assert manual.peak_in_flight == (12,) * 4 and h2.peak_in_flight == (7,) * 4
    assert [row[:2 * (4 - r) - 1] for r, row in enumerate(rows)] == \
        [row[:2 * (4 - r) - 1] for r, row in enumerate(schedule("zb_h2", 4, 12))]


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_the_stages_are_built_from_the_schedules_placement_not_s_mod_p(name):
    """build_stages reads the placement from the lists: under a V rank r holds stages r and
    2p - 1 - r (rank 0 the embedding and the loss, the last rank the turn)."""
    p = 3
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=2 * p, seed=0)
    for r in range(p):
        with device():
            stages = build_stages(GPT(cfg), placement(schedule(name, p, 2 * p)), r)
        assert [(st.index, st.lo, st.hi) for st in stages] == [(r, r, r + 1),
                                                               (2 * p - 1 - r, 2 * p - 1 - r,
                                                                2 * p - r)]
        assert [st.is_first for st in stages] == [r == 0, False]
        assert [st.is_last for st in stages] == [False, r == 0]
