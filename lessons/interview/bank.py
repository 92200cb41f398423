"""Interview questions on lessons 00-13, and open design and debugging questions, each
answered with numbers minipar computes.

    python lessons/interview/bank.py                 every question, with its answer
    python lessons/interview/bank.py --lesson 03     the questions on lesson 03
    python lessons/interview/bank.py --lesson design the open design and debugging questions
    python lessons/interview/bank.py --id q21        one question
    python lessons/interview/bank.py --quiz          the questions alone, to answer first

Each entry of QUESTIONS holds the example data (`given`), the question and a short answer,
both format strings, and `compute`, which takes the example data and returns the numbers
the answer shows: from minipar's planning formulas (minipar.plan), its cost model
(minipar.runtime.cost), the pipeline schedules and their dry run (minipar.parallel.pp),
and small runs on simulated devices (minipar.launch). Nothing in an answer is typed in by
hand: change the example data and every number follows. Lessons 06 to 13 keep their
questions in bank_06.py ... bank_13.py beside this file, and the open design and debugging
questions ("pick TP/PP/DP for 70B on 512 GPUs", "NCCL timeout at step 10k", ...), answered
with the planner's search and runs on simulated devices, are in bank_design.py; all are
loaded below, and the command and QUESTIONS hold them all.

The example data are deliberately uneven (13B on 24 GPUs, 96 MiB over 6 ranks, s = 3000,
b = 5, t = 4, ...) so that an answer cannot come out right by a lucky coincidence of two
different formulas.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import math
import re
import textwrap
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional

import numpy as np

import minipar as mp
from minipar.programs.incidents import pipeline_bubble, tp_across_nodes, zero3_recompute
from minipar.nn import GPT, GPTConfig
from minipar.parallel import zero_engine
from minipar.parallel.pp import (SEND_B, SEND_F, Action, Kind, PipelineRunner, ScheduleError,
                                 build_stages, dry_run, lower, message, placement, schedule,
                                 split_layers)
from minipar.parallel.tp.sequence import SequenceParallelGrads
from minipar.parallel.tp.gpt import TensorParallelGPT
from minipar.plan import (activation_bytes_per_layer, dp_comm_elements, flat_padding,
                          model_flops, model_flops_full_recompute, model_state_bytes,
                          segments_activation_bytes, selective_recompute_extra_flops,
                          zero_figure1)
from minipar.runtime.cost import (algbw, busbw, bytes_sent, collective_cost, p2p_time,
                                  ring_all_reduce_time)
from minipar.runtime.device import DeviceSpec
from minipar.runtime.errors import DeadlockError
from minipar.runtime.reference import all_gather_ref, all_reduce_ref, reduce_scatter_ref
from minipar.runtime.topology import Link, Topology

GB = 10**9  # decimal gigabytes, as the ZeRO paper and GPU datasheets count
MB = 10**6
KiB, MiB = 2**10, 2**20
US, MS = 1e-6, 1e-3

LESSONS = {"00": "The memory wall", "01": "Collectives", "02": "Data parallelism",
           "03": "ZeRO and FSDP", "04": "Tensor and sequence parallelism",
           "05": "Pipeline parallelism", "06": "Zero-bubble pipelines and DualPipe",
           "07": "3-D composition and topology",
           "08": "Mixture of experts and expert parallelism", "09": "Context parallelism",
           "10": "Planning a run", "11": "Mixed precision", "12": "Activation recomputation",
           "13": "Checkpoints, faults and hangs",
           "design": "Open design and debugging questions"}


@dataclass(frozen=True)
class Question:
    """One entry: `question` formats with `given`; `answer` with given + compute(**given)."""

    id: str
    lesson: str
    given: dict
    question: str
    answer: str
    compute: Callable[..., dict] = field(repr=False)

    def values(self) -> dict:
        """The example data and every number the answer shows."""
        return {**self.given, **self.compute(**self.given)}

    def render(self, values: Optional[dict] = None) -> tuple[str, str]:
        """(question, answer) with the placeholders filled in."""
        v = self.values() if values is None else values
        return self.question.format(**self.given), self.answer.format(**v)


# ---- small helpers ----------------------------------------------------------------------
def states_gb(psi: float, stage: int, n: int) -> float:
    """Model-state bytes per rank at a ZeRO stage, in GB."""
    return model_state_bytes(psi, stage, n)["total"] / GB


def block_parameters(h: int, vocab: int = 16) -> int:
    """12h^2 + 13h: the parameters of one transformer block (a GPT with one layer more)."""
    one, two = (GPTConfig(vocab_size=vocab, seq_len=1, hidden=h, num_heads=1, num_layers=k)
                for k in (1, 2))
    return two.num_parameters() - one.num_parameters()


def comm_events(ctx, start: int) -> list:
    """This rank's communication events recorded since trace position `start`."""
    return [e for e in ctx.trace.events[start:] if e.stream == "comm"]


@contextlib.contextmanager
def without_sp_grad_all_reduce():
    """Sequence parallelism with its LayerNorm/bias gradient all-reduce removed: each rank
    keeps the partial gradient of its own sequence shard (the bug, for one run only)."""
    original = SequenceParallelGrads.flush

    def flush_locally(self):
        for param, g in self.pending:
            param.accumulate(g)
        self.pending.clear()

    SequenceParallelGrads.flush = flush_locally
    try:
        yield
    finally:
        SequenceParallelGrads.flush = original


# ---- runs on simulated devices (each runs once; several questions read the results) ----
@functools.lru_cache(maxsize=None)
def ring_run(n: int, kib: int) -> dict:
    """An all-reduce, and a reduce-scatter followed by an all-gather, of `kib` KiB of
    float32 per rank over n ranks, with rank- and index-dependent data."""

    def program(ctx):
        x = (np.arange(kib * KiB // 4) % 97 + 1.0 + 7.0 * ctx.rank ** 2).astype(np.float32)
        start = len(ctx.trace.events)
        ar = mp.all_reduce(x)
        rs = mp.reduce_scatter(x)
        ag = mp.all_gather(rs)
        sent = {e.name: e.meta["sent_bytes"] for e in comm_events(ctx, start)}
        return sent, float(np.max(np.abs(ag - ar)))

    res = mp.launch(program, n)
    if any(r[0] != res[0][0] for r in res):
        raise RuntimeError(f"ranks of one ring sent different bytes: {[r[0] for r in res]}")
    return {"sent": res[0][0], "max_diff": max(r[1] for r in res)}


TINY_DP = GPTConfig(vocab_size=18, seq_len=6, hidden=12, num_heads=3, num_layers=3,
                    dtype="bfloat16", seed=3)


@functools.lru_cache(maxsize=None)
def zero_stage_run(n: int) -> dict:
    """One training step of TINY_DP at each ZeRO stage on n ranks: rank 0's collectives,
    split into those issued before the first backward hook (forward) and after."""
    cfg = TINY_DP
    rng = np.random.default_rng(5)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, n))  # [s, n]: one sequence a rank
    tgt = rng.integers(0, cfg.vocab_size, (cfg.seq_len, n))
    out = {}
    for stage in range(4):
        def program(ctx, stage=stage):
            model = GPT(cfg)
            mark = {}
            model.hooks.register("backward_pre", lambda unit: mark.setdefault(
                "backward", len(ctx.trace.events)))  # registered before the engine's hooks
            engine = zero_engine(model, stage=stage, lr=1e-3)
            start = len(ctx.trace.events)
            model.loss_and_grad(ids[:, ctx.rank:ctx.rank + 1], tgt[:, ctx.rank:ctx.rank + 1])
            engine.step()
            engine.zero_grad()
            ctx.resolve_pending()
            forward = [e.name for e in ctx.trace.events[start:mark["backward"]]
                       if e.stream == "comm"]
            rest = [e.name for e in comm_events(ctx, mark["backward"])]
            return forward, rest, sum(e.meta["sent_bytes"] for e in comm_events(ctx, start))

        out[stage] = mp.launch(program, n)[0]
    with mp.device():
        units = len(GPT(cfg).units())
    return {"stages": out, "units": units}


TINY_TP = GPTConfig(vocab_size=28, seq_len=12, hidden=16, num_heads=4, num_layers=3,
                    dtype="bfloat16", seed=7)
TINY_TP_BATCH = 2


@functools.lru_cache(maxsize=None)
def tp_comm_run(t: int, sequence_parallel: bool) -> dict:
    """Rank 0's collectives in one forward and backward of TINY_TP over t ranks:
    (name, bytes) per event, per phase, and the bytes sent inside block 0 per phase."""
    cfg = TINY_TP
    rng = np.random.default_rng(11)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_TP_BATCH))  # [s, b]
    tgt = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_TP_BATCH))

    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"),
                                  sequence_parallel=sequence_parallel)
        marks = {}
        for ev in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
            model.hooks.register(ev, lambda unit, ev=ev: marks.__setitem__(
                (ev, unit), len(ctx.trace.events)))
        n0 = len(ctx.trace.events)
        loss, cache = model.forward(ids, tgt)
        n1 = len(ctx.trace.events)
        model.backward(cache)

        def events(lo, hi=None):
            return [(e.name, e.nbytes) for e in ctx.trace.events[lo:hi] if e.stream == "comm"]

        def block_sent(phase):
            lo, hi = marks[(f"{phase}_pre", "blocks.0")], marks[(f"{phase}_post", "blocks.0")]
            return sum(e.meta["sent_bytes"] for e in ctx.trace.events[lo:hi]
                       if e.stream == "comm")

        return {"forward": events(n0, n1), "backward": events(n1),
                "block_forward_sent": block_sent("forward"),
                "block_backward_sent": block_sent("backward")}

    return mp.launch(program, t)[0]


TINY_SP = GPTConfig(vocab_size=28, seq_len=12, hidden=16, num_heads=4, num_layers=2,
                    dropout=0.1, seed=4)  # float64: differences come from the bug alone


@functools.lru_cache(maxsize=None)
def sp_grad_run(t: int) -> dict:
    """TINY_SP under tp = t with sequence parallelism, with and without the LayerNorm and
    bias gradient all-reduce, against one device."""
    cfg = TINY_SP
    rng = np.random.default_rng(2)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, 2))  # [s, b]
    tgt = rng.integers(0, cfg.vocab_size, (cfg.seq_len, 2))
    with mp.device():
        ref = GPT(cfg)
        loss0 = ref.loss_and_grad(ids, tgt)
        g0 = {p.name: p.grad.copy() for p in ref.parameters()}

    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"), sequence_parallel=True)
        loss = model.loss_and_grad(ids, tgt)
        tagged = sorted(p.name for p in model.parameters()
                        if getattr(p, "sequence_parallel", False))
        return loss, model.full_parameters(grad=True), tagged

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    right = mp.launch(program, t)
    with without_sp_grad_all_reduce():
        wrong = mp.launch(program, t)
    tagged = right[0][2]
    others = [name for name in g0 if name not in tagged]

    def errors(res, names):
        return [rel(r[1][name], g0[name]) for r in res for name in names]

    partial_sum = sum(r[1]["ln_f.weight"] for r in wrong)
    gaps = [float(np.linalg.norm(wrong[i][1][name] - wrong[j][1][name]) / np.linalg.norm(g0[name]))
            for name in tagged for i in range(t) for j in range(i + 1, t)]
    return {
        "tagged": len(tagged), "others": len(others),
        "loss_err": max(abs(r[0] - loss0) / loss0 for r in wrong),
        "with_max": max(errors(right, tagged)),
        "without_min": min(errors(wrong, tagged)), "without_max": max(errors(wrong, tagged)),
        "others_max": max(errors(wrong, others)),
        "replica_gap": min(gaps),  # any two ranks' copies, relative to the true gradient
        "partial_sum_err": rel(partial_sum, g0["ln_f.weight"]),
    }


TINY_ACC = GPTConfig(vocab_size=23, seq_len=7, hidden=12, num_heads=3, num_layers=2, seed=9)


@functools.lru_cache(maxsize=None)
def accumulation_run(k: int, micro: int) -> dict:
    """One device: the full batch's gradient against k accumulated micro-batch gradients,
    each loss scaled by 1/k, and not scaled."""
    cfg = TINY_ACC
    rng = np.random.default_rng(4)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, k * micro))  # [s, k*micro]
    tgt = rng.integers(0, cfg.vocab_size, (cfg.seq_len, k * micro))

    def grads(scale: Optional[float]) -> np.ndarray:
        with mp.device():
            model = GPT(cfg)
            if scale is None:
                model.loss_and_grad(ids, tgt)
            else:
                for i in range(k):
                    part = slice(i * micro, (i + 1) * micro)
                    model.loss_and_grad(ids[:, part], tgt[:, part], loss_scale=scale)
            return np.concatenate([p.grad.reshape(-1) for p in model.parameters()])

    full, scaled, summed = grads(None), grads(1.0 / k), grads(1.0)
    return {"err_scaled": float(np.linalg.norm(scaled - full) / np.linalg.norm(full)),
            "ratio_unscaled": float(np.linalg.norm(summed) / np.linalg.norm(full))}


@functools.lru_cache(maxsize=None)
def no_sync_run(n: int, k: int) -> dict:
    """DDP on n ranks, k micro-batches a step: all-reduces and bytes with no_sync() on the
    first k-1 micro-batches, and without it."""
    cfg = TINY_DP
    rng = np.random.default_rng(6)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, n * k))  # [s, n*k]
    out = {}
    for quiet in (True, False):
        def program(ctx, quiet=quiet):
            model = GPT(cfg)
            engine = zero_engine(model, stage=0, lr=1e-3)
            start = len(ctx.trace.events)
            for i in range(k):
                col = slice(ctx.rank * k + i, ctx.rank * k + i + 1)
                use = engine.no_sync() if quiet and i < k - 1 else contextlib.nullcontext()
                with use:
                    model.loss_and_grad(ids[:, col], np.roll(ids[:, col], -1, axis=0),
                                        loss_scale=1.0 / k)
            engine.step()
            events = comm_events(ctx, start)
            return (sum(e.name == "all_reduce" for e in events),
                    sum(e.meta["sent_bytes"] for e in events))

        out[quiet] = mp.launch(program, n)[0]
    return {"with": out[True], "without": out[False]}


@functools.lru_cache(maxsize=None)
def incident_c_run(layers: int) -> dict:
    """Incident C on a `layers`-block model: the largest rank's peak bytes (total, and
    activations) for ZeRO-2, ZeRO-3 with the host running ahead, ZeRO-3 with
    limit_all_gathers, and both fixes (the limit and checkpoint segments of 2)."""
    cfg = zero3_recompute.MODEL.with_(num_layers=layers)
    table = zero3_recompute.scenarios(cfg)
    peaks = {key: zero3_recompute.measure(table[key][1], table[key][2])["peak"]
             for key in ("zero2", "zero3", "zero3_limit", "zero3_both")}
    return {"peaks": {k: p["total"] for k, p in peaks.items()},
            "activations": {k: p["activations"] for k, p in peaks.items()},
            "dp": zero3_recompute.DP}


# ---- lesson 00: the memory wall -------------------------------------------------------
def q01(psi_b, n, gpu_gb):
    """16 bytes a parameter (2 + 2 + 12), all of them on every DDP rank."""
    one = model_state_bytes(1, stage=0, dp=1)  # bytes for a single parameter
    m = model_state_bytes(psi_b * 1e9, stage=0, dp=n)
    return {"w_pp": one["parameters"], "g_pp": one["gradients"],
            "o_pp": one["optimizer_states"], "bytes_pp": one["total"],
            "weights_gb": m["parameters"] / GB, "grads_gb": m["gradients"] / GB,
            "optim_gb": m["optimizer_states"] / GB, "total_gb": m["total"] / GB,
            "x_gpu": m["total"] / (gpu_gb * GB)}


def q02(psi_b, claimed_tb, gpu_gb):
    """16 bytes a parameter for 671B against the quoted 2.7 TB."""
    m = model_state_bytes(psi_b * 1e9, stage=0, dp=1)
    return {"bytes_pp": m["total"] / (psi_b * 1e9), "total_tb": m["total"] / 1e12,
            "under": m["total"] / (claimed_tb * 1e12), "adam_tb": m["optimizer_states"] / 1e12,
            "adam_share": m["optimizer_states"] / m["total"],
            "wg_tb": (m["parameters"] + m["gradients"]) / 1e12,
            "claimed_bpp": claimed_tb * 1e12 / (psi_b * 1e9),
            "gpus": math.ceil(m["total"] / (gpu_gb * GB))}


def q03(s, b, h, a, layers):
    """sbh(34 + 5as/h) bytes per layer, split into its linear and attention terms."""
    sbh = s * b * h
    full = activation_bytes_per_layer(s, b, h, a)
    selective = activation_bytes_per_layer(s, b, h, a, recompute="selective")
    return {"sbh_m": sbh / 1e6, "linear_coeff": selective / sbh,
            "attn_coeff": (full - selective) / sbh, "per_layer_gb": full / GB,
            "total_gb": full * layers / GB, "attn_share": (full - selective) / full}


def korthikanti_selective_pct(B, s, l, h, V):
    """Korthikanti et al.'s count of selective recomputation: the step's attention term
    72Bslh^2 s/(6h) = 12Bs^2hl once more, over the model FLOPs, in %."""
    return 100 * 72 * B * s * l * h**2 * (s / (6 * h)) / model_flops(B, s, l, h, V)


def q04(s, b, h, a, layers, vocab):
    """Activations kept with selective (34sbh) and full (2sbh) recomputation; the extra
    FLOPs of selective recomputation in three conventions, and of full recomputation."""
    per = {r: activation_bytes_per_layer(s, b, h, a, recompute=r)
           for r in ("none", "selective", "full")}
    f = model_flops(b, s, layers, h, vocab)
    qk = selective_recompute_extra_flops(b, s, layers, h)  # one Q K^T a layer, 2Bs^2h
    return {"none_gb": per["none"] * layers / GB, "sel_gb": per["selective"] * layers / GB,
            "full_gb": per["full"] * layers / GB, "layer_gb": per["none"] / GB,
            "full_peak_gb": ((layers - 1) * per["full"] + per["none"]) / GB,
            "sel_flops_pct": 100 * qk / f,
            "core_flops_pct": 100 * 2 * qk / f,  # Q K^T and P V: 4Bs^2h a layer
            "paper_flops_pct": korthikanti_selective_pct(b, s, layers, h, vocab),
            "gpt3_pct": korthikanti_selective_pct(1, 2048, 96, 12288, 51200),
            "full_flops_pct": 100 * (model_flops_full_recompute(b, s, layers, h, vocab) / f - 1)}


def q05(psi_b, n):
    """ZeRO's Figure 1: the four stages' bytes for 7.5B on 64 ranks, and the paper's labels."""
    exact = {stage: states_gb(psi_b * 1e9, stage, n) for stage in range(4)}
    paper = [row["label"] for row in zero_figure1()]
    return {"ddp_gb": exact[0], "z1_gb": exact[1], "z2_gb": exact[2], "z3_gb": exact[3],
            "labels": ", ".join(paper), "z3_label": paper[3]}


def min_ranks(psi: float, stage: int, capacity: float, limit: int = 100_000) -> Optional[int]:
    """The fewest ranks whose model states fit in `capacity` bytes (None: no number does)."""
    if model_state_bytes(psi, stage, limit)["total"] > capacity:
        return None
    return next(n for n in range(1, limit + 1)
                if model_state_bytes(psi, stage, n)["total"] <= capacity)


def q06(psi_b, gpu_gb):
    """The fewest ranks whose model states fit in one GPU, per stage."""
    psi, cap = psi_b * 1e9, gpu_gb * GB
    mins = {stage: min_ranks(psi, stage, cap) for stage in range(4)}
    z1, z3 = states_gb(psi, 1, mins[1]), states_gb(psi, 3, mins[3])
    z1_states = model_state_bytes(psi, 1, mins[1])  # weights and gradients stay whole
    return {"ddp_gb": states_gb(psi, 0, 1), "ddp_min": "never" if mins[0] is None else mins[0],
            "z1_min": mins[1], "z2_min": mins[2], "z3_min": mins[3],
            "z1_floor_gb": (z1_states["parameters"] + z1_states["gradients"]) / GB,
            "z1_at_min_gb": z1, "z3_at_min_gb": z3,
            "z1_left_gb": gpu_gb - z1, "z3_left_gb": gpu_gb - z3}


def q07(psi_b, s, b, h, a, layers):
    """The seed's 2·S·L·P activation estimate against sbh(34 + 5as/h) per layer."""
    wrong = 2 * s * layers * psi_b * 1e9
    real = activation_bytes_per_layer(s, b, h, a) * layers
    return {"wrong_pb": wrong / 1e15, "real_gb": real / GB, "factor": wrong / real}


# ---- lesson 01: collectives -----------------------------------------------------------
def q08(x0, x1, x2):
    """all_reduce, reduce_scatter and all_gather on three small blocks (the reference)."""
    blocks = [np.array(x, dtype=np.int64) for x in (x0, x1, x2)]
    ar = all_reduce_ref(blocks)[0]
    rs = reduce_scatter_ref(blocks)
    ag = all_gather_ref(rs)[0]
    as_list = lambda v: [int(e) for e in v]
    return {"ar": as_list(ar), "rs0": as_list(rs[0]), "rs1": as_list(rs[1]),
            "rs2": as_list(rs[2]), "ag": as_list(ag)}


def q09(s_mib, n, sim_kib):
    """2(n-1)/n · S bytes per rank, analytically and from a simulated trace."""
    S = s_mib * MiB
    sent = bytes_sent("all_reduce", "ring", S, n, me=0)
    run = ring_run(n, sim_kib)
    return {"sent_mib": sent / MiB, "sent_bytes": round(sent), "all_ranks_mib": n * sent / MiB,
            "naive_mib": (n - 1) * S / MiB, "ratio": sent / S,
            "ratio_1024": bytes_sent("all_reduce", "ring", S, 1024, me=0) / S,
            "sim_sent_kib": run["sent"]["all_reduce"] / KiB}


def q10(s_mib, n, sim_kib):
    """Reduce-scatter (n-1)/n · S + all-gather (n-1)/n · S = the ring all-reduce."""
    S = s_mib * MiB
    run = ring_run(n, sim_kib)
    return {"steps": 2 * (n - 1), "chunk_mib": S / n / MiB,
            "rs_mib": bytes_sent("reduce_scatter", "ring", S, n, me=0) / MiB,
            "ag_mib": bytes_sent("all_gather", "ring", S, n, me=0) / MiB,
            "ar_mib": bytes_sent("all_reduce", "ring", S, n, me=0) / MiB,
            "sim_rs_kib": run["sent"]["reduce_scatter"] / KiB,
            "sim_ag_kib": run["sent"]["all_gather"] / KiB,
            "sim_ar_kib": run["sent"]["all_reduce"] / KiB, "max_diff": run["max_diff"]}


def all_reduce_in_and_across(S: float, n: int):
    """(cost on one node of n GPUs over NVLink, cost over n nodes of one GPU on IB)."""
    inside = collective_cost("all_reduce", S, range(n), Topology.single_node(n))
    across = collective_cost("all_reduce", S, range(n), Topology.nodes(n, gpus_per_node=1))
    return inside, across


def q11(s_mib, n):
    """2(n-1)a + 2(n-1)/n · S/B on NVLink 4 and on InfiniBand NDR."""
    S = s_mib * MiB
    nv, ib = Link.nvlink4(), Link.infiniband_ndr()
    inside, across = all_reduce_in_and_across(S, n)
    return {"nv_gbps": nv.bandwidth / GB, "nv_alpha_us": nv.latency / US,
            "ib_gbps": ib.bandwidth / GB, "ib_alpha_us": ib.latency / US,
            "nv_lat_us": ring_all_reduce_time(0, n, nv) / US,
            "nv_us": inside.seconds / US,
            "ib_lat_us": ring_all_reduce_time(0, n, ib) / US,
            "ib_us": across.seconds / US,
            "ratio": across.seconds / inside.seconds}


def q12(s_mib, n):
    """algbw = S/t and busbw = algbw · 2(n-1)/n for both links."""
    S = s_mib * MiB
    inside, across = all_reduce_in_and_across(S, n)
    return {"nv_algbw": algbw(S, inside.seconds) / GB,
            "nv_busbw": busbw("all_reduce", S, inside.seconds, n) / GB,
            "ib_algbw": algbw(S, across.seconds) / GB,
            "ib_busbw": busbw("all_reduce", S, across.seconds, n) / GB,
            "factor": busbw("all_reduce", S, 1.0, n) / algbw(S, 1.0),
            "nv_gbps": Link.nvlink4().bandwidth / GB,
            "ib_gbps": Link.infiniband_ndr().bandwidth / GB}


def q13(n, small_kib):
    """The size S = n a B at which latency and bandwidth terms are equal."""
    nv, ib = Link.nvlink4(), Link.infiniband_ndr()
    # the latency term 2(n-1)a equals the bandwidth term 2(n-1)/n * S/B at S = n a B
    cross = {link.name: n * link.latency * link.bandwidth for link in (nv, ib)}
    for link in (nv, ib):  # at that size the two terms are equal: the time is twice the latency
        assert math.isclose(ring_all_reduce_time(cross[link.name], n, link),
                            2 * ring_all_reduce_time(0, n, link))
    S = small_kib * KiB
    t = ring_all_reduce_time(S, n, nv)
    return {"nv_cross_mb": cross[nv.name] / MB, "ib_cross_mb": cross[ib.name] / MB,
            "small_us": t / US, "small_lat_share": ring_all_reduce_time(0, n, nv) / t}


# ---- lesson 02: data parallelism ------------------------------------------------------
def ddp_costs(psi: float, nodes: int, per_node: int, nbytes: Optional[float] = None):
    """(flat ring, hierarchical) cost of DDP's all-reduce of bf16 gradients (or `nbytes`)."""
    topo = Topology.nodes(nodes, per_node)
    S = 2 * psi if nbytes is None else nbytes
    ranks = range(topo.world_size)
    return (collective_cost("all_reduce", S, ranks, topo, algorithm="ring"),
            collective_cost("all_reduce", S, ranks, topo))


def q14(psi_b, nodes, per_node):
    """DDP's gradient all-reduce: bytes, flat ring and hierarchical time."""
    psi = psi_b * 1e9
    n = Topology.nodes(nodes, per_node).world_size
    ring, hier = ddp_costs(psi, nodes, per_node)
    return {"n": n, "grad_gb": 2 * psi / GB, "sent_gb": 2 * dp_comm_elements(psi, 0, n) / GB,
            "ring_ms": ring.seconds / MS, "ring_link": ring.link, "hier_ms": hier.seconds / MS,
            "speedup": ring.seconds / hier.seconds,
            "ib_gb": bytes_sent("all_reduce", "ring", 2 * psi / per_node, nodes, me=0) / GB}


def q15(psi_b, nodes, per_node, bucket_mib, h):
    """Buckets of bucket_mib MiB: how many, their extra latency, one tiny all-reduce."""
    psi = psi_b * 1e9
    S, cap = 2 * psi, bucket_mib * MiB
    full, rest = divmod(S, cap)
    sizes = [cap] * int(full) + ([rest] if rest else [])
    _, whole = ddp_costs(psi, nodes, per_node)
    buckets = sum(ddp_costs(psi, nodes, per_node, nbytes=size)[1].seconds for size in sizes)
    _, ln = ddp_costs(psi, nodes, per_node, nbytes=2 * h)
    _, empty = ddp_costs(psi, nodes, per_node, nbytes=0)
    return {"n_buckets": len(sizes), "last_mb": sizes[-1] / MB, "whole_ms": whole.seconds / MS,
            "buckets_ms": buckets / MS, "extra_ms": (buckets - whole.seconds) / MS,
            "ln_bytes": 2 * h, "ln_us": ln.seconds / US,
            "ln_lat_share": empty.seconds / ln.seconds}


def q16(psi_b, nodes, per_node, b, s, h, layers, vocab):
    """Backward time (2/3 of 72 B s l h^2 (...) at peak) against the all-reduce."""
    flops = model_flops(b, s, layers, h, vocab)
    peak = DeviceSpec.h100_sxm().peak("bfloat16")
    backward = (2 / 3) * flops / peak  # backward = twice the forward: 2/3 of the step
    ring, hier = ddp_costs(psi_b * 1e9, nodes, per_node)
    return {"tflop": flops / 1e12, "peak_tflops": peak / 1e12, "step_ms": flops / peak / MS,
            "backward_ms": backward / MS, "ring_ms": ring.seconds / MS,
            "hier_ms": hier.seconds / MS, "exposed_ms": (ring.seconds - backward) / MS,
            "slack_ms": (backward - hier.seconds) / MS}


def q17(k, micro):
    """Accumulated gradients with and without the 1/k loss scale (measured)."""
    run = accumulation_run(k, micro)
    return {"batch": k * micro, **run}


def q18(psi_b, n, k, sim_ranks, sim_k):
    """Bytes per step with and without no_sync() (analytic and measured)."""
    per_sync = 2 * dp_comm_elements(psi_b * 1e9, 0, n) / GB  # bf16 bytes of one all-reduce
    run = no_sync_run(sim_ranks, sim_k)
    return {"with_gb": per_sync, "without_gb": k * per_sync, "saved_gb": (k - 1) * per_sync,
            "sim_with_ar": run["with"][0], "sim_without_ar": run["without"][0],
            "sim_ratio": run["without"][1] / run["with"][1]}


# ---- lesson 03: ZeRO and FSDP ---------------------------------------------------------
def q19(psi_b, n):
    """ZeRO-2's 2Ψ + 2Ψ/N + 12Ψ/N, and the other stages."""
    psi = psi_b * 1e9
    z2 = model_state_bytes(psi, 2, n)
    return {"params_gb": z2["parameters"] / GB, "grads_gb": z2["gradients"] / GB,
            "optim_gb": z2["optimizer_states"] / GB, "z2_gb": z2["total"] / GB,
            "ddp_gb": states_gb(psi, 0, n), "z1_gb": states_gb(psi, 1, n),
            "z3_gb": states_gb(psi, 3, n), "w_share": z2["parameters"] / z2["total"]}


def q20(sim_ranks):
    """The collectives each stage issues in one step, counted in the trace."""
    run = zero_stage_run(sim_ranks)
    st = run["stages"]
    count = lambda names, kind: sum(name == kind for name in names)
    return {"units": run["units"], "blocks": TINY_DP.num_layers,
            "ddp_ar": count(st[0][1], "all_reduce"), "ddp_fwd": len(st[0][0]),
            "z1_rs": count(st[1][1], "reduce_scatter"), "z1_ag": count(st[1][1], "all_gather"),
            "z2_rs": count(st[2][1], "reduce_scatter"), "z2_ag": count(st[2][1], "all_gather"),
            "z3_ag_fwd": count(st[3][0], "all_gather"),
            "z3_ag_bwd": count(st[3][1], "all_gather"),
            "z3_rs": count(st[3][1], "reduce_scatter")}


def q21(psi_b, n, sim_ranks):
    """2Ψ(N-1)/N for DDP and ZeRO-1/2, 3Ψ(N-1)/N for ZeRO-3 (analytic and measured)."""
    psi = psi_b * 1e9
    st = zero_stage_run(sim_ranks)["stages"]
    ddp, z3 = 2 * dp_comm_elements(psi, 0, n), 2 * dp_comm_elements(psi, 3, n)  # bf16 bytes
    return {"ddp_gb": ddp / GB, "z12_gb": 2 * dp_comm_elements(psi, 1, n) / GB,
            "z3_gb": z3 / GB, "ratio": z3 / ddp,
            "sim_ddp": round(st[0][2]), "sim_z12": round(st[1][2]), "sim_z3": round(st[3][2]),
            "sim_ratio": st[3][2] / st[0][2]}


def q22(h, layers, n, tiny_n):
    """(-Ψ) mod N padding of one block, and what padding costs a tiny buffer."""
    block = block_parameters(h)
    pad = flat_padding(block, n)
    tiny_ddp = model_state_bytes(1, 0, tiny_n)["total"]  # one parameter, no padding
    tiny_z1 = model_state_bytes(1, 1, tiny_n, padding=flat_padding(1, tiny_n))["total"]
    extra = model_state_bytes(block, 3, n, padding=pad)["total"] \
        - model_state_bytes(block, 3, n)["total"]  # bytes a rank holds for one unit's padding
    return {"block": block, "pad": pad, "extra_bytes": extra * layers,
            "share": pad / block,
            "tiny_z1": int(tiny_z1), "tiny_extra": int(tiny_z1 - tiny_ddp)}


def q23(psi_b, nodes, per_node):
    """FSDP's strategies as ZeRO stages; InfiniBand bytes of HYBRID_SHARD and FULL_SHARD."""
    psi = psi_b * 1e9
    n = Topology.nodes(nodes, per_node).world_size
    shard_bytes = 2 * psi / per_node  # bf16 bytes of one node-level shard
    return {"n": n, "full_gb": states_gb(psi, 3, n), "grad_op_gb": states_gb(psi, 2, n),
            "no_shard_gb": states_gb(psi, 0, n), "hybrid_gb": states_gb(psi, 3, per_node),
            # HYBRID: only the gradient shard's all-reduce crosses nodes;
            # FULL_SHARD (hierarchical): 3 gathers/scatters, each crossing with 1/m of S
            "hybrid_ib_gb": bytes_sent("all_reduce", "ring", shard_bytes, nodes, me=0) / GB,
            "full_ib_gb": 3 * bytes_sent("all_gather", "ring", shard_bytes, nodes, me=0) / GB}


def q24(psi_b, n, s, b, h, a, layers, sim_layers):
    """ZeRO-3 with every block gathered, or two, against ZeRO-2 (analytic and measured);
    checkpoint segments of 2 layers against per-layer checkpoints."""
    psi = psi_b * 1e9
    block = block_parameters(h)
    z3 = states_gb(psi, 3, n)
    run = incident_c_run(sim_layers)
    peaks, act = run["peaks"], run["activations"]
    kept = activation_bytes_per_layer(s, b, h, a, recompute="full")  # I = 2sbh
    flash = activation_bytes_per_layer(s, b, h, a, recompute="selective")  # no s^2 terms
    scores = activation_bytes_per_layer(s, b, h, a)  # the attention scores kept too
    blocks = {(A, k): segments_activation_bytes(layers, k, A, kept) / GB
              for A in (flash, scores) for k in (1, 2)}
    return {"z2_gb": states_gb(psi, 2, n), "z3_gb": z3,
            "runahead_gb": z3 + 2 * psi / GB, "limit_gb": z3 + 2 * 2 * block / GB,
            "excess_gb": z3 + 2 * psi / GB - states_gb(psi, 2, n),
            "sim_dp": run["dp"], "sim_z3_pct": 100 * (peaks["zero3"] / peaks["zero2"] - 1),
            "sim_limit_pct": 100 * (1 - peaks["zero3_limit"] / peaks["zero2"]),
            "sim_both_pct": 100 * (1 - peaks["zero3_both"] / peaks["zero2"]),
            "sim_seg_extra": act["zero3_both"] - act["zero3_limit"],
            "half_gb": (layers - len(range(0, layers, 2))) * kept / GB, "rerun_gb": flash / GB,
            "per_flash_gb": blocks[flash, 1], "seg_flash_gb": blocks[flash, 2],
            "per_scores_gb": blocks[scores, 1], "seg_scores_gb": blocks[scores, 2],
            "thr_flash": 2 * flash / kept, "thr_scores": 2 * scores / kept}


# ---- lesson 04: tensor and sequence parallelism ---------------------------------------
def layer_compute_seconds(s, b, h, t) -> float:
    """One layer's forward and backward matmuls on one of t GPUs at the bf16 peak."""
    return model_flops(b, s, 1, h, 0) / t / DeviceSpec.h100_sxm().peak("bfloat16")


def q25(s, b, h, t, layers, sim_t):
    """Four all-reduces of [s, b, h] per layer: bytes, and a count from the trace."""
    S = s * b * h * 2  # bf16 [s, b, h]
    sent = bytes_sent("all_reduce", "ring", S, t, me=0)
    run = tp_comm_run(sim_t, False)
    sbh = TINY_TP.seq_len * TINY_TP_BATCH * TINY_TP.hidden * 2  # bf16 bytes of its [s, b, h]
    count = lambda phase: sum(1 for name, nb in run[phase] if name == "all_reduce" and nb == sbh)
    return {"ar_mb": S / MB, "sent_mb": sent / MB, "layer_mb": 4 * sent / MB,
            "model_gb": 4 * sent * layers / GB, "sim_layers": TINY_TP.num_layers,
            "sim_fwd": count("forward"), "sim_bwd": count("backward"),
            # minus the embedding's g (forward) and the head's f (backward)
            "fwd_per_layer": (count("forward") - 1) / TINY_TP.num_layers,
            "bwd_per_layer": (count("backward") - 1) / TINY_TP.num_layers}


def q26(s, b, h, t):
    """The four all-reduces on NVLink against the layer's matmuls at peak."""
    S = s * b * h * 2
    ar = collective_cost("all_reduce", S, range(t), Topology.single_node(8)).seconds
    compute = layer_compute_seconds(s, b, h, t)
    return {"ar_us": ar / US, "comm_ms": 4 * ar / MS, "compute_ms": compute / MS,
            "share": 4 * ar / compute}


def q27(s, b, h, t):
    """The same all-reduces with the tp group spread over nodes."""
    S = s * b * h * 2
    inside = collective_cost("all_reduce", S, range(t), Topology.single_node(8))
    spread = Topology.nodes(t, 8)  # one GPU of the tp group on each of t nodes
    across = collective_cost("all_reduce", S, [8 * i for i in range(t)], spread)
    compute = layer_compute_seconds(s, b, h, t)
    return {"in_us": inside.seconds / US, "across_us": across.seconds / US,
            "across_algorithm": across.algorithm, "ratio": across.seconds / inside.seconds,
            "across_layer_ms": 4 * across.seconds / MS, "compute_ms": compute / MS,
            "busy_in": compute / (compute + 4 * inside.seconds),
            "busy_across": compute / (compute + 4 * across.seconds)}


def q28(s, b, h, layers):
    """Incident A at scale: TP = 8 in a node against TP = 16 over four nodes."""
    r = tp_across_nodes.at_scale(Topology.nodes(2, 8), hidden=h, seq_len=s, micro_batch=b,
                                 layers=layers)["rows"]
    keys = {"in": "tp8_in_node", "hier": "tp16_hierarchical", "ring": "tp16_ring"}
    out = {}
    for short, key in keys.items():
        out[f"{short}_ar_us"] = r[key]["all_reduce_seconds"] / US
        out[f"{short}_busy"] = r[key]["busy"]
        out[f"{short}_step_ms"] = r[key]["model_comm_seconds"] / MS
        out[f"{short}_label"] = r[key]["label"]
    out["in_tp"] = r["tp8_in_node"]["tp"]
    return out


def q29(s, b, h, a, t):
    """Table 2: sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh(34/t + 5as/(ht))."""
    per = {"one": activation_bytes_per_layer(s, b, h, a),
           "tp": activation_bytes_per_layer(s, b, h, a, tp=t),
           "sp": activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True)}
    return {"one_gb": per["one"] / GB, "tp_gb": per["tp"] / GB, "sp_gb": per["sp"] / GB,
            "tp_saving": per["one"] / per["tp"], "sp_saving": per["one"] / per["sp"],
            "sp_saved_mb": (per["tp"] - per["sp"]) / MB,
            # tp - sp = U (1 - 1/t): U, what tensor parallelism leaves whole between blocks
            "between_mb": (per["tp"] - per["sp"]) * t / (t - 1) / MB}


def q30(s, b, vocab, t, sim_t):
    """Three [s, b] all-reduces against the full [s, b, V] logits."""
    run = tp_comm_run(sim_t, False)
    sb = TINY_TP.seq_len * TINY_TP_BATCH * 4  # float32 bytes of the tiny model's [s, b]
    return {"full_gb": s * b * vocab * 4 / GB, "shard_gb": s * b * vocab // t * 4 / GB,
            "ce_kb": 3 * s * b * 4 / 1e3,
            "sim_ce": sum(1 for name, nb in run["forward"] if name == "all_reduce" and nb == sb),
            "sim_ce_bwd": sum(1 for name, nb in run["backward"] if nb == sb)}


def q31(sim_t):
    """Sequence-parallel gradients with and without the all-reduce, against one device."""
    return sp_grad_run(sim_t)


def q32(s, b, h, t, sim_t):
    """Bytes per layer of TP and TP + SP, forward and backward (analytic and measured)."""
    S = s * b * h * 2
    ar = bytes_sent("all_reduce", "ring", S, t, me=0)
    ag = bytes_sent("all_gather", "ring", S, t, me=0)
    rs = bytes_sent("reduce_scatter", "ring", S, t, me=0)
    ln = bytes_sent("all_reduce", "ring", 6 * h * 2, t, me=0)  # 6h bf16 gradients
    tp, sp = tp_comm_run(sim_t, False), tp_comm_run(sim_t, True)
    return {"tp_fwd_mb": 2 * ar / MB, "sp_fwd_mb": 2 * (ag + rs) / MB,
            "tp_bwd_mb": 2 * ar / MB, "sp_bwd_mb": (4 * ag + 2 * rs) / MB,
            "ln_kb": ln / 1e3,
            "sim_tp_fwd": round(tp["block_forward_sent"]),
            "sim_sp_fwd": round(sp["block_forward_sent"]),
            "sim_tp_bwd": round(tp["block_backward_sent"]),
            "sim_sp_bwd": round(sp["block_backward_sent"])}


# ---- lesson 05: pipeline parallelism --------------------------------------------------
def pp_durations(t_f, t_b, v: int = 1) -> dict:
    """{"F": t_F/v, "B": t_B/v}: each rank's stage cut into v chunks (exact Fractions)."""
    if v == 1:
        return {"F": t_f, "B": t_b}
    return {"F": Fraction(t_f) / v, "B": Fraction(t_b) / v}


@functools.lru_cache(maxsize=None)
def lowered(name: str, p: int, m: int, v: int = 1) -> list:
    """lower(schedule(...)), built once (the lists are read, never changed)."""
    return lower(schedule(name, p, m, v))


def pp_clock(name: str, p: int, m: int, t_f, t_b, v: int = 1, p2p=0):
    """The dry run of schedule `name` on p ranks, m micro-batches, v chunks, equal stages."""
    return dry_run(lowered(name, p, m, v), pp_durations(t_f, t_b, v), p2p)


def layer_bytes(s, b, h, a) -> float:
    """34 sbh: what one layer keeps of a micro-batch with the attention core recomputed."""
    return activation_bytes_per_layer(s, b, h, a, recompute="selective")


def stage_layers(layers: int, p: int) -> list[int]:
    """The block count of each stage, as minipar splits them (split_layers)."""
    return [hi - lo for lo, hi in split_layers(layers, p)]


def forwards_first(row) -> int:
    """How many forwards a rank runs before its first backward."""
    return next(i for i, a in enumerate(row) if a.kind == Kind.B)


def torch_1f1b(p: int, m: int) -> list:
    """torch.distributed.pipelining's Schedule1F1B, restated: rank r runs min(m, p - r)
    forwards ("warm-up"), then a backward and a forward alternately while forwards
    remain, then the remaining backwards."""
    ranks = []
    for r in range(p):
        warm = min(m, p - r)
        row, f = [Action(r, Kind.F, i) for i in range(warm)], warm
        for i in range(m):
            row.append(Action(r, Kind.B, i))
            if f < m:
                row.append(Action(r, Kind.F, f))
                f += 1
        ranks.append(row)
    return ranks


def literal_p_minus_r(p: int, m: int) -> list:
    """torch's warm-up count read into Megatron's loop: min(p - r, m) forwards, then
    F-then-B pairs, then the cool-down (one forward more before the first backward)."""
    ranks = []
    for r in range(p):
        w = min(p - r, m)
        row = [Action(r, Kind.F, i) for i in range(w)]
        for i in range(m - w):
            row += [Action(r, Kind.F, w + i), Action(r, Kind.B, i)]
        ranks.append(row + [Action(r, Kind.B, i) for i in range(m - w, m)])
    return ranks


def sends(lists) -> int:
    """The messages lowered lists send in one step (activations and gradients)."""
    return sum(a.kind in (SEND_F, SEND_B) for row in lists for a in row)


def pct_list(values) -> str:
    return ", ".join(f"{100 * float(x):.1f}%" for x in values)


def int_list(values) -> str:
    return ", ".join(str(int(x)) for x in values)


FREE_LINK = Link("free", 1e30, 0.0)  # messages cost nothing: the clock shows compute alone
SLOW = DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s: a FLOP count is a time


@functools.lru_cache(maxsize=None)
def send_modes_run(p: int, m: int, t_f_ms: float, t_b_ms: float) -> dict:
    """1F1B's lowered lists on p simulated devices, sends blocking or isend, under
    rendezvous and eager sends: where each rank stands when a run deadlocks, else when its
    clock ends. Messages are free, F and B take t_f_ms and t_b_ms."""
    lists = lowered("1f1b", p, m)
    where = placement(lists)
    flops = {"F": t_f_ms * MS * 1e9, "B": t_b_ms * MS * 1e9}  # at 1 GFLOP/s
    topology = Topology(1, p, SLOW, FREE_LINK, FREE_LINK)
    out = {}
    for blocking, mode in ((True, "rendezvous"), (True, "eager"), (False, "rendezvous")):
        at: dict = {}

        def program(ctx, blocking=blocking, at=at):
            pending = []
            for a in lists[ctx.rank]:
                at[ctx.rank] = str(a)
                if a.is_compute:
                    ctx.compute(flops[a.kind.value], dtype="float64")
                elif a.kind in (SEND_F, SEND_B):
                    msg, x = message(a, where), np.zeros(4)
                    if blocking:
                        mp.send(x, msg.dst, tag=msg.tag)
                    else:
                        pending.append(mp.isend(x, msg.dst, tag=msg.tag))
                else:
                    msg = message(a, where)
                    mp.irecv(msg.src, tag=msg.tag).wait()
            for work in pending:
                work.wait()
            at[ctx.rank] = "done"
            return ctx.clock.compute

        try:
            out[blocking, mode] = max(mp.launch(program, p, topology=topology, sends=mode))
        except DeadlockError:
            out[blocking, mode] = dict(sorted(at.items()))
    return out


TINY_PP = GPTConfig(vocab_size=19, seq_len=6, hidden=8, num_heads=2, num_layers=4,
                    tie_embeddings=True, seed=5)


@functools.lru_cache(maxsize=None)
def tied_run(p: int) -> list:
    """One 1F1B step of TINY_PP (tied embeddings) on p pipeline ranks: each rank's
    all-reduces in the step, (count, bytes)."""
    cfg = TINY_PP
    actions = schedule("1f1b", p, 3)
    rng = np.random.default_rng(8)
    ids, tgt = (rng.integers(0, cfg.vocab_size, (cfg.seq_len, 3)) for _ in range(2))  # [s, B]

    def program(ctx):
        runner = PipelineRunner(build_stages(GPT(cfg), placement(actions), ctx.rank), actions)
        runner.step(ids, tgt)
        reduces = [e for e in ctx.trace.events if e.stream == "comm" and e.name == "all_reduce"]
        return len(reduces), sum(e.nbytes for e in reduces)

    return list(mp.launch(program, p))


def q33(p, m, t_f_ms, t_b_ms, rule):
    """GPipe's step (m + p - 1)(t_F + t_B) and its bubble in both spellings, dry run."""
    d = pp_clock("gpipe", p, m, t_f_ms, t_b_ms)
    ruled = pp_clock("gpipe", p, rule * p, t_f_ms, t_b_ms)
    return {"step_ms": float(d.makespan), "busy_ms": float(d.busy[0]),
            "idle_ms": float(d.idle[0]), "over_ideal": float(d.bubble_over_ideal),
            "over_total": float(d.bubble_over_total), "m_rule": rule * p,
            "rule_share": float(ruled.bubble_over_total)}


def q34(p, m, t_f_ms, t_b_ms, s, b, h, a, layers):
    """GPipe against 1F1B: the same clock, m against min(p - r, m) micro-batches held."""
    g, f = (pp_clock(name, p, m, t_f_ms, t_b_ms) for name in ("gpipe", "1f1b"))
    per_stage = stage_layers(layers, p)[0]
    stage = per_stage * layer_bytes(s, b, h, a)  # one micro-batch through a stage
    return {"gpipe_ms": float(g.makespan), "f1b_ms": float(f.makespan),
            "layer_mb": layer_bytes(s, b, h, a) / MB, "per_stage": per_stage,
            "stage_gb": stage / GB, "gpipe_peak": g.peak_in_flight[0],
            "gpipe_gb": g.peak_in_flight[0] * stage / GB, "f1b_peaks": int_list(f.peak_in_flight),
            "f1b_first_gb": f.peak_in_flight[0] * stage / GB}


def q35(p, m, t_f_ms, t_b_ms, s, b, h, a, layers):
    """torch's warm-up min(m, p - r) and Megatron's min(p - r - 1, m): one list; the
    literal reading holds one micro-batch more."""
    mine, torch, literal = schedule("1f1b", p, m), torch_1f1b(p, m), literal_p_minus_r(p, m)
    if torch != mine:
        raise RuntimeError("torch's 1F1B order should be minipar's (Megatron's) list")
    dm, dl = (dry_run(lower(x), pp_durations(t_f_ms, t_b_ms)) for x in (mine, literal))
    stage = stage_layers(layers, p)[0] * layer_bytes(s, b, h, a)
    return {"first_f": forwards_first(mine[0]), "literal_first_f": forwards_first(literal[0]),
            "peaks": int_list(dm.peak_in_flight), "literal_peaks": int_list(dl.peak_in_flight),
            "extra_gb": (dl.peak_in_flight[0] - dm.peak_in_flight[0]) * stage / GB,
            "ranks_more": sum(x > y for x, y in zip(dl.peak_in_flight, dm.peak_in_flight)),
            "mine_ms": float(dm.makespan), "literal_ms": float(dl.makespan)}


def q36(p, m_bad, m, v, t_f_ms, t_b_ms):
    """Interleaved 1F1B: the m % p rule, the bubble (p - 1)/(v m), v-fold messages, memory."""
    try:
        schedule("interleaved_1f1b", p, m_bad, v)
        fix = "accepted"
    except ScheduleError as err:
        fix = re.search(r"use microbatches = (.+?),", str(err)).group(1)
    one, inter = pp_clock("1f1b", p, m, t_f_ms, t_b_ms), \
        pp_clock("interleaved_1f1b", p, m, t_f_ms, t_b_ms, v)
    msgs = {k: sends(lowered(name, p, m, c))
            for k, name, c in (("one", "1f1b", 1), ("inter", "interleaved_1f1b", v))}
    return {"fix": fix, "f1b_ms": float(one.makespan), "inter_ms": float(inter.makespan),
            "f1b_bubble": float(one.bubble_over_ideal),
            "inter_bubble": float(inter.bubble_over_ideal),
            "f1b_msgs": msgs["one"], "inter_msgs": msgs["inter"],
            "msg_ratio": msgs["inter"] / msgs["one"], "f1b_peak": one.peak_in_flight[0],
            "inter_pairs": inter.peak_in_flight[0],
            "inter_peak": float(inter.peak_activations[0]),
            "mem_factor": float(inter.peak_activations[0] / one.peak_activations[0])}


def q37(p, m_seed, m_fix, mfu_seed_pct, mfu_fix_pct, mfu_stage_pct):
    """Incident B: the dry run at p = 64 for m = 4, 32 and the least m that allows 51 %."""
    floor = pipeline_bubble.needed_m(p, mfu_fix_pct / 100, 1.0)
    real = pipeline_bubble.needed_m(p, mfu_fix_pct / 100, mfu_stage_pct / 100)
    runs = {k: pp_clock("1f1b", p, mm, 1, 2) for k, mm in (("seed", m_seed), ("fix", m_fix))}
    bound = {k: 1 - float(d.bubble_over_total) for k, d in runs.items()}
    bound["floor"] = pipeline_bubble.formulas(p, floor)["mfu_bound"]  # a 1 s dry run spared
    return {"seed_over": float(runs["seed"].bubble_over_ideal),
            "seed_share": float(runs["seed"].bubble_over_total), "seed_bound": bound["seed"],
            "fix_over": float(runs["fix"].bubble_over_ideal),
            "fix_share": float(runs["fix"].bubble_over_total), "fix_bound": bound["fix"],
            "implied_seed": mfu_seed_pct / 100 / bound["seed"],
            "implied_fix": mfu_fix_pct / 100 / bound["fix"],
            "floor_m": floor, "floor_bound": bound["floor"], "real_m": real,
            "fix_peak": runs["fix"].peak_in_flight[0],
            "floor_peak": pipeline_bubble.formulas(p, floor)["peak_rank0"]}


def q38(s, b, h, layers, p, m, t):
    """A stage boundary's two messages of [s, b, h] against the stage's compute and
    against tensor parallelism's all-reduces over the same layers; GPipe's clock with them."""
    S = s * b * h * 2  # bf16 [s, b, h]
    ib = p2p_time(S, Link.infiniband_ndr())
    nv = p2p_time(S, Link.nvlink4())
    k = stage_layers(layers, p)[0]
    compute = model_flops(b, s, k, h, 0) / DeviceSpec.h100_sxm().peak("bfloat16")
    d0 = pp_clock("gpipe", p, m, compute / 3, 2 * compute / 3)
    d1 = pp_clock("gpipe", p, m, compute / 3, 2 * compute / 3, p2p=ib)
    ars = 4 * k  # two all-reduces forward and two backward per layer
    tp_nv = collective_cost("all_reduce", S, range(t), Topology.single_node(t)).seconds
    tp_ib = collective_cost("all_reduce", S, [8 * i for i in range(t)],
                            Topology.nodes(t, 8)).seconds  # one GPU of the group per node
    tp_bytes = ars * bytes_sent("all_reduce", "ring", S, t, me=0)
    return {"msg_mb": S / MB, "ib_ms": ib / MS, "nv_us": nv / US, "per_stage": k,
            "compute_ms": compute / MS, "pp_share": 2 * ib / compute,
            "step0_ms": d0.makespan / MS, "step_ms": d1.makespan / MS,
            "extra_ms": (d1.makespan - d0.makespan) / MS, "ars": ars,
            "tp_gb": tp_bytes / GB, "tp_ratio": tp_bytes / (2 * S),
            "tp_nv_ms": ars * tp_nv / MS, "tp_ib_ms": ars * tp_ib / MS,
            "tp_compute_ms": compute / t / MS}


def q39(s, b, h, layers, vocab, p, m):
    """Balancing the head: GPipe's clock for the even split and for the best last stage."""
    peak = DeviceSpec.h100_sxm().peak("bfloat16")
    t_layer = model_flops(b, s, 1, h, 0) / peak
    t_head = (model_flops(b, s, layers, h, vocab) - model_flops(b, s, layers, h, 0)) / peak

    def step(counts):
        T = [c * t_layer + (t_head if i == len(counts) - 1 else 0) for i, c in enumerate(counts)]
        d = dry_run(lowered("gpipe", p, m), {"F": [x / 3 for x in T],
                                             "B": [2 * x / 3 for x in T]})
        return d.makespan, T

    even = stage_layers(layers, p)
    tries = [stage_layers(layers - k, p - 1) + [k] for k in range(even[-1], 0, -1)]
    # the first minimum (to the microsecond): the fewest layers moved
    best = min(tries, key=lambda c: round(step(c)[0] / US))
    (even_s, even_T), (best_s, best_T) = step(even), step(best)
    return {"layer_ms": t_layer / MS, "head_ms": t_head / MS, "head_layers": t_head / t_layer,
            "even": int_list(even), "even_last_ms": even_T[-1] / MS,
            "even_other_ms": even_T[0] / MS, "even_step_ms": even_s / MS,
            "best": int_list(best), "best_max_ms": max(best_T) / MS,
            "best_step_ms": best_s / MS, "speedup": even_s / best_s}


def q40(global_batch, dp, b, b_small, p, s, h, a, layers):
    """m = B/(dp · b): the bubble against the micro-batch size; 1F1B's memory against m."""
    out = {}
    for key, mb in (("1", b), ("2", b_small)):
        m = global_batch // (dp * mb)
        d = pp_clock("1f1b", p, m, 1, 2)
        stage = stage_layers(layers, p)[0] * layer_bytes(s, mb, h, a)
        out.update({f"m{key}": m, f"over{key}": float(d.bubble_over_ideal),
                    f"share{key}": float(d.bubble_over_total),
                    f"f1b_gb{key}": d.peak_in_flight[0] * stage / GB,
                    f"msgs{key}": sends(lowered("1f1b", p, m))})
    g = pp_clock("gpipe", p, out["m1"], 1, 2)  # all m micro-batches: B/dp sequences
    out["gpipe_gb"] = g.peak_in_flight[0] * stage_layers(layers, p)[0] * layer_bytes(
        s, b, h, a) / GB
    return out


def q41(p, m, t_f_ms, t_b_ms):
    """Blocking sends under rendezvous deadlock 1F1B; eager sends or isend finish."""
    run = send_modes_run(p, m, t_f_ms, t_b_ms)
    stuck = run[True, "rendezvous"]
    if not isinstance(stuck, dict):
        raise RuntimeError("1F1B with blocking rendezvous sends should deadlock")
    return {"stuck": "; ".join(f"rank {r} at {a}" for r, a in stuck.items()),
            "eager_ms": run[True, "eager"] / MS, "isend_ms": run[False, "rendezvous"] / MS}


def q42(vocab, h, p, sim_p):
    """Tied embeddings: the [V, h] gradient all-reduced by the first and last stages."""
    S = vocab * h * 4  # fp32 gradients (Megatron accumulates bf16 runs' grads in fp32)
    topo = Topology.nodes(p, 8)  # one stage per node
    ar = collective_cost("all_reduce", S, [0, 8 * (p - 1)], topo)
    run = tied_run(sim_p)
    return {"params_m": vocab * h / 1e6, "grad_gb": S / GB, "ar_ms": ar.seconds / MS,
            "algorithm": ar.algorithm,
            "copy_gb": model_state_bytes(vocab * h, 0, 1)["total"] / GB,
            "sim_counts": int_list(c for c, _ in run),
            "sim_bytes": max(nb for _, nb in run)}


def q43(p, ms):
    """The seed's two claims on 1F1B against the dry run of both schedules, m after m."""
    runs = {name: [pp_clock(name, p, m, 1, 2) for m in ms] for name in ("gpipe", "1f1b")}
    return {"gpipe_bubbles": pct_list(d.bubble_over_ideal for d in runs["gpipe"]),
            "f1b_bubbles": pct_list(d.bubble_over_ideal for d in runs["1f1b"]),
            "gpipe_peaks": int_list(d.peak_in_flight[0] for d in runs["gpipe"]),
            "f1b_peaks": int_list(d.peak_in_flight[0] for d in runs["1f1b"]),
            "f1b_last": int_list(d.peak_in_flight[-1] for d in runs["1f1b"])}


def q44(s, b, h, a, layers, m, ps, p_inter, m_inter, v1, v2):
    """Rank 0's activations under 1F1B for several p (always L layers of one micro-batch),
    and under interleaving (1 + (p - 1)/(p v) times that)."""
    per = layer_bytes(s, b, h, a)
    first = {p: pp_clock("1f1b", p, m, 1, 2).peak_in_flight[0] for p in ps}
    held = {first[p] * stage_layers(layers, p)[0] * per for p in ps}
    if len(held) != 1:
        raise RuntimeError(f"rank 0 should hold the same bytes at every p, got {held}")
    r0 = held.pop()
    inter = {}
    for v in (v1, v2):
        d = pp_clock("interleaved_1f1b", p_inter, m_inter, 1, 2, v)
        inter[v] = d.peak_in_flight[0] * stage_layers(layers, p_inter * v)[0] * per
    return {"first": int_list(first.values()),
            "per_stage": int_list(stage_layers(layers, p)[0] for p in ps),
            "r0_gb": r0 / GB, "whole_gb": layers * per / GB,
            "inter1_gb": inter[v1] / GB, "inter2_gb": inter[v2] / GB,
            "factor1": inter[v1] / r0, "factor2": inter[v2] / r0,
            "last_gb": stage_layers(layers, p_inter)[0] * per / GB}


# ---- the bank ---------------------------------------------------------------------------
SHAPE = dict(s=3000, b=5, h=5120, a=40)  # a 13B-class layer (h 5120, 40 heads), 42 of them
PP_MODEL = dict(s=2048, b=2, h=6144, a=64, layers=48)  # cut into p = 6 stages of 8 layers

QUESTIONS: list[Question] = [
    # -- lesson 00: the memory wall --
    Question(
        "q01", "00", dict(psi_b=13, n=24, gpu_gb=80),
        "A {psi_b}B-parameter model is trained with mixed-precision Adam under plain DDP on "
        "{n} GPUs of {gpu_gb} GB. How much memory do the model states take on each GPU?",
        "{bytes_pp:g} bytes per parameter: {w_pp:g} for the bf16 weight, {g_pp:g} for its bf16 "
        "gradient and {o_pp:g} for Adam's fp32 state (master weight, m and v). DDP replicates "
        "all of it, so the {n} GPUs divide nothing: each holds {weights_gb:.0f} GB of weights, "
        "{grads_gb:.0f} GB of gradients and {optim_gb:.0f} GB of optimizer states, "
        "{total_gb:.0f} GB in all, {x_gpu:.2f}x its {gpu_gb} GB before the first activation. "
        "No number of DDP replicas makes it fit: the states must be sharded (ZeRO) or the "
        "model split (tensor or pipeline parallelism).",
        q01),
    Question(
        "q02", "00", dict(psi_b=671, claimed_tb=2.7, gpu_gb=80),
        "An article says a dense {psi_b}B model needs about {claimed_tb} TB for its parameters "
        "and Adam states. Check the figure.",
        "It is {under:.2f}x too low. At {bytes_pp:g} bytes per parameter the model states are "
        "{total_tb:.2f} TB, {adam_tb:.2f} TB of them Adam's fp32 master weights and moments "
        "({adam_share:.0%}). {claimed_tb} TB is {claimed_bpp:.2f} bytes per parameter: the bf16 "
        "weights and gradients alone ({wg_tb:.2f} TB), with the optimizer forgotten. The states "
        "alone fill {gpus} GPUs of {gpu_gb} GB, before any activation.",
        q02),
    Question(
        "q03", "00", dict(**SHAPE, layers=42),
        "How much activation memory does one transformer layer keep for its backward with "
        "sequence length s = {s}, micro-batch b = {b}, hidden size h = {h} and a = {a} heads "
        "(bf16, dropout on, no recomputation)? And {layers} such layers?",
        "Korthikanti et al. (2022) count sbh(34 + 5as/h) bytes per layer, for 2-byte "
        "activations and 1-byte dropout masks. Here sbh = {sbh_m:.2f} M, the linear term is "
        "{linear_coeff:g} and the attention term 5as/h = {attn_coeff:.2f}, so one layer keeps "
        "{per_layer_gb:.2f} GB and {layers} layers {total_gb:.1f} GB for one micro-batch. The "
        "attention term (softmax output, its dropout mask and the dropped-out probabilities, "
        "s x s per head) is {attn_share:.1%} of it: it grows with s squared, the rest with s. "
        "None of it depends on the parameter count, and data parallelism does not divide it.",
        q03),
    Question(
        "q04", "00", dict(**SHAPE, layers=42, vocab=50304),
        "For a model of {layers} layers with s = {s}, b = {b}, h = {h}, a = {a} and a vocabulary "
        "of {vocab}: what do selective and full activation recomputation keep, and what do they "
        "cost in FLOPs?",
        "Without recomputation the layers keep {none_gb:.1f} GB. Selective recomputation drops "
        "only the attention core's s x s tensors and rebuilds them in the backward from the "
        "saved Q and K: 34sbh per layer, {sel_gb:.1f} GB. Its FLOPs depend on what is counted "
        "as rerun. This answer counts one QK^T per layer, 2Bs^2h, what minipar's selective "
        "mode reruns (the softmax and its dropout need nothing more, and P V's inputs are "
        "kept): {sel_flops_pct:.2f}% more FLOPs. Megatron-LM checkpoints the whole core "
        "attention, so it reruns P V too, 4Bs^2h: {core_flops_pct:.2f}%. Korthikanti et al.'s "
        "formula adds the step's whole attention term once more, s/(3h) in place of s/(6h): "
        "{paper_flops_pct:.2f}% (the convention behind the paper's {gpt3_pct:.1f}% for GPT-3 "
        "175B). Full recomputation keeps only each layer's input, 2sbh: {full_gb:.2f} GB, "
        "plus one layer's {layer_gb:.2f} GB while that layer is recomputed (a peak of "
        "{full_peak_gb:.2f} GB), and runs every layer's forward twice: {full_flops_pct:.1f}% "
        "more FLOPs. Selective is the better trade when the s-squared term dominates; full is "
        "for when even 34sbh per layer does not fit.",
        q04),
    Question(
        "q05", "00", dict(psi_b=7.5, n=64),
        "Reproduce Figure 1 of the ZeRO paper: model-state memory per GPU for a {psi_b}B model "
        "on {n} GPUs under DDP and ZeRO stages 1, 2 and 3 (mixed-precision Adam, K = 12).",
        "DDP (2 + 2 + K)Psi = {ddp_gb:.7g} GB; ZeRO-1 (P_os) 4Psi + K Psi/N = {z1_gb:.7g} GB; "
        "ZeRO-2 (P_os+g) 2Psi + (2 + K)Psi/N = {z2_gb:.7g} GB; ZeRO-3 (P_os+g+p) "
        "(2 + 2 + K)Psi/N = {z3_gb:.7g} GB. The paper prints {labels}, rounded to one decimal, so "
        "{z3_gb:.7g} appears as {z3_label}. The figure is from ZeRO (Rajbhandari et al., SC20); "
        "ZeRO-Infinity (2021) is a later paper that adds offloading to CPU and NVMe.",
        q05),
    Question(
        "q06", "00", dict(psi_b=13, gpu_gb=80),
        "On how few GPUs of {gpu_gb} GB do the model states of a {psi_b}B model fit, at each "
        "ZeRO stage?",
        "DDP: {ddp_min}, since every rank holds {ddp_gb:.0f} GB whatever N. ZeRO-1 keeps the "
        "weights and gradients whole ({z1_floor_gb:.0f} GB on every rank) and shards the rest: "
        "N >= {z1_min}. ZeRO-2: N >= {z2_min}. ZeRO-3: N >= {z3_min}. These are floors, not "
        "plans: at those sizes ZeRO-1 holds {z1_at_min_gb:.1f} GB and ZeRO-3 {z3_at_min_gb:.1f} "
        "GB of states, leaving {z1_left_gb:.1f} GB and {z3_left_gb:.1f} GB for activations, "
        "communication buffers and fragmentation.",
        q06),
    Question(
        "q07", "00", dict(psi_b=13, **SHAPE, layers=42),
        "A colleague estimates the activations of a {psi_b}B model ({layers} layers, h = {h}, "
        "a = {a}) at sequence length {s} as 2*S*L*P bytes. What does that give, and what is the "
        "real count for a micro-batch of {b}?",
        "2*S*L*P = {wrong_pb:.2f} PB, which cannot be right: it multiplies by the parameter "
        "count, but a layer saves tensors shaped by its tokens and hidden size, not by its "
        "weights. Counting what each layer saves, sbh(34 + 5as/h), gives {real_gb:.1f} GB for "
        "the whole model: the estimate is {factor:,.0f}x too large. Activations scale with "
        "s*b*h per layer (and with s squared through attention); the levers on them are "
        "recomputation and tensor/sequence parallelism, not sharding.",
        q07),
    # -- lesson 01: collectives --
    Question(
        "q08", "01", dict(x0=[3, 1, 4, 1, 5, 9], x1=[2, 7, 1, 8, 2, 8], x2=[5, 0, 9, 3, 6, 1]),
        "Three ranks hold x0 = {x0}, x1 = {x1} and x2 = {x2}. What does each rank get from "
        "all_reduce (sum), from reduce_scatter (sum), and from an all_gather of the "
        "reduce-scatter results?",
        "all_reduce gives every rank the elementwise sum, {ar}. reduce_scatter gives rank r "
        "only the r-th of n equal chunks of that sum: rank 0 {rs0}, rank 1 {rs1}, rank 2 {rs2}. "
        "all_gather concatenates the ranks' blocks in rank order, so gathering those chunks "
        "gives every rank {ag}: the all-reduce again. All-reduce = reduce-scatter + all-gather "
        "is how the ring algorithm is built, and how ZeRO splits DDP's all-reduce in two.",
        q08),
    Question(
        "q09", "01", dict(s_mib=96, n=6, sim_kib=36),
        "How many bytes does each rank send in a ring all-reduce of {s_mib} MiB over {n} ranks?",
        "2(n-1)/n * S = {sent_mib:g} MiB ({sent_bytes:,} bytes) per rank, {all_ranks_mib:g} MiB "
        "over all ranks: the reduce-scatter half sends n-1 chunks of S/n and the all-gather "
        "half another n-1. Each rank sends {ratio:.4f}x the buffer, a factor that tends to 2, "
        "not to n ({ratio_1024:.4f} at 1024 ranks): that is why the ring is bandwidth-optimal "
        "among host-driven algorithms, where exchanging whole buffers would cost (n-1)S = "
        "{naive_mib:g} MiB per rank. A switch that adds (NVLS on NVLink, SHARP on "
        "InfiniBand) does better: each GPU sends its buffer once, S = {s_mib} MiB. "
        "Measured: a simulated all-reduce of {sim_kib} KiB on {n} ranks records "
        "{sim_sent_kib:g} KiB sent by each rank in its trace.",
        q09),
    Question(
        "q10", "01", dict(s_mib=96, n=6, sim_kib=36),
        "Explain the ring all-reduce of {s_mib} MiB over {n} ranks as a reduce-scatter followed "
        "by an all-gather: how many steps, and how much does each move?",
        "Cut the buffer into n chunks of {chunk_mib:g} MiB. In the reduce-scatter each rank "
        "passes one chunk to its neighbour, which adds its own copy and passes it on; after "
        "n-1 steps rank r holds the complete sum of one chunk. The all-gather circulates the "
        "finished chunks for another n-1 steps. That is {steps} steps of {chunk_mib:g} MiB: "
        "{rs_mib:g} MiB for the reduce-scatter, {ag_mib:g} MiB for the all-gather, "
        "{ar_mib:g} MiB in all. Simulated with {sim_kib} KiB on {n} ranks: the reduce-scatter "
        "sends {sim_rs_kib:g} KiB, the all-gather {sim_ag_kib:g} KiB, the all-reduce "
        "{sim_ar_kib:g} KiB per rank, and all_gather(reduce_scatter(x)) differs from "
        "all_reduce(x) by {max_diff:g}.",
        q10),
    Question(
        "q11", "01", dict(s_mib=96, n=7),
        "Estimate with the alpha-beta model the time of an all-reduce of {s_mib} MiB over {n} "
        "GPUs, inside one node on NVLink 4 and across {n} nodes (one GPU each) on InfiniBand "
        "NDR.",
        "t = 2(n-1)a + 2(n-1)/n * S/B. NVLink 4 ({nv_gbps:g} GB/s a direction, "
        "a = {nv_alpha_us:g} us): {nv_lat_us:g} us of latency, {nv_us:.1f} us in all. "
        "InfiniBand NDR ({ib_gbps:g} GB/s a GPU, a = {ib_alpha_us:g} us): {ib_lat_us:g} us of "
        "latency, {ib_us:.0f} us in all, {ratio:.1f}x slower. At this size the bandwidth term "
        "dominates both, so the ratio is close to the links' bandwidth ratio.",
        q11),
    Question(
        "q12", "01", dict(s_mib=96, n=7),
        "nccl-tests reports algbw and busbw. What are they for an all-reduce of {s_mib} MiB over "
        "{n} GPUs on NVLink 4, and over {n} nodes on InfiniBand NDR? Why report busbw?",
        "algbw = S/t: {nv_algbw:.1f} GB/s on NVLink, {ib_algbw:.2f} GB/s on InfiniBand. "
        "busbw = algbw * 2(n-1)/n (= {factor:.4f} here): {nv_busbw:.1f} and {ib_busbw:.2f} "
        "GB/s. algbw falls as n grows, because each rank must move 2(n-1)/n of the buffer "
        "whatever the algorithm; busbw takes that factor out, so it compares with the link's "
        "own rate ({nv_gbps:g} and {ib_gbps:g} GB/s) at any n. A busbw well below the link's "
        "rate means latency, congestion or a poor algorithm; here the gap is the latency term.",
        q12),
    Question(
        "q13", "01", dict(n=6, small_kib=24),
        "Below what size is an all-reduce over {n} GPUs latency-bound? How much of a "
        "{small_kib} KiB all-reduce on NVLink is latency?",
        "The latency term 2(n-1)a equals the bandwidth term 2(n-1)/n * S/B at S = n a B: "
        "{nv_cross_mb:g} MB on NVLink 4, {ib_cross_mb:g} MB on InfiniBand NDR. Below that, "
        "more bytes are almost free and more collectives are not. A {small_kib} KiB "
        "all-reduce on NVLink takes {small_us:.2f} us, {small_lat_share:.1%} of it latency. "
        "That is why DDP packs gradients into buckets of tens of MB instead of sending each "
        "LayerNorm weight on its own.",
        q13),
    # -- lesson 02: data parallelism --
    Question(
        "q14", "02", dict(psi_b=2.7, nodes=3, per_node=4),
        "A {psi_b}B model is trained with DDP on {nodes} nodes of {per_node} H100s (NVLink 4 "
        "inside a node, InfiniBand NDR between). What does each GPU send per step for the "
        "gradients, and how long does the all-reduce take?",
        "The bf16 gradients are {grad_gb:.1f} GB; a ring all-reduce over N = {n} ranks sends "
        "2(N-1)/N of that, {sent_gb:.2f} GB per GPU. As one flat ring it runs at the slowest "
        "link it crosses ({ring_link}): {ring_ms:.1f} ms. The hierarchical algorithm "
        "reduce-scatters inside each node over NVLink, all-reduces 1/{per_node} of the data "
        "across nodes ({ib_gb:.2f} GB per GPU over InfiniBand) and all-gathers inside the node "
        "again: {hier_ms:.1f} ms, {speedup:.2f}x faster. NCCL's topology-aware rings and trees "
        "exist for the same reason.",
        q14),
    Question(
        "q15", "02", dict(psi_b=2.7, nodes=3, per_node=4, bucket_mib=25, h=2560),
        "DDP all-reduces neither each gradient tensor on its own nor the whole gradient at "
        "the end, but buckets of {bucket_mib} MiB. For a {psi_b}B model (h = {h}) on {nodes} "
        "nodes of {per_node} GPUs: how many buckets, and what do they cost and buy?",
        "{n_buckets} buckets, the last {last_mb:.1f} MB. One all-reduce of the whole gradient "
        "would take {whole_ms:.2f} ms; the buckets take {buckets_ms:.2f} ms in all, "
        "{extra_ms:.2f} ms more, since each pays the latency again. What they buy is overlap: "
        "a bucket is launched as soon as the backward has produced all its gradients (last "
        "layers first), so the communication runs under the rest of the backward instead of "
        "after it. One tensor at a time would pay the latency for every tensor: a LayerNorm "
        "weight ({ln_bytes:,} bytes) alone costs {ln_us:.1f} us, {ln_lat_share:.1%} of it "
        "latency.",
        q15),
    Question(
        "q16", "02",
        dict(psi_b=2.7, nodes=3, per_node=4, b=5, s=2048, h=2560, layers=32, vocab=50304),
        "In that job ({psi_b}B, {nodes} nodes of {per_node} GPUs) each GPU runs a micro-batch "
        "of {b} sequences of {s} tokens (h = {h}, {layers} layers, vocabulary {vocab}). Can the "
        "gradient all-reduce hide behind the backward pass?",
        "One step is {tflop:.1f} TFLOP per GPU: {step_ms:.1f} ms at the H100's "
        "{peak_tflops:g} TFLOP/s bf16 peak, of which the backward (twice the forward) takes "
        "{backward_ms:.1f} ms. The flat ring needs {ring_ms:.1f} ms: even perfectly "
        "overlapped, at least {exposed_ms:.1f} ms stay exposed. The hierarchical all-reduce "
        "needs {hier_ms:.1f} ms, {slack_ms:.1f} ms less than the backward, so with buckets it "
        "can hide almost entirely (only the last bucket, launched when the backward ends, is "
        "always exposed). Below peak FLOP/s the backward is longer and the slack larger.",
        q16),
    Question(
        "q17", "02", dict(k=3, micro=2),
        "Gradient accumulation over k = {k} micro-batches of {micro} sequences: why scale each "
        "micro-batch's loss by 1/k, and what happens if you forget?",
        "The loss is a mean over the micro-batch's tokens, so the sum of k micro-batch "
        "gradients is k times the gradient of the whole batch's mean. Measured on a tiny GPT "
        "with a batch of {batch} sequences: with each loss scaled by 1/k the accumulated "
        "gradient matches the full batch's to a relative {err_scaled:.1g}; unscaled it is "
        "{ratio_unscaled:.6f}x too large. The bug hides under Adam, whose update m/sqrt(v) "
        "barely sees a constant factor, but SGD's effective learning rate, the gradient "
        "clipping threshold and the logged gradient norm all see it. With micro-batches of "
        "unequal token counts, weight by tokens instead of 1/k.",
        q17),
    Question(
        "q18", "02", dict(psi_b=2.7, n=12, k=3, sim_ranks=4, sim_k=5),
        "DDP of a {psi_b}B model on {n} GPUs accumulates k = {k} micro-batches per step. What "
        "does no_sync() save?",
        "Without it every backward all-reduces its gradients: {without_gb:.1f} GB sent per GPU "
        "per step, k times the {with_gb:.2f} GB one all-reduce costs. Inside no_sync() the "
        "first k-1 backward passes only accumulate locally and the last one all-reduces the "
        "sum: {with_gb:.2f} GB, {saved_gb:.1f} GB saved a step, with the same result because "
        "the all-reduce is linear. Simulated with DDP on {sim_ranks} ranks and {sim_k} "
        "micro-batches: all-reduces {sim_with_ar} with no_sync and {sim_without_ar} without, "
        "{sim_ratio:g}x the bytes. ZeRO-2 and ZeRO-3 pay for it in memory: inside no_sync they "
        "keep whole gradients between micro-batches.",
        q18),
    # -- lesson 03: ZeRO and FSDP --
    Question(
        "q19", "03", dict(psi_b=6.7, n=18),
        "A {psi_b}B model is trained with ZeRO-2 on {n} data-parallel ranks. What does each "
        "rank hold, and how does it compare with the other stages?",
        "ZeRO-2 shards the optimizer states and the gradients and keeps the bf16 weights "
        "whole: {params_gb:.1f} GB of weights, a {grads_gb:.3f} GB gradient shard and a "
        "{optim_gb:.3f} GB Adam shard, {z2_gb:.2f} GB per rank (2Psi + 14Psi/N). DDP would "
        "hold {ddp_gb:.1f} GB, ZeRO-1 {z1_gb:.2f} GB, ZeRO-3 {z3_gb:.2f} GB. The replicated "
        "weights are now {w_share:.0%} of what a ZeRO-2 rank holds: more ranks barely help, "
        "and the next saving must come from sharding the weights too (ZeRO-3).",
        q19),
    Question(
        "q20", "03", dict(sim_ranks=5),
        "Which collectives does each ZeRO stage run in a training step, and why those?",
        "Measured on a tiny GPT of {units} units (the root with embeddings and head, and "
        "{blocks} blocks) on {sim_ranks} ranks. DDP: {ddp_ar} all-reduce of its gradient "
        "bucket ({ddp_fwd} collectives in the forward), because every rank updates every weight "
        "and needs the whole averaged gradient. ZeRO-1: {z1_rs} reduce-scatters and {z1_ag} "
        "all-gathers; ZeRO-2: {z2_rs} and {z2_ag}, one of each per unit. A rank updates only "
        "its shard, so it needs only its shard of the averaged gradient (reduce-scatter), and "
        "afterwards every rank needs every updated weight (all-gather). ZeRO-3 keeps the "
        "weights sharded too, so it all-gathers each unit before using it: {z3_ag_fwd} "
        "all-gathers in the forward, {z3_ag_bwd} more in the backward (the root stays gathered "
        "between the two), and {z3_rs} reduce-scatters of the gradients.",
        q20),
    Question(
        "q21", "03", dict(psi_b=13, n=24, sim_ranks=5),
        "How many bytes does each rank send per step for a {psi_b}B model on {n} ranks under "
        "DDP, ZeRO-1/2 and ZeRO-3 (bf16 gradients and weights)?",
        "DDP's all-reduce sends 2Psi(N-1)/N elements: {ddp_gb:.2f} GB. ZeRO-1/2's "
        "reduce-scatter plus all-gather is the same ring cut in two: {z12_gb:.2f} GB, no extra "
        "traffic. ZeRO-3 gathers the weights twice (forward and backward) and reduce-scatters "
        "once, 3Psi(N-1)/N: {z3_gb:.2f} GB, {ratio:.2f}x DDP, a constant factor that does not "
        "grow with layers or ranks. Measured on a tiny GPT on {sim_ranks} ranks: DDP "
        "{sim_ddp:,} bytes, ZeRO-1/2 {sim_z12:,} (the padding to a multiple of N adds a few "
        "elements), ZeRO-3 {sim_z3:,}, {sim_ratio:.3f}x DDP, a little under the factor because "
        "the root is not gathered again for the backward.",
        q21),
    Question(
        "q22", "03", dict(h=5120, layers=42, n=24, tiny_n=2),
        "ZeRO pads each flat buffer so that it splits evenly over N ranks. How much padding "
        "does a transformer block of hidden size {h} need on {n} ranks, and when does padding "
        "matter?",
        "A block has 12h^2 + 13h = {block:,} parameters; (-Psi) mod N = {pad} elements of "
        "padding make it divisible by {n}. Over {layers} blocks at ZeRO-3 that costs a rank "
        "{extra_bytes:,.0f} bytes, a {share:.1e} fraction: nothing. Padding matters for tiny "
        "buffers: one parameter on {tiny_n} ranks takes {tiny_z1} bytes under ZeRO-1, "
        "{tiny_extra} more than under DDP, because the padded element's weight, gradient and "
        "optimizer-state shard are real memory. "
        "And it matters for correctness everywhere: the padding must stay zero, and a "
        "checkpoint must drop it.",
        q22),
    Question(
        "q23", "03", dict(psi_b=13, nodes=3, per_node=8),
        "Map PyTorch FSDP's sharding strategies to ZeRO stages, with the model-state memory "
        "per GPU for a {psi_b}B model on {nodes} nodes of {per_node} GPUs.",
        "FULL_SHARD is ZeRO-3: {full_gb:.2f} GB. SHARD_GRAD_OP is ZeRO-2: {grad_op_gb:.2f} GB. "
        "NO_SHARD is DDP: {no_shard_gb:.0f} GB. HYBRID_SHARD is ZeRO-3 inside each node and "
        "replication across nodes: {hybrid_gb:.1f} GB, ZeRO-3 over {per_node} ranks. What "
        "HYBRID_SHARD buys is less traffic on the slow links: per step each GPU sends "
        "{hybrid_ib_gb:.2f} GB over InfiniBand (one all-reduce of its gradient shard), against "
        "{full_ib_gb:.2f} GB for FULL_SHARD over all {n} ranks (three hierarchical gathers or "
        "scatters, each crossing nodes with 1/{per_node} of the data).",
        q23),
    Question(
        "q24", "03", dict(psi_b=13, n=24, **SHAPE, layers=42, sim_layers=8),
        "Incident C: a {psi_b}B model on {n} GPUs ({layers} layers, h = {h}, {a} heads, "
        "s = {s}, b = {b}) peaked higher with ZeRO-3 and activation checkpointing than with "
        "ZeRO-2. How can sharding more use more memory, what does limit_all_gathers do, and "
        "what does checkpointing in groups of 2 layers change?",
        "ZeRO-3 saves memory only while few units are gathered at once. Its states are "
        "{z3_gb:.2f} GB against ZeRO-2's {z2_gb:.2f} GB, but with nothing holding it back the "
        "host issues each unit's all-gather long before the GPU computes that unit, and the "
        "gathered weights pile up: with every block whole a rank holds {runahead_gb:.2f} GB, "
        "{excess_gb:.2f} GB above ZeRO-2, before the recomputed activations and the gradients. "
        "limit_all_gathers=True admits two units at a time, the one computing and the one "
        "prefetched: {limit_gb:.2f} GB. Groups of 2 layers are checkpoint segments: keep the "
        "input of every second layer ({half_gb:.2f} GB of inputs fewer) and rerun two layers "
        "at a time in the backward (one layer's {rerun_gb:.2f} GB more, without the attention "
        "scores). The blocks then hold {seg_flash_gb:.2f} GB instead of {per_flash_gb:.2f} GB: "
        "segments of 2 win only when L > 2A/I, {thr_flash:.0f} layers here. If the attention "
        "scores are kept (no FlashAttention), 2A/I = {thr_scores:.1f} layers and they lose: "
        "{seg_scores_gb:.2f} GB instead of {per_scores_gb:.2f} GB. Simulated with "
        "{sim_layers} blocks on {sim_dp} ranks, ZeRO-3 running ahead peaks {sim_z3_pct:.1f}% "
        "above ZeRO-2 and {sim_limit_pct:.1f}% below it with the limit; adding segments of 2 "
        "(too few layers to win) adds {sim_seg_extra:,} B of "
        "activations: {sim_both_pct:.1f}% below ZeRO-2. The limit is the fix.",
        q24),
    # -- lesson 04: tensor and sequence parallelism --
    Question(
        "q25", "04", dict(**{k: SHAPE[k] for k in "sbh"}, t=4, layers=42, sim_t=4),
        "Megatron splits the first MLP matrix by columns and the second by rows (attention by "
        "heads, then the output projection by rows). What communication does one layer need, "
        "and how much for s = {s}, b = {b}, h = {h}, t = {t} and {layers} layers?",
        "Column then row needs nothing between the two matmuls (GeLU is elementwise), only an "
        "all-reduce of the row-parallel partial sums: g, all-reduce in forward and identity in "
        "backward. Its conjugate f sits before the block: identity in forward, all-reduce of "
        "the input gradient in backward. Attention and MLP give {fwd_per_layer:g} all-reduces "
        "per layer in forward and {bwd_per_layer:g} in backward, each of [s, b, h] in bf16 = "
        "{ar_mb:.2f} MB. On a ring each rank sends {sent_mb:.2f} MB per all-reduce, "
        "{layer_mb:.2f} MB per layer and step, {model_gb:.2f} GB for the model. Counted in a "
        "simulated {sim_layers}-layer model on {sim_t} ranks: {sim_fwd} all-reduces of "
        "[s, b, h] in forward and {sim_bwd} in backward, the per-layer ones plus the "
        "embedding's g and the head's f.",
        q25),
    Question(
        "q26", "04", dict(**{k: SHAPE[k] for k in "sbh"}, t=4),
        "With s = {s}, b = {b}, h = {h} and t = {t} GPUs of one node on NVLink 4: how long do "
        "a layer's tensor-parallel all-reduces take, against the layer's compute?",
        "Each all-reduce of [s, b, h] takes {ar_us:.1f} us on NVLink, {comm_ms:.2f} ms per "
        "layer and step. The layer's matmuls, split {t} ways, take {compute_ms:.2f} ms per GPU "
        "at the bf16 peak. Communication adds {share:.0%} on top of the compute, and it sits "
        "on the critical path, between matmuls that need its result, so little of it overlaps.",
        q26),
    Question(
        "q27", "04", dict(**{k: SHAPE[k] for k in "sbh"}, t=4),
        "Why does tensor parallelism stay inside a node? Put the same t = {t} group (s = {s}, "
        "b = {b}, h = {h}) on {t} different nodes, one GPU each, and compare.",
        "Across nodes every all-reduce crosses InfiniBand (a {across_algorithm}: with one GPU "
        "per node there is nothing to do hierarchically): {across_us:.0f} us instead of "
        "{in_us:.1f} us on NVLink, {ratio:.1f}x slower, {across_layer_ms:.2f} ms per layer "
        "against {compute_ms:.2f} ms of compute. The GPU would compute {busy_across:.0%} of the "
        "time instead of {busy_in:.0%}. Data parallelism tolerates InfiniBand because it "
        "communicates once per step and overlaps with the backward; tensor parallelism "
        "communicates inside every layer, on the critical path. So: tensor parallelism within "
        "the NVLink domain, pipeline and data parallelism across nodes.",
        q27),
    Question(
        "q28", "04", dict(**{k: SHAPE[k] for k in "sbh"}, layers=42),
        "Incident A: tensor parallelism was set larger than a node, so every tensor-parallel "
        "group spanned nodes; steps slowed down and MFU fell. Quantify it for {layers} layers "
        "with s = {s}, b = {b}, h = {h} on H100 nodes (NVLink 4 inside, InfiniBand NDR "
        "between).",
        "{in_label}: each all-reduce of [s, b, h] takes {in_ar_us:.0f} us, the GPU computes "
        "{in_busy:.0%} of the time, and the model's TP communication is {in_step_ms:.1f} ms per "
        "micro-batch. {hier_label}: {hier_ar_us:.0f} us, busy {hier_busy:.0%}, "
        "{hier_step_ms:.1f} ms. {ring_label}: {ring_ar_us:.0f} us, busy {ring_busy:.0%}, "
        "{ring_step_ms:.1f} ms. Doubling TP halves each GPU's compute but sends every "
        "all-reduce over InfiniBand, so the busy fraction collapses. The fix: TP = {in_tp} "
        "inside each node, pipeline and data parallelism across nodes.",
        q28),
    Question(
        "q29", "04", dict(**SHAPE, t=4),
        "Activation memory per layer with tensor parallelism t = {t}, with and without "
        "sequence parallelism (s = {s}, b = {b}, h = {h}, a = {a}).",
        "One device: sbh(34 + 5as/h) = {one_gb:.2f} GB. Tensor parallel: sbh(10 + 24/t + "
        "5as/(ht)) = {tp_gb:.2f} GB, only {tp_saving:.2f}x less, because the {between_mb:.1f} "
        "MB between the blocks (the LayerNorm inputs, the QKV and fc1 inputs, the "
        "residual-dropout masks) stay whole on every rank. Sequence parallelism splits those "
        "along the sequence: sbh(34/t + 5as/(ht)) = {sp_gb:.2f} GB, {sp_saving:.2f}x less than "
        "one device (every term is now divided by t) and {sp_saved_mb:.1f} MB below plain "
        "tensor parallelism (Korthikanti et al. 2022, Table 2).",
        q29),
    Question(
        "q30", "04", dict(s=SHAPE["s"], b=SHAPE["b"], vocab=50304, t=4, sim_t=4),
        "With the vocabulary of {vocab} split over t = {t} ranks, how does Megatron compute the "
        "cross-entropy without gathering the logits (s = {s}, b = {b})?",
        "Each rank has the logits of its V/t vocabulary entries, [s, b, V/t]. Three all-reduces "
        "of [s, b] fp32 numbers replace the gather: the max over the vocabulary (for a stable "
        "softmax), the target's logit (non-zero only on the rank that owns the target) and the "
        "sum of exponentials. They move {ce_kb:.0f} KB; the full fp32 logits would be "
        "{full_gb:.2f} GB, and no rank holds more than its {shard_gb:.3f} GB shard. The "
        "backward needs no communication: each rank rebuilds its slice of the softmax from "
        "the saved log-sum-exp. Counted in a simulated run on {sim_t} ranks: {sim_ce} "
        "all-reduces of [s, b] in the forward, {sim_ce_bwd} in the backward.",
        q30),
    Question(
        "q31", "04", dict(sim_t=4),
        "Under sequence parallelism, what breaks if the all-reduce of the LayerNorm (and "
        "row-parallel bias) gradients across the tensor-parallel group is missing?",
        "With sequence parallelism each rank runs LayerNorm on its s/t tokens only, so its "
        "gradients of gamma, beta and the biases are partial sums over its shard; the "
        "all-reduce over the tp group adds them up. Measured on a tiny GPT with t = {sim_t}: "
        "the loss is still right (relative error {loss_err:.1g}) and the {others} other "
        "gradients are exact ({others_max:.1g}), but the {tagged} gradients of replicated "
        "parameters are off by {without_min:.0%} to {without_max:.0%} (with the all-reduce: "
        "{with_max:.1g}). Any two ranks' copies of one parameter get gradients at least "
        "{replica_gap:.0%} apart, so the replicas drift apart from the first step, and the "
        "partial gradients summed over ranks give the true one back ({partial_sum_err:.1g}). "
        "The loss curve does not show it; a gradient check against one device does. (Sequence "
        "parallelism never all-reduces LayerNorm activations: only these parameter gradients.)",
        q31),
    Question(
        "q32", "04", dict(**{k: SHAPE[k] for k in "sbh"}, t=4, sim_t=4),
        "Sequence parallelism replaces each tensor-parallel all-reduce by a reduce-scatter and "
        "an all-gather. Does it communicate more (s = {s}, b = {b}, h = {h}, t = {t})?",
        "In the forward, no: an all-reduce is a reduce-scatter plus an all-gather, so each "
        "rank sends {tp_fwd_mb:.2f} MB per layer without sequence parallelism and "
        "{sp_fwd_mb:.2f} MB with it. In the backward, yes: the column-parallel layers keep "
        "only their sequence-sharded input and all-gather it again for the weight gradient "
        "(that is what lets the input count 1/t in the activation formula), so the backward "
        "sends {sp_bwd_mb:.2f} MB instead of {tp_bwd_mb:.2f} MB, plus an all-reduce of the 6h "
        "replicated-parameter gradients ({ln_kb:.1f} KB). Measured in block 0 of a tiny model "
        "on {sim_t} ranks: forward {sim_tp_fwd:,} bytes without and {sim_sp_fwd:,} with; "
        "backward {sim_tp_bwd:,} and {sim_sp_bwd:,}. Megatron overlaps the re-gather with the "
        "input-gradient matmul, so it costs less time than its bytes suggest.",
        q32),
    # -- lesson 05: pipeline parallelism --
    Question(
        "q33", "05", dict(p=6, m=10, t_f_ms=5, t_b_ms=11, rule=4),
        "GPipe runs p = {p} stages with m = {m} micro-batches; a stage's forward of one "
        "micro-batch takes t_F = {t_f_ms} ms and its backward t_B = {t_b_ms} ms. How long is "
        "a step, how large is the bubble, and why do two papers print different percentages "
        "for it?",
        "The first micro-batch needs p - 1 slots to reach the last stage and the last "
        "backward as many to drain, so a step takes (m + p - 1)(t_F + t_B) = {step_ms:g} ms "
        "(the dry run of GPipe's lists), of which each rank computes m(t_F + t_B) = "
        "{busy_ms:g} ms and waits {idle_ms:g} ms. Megatron-LM (Narayanan et al. 2021) divides "
        "the idle time by the ideal time: (p - 1)/m = {over_ideal:.1%}. GPipe (Huang et al. "
        "2019) divides it by the whole step: (p - 1)/(m + p - 1) = {over_total:.1%}. The same "
        "idle time over two denominators: say which one you mean. GPipe's rule of thumb, "
        "m >= {rule}p (m = {m_rule} here), still leaves {rule_share:.1%} of the step idle.",
        q33),
    Question(
        "q34", "05", dict(p=6, m=10, t_f_ms=5, t_b_ms=11, **PP_MODEL),
        "Compare GPipe and 1F1B for p = {p}, m = {m}, t_F = {t_f_ms} ms, t_B = {t_b_ms} ms: "
        "the step time, and the activation memory per GPU for a {layers}-layer model "
        "(s = {s}, b = {b}, h = {h}, a = {a}, bf16, the attention core recomputed).",
        "The step is the same, {gpipe_ms:g} ms for GPipe and {f1b_ms:g} ms for 1F1B (dry "
        "run): 1F1B does not shrink the bubble. It changes the memory. A layer keeps 34sbh = "
        "{layer_mb:.1f} MB of each micro-batch, a stage of {per_stage} layers {stage_gb:.2f} "
        "GB. GPipe runs every forward before any backward, so every rank holds {gpipe_peak} "
        "micro-batches, {gpipe_gb:.1f} GB. 1F1B runs a micro-batch's backward as soon as its "
        "gradient arrives: rank r holds min(p - r, m), {f1b_peaks} from the first rank to the "
        "last, {f1b_first_gb:.1f} GB on rank 0. The first stage fills up first (it holds the "
        "embedding too), and past m = p more micro-batches cost 1F1B no memory.",
        q34),
    Question(
        "q35", "05", dict(p=6, m=10, t_f_ms=5, t_b_ms=11, **PP_MODEL),
        "torch.distributed.pipelining's 1F1B warms up with p - r forwards on rank r, "
        "Megatron-LM's with p - r - 1. Which holds more activations, and what does the "
        "difference cost for p = {p}, m = {m}, t_F = {t_f_ms} ms, t_B = {t_b_ms} ms and the "
        "{layers}-layer model (s = {s}, b = {b}, h = {h}, a = {a})?",
        "Nothing: it is the same list of actions. torch counts as warm-up the forward that "
        "Megatron runs first in its steady 'one forward, one backward' loop; both run "
        "{first_f} forwards on rank 0 before its first backward, hold {peaks} micro-batches "
        "from the first rank to the last, and take {mine_ms:g} ms. The difference is in the "
        "words. Read torch's count into Megatron's loop and you get another schedule, with "
        "{literal_first_f} forwards before the first backward: it holds {literal_peaks}, one "
        "micro-batch more on every rank where m > p - r ({ranks_more} of {p} here), "
        "{extra_gb:.2f} GB more on rank 0, for a step of {literal_ms:g} ms when messages are "
        "free (with costly ones the extra forward can hide a message, or add one).",
        q35),
    Question(
        "q36", "05", dict(p=6, m_bad=10, m=12, v=2, t_f_ms=5, t_b_ms=11),
        "Interleaved 1F1B with v = {v} model chunks per rank, p = {p}, and t_F = {t_f_ms} ms, "
        "t_B = {t_b_ms} ms for a rank's whole share of the layers: why is m = {m_bad} "
        "refused, and what does m = {m} gain over plain 1F1B, at what cost?",
        "Megatron's interleaved order sends micro-batches through the chunks in groups of p, "
        "so it needs m % p == 0: minipar refuses m = {m_bad} and proposes m = {fix} (torch "
        "relaxes the rule; minipar keeps Megatron's). Rank r holds stages r, r + p, ..., "
        "each 1/v of its layers, so the pipeline fills in steps of (t_F + t_B)/v: at m = {m} "
        "the step falls from {f1b_ms:g} ms to {inter_ms:g} ms, the bubble from (p - 1)/m = "
        "{f1b_bubble:.1%} to (p - 1)/(v m) = {inter_bubble:.1%} (dry run). The price: "
        "{inter_msgs} messages a step instead of {f1b_msgs} ({msg_ratio:.1f}x, each the same "
        "[s, b, h], since every chunk boundary is a hop), and more activations on rank 0: its "
        "warm-up is 2(p - 1) + (v - 1)p chunk forwards, so it holds {inter_pairs} (chunk, "
        "micro-batch) pairs, {inter_peak:g} micro-batches' worth against 1F1B's {f1b_peak}, "
        "{mem_factor:.2f}x.",
        q36),
    Question(
        "q37", "05", dict(p=64, m_seed=4, m_fix=32, mfu_seed_pct=28, mfu_fix_pct=51,
                          mfu_stage_pct=60),
        "Incident B: a pipeline of p = {p} stages with m = {m_seed} micro-batches ran at "
        "{mfu_seed_pct}% MFU; the write-up computed the bubble as (p - 1)/m and said that "
        "m = {m_fix} brought MFU back to {mfu_fix_pct}%. Check both claims.",
        "The dry run of 1F1B at p = {p}, m = {m_seed}: the bubble over ideal is "
        "{seed_over:.0%}, the write-up's figure and right as such, but it leaves a rank "
        "computing {seed_bound:.1%} of the step ({seed_share:.1%} idle), so the step reaches "
        "at most {seed_bound:.1%} of the MFU its stages reach alone, and {mfu_seed_pct}% "
        "would need stages at {implied_seed:.0%} MFU. At m = {m_fix} the bubble is "
        "{fix_over:.1%} over ideal, {fix_share:.1%} of the step; the bound is "
        "{fix_bound:.1%}, and {mfu_fix_pct}% would need stages at {implied_fix:.0%}: it "
        "cannot hold. {mfu_fix_pct}% needs m/(m + p - 1) >= {mfu_fix_pct}%/MFU_stage: "
        "m >= {floor_m} even with perfect stages (bound {floor_bound:.1%}), m >= {real_m} at "
        "a more realistic {mfu_stage_pct}%; or fewer stages, or interleaving. Memory: 1F1B's "
        "rank 0 holds min(p, m) micro-batches, {fix_peak} at m = {m_fix} and {floor_peak} at "
        "m = {floor_m}, where GPipe would hold {floor_m}; past m = p more micro-batches cost "
        "only a larger global batch or a smaller micro-batch.",
        q37),
    Question(
        "q38", "05", dict(s=2048, b=2, h=6144, layers=48, p=3, m=10, t=8),
        "A stage boundary sends each micro-batch's activations [s, b, h] forward and their "
        "gradient back. For s = {s}, b = {b}, h = {h} in bf16, {layers} layers on p = {p} "
        "stages and m = {m}: what does that cost across nodes, and how does it compare with "
        "tensor parallelism over t = {t} GPUs on the same layers?",
        "One message is 2sbh bytes = {msg_mb:.1f} MB: {ib_ms:.2f} ms over InfiniBand NDR "
        "(alpha + V/B), {nv_us:.0f} us over NVLink. A stage of {per_stage} layers computes a "
        "micro-batch's forward and backward in {compute_ms:.1f} ms at the H100's bf16 peak, "
        "so its two messages are {pp_share:.1%} of that, and isend overlaps them with the "
        "next micro-batch. The dry run of GPipe with that message cost: {step_ms:.1f} ms a "
        "step instead of {step0_ms:.1f} ms, {extra_ms:.2f} ms more, each of the p - 1 hops "
        "paid once filling and once draining, 2(p - 1)c. Tensor parallelism over the same "
        "layers runs {ars} all-reduces of [s, b, h] per micro-batch, sending {tp_gb:.2f} GB "
        "per GPU ({tp_ratio:.0f}x the boundary's two messages), on the critical path between "
        "matmuls: {tp_nv_ms:.1f} ms on NVLink, {tp_ib_ms:.1f} ms if the group spanned {t} "
        "nodes, against {tp_compute_ms:.1f} ms of compute per GPU. So pipeline stages go "
        "across nodes and tensor parallelism stays inside one.",
        q38),
    Question(
        "q39", "05", dict(s=2048, b=2, h=6144, layers=48, vocab=128256, p=6, m=10),
        "A {layers}-layer model (s = {s}, b = {b}, h = {h}) with a vocabulary of {vocab} is "
        "cut into p = {p} stages of equal layer counts, m = {m}. The first stage also embeds, "
        "the last computes the logits and the loss. Is the pipeline balanced, and what would "
        "you change?",
        "No. A layer's forward and backward take {layer_ms:.2f} ms at the bf16 peak; the "
        "embedding lookup costs no FLOPs, but the logit layer's 6bshV take {head_ms:.2f} ms, "
        "{head_layers:.2f} layers' worth. With {even} layers the last stage takes "
        "{even_last_ms:.1f} ms a micro-batch against {even_other_ms:.1f} ms for the others, "
        "and a pipeline runs at the pace of its slowest stage: GPipe's clock (a flow shop, "
        "the sum of the stage times plus m - 1 times the slowest) is {even_step_ms:.0f} ms. "
        "Moving layers off the last stage, {best} (the best such split with the fewest "
        "layers moved), makes the slowest stage {best_max_ms:.1f} ms and the step "
        "{best_step_ms:.0f} ms, {speedup:.3f}x faster. Megatron-LM lets one give the first "
        "and last stages' layer counts for this. For memory it is the first stage to lighten "
        "(it holds the embedding and, under 1F1B, p micro-batches); for time the last.",
        q39),
    Question(
        "q40", "05", dict(global_batch=960, dp=8, b=2, b_small=1, p=6, s=2048, h=6144, a=64,
                          layers=48),
        "With dp = {dp} replicas, a global batch of {global_batch} sequences and micro-batches "
        "of b = {b} sequences, how many micro-batches does each pipeline of p = {p} stages "
        "run a step? What do you gain and pay by going to b = {b_small} to get more of them? "
        "(s = {s}, h = {h}, a = {a}, {layers} layers, the attention core recomputed)",
        "The global batch is dp · m · b, so m = {m1}: 1F1B's bubble is {over1:.2%} of ideal, "
        "{share1:.2%} of the step. At b = {b_small}, m = {m2}: {over2:.2%} and {share2:.2%}. "
        "1F1B's memory does not grow with m: rank 0 holds p micro-batches, {f1b_gb1:.1f} GB "
        "at b = {b} and {f1b_gb2:.1f} GB at b = {b_small} (GPipe would hold every one of its "
        "sequences, {gpipe_gb:.0f} GB, at either size). The price is elsewhere: the pipeline "
        "sends twice the messages, each half as large, {msgs2} a step instead of {msgs1} "
        "(the latency terms double), and every matmul works on half as many tokens, further from "
        "the GPU's peak. The other ways to raise m, a larger global batch or fewer "
        "data-parallel replicas, change the optimisation or the time per step.",
        q40),
    Question(
        "q41", "05", dict(p=3, m=4, t_f_ms=5, t_b_ms=11),
        "A pipeline's code sends each tensor with a blocking send as soon as it is computed, "
        "and receives each just before it needs it. It passes its tests with buffered sends; "
        "on NCCL it hangs. Why? (1F1B, p = {p}, m = {m}, t_F = {t_f_ms} ms, t_B = {t_b_ms} ms)",
        "NCCL's send is a rendezvous: it returns only once the peer has posted the matching "
        "receive. In 1F1B's steady state neighbours send to each other at the same moment, "
        "rank r a micro-batch's activations to r + 1 while r + 1 sends r a gradient, and each "
        "waits for the other's receive. Run on simulated devices with rendezvous sends, "
        "minipar's runtime reports the deadlock, with every rank stuck: {stuck}. With eager "
        "(buffered) sends the same program finishes, at {eager_ms:g} ms with free messages, "
        "and so do the lowering's lists under rendezvous sends (isend posted at once, waited "
        "only at the end), at {isend_ms:g} ms = (m + p - 1)(t_F + t_B): the send mode decides "
        "which programs finish, not what they cost. Megatron-LM pairs the two directions in "
        "one batched send_forward_recv_backward; torch's schedules post their sends and "
        "receives as one batch (batch_isend_irecv).",
        q41),
    Question(
        "q42", "05", dict(vocab=51200, h=6144, p=6, sim_p=4),
        "GPT models tie the input embedding to the output layer. Under pipeline parallelism "
        "the embedding lives on the first stage and the logits on the last. How does "
        "training keep the two equal, and what does it cost for V = {vocab}, h = {h} and "
        "p = {p} stages, one per node?",
        "The last stage keeps its own copy of the word embeddings (as Megatron-LM does): "
        "{params_m:.1f} M parameters, {copy_gb:.2f} GB of model states at 16 bytes each. "
        "After a step's last backward the two copies' gradients are summed by an all-reduce "
        "over the embedding group, the first and last stages' ranks only, so both copies "
        "take the same optimizer step. The [V, h] gradient in fp32 (Megatron-LM keeps a bf16 "
        "run's main gradients in fp32) is {grad_gb:.2f} GB; "
        "between two nodes a {algorithm} all-reduce of two ranks (2 alpha + S/B) takes "
        "{ar_ms:.1f} ms, once per step, after the schedule. On {sim_p} simulated pipeline "
        "ranks with a tiny tied GPT the trace shows it: all-reduces per rank {sim_counts}, "
        "each of the tiny [V, h] gradient, {sim_bytes:,} bytes (float64).",
        q42),
    Question(
        "q43", "05", dict(p=6, ms=(6, 12, 24, 48)),
        "Two claims one often reads about 1F1B: it 'compresses the bubble to a constant', and "
        "it 'makes every stage hold every micro-batch's activations'. Test them with p = {p} "
        "and m in {ms}.",
        "Both are wrong. The dry run's bubble over ideal is {gpipe_bubbles} for GPipe and "
        "{f1b_bubbles} for 1F1B: the same (p - 1)/m, halving as m doubles, never a constant. "
        "Rank 0 holds {gpipe_peaks} micro-batches under GPipe (all of them) and {f1b_peaks} "
        "under 1F1B, capped at p; the last rank holds {f1b_last}. The second claim describes "
        "GPipe. What 1F1B buys is memory, which lets m grow until the bubble is small; the "
        "zero-bubble schedules attack the bubble itself.",
        q43),
    Question(
        "q44", "05", dict(**PP_MODEL, m=10, ps=(2, 3, 4, 6), p_inter=6, m_inter=12, v1=4,
                          v2=8),
        "Does pipeline parallelism reduce the first GPU's activation memory? Take the "
        "{layers}-layer model (s = {s}, b = {b}, h = {h}, a = {a}, the attention core "
        "recomputed) under 1F1B with m = {m} and p in {ps}; then interleave v = {v1} and "
        "v = {v2} chunks at p = {p_inter}, m = {m_inter}.",
        "Not below one micro-batch through the whole model. Rank 0 holds min(p, m) = {first} "
        "micro-batches of {per_stage} layers: p · L/p = L layers, {r0_gb:.2f} GB at every p, "
        "what one device keeps for one micro-batch ({whole_gb:.2f} GB). Only the other ranks "
        "gain (the last holds one micro-batch of its L/p layers, {last_gb:.2f} GB at "
        "p = {p_inter}). Interleaving makes rank 0 hold more, since its warm-up is "
        "2(p - 1) + (v - 1)p chunk forwards: {inter1_gb:.2f} GB at v = {v1} ({factor1:.3f}x) "
        "and {inter2_gb:.2f} GB at v = {v2} ({factor2:.3f}x), 1 + (p - 1)/(pv) (Korthikanti "
        "et al. 2022). What divides it is tensor and sequence parallelism, recomputation, or "
        "a smaller micro-batch.",
        q44),
]




def load_part(filename: str):
    """A part of the bank kept in its own file beside this one (bank_06.py), loaded by path
    so that it runs the same from `python lessons/interview/bank.py` and from the tests."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"{__name__}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bank_06 = load_part("bank_06.py")  # lesson 06: zero-bubble pipelines and DualPipe
QUESTIONS += [Question(**entry) for entry in bank_06.ENTRIES]
bank_07 = load_part("bank_07.py")  # lesson 07: 3-D composition and topology
QUESTIONS += [Question(**entry) for entry in bank_07.ENTRIES]
bank_08 = load_part("bank_08.py")  # lesson 08: mixture of experts and expert parallelism
QUESTIONS += [Question(**entry) for entry in bank_08.ENTRIES]
bank_09 = load_part("bank_09.py")  # lesson 09: context parallelism
QUESTIONS += [Question(**entry) for entry in bank_09.ENTRIES]
bank_10 = load_part("bank_10.py")  # lesson 10: planning a run
QUESTIONS += [Question(**entry) for entry in bank_10.ENTRIES]
bank_11 = load_part("bank_11.py")  # lesson 11: mixed precision
QUESTIONS += [Question(**entry) for entry in bank_11.ENTRIES]
bank_12 = load_part("bank_12.py")  # lesson 12: activation recomputation
QUESTIONS += [Question(**entry) for entry in bank_12.ENTRIES]
bank_13 = load_part("bank_13.py")  # lesson 13: checkpoints, faults and hangs
QUESTIONS += [Question(**entry) for entry in bank_13.ENTRIES]
bank_design = load_part("bank_design.py")  # open design and debugging questions
QUESTIONS += [Question(**entry) for entry in bank_design.ENTRIES]


# ---- printing -------------------------------------------------------------------------
def lesson_key(text: str) -> str:
    """'3', '03' or '03_zero' -> '03'; 'design' or 'Design' -> 'design'."""
    return str(text).split("_")[0].zfill(2).lower()


def heading(lesson: str, title: str, count: int) -> str:
    """'=== Lesson 03 — ZeRO and FSDP (6 questions) ===' ('=== Open design ... ===')."""
    noun = "question" if count == 1 else "questions"
    name = f"Lesson {lesson} — {title}" if lesson.isdigit() else title
    return f"=== {name} ({count} {noun}) ==="


def format_entry(q: Question, show_answer: bool = True, width: int = 92) -> str:
    """The question, wrapped, and (unless show_answer is False) its computed answer."""
    wrap = lambda text, lead: textwrap.fill(text, width, initial_indent=lead,
                                            subsequent_indent=" " * len(lead),
                                            break_on_hyphens=False)
    if not show_answer:  # nothing to compute
        return wrap(q.question.format(**q.given), f"{q.id}  ")
    question, answer = q.render()
    return wrap(question, f"{q.id}  ") + "\n" + wrap(answer, "     A: ")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Interview questions on lessons 00-13, and "
                                     "open design and debugging questions, answered with "
                                     "numbers minipar computes.")
    parser.add_argument("--lesson", help="only this lesson's questions (e.g. 03; 'design': "
                        "the open design and debugging questions)")
    parser.add_argument("--id", help="only this question (e.g. q21)")
    parser.add_argument("--quiz", action="store_true", help="questions only, no answers")
    args = parser.parse_args(argv)
    chosen = [q for q in QUESTIONS
              if (args.lesson is None or q.lesson == lesson_key(args.lesson))
              and (args.id is None or q.id == args.id)]
    if not chosen:
        parser.error(f"no question matches --lesson {args.lesson} --id {args.id}; the "
                     f"lessons are {', '.join(LESSONS)} and the ids q01..q{len(QUESTIONS):02d}")
    for lesson, title in LESSONS.items():
        entries = [q for q in chosen if q.lesson == lesson]
        if entries:
            print(f"\n{heading(lesson, title, len(entries))}\n")
            print("\n\n".join(format_entry(q, show_answer=not args.quiz) for q in entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
