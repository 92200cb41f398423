"""The interview bank's questions on lesson 11, mixed precision (lessons/interview/bank_11.py).

As in tests/test_interview.py, each number an answer shows is checked independently of the
bank's `compute`: the formats' constants from their bit counts, roundings redone by hand
(frexp to a number of significant bits, ties to even; the subnormal quantum; E4M3 by its
own rule), the loss scaler's rule written out, the byte counts as sums of 2, 4, 12 and 8,
the accumulations and the all-reduce as sequential sums in bf16 and float32, the ring's
α–β cost with the preset's numbers, a parameter count from the model's shape.
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BANK_PATH = ROOT / "lessons" / "interview" / "bank.py"

_spec = importlib.util.spec_from_file_location(  # the shared checks, loaded by path
    "interview_checks", Path(__file__).resolve().parent / "interview_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
bank = checks.load(BANK_PATH, "interview_bank_11_tests")
LESSON_11 = [q for q in bank.QUESTIONS if q.lesson == "11"]
BY_ID = {q.id: q for q in LESSON_11}
VALUES = checks.LazyValues(BY_ID)

BF16 = np.dtype(ml_dtypes.bfloat16)
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU: bytes/s, seconds


def significant(x: float, bits: int) -> float:
    """x rounded to `bits` significant bits, ties to even (a normal number's rounding)."""
    m, e = math.frexp(x)  # x = m·2^e, 0.5 <= |m| < 1
    return float(np.round(m * 2**bits)) / 2**bits * 2.0**e


def e4m3(v: np.ndarray) -> np.ndarray:
    """E4M3 by its rule: 4 significant bits from 2^-6 up, a quantum of 2^-9 below, ties to
    even, |v| <= 448 here (the factor maps the largest to 448)."""
    out = np.empty_like(v, dtype=np.float64)
    for i, x in enumerate(v.astype(np.float64).ravel()):
        out.flat[i] = (significant(x, 4) if abs(x) >= 2.0**-6
                       else float(np.round(x / 2.0**-9)) * 2.0**-9)
    return out


def sequential(grads, dtype):
    """((g1 + g2) + g3) + ... rounded to `dtype` after each addition: every partial sum."""
    acc, out = None, []
    for g in grads:
        acc = g.astype(dtype) if acc is None else (acc + g.astype(dtype)).astype(dtype)
        out.append(acc.astype(np.float64))
    return out


def rel(x, ref):
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


# ---- q108: the master, in float32 arithmetic -------------------------------------------------
W16 = significant(0.37, 8)
W32, FIRST = np.float32(W16), None
for _step in range(1, 301):
    W32 = np.float32(W32 - np.float32(2e-4))
    if FIRST is None and significant(float(W32), 8) != W16:
        FIRST = _step

# ---- q110: the scaler's rule, written out ----------------------------------------------------
SCALE, CLEAN, LOGS, SKIPPED = 2.0**16, 0, [], 0
for _step in range(17):
    if _step in (0, 1, 2, 7, 12):
        SCALE, CLEAN, SKIPPED = max(SCALE / 2, 1.0), 0, SKIPPED + 1
    else:
        CLEAN += 1
        if CLEAN == 4:
            SCALE, CLEAN = SCALE * 2, 0
    LOGS.append(int(math.log2(SCALE)))

# ---- q112: Ψ from the shape -------------------------------------------------------------------
H123, L123, V123, S123 = 24, 3, 40, 12
PSI123 = L123 * (12 * H123**2 + 13 * H123) + V123 * H123 + S123 * H123 + 2 * H123 + V123 * H123

# ---- q113: the same micro-batch gradients, summed by hand ------------------------------------
_rng = np.random.default_rng(124)
G124 = [(_rng.standard_normal(4096) + 0.4).astype(BF16) for _ in range(96)]
EXACT124 = np.cumsum([g.astype(np.float64) for g in G124], axis=0)
BF124, F32_124 = sequential(G124, BF16), sequential(G124, np.float32)
E124 = {"bf_half_err": rel(BF124[47], EXACT124[47]), "bf_err": rel(BF124[-1], EXACT124[-1]),
        "mg_half_err": rel(F32_124[47], EXACT124[47]), "mg_err": rel(F32_124[-1], EXACT124[-1])}

# ---- q114: the all-reduce as a sum in rank order ---------------------------------------------
G125 = [(np.random.default_rng([125, r]).standard_normal(2048) * 1e-3 + 2e-3).astype(BF16)
        for r in range(48)]
EXACT125 = np.mean([g.astype(np.float64) for g in G125], axis=0)
AVG_BF16 = (sequential(G125, BF16)[-1].astype(BF16) / 48).astype(BF16)
AVG_F32 = (sequential(G125, np.float32)[-1].astype(np.float32) / 48).astype(np.float32)

# ---- q115: ring all-reduce and reduce-scatter on InfiniBand ---------------------------------
S126 = {"bf": 1.7e9 * 2, "f32": 1.7e9 * 4}
AR126 = {k: 2 * 15 * IB_A + 2 * 15 / 16 * S / IB_B for k, S in S126.items()}
RS126 = {k: 15 * IB_A + 15 / 16 * S / IB_B for k, S in S126.items()}

# ---- q117: E4M3 by its own rule, per tensor and per tile -------------------------------------
_x = np.random.default_rng(128).standard_normal((48, 1024)).astype(np.float32)
_x[:, 5] *= 4000
_rest = np.ones(1024, bool)
_rest[5] = False
_s = 448 / np.abs(_x).max()
_tensor = (e4m3(_x[:, _rest] * _s) / _s)
_tiles = _x.reshape(48, 8, 128)
_st = np.repeat(448 / np.abs(_tiles).max(axis=2), 128, axis=1)  # [tokens, channels]
_tile = (e4m3(_x * _st) / _st)[:, _rest]

# ---- q118: truncation and rounding in [1, 2), where the step is 2^-7 --------------------------
X129 = np.random.default_rng(129).uniform(1.0, 2.0, 20000).astype(np.float32).astype(np.float64)
TRUNC129, RNE129 = np.floor(X129 * 128) / 128, np.round(X129 * 128) / 128

EXPECTED = {
    "q107": dict(g=3.3e-6, a=70000, bf_eps=2.0**-7, bf_max=(2 - 2.0**-7) * 2.0**127,
                 bf_normal=2.0**-126, fp_eps=2.0**-10, fp_max=65504.0, fp_normal=2.0**-14,
                 bf_g=significant(3.3e-6, 8), fp_g=round(3.3e-6 / 2.0**-24) * 2.0**-24,
                 bf_g_err=abs(significant(3.3e-6, 8) - 3.3e-6) / 3.3e-6,
                 fp_g_err=abs(round(3.3e-6 / 2.0**-24) * 2.0**-24 - 3.3e-6) / 3.3e-6,
                 bf_a=significant(70000, 8), bf_a_err=abs(significant(70000, 8) - 70000) / 70000,
                 fp_a="inf"),
    "q108": dict(w=0.37, lr=2e-4, steps=300, w16=W16, half=2.0**-10, alone=W16,
                 master=lambda v: abs(v - float(W32)) < 1e-7, model=significant(float(W32), 8),
                 first=FIRST),
    "q109": dict(lo=2.5e-9, hi=3e-3, lo_fp16=0.0, normal=2.0**-14,
                 s_min_log=math.ceil(math.log2(2.0**-14 / 2.5e-9)),
                 s_max_log=math.floor(math.log2(65504 / 3e-3)),
                 count=math.floor(math.log2(65504 / 3e-3))
                 - math.ceil(math.log2(2.0**-14 / 2.5e-9)) + 1,
                 over_log=math.floor(math.log2(65504 / 3e-3)) + 1,
                 hi_over=lambda v: v == math.inf),
    "q110": dict(interval=4, steps=17, overflows=(0, 1, 2, 7, 12), final_log=LOGS[-1],
                 skipped=SKIPPED, taken=17 - SKIPPED, count=CLEAN, lowest_log=min(LOGS),
                 grew=sum(1 for a, b in zip(LOGS, LOGS[1:]) if b > a)),
    "q111": dict(psi_b=13, mp_=4, dp=12, bf_b=18, bf_gb=18 * 13 / 4, bf_dist_b=6 + 12 / 12,
                 bf_dist_gb=(6 + 12 / 12) * 13 / 4, f32_b=16, f32_gb=16 * 13 / 4,
                 f32_dist_b=8 + 8 / 12, f32_dist_gb=(8 + 8 / 12) * 13 / 4),
    "q112": dict(h=24, layers=3, vocab=40, s=12, psi=PSI123, bf_b=16, mg_b=18,
                 bf_peak_g=2 + 4 * 4 * H123**2 / PSI123, mg_peak_g=4, n_max=4 * H123**2),
    "q113": dict(k=96, elements=4096, **E124, ratio=E124["bf_err"] / E124["mg_err"]),
    "q114": dict(n=48, elements=2048, bf_err=rel(AVG_BF16, EXACT125),
                 f32_err=rel(AVG_F32, EXACT125), bf_kib=2 * 47 / 48 * 2048 * 2 / 1024,
                 f32_kib=2 * 47 / 48 * 2048 * 4 / 1024),
    "q115": dict(psi_r_b=1.7, dp=16, gpus_per_node=8, bf_gb=3.4, f32_gb=6.8,
                 bf_ar_s=AR126["bf"], bf_rs_s=RS126["bf"], f32_ar_s=AR126["f32"],
                 f32_rs_s=RS126["f32"], ratio=AR126["f32"] / AR126["bf"]),
    "q116": dict(amax=37.5, e4_max=448.0, e4_normal=2.0**-6, e4_sub=2.0**-9, e4_eps=2.0**-3,
                 e4_binades=math.log2(448 * 2**9), e5_max=57344.0, e5_normal=2.0**-14,
                 e5_sub=2.0**-16, e5_eps=2.0**-2, e5_binades=math.log2(57344 * 2**16),
                 scale=448 / 37.5, kept_normal=2.0**-6 * 37.5 / 448,
                 kept_any=2.0**-10 * 37.5 / 448),
    "q117": dict(outlier=4000, channels=1024, tokens=48,
                 tensor_err=rel(_tensor, _x[:, _rest]), tensor_zero=float(np.mean(_tensor == 0)),
                 tile_err=rel(_tile, _x[:, _rest]), tile_zero=float(np.mean(_tile == 0)),
                 tiles=8),
    "q118": dict(n=20000, trunc_mean=float(np.mean(TRUNC129 - X129)),
                 rne_mean=float(np.mean(RNE129 - X129)),
                 trunc_sum=float(np.sum(TRUNC129) - np.sum(X129)),
                 rne_sum=float(np.sum(RNE129) - np.sum(X129)), step=2.0**-7),
}

# quantities that print alike because they are alike
INHERENT = {
    "q108": [{"w16", "alone"}],  # the point: the bf16 weight never moves
}


def test_twelve_questions_on_lesson_11_numbered_after_lesson_10():
    before = max(int(q.id[1:]) for q in bank.QUESTIONS if q.lesson < "11")
    assert [q.id for q in LESSON_11] == [f"q{i}" for i in range(before + 1, before + 13)]
    assert bank.LESSONS["11"] == "Mixed precision"
    assert set(EXPECTED) == set(BY_ID)


@pytest.mark.parametrize("qid", sorted(EXPECTED))
def test_every_placeholder_is_filled_and_every_value_is_shown(qid):
    checks.check_shown(BY_ID[qid], VALUES[qid])
    checks.check_worked(BY_ID[qid], VALUES[qid])


@pytest.mark.parametrize("qid", sorted(EXPECTED))
def test_every_number_equals_the_independent_route(qid):
    values = dict(VALUES[qid])
    if qid == "q117":  # E4M3 redone in float64 arithmetic: equal to float32's within 1e-7
        for key in ("tensor_err", "tile_err"):
            assert values[key] == pytest.approx(EXPECTED[qid][key], rel=1e-6)
            values[key] = EXPECTED[qid][key]
    checks.check_numbers(qid, values, EXPECTED[qid])


@pytest.mark.parametrize("qid", sorted(EXPECTED))
def test_no_two_numbers_in_an_answer_coincide_unless_they_must(qid):
    checks.check_distinct(BY_ID[qid], VALUES[qid], INHERENT.get(qid, []))


def test_what_the_answers_claim():
    v = VALUES
    assert v["q107"]["bf_g_err"] < 2.0**-8 < v["q107"]["fp_g_err"]  # fp16's subnormal
    assert v["q108"]["half"] > v["q108"]["lr"] and v["q108"]["first"] == 5
    assert v["q113"]["bf_half_err"] < v["q113"]["bf_err"] and v["q113"]["ratio"] > 1e5
    assert v["q114"]["f32_err"] < 1e-7 < 1e-3 < v["q114"]["bf_err"]
    assert v["q117"]["tile_err"] < v["q117"]["tensor_err"]
    assert v["q117"]["tile_zero"] < v["q117"]["tensor_zero"] / 10
    assert abs(v["q118"]["rne_sum"]) < 1 < -v["q118"]["trunc_sum"]


def test_the_bank_computes_lesson_11_in_a_few_seconds():
    start = time.process_time()
    for q in LESSON_11:
        q.compute(**q.given)
    assert time.process_time() - start < 6  # measured about 1.2 s alone


def test_the_lesson_option_prints_lesson_11(capsys):
    assert bank.main(["--lesson", "11"]) == 0
    out = capsys.readouterr().out
    assert "=== Lesson 11 — Mixed precision (12 questions) ===" in out
    shown = {q.id for q in bank.QUESTIONS if f"\n{q.id}  " in out}
    assert shown == set(BY_ID)
    flat = " ".join(out.split())
    for q in LESSON_11:
        assert " ".join(q.render(VALUES[q.id])[1].split()) in flat, q.id
