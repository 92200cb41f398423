"""Lesson 06's numbers, as the lesson computes them, against hand-written formulas: a block's
backward FLOPs split into I and W and the bytes W keeps, ZB-H1's bubble against 1F1B's
(and where its formula breaks), ZB-H2's and ZB-V's flushed and back-to-back bubbles and
memory, the V placement, DualPipeV against its README's formula, the side-by-side table,
the W's a rank owes after its last I, and the design puzzle (the plans the lesson measures
against the grader's budgets, and both budgets satisfiable, by more than one plan)."""

from fractions import Fraction

import pytest

from minipar.course import find_lesson
from minipar.course.grading import load_implementation

LESSON = find_lesson("06")
P = 4  # the lesson's pipeline


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


def test_a_blocks_backward_is_i_plus_w_and_the_attention_core_is_all_i(lesson):
    s, b, h = 8, 2, 16
    n = s * b
    # the four linears (3h, h, 4h, 4h by h) charge 2 n h · 12 h each half; the core's
    # backward, 4 matmuls of 2 b s^2 h, is input gradients only
    assert lesson["flops"]["W"] == 2 * n * h * (3 * h + h + 4 * h + 4 * h)
    assert lesson["flops"]["I"] == lesson["flops"]["W"] + 4 * 2 * b * s * s * h
    assert lesson["flops"]["I"] > lesson["flops"]["W"]


def test_w_keeps_the_linears_inputs_and_output_gradients(lesson):
    s, b, h, item = 8, 2, 16, 8
    sbh = s * b * h * item
    kept = lesson["kept_for_w"]
    assert lesson["same"]  # the split gradients are the fused ones, bit for bit
    assert lesson["after_i"]["ledger"] == lesson["after_i"]["records"] == (
        kept["inputs"] + kept["output grads"] + kept["layernorms"])
    assert kept["layernorms"] == 2 * 2 * h * item and lesson["after_w"] == 0
    assert kept["inputs"] == (1 + 1 + 1 + 4) * sbh  # qkv, proj, fc1 inputs h; fc2 input 4h
    assert kept["output grads"] == (3 + 1 + 4 + 1) * sbh  # qkv 3h, proj h, fc1 4h, fc2 h
    # no dropout: LayerNorms 2 sbh, Q K V 3 sbh, softmax a s^2 b, GeLU input 4 sbh
    assert kept["freed at I"] == (2 + 3 + 4) * sbh + 2 * s * s * b * item


def test_the_libraries_split_mlp_keeps_what_exercise_6_1_allows():
    """minipar's own split MLP: its W records hold 8·N·(2h + 2ffn) bytes, the bound the
    grader sets, and I + W charge the fused backward's FLOPs, half each."""
    import numpy as np

    import minipar as mp
    from minipar.nn import MLP, WeightGradStore

    h, ffn, n = 3, 6, 10
    x, dy = np.ones((n, h)), np.ones((n, h))
    with mp.device() as ctx:
        mlp = MLP("mlp", h, ffn)
        _, saved = mlp.forward(x)
        store, start = WeightGradStore(), len(ctx.trace.events)
        mlp.backward(dy, saved, store=store)
        i_flops = sum(e.flops for e in ctx.trace.events[start:])
        assert store.nbytes() == ctx.ledger.held("activations") == 8 * n * (2 * h + 2 * ffn)
        start = len(ctx.trace.events)
        store.run()
        assert sum(e.flops for e in ctx.trace.events[start:]) == i_flops == 4 * n * h * ffn
        assert ctx.ledger.held("activations") == 0


def test_zb_h1_takes_a_third_of_1f1b_at_equal_times_and_its_peak_memory(lesson):
    for (t_f, t_i, t_w), (one, zb, formula, one_peak, zb_peak) in lesson["zb_h1_table"].items():
        t_b = t_i + t_w
        assert one == (P - 1) * (t_f + t_b)
        assert one_peak == tuple(P - r for r in range(P))
        assert zb_peak == (P,) * P  # 1F1B's peak, on every rank
        assert formula == (P - 1) * (t_f + t_b - 2 * t_w)
        if t_w <= t_f and t_w <= t_i:
            assert zb == (formula,) * P
        else:  # t_W > t_F: the formula undercounts; the ramp's forwards remain
            assert zb == ((P - 1) * t_f,) * P and formula < zb[0]
    assert lesson["zb_h1_table"][(1, 1, 1)][1][0] * 3 == lesson["zb_h1_table"][(1, 1, 1)][0]
    assert lesson["split_idle"] == ((P - 1) * (3 + 3 - 1),) * P  # a split 1F1B saves one W


def test_zb_h2_and_zbv_reach_zero_only_back_to_back(lesson):
    assert lesson["v_place"] == {s: min(s, 2 * P - 1 - s) for s in range(2 * P)}
    idle, flushed, steady, held = lesson["flushed"]["zb_h2"]
    assert (idle, steady, held) == (P - 1, 0, 2 * P - 1)  # ramp (p - 1) t_F, 2p - 1 held
    assert flushed == lesson["flushed"]["zb_h1"][1]  # equal times: ZB-H1's bubble
    idle, flushed, steady, held = lesson["flushed"]["zbv"]
    assert (idle, steady, held) == (Fraction(P - 1, 2), 0, P)  # half-size chunks
    assert lesson["flushed"]["zb_h1"][2] == lesson["flushed"]["zb_h1"][1] == Fraction(1, 8)


def test_dualpipev_against_its_readme(lesson):
    for fb, (idle, formula, in_flight, _) in lesson["dual"].items():
        f = i = w = Fraction(1, 2)
        t_fb, t_b = Fraction(fb, 2), i + w
        assert formula == (2 * P // 2 - 1) * (t_fb + t_b - 3 * w)
        assert idle[-2:] == (formula, formula)  # the last two ranks idle the formula
        assert all(x <= formula for x in idle)
        assert in_flight == (2 * P + 1,) * P  # PP + 1 chunk-micro-batches
        assert f + t_b >= t_fb >= t_b
    assert "needs at least 2p = 8 micro-batches" in lesson["dual_refusal"]


def test_the_side_by_side_table(lesson):
    side, m = lesson["side"], 8
    busy = m * (2 + 4)  # a rank's layers: F = 2, B = 4
    assert side["1F1B"].idle == ((P - 1) * 6,) * P and side["1F1B"].makespan == busy + 18
    assert side["ZB-H1"].idle == ((P - 1) * 2,) * P  # (p - 1)(t_F + t_B - 2 t_W)
    assert side["ZB-H2"].steady_bubble_over_ideal == side["ZB-V"].steady_bubble_over_ideal == 0
    assert side["ZB-V"].idle == ((P - 1) * 1,) * P  # (p - 1) t_F of a chunk
    assert side["interleaved 1F1B, v = 2"].bubble_over_ideal == Fraction(P - 1, 2 * m)
    assert side["DualPipeV, F&B = 3"].idle[-1] == (P - 1) * (3 + 2 - 3)
    assert side["DualPipeV, F&B = 2"].idle[-1] == (P - 1) * (2 + 2 - 3)
    assert side["DualPipeV, F&B = 2"].makespan < busy  # the pairs shorten the work
    sent = lesson["messages"]  # 2m(S - 1) over S stages, less the V's turn in memory
    assert sent["1F1B"] == sent["ZB-H1"] == sent["ZB-H2"] == 2 * m * (P - 1)
    assert sent["interleaved 1F1B, v = 2"] == 2 * m * (2 * P - 1)
    assert sent["ZB-V"] == sent["DualPipeV, F&B = 2"] == 2 * m * (2 * P - 2)


def test_a_rank_owes_r_plus_one_ws_after_its_last_i(lesson):
    assert lesson["owed"] == [r + 1 for r in range(P)]


def test_the_zero_bubble_run_reduces_after_the_last_w_and_trains_like_one_device(lesson):
    blocks = lesson["zb_blocks"]
    assert sorted(blocks) == [0, 1]
    assert sum(blocks.values()) / 2 == pytest.approx(lesson["loss_one"], rel=1e-12)
    for loss, last, starts, coord in lesson["zb_run"]:
        assert starts and min(starts) >= last["W"] >= last["I"]
        if coord["pp"] == 1:  # the later stage defers a W past its last I
            assert last["W"] > last["I"]


def test_the_puzzle_is_the_graders_and_the_lessons_plans_miss_as_it_says(lesson, grader):
    first = grader.SCENARIOS[0]
    assert lesson["PUZZLE"] == {"pp": first.pp, "global_batch": first.global_batch,
                                "min_microbatch": first.min_microbatch,
                                "bubble_target": first.bubble_target,
                                "activation_cap": first.activation_cap}
    bubble, held = lesson["missed"]["1f1b"]  # 1F1B fits the memory, misses the bubble
    assert bubble == Fraction(3, 16) > first.bubble_target and held == P * 2 <= 8
    bubble, held = lesson["missed"]["zb_h2"]  # ZB-H2 meets the bubble, misses the memory
    assert bubble == Fraction(3, 48) <= first.bubble_target and held == (2 * P - 1) * 2 > 8


@pytest.mark.parametrize("index, plan", [(0, ("zb_h1", 16, 1)), (0, ("zbv", 16, 2)),
                                         (1, ("zb_h2", 16, 1)), (1, ("zbv", 16, 2)),
                                         (1, ("zbv", 8, 2))])
def test_each_puzzle_has_more_than_one_plan_within_both_budgets(grader, index, plan):
    sc = grader.SCENARIOS[index]
    name, m, v = plan
    d = grader.timed(sc, name, m, v)
    bubble = d.steady_bubble_over_ideal if sc.back_to_back else d.bubble_over_ideal
    assert bubble <= sc.bubble_target
    assert max(d.peak_activations) * Fraction(sc.global_batch, m) <= sc.activation_cap


def test_the_second_puzzle_refuses_zb_h1(grader):
    """Back to back, ZB-H1 still idles (p - 1)(t_F + t_B - 2 t_W) every step."""
    sc = grader.SCENARIOS[1]
    d = grader.timed(sc, "zb_h1", 16, 1)
    assert d.steady_bubble_over_ideal == Fraction(P - 1, 16 * 3) > sc.bubble_target
