"""Lesson 09's numbers, as the lesson computes them, against hand-written formulas: the
ledger's bytes of a tp rank's attention (s² per head) and a cp rank's (linear in s),
Korthikanti et al.'s activation terms at Llama 3 405B's width, LayerNorm on sequence
shards, the lse merge against the softmax and the overflow it avoids, ring attention
against one device with its causal blocks read from the trace and its sends, the work
fractions and the step time of both layouts, the crossover length (the quadratic, the
cost model and the scaled clock), Ulysses' bytes and refusal, Llama 3's all-gather and the
bf16 errors. Then the exercises: the solution passes every check, the generated exercise
is all todo, each corpus case holds."""

import math
from fractions import Fraction

import numpy as np
import pytest

from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps

LESSON = find_lesson("09")
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU
PEAK = 989e12  # H100 bf16 dense


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def test_a_tp_ranks_attention_grows_as_s_squared_a_cp_ranks_as_s(lesson):
    t, heads, d = 4, 8, 8
    for s, (tp_held, cp_held) in lesson["held"].items():
        # nn's core on a/t heads over s tokens keeps qkv [s, b, 3h/t] and the probabilities
        # [b, a/t, s, s]; the ring keeps its qkv [s/cp, b, 3h], context [s/cp, b, h], lse
        assert tp_held == 8 * (s * 3 * heads * d // t + heads // t * s * s)
        assert cp_held == 8 * (s // t * 3 * heads * d + s // t * heads * d + heads * s // t)
    grow = [lesson["held"][s][0] / lesson["held"][s // 2][0] for s in (128, 256)]
    assert 3 < grow[0] < grow[1] < 4
    assert [lesson["held"][s][1] / lesson["held"][s // 2][1] for s in (128, 256)] == [2, 2]


def test_the_activation_terms_at_llama_3_405b_width(lesson):
    h, a, t, cp = 16384, 128, 8, 16
    for s, (tp_sp, flash, with_cp) in lesson["at_scale"].items():
        assert tp_sp == pytest.approx(s * h * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
        assert flash == pytest.approx(s * h * 34 / t, rel=1e-12)
        assert with_cp == pytest.approx(s / cp * h * 34 / t, rel=1e-12)
    assert 126 * lesson["at_scale"][131072][1] > 1e12  # far beyond an 80 GB device


def test_layernorm_on_sequence_shards_needs_no_communication(lesson):
    np.testing.assert_array_equal(lesson["sharded_ln"], lesson["whole_ln"])


def test_the_merge_is_the_softmax_in_any_order_and_never_overflows(lesson):
    for out_err, lse_err in lesson["merged"].values():
        assert out_err < 1e-14 and lse_err < 1e-14
    assert lesson["overflow"]["float64"] == pytest.approx(math.log(1.7976931348623157e308))
    assert lesson["overflow"]["float32"] == pytest.approx(math.log(3.4028234663852886e38))
    assert np.isnan(lesson["naive"]).all()
    assert lesson["shift_err"][0] < 1e-12 and lesson["shift_err"][1] < 1e-12


def test_ring_attention_equals_one_device_and_skips_the_masked_blocks(lesson):
    for ctx_err, dqkv_err in lesson["ring_err"].values():
        assert ctx_err < 1e-13 and dqkv_err < 1e-13
    cp = 4
    want = [[0.5 if t == 0 else (1.0 if t <= r else 0.0) for t in range(cp)] for r in range(cp)]
    np.testing.assert_array_equal(lesson["step_units"], want)  # src = r - t: full if src < r
    kv = 2 * (32 // cp) * 2 * 16 * 8  # one rank's K and V, float64
    fwd, bwd = lesson["sends3"]
    assert (len(fwd), sum(fwd)) == (cp - 1, (cp - 1) * kv)
    assert (len(bwd), sum(bwd)) == (2 * cp - 1, (2 * cp - 1) * kv)  # K/V cp - 1, dK/dV cp
    assert (lesson["bytes3"].forward, lesson["bytes3"].backward) == (sum(fwd), sum(bwd))


def test_contiguous_work_is_2r_plus_1_over_cp_squared_and_the_step_7_over_4(lesson):
    assert lesson["work"]["contiguous"] == [Fraction(2 * r + 1, 16) for r in range(4)]
    assert lesson["work"]["zigzag"] == [Fraction(1, 4)] * 4
    ratio = lesson["step_time"]["contiguous"] / lesson["step_time"]["zigzag"]
    assert ratio == pytest.approx(7 / 4, rel=2e-3)


def crossover(b, h, cp, e, bw, alpha):
    """The quadratic 2bhs²/(cp² P) = alpha + 2(s/cp)bh·e/bw, solved for s."""
    qa, qb = 2 * b * h / (cp**2 * PEAK), 2 * b * h * e / (cp * bw)
    return (qb + math.sqrt(qb**2 + 4 * qa * alpha)) / (2 * qa)


def test_the_crossover_from_the_formula_the_cost_model_and_the_clock(lesson):
    b, h, cp, e = 1, 4096, 4, 2
    for name, bw, alpha in (("NVLink", NV_B, NV_A), ("InfiniBand", IB_B, IB_A)):
        s_star, no_alpha, hides, shortest = lesson["crossover"][name]
        assert s_star == pytest.approx(crossover(b, h, cp, e, bw, alpha), rel=1e-12)
        assert shortest == 2 * cp * math.ceil(s_star / (2 * cp))  # costs.ring_hidden_length
        assert no_alpha == pytest.approx(cp * e * PEAK / bw, rel=1e-12)
        assert s_star / no_alpha == pytest.approx(1, abs=1e-2)  # the latency's share
        assert hides == [False, True]
        s_bwd = 1.2 * s_star  # 5 matmuls against 2, K/V and float32 dK/dV against K/V
        for (link, s), (fwd, bwd, tail) in lesson["clock5"].items():
            if link != name:
                continue
            t_c = 2 * b * h * s**2 / (cp**2 * PEAK)
            t_s = alpha + 2 * (s / cp) * b * h * e / bw
            assert fwd == pytest.approx((cp - 1) * max(0.0, t_s - t_c), rel=1e-9, abs=1e-15)
            assert tail == pytest.approx(alpha + 2 * (s / cp) * b * h * 4 / bw, rel=1e-12)
            if s > 1.01 * s_bwd:  # only the last dK/dV send is exposed
                assert bwd == pytest.approx(tail, rel=1e-9)
            elif s < 0.99 * s_bwd:
                assert bwd > tail * (1 + 1e-6)
        lengths = sorted(s for link, s in lesson["clock5"] if link == name)
        hidden = [s for s in lengths if lesson["clock5"][name, s][0] == 0]
        exposed = [s for s in lengths if lesson["clock5"][name, s][0] > 0]
        assert max(exposed) < s_star < min(hidden)  # the clock brackets the formula


def test_ulysses_bytes_the_table_and_the_refusal(lesson):
    assert lesson["uly_err"] == (0.0, 0.0)
    cp, s, b, h = 4, 32, 2, 16
    uly = (cp - 1) / cp * 4 * (s // cp) * b * h * 8
    assert lesson["uly"][0][2] == [uly, uly]
    assert lesson["uly_bytes"].forward == uly
    assert lesson["ring_sent"] == [3 * 2 * 8 * 2 * 16 * 8, 7 * 2 * 8 * 2 * 16 * 8]
    for cp, (ring, uly6) in lesson["table6"].items():
        kv = 2 * (32768 // cp) * 4096 * 2
        assert ring.forward == (cp - 1) * kv
        assert ring.backward == (cp - 1) * kv + cp * kv * 2  # dK/dV in float32
        assert uly6.forward == pytest.approx((cp - 1) / cp * 4 * (32768 // cp) * 4096 * 2)
    kv = 2 * 8192 * 4096 * 2  # s = 65,536 over cp = 8, h = 4096, bf16
    t_c = 2 * 4096 * 65536**2 / (64 * PEAK)
    node, nodes = lesson["exposed6"]["one node"], lesson["exposed6"]["8 nodes"]
    assert node[0] == 0.0 and node[1] == pytest.approx(14 * NV_A + 7 / 8 * 2 * kv / NV_B)
    assert nodes[0] == pytest.approx(7 * (IB_A + kv / IB_B - t_c), rel=1e-12)
    assert nodes[1] == pytest.approx(14 * IB_A + 7 / 8 * 2 * kv / IB_B, rel=1e-12)
    assert nodes[1] < nodes[0]  # across nodes, a ring that cannot hide loses
    assert lesson["refusal"] == ("rank 0: ulysses_attention_forward on cp group world[0, 1, 2, "
                                 "3]: num_heads = 6 is not divisible by cp = 4: choose cp in "
                                 "{1, 2, 3, 6} or use ring attention")


def test_llama_3s_all_gather_from_the_cost_model(lesson):
    mb, seconds, attend, link, mha = lesson["llama"]
    kv = 2 * 131072 * 128 * 2
    assert mb == kv / 1e6 and link == "IB-NDR400"
    assert seconds == pytest.approx(15 * IB_A + 15 / 16 * kv / IB_B, rel=1e-12)
    assert mha == pytest.approx(15 * IB_A + 15 / 16 * 16 * kv / IB_B, rel=1e-12)
    assert attend == pytest.approx(2 * 16 * 128 * 131072**2 / 16 / PEAK, rel=1e-12)
    assert seconds < attend < mha


def test_bf16_error_does_not_grow_with_cp(lesson):
    errors = lesson["bf16_err"]
    one = errors["one device"]
    for key, (fwd, bwd) in errors.items():
        assert 0 < fwd < 2e-2 and 0 < bwd < 2e-2
        assert fwd <= 1.2 * one[0] and bwd <= 1.3 * one[1], key
        if key != "one device" and key[0] == "Ulysses":  # the one-device core on its heads
            assert (fwd, bwd) == pytest.approx(one, rel=1e-12)
    ring = [errors["ring", cp] for cp in (1, 2, 4, 8)]
    assert max(r[0] for r in ring) < 1.1 * min(r[0] for r in ring)
    assert max(r[1] for r in ring) < 1.2 * min(r[1] for r in ring)


def test_a_whole_gpt_with_cp_on_the_mesh_equals_one_device(lesson):
    for method, (loss_err, w_err, rows) in lesson["mesh8"].items():
        assert rows == (8, 2)  # [s/cp, B/dp]
        assert loss_err < 1e-12 and w_err < 1e-10, method


# ---- the exercises ---------------------------------------------------------------------
# That the solution passes, the generated exercise is all todo and every corpus case is
# graded as it says is checked for every lesson at once (tests/test_course.py,
# tests/course/test_corpus.py); here, what this lesson's corpus must hold.
def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"9.1", "9.2", "9.3"}
    assert len(wrong) >= 12 and len(right) >= 1
