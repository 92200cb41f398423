"""Lesson 11's numbers, as the lesson computes them, against hand-written formulas: the three
formats' epsilon, range and spacing from their bit counts, the rounding of the tie cases
bit by bit, the lost update and the master that keeps it, fp16's underflow and overflow at
each scale and the loss scaler's cycle, 16 against 18 bytes a parameter and 6 + 12/d on
the ledger, the accumulated and all-reduced gradients redone here by sequential sums in
bf16 and float32, the reduction's doubled bytes, and the FP8 formats and scaling. Then the
exercises: the rounding exercise on a million bit patterns, the budget task's problem as
the lesson states it, and what this lesson's corpus must hold."""

import math

import ml_dtypes
import numpy as np
import pytest

import minipar as mp
from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, gaps
from minipar.course.grading import load_implementation
from minipar.nn import GPT

LESSON = find_lesson("11")
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


def test_epsilon_range_and_subnormals_from_the_bit_counts(lesson):
    for name, (e, m) in {"fp32": (8, 23), "bf16": (8, 7), "fp16": (5, 10)}.items():
        r = lesson["ranges"][name]
        bias = 2 ** (e - 1) - 1
        assert (r["e"], r["m"]) == (e, m)
        assert r["eps"] == 2.0**-m
        assert r["max"] == (2 - 2.0**-m) * 2.0**bias
        assert r["normal"] == 2.0 ** (1 - bias)
        assert r["subnormal"] == 2.0 ** (1 - bias - m)
    assert lesson["ranges"]["fp16"]["max"] == 65504


def test_the_spacing_is_2_to_the_e_minus_m_and_fp16s_ends(lesson):
    for j, k in enumerate(lesson["exponents"]):  # x = 1.25·2^k, inside the binade 2^k
        assert lesson["spacing"]["fp32"][j] == 2.0 ** (k - 23)
        assert lesson["spacing"]["bf16"][j] == 2.0 ** (k - 7)
        fp16 = lesson["spacing"]["fp16"][j]
        if 1.25 * 2.0**k > 65504:
            assert math.isnan(fp16)  # infinite
        elif k >= -14:
            assert fp16 == 2.0 ** (k - 10)
        elif 1.25 * 2.0**k >= 2.0**-25:  # rounds to a subnormal: the step is 2^-24
            assert fp16 == 2.0**-24
        else:
            assert math.isnan(fp16)  # rounds to zero


def test_the_tie_cases_round_to_even_bit_by_bit(lesson):
    want = {1 + 2.0**-8: 0x3F80, 1 + 3 * 2.0**-8: 0x3F82, 1 + 2.0**-8 + 2.0**-20: 0x3F81,
            -1.999: 0xC000, float(np.finfo(np.float32).max): 0x7F80}
    assert sorted(want) == sorted(lesson["tie_cases"].values())
    for value, bits in want.items():
        b = int(np.array([value], np.float32).view(np.uint32)[0])
        lsb = (b >> 16) & 1
        assert (b + 0x7FFF + lsb) >> 16 == bits  # the rule the lesson states
        assert int(np.array([value], np.float32).astype(BF16).view(np.uint16)[0]) == bits


def test_the_update_is_lost_in_bf16_and_kept_by_the_master(lesson):
    assert float(lesson["w16"][0]) == 1.0
    f32 = np.float32(1.0)
    for _ in range(1000):
        f32 = np.float32(f32 - np.float32(1e-4))  # SGD's float32 arithmetic on the master
    assert lesson["master_w"] == pytest.approx(float(f32), abs=1e-7)
    assert abs(lesson["master_w"] - 0.9) < 1e-4
    assert lesson["model_w"] == float(np.array([lesson["master_w"]], np.float32).astype(BF16)[0])
    assert lesson["model_w"] == 0.8984375  # 0.9 to 8 significant bits
    u = 3e-4
    for name, m in (("bf16", 7), ("fp16", 10), ("fp32", 23)):
        E = min(E for E in range(-30, 40) if 2.0 ** (E - m - 1) > u)
        assert lesson["deaf"][name] == 2.0**E
    assert lesson["deaf"] == {"bf16": 0.125, "fp16": 1.0, "fp32": 8192.0}


def test_fp16_underflow_and_overflow_at_each_scale(lesson):
    x = lesson["magnitudes"]
    for S, got in lesson["scaled"].items():
        y = x * S
        assert got["zero"] == pytest.approx(np.mean(y < 2.0**-25), abs=1e-4)
        assert got["subnormal"] == pytest.approx(np.mean((y > 2.0**-25) & (y < 2.0**-14)),
                                                 abs=1e-3)
        assert got["inf"] == pytest.approx(np.mean(y >= 65520), abs=1e-4)  # rounds past 65504
    assert lesson["scaled"][2.0**24] == {"zero": 0.0, "subnormal": 0.0, "inf": 0.0}
    assert lesson["scaled"][2.0**28]["inf"] > 0.05


def test_the_loss_scaler_skips_halves_and_grows_every_third_clean_step(lesson):
    trace = lesson["trace16"]
    scale, clean, last_loss = 2.0**24, 0, None
    for step, S, largest, taken, after, loss in trace:
        assert S == scale
        assert taken == (math.isfinite(largest) and largest <= 65504)
        if taken:
            clean += 1
            scale = scale * 2 if clean == 3 else scale
            clean = 0 if clean == 3 else clean
        else:
            scale, clean = scale / 2, 0
        assert after == scale
        if last_loss is not None and not last_taken:
            assert loss == last_loss  # nothing moved during a skipped step
        last_loss, last_taken = loss, taken
    skipped = [t[0] for t in trace if not t[3]]
    assert skipped == [0, 1, 2, 3, 4, 5, 6, 10] and lesson["skipped16"] == 8
    assert trace[7][1] == 2.0**17 and trace[7][2] == 46592


def test_16_and_18_bytes_on_the_ledger_and_6_plus_12_over_d(lesson):
    cfg = lesson["cfg"]
    h, V, s, L = cfg.hidden, cfg.vocab_size, cfg.seq_len, cfg.num_layers
    psi = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h + V * h  # blocks, ends, head
    assert lesson["psi"] == psi == 7744
    n_max = 4 * h * h  # the MLP's matrices, the largest tensors
    assert lesson["measured"][False] == {"parameters": 2, "gradients": 2,
                                         "optimizer_states": 12,
                                         "peak gradients": 2 + 4 * n_max / psi}
    assert lesson["measured"][True] == {"parameters": 2, "gradients": 4,
                                        "optimizer_states": 12, "peak gradients": 4}
    for d, held in lesson["dist_held"].items():
        assert held == [6 + 12 / d] * d  # every unit a multiple of d: no padding


def sequential(grads, dtype):
    """((g1 + g2) + g3) + ... rounded to `dtype` after every addition, as a buffer adds."""
    acc, out = None, []
    for g in grads:
        acc = g.astype(dtype) if acc is None else (acc + g.astype(dtype)).astype(dtype)
        out.append(acc.astype(np.float64))
    return out


def test_the_accumulated_gradients_are_sequential_sums_in_bf16_and_float32(lesson):
    """Redone here: each micro-batch's bf16 gradient, summed in bf16 (the bf16 buffer) and
    in float32 (main_grad), in order: the lesson's gradients to the bit."""
    K, ids = lesson["K"], lesson["idsK"]
    with mp.device():
        model = GPT(lesson["cfg1"])
        each = []
        for i in range(K):
            model.loss_and_grad(ids[:-1, i:i + 1], ids[1:, i:i + 1], loss_scale=1 / K)
            each.append(np.concatenate([p.grad.ravel() for p in model.parameters()]))
            for p in model.parameters():
                p.free_grad()
    in_bf16, in_fp32 = sequential(each, BF16), sequential(each, np.float32)
    exact = np.cumsum([g.astype(np.float64) for g in each], axis=0)
    for k in lesson["checkpoints"]:
        assert np.array_equal(lesson["grads_at"]["bf16 buffer"][k], in_bf16[k - 1])
        assert np.array_equal(lesson["grads_at"]["float32 main_grad"][k], in_fp32[k - 1])
        assert np.array_equal(lesson["grads_at"]["exact sum"][k], exact[k - 1])
    err = lesson["errors"]
    bf16, main = err["bf16 buffer", "exact sum"], err["float32 main_grad", "exact sum"]
    assert bf16[0] == main[0] == 0 and all(e == 0 for e in main[:5])  # k <= 16: exact
    assert max(main) < 1e-8 and bf16 == sorted(bf16) and bf16[-1] > 1e-2
    model_bf16, model_main = err["bf16 buffer", "float64 model"], err["float32 main_grad",
                                                                      "float64 model"]
    assert model_bf16[0] == model_main[0]  # one micro-batch: the same bits
    assert model_bf16[-1] > 2.5 * model_main[-1] and max(model_main) < 6e-3


def test_the_all_reduce_errors_are_sequential_sums_in_rank_order(lesson):
    for j, n in enumerate(lesson["worlds"]):
        grads = [(np.random.default_rng([11, r]).standard_normal(4096) * 1e-3 + 2e-3)
                 .astype(BF16) for r in range(n)]
        exact = np.mean([g.astype(np.float64) for g in grads], axis=0)
        in_bf16 = (sequential(grads, BF16)[-1].astype(BF16) / n).astype(BF16)
        in_fp32 = (sequential(grads, np.float32)[-1].astype(np.float32) / n).astype(np.float32)
        for label, got in (("bf16 all-reduce", in_bf16), ("float32 all-reduce", in_fp32)):
            want = np.linalg.norm(got.astype(np.float64) - exact) / np.linalg.norm(exact)
            assert lesson["reduction"][label][j] == pytest.approx(want, rel=1e-12, abs=0)
    bf16, fp32 = lesson["reduction"]["bf16 all-reduce"], lesson["reduction"]["float32 all-reduce"]
    assert bf16 == sorted(bf16) and fp32[:3] == [0.0, 0.0, 0.0] and max(fp32) < 1e-8
    psi = lesson["psi"]
    for main, per in ((False, 2), (True, 4)):
        sent, dtype = lesson["ddp_sent"][main]
        assert sent == 2 * 3 / 4 * per * psi and dtype == (np.float32 if main else BF16)


def test_the_fp8_formats_and_what_scaling_keeps(lesson):
    want = {"E4M3": (2.0**-3, 448.0, 2.0**-6, 2.0**-9), "E5M2": (2.0**-2, 57344.0, 2.0**-14,
                                                                  2.0**-16)}
    for name, (eps, top, normal, sub) in want.items():
        r = lesson["fp8"][name]
        assert (r["eps"], r["max"], r["normal"], r["subnormal"]) == (eps, top, normal, sub)
        assert r["binades"] == pytest.approx(math.log2(top / sub))
    assert 448 == 1.75 * 2**8 and 57344 == 1.75 * 2**15  # E4M3 keeps one more exponent code
    e = lesson["fp8_errors"]
    for factor in (1e2, 1e3, 1e4):
        tile, tensor = e[factor, "1 x 128 tiles"], e[factor, "per tensor"]
        assert tile[0] < 2.0**-4 and tile[0] <= tensor[0] and tile[1] <= tensor[1]
    assert e[1e4, "per tensor"][0] > 1.5 * e[1e4, "1 x 128 tiles"][0]
    assert e[1e4, "per tensor"][1] > 0.05
    assert lesson["no_factor"][1] > 0.5


# ---- the exercises -------------------------------------------------------------------------
def test_the_rounding_solution_is_the_cast_on_a_million_bit_patterns():
    solution = load_implementation(LESSON.path("solution"))
    bits = np.random.default_rng(0).integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(
        np.uint32)
    bits = bits[(bits & 0x7F800000) != 0x7F800000]  # no NaN or inf here; inf below
    bits = np.concatenate([bits, np.array([0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x0000FFFF,
                                           0x80008000, 0x00018000], np.uint32)])
    x = bits.view(np.float32)
    assert np.array_equal(solution.round_to_bf16_bits(x), x.astype(BF16).view(np.uint16))


def test_the_budget_task_is_the_one_the_lesson_states():
    grader = load_implementation(LESSON.path("grader"))
    text = " ".join(LESSON.path("lesson").read_text(encoding="utf-8").replace("#", " ").split())
    psi = grader.CFG.num_parameters()
    assert grader.MAX_ERROR == 1e-5 and "within 10⁻⁵" in text
    assert (f"a bf16 GPT of {psi:,} parameters on n = 2 to 4 ranks that peaks under "
            f"{grader.MEMORY_BUDGET:,} bytes a rank (15 bytes a parameter)") in text
    assert 15 * psi < grader.MEMORY_BUDGET < 15.1 * psi  # 18Ψ does not fit, 6 + 12/2 does


def test_the_corpus_covers_every_exercise():
    wrong, right = corpus_of(LESSON)
    assert gaps(LESSON, wrong, right) == []
    assert {w.exercise for w in wrong} == {"11.1", "11.2", "11.3", "11.4"}
    assert len(wrong) >= 16 and len(right) >= 4
