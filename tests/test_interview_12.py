"""The interview bank's questions on lesson 12 (lessons/interview/bank_12.py).

As in tests/test_interview.py, each number an answer shows is checked independently of the
bank's `compute`: against the closed form with the example's numbers in it (Korthikanti et
al.'s per-layer bytes, the FLOP counts, the segments' peak taken segment by segment, the
sequence length where selective recomputation costs a given share, solved by hand), against
a direct call of the planner on a layout written out here, or, for runs on simulated
devices, against what the rules predict (a rerun that replays its masks changes nothing).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from minipar.plan import CLUSTERS, MODELS, Layout, rank_memory, step_time

ROOT = Path(__file__).resolve().parents[1]
BANK_PATH = ROOT / "lessons" / "interview" / "bank.py"

_spec = importlib.util.spec_from_file_location(  # the shared checks, loaded by path
    "interview_checks", Path(__file__).resolve().parent / "interview_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
bank = checks.load(BANK_PATH, "interview_bank_12_tests")
LESSON12 = [q for q in bank.QUESTIONS if q.lesson == "12"]
BY_ID = {q.id: q for q in LESSON12}
VALUES = checks.LazyValues(BY_ID)

GB, GiB, MiB = 10**9, 2**30, 2**20
A100_PEAK = 312e12  # A100 bf16 dense


def flops(B, s, l, h, V):
    """72 B s l h² (1 + s/(6h) + V/(12 l h)): a GPT step's model FLOPs."""
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def flops_full(B, s, l, h, V):
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def peak_by_hand(L, k, A, I):
    """The segments' worst moment: max over segments m of m·I + k_m·A."""
    sizes = [min(k, L - start) for start in range(0, L, k)]
    return max(m * I + size * A for m, size in enumerate(sizes))


def best_by_hand(L, A, I):
    peaks = {k: peak_by_hand(L, k, A, I) for k in range(1, L + 1)}
    return min(peaks, key=lambda k: (peaks[k], k))


# ---- q119, q120: Table 2 and no dropout -----------------------------------------------------
S0, B0, H0, A0, T0 = 3000, 2, 6144, 48, 8
SBH0 = S0 * B0 * H0
X0 = 5 * A0 * S0 / H0  # the scores' term, 5as/h
S1, B1, H1, A1 = 4096, 3, 5120, 40
SBH1, Y1 = S1 * B1 * H1, A1 * S1 / H1

# ---- q121: the simulated GPT (3 layers, h = 24, 2 heads, s = 12, b = 5, V = 48) -------------
SIM = dict(B=5, s=12, l=3, h=24, V=48)
SIM_F, SIM_FULL = flops(**SIM), flops_full(**SIM)
SIM_BLOCKS_FWD = SIM["B"] * SIM["l"] * (24 * SIM["s"] * SIM["h"] ** 2
                                        + 4 * SIM["s"] ** 2 * SIM["h"])

# ---- q122: Llama 3 70B's first rank, tp 8 + SP, selective, no dropout -----------------------
H70, Q70, KV70, F70, HEADS70 = 8192, 64 * 128, 8 * 128, 28672, 64


def llama70_selective_layer(s):
    """A layer, b = 1, on a tp rank of 8 with SP: 8sbh/t + 2s(2q + 2kv)/t + 6sf/t."""
    return (8 * s * H70 + 2 * s * (2 * Q70 + 2 * KV70) + 6 * s * F70) / 8


def llama70_rerun(s):
    """One layer's scores 2·a·s²/t less what its backward freed before reaching them."""
    core = 2 * HEADS70 * s * s / 8
    before = (6 * s * F70 + 4 * s * H70 + 2 * s * Q70) / 8
    return core, before


CORE_LONG, BEFORE_LONG = llama70_rerun(32768)
RERUN = {s: max(0.0, llama70_rerun(s)[0] - llama70_rerun(s)[1]) for s in (8192, 32768)}

# ---- q123: s where 4s²hl = target · 72slh²(1 + s/(6h) + V/(12lh)), solved for s --------------
H4, A4, L4, V4, T4 = 5120, 40, 48, 50257, 0.1
S_STAR = T4 * (1 + V4 / (12 * L4 * H4)) / (1 / (18 * H4) - T4 / (6 * H4))

# ---- q124: 88 layers, s = 3000, b = 3, h = 8192, a = 64, dropout ------------------------------
S5, B5, H5, A5, L5 = 3000, 3, 8192, 64, 88
I5 = 2 * S5 * B5 * H5
STORED5 = S5 * B5 * H5 * (34 + 5 * A5 * S5 / H5)
FLASH5 = 34 * S5 * B5 * H5 + 4 * A5 * S5 * B5

# ---- q125: FlashAttention without dropout, s = 4096, h = 5120, a = 40, b = 1 ----------------------
S6, H6, A6 = 4096, 5120, 40
I6, FLASH6 = 2 * S6 * H6, 32 * S6 * H6 + 4 * A6 * S6


def first_depth(k, A, I):
    L = 1
    while best_by_hand(L, A, I) < k:
        L += 1
    return L


# ---- q127: the 22B on 8 A100s, by a direct call of the planner ------------------------------
M22 = MODELS["22b"]


def lay22(rec, sp):
    return Layout(tp=8, micro_batch=4, global_batch=4, sequence_parallel=sp, recompute=rec)


ST22 = {tag: step_time(M22, lay22(rec, sp), CLUSTERS["a100"])
        for tag, rec, sp in (("full", "full", False), ("sel", "selective", True),
                             ("none", "none", True))}
F22 = flops(4, 2048, 48, 6144, 51200)

# ---- q128: Llama 3 8B at 16k on tp 4 + SP, dp 2 ---------------------------------------------
S9, T9 = 16384, 4
L8 = MODELS["llama3-8b"]
SEL9 = (8 * S9 * 4096 + 2 * S9 * (2 * 4096 + 2 * 1024) + 6 * S9 * 14336) / T9
CORE9 = 2 * 32 * S9 * S9 / T9


def st9(rec, flash):
    lay = Layout(tp=4, dp=2, global_batch=16, sequence_parallel=True, recompute=rec,
                 distributed_optimizer=True)
    return step_time(dataclasses.replace(L8, seq_len=S9), lay, CLUSTERS["h100"], dropout=False,
                     flash_attention=flash).seconds


T9S = {(rec, fl): st9(rec, fl) for rec in ("none", "selective") for fl in (False, True)}

# ---- q129: 44 layers, h = 6144, a = 48, s = 2048, b = 1, no dropout, ZeRO-3 ------------------
L0, H10, A10, S10 = 44, 6144, 48, 2048
I10 = 2 * S10 * H10
W10 = 2 * (12 * H10 * H10 + 13 * H10)
STORED10 = 32 * S10 * H10 + 2 * A10 * S10 * S10
FLASH10 = 32 * S10 * H10 + 4 * A10 * S10


def segments_of_2(A):
    return (peak_by_hand(L0, 2, A, I10) - peak_by_hand(L0, 1, A, I10)) / MiB


EXPECTED = {
    "q119": dict(s=S0, b=B0, h=H0, a=A0, t=T0, one_gb=SBH0 * (34 + X0) / GB,
                 none_tp_gb=SBH0 * (10 + 24 / T0 + X0 / T0) / GB,
                 x_tp=(34 + X0) / (10 + 24 / T0 + X0 / T0),
                 sel_tp_gb=SBH0 * (10 + 24 / T0) / GB, share=10 / (10 + 24 / T0),
                 none_sp_gb=SBH0 * (34 + X0) / T0 / GB, sel_sp_gb=SBH0 * 34 / T0 / GB),
    "q120": dict(s=S1, b=B1, h=H1, a=A1, with_gb=SBH1 * (34 + 5 * Y1) / GB,
                 without_gb=SBH1 * (32 + 2 * Y1) / GB, less=1 - (32 + 2 * Y1) / (34 + 5 * Y1),
                 share=2 * Y1 / (32 + 2 * Y1), sel_gb=32 * SBH1 / GB, sel_drop_gb=34 * SBH1 / GB,
                 over=(34 + 5 * Y1) / (32 + 2 * Y1) - 1),
    "q121": dict(sim_layers=3, sim_h=24, sim_s=12, sim_b=5, l=60, h=7168, s=4096, V=100000,
                 sim_none=SIM_F, sim_full=SIM_FULL, sim_ratio=SIM_FULL / SIM_F,
                 blocks_ratio=4 / 3,
                 bwd_ratio=(2 * SIM_F / 3 + SIM_BLOCKS_FWD) / (2 * SIM_F / 3),
                 ratio=flops_full(1, 4096, 60, 7168, 100000) / flops(1, 4096, 60, 7168, 100000)),
    "q122": dict(s_short=8192, s_long=32768,
                 steady_short=4 * 20 * llama70_selective_layer(8192) / GiB,
                 steady_long=4 * 20 * llama70_selective_layer(32768) / GiB,
                 rerun_short=RERUN[8192] / GiB, rerun_long=RERUN[32768] / GiB,
                 core_long=CORE_LONG / GiB, freed_long=BEFORE_LONG / GiB,
                 growth=RERUN[32768] / RERUN[8192], total_long=lambda v: v > 80e9 / GiB,
                 fits_long="does not fit in 80 GB"),
    "q123": dict(h=H4, a=A4, l=L4, V=V4, target=T4, s_star=S_STAR, approx=18 * H4 * T4,
                 saved=(5 * A4 * S_STAR / H4) / (34 + 5 * A4 * S_STAR / H4), qk=T4 / 2),
    "q124": dict(layers=L5, s=S5, b=B5, h=H5, a=A5, r_stored=STORED5 / I5,
                 kstar_stored=math.sqrt(L5 * I5 / STORED5),
                 best_stored=best_by_hand(L5, STORED5, I5),
                 best_stored_gb=peak_by_hand(L5, best_by_hand(L5, STORED5, I5), STORED5, I5) / GB,
                 chen_stored_gb=peak_by_hand(L5, 9, STORED5, I5) / GB, r_flash=FLASH5 / I5,
                 kstar_flash=math.sqrt(L5 * I5 / FLASH5), best_flash=best_by_hand(L5, FLASH5, I5),
                 best_flash_gb=peak_by_hand(L5, best_by_hand(L5, FLASH5, I5), FLASH5, I5) / GB,
                 per_flash_gb=peak_by_hand(L5, 1, FLASH5, I5) / GB, chen=9,
                 chen_flash_gb=peak_by_hand(L5, 9, FLASH5, I5) / GB),
    "q125": dict(s=S6, b=1, h=H6, a=A6, r=FLASH6 / I6, l2=first_depth(2, FLASH6, I6),
                 l3=first_depth(3, FLASH6, I6), l4=first_depth(4, FLASH6, I6),
                 t2=2 * FLASH6 / I6, t3=6 * FLASH6 / I6, t4=12 * FLASH6 / I6),
    "q126": dict(hfu=0.58, l=80, h=8192, s=4096, V=64000,
                 ratio_full=flops_full(1, 4096, 80, 8192, 64000) / flops(1, 4096, 80, 8192, 64000),
                 mfu_full=0.58 * flops(1, 4096, 80, 8192, 64000)
                 / flops_full(1, 4096, 80, 8192, 64000),
                 ratio_sel=1 + 4 * 4096**2 * 8192 * 80 / flops(1, 4096, 80, 8192, 64000),
                 mfu_sel=0.58 / (1 + 4 * 4096**2 * 8192 * 80 / flops(1, 4096, 80, 8192, 64000))),
    "q127": dict(batch=4, full_s=ST22["full"].seconds, sel_s=ST22["sel"].seconds,
                 none_s=ST22["none"].seconds,
                 full_mfu=F22 / (ST22["full"].seconds * 8 * A100_PEAK),
                 full_hfu=flops_full(4, 2048, 48, 6144, 51200) / (ST22["full"].seconds * 8
                                                                  * A100_PEAK),
                 sel_mfu=F22 / (ST22["sel"].seconds * 8 * A100_PEAK),
                 sel_hfu=(F22 + 4 * 4 * 2048**2 * 6144 * 48) / (ST22["sel"].seconds * 8
                                                                 * A100_PEAK),
                 d_hfu=lambda v: 0 < v < 3, slower=ST22["full"].seconds / ST22["sel"].seconds - 1,
                 none_gib=rank_memory(M22, lay22("none", True), CLUSTERS["a100"]).peak / GiB),
    "q128": dict(s=S9, tp=T9, dp=2, stored_gib=(SEL9 + CORE9) / GiB, sel_gib=SEL9 / GiB,
                 flash_gib=SEL9 / GiB, none_std_s=T9S["none", False],
                 sel_std_s=T9S["selective", False], none_fa_s=T9S["none", True],
                 sel_fa_s=T9S["selective", True],
                 extra=T9S["selective", True] / T9S["none", True] - 1),
    "q129": dict(layers=L0, h=H10, a=A10, s=S10, i_mib=I10 / MiB, w_mib=W10 / MiB,
                 r_stored=STORED10 / I10, d_stored=segments_of_2(STORED10),
                 z3_stored=segments_of_2(STORED10 + W10),
                 k_stored=math.sqrt(L0 * I10 / (STORED10 + W10)), r_flash=FLASH10 / I10,
                 d_flash=segments_of_2(FLASH10), z3_flash=segments_of_2(FLASH10 + W10),
                 k_flash=math.sqrt(L0 * I10 / (FLASH10 + W10)),
                 best_flash=best_by_hand(L0, FLASH10, I10)),
    "q130": dict(layers=2, h=16, s=8, B=3, p=0.1, loss=lambda v: 2 < v < 4,
                 same_loss="the same", err_right=0.0, err_bug=lambda v: 0.05 < v < 2,
                 err_nodrop=0.0),
}
INHERENT = {  # numbers an answer shows twice, or two quantities that print alike
    "q128": [{"sel_gib", "flash_gib"}],  # the point: FlashAttention keeps what selective keeps
    "q130": [{"err_right", "err_nodrop"}],  # both exactly 0: the rerun changes nothing
}


# ---- the part's shape --------------------------------------------------------------------
def test_twelve_questions_on_lesson_12_numbered_after_lesson_11():
    before = max(int(q.id[1:]) for q in bank.QUESTIONS if q.lesson < "12")
    assert [q.id for q in LESSON12] == [f"q{i}" for i in range(before + 1, before + 13)]
    assert bank.LESSONS["12"] == "Activation recomputation"
    assert set(EXPECTED) == set(BY_ID)


@pytest.mark.parametrize("qid", sorted(BY_ID))
def test_every_placeholder_is_filled_and_every_value_is_shown(qid):
    q, values = BY_ID[qid], VALUES[qid]
    checks.check_shown(q, values)
    checks.check_worked(q, values)


@pytest.mark.parametrize("qid", sorted(BY_ID))
def test_every_number_equals_the_independent_route(qid):
    checks.check_numbers(qid, VALUES[qid], EXPECTED[qid])


@pytest.mark.parametrize("qid", sorted(BY_ID))
def test_no_two_numbers_in_an_answer_coincide_unless_they_must(qid):
    checks.check_distinct(BY_ID[qid], VALUES[qid], INHERENT.get(qid, []))


# ---- what the answers claim, beyond the numbers -------------------------------------------
def test_the_claims_hold():
    v = VALUES
    assert v["q119"]["x_tp"] < 6 < 8  # not 1/t
    assert v["q122"]["growth"] > 16  # faster than s²: a constant is subtracted
    assert v["q123"]["s_star"] > v["q123"]["approx"]  # the rule is a lower bound
    assert v["q124"]["best_stored"] == 1 and v["q124"]["best_flash"] == 2
    assert v["q124"]["chen_flash_gb"] > v["q124"]["per_flash_gb"] > v["q124"]["best_flash_gb"]
    assert v["q125"]["l2"] > v["q125"]["t2"] and v["q125"]["l3"] > v["q125"]["t3"]
    assert v["q129"]["d_flash"] < 0 < v["q129"]["z3_flash"] < v["q129"]["z3_stored"]
    assert v["q129"]["k_stored"] < 1 and v["q129"]["k_flash"] < 1
    assert v["q127"]["full_s"] > v["q127"]["sel_s"] > v["q127"]["none_s"]
    assert v["q128"]["none_fa_s"] < v["q128"]["sel_fa_s"] < v["q128"]["none_std_s"]


def test_the_fresh_masks_loss_is_one_devices_loss_by_another_route():
    """q130's loss is the forward's alone: the same under selective recomputation, whose
    path through the attention core differs."""
    loss, _ = bank.bank_12.gradients(2, 16, 2, 8, 24, 3, 0.1, "selective", False)
    assert loss == pytest.approx(VALUES["q130"]["loss"], abs=1e-12)


def test_the_lesson_option_prints_lesson_12s_questions(capsys):
    assert bank.main(["--lesson", "12"]) == 0
    out = capsys.readouterr().out
    assert "=== Lesson 12 — Activation recomputation (12 questions) ===" in out
    shown = {q.id for q in bank.QUESTIONS if f"\n{q.id}  " in out}
    assert shown == set(BY_ID)
