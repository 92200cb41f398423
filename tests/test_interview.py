"""The interview bank (lessons/interview/bank.py): its shape, and every number it shows.

Each number an answer shows is checked against arithmetic written out here, independently
of the minipar function the bank calls: the formula, with the example's numbers in it.
Measured values (runs on simulated devices) are checked against the count the theory
predicts, or, for floating-point errors, against a bound.
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BANK_PATH = ROOT / "lessons" / "interview" / "bank.py"


_spec = importlib.util.spec_from_file_location(  # the shared checks, loaded by path
    "interview_checks", Path(__file__).resolve().parent / "interview_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
bank = checks.load(BANK_PATH, "interview_bank")
BY_ID = {q.id: q for q in bank.QUESTIONS}
VALUES = checks.LazyValues(BY_ID)
# lessons 00-10's questions; those of lessons 11, 12 and 13 (bank_11.py ...) and the open
# design and debugging ones (bank_design.py) have their numbers checked in
# tests/test_interview_11.py ... and tests/test_interview_design.py
LESSON_IDS = sorted(q.id for q in bank.QUESTIONS if q.lesson <= "10")

# ---- the hardware, as the presets define it (bytes/s, seconds) ---------------------------
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU
PEAK = 989e12  # H100 bf16 dense
MIB, KIB = 2**20, 2**10


def ring_ar(S, n, B, a):
    """2(n-1)a + 2(n-1)/n S/B."""
    return 2 * (n - 1) * a + 2 * (n - 1) / n * S / B


def ring_half(S, n, B, a):
    """(n-1)a + (n-1)/n S/B: a ring reduce-scatter or all-gather."""
    return (n - 1) * a + (n - 1) / n * S / B


def hier_ar(S, k, m):
    """Reduce-scatter in the node, all-reduce of S/m across k nodes, all-gather in the node."""
    return 2 * ring_half(S, m, NV_B, NV_A) + ring_ar(S / m, k, IB_B, IB_A)


def flops(B, s, l, h, V):
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def small(bound):
    return lambda v: 0 <= v < bound


# 13B-class layer of lessons 00 and 04
S_, B_, H_, A_ = 3000, 5, 5120, 40
SBH = S_ * B_ * H_
ATT = 5 * A_ * S_ / H_  # 5as/h = 117.1875
# 2.7B DDP job of lesson 02: 3 nodes of 4 GPUs, bf16 gradients
G27 = 2 * 2.7e9
RING_27 = ring_ar(G27, 12, IB_B, IB_A)
HIER_27 = hier_ar(G27, 3, 4)
F_27 = flops(5, 2048, 32, 2560, 50304)
# the tiny GPT of the ZeRO runs (V 18, s 6, h 12, 3 layers) on 5 ranks
ROOT_T, BLOCK_T = 18 * 12 + 6 * 12 + 2 * 12 + 18 * 12, 12 * 12**2 + 13 * 12
PSI_T = ROOT_T + 3 * BLOCK_T
PAD5 = lambda x: x + (-x) % 5
PSI_T5 = PAD5(ROOT_T) + 3 * PAD5(BLOCK_T)
# one block of h = 5120
BLOCK_5120 = 12 * 5120**2 + 13 * 5120
# tensor-parallel all-reduce of [s, b, h] in bf16 on t = 4
S_TP = SBH * 2
LAYER_4 = 72 * B_ * S_ * H_**2 * (1 + S_ / (6 * H_)) / 4 / PEAK
AR_IN4 = ring_ar(S_TP, 4, NV_B, NV_A)
AR_ACROSS4 = ring_ar(S_TP, 4, IB_B, IB_A)
# incident A at scale: TP = 8 in a node, TP = 16 as 4 GPUs on each of 4 nodes
LAYER_8, LAYER_16 = LAYER_4 * 4 / 8, LAYER_4 * 4 / 16
AR_8 = ring_ar(S_TP, 8, NV_B, NV_A)
AR_16H = hier_ar(S_TP, 4, 4)
AR_16R = ring_ar(S_TP, 16, IB_B, IB_A)
# the tiny tensor-parallel GPT (s 12, b 2, h 16, bf16) on 4 ranks
S_TINY_TP = 12 * 2 * 16 * 2
# lesson 05: stages of t_F = 5, t_B = 11 ms; the 48-layer model (s 2048, b 2, h 6144) with
# the attention core recomputed, 34 sbh bytes a layer; p = 6 stages of 8 layers, m = 10
T_FB = 5 + 11
SBH_PP = 2048 * 2 * 6144
A_SEL = 34 * SBH_PP
STAGE_8 = 8 * A_SEL
PP_GIVEN = dict(s=2048, b=2, h=6144, a=64, layers=48)
FIRST_1F1B = ", ".join(str(min(6 - r, 10)) for r in range(6))  # min(p - r, m)
# one stage boundary's bf16 [s, b, h] message, and a stage of 16 layers at the bf16 peak
S_PP = SBH_PP * 2
C_IB = IB_A + S_PP / IB_B
STAGE_16 = 72 * 2 * 2048 * 16 * 6144**2 * (1 + 2048 / (6 * 6144)) / PEAK
# a layer's and the logit layer's forward + backward (6 b s h V), V = 128256
T_LAYER = 72 * 2 * 2048 * 6144**2 * (1 + 2048 / (6 * 6144)) / PEAK
T_HEAD = 6 * 2 * 2048 * 6144 * 128256 / PEAK

# lesson 06: a layer of that model split into F, I and W at the bf16 peak
T_F6 = (24 * 6144 + 4 * 2048) * 2 * 2048 * 6144 / PEAK
T_I6 = (24 * 6144 + 8 * 2048) * 2 * 2048 * 6144 / PEAK
T_W6 = 24 * 2 * 2048 * 6144**2 / PEAK
BLOCK_6144 = 12 * 6144**2 + 13 * 6144
ZB_T = 10 * 16 + 5 * (5 + 11 - 8)  # ZB-H1's step at p = 6, m = 10, t_F 5, t_I 7, t_W 4


def dv_pairs(p, m, r):
    """DualPipeV's overlapped pairs on rank r: 2(m - 2p + r + 1) in its steady step (the
    last rank's first unpaired), p - r - 1 after it."""
    return 2 * (m - 2 * p + r + 1) - (r == p - 1) + (p - r - 1)


# DualPipeV at pp = 16, m = 40 with the all-to-all of q51: rank 0's compute, the bubble
DV_BUSY0 = dv_pairs(16, 40, 0) * 9 + (80 - dv_pairs(16, 40, 0)) * (6 + 9)
DV_BUBBLE = 15 * (9 + 9 - 3 * 2.5)


def dv_bubble(p, m, t=2):
    """DualPipeV at F = I = W = t, B = F&B = 2t: idle (p - 1)(F&B + B - 3W) less
    (p - 2 - r)(F + B - F&B) on rank r; busy 2m(F + B) less each pair's F + B - F&B."""
    idle = [(p - 1) * t - max(0, p - 2 - r) * t for r in range(p)]
    busy = [2 * m * 3 * t - dv_pairs(p, m, r) * t for r in range(p)]
    if len({i + b for i, b in zip(idle, busy)}) != 1:
        raise AssertionError("every rank's busy + idle is the one makespan")
    return sum(idle) / sum(busy)


def flow_shop(T, m):
    """GPipe with uneven stages, t_B = 2 t_F on each: sum T + (m - 1) max T."""
    return sum(T) + (m - 1) * max(T)


def even_counts(L, S):
    q, r = divmod(L, S)
    return [q + (i < r) for i in range(S)]


def balanced_head_split(L=48, p=6, m=10):
    """The last stage's count k (largest first) whose flow shop is least: (counts, step)."""
    def stage_times(c):
        return [n * T_LAYER + (T_HEAD if i == p - 1 else 0) for i, n in enumerate(c)]
    tries = [even_counts(L - k, p - 1) + [k] for k in range(L // p, 0, -1)]
    steps = [flow_shop(stage_times(c), m) for c in tries]
    best = next(i for i, s in enumerate(steps) if s <= min(steps) * (1 + 1e-12))
    return tries[best], stage_times(tries[best]), steps[best]


BEST_SPLIT, BEST_T, BEST_STEP = balanced_head_split()
EVEN_T = [8 * T_LAYER] * 5 + [8 * T_LAYER + T_HEAD]


def least_m(p, r):
    """The least m with m/(m + p - 1) >= r, exactly."""
    return next(m for m in itertools.count(1) if Fraction(m, m + p - 1) >= r)

EXPECTED = {
    "q01": dict(psi_b=13, n=24, gpu_gb=80, w_pp=2, g_pp=2, o_pp=12, bytes_pp=16,
                weights_gb=13 * 2, grads_gb=13 * 2, optim_gb=13 * 12, total_gb=13 * 16,
                x_gpu=13 * 16 / 80),
    "q02": dict(psi_b=671, claimed_tb=2.7, gpu_gb=80, bytes_pp=16,
                total_tb=671e9 * 16 / 1e12, under=671e9 * 16 / 2.7e12,
                adam_tb=671e9 * 12 / 1e12, adam_share=12 / 16, wg_tb=671e9 * 4 / 1e12,
                claimed_bpp=2.7e12 / 671e9, gpus=math.ceil(671e9 * 16 / 80e9)),
    "q03": dict(s=S_, b=B_, h=H_, a=A_, layers=42, sbh_m=SBH / 1e6, linear_coeff=34,
                attn_coeff=ATT, per_layer_gb=SBH * (34 + ATT) / 1e9,
                total_gb=42 * SBH * (34 + ATT) / 1e9, attn_share=ATT / (34 + ATT)),
    "q04": dict(s=S_, b=B_, h=H_, a=A_, layers=42, vocab=50304,
                none_gb=42 * SBH * (34 + ATT) / 1e9, sel_gb=42 * 34 * SBH / 1e9,
                full_gb=42 * 2 * SBH / 1e9, layer_gb=SBH * (34 + ATT) / 1e9,
                full_peak_gb=(41 * 2 * SBH + SBH * (34 + ATT)) / 1e9,
                sel_flops_pct=100 * 42 * 2 * B_ * S_**2 * H_ / flops(B_, S_, 42, H_, 50304),
                core_flops_pct=100 * 42 * 4 * B_ * S_**2 * H_ / flops(B_, S_, 42, H_, 50304),
                paper_flops_pct=100 * (72 * B_ * S_ * 42 * H_**2 * (
                    1 + S_ / (3 * H_) + 50304 / (12 * 42 * H_))
                    / flops(B_, S_, 42, H_, 50304) - 1),
                gpt3_pct=100 * (2048 / (6 * 12288)) / (
                    1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288)),
                full_flops_pct=100 * (96 * B_ * S_ * 42 * H_**2 * (
                    1 + S_ / (6 * H_) + 50304 / (16 * 42 * H_)) / flops(B_, S_, 42, H_, 50304)
                    - 1)),
    "q05": dict(psi_b=7.5, n=64, ddp_gb=7.5 * 16, z1_gb=7.5 * 4 + 7.5 * 12 / 64,
                z2_gb=7.5 * 2 + 7.5 * 14 / 64, z3_gb=7.5 * 16 / 64,
                labels="120GB, 31.4GB, 16.6GB, 1.9GB", z3_label="1.9GB"),
    "q06": dict(psi_b=13, gpu_gb=80, ddp_gb=208, ddp_min="never",
                z1_min=math.ceil(13 * 12 / (80 - 13 * 4)),
                z2_min=math.ceil(13 * 14 / (80 - 13 * 2)), z3_min=math.ceil(13 * 16 / 80),
                z1_floor_gb=13 * 4, z1_at_min_gb=13 * 4 + 13 * 12 / 6,
                z3_at_min_gb=13 * 16 / 3, z1_left_gb=80 - (52 + 26), z3_left_gb=80 - 208 / 3),
    "q07": dict(psi_b=13, s=S_, b=B_, h=H_, a=A_, layers=42,
                wrong_pb=2 * S_ * 42 * 13e9 / 1e15, real_gb=42 * SBH * (34 + ATT) / 1e9,
                factor=2 * S_ * 42 * 13e9 / (42 * SBH * (34 + ATT))),
    "q08": dict(x0=[3, 1, 4, 1, 5, 9], x1=[2, 7, 1, 8, 2, 8], x2=[5, 0, 9, 3, 6, 1],
                ar=[3 + 2 + 5, 1 + 7 + 0, 4 + 1 + 9, 1 + 8 + 3, 5 + 2 + 6, 9 + 8 + 1],
                rs0=[10, 8], rs1=[14, 12], rs2=[13, 18], ag=[10, 8, 14, 12, 13, 18]),
    "q09": dict(s_mib=96, n=6, sim_kib=36, sent_mib=2 * 5 / 6 * 96,
                sent_bytes=160 * MIB, all_ranks_mib=6 * 160, naive_mib=5 * 96, ratio=10 / 6,
                ratio_1024=2 * 1023 / 1024, sim_sent_kib=2 * 5 / 6 * 36),
    "q10": dict(s_mib=96, n=6, sim_kib=36, steps=2 * 5, chunk_mib=96 / 6,
                rs_mib=5 / 6 * 96, ag_mib=5 / 6 * 96, ar_mib=2 * 5 / 6 * 96,
                sim_rs_kib=5 / 6 * 36, sim_ag_kib=5 / 6 * 36, sim_ar_kib=2 * 5 / 6 * 36,
                max_diff=0.0),
    "q11": dict(s_mib=96, n=7, nv_gbps=450, nv_alpha_us=1, ib_gbps=50, ib_alpha_us=5,
                nv_lat_us=12, nv_us=ring_ar(96 * MIB, 7, NV_B, NV_A) * 1e6,
                ib_lat_us=60, ib_us=ring_ar(96 * MIB, 7, IB_B, IB_A) * 1e6,
                ratio=ring_ar(96 * MIB, 7, IB_B, IB_A) / ring_ar(96 * MIB, 7, NV_B, NV_A)),
    "q12": dict(s_mib=96, n=7, nv_algbw=96 * MIB / ring_ar(96 * MIB, 7, NV_B, NV_A) / 1e9,
                nv_busbw=96 * MIB / ring_ar(96 * MIB, 7, NV_B, NV_A) / 1e9 * 12 / 7,
                ib_algbw=96 * MIB / ring_ar(96 * MIB, 7, IB_B, IB_A) / 1e9,
                ib_busbw=96 * MIB / ring_ar(96 * MIB, 7, IB_B, IB_A) / 1e9 * 12 / 7,
                factor=12 / 7, nv_gbps=450, ib_gbps=50),
    "q13": dict(n=6, small_kib=24, nv_cross_mb=6 * NV_A * NV_B / 1e6,
                ib_cross_mb=6 * IB_A * IB_B / 1e6,
                small_us=ring_ar(24 * KIB, 6, NV_B, NV_A) * 1e6,
                small_lat_share=10e-6 / ring_ar(24 * KIB, 6, NV_B, NV_A)),
    "q14": dict(psi_b=2.7, nodes=3, per_node=4, n=12, grad_gb=5.4, sent_gb=2 * 11 / 12 * 5.4,
                ring_ms=RING_27 * 1e3, ring_link="IB-NDR400", hier_ms=HIER_27 * 1e3,
                speedup=RING_27 / HIER_27, ib_gb=2 * 2 / 3 * 5.4 / 4),
    "q15": dict(psi_b=2.7, nodes=3, per_node=4, bucket_mib=25, h=2560,
                n_buckets=math.ceil(G27 / (25 * MIB)), last_mb=(G27 - 205 * 25 * MIB) / 1e6,
                whole_ms=HIER_27 * 1e3,
                buckets_ms=(HIER_27 + 205 * hier_ar(0, 3, 4)) * 1e3,
                extra_ms=205 * (3e-6 + 20e-6 + 3e-6) * 1e3, ln_bytes=2560 * 2,
                ln_us=hier_ar(5120, 3, 4) * 1e6, ln_lat_share=26e-6 / hier_ar(5120, 3, 4)),
    "q16": dict(psi_b=2.7, nodes=3, per_node=4, b=5, s=2048, h=2560, layers=32, vocab=50304,
                tflop=F_27 / 1e12, peak_tflops=989, step_ms=F_27 / PEAK * 1e3,
                backward_ms=2 / 3 * F_27 / PEAK * 1e3, ring_ms=RING_27 * 1e3,
                hier_ms=HIER_27 * 1e3, exposed_ms=(RING_27 - 2 / 3 * F_27 / PEAK) * 1e3,
                slack_ms=(2 / 3 * F_27 / PEAK - HIER_27) * 1e3),
    "q17": dict(k=3, micro=2, batch=6, err_scaled=small(1e-12),
                ratio_unscaled=lambda v: abs(v - 3) < 1e-12),
    "q18": dict(psi_b=2.7, n=12, k=3, sim_ranks=4, sim_k=5, with_gb=2 * 11 / 12 * 5.4,
                without_gb=3 * 2 * 11 / 12 * 5.4, saved_gb=2 * 2 * 11 / 12 * 5.4,
                sim_with_ar=1, sim_without_ar=5, sim_ratio=5.0),
    "q19": dict(psi_b=6.7, n=18, params_gb=6.7 * 2, grads_gb=6.7 * 2 / 18,
                optim_gb=6.7 * 12 / 18, z2_gb=6.7 * 2 + 6.7 * 14 / 18, ddp_gb=6.7 * 16,
                z1_gb=6.7 * 4 + 6.7 * 12 / 18, z3_gb=6.7 * 16 / 18,
                w_share=6.7 * 2 / (6.7 * 2 + 6.7 * 14 / 18)),
    # which collective each stage runs: one per unit (root + 3 blocks), ZeRO-3 gathering
    # every unit in forward and every unit but the root again in backward
    "q20": dict(sim_ranks=5, units=1 + 3, blocks=3, ddp_ar=1, ddp_fwd=0, z1_rs=4, z1_ag=4,
                z2_rs=4, z2_ag=4, z3_ag_fwd=4, z3_ag_bwd=3, z3_rs=4),
    "q21": dict(psi_b=13, n=24, sim_ranks=5, ddp_gb=2 * 13 * 23 / 24 * 2,
                z12_gb=2 * 13 * 23 / 24 * 2, z3_gb=3 * 13 * 23 / 24 * 2, ratio=1.5,
                sim_ddp=2 * 4 * PSI_T * 2 // 5, sim_z12=2 * 4 * PSI_T5 * 2 // 5,
                sim_z3=(3 * PSI_T5 - PAD5(ROOT_T)) * 4 * 2 // 5,
                sim_ratio=(3 * PSI_T5 - PAD5(ROOT_T)) / (2 * PSI_T)),
    "q22": dict(h=5120, layers=42, n=24, tiny_n=2, block=BLOCK_5120,
                pad=(24 - BLOCK_5120 % 24) % 24, extra_bytes=16 * 16 / 24 * 42,
                share=16 / BLOCK_5120, tiny_z1=2 * 2 + 2 * 2 + 12 * 2 // 2, tiny_extra=20 - 16),
    "q23": dict(psi_b=13, nodes=3, per_node=8, n=24, full_gb=13 * 16 / 24,
                grad_op_gb=26 + 13 * 14 / 24, no_shard_gb=208, hybrid_gb=13 * 16 / 8,
                hybrid_ib_gb=2 * 2 / 3 * 26 / 8, full_ib_gb=3 * 2 / 3 * 26 / 8),
    "q24": dict(psi_b=13, n=24, s=S_, b=B_, h=H_, a=A_, layers=42, sim_layers=8, sim_dp=4,
                z2_gb=26 + 13 * 14 / 24, z3_gb=13 * 16 / 24, runahead_gb=26 + 13 * 16 / 24,
                limit_gb=13 * 16 / 24 + 2 * 2 * BLOCK_5120 / 1e9, excess_gb=2 * 13 / 24,
                # measured: run-ahead above ZeRO-2, by at most (2/N)/(2 + 14/N) of the
                # model states (minipar/programs/incidents/zero3_recompute.py); the
                # limit below it, and with segments of 2 too
                sim_z3_pct=lambda v: 0 < v < 100 * (2 / 4) / (2 + 14 / 4),
                sim_limit_pct=lambda v: 0 < v < 100, sim_both_pct=lambda v: 0 < v < 100,
                # segments of 2 on the incident's 8 layers (s 16, b 1, h 64: I = 2sbh,
                # A = 17 I): (8/2 - 1) I + 2A - ((8 - 1) I + A) = A - 4 I
                sim_seg_extra=(17 - 4) * 2 * 16 * 64,
                # checkpoint segments of 2 on the 42 layers: 21 inputs of 2sbh fewer, one
                # layer more rerun; without the scores A = 34 sbh, with them sbh(34 + 5as/h)
                half_gb=21 * 2 * SBH / 1e9, rerun_gb=34 * SBH / 1e9,
                per_flash_gb=(41 * 2 + 34) * SBH / 1e9, seg_flash_gb=(20 * 2 + 2 * 34) * SBH / 1e9,
                per_scores_gb=(41 * 2 + 34 + ATT) * SBH / 1e9,
                seg_scores_gb=(20 * 2 + 2 * (34 + ATT)) * SBH / 1e9,
                thr_flash=34, thr_scores=34 + ATT),
    "q25": dict(s=S_, b=B_, h=H_, t=4, layers=42, sim_t=4, ar_mb=S_TP / 1e6,
                sent_mb=2 * 3 / 4 * S_TP / 1e6, layer_mb=4 * 2 * 3 / 4 * S_TP / 1e6,
                model_gb=42 * 4 * 2 * 3 / 4 * S_TP / 1e9, sim_layers=3,
                sim_fwd=2 * 3 + 1, sim_bwd=2 * 3 + 1, fwd_per_layer=2, bwd_per_layer=2),
    "q26": dict(s=S_, b=B_, h=H_, t=4, ar_us=AR_IN4 * 1e6, comm_ms=4 * AR_IN4 * 1e3,
                compute_ms=LAYER_4 * 1e3, share=4 * AR_IN4 / LAYER_4),
    "q27": dict(s=S_, b=B_, h=H_, t=4, in_us=AR_IN4 * 1e6, across_us=AR_ACROSS4 * 1e6,
                across_algorithm="ring", ratio=AR_ACROSS4 / AR_IN4,
                across_layer_ms=4 * AR_ACROSS4 * 1e3, compute_ms=LAYER_4 * 1e3,
                busy_in=LAYER_4 / (LAYER_4 + 4 * AR_IN4),
                busy_across=LAYER_4 / (LAYER_4 + 4 * AR_ACROSS4)),
    "q28": dict(s=S_, b=B_, h=H_, layers=42, in_tp=8,
                in_label="TP=8 in one node", in_ar_us=AR_8 * 1e6,
                in_busy=LAYER_8 / (LAYER_8 + 4 * AR_8), in_step_ms=42 * 4 * AR_8 * 1e3,
                hier_label="TP=16 over 4 nodes, hierarchical", hier_ar_us=AR_16H * 1e6,
                hier_busy=LAYER_16 / (LAYER_16 + 4 * AR_16H),
                hier_step_ms=42 * 4 * AR_16H * 1e3,
                ring_label="TP=16 over 4 nodes, flat ring", ring_ar_us=AR_16R * 1e6,
                ring_busy=LAYER_16 / (LAYER_16 + 4 * AR_16R),
                ring_step_ms=42 * 4 * AR_16R * 1e3),
    "q29": dict(s=S_, b=B_, h=H_, a=A_, t=4, one_gb=SBH * (34 + ATT) / 1e9,
                tp_gb=SBH * (10 + 24 / 4 + ATT / 4) / 1e9, sp_gb=SBH * (34 / 4 + ATT / 4) / 1e9,
                tp_saving=(34 + ATT) / (10 + 24 / 4 + ATT / 4), sp_saving=4,
                sp_saved_mb=SBH * (10 - 10 / 4) / 1e6, between_mb=10 * SBH / 1e6),
    "q30": dict(s=S_, b=B_, vocab=50304, t=4, sim_t=4, full_gb=S_ * B_ * 50304 * 4 / 1e9,
                shard_gb=S_ * B_ * 50304 / 4 * 4 / 1e9, ce_kb=3 * S_ * B_ * 4 / 1e3,
                sim_ce=3, sim_ce_bwd=0),
    # the LayerNorm-gradient bug: loss and the other gradients exact; the 14 gradients of
    # replicated parameters (per layer: ln1 and ln2 weight and bias, the attention
    # projection and fc2 biases; plus ln_f's two) badly wrong without the all-reduce
    "q31": dict(sim_t=4, tagged=6 * 2 + 2, others=(2 + 12 * 2 + 3) - (6 * 2 + 2),
                loss_err=small(1e-12), others_max=small(1e-12), with_max=small(1e-12),
                without_min=lambda v: v > 0.2, without_max=lambda v: v > 0.2,
                replica_gap=lambda v: v > 0.05, partial_sum_err=small(1e-12)),
    "q32": dict(s=S_, b=B_, h=H_, t=4, sim_t=4, tp_fwd_mb=2 * 1.5 * S_TP / 1e6,
                sp_fwd_mb=4 * 0.75 * S_TP / 1e6, tp_bwd_mb=2 * 1.5 * S_TP / 1e6,
                sp_bwd_mb=6 * 0.75 * S_TP / 1e6, ln_kb=1.5 * 6 * H_ * 2 / 1e3,
                sim_tp_fwd=2 * 3 * S_TINY_TP // 2, sim_sp_fwd=4 * 3 * S_TINY_TP // 4,
                sim_tp_bwd=2 * 3 * S_TINY_TP // 2,
                sim_sp_bwd=6 * 3 * S_TINY_TP // 4 + 3 * (6 * 16 * 2) // 2),
    # -- lesson 05 --
    "q33": dict(p=6, m=10, t_f_ms=5, t_b_ms=11, rule=4, step_ms=(10 + 6 - 1) * T_FB,
                busy_ms=10 * T_FB, idle_ms=(6 - 1) * T_FB, over_ideal=5 / 10,
                over_total=5 / (10 + 5), m_rule=4 * 6, rule_share=5 / (24 + 5)),
    "q34": dict(p=6, m=10, t_f_ms=5, t_b_ms=11, **PP_GIVEN, gpipe_ms=15 * T_FB,
                f1b_ms=15 * T_FB, layer_mb=A_SEL / 1e6, per_stage=48 // 6,
                stage_gb=STAGE_8 / 1e9, gpipe_peak=10, gpipe_gb=10 * STAGE_8 / 1e9,
                f1b_peaks=FIRST_1F1B, f1b_first_gb=6 * STAGE_8 / 1e9),
    # torch's list is Megatron's; the literal reading holds min(p - r + 1, m)
    "q35": dict(p=6, m=10, t_f_ms=5, t_b_ms=11, **PP_GIVEN, first_f=min(10, 6),
                literal_first_f=min(10, 6 + 1), peaks=FIRST_1F1B,
                literal_peaks=", ".join(str(min(6 - r + 1, 10)) for r in range(6)),
                extra_gb=STAGE_8 / 1e9, ranks_more=sum(10 > 6 - r for r in range(6)),
                mine_ms=15 * T_FB, literal_ms=15 * T_FB),
    # 2(S - 1)m messages for S stages; rank 0 holds 2(p - 1) + (v - 1)p + 1 chunk pairs
    "q36": dict(p=6, m_bad=10, m=12, v=2, t_f_ms=5, t_b_ms=11, fix="6 or 12",
                f1b_ms=(12 + 5) * T_FB, inter_ms=(12 + 5 / 2) * T_FB, f1b_bubble=5 / 12,
                inter_bubble=5 / 24, f1b_msgs=2 * 5 * 12, inter_msgs=2 * 11 * 12,
                msg_ratio=11 / 5, f1b_peak=6, inter_pairs=2 * 5 + 6 + 1,
                inter_peak=(2 * 5 + 6 + 1) / 2, mem_factor=(2 * 5 + 6 + 1) / 2 / 6),
    "q37": dict(p=64, m_seed=4, m_fix=32, mfu_seed_pct=28, mfu_fix_pct=51, mfu_stage_pct=60,
                seed_over=63 / 4, seed_share=63 / 67, seed_bound=4 / 67, fix_over=63 / 32,
                fix_share=63 / 95, fix_bound=32 / 95, implied_seed=0.28 * 67 / 4,
                implied_fix=0.51 * 95 / 32, floor_m=least_m(64, Fraction(51, 100)),
                floor_bound=66 / (66 + 63), real_m=least_m(64, Fraction(51, 60)),
                fix_peak=min(64, 32), floor_peak=min(64, 66)),
    # GPipe with a message cost c <= t_F: (m + p - 1)(t_F + t_B) + 2(p - 1)c
    "q38": dict(s=2048, b=2, h=6144, layers=48, p=3, m=10, t=8, msg_mb=S_PP / 1e6,
                ib_ms=C_IB * 1e3, nv_us=(NV_A + S_PP / NV_B) * 1e6, per_stage=16,
                compute_ms=STAGE_16 * 1e3, pp_share=2 * C_IB / STAGE_16,
                step0_ms=12 * STAGE_16 * 1e3, step_ms=(12 * STAGE_16 + 2 * 2 * C_IB) * 1e3,
                extra_ms=2 * 2 * C_IB * 1e3, ars=4 * 16, tp_gb=64 * 2 * 7 / 8 * S_PP / 1e9,
                tp_ratio=64 * 2 * 7 / 8 / 2, tp_nv_ms=64 * ring_ar(S_PP, 8, NV_B, NV_A) * 1e3,
                tp_ib_ms=64 * ring_ar(S_PP, 8, IB_B, IB_A) * 1e3,
                tp_compute_ms=STAGE_16 / 8 * 1e3),
    "q39": dict(s=2048, b=2, h=6144, layers=48, vocab=128256, p=6, m=10,
                layer_ms=T_LAYER * 1e3, head_ms=T_HEAD * 1e3, head_layers=T_HEAD / T_LAYER,
                even="8, 8, 8, 8, 8, 8", even_last_ms=EVEN_T[-1] * 1e3,
                even_other_ms=EVEN_T[0] * 1e3, even_step_ms=flow_shop(EVEN_T, 10) * 1e3,
                best=", ".join(map(str, BEST_SPLIT)), best_max_ms=max(BEST_T) * 1e3,
                best_step_ms=BEST_STEP * 1e3, speedup=flow_shop(EVEN_T, 10) / BEST_STEP),
    # m = B/(dp b); 1F1B's rank 0 holds p micro-batches, GPipe's all B/dp sequences
    "q40": dict(global_batch=960, dp=8, b=2, b_small=1, p=6, s=2048, h=6144, a=64, layers=48,
                m1=960 // (8 * 2), m2=960 // 8, over1=5 / 60, over2=5 / 120,
                share1=5 / 65, share2=5 / 125, f1b_gb1=6 * STAGE_8 / 1e9,
                f1b_gb2=6 * STAGE_8 / 2 / 1e9, gpipe_gb=60 * STAGE_8 / 1e9,
                msgs1=2 * 5 * 60, msgs2=2 * 5 * 120),
    # blocking rendezvous sends: rank r < p - 1 stuck sending micro-batch p - r - 1's
    # activations, the last rank sending micro-batch 0's gradient
    "q41": dict(p=3, m=4, t_f_ms=5, t_b_ms=11,
                stuck="rank 0 at 0SEND_F2; rank 1 at 1SEND_F1; rank 2 at 2SEND_B0",
                eager_ms=(4 + 3 - 1) * T_FB, isend_ms=(4 + 3 - 1) * T_FB),
    "q42": dict(vocab=51200, h=6144, p=6, sim_p=4, params_m=51200 * 6144 / 1e6,
                grad_gb=51200 * 6144 * 4 / 1e9,
                ar_ms=(2 * IB_A + 51200 * 6144 * 4 / IB_B) * 1e3, algorithm="ring",
                copy_gb=51200 * 6144 * 16 / 1e9, sim_counts="1, 0, 0, 1",
                sim_bytes=19 * 8 * 8),
    "q43": dict(p=6, ms=(6, 12, 24, 48),
                gpipe_bubbles=", ".join(f"{100 * 5 / m:.1f}%" for m in (6, 12, 24, 48)),
                f1b_bubbles=", ".join(f"{100 * 5 / m:.1f}%" for m in (6, 12, 24, 48)),
                gpipe_peaks="6, 12, 24, 48", f1b_peaks="6, 6, 6, 6", f1b_last="1, 1, 1, 1"),
    # rank 0: min(p, m) micro-batches of L/p layers = L layers; interleaved
    # (2(p - 1) + (v - 1)p + 1) chunk pairs of L/(pv) layers = L(1 + (p - 1)/(pv))
    "q44": dict(**PP_GIVEN, m=10, ps=(2, 3, 4, 6), p_inter=6, m_inter=12, v1=4, v2=8,
                first="2, 3, 4, 6", per_stage="24, 16, 12, 8", r0_gb=48 * A_SEL / 1e9,
                whole_gb=48 * A_SEL / 1e9, inter1_gb=(1 + 5 / 24) * 48 * A_SEL / 1e9,
                inter2_gb=(1 + 5 / 48) * 48 * A_SEL / 1e9, factor1=1 + 5 / 24,
                factor2=1 + 5 / 48, last_gb=STAGE_8 / 1e9),
    # -- lesson 06 --
    # a block's F, I, W: (24h + 4s)bsh, (24h + 8s)bsh, 24bsh^2 (Qi et al. 2023, Table 1)
    # W's records: x and dy of qkv, proj, fc1, fc2 (16sbh) and the LayerNorms' [h] pairs
    "q45": dict(s=2048, b=2, h=6144, a=64, sim_s=7, sim_b=3, sim_h=10, rec_tok=16,
                w_mb=2 * (16 * SBH_PP + 4 * 6144) / 1e6, f_mb=A_SEL / 1e6, lin=24, core_f=4,
                core_i=8, core_w=0, fc1_gflop=8 * 2 * 2048 * 6144**2 / 1e9,
                t_f_ms=T_F6 * 1e3, t_i_ms=T_I6 * 1e3, t_w_ms=T_W6 * 1e3,
                w_share=24 * 6144 / (48 * 6144 + 8 * 2048)),
    # 1F1B (p - 1)(t_F + t_B), ZB-H1 (p - 1)(t_F + t_B - 2t_W); steps m(t_F + t_B) + idle
    "q46": dict(p=6, m=10, t_ms=3, t_f_ms=5, t_i_ms=7, t_w_ms=4, eq_f1b_idle=5 * 9,
                eq_f1b_ms=10 * 9 + 5 * 9, eq_zb_idle=5 * 3, eq_zb_ms=10 * 9 + 5 * 3,
                eq_ratio=1 / 3, t_b_ms=11, f1b_idle=5 * 16, zb_idle=5 * (5 + 11 - 8),
                ratio=(5 + 11 - 8) / 16, f1b_peaks="6, 5, 4, 3, 2, 1",
                zb_peaks="6, 6, 6, 6, 6, 6"),
    # t_W > t_F: the formula undercounts; the clock idles (p - 1) t_F here
    "q47": dict(p=6, m=12, t_f_ms=5, t_i_ms=4, t_w_ms=7, s=2048, h=6144, t_b_ms=11,
                formula_ms=5 * (5 + 11 - 14), clock_ms=5 * 5, f1b_ms=5 * 16,
                block_ratio=24 * 6144 / (24 * 6144 + 4 * 2048)),
    # ZB-H2 at equal t: period 3mt, flushed 3mt + (p - 1)t, 2p - 1 in flight
    "q48": dict(p=6, m=12, t_ms=9, t_f_ms=5, t_i_ms=7, t_w_ms=4, **PP_GIVEN, h2_idle=5 * 9,
                h2_ms=3 * 12 * 9 + 5 * 9, h2_period=3 * 12 * 9, h2_steady=0.0,
                h1_steady=5 / (3 * 12), h1_peak=6, h2_peak=11, per_stage=8,
                stage_gb=STAGE_8 / 1e9, h1_gb=6 * STAGE_8 / 1e9, h2_gb=11 * STAGE_8 / 1e9,
                mem_ratio=11 / 6, h1_uneven=5 * (5 + 11 - 8) / (12 * 16),
                h2_uneven=lambda v: 0 < v < 5 * (5 + 11 - 8) / (12 * 16)),
    # ZB-V: 2p stages of L/(2p) layers; (p - 1)t against 1F1B's (p - 1)6t; 4m(p - 1) sends
    "q49": dict(p=6, m=14, t_ms=3, layers=48, rank0="0 and 11", last="5 and 6",
                chunk_layers=4, v_idle=5 * 3, f1b_idle=5 * 18, v_ratio=1 / 6, v_steady=0.0,
                v_chunks=12, v_worth=6, f1b_peak=6, v_sends=4 * 14 * 5, f1b_sends=2 * 14 * 5,
                send_ratio=2.0),
    # DualPipe's README: (PP/2 - 1)(F&B + B - 3W), less by (p - 2 - r)(F + B - F&B) on
    # rank r < p - 2; PP + 1 activations; two stages of L/PP layers a device
    "q50": dict(p=4, m=10, t_ms=3, fb_ms=7, **PP_GIVEN, pp_stages=8,
                formula_ms=3 * (7 + 6 - 9), dv_worst=12, dv_idles=", ".join(
                    str(12 - max(0, 4 - 2 - r) * (3 + 6 - 7)) for r in range(4)),
                f1b_idle=7 * 9, zb_idle=7 * 3, dv_peak=9, f1b_peak=8, stage_layers=6,
                dv_act_gb=9 * 6 * A_SEL / 1e9, f1b_act_gb=8 * 6 * A_SEL / 1e9,
                stage_b=6 * BLOCK_6144 / 1e9, stage_gb=16 * 6 * BLOCK_6144 / 1e9,
                two_gb=2 * 16 * 6 * BLOCK_6144 / 1e9, v_total_gb=8 * 16 * 6 * BLOCK_6144 / 1e9,
                bi_total_gb=16 * 16 * 6 * BLOCK_6144 / 1e9),
    # all-to-all c = t_F (1:1) in F and in I: 1F1B (m + p - 1)(F + B), ZB-H1 m(F + I + W)
    # + (p - 1)(F + I - W); DualPipeV between rank 0's busy time and that plus the README's
    # bubble (chunks: F 6, I 6.5, W 2.5, B 9, F&B 9)
    "q51": dict(pp=16, m=40, t_f_ms=6, t_i_ms=7, t_w_ms=5, ratio=1, c_ms=6,
                f1b_ms=55 * (12 + 18), zb_ms=40 * 30 + 15 * (12 + 13 - 5), free_ms=55 * 18,
                compute_ms=40 * 18, dv_ms=lambda v: DV_BUSY0 < v <= DV_BUSY0 + DV_BUBBLE,
                speedup=lambda v: 1650 / (DV_BUSY0 + DV_BUBBLE) <= v < 1650 / DV_BUSY0,
                over_free=lambda v: DV_BUSY0 / 990 - 1 < v <= (DV_BUSY0 + DV_BUBBLE) / 990 - 1,
                pairs_first=dv_pairs(16, 40, 0), pairs_last=dv_pairs(16, 40, 15), forwards=80),
    # flushed 3mt + (p - 1)t against the period 3mt (ZB-V: (p - 1)t/2 per chunk)
    "q52": dict(p=8, m=24, t_ms=4, h2_ms=3 * 24 * 4 + 7 * 4, h2_period=3 * 24 * 4,
                h2_cost=7 / (3 * 24), h1_bubble=7 / (3 * 24), v_ms=3 * 24 * 4 + 7 * 2,
                v_period=3 * 24 * 4, v_cost=7 / (2 * 3 * 24), dv_bubble=dv_bubble(8, 24)),
    # ZB-H1's calls on rank r: r I's, then (I, W) pairs; its last I ends r t_I before rank
    # 0's, then r + 1 W's follow; DDP's one flat all-reduce (q20), after the W's
    # the trap: two replicas' local gradients, tens of percent apart
    "q53": dict(p=6, m=10, t_f_ms=5, t_i_ms=7, t_w_ms=4, sim_dp=2, sim_during_i=0,
                sim_after_i=1, calls=20, sim_err=lambda v: v > 0.1, sim_gap=lambda v: v > 0.1,
                missing_at_m=", ".join(str(10 - (10 - r) // 2) for r in range(6)),
                after_last_i=", ".join(str(r + 1) for r in range(6)),
                last_i=", ".join(str(ZB_T - 4 - 7 * r) for r in range(6)),
                last_w=", ".join(str(ZB_T - 4 - 7 * r + 4 * (r + 1)) for r in range(6))),
}

# numbers an answer may show twice because they are equal by construction
INHERENT = {
    "q01": [{"w_pp", "g_pp"}, {"weights_gb", "grads_gb"}],  # bf16 weight and gradient
    "q10": [{"rs_mib", "ag_mib"}, {"sim_rs_kib", "sim_ag_kib"}],  # the two halves
    "q18": [{"sim_k", "sim_without_ar", "sim_ratio"}],  # one all-reduce a micro-batch
    "q20": [{"units", "z1_rs", "z1_ag", "z2_rs", "z2_ag", "z3_ag_fwd", "z3_rs"},
            {"blocks", "z3_ag_bwd"}],  # one collective per unit
    "q21": [{"ddp_gb", "z12_gb"}],  # the point: ZeRO-1/2 cost what DDP costs
    "q25": [{"t", "sim_t"}, {"fwd_per_layer", "bwd_per_layer"}, {"sim_fwd", "sim_bwd"}],
    "q30": [{"t", "sim_t"}],
    "q32": [{"t", "sim_t"}, {"tp_fwd_mb", "sp_fwd_mb", "tp_bwd_mb"},
            {"sim_tp_fwd", "sim_sp_fwd", "sim_tp_bwd"}],
    "q34": [{"gpipe_ms", "f1b_ms"}, {"m", "gpipe_peak"}],  # the same clock; GPipe holds m
    "q35": [{"mine_ms", "literal_ms"}, {"p", "first_f", "ranks_more"}],  # min(m, p) on rank 0
    "q36": [{"p", "f1b_peak"}],  # 1F1B: min(p, m) = p on rank 0
    "q37": [{"m_fix", "fix_peak"}, {"p", "floor_peak"}],  # min(p, m)
    "q41": [{"eager_ms", "isend_ms"}],  # the send mode does not change the clock
    "q44": [{"r0_gb", "whole_gb"}],  # the point: one micro-batch through all L layers
    "q48": [{"p", "h1_peak"}],  # ZB-H1 holds p on every rank
    "q49": [{"p", "v_worth", "f1b_peak"}],  # ZB-V's 2p chunks = p; 1F1B's rank 0
    "q50": [{"pp_stages", "f1b_peak"}, {"formula_ms", "dv_worst"}],  # PP; the README holds
    "q51": [{"t_f_ms", "c_ms"}],  # the report's 1:1
    "q52": [{"h2_cost", "h1_bubble"}, {"h2_period", "v_period"}],  # the ramp; the same work
}


# ---- lesson 07: 3-D composition and topology --------------------------------------------
def _q54(tp, dp, pp, r, g):
    t, d, p = r % tp, r // tp % dp, r // (tp * dp)
    dp_group = [r - d * tp + i * tp for i in range(dp)]
    pp_group = [r - p * tp * dp + i * tp * dp for i in range(pp)]
    text = lambda xs: ", ".join(str(x) for x in xs)
    return dict(tp=tp, dp=dp, pp=pp, rank=r, gpus_per_node=g, world=tp * dp * pp, tp_rank=t,
                dp_rank=d, pp_rank=p, tp_group=text(range(r - t, r - t + tp)),
                dp_group=text(dp_group), pp_group=text(pp_group),
                torch_shape=str((pp, dp, tp)), node=r // g,
                dp_nodes=len({x // g for x in dp_group}),
                pp_nodes=text(sorted({x // g for x in pp_group})))


# the tiny GPT of q55 (V 24, s 6, h 16, 2 layers) at dp_shard 2 x pp 2 x tp 2, m = 2, B = 8:
# b = 2 sequences a micro-batch and dp rank, float64
SIM_SBH = 6 * 2 * 16 * 8
SIM_TP = 8 * 2 * (4 * 1 + 1) * SIM_SBH + 4 * 2 * 3 * 6 * 2 * 8  # q55's tp all-reduce bytes
# a tp rank's parameters: a block 6h^2 + 3.5h (column shards) + 6h (proj and fc2 biases,
# two LayerNorms, replicated); the first stage adds wte/tp and wpe, the last ln_f and the
# head's V/tp x h; ZeRO-1's reduce-scatter and all-gather send half the buffer each
SIM_BLOCK = 6 * 16**2 + 3.5 * 16 + 6 * 16
SIM_DP = 4 * 8 * (SIM_BLOCK + 12 * 16 + 6 * 16) + 4 * 8 * (SIM_BLOCK + 2 * 16 + 12 * 16)
SIM_PP = 2 * 2 * 2 * 2 * SIM_SBH + 4 * 8  # sends, and the loss broadcast to the first stage
# the 70B-class GPT of q57 and q64 (V 32000, s 4096, h 8192, 80 layers, its own head), bf16
P70 = 2 * 32000 * 8192 + 4096 * 8192 + 80 * (12 * 8192**2 + 13 * 8192) + 2 * 8192
G70, S70 = 2 * P70 / 8, 4096 * 8192 * 2  # a GPU's gradients at tp x pp = 8; [s, 1, h]
TP70 = 12 * 40 * 4 * ring_ar(S70, 4, NV_B, NV_A)  # m = 12 micro-batches
DP70 = 2 * ring_half(G70, 2, NV_B, NV_A) + ring_ar(G70 / 2, 4, IB_B, IB_A)  # 2 ranks a node
HALF70 = ring_half(G70, 2, NV_B, NV_A) + ring_half(G70 / 2, 4, IB_B, IB_A)  # RS or AG
S56, S60 = 2048 * 2 * 6144 * 2, 2048 * 12288 * 2
C60 = 72 * 2048 * 12288**2 * (1 + 2048 / (6 * 12288)) / 8 / PEAK
J62 = 54 * 24 / 419
Y62 = math.sqrt(2 * 2 * J62 * 60)
EXPECTED.update({
    "q54": _q54(4, 9, 3, 60, 8),
    "q55": dict(batch=8, m=2, tp_nv=SIM_TP, tp_ib=0, dp_nv=int(SIM_DP), dp_ib=0,
                pp_ib=SIM_PP, pp_nv=0, share_tp=SIM_TP / (SIM_TP + SIM_DP + SIM_PP)),
    "q56": dict(h=6144, s=2048, b=2, layers=60, tp=8, gpus_per_node=8, mb=S56 / 2**20,
                in_ms=4 * 60 * ring_ar(S56, 8, NV_B, NV_A) * 1e3,
                ring_ms=4 * 60 * ring_ar(S56, 8, IB_B, IB_A) * 1e3,
                hier_ms=4 * 60 * (2 * ring_half(S56, 4, NV_B, NV_A)
                                  + ring_ar(S56 / 4, 2, IB_B, IB_A)) * 1e3,
                ring_x=ring_ar(S56, 8, IB_B, IB_A) / ring_ar(S56, 8, NV_B, NV_A),
                hier_x=(2 * ring_half(S56, 4, NV_B, NV_A) + ring_ar(S56 / 4, 2, IB_B, IB_A))
                / ring_ar(S56, 8, NV_B, NV_A)),
    "q57": dict(psi_b=70, gpus=64, gpus_per_node=8, tp=4, pp=2, dp=8, h=8192, layers=80,
                s=4096, m=12, gpu_gb=94, per_gpu_b=70 / 8, ddp_gb=16 * 70 / 8,
                z1_gb=4 * 70 / 8 + 12 * 70 / 8 / 8,
                default_s=TP70 + DP70 + 2 * 12 * (IB_A + S70 / IB_B), default_dp_s=DP70,
                outer_s=TP70 + ring_ar(G70, 8, IB_B, IB_A) + 2 * 12 * (NV_A + S70 / NV_B),
                outer_dp_s=ring_ar(G70, 8, IB_B, IB_A)),
    "q58": dict(psi_b=7, n=16, gpu_gb=80, s=3072, long_s=32768, h=4096, layers=32, heads=64,
                ddp_gb=16 * 7, z1_gb=4 * 7 + 12 * 7 / 16, z2_gb=2 * 7 + 14 * 7 / 16,
                act_gb=32 * 34 * 3072 * 4096 / 1e9, long_act_gb=32 * 34 * 32768 * 4096 / 1e9,
                pp2_bubble=1 / 8),
    "q59": dict(tp=8, pp=4, dp=12, failed=211, batch=1536, world=384, replica=211 // 8 % 12,
                replica_gpus=8 * 4, first=2 * 8, last=3 * 8 * 12 + 2 * 8 + 7,
                left=384 - 32, new_dp=11, per_replica=1536 // 12, new_per_replica=1536 / 11),
    "q60": dict(h=12288, s=2048, b=1, tp=8, gpus_per_node=8, block_ms=C60 * 1e3,
                ar_in_ms=4 * ring_ar(S60, 8, NV_B, NV_A) * 1e3,
                ar_x_ms=4 * ring_ar(S60, 8, IB_B, IB_A) * 1e3,
                share_in=4 * ring_ar(S60, 8, NV_B, NV_A) / C60,
                share_x=4 * ring_ar(S60, 8, IB_B, IB_A) / C60),
    "q61": dict(nodes=16, m=24, p1=16, p2=8, p3=4, b1=15 / 24, b2=7 / 24, b3=3 / 24),
    "q62": dict(gpus=16384, days=54, interruptions=419, big=100000, save_min=2,
                restart_min=10, job_h=J62, gpu_years=J62 * 16384 / (24 * 365),
                big_min=J62 * 16384 / 100000 * 60, per_day=24 / J62, young_min=Y62,
                lost=2 / Y62 + (Y62 / 2 + 10) / (J62 * 60)),
    "q63": dict(batch=8, m=2, steps=3, first_loss=lambda v: abs(v - math.log(24)) < 0.2,
                last_loss=lambda v: v < VALUES["q63"]["first_loss"], max_diff=small(1e-12)),
    "q64": dict(psi_b=70, gpus=64, gpus_per_node=8, tp=4, pp=2, dp=8, h=8192, layers=80,
                s=4096, m=12, z1_s=DP70, z3_s=(1 + 2 * 12) * HALF70, z3_x=25 * HALF70 / DP70,
                z1_gb=4 * 70 / 8 + 12 * 70 / 8 / 8, z3_gb=16 * 70 / 8 / 8),
    "q65": dict(tp=4, dp=5, pp=2, gpus_per_node=8, right_groups=10, right_spanning=0,
                right_rank0="0, 1, 2, 3", wrong_groups=10, wrong_spanning=10, wrong_nodes=4,
                wrong_rank0="0, 10, 20, 30"),
})
INHERENT.update({
    "q55": [{"tp_ib", "dp_ib", "pp_nv"}],
    "q56": [{"tp", "gpus_per_node"}],  # a tp group of a whole node, split over two
    "q57": [{"dp", "gpus_per_node"}],  # the seed's example
    "q60": [{"tp", "gpus_per_node"}],  # tp = a node
    "q61": [{"nodes", "p1"}],  # PP = the number of nodes
    "q64": [{"dp", "gpus_per_node"}],  # the seed's example  # nothing of tp and dp crosses, nothing of pp stays
    "q65": [{"right_groups", "wrong_groups", "wrong_spanning"},  # every group, both orders
            {"tp", "wrong_nodes"}],  # tp slowest: each member on its own node
})

# ---- lesson 08: mixture of experts and expert parallelism -------------------------------
def _moe_layer(h, f, E, k, shared=0, active=False):
    """Router E·h, experts of two linears with biases (2hf + f + h), shared experts."""
    mlp = lambda width: 2 * h * width + width + h
    return E * h + (k if active else E) * mlp(f) + (mlp(shared) if shared else 0)


def _moe_gpt(V, s, h, layers, moe_blocks, f_dense, f, E, k, shared, active=False):
    attn = 4 * h * h + 4 * h + 4 * h  # qkv and proj with biases, two LayerNorms
    dense = 2 * h * f_dense + f_dense + h
    return (2 * V * h + s * h + 2 * h + layers * attn + (layers - moe_blocks) * dense
            + moe_blocks * _moe_layer(h, f, E, k, shared, active))


def _nodes_reached(n, per, k):
    """Expected distinct nodes (of n, per experts each) among k experts drawn uniformly."""
    total = n * per
    return n * (1 - math.comb(total - per, k) / math.comb(total, k))


LSE68 = math.log(sum(math.exp(-1 + 2 * i / 15) for i in range(16)))  # linspace(-1, 1, 16)
S70 = 3072 * 6 * 5120 * 2
T70 = 15 * IB_A + max(7 / 16 * S70 / NV_B, 8 / 16 * S70 / IB_B)  # 2 nodes of 8
N70 = 7 * NV_A + 7 / 8 * S70 / NV_B  # one node of 8
L74 = (2048, 1408, 64, 6)
P76 = (102400, 4096, 2048, 28, 27, 10944, 1408, 64, 6, 2816)
ROW77 = 4096 * 2  # bytes of a row, bf16
EXPECTED.update({
    "q66": dict(tokens=1536, experts=12, k=3, factor=1.15, hot=0.3,
                cap=math.ceil(3 * 1536 / 12 * 1.15), even=3 * 1536 / 12, pairs=3 * 1536,
                hot_pairs=round(0.3 * 3 * 1536), dropped=1382 - 442,
                dropped_pct=(1382 - 442) / 4608, other_max=math.ceil((4608 - 1382) / 11),
                needed=1382 / 384),
    "q67": dict(alpha=0.013, experts=24, k=6, tokens=120, balanced=0.013,
                without_k=0.013 * 6, collapsed=0.013 * 24 / 6, collapsed_no_k=0.013 * 24),
    "q68": dict(alpha=0.001, experts=16, small=2.5, large=90,
                z_small=0.001 * (LSE68 + 2.5) ** 2, z_large=0.001 * (LSE68 + 90) ** 2,
                step_small=2.0 ** (1 - 7), step_large=2.0 ** (6 - 7), jump=math.exp(0.5),
                same="the same"),
    "q69": dict(tokens=512, experts=16, k=4, rate=0.002, lean=1.2, steps=150,
                ratio0=lambda v: v > 5, below_step=lambda v: 10 <= v < 150,
                last_lo=lambda v: 1 <= v <= VALUES["q69"]["last_hi"],
                last_hi=lambda v: v < 1.5, stayed=lambda v: 0 < v < 512,
                w_change=small(1e-15), bias_lo=lambda v: v < 0, bias_hi=lambda v: v > 0),
    "q70": dict(tokens=3072, k=6, h=5120, ep=16, gpus_per_node=8, layers=27,
                s_mb=S70 / 1e6, sent_mb=15 / 16 * S70 / 1e6, ib_mb=8 / 16 * S70 / 1e6,
                t_ms=T70 * 1e3, node_ms=N70 * 1e3, step_ms=4 * 27 * T70 * 1e3,
                slower=T70 / N70),
    "q71": dict(dp=24, ep=8, experts=40, rank=13, sim_dp=4, sim_ep=2,
                ep_group=", ".join(str(r) for r in range(8, 16)), edp_group="5, 13, 21",
                per_rank=5, first_expert=25, last_expert=29, replicas=3,
                right_ratio=lambda v: abs(v - 1) < 1e-10, wrong_ratio=lambda v: abs(v - 2) < 1e-10),
    "q72": dict(hidden=12, experts=6, tokens=10, norm_k2=lambda v: v > 0.1,
                fd_err=small(1e-6), norm_k1=0.0, norm_switch=lambda v: v > 0.1),
    "q73": dict(tokens=640, experts=10, k=2, lean=0.9, f1=1.1, f2=1.6,
                cap1=math.ceil(128 * 1.1), cap2=math.ceil(128 * 1.6),
                drop1=lambda v: VALUES["q73"]["drop2"] < v < 0.5, drop2=lambda v: 0 < v,
                pad1=lambda v: abs(v - (1 - 1280 * (1 - VALUES["q73"]["drop1"]) / 1410)) < 1e-12,
                pad2=lambda v: abs(v - (1 - 1280 * (1 - VALUES["q73"]["drop2"]) / 2050)) < 1e-12,
                busiest=lambda v: 205 < v <= 640, mean=128.0,
                straggle=lambda v: abs(v - VALUES["q73"]["busiest"] / 128) < 1e-12),
    "q74": dict(h=2048, f=1408, experts=64, k=6, shared=2816,
                total_m=_moe_layer(*L74, 2816) / 1e6,
                active_m=_moe_layer(*L74, 2816, active=True) / 1e6,
                active0_m=_moe_layer(*L74, active=True) / 1e6,
                shared_m=(2 * 2048 * 2816 + 2816 + 2048) / 1e6,
                shared_pct=(2 * 2048 * 2816 + 2816 + 2048) / _moe_layer(*L74, 2816, active=True)),
    "q75": dict(nodes=16, experts=192, k=7, kept=4, h=7168, tokens=4000,  # a row: 14.336 kB
                free_nodes=lambda v: abs(v - _nodes_reached(16, 12, 7)) < 0.1,
                limited_nodes=lambda v: 3 < v <= 4, over=lambda v: 0.5 < v < 1,
                free_kb=lambda v: abs(v - 15 / 16 * _nodes_reached(16, 12, 7) * 14.336) < 1.5,
                limited_kb=lambda v: v < VALUES["q75"]["free_kb"] and v <= 4 * 14.336,
                rows_kb=7 * 7168 * 2 / 1e3),
    "q76": dict(vocab=102400, h=2048, layers=28, first_dense=1, experts=64, k=6, f=1408,
                shared=2816, dense_ffn=10944, total_b=_moe_gpt(*P76) / 1e9,
                active_b=_moe_gpt(*P76, active=True) / 1e9,
                active_pct=_moe_gpt(*P76, active=True) / _moe_gpt(*P76),
                states_gb=16 * _moe_gpt(*P76) / 1e9, dense_gb=16 * _moe_gpt(*P76, active=True) / 1e9,
                gflops=6 * _moe_gpt(*P76, active=True) / 1e9),
    "q77": dict(tokens=2048, experts=32, k=4, ep=8, lean=1.1, h=4096,
                busiest_rows=lambda v: 1024 < v <= 2048, mean_rows=1024.0,
                expert_x=lambda v: abs(v - VALUES["q77"]["busiest_rows"] / 1024) < 1e-12,
                a2a_us=lambda v: abs(v - (7 * NV_A + 7 * VALUES["q77"]["busiest_rows"] * ROW77
                                          / NV_B) * 1e6) < 1e-6,
                even_us=(7 * NV_A + 7 / 8 * 2048 * 4 * ROW77 / NV_B) * 1e6,
                a2a_x=lambda v: abs(v - VALUES["q77"]["a2a_us"] / VALUES["q77"]["even_us"]) < 1e-12),
    "q78": dict(m=5, alpha=0.02, excess_ratio=lambda v: abs(v - 4) < 1e-6,
                rel=lambda v: v > 0.5, alpha_eff=5 * 0.02),
    "q79": dict(dp=4, experts=8, k=2, tokens=64, lean=2.0,
                whole=lambda v: 1.0 <= v < 1.2,  # nearer balance over the whole batch
                local=lambda v: v > 1.2 * VALUES["q79"]["whole"],
                global_=lambda v: abs(v - VALUES["q79"]["whole"]) < 1e-12),
})
INHERENT.update({
    "q67": [{"alpha", "balanced"}],  # the loss is the coefficient at balance
    "q79": [{"whole", "global_"}],  # the summed counts give the global loss exactly
})

# ---- lesson 09: context parallelism ----------------------------------------------------
PEAK_BF16 = 989e12  # H100 bf16 dense


def _crossover(b, h, cp, e, bw, alpha):
    """s with 2bhs²/(cp² P) = alpha + 2(s/cp)bh·e/bw: one zigzag step's compute against
    its K/V send, solved for s by the quadratic formula."""
    qa, qb = 2 * b * h / (cp**2 * PEAK_BF16), 2 * b * h * e / (cp * bw)
    return (qb + math.sqrt(qb**2 + 4 * qa * alpha)) / (2 * qa)


def _exposed(s, b, h, cp, bw, alpha):
    """(cp - 1) · max(0, T_s - T_c): what a ring forward's sends add to its compute."""
    t_c = 2 * b * h * s**2 / (cp**2 * PEAK_BF16)
    return (cp - 1) * max(0.0, alpha + 2 * (s / cp) * b * h * 2 / bw - t_c)


X84 = {"nv": _crossover(2, 5120, 8, 2, NV_B, NV_A), "ib": _crossover(2, 5120, 8, 2, IB_B, IB_A)}
KV90 = 2 * 131072 * 1 * 128 * 2  # K and V of one KV head over the whole sequence, bf16
SH87 = 8192 * 6144 * 2  # one rank's [s/cp, b, h] in bf16 at cp = 8
L91 = 65536 * 12288  # s·b·h
EXPECTED.update({
    "q80": dict(s=6000, b=3, h=5120, n=5, s_mb=6000 * 3 * 5120 * 2 / 1e6,
                megatron_mb=2 * 4 / 5 * 6000 * 3 * 5120 * 2 / 1e6,
                ulysses_mb=4 / 5 * 4 * 1200 * 3 * 5120 * 2 / 1e6,
                ring_mb=4 * 2 * 1200 * 3 * 5120 * 2 / 1e6, sends=4, tokens_ring=1200),
    "q81": dict(lse1=1000.7, lse2=997.9, out1=0.31, out2=-0.58,
                w1=1 / (1 + math.exp(-2.8)), w2=1 / (1 + math.exp(2.8)),
                out=(0.31 * math.exp(2.8) - 0.58) / (math.exp(2.8) + 1),
                lse=1000.7 + math.log(1 + math.exp(-2.8)),
                f64=math.log(1.7976931348623157e308), f32=math.log(3.4028234663852886e38),
                naive="nan"),
    "q82": dict(s=48, cp=3, chunks=6, c=8,
                contiguous="rank 0: 0–15; rank 1: 16–31; rank 2: 32–47",
                zigzag="rank 0: 0–7 and 40–47; rank 1: 8–15 and 32–39; rank 2: 16–23 and 24–31",
                work_contiguous="1/9, 1/3, 5/9", work_zigzag="1/3, 1/3, 1/3",
                last_over_first=5, slower=5 / 3),
    "q83": dict(cp=5, blocks=25, full=10, diagonal=5, skipped=10, units=12.5, sends_fwd=4,
                sends_bwd=9),
    "q84": dict(b=2, h=5120, cp=8, nv_s=X84["nv"], ib_s=X84["ib"], nv_rank=X84["nv"] / 8,
                ib_rank=X84["ib"] / 8, link_ratio=9.0, bwd_factor=1.2,
                gqa_s=_crossover(2, 5120, 8, 2 / 8, IB_B, IB_A),
                tail_ms=(IB_A + 2 * math.floor(X84["ib"] / 8) * 2 * 5120 * 4 / IB_B) * 1e3),
    "q85": dict(s=24576, b=1, h=5120, cp=6, fwd_mb=5 * 2 * 4096 * 5120 * 2 / 1e6,
                dkv_mb=6 * 2 * 4096 * 5120 * 4 / 1e6,
                bwd_mb=(5 * 2 * 4096 * 5120 * 2 + 6 * 2 * 4096 * 5120 * 4) / 1e6,
                ratio=1 + (6 * 4) / (5 * 2), uly_mb=5 / 6 * 4 * 4096 * 5120 * 2 / 1e6),
    "q86": dict(heads=40, tp=8, tp2=4, cp=16, per_rank=5, per_rank2=10, options="1, 5",
                options2="1, 2, 5, 10", message="num_heads = 5 is not divisible by cp = 16"),
    "q87": dict(s=65536, b=1, h=6144, cp_small=2, cp_big=8,
                ring_small=2 * 32768 * 6144 * 2 / 1e6, uly_small=1 / 2 * 4 * 32768 * 6144 * 2 / 1e6,
                ring_big=7 * 2 * SH87 / 1e6, uly_big=7 / 8 * 4 * SH87 / 1e6,
                uly_node_ms=(14 * NV_A + 7 / 8 * 4 * SH87 / NV_B) * 1e3,
                uly_nodes_ms=(14 * IB_A + 7 / 8 * 4 * SH87 / IB_B) * 1e3,
                ring_node_ms=_exposed(65536, 1, 6144, 8, NV_B, NV_A) * 1e3,
                ring_nodes_ms=_exposed(65536, 1, 6144, 8, IB_B, IB_A) * 1e3),
    "q88": dict(cp=8, first="1/64", last="15/64", times=15, even="1/8", ratio=15 / 8,
                measured=lambda v: abs(v - 15 / 8) < 0.01),
    "q89": dict(s=32, b=2, heads=4, d=16, cp_big=8, one_fwd=lambda v: 1e-4 < v < 2e-2,
                one_bwd=lambda v: 1e-4 < v < 2e-2, growth_fwd=lambda v: 0.5 < v < 1.5,
                growth_bwd=lambda v: 0.5 < v < 1.5, vs_one=lambda v: 0.5 < v < 2),
    "q90": dict(s=131072, cp=16, tp=8, h=16384, heads=128, kv_heads=8, kv=1,
                gather_mb=KV90 / 1e6, gather_ms=(15 * IB_A + 15 / 16 * KV90 / IB_B) * 1e3,
                mha_ms=(15 * IB_A + 15 / 16 * 16 * KV90 / IB_B) * 1e3,
                attend_ms=2 * 16 * 128 * 131072**2 / 16 / PEAK_BF16 * 1e3,
                rank_crossover=_crossover(1, 16 * 128, 16, 2 / 16, IB_B, IB_A) / 16,
                tokens_rank=8192),
    "q91": dict(s=65536, h=12288, a=96, t=8, cp=16,
                none_gb=L91 * (34 / 8 + 5 * 96 * 65536 / (12288 * 8)) / 1e9,
                flash_gb=L91 * 34 / 8 / 1e9, cp_gb=L91 / 16 * 34 / 8 / 1e9,
                scores_share=1 - (34 / 8) / (34 / 8 + 5 * 96 * 65536 / (12288 * 8))),
})
INHERENT.update({
    "q80": [{"megatron_mb", "ring_mb"}],  # the ring's forward is 2(n - 1)/n · S, as SP's
    "q83": [{"full", "skipped"},  # cp(cp - 1)/2 each side of the diagonal
            {"cp", "diagonal"}],  # one diagonal block a rank
    "q87": [{"ring_small", "uly_small"}],  # at cp = 2 both send s·b·h·e
    "q88": [{"ratio", "measured"}],  # the clock measures the formula
    "q90": [{"kv_heads", "tp"}],  # Llama 3 sets tp to its KV heads: one a tp rank, none copied
})

# ---- lesson 10: planning a run -----------------------------------------------------------
GIB = 2**30
PEAK_A100 = 312e12  # A100 bf16 dense
HBM_H100 = 3.35e12  # H100 HBM3, bytes/s


def _g(x):
    """A GEMM dimension's share of the tile pipeline: x / (x + 128)."""
    return x / (x + 128)


def _eff(M, N, K):
    """e_max · g(M) g(N) g(K), e_max = 0.766 (the fit over Korthikanti et al.'s Table 5)."""
    return 0.766 * _g(M) * _g(N) * _g(K)


def _gpt_layer(h):
    """A GPT layer's parameters: 12h² weights, 13h biases and LayerNorms."""
    return 12 * h * h + 13 * h


H530 = 20480  # the 530B: 105 layers on pp 35 x 3 chunks, the first rank 3 of them
ENDS530 = (51200 // 8 + 2048) * H530  # ceil(V/t)·h embedding, s·h positions
A94 = 34 * 2048 * 6144 / 8  # 34sbh/t a layer, s = 2048, h = 6144, t = 8
F95 = 72 * 96 * 2048 * 48 * 6144**2 * (1 + 2048 / (6 * 6144) + 51200 / (12 * 48 * 6144))
D95 = 5.3 * 64 * PEAK_A100
T97, H97, S97, B97, A97, t97 = 6000, 5120, 3000, 2, 40, 4  # tokens b·s
N97, FT97, Q97, SEL97 = T97 * H97 / t97, T97 * 4 * H97 / t97, T97 * 4 * H97 / t97, \
    B97 * A97 / t97 * S97 * S97
STREAM97 = (2 * 2 * 2 * N97 + 2 * 7 * N97 + 2 * 2 * FT97 + 2 * 2 * Q97  # forward, e = 2, r = 1
            + 2 * 5 * 2 * N97 + 2 * 13 * N97 + 4 * 2 * FT97 + 2 * 2 * Q97)  # backward
CORE97 = 2 * 2 * SEL97 + 5 * SEL97 + 3 * 2 * SEL97 + 5 * SEL97  # softmax, dropout each way
GEMMS97 = [(T97, 3 * H97 / t97, H97, 1), (S97, S97, 128, B97 * A97 / t97),
           (S97, 128, S97, B97 * A97 / t97), (T97, H97, H97 / t97, 1),
           (T97, 4 * H97 / t97, H97, 1), (T97, H97, 4 * H97 / t97, 1)]
GEMM97 = 3 * sum(2 * M * N * K * c / (_eff(M, N, K) * PEAK) for M, N, K, c in GEMMS97)
S99 = 1.3e9 * 4
PSI102 = 40 * _gpt_layer(5120) + 2 * 51200 * 5120 + 2048 * 5120 + 2 * 5120
PSI104 = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096
EXPECTED.update({
    "q92": dict(psi_b=34, mp=8, dp=24, gpu_gb=80, b18=18, b16=16, gb18=34 / 8 * 18,
                gb16=34 / 8 * 16, dist_b=6 + 12 / 24, dist_gb=34 / 8 * 6.5, under=1 / 9,
                left_gb=80 - 34 / 8 * 6.5),
    "q93": dict(tp=8, pp=35, chunks=3, layers_per_rank=3,
                layers_gib=18 * 12 * 3 * H530**2 / 8 / GIB, ends_m=ENDS530 / 1e6,
                model_gib=18 * (3 * (12 * H530**2 / 8 + 7 * H530 / 8 + 6 * H530) + ENDS530)
                / GIB,
                more=(3 * (12 * H530**2 / 8 + 7 * H530 / 8 + 6 * H530) + ENDS530)
                / (3 * 12 * H530**2 / 8) - 1,
                held=35 * 3 + 35 - 1, acts_gib=139 * 34 * 2048 * H530 / 8 / GIB),
    "q94": dict(layers=48, h=6144, a=64, s=2048, t=8, p=6, m=12, v=2, layer_mb=A94 / 1e6,
                gpipe_n=12, gpipe_layers=12 * 8, gpipe_gb=96 * A94 / 1e9,
                f1b_n=6, f1b_layers=48, f1b_gb=48 * A94 / 1e9,
                inter_n=6 * 2 + 6 - 1, inter_layers=17 * 4, inter_gb=68 * A94 / 1e9),
    "q95": dict(layers=48, h=6144, a=24, s=2048, vocab=51200, batch=96, gpus=64, step_s=5.3,
                model_pf=F95 / 1e15, mfu=F95 / D95,
                hfu_full=96 * 96 * 2048 * 48 * 6144**2 * (
                    1 + 2048 / (6 * 6144) + 51200 / (16 * 48 * 6144)) / D95,
                hfu_sel=(F95 + 48 * 4 * 96 * 2048**2 * 6144) / D95,
                hfu_qk=(F95 + 48 * 2 * 96 * 2048**2 * 6144) / D95),
    "q96": dict(s=3000, h=5120, d=128, t=4, peak_tflops=989, g_d=0.5,
                scores_eff=_eff(3000, 3000, 128), mlp_eff=_eff(3000, 5120, 5120),
                scores_us_per_gflop=1e15 / (_eff(3000, 3000, 128) * 989e12),
                mlp_us_per_gflop=1e15 / (_eff(3000, 5120, 5120) * 989e12),
                slower=_eff(3000, 5120, 5120) / _eff(3000, 3000, 128)),
    "q97": dict(s=3000, b=2, h=5120, a=40, t=4, stream_gb=STREAM97 / 1e9, core_gb=CORE97 / 1e9,
                ms=(STREAM97 + CORE97) / HBM_H100 * 1e3, gemm_ms=GEMM97 * 1e3,
                share=(STREAM97 + CORE97) / HBM_H100 / GEMM97),
    "q98": dict(p=6, m=10, t_f_ms=5, t_b_ms=11, last_f_ms=7, last_b_ms=13,
                even_ms=(10 + 6 - 1) * 16, even_idle=1 - 160 / 240,
                step_ms=(6 - 1) * 16 + 10 * (7 + 13), idle=1 - 160 / 280, closed=5 / 15),
    "q99": dict(psi_r_b=1.3, dp=12, gpus_per_node=8, s_gb=S99 / 1e9,
                one_ar_s=ring_ar(S99, 12, IB_B, IB_A), one_rs_s=ring_half(S99, 12, IB_B, IB_A),
                naive_s=S99 / IB_B, two_ar_s=hier_ar(S99, 6, 2),
                two_rs_s=ring_half(S99, 2, NV_B, NV_A) + ring_half(S99 / 2, 6, IB_B, IB_A),
                two_algo="hierarchical"),
    "q100": dict(gpus=256, batch=512, fits16="fits", fits8="fits",
                 mfu16=lambda v: 0.28 < v < 0.35, mfu8=lambda v: 0.40 < v < 0.48,
                 gain=lambda v: abs(v - 48 / 35) < 0.05, reported_gain=48 / 35,
                 tp16_s=lambda v: v > 3 * VALUES["q100"]["tp8_s"], tp8_s=lambda v: 0 < v < 3,
                 tp_ratio=lambda v: v == pytest.approx(
                     VALUES["q100"]["tp16_s"] / VALUES["q100"]["tp8_s"])),
    "q101": dict(p=64, m_seed=4, m_fix=32, seed_closed=63 / 4, fix_closed=63 / 32,
                 seed_dry=lambda v: 63 / 4 <= v < 1.1 * 63 / 4,
                 fix_dry=lambda v: 63 / 32 <= v < 1.15 * 63 / 32,
                 seed_bound=4 / 67, fix_bound=32 / 95,
                 seed_mfu=lambda v: 0 < v < 4 / 67 and v < 0.28,
                 fix_mfu=lambda v: 0 < v < 32 / 95 and v < 0.51 / 2),
    "q102": dict(dp=8, psi_b=PSI102 / 1e9, z2_states_gb=(2 + 14 / 8) * PSI102 / 1e9,
                 z3_states_gb=16 / 8 * PSI102 / 1e9,
                 z2_peak_gb=lambda v: VALUES["q102"]["z2_states_gb"] < v < 80,
                 z3_peak_gb=lambda v: VALUES["q102"]["z3_states_gb"] < v
                 < VALUES["q102"]["z2_peak_gb"],
                 ratio=lambda v: v == pytest.approx(
                     VALUES["q102"]["z3_peak_gb"] / VALUES["q102"]["z2_peak_gb"]) and v < 1,
                 layers_needed=lambda v: v > 40),
    "q103": dict(gpus=256, batch=512, tp16_pp4=lambda v: v > 0.3, tp16_pp1=lambda v: v > 0.3,
                 tp8_pp4=lambda v: v < 0.3),
    "q104": dict(gpus=16, batch=64, psi_b=PSI104 / 1e9, ddp_gb=18 * PSI104 / 1e9,
                 z2_gb=3 * PSI104 / 1e9, ddp_peak_gib=lambda v: v > 80e9 / GIB,
                 z2_s=lambda v: 0 < v < VALUES["q104"]["pp2_s"], pp2_s=lambda v: v > 0,
                 pp2_more=lambda v: v == pytest.approx(
                     VALUES["q104"]["pp2_s"] / VALUES["q104"]["z2_s"] - 1) and v > 0.05),
    "q105": dict(gpus=512, batch=1024, none_peak_gib=lambda v: v > 80e9 / GIB,
                 sel_peak_gib=lambda v: v < 80e9 / GIB, sel_s=lambda v: 10 < v < 40,
                 sel_mfu=lambda v: 0.3 < v < 0.5,
                 tokens_k=lambda v: v == pytest.approx(
                     1024 * 8192 / VALUES["q105"]["sel_s"] / 1e3),
                 best_s=lambda v: v < VALUES["q105"]["sel_s"],
                 slower=lambda v: v == pytest.approx(
                     VALUES["q105"]["sel_s"] / VALUES["q105"]["best_s"] - 1)),
    "q106": dict(dp=128, pp=16, tp=8, world=16384, ranks=16, share=16 / 16384,
                 events=lambda v: v > 16 * 2 * 16 * 8,  # more than an event a layer pass
                 step_s=lambda v: 1 < v < 60),
})
INHERENT.update({
    "q93": [{"chunks", "layers_per_rank"}],  # 105 layers in 35 x 3 stages: one a chunk
    "q94": [{"p", "f1b_n"},  # 1F1B holds min(p, m) = p
            {"m", "gpipe_n"},  # GPipe holds m
            {"layers", "f1b_layers"}],  # the point: L layers' worth at any p
    "q98": [{"even_idle", "closed"}],  # the dry run is the closed form on equal stages
    "q106": [{"pp", "ranks"}],  # one rank a pipeline coordinate: the point
    "q100": [{"gain", "reported_gain"}],  # the planner's gain is the reported one
})


# ---- the bank's shape ------------------------------------------------------------------
def test_at_least_150_questions_and_4_per_lesson_12_and_8_for_pipelines():
    assert len(bank.QUESTIONS) >= 150
    per_lesson = collections.Counter(q.lesson for q in bank.QUESTIONS)
    assert set(per_lesson) == {f"{n:02d}" for n in range(14)} | {"design"}
    assert set(per_lesson) == set(bank.LESSONS)
    assert all(count >= 4 for count in per_lesson.values()), per_lesson
    assert per_lesson["05"] >= 12 and per_lesson["06"] >= 8 and per_lesson["07"] >= 12
    assert per_lesson["08"] >= 12 and per_lesson["09"] >= 10 and per_lesson["10"] >= 12
    assert per_lesson["design"] >= 10
    assert min(per_lesson["11"], per_lesson["12"], per_lesson["13"]) >= 10
    ids = [q.id for q in bank.QUESTIONS]
    assert ids == [f"q{i:02d}" for i in range(1, len(ids) + 1)]
    lessons = [q.lesson for q in bank.QUESTIONS]
    assert lessons == sorted(lessons), "questions are grouped by lesson, in order"


@pytest.mark.parametrize("qid", LESSON_IDS)
def test_every_placeholder_is_filled_and_every_value_is_shown(qid):
    checks.check_shown(BY_ID[qid], VALUES[qid])


@pytest.mark.parametrize("qid", LESSON_IDS)
def test_every_number_equals_the_hand_formula(qid):
    checks.check_numbers(qid, VALUES[qid], EXPECTED[qid])


@pytest.mark.parametrize("qid", LESSON_IDS)
def test_no_two_numbers_in_an_answer_coincide_unless_they_must(qid):
    """Uneven example data: two different quantities never print the same number, so a
    reader (or a test) cannot mistake one formula's result for another's."""
    checks.check_distinct(BY_ID[qid], VALUES[qid], INHERENT.get(qid, []))


# ---- what the answers claim, beyond the numbers -----------------------------------------
def test_the_example_data_separate_right_from_common_wrong_formulas():
    v = VALUES
    # the seed's "2P for parameters and gradients": 14 bytes, not 16
    assert v["q01"]["total_gb"] != pytest.approx(13 * 14)
    # a ring all-reduce is neither (n-1)/n S nor (n-1) S nor 2S per rank
    for wrong in (5 / 6 * 96, 5 * 96, 2 * 96):
        assert v["q09"]["sent_mib"] != pytest.approx(wrong)
    # the micro-batch and the layer count are not 1 and not the head count
    assert v["q03"]["b"] != 1 and v["q03"]["layers"] != v["q03"]["a"]
    # ZeRO-3 traffic is 1.5x DDP's, not a multiple of the layer count
    assert v["q21"]["ratio"] == pytest.approx(1.5)
    # three cross-entropy all-reduces: not one per sequence, nor one per rank
    assert v["q30"]["sim_ce"] not in (v["q30"]["b"], v["q30"]["sim_t"], v["q30"]["t"])
    # two all-reduces per layer and direction: not b, not the tiny model's layer count
    assert v["q25"]["fwd_per_layer"] not in (v["q25"]["b"], v["q25"]["sim_layers"])
    # ZeRO-1 on 18 ranks: K/N is not a round number of bytes per parameter
    assert v["q19"]["z1_gb"] != pytest.approx(6.7 * 5)


def test_the_layernorm_gradient_answer():
    """Without the all-reduce: loss right, other gradients exact, replicated parameters'
    gradients wrong by tens of percent; with it: exact. The patch is undone afterwards."""
    from minipar.parallel.tp.sequence import SequenceParallelGrads

    flush = SequenceParallelGrads.flush
    v = bank.sp_grad_run(4)
    assert SequenceParallelGrads.flush is flush, "the bank must restore the all-reduce"
    assert v["without_min"] > 1e10 * max(v["with_max"], 1e-300)
    assert v["loss_err"] < 1e-12 and v["others_max"] < 1e-12 and v["partial_sum_err"] < 1e-12


def test_the_segments_answer_wins_and_loses_where_it_says():
    """q24: 42 layers lie between 2A/I without the attention scores and with them, so
    segments of 2 win the one way and lose the other; the simulated 8 layers are below
    the incident model's 2A/I, so there they add activations."""
    from minipar.programs.incidents import zero3_recompute as inc
    v = VALUES["q24"]
    assert v["thr_flash"] < v["layers"] < v["thr_scores"]
    assert v["seg_flash_gb"] < v["per_flash_gb"] and v["seg_scores_gb"] > v["per_scores_gb"]
    m = inc.MODEL
    terms = inc.segment_terms(v["sim_layers"], m.seq_len, inc.MICRO_BATCH, m.hidden,
                              m.num_heads)
    assert v["sim_layers"] < terms["threshold"] and v["sim_seg_extra"] > 0


def test_which_collective_each_zero_stage_runs():
    run = bank.zero_stage_run(5)["stages"]
    ddp, z1, z2, z3 = (run[s] for s in range(4))
    assert ddp[0] == [] and set(ddp[1]) == {"all_reduce"}
    for stage in (z1, z2):
        assert stage[0] == [], "ZeRO-1/2 communicate nothing in the forward"
        assert set(stage[1]) == {"reduce_scatter", "all_gather"}
        first_gather = stage[1].index("all_gather")
        assert set(stage[1][:first_gather]) == {"reduce_scatter"}, \
            "every gradient is reduce-scattered before the updated weights are gathered"
    assert set(z3[0]) == {"all_gather"}, "ZeRO-3's forward only gathers weights"
    assert set(z3[1]) == {"all_gather", "reduce_scatter"}
    assert "all_reduce" not in z1[1] + z2[1] + z3[1]


def test_the_pipeline_example_data_separate_right_from_common_wrong_formulas():
    v = VALUES
    # t_B is not 2 t_F here, so the shortcut "3 t_F a slot" gives another step
    q = v["q33"]
    assert q["t_b_ms"] != 2 * q["t_f_ms"]
    assert q["step_ms"] != pytest.approx((q["m"] + q["p"] - 1) * 3 * q["t_f_ms"])
    assert q["over_ideal"] != pytest.approx(q["over_total"])  # two spellings, two numbers
    # interleaving divides the bubble by v exactly, but multiplies messages by
    # (pv - 1)/(p - 1), not v
    q = v["q36"]
    assert q["inter_bubble"] == pytest.approx(q["f1b_bubble"] / q["v"])
    assert q["msg_ratio"] != pytest.approx(q["v"]) and q["mem_factor"] > 1
    # incident B: the fix's bound is below the MFU it claims, at any stage MFU
    q = v["q37"]
    assert q["fix_bound"] < q["mfu_fix_pct"] / 100 < q["floor_bound"]
    assert q["implied_fix"] > 1 and q["implied_seed"] > 1
    # the head makes the even split's last stage the slowest, and the fix moves layers off it
    q = v["q39"]
    assert q["even_last_ms"] > q["best_max_ms"] > q["even_other_ms"] and q["speedup"] > 1
    # 1F1B's first rank holds L layers' worth at every p; interleaving holds more
    q = v["q44"]
    assert q["r0_gb"] == pytest.approx(q["whole_gb"]) and min(q["factor1"], q["factor2"]) > 1


def test_blocking_sends_deadlock_1f1b_only_under_rendezvous():
    """q41: with blocking sends and rendezvous every rank is stuck in a send; with eager
    sends, or isend under rendezvous, the same lists finish on the same clock."""
    run = bank.send_modes_run(3, 4, 5, 11)
    stuck = run[True, "rendezvous"]
    assert set(stuck) == {0, 1, 2} and all("SEND" in a for a in stuck.values())
    assert run[True, "eager"] == run[False, "rendezvous"] == pytest.approx(6 * 16e-3)


def test_the_tied_embedding_all_reduce_runs_on_the_first_and_last_stage_only():
    """q42: the embedding group is the first and last pipeline ranks, and nothing else."""
    runs = bank.tied_run(4)
    assert [count for count, _ in runs] == [1, 0, 0, 1]
    assert {nbytes for count, nbytes in runs if count} == {19 * 8 * 8}


def test_the_block_split_is_measured_the_same_at_another_size():
    """q45's coefficients come from the matmuls a simulated device is charged for; at
    another (s, b, h) they are the same, and F + I + W is the model-FLOPs count of a layer,
    72bsh^2(1 + s/(6h)) (Narayanan et al. 2021)."""
    part = bank.bank_06
    for s, b, h in ((5, 2, 12), (9, 1, 6)):
        c = part.split_coefficients(s, b, h)
        assert c["linear"] == {"F": 24, "I": 24, "W": 24}
        assert c["core"] == {"F": 4, "I": 8, "W": 0}
        assert c["fc1"] == {"F": 8, "I": 8, "W": 8}
        run = part.block_flops(s, b, h)["parts"]
        assert sum(run.values()) == pytest.approx(72 * b * s * h**2 * (1 + s / (6 * h)))


def test_the_zero_bubble_example_data_separate_right_from_common_wrong_formulas():
    v = VALUES
    # a layer's W is the shortest of the three, so ZB-H1's formula applies to it
    q = v["q45"]
    assert q["t_w_ms"] < q["t_f_ms"] < q["t_i_ms"]
    # "a third of 1F1B's bubble" holds at equal times only
    q = v["q46"]
    assert q["eq_ratio"] == pytest.approx(1 / 3) and q["ratio"] != pytest.approx(1 / 3)
    # t_W > t_F: the clock idles more than the formula says, still less than 1F1B
    q = v["q47"]
    assert q["formula_ms"] < q["clock_ms"] < q["f1b_ms"] and q["block_ratio"] < 1
    # ZB-H2's zero is back to back at equal times, at fewer than twice ZB-H1's micro-batches
    q = v["q48"]
    assert q["h2_steady"] == 0 < q["h2_uneven"] < q["h1_uneven"]
    assert q["h2_peak"] == 2 * q["p"] - 1 and 1 < q["mem_ratio"] < 2
    # ZB-V: a sixth of 1F1B's flushed bubble, twice its messages
    q = v["q49"]
    assert q["v_ratio"] == pytest.approx(1 / 6) and q["send_ratio"] == 2
    # DualPipeV: only the last two ranks idle the README's bubble
    q = v["q50"]
    idles = [int(x) for x in q["dv_idles"].split(", ")]
    assert idles[-2:] == [q["formula_ms"]] * 2 and min(idles) < q["formula_ms"]
    assert q["two_gb"] == pytest.approx(2 * q["stage_gb"])
    # hiding the all-to-all: DualPipeV beats ZB-H1 and 1F1B, but not a free all-to-all
    q = v["q51"]
    assert q["free_ms"] < q["dv_ms"] < q["zb_ms"] < q["f1b_ms"]
    # a flush costs ZB-H2 exactly ZB-H1's bubble, and ZB-V half of it
    q = v["q52"]
    assert q["h2_cost"] == pytest.approx(q["h1_bubble"]) == pytest.approx(2 * q["v_cost"])


def test_a_split_backward_is_complete_only_after_its_last_w():
    """q53 from the lists themselves: on every ZB-H1 rank the last action is a W, and at the
    m-th backward call (I or W) some W's of the step have not run. minipar's DDP under a
    split backward reduces after W, as many times as fused, to the same bits."""
    run = bank.bank_06.ddp_split_run(VALUES["q53"]["sim_dp"])
    assert run["during_i"] == 0 and run["after_i"] == run["fused"] >= 1 and run["diff"] == 0
    assert run["trap_reduces"] == 0 and min(run["trap_err"], run["trap_gap"]) > 0.1
    from minipar.parallel.pp import Kind, schedule
    p, m = VALUES["q53"]["p"], VALUES["q53"]["m"]
    for row in schedule("zb_h1", p, m):
        assert row[-1].kind == Kind.W
        calls = [a for a in row if a.kind in (Kind.I, Kind.W)]
        assert len(calls) == 2 * m
        assert sum(a.kind == Kind.W for a in calls[:m]) < m


# ---- the command ---------------------------------------------------------------------------
def run_bank(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(BANK_PATH), *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)


def test_the_command_prints_every_question_and_answer(monkeypatch, capsys):
    """bank.main() run here, its questions' values those the other tests computed in this
    process (the command's printing is under test, not the numbers again); running the
    file as a script is tested below, on one lesson."""
    monkeypatch.setattr(bank.Question, "values", lambda q: VALUES[q.id])
    assert bank.main([]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for q in bank.QUESTIONS:
        question, answer = q.render(VALUES[q.id])
        assert f"{q.id} " in out
        assert " ".join(question.split()) in flat, q.id
        assert " ".join(answer.split()) in flat, q.id
    for lesson, title in bank.LESSONS.items():
        count = sum(q.lesson == lesson for q in bank.QUESTIONS)
        heading = (f"=== Lesson {lesson} — {title} ({count} questions) ===" if lesson.isdigit()
                   else f"=== {title} ({count} questions) ===")
        assert heading in out


@pytest.mark.timeout(60)
def test_running_the_file_prints_a_lessons_questions_and_answers():
    out = run_bank("--lesson", "00")
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    chosen = [q for q in bank.QUESTIONS if q.lesson == "00"]
    assert f"({len(chosen)} questions) ===" in out.stdout and "=== Lesson 01" not in out.stdout
    for q in chosen:
        assert " ".join(q.render(VALUES[q.id])[1].split()) in flat, q.id


@pytest.mark.timeout(60)
def test_lesson_and_quiz_options():
    out = run_bank("--lesson", "1", "--quiz")
    assert out.returncode == 0, out.stderr
    shown = {q.id for q in bank.QUESTIONS if f"{q.id} " in out.stdout}
    assert shown == {q.id for q in bank.QUESTIONS if q.lesson == "01"}
    assert "A:" not in out.stdout
    bad = run_bank("--lesson", "99")
    assert bad.returncode == 2 and "no question matches" in bad.stderr
