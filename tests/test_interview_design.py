"""The interview bank's open design and debugging questions (lessons/interview/bank_design.py).

As in tests/test_interview.py, each number an answer shows is checked independently of the
bank's `compute`: against the closed form with the example's numbers in it (batch and token
arithmetic, Ψ from the model's shape, the checkpoint's bytes, Young's interval, the
bisection's bracket, a straggler's clock), against a direct call of the planner on a layout
written out here, or, for runs on simulated devices, against what the runtime's rules
predict (the call a hang surfaces at, the count of silently wrong sums) and a single-device
run of the same data.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT
from minipar.optim import AdamW
from minipar.plan import CLUSTERS, MODELS, Layout, rank_memory, step_time
from minipar.plan.search import candidates
from minipar.runtime.topology import Link

ROOT = Path(__file__).resolve().parents[1]
BANK_PATH = ROOT / "lessons" / "interview" / "bank.py"


_spec = importlib.util.spec_from_file_location(  # the shared checks, loaded by path
    "interview_checks", Path(__file__).resolve().parent / "interview_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
bank = checks.load(BANK_PATH, "interview_bank_design_tests")
DESIGN = [q for q in bank.QUESTIONS if q.lesson == "design"]
BY_ID = {q.id: q for q in DESIGN}
VALUES = checks.LazyValues(BY_ID)

GIB, GB = 2**30, 10**9
H100, A100 = CLUSTERS["h100"], CLUSTERS["a100"]
LLAMA = MODELS["llama3-70b"]
PEAK = 989e12  # H100 bf16 dense
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B = 50e9  # InfiniBand NDR, one GPU


def plan(model, lay, cluster=H100):
    """(step_time, rank_memory), Llama-style without dropout, by a direct call."""
    return (step_time(model, lay, cluster, dropout=False),
            rank_memory(model, lay, cluster, dropout=False))


def megatron(tp, pp, dp, batch, cp=1, recompute="selective"):
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=batch, sequence_parallel=True,
                  recompute=recompute, distributed_optimizer=True)


# Llama 3 70B from its shape: 80 layers of 2h² + 2h·(8 · 128) attention, 3hf SwiGLU and two
# RMSNorm gains, two untied V·h ends and the final norm
H, V, F, KV = 8192, 128256, 28672, 8 * 128
LLAMA_LAYER = 2 * H * H + 2 * H * KV + 3 * H * F + 2 * H
PSI_LLAMA = 80 * LLAMA_LAYER + 2 * V * H + H

# ---- q143: the search ---------------------------------------------------------------------
BEST107 = Layout(tp=4, dp=128, global_batch=1536, sequence_parallel=True,
                 recompute="selective", zero=3)
SECOND107 = megatron(4, 4, 32, 1536)
T88_107 = dataclasses.replace(megatron(8, 8, 8, 1536), schedule="interleaved_1f1b", chunks=2)
ST107, MEM107 = plan(LLAMA, BEST107)
ST2_107, MEM2_107 = plan(LLAMA, SECOND107)
ST88_107, _ = plan(LLAMA, T88_107)


def candidate_count(gpus, batch, layers=80, heads=64, per_node=8):
    """The search's space as its docstring states it, counted here: tp a power of two up to
    2 nodes' worth dividing the heads, pp a divisor of the layers, dp dividing the batch; 1F1B
    and interleaving with 2 or 3 chunks (layers % (pp v) = 0 and m % pp = 0); the
    distributed optimizer under a pipeline, else it or ZeRO-3; three recompute modes."""
    n = 0
    for tp in (1, 2, 4, 8, 16):
        for pp in range(1, layers + 1):
            if heads % tp or layers % pp or gpus % (tp * pp) or tp > 2 * per_node:
                continue
            dp = gpus // (tp * pp)
            if batch % dp:
                continue
            m = batch // dp
            schedules = 1 + (sum(1 for v in (2, 3) if layers % (pp * v) == 0 and m % pp == 0)
                             if pp > 1 else 0)
            n += schedules * (1 if pp > 1 else 2) * 3
    return n


# ---- q144: ZeRO-3 alone against ZeRO-1 + full recompute on A100s ----------------------------
def a100_layout(zero, recompute):
    return Layout(dp=8, tp=4, pp=2, global_batch=48, sequence_parallel=True,
                  recompute=recompute, zero=zero, fp32_grads=False)


ST108 = {k: plan(LLAMA, a100_layout(*k), A100) for k in ((3, "none"), (1, "full"),
                                                         (3, "selective"))}
# the first stage's parameters on a tp rank: 40 layers (matrices / 4, the norms whole) and the
# vocab-parallel embedding
PSI_R108 = 40 * ((LLAMA_LAYER - 2 * H) // 4 + 2 * H) + V * H // 4

# ---- q145: 8k -> 32k ----------------------------------------------------------------------
LONG = dataclasses.replace(LLAMA, seq_len=32768)
ST109_8 = plan(LLAMA, megatron(8, 4, 12, 1152))
ST109_32 = plan(LONG, megatron(8, 4, 12, 288))  # the same tokens: 1152 / 4 sequences
ST109_FULL = plan(LONG, megatron(8, 4, 12, 288, recompute="full"))
ST109_CP = plan(LONG, megatron(8, 4, 6, 288, cp=2))

# ---- q146: strong scaling at a fixed batch --------------------------------------------------
ST110 = {k: plan(LLAMA, megatron(8, p, g // (8 * p), 480))
         for k, g, p in (("from", 256, 16), ("to", 1536, 16), ("fix", 1536, 4))}

# ---- q147: the checkpoint -------------------------------------------------------------------
CKPT = PSI_LLAMA * (2 + 4 + 4 + 4)  # bf16 weights; float32 master, m and v
ONE_S, SHARD_S, MTBF = CKPT / 2.5e9, CKPT / 120e9, 41 * 3600  # 64 nodes x 2.5 GB/s > 120


def young(delta):
    tau = math.sqrt(2 * delta * MTBF)
    return tau, delta / tau + tau / (2 * MTBF)


# ---- q148: resharding a tiny GPT's ZeRO-1 checkpoint ----------------------------------------
TINY = bank.bank_design.TINY
Vt, St, Ht, Lt = TINY.vocab_size, TINY.seq_len, TINY.hidden, TINY.num_layers
PSI_TINY = Vt * Ht + St * Ht + Lt * (12 * Ht * Ht + 13 * Ht) + 2 * Ht + Vt * Ht
# one tp half of each flat unit: split matrices (and column-parallel biases) halved, the
# replicated tensors (positions, LayerNorms, row-parallel biases) whole
ROOT_HALF = Vt * Ht // 2 + St * Ht + 2 * Ht + Vt * Ht // 2
BLOCK_HALF = (2 * Ht + (3 * Ht * Ht + 3 * Ht) // 2 + Ht * Ht // 2 + Ht + 2 * Ht
              + (4 * Ht * Ht + 4 * Ht) // 2 + 4 * Ht * Ht // 2 + Ht)


def shard_of(n, dp):
    return -(-n // dp)  # a flat unit padded to a multiple of dp, cut in dp


SHARD112 = 3 * (shard_of(ROOT_HALF, 4) + Lt * shard_of(BLOCK_HALF, 4))  # param, m, v


@pytest.fixture(scope="module")
def tiny_single_device():
    """Two AdamW steps of the tiny GPT on one device, on q148's batches: the second loss."""
    data = [bank.bank_design.tiny_batch(36, k) for k in (0, 1)]
    with mp.device():
        model = GPT(TINY)
        opt = AdamW(model.parameters(), lr=3e-3)
        losses = []
        for ids, tgt in data:
            losses.append(model.loss_and_grad(ids, tgt))
            opt.step()
            opt.zero_grad()
    return losses


# ---- q149: the batch, and Adam's first step -------------------------------------------------
def first_grad_norm(n):
    ids, tgt = bank.bank_design.tiny_batch(12, 0)
    with mp.device():
        model = GPT(TINY)
        model.loss_and_grad(ids[:, :n], tgt[:, :n])
        return math.sqrt(sum(float(np.sum(p.grad ** 2)) for p in model.parameters()))


NORM_RATIO = first_grad_norm(12) / first_grad_norm(6)

# ---- q150: the 70B GPT of incident A --------------------------------------------------------
M70 = bank.bank_design.M70
T16 = Layout(tp=16, pp=4, dp=4, global_batch=512, sequence_parallel=True,
             distributed_optimizer=True)
T8 = dataclasses.replace(T16, tp=8, dp=8)
S16, S8 = (step_time(M70, t, H100, dropout=False).seconds for t in (T16, T8))


def with_inter(bw):
    cluster = dataclasses.replace(H100, inter=Link("IB", bw, H100.inter.latency))
    return step_time(M70, T16, cluster, dropout=False)


# ---- q153: a straggler on the peak clock ----------------------------------------------------
T_STEP = 1.5e12 / PEAK
AR_2MIB = 2 * 5 * NV_A + 2 * 5 / 6 * 2 * 2**20 / NV_B  # ring of 6 on NVLink

EXPECTED = {
    "q143": dict(gpus=512, batch=1536, cands=candidate_count(512, 1536),
                 fit=lambda v: 10 < v < VALUES["q143"]["cands"],
                 cap_gib=80e9 / GIB, best="tp 4 × dp 128, ZeRO-3, selective recompute",
                 best_s=ST107.seconds,
                 best_mfu=ST107.model_flops / (ST107.seconds * 512 * PEAK),
                 best_peak_gib=MEM107.peak / GIB,
                 z3_raw_s=ST107.communication["zero3"], z3_exposed_s=ST107.terms["zero3"],
                 compute_s=sum(ST107.terms[k] for k in ("matmul", "attention", "elementwise",
                                                        "recompute")),
                 second="tp 4 × pp 4 × dp 32, 1F1B, the distributed optimizer, selective "
                        "recompute",
                 second_more=ST2_107.seconds / ST107.seconds - 1,
                 second_bubble=ST2_107.terms["pipeline"] / ST2_107.seconds,
                 second_peak_gib=MEM2_107.peak / GIB, rank88="11th", t88_s=ST88_107.seconds,
                 t88_more=ST88_107.seconds / ST107.seconds - 1),
    "q144": dict(dp=8, tp=4, pp=2, m=6, cap_gib=80e9 / GIB, held=2, layers=40,
                 z3_states_gib=16 * PSI_R108 / 8 / GIB,
                 z3_acts_gib=lambda v: v > 80e9 / GIB,
                 z3_peak_gib=ST108[3, "none"][1].peak / GIB,
                 z1f_states_gib=(4 * PSI_R108 + 12 * PSI_R108 / 8) / GIB,
                 z1f_acts_gib=2 * 40 * 2 * 8192 * 8192 / 4 / GIB,  # 2 in flight, 2sbh/t bytes
                 z1f_peak_gib=ST108[1, "full"][1].peak / GIB,
                 z1f_s=ST108[1, "full"][0].seconds, z1f_mfu=ST108[1, "full"][0].mfu,
                 z3s_peak_gib=ST108[3, "selective"][1].peak / GIB,
                 z3s_s=ST108[3, "selective"][0].seconds,
                 z3s_mfu=ST108[3, "selective"][0].mfu,
                 z1f_more=ST108[1, "full"][0].seconds / ST108[3, "selective"][0].seconds - 1),
    "q145": dict(gpus=384, tp=8, pp=4, batch=1152, s_to=32768, cp=2,
                 tokens_m=1152 * 8192 / 1e6, b_to=288, cp_dp=6, m32=288 // 12, cp_m=288 // 6,
                 peak8=ST109_8[1].peak / GIB, peak32=ST109_32[1].peak / GIB,
                 full_peak=ST109_FULL[1].peak / GIB, full_s=ST109_FULL[0].seconds,
                 sel_s=ST109_32[0].seconds, cp_peak=ST109_CP[1].peak / GIB,
                 cp_s=ST109_CP[0].seconds, bub32=ST109_32[0].bubble_fraction,
                 cp_bub=ST109_CP[0].bubble_fraction,
                 attn8_s=ST109_8[0].terms["attention"],
                 attn32_s=ST109_CP[0].terms["attention"], step8_s=ST109_8[0].seconds),
    "q146": dict(batch=480, tp=8, pp=16, gpus_from=256, gpus_to=1536, pp_fix=4, ideal=6,
                 dp_from=2, dp_to=12, dp_fix=48, m_from=240, m_to=40, m_fix=10,
                 from_s=ST110["from"][0].seconds, to_s=ST110["to"][0].seconds,
                 fix_s=ST110["fix"][0].seconds,
                 speedup=ST110["from"][0].seconds / ST110["to"][0].seconds,
                 mfu_from=ST110["from"][0].mfu, mfu_to=ST110["to"][0].mfu,
                 mfu_fix=ST110["fix"][0].mfu, bub_from=ST110["from"][0].bubble_fraction,
                 bub_to=ST110["to"][0].bubble_fraction,
                 bub_fix=ST110["fix"][0].bubble_fraction,
                 fix_peak_gib=ST110["fix"][1].peak / GIB),
    "q147": dict(gpus=512, node_write_gbs=2.5, fs_gbs=120, mtbf_h=41,
                 psi_b=PSI_LLAMA / 1e9, saved_b=14, held_b=18, ckpt_gb=CKPT / GB,
                 per_gpu_gb=CKPT / 512 / GB, one_min=ONE_S / 60, nodes=64, rate_gbs=120,
                 shard_s=SHARD_S, young_one_min=young(ONE_S)[0] / 60,
                 lost_one=young(ONE_S)[1], young_shard_min=young(SHARD_S)[0] / 60,
                 lost_shard=young(SHARD_S)[1]),
    "q148": dict(dp_from=4, dp_to=3, tp=2, batch=36, files=8, shard=SHARD112,
                 params=PSI_TINY, world_to=6, per_from=9, per_to=12,
                 loss=lambda v: 2 < v < 4, loss_diff=lambda v: 0 <= v < 1e-12,
                 max_diff=lambda v: 0 <= v < 1e-12),
    "q149": dict(gpus_from=8, gpus_to=64, per_gpu=3, s=4096, lr=3e-4, sim_batch=6,
                 sim_steps=4, sim_lr=3e-3, sim_batch2=12, batch_from=24, batch_to=192,
                 tokens_from_m=24 * 4096 / 1e6, tokens_to_m=192 * 4096 / 1e6,
                 lr_linear=3e-4 * 8, lr_sqrt=3e-4 * math.sqrt(8),
                 # Adam's first step: lr · g / (|g| + eps) < lr, within eps/|g| of it
                 step_small=lambda v: 3e-3 * (1 - 1e-6) < v < 3e-3,
                 step_big=lambda v: 3e-3 * (1 - 1e-6) < v < 3e-3,
                 norm_ratio=NORM_RATIO, same_diff=lambda v: 0 <= v < 1e-12),
    "q150": dict(gpus=256, batch=512, slower=8, tp8_s=S8, tp16_s=S16, ratio=S16 / S8,
                 target_s=8 * S8, ib_gbs=50,
                 bw_gbs=lambda v: with_inter(v * GB * 1.001).seconds < 8 * S8
                 < with_inter(v * GB * 0.999).seconds,
                 bw_factor=lambda v: v == pytest.approx(IB_B / (VALUES["q150"]["bw_gbs"] * GB)),
                 node_gbit=lambda v: v == pytest.approx(VALUES["q150"]["bw_gbs"] * 8 * 8),
                 tp_share=lambda v: v == pytest.approx(
                     (lambda st: st.terms["tp"] / st.seconds)(
                         with_inter(VALUES["q150"]["bw_gbs"] * GB)), rel=1e-6)),
    "q151": dict(world=6, save_every=3, timeout_s=0.1, save_s=0.4,
                 waiting=5,  # every rank but the saver
                 call=3, wait_step=4,  # the first collective after the save: step 4's
                 absent="0", where="write_checkpoint_alone"),
    "q152": dict(world=7, steps=6, rank=3, skip_step=2,
                 hang=5, hang_step=6,  # the others' last call: rank 3 has one call fewer
                 finished="3", wrong=6 - 2, first_wrong=2,  # steps 2 .. 5, paired off by one
                 swap_wrong=7,  # each sum mixes one wrong term, on every rank
                 caught="CollectiveMismatchError"),
    "q153": dict(world=6, slow_rank=5, slowdown=1.3, onset=3, steps=4, tflop=1.5, grad_mib=2,
                 before_ms=(T_STEP + AR_2MIB) * 1e3, after_ms=(1.3 * T_STEP + AR_2MIB) * 1e3,
                 slower_pct=(1.3 * T_STEP + AR_2MIB) / (T_STEP + AR_2MIB) - 1, found=5,
                 wait_ms=0.3 * T_STEP * 1e3, own_ms=0.0),
}
INHERENT = {
    "q144": [{"pp", "held"}],  # 1F1B's first rank holds min(p, m) = p micro-batches
    "q147": [{"fs_gbs", "rate_gbs"}],  # 64 nodes would write faster than the file system
    "q149": [{"sim_lr", "step_small", "step_big"}],  # the point: Adam's step is lr
    "q151": [{"save_every", "call"}],  # the first call after the save is call #save_every
    "q152": [{"skip_step", "first_wrong"}, {"world", "swap_wrong"},
             {"steps", "hang_step"}],  # the point: caught at the last step, not the skip
    "q153": [{"slow_rank", "found"}],  # the point: the trace finds the throttled rank
}


# ---- the part's shape --------------------------------------------------------------------
def test_ten_to_twelve_design_questions_numbered_after_the_last_lesson():
    assert 10 <= len(DESIGN) <= 12
    last = max(int(q.id[1:]) for q in bank.QUESTIONS if q.lesson != "design")
    assert [q.id for q in DESIGN] == [f"q{i}" for i in range(last + 1, last + 1 + len(DESIGN))]
    assert bank.QUESTIONS[-len(DESIGN):] == DESIGN, "the design questions come last"
    assert list(bank.LESSONS)[-1] == "design" and bank.lesson_key("Design") == "design"
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
def test_the_searchs_ranking_is_the_step_times_of_every_layout_that_fits():
    """q143 by brute force: every candidate that fits (rank_memory), ranked by step_time;
    the first two are the layouts written out above, TP 8 x PP 8 first appears 11th."""
    timed = []
    for lay in candidates(LLAMA, 512, H100, 1536):
        try:
            mem = rank_memory(LLAMA, lay, H100, dropout=False)
        except ValueError:
            continue
        if mem.fits:
            timed.append((step_time(LLAMA, lay, H100, dropout=False).seconds, mem.peak, lay))
    timed.sort(key=lambda t: t[:2])
    assert len(timed) == VALUES["q143"]["fit"]
    assert timed[0][2] == BEST107 and timed[1][2] == SECOND107
    first88 = next(i for i, t in enumerate(timed) if t[2].tp == 8 and t[2].pp == 8)
    assert timed[first88][2] == T88_107 and first88 + 1 == 11
    assert not MEM107.peak > 0.9 * MEM107.capacity and MEM2_107.peak > 0.9 * MEM2_107.capacity


def test_zero3_alone_does_not_fit_and_the_other_two_do():
    z3, z1f, z3s = (ST108[k][1] for k in ((3, "none"), (1, "full"), (3, "selective")))
    assert not z3.fits and z1f.fits and z3s.fits
    assert ST108[3, "selective"][0].seconds < ST108[1, "full"][0].seconds


def test_longer_sequences_need_context_parallelism_or_full_recompute():
    assert ST109_8[1].fits and not ST109_32[1].fits
    assert ST109_FULL[1].fits and ST109_CP[1].fits
    assert ST109_CP[0].seconds < ST109_FULL[0].seconds < ST109_32[0].seconds * 1.2
    # attention's s²: four times the work a token at four times the length, whatever cp
    assert 3.5 < ST109_CP[0].terms["attention"] / ST109_8[0].terms["attention"] < 4.5


def test_strong_scaling_loses_to_the_bubble_and_fewer_stages_win_some_back():
    v = VALUES["q146"]
    for tag in ("from", "to"):
        p, m = 16, v[f"m_{tag}"]
        assert v[f"bub_{tag}"] >= (p - 1) / m  # the dry run's bubble: at least (p - 1)/m
    assert v["speedup"] < 0.8 * v["ideal"] and v["mfu_to"] < v["mfu_from"] - 0.05
    assert v["fix_s"] < v["to_s"] and v["bub_fix"] < v["bub_to"]
    assert ST110["fix"][1].fits


def test_the_resharded_run_is_the_single_device_run(tiny_single_device):
    """q148: the second step's loss at dp 4 and, resumed from the save, at dp 3, is one
    device's second loss on the same 36 sequences (float64)."""
    assert VALUES["q148"]["loss"] == pytest.approx(tiny_single_device[1], abs=1e-12)


def test_the_bisections_bandwidth_is_a_degraded_fabric_not_a_congested_tp_group():
    v = VALUES["q150"]
    assert v["ratio"] < 2 and 1 < v["bw_gbs"] < 5  # far below NDR's 50 GB/s a GPU
    assert with_inter(IB_B).seconds == pytest.approx(S16)


# ---- the command ----------------------------------------------------------------------------
def test_the_lesson_option_prints_the_design_questions_only(capsys):
    assert bank.main(["--lesson", "design"]) == 0
    out = capsys.readouterr().out
    assert "=== Open design and debugging questions (" in out and "=== Lesson" not in out
    shown = {q.id for q in bank.QUESTIONS if f"\n{q.id}  " in out}
    assert shown == set(BY_ID)
    flat = " ".join(out.split())
    for q in DESIGN:
        assert " ".join(q.render(VALUES[q.id])[1].split()) in flat, q.id
    assert bank.main(["--lesson", "Design", "--quiz"]) == 0
    quiz = capsys.readouterr().out
    assert "A:" not in quiz and all(f"{q.id}  " in quiz for q in DESIGN)
