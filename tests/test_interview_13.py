"""The interview bank's questions on lesson 13 (lessons/interview/bank_13.py): checkpoints,
faults and hangs.

As in tests/test_interview_design.py, each number an answer shows is checked independently
of the bank's `compute`: Llama 3 405B's parameters from its shape, the checkpoint's bytes,
Young's and Daly's intervals and the overheads written out with the example's numbers, the
exact model's optimum found here on a grid, the flat layout's shards by ceiling division,
the planner called directly on layouts written out here, DDP's buckets cut by hand from the
model's parameter sizes, a straggler's step from the clock's rules, and the files a save
leaves from who writes under each engine.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT
from minipar.plan import CLUSTERS, MODELS, Layout, rank_memory, step_time

ROOT = Path(__file__).resolve().parents[1]
BANK_PATH = ROOT / "lessons" / "interview" / "bank.py"

_spec = importlib.util.spec_from_file_location(  # the shared checks, loaded by path
    "interview_checks", Path(__file__).resolve().parent / "interview_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
bank = checks.load(BANK_PATH, "interview_bank_13_tests")
LESSON13 = [q for q in bank.QUESTIONS if q.lesson == "13"]
BY_ID = {q.id: q for q in LESSON13}
VALUES = checks.LazyValues(BY_ID)

GB, GIB, DAY = 10**9, 2**30, 86400
H100 = CLUSTERS["h100"]
PEAK = 989e12  # H100 bf16 dense
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B = 50e9  # InfiniBand NDR, one GPU
HBM = 80e9

# Llama 3 405B from its shape (Dubey et al. 2024, Table 3): 126 layers of h = 16384, 128
# heads of 128 with 8 key-value heads, SwiGLU of 53,248, two RMSNorm gains; V = 128,256,
# untied embedding and head, a final norm
H, L, F, V, KV = 16384, 126, 53248, 128256, 8 * 128
PSI405 = L * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H) + 2 * V * H + H
CKPT = PSI405 * (2 + 4 + 4 + 4)  # bf16 weights; float32 master, m and v
M = 54 * DAY / 419  # the job's mean time between unexpected interruptions
DELTA = CKPT / 2e12  # a sharded save at the storage's 2 TB/s


def young(d, m):
    return math.sqrt(2 * d * m)


def first_order(tau, d, m, restart=0.0):
    return d / tau + ((tau + d) / 2 + restart) / m


def exact(tau, d, m):
    return m * np.expm1((tau + d) / m) / tau - 1


def grid_minimum(d, m):
    """The exact model's minimum on a grid fine enough to place it within 0.01 %."""
    taus = np.geomspace(60, 10 * m, 400_000)
    return float(taus[np.argmin(exact(taus, d, m))])


def near(want, rel):
    return lambda v: v == pytest.approx(want, rel=rel)


# ---- q134: a slow save ----------------------------------------------------------------------
D145, M145 = 20 * 60, 3 * 3600
Y145 = young(D145, M145)
DALY145 = Y145 * (1 + math.sqrt(D145 / (2 * M145)) / 3 + D145 / (18 * M145)) - D145
BEST145 = grid_minimum(D145, M145)

# ---- q135, q136: Llama 3's failures ---------------------------------------------------------
TAU = young(DELTA, M)
REDO = (TAU + DELTA) / 2
LOST146 = 419 * (REDO + 600)
SAVES146 = 54 * DAY * DELTA / (TAU + DELTA)
M147 = 16384 * M / 100000

# ---- q138: Llama 3 70B loses a node of 48 ---------------------------------------------------
L70 = MODELS["llama3-70b"]


def megatron(tp, pp, dp, batch):
    return Layout(tp=tp, pp=pp, dp=dp, global_batch=batch, sequence_parallel=True,
                  recompute="selective", distributed_optimizer=True)


LAY149 = {"from": megatron(8, 4, 12, 576), "to": megatron(8, 4, 11, 572),
          "re": megatron(8, 2, 23, 575)}
PLAN149 = {k: (rank_memory(L70, lay, H100, dropout=False),
               step_time(L70, lay, H100, dropout=False)) for k, lay in LAY149.items()}
TOK149 = {k: LAY149[k].global_batch * 8192 / st.seconds for k, (_, st) in PLAN149.items()}


# ---- q141: DDP's buckets cut by hand ---------------------------------------------------------
def buckets_by_hand(layers, cap_bytes):
    """Parameters in reverse unit order (reverse within a unit), a bucket closed once it
    holds cap_bytes or more: each bucket's set of units."""
    cfg = bank.bank_13.tiny(num_layers=layers)
    with mp.device():
        units = GPT(cfg).units()
    out, current, size = [], set(), 0
    order = [(u, p) for u, ps in reversed(units) for p in reversed(ps)]
    for i, (u, p) in enumerate(order):
        current.add(u)
        size += p.data.nbytes
        if size >= cap_bytes or i == len(order) - 1:
            out.append(current)
            current, size = set(), 0
    return out


BUCKETS152 = buckets_by_hand(4, 0.002 * 2**20)
NEVER152 = next(i for i, units in enumerate(BUCKETS152) if "blocks.1" in units)

# ---- q142: a straggler on the peak clock ------------------------------------------------------
T153 = 0.5e12 / PEAK
AR153 = 2 * 7 * NV_A + 2 * 7 / 8 * 4 * 2**20 / NV_B  # a ring of 8 on NVLink

EXPECTED = {
    "q131": dict(gpus=16384, measured=14.0, master_b=4.0, w=2, held=18, psi_b=PSI405 / 1e9,
                 size_tb=CKPT / 1e12, per_gpu_mb=CKPT / 16384 / 1e6),
    "q132": dict(gpus=16384, fs_tbs=2.0, per_gpu_mb=CKPT / 16384 / 1e6, size_tb=CKPT / 1e12,
                 shard_s=DELTA, link_gbs=50, one_s=CKPT / IB_B, ratio=2e12 / IB_B,
                 devices=CKPT / HBM, hbm_gb=80),
    "q133": dict(days=54, planned=47, unexpected=419, fs_tbs=2.0, mtbf_h=M / 3600,
                 delta_s=DELTA, young_min=TAU / 60, overhead=first_order(TAU, DELTA, M),
                 total=466, mtbf_all_h=54 * 24 / 466,
                 young_all_min=young(DELTA, 54 * DAY / 466) / 60,
                 overhead_all=first_order(young(DELTA, 54 * DAY / 466), DELTA, M)),
    "q134": dict(delta_min=20, mtbf_h=3, young_min=Y145 / 60, daly_min=DALY145 / 60,
                 best_min=near(BEST145 / 60, 1e-4),
                 over_young=float(exact(Y145, D145, M145)),
                 over_daly=float(exact(DALY145, D145, M145)),
                 over_best=near(float(exact(BEST145, D145, M145)), 1e-8),
                 first_order=first_order(Y145, D145, M145)),
    "q135": dict(restart_min=10, effective=0.9, delta_s=DELTA, tau_min=TAU / 60, redo_s=REDO,
                 lost_h=LOST146 / 3600, lost_gpuh=LOST146 / 3600 * 16384,
                 save_h=SAVES146 / 3600, trained=1 - (LOST146 + SAVES146) / (54 * DAY),
                 r_max_min=(0.1 - first_order(TAU, DELTA, M)) * M / 60),
    "q136": dict(gpus_to=100000, m_h=M / 3600, gpu_years=16384 * M / (365 * DAY),
                 m_to_min=M147 / 60, delta_s=DELTA, young_to_min=young(DELTA, M147) / 60,
                 over_now=first_order(TAU, DELTA, M),
                 over_to=first_order(young(DELTA, M147), DELTA, M147)),
    # 1003 over 6: shards of 168 (1008 = 6 x 168, 5 of padding); over 4: 251 (1004, 1);
    # rank 2 of 4 needs [502, 753): old 2 = [336, 504), old 3 = [504, 672), old 4 = [672, 840)
    "q137": dict(numel=1003, n=6, m=4, rank=2, old_s=168, old_pad=5, new_s=251, lo=502,
                 hi=753, count=3,
                 pieces="old rank 2's [166:168], old rank 3's [0:168], old rank 4's [0:81]"),
    "q138": dict(nodes=48, tp=8, pp=4, batch=576, dp_from=12, dp_to=11, re_pp=2, re_dp=23,
                 batch_to=572, k_to=52, idle=47 - 44,
                 peak_from=PLAN149["from"][0].peak / GIB, peak_to=PLAN149["to"][0].peak / GIB,
                 peak_re=PLAN149["re"][0].peak / GIB,
                 opt_from=PLAN149["from"][0].optimizer_states.steady / GIB,
                 opt_to=PLAN149["to"][0].optimizer_states.steady / GIB,
                 share_to=TOK149["to"] / TOK149["from"], share_re=TOK149["re"] / TOK149["from"]),
    # ZeRO-1: every rank of dp 3 x tp 2 writes its file before the index; step 4's save is
    # the last complete one
    "q139": dict(dp=3, tp=2, steps=7, rank=1, step=5, files=6, last=4,
                 skipped="step-00000005", world=6, next=5),
    "q140": dict(dp_sim=4, per_gpu_gbs=1.5, fs_tbs=2.0, tp=8, pp=16, dp=128, ddp_files=1,
                 zero_files=4, ddp_writers=128, zero_writers=16384, ddp_gb=CKPT / 128 / GB,
                 zero_mb=CKPT / 16384 / 1e6, ddp_s=CKPT / (128 * 1.5e9),
                 zero_s=CKPT / 2e12),
    "q141": dict(world=2, layers=4, skipped=1, bucket=NEVER152, unit="blocks.1",
                 left=len(BUCKETS152) - NEVER152, total=len(BUCKETS152)),
    "q142": dict(world=8, slowdown=1.25, tflop=0.5, grad_mib=4, dp=128,
                 before_ms=(T153 + AR153) * 1e3, after_ms=(1.25 * T153 + AR153) * 1e3,
                 slower=(1.25 * T153 + AR153) / (T153 + AR153) - 1, drain=1 / 128),
}
INHERENT = {
    "q134": [{"over_daly", "over_best"}],  # the point: Daly's interval is all but optimal
    "q139": [{"world", "files"},  # every rank writes its file
             {"step", "next"}],  # the interrupted step is trained again
    "q140": [{"dp_sim", "zero_files"},  # every ZeRO rank writes
             {"dp", "ddp_writers"}],  # Llama 3's own layout: tp x pp = dp = 128
}


# ---- the part's shape ----------------------------------------------------------------------
def test_twelve_questions_on_lesson_13_numbered_after_lesson_12():
    before = max(int(q.id[1:]) for q in bank.QUESTIONS if q.lesson < "13")
    assert [q.id for q in LESSON13] == [f"q{i}" for i in range(before + 1, before + 13)]
    assert bank.LESSONS["13"] == "Checkpoints, faults and hangs"
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


# ---- what the answers claim, beyond the numbers ---------------------------------------------
def test_the_llama_shape_is_the_planners():
    assert MODELS["llama3-405b"].parameters() == PSI405


def test_daly_is_near_the_exact_optimum_and_young_is_not_when_the_save_is_slow():
    v = VALUES["q134"]
    assert abs(v["daly_min"] / v["best_min"] - 1) < 0.01 < v["young_min"] / v["best_min"] - 1
    assert v["over_best"] <= v["over_daly"] < v["over_young"]
    assert v["first_order"] < v["over_best"]  # the first-order formula is optimistic


def test_the_smaller_dp_fits_and_the_replanned_layout_needs_more_memory():
    v = VALUES["q138"]
    assert all(mem.fits for mem, _ in PLAN149.values())
    assert v["opt_to"] == pytest.approx(v["opt_from"] * 12 / 11, rel=1e-3)  # ZeRO-1 over dp
    assert v["peak_re"] > v["peak_to"] + 10 and v["share_to"] < v["share_re"] < 1


def test_the_straggler_costs_more_than_a_replica():
    v = VALUES["q142"]
    assert v["slower"] > 20 * v["drain"]
