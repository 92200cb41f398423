"""Interview questions on lesson 13 (checkpoints, faults and hangs), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 13`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the planner (minipar.plan:
a model's parameters and bytes a parameter, rank_memory, step_time), the device presets,
minipar's flat layout (FlatParameter), and small runs on simulated devices (minipar.launch):
real sharded saves and their files, a fault planted in a save (minipar.runtime.faults), a
DDP bucket that never fires, a straggler on the clock. Llama 3's interruptions are those
Dubey et al. 2024 report (section 3.3.4): 466 in a 54-day snapshot on 16,384 H100s, 47
planned and 419 unexpected; its storage sustains 2 TB/s (section 3.3.1). The checkpoint
interval's questions use Young's (1974) and Daly's (2006) formulas; the open questions on a
checkpoint's size and a hang at a round step are in bank_design.py (q147, q151).
"""

from __future__ import annotations

import functools
import math
import re
import tempfile
from pathlib import Path

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel import (DistributedDataParallel, FlatParameter, ParallelDims,
                              checkpoint, parallelize)
from minipar.nn.parameter import Parameter
from minipar.plan import CLUSTERS, MODELS, Layout, rank_memory, step_time
from minipar.plan.rank_states import bytes_per_parameter
from minipar.runtime.errors import RankFailedError
from minipar.runtime.faults import Fault, inject, step_begins

GB, GiB, DAY, MS = 10**9, 2**30, 86400, 1e-3
H100 = CLUSTERS["h100"]
L405, L70 = MODELS["llama3-405b"], MODELS["llama3-70b"]
# Llama 3's 54-day snapshot (Dubey et al. 2024, section 3.3.4)
DAYS, PLANNED, UNEXPECTED, LLAMA_GPUS = 54, 47, 419, 16384


def saved_bytes(model) -> float:
    """A mixed-precision AdamW checkpoint: bf16 weights and float32 master, m and v."""
    w, _, k = bytes_per_parameter(Layout())
    return model.parameters() * (w + k)


def young(delta: float, M: float) -> float:
    """Young's interval sqrt(2·δ·M)."""
    return math.sqrt(2 * delta * M)


def overhead(tau: float, delta: float, M: float, restart: float = 0.0) -> float:
    """First order: the saves δ/τ, and each failure's half cycle redone and restart."""
    return delta / tau + ((tau + delta) / 2 + restart) / M


def exact(tau: float, delta: float, M: float) -> float:
    """Daly's exact expected overhead under exponential failures (no restart):
    M·(e^((τ+δ)/M) − 1)/τ − 1."""
    return M * math.expm1((tau + delta) / M) / tau - 1


def tiny(**kw) -> GPTConfig:
    return GPTConfig(**{**dict(vocab_size=14, seq_len=6, hidden=8, num_heads=2, num_layers=2),
                        **kw})


def tiny_batches(cfg: GPTConfig, steps: int, batch: int) -> list:
    ids = np.random.default_rng(13).integers(0, cfg.vocab_size, (steps, cfg.seq_len, batch))
    return [(x, np.roll(x, -1, axis=0)) for x in ids]


# ---- runs on simulated devices (each once) ---------------------------------------------
@functools.lru_cache(maxsize=None)
def bf16_save() -> dict:
    """One AdamW step of a tiny bfloat16 GPT on one device, saved: the file's bytes by kind."""
    cfg = tiny(dtype="bfloat16")
    (ids, tgt), = tiny_batches(cfg, 1, 4)
    with tempfile.TemporaryDirectory() as tmp:
        def program(ctx):
            run = parallelize(cfg, ParallelDims(), zero=1, lr=1e-3)
            run.train_step(ids, tgt)
            checkpoint.save_sharded(run, Path(tmp) / "ckpt")

        mp.launch(program, 1)
        by_kind: dict = {}
        with np.load(Path(tmp) / "ckpt" / "rank00000.npz") as f:
            for name in f.files:
                kind = name.split("/")[-1]
                by_kind[kind] = by_kind.get(kind, 0) + f[name].nbytes
    return {"params": cfg.num_parameters(), "by_kind": by_kind}


@functools.lru_cache(maxsize=None)
def writers(dp: int) -> dict:
    """A tiny GPT on dp ranks under DDP and under ZeRO-1, saved sharded: the rank files."""
    cfg = tiny()
    (ids, tgt), = tiny_batches(cfg, 1, 2 * dp)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for zero in (0, 1):
            d = Path(tmp) / f"zero{zero}"

            def program(ctx):
                dims = ParallelDims(dp_shard=dp) if zero else ParallelDims(dp_replicate=dp)
                run = parallelize(cfg, dims, zero=zero, lr=1e-3)
                run.train_step(ids, tgt)
                checkpoint.save_sharded(run, d)

            mp.launch(program, dp)
            out[zero] = len(list(d.glob("rank*.npz")))
    return out


@functools.lru_cache(maxsize=None)
def interrupted_save(dp: int, tp: int, steps: int, rank: int, step: int) -> dict:
    """dp x tp with ZeRO-1, a save after every step; rank `rank` fails midway through the
    save of step `step`. The directories left, what latest() takes and skips, and the
    resumed run's losses against the run that never failed."""
    cfg = tiny()
    batches = tiny_batches(cfg, steps, 2 * dp)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "run"

        def program(ctx, save, resume):
            run = parallelize(cfg, ParallelDims(dp_shard=dp, tp=tp), zero=1, lr=1e-3)
            start = checkpoint.resume(run, root).step if resume else 0
            losses = []
            for n in range(start + 1, steps + 1):
                step_begins(n)
                losses.append(run.train_step(*batches[n - 1]))
                if save:
                    checkpoint.save_step(run, root)
            return losses

        world = dp * tp
        straight = mp.launch(lambda ctx: program(ctx, False, False), world)
        try:
            mp.launch(inject(lambda ctx: program(ctx, True, False),
                             Fault(rank=rank, step=step, at="save")), world)
        except RankFailedError as e:
            failed = e.rank
        else:
            raise RuntimeError("the planted fault did not stop the run")
        unfinished = checkpoint.step_dir(root, step)
        files = len(list(unfinished.glob("rank*.npz")))
        index = (unfinished / "index.json").exists()
        last = checkpoint.latest(root)
        resumed = mp.launch(lambda ctx: program(ctx, False, True), world)
    return {"failed": failed, "files": files, "index": index, "last": last.step,
            "skipped": [d.name for d, _ in last.skipped],
            "equal": all(list(s[last.step:]) == list(r) for s, r in zip(straight, resumed))}


@functools.lru_cache(maxsize=None)
def unused_block(world: int, layers: int, skipped: int, cap_mb: float) -> dict:
    """DDP over a tiny GPT whose block `skipped` the forward never calls: what DDP says."""
    cfg = tiny(num_layers=layers)
    (ids, tgt), = tiny_batches(cfg, 1, 2 * world)

    def program(ctx):
        model = GPT(cfg)
        ddp = DistributedDataParallel(model, lr=1e-3, bucket_cap_mb=cap_mb)
        mine = slice(2 * ctx.rank, 2 * ctx.rank + 2)
        x, s_embed = model.embed_forward(ids[:, mine], None)
        saved = []
        for i in range(layers):
            if i != skipped:
                x, s = model.blocks_forward(x, None, i, i + 1)
                saved.append((i, s))
        loss, s_head = model.head_forward(x, tgt[:, mine])
        dx = model.head_backward(s_head, 1.0)
        for i, s in reversed(saved):
            dx = model.blocks_backward(dx, s, i, i + 1)
        try:
            model.embed_backward(dx, s_embed)
        except RuntimeError as e:
            return len(ddp.buckets), str(e)
        return len(ddp.buckets), None

    said = mp.launch(program, world)
    total, text = said[0]
    if any(re.sub(r"^rank \d+: ", "", t or "") != re.sub(r"^rank \d+: ", "", text or "")
           for _, t in said):
        raise RuntimeError("the ranks did not all refuse the same bucket")
    m = re.search(r"bucket (\d+) never fired: unit\(s\) \['([\w.]+)'\].*?(\d+) of the (\d+) "
                  r"buckets", text)
    return {"total": total, "bucket": int(m.group(1)), "unit": m.group(2),
            "left": int(m.group(3))}


@functools.lru_cache(maxsize=None)
def straggler(world: int, slowdown: float, tflop: float, grad_mib: int) -> dict:
    """Each step `tflop` TFLOP of compute a rank, then an all-reduce of `grad_mib` MiB; in
    step 2 the last rank computes `slowdown` times slower. Each step's length."""
    grads = np.ones(grad_mib * 2**20 // 4, np.float32)

    def program(ctx):
        ends = []
        for step in (1, 2):
            slow = slowdown if ctx.rank == world - 1 and step == 2 else 1.0
            ctx.compute(tflop * 1e12 * slow, dtype="bfloat16")
            mp.all_reduce(grads)
            ends.append(ctx.clock.elapsed())
        return ends

    ends = mp.launch(program, world)[0]
    return {"before": ends[0], "after": ends[1] - ends[0]}


# ---- the questions' numbers ------------------------------------------------------------
def q131(gpus):
    """What a checkpoint holds: bytes a parameter measured on a tiny save, then 405B."""
    run = bf16_save()
    w, g, k = bytes_per_parameter(Layout())
    size = saved_bytes(L405)
    by_kind = run["by_kind"]
    return {"measured": sum(v for kind, v in by_kind.items() if kind != "step") / run["params"],
            "master_b": by_kind["master"] / run["params"], "w": w, "held": w + g + k,
            "psi_b": L405.parameters() / 1e9, "size_tb": size / 1e12,
            "per_gpu_mb": size / gpus / 1e6}


def q132(gpus, fs_tbs):
    """Sharded against consolidated at 405B: the file system's rate against one rank's link."""
    size = saved_bytes(L405)
    link, hbm = H100.inter.bandwidth, H100.device.memory_bytes
    shard_s = size / (fs_tbs * 1e12)
    one_s = size / link
    return {"per_gpu_mb": size / gpus / 1e6, "size_tb": size / 1e12, "shard_s": shard_s,
            "link_gbs": link / GB, "one_s": one_s, "ratio": one_s / shard_s,
            "devices": size / hbm, "hbm_gb": hbm / GB}


def q133(days, planned, unexpected, fs_tbs):
    """Young's interval from Llama 3's interruptions; and what counting the planned does."""
    M, M_all = days * DAY / unexpected, days * DAY / (planned + unexpected)
    delta = saved_bytes(L405) / (fs_tbs * 1e12)
    tau, tau_all = young(delta, M), young(delta, M_all)
    return {"mtbf_h": M / 3600, "delta_s": delta, "young_min": tau / 60,
            "overhead": overhead(tau, delta, M), "total": planned + unexpected,
            "mtbf_all_h": M_all / 3600, "young_all_min": tau_all / 60,
            "overhead_all": overhead(tau_all, delta, M)}


def q134(delta_min, mtbf_h):
    """A slow save: Young's and Daly's intervals against the exact model's optimum."""
    d, M = delta_min * 60, mtbf_h * 3600
    tau_y = young(d, M)
    tau_d = tau_y * (1 + math.sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d if d < 2 * M else M
    lo, hi = 1.0, 10 * M  # golden-section search of the exact model's minimum
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if exact(a, d, M) < exact(b, d, M):
            hi = b
        else:
            lo = a
    best = (lo + hi) / 2
    return {"young_min": tau_y / 60, "daly_min": tau_d / 60, "best_min": best / 60,
            "over_young": exact(tau_y, d, M), "over_daly": exact(tau_d, d, M),
            "over_best": exact(best, d, M), "first_order": overhead(tau_y, d, M)}


def q135(restart_min, effective):
    """What failures cost over Llama 3's 54 days, and the restart its 90 % allows."""
    M = DAYS * DAY / UNEXPECTED
    delta = saved_bytes(L405) / 2e12
    tau = young(delta, M)
    R = restart_min * 60
    redo = (tau + delta) / 2
    lost = UNEXPECTED * (redo + R)
    saves = DAYS * DAY * delta / (tau + delta)
    r_max = ((1 - effective) - overhead(tau, delta, M)) * M
    return {"delta_s": delta, "tau_min": tau / 60, "redo_s": redo, "lost_h": lost / 3600,
            "lost_gpuh": lost / 3600 * LLAMA_GPUS,
            "save_h": saves / 3600, "trained": 1 - (lost + saves) / (DAYS * DAY),
            "r_max_min": r_max / 60}


def q136(gpus_to):
    """A GPU's MTBF from Llama 3's job, and the job's at a larger scale."""
    M = DAYS * DAY / UNEXPECTED
    per_gpu = LLAMA_GPUS * M
    M_to = per_gpu / gpus_to
    delta = saved_bytes(L405) / 2e12
    tau_to = young(delta, M_to)
    return {"m_h": M / 3600, "gpu_years": per_gpu / (365 * DAY), "m_to_min": M_to / 60,
            "delta_s": delta,
            "young_to_min": tau_to / 60, "over_now": overhead(young(delta, M), delta, M),
            "over_to": overhead(tau_to, delta, M_to)}


def q137(numel, n, m, rank):
    """The overlapping pieces a rank of m reads from a flat buffer saved over n."""
    def flat(world):
        return FlatParameter("unit", [Parameter("w", np.zeros(numel), charge=False)], world)
    old, new = flat(n), flat(m)
    lo, hi = new.shard_range(rank)
    hi = min(hi, numel)
    pieces = []
    for k in range(n):
        a, b = old.shard_range(k)
        start, stop = max(lo, a), min(hi, b)
        if start < stop:
            pieces.append(f"old rank {k}'s [{start - a}:{stop - a}]")
    return {"old_s": old.shard_numel, "old_pad": old.padding, "new_s": new.shard_numel,
            "lo": lo, "hi": hi, "pieces": ", ".join(pieces), "count": len(pieces)}


def q138(nodes, tp, pp, batch):
    """A node of Llama 3 70B's tp x pp x dp job lost: drop its replica, or replan."""
    gpus = nodes * H100.gpus_per_node
    dp = gpus // (tp * pp)
    common = dict(sequence_parallel=True, recompute="selective", distributed_optimizer=True)
    dp_to = dp - 1  # the lost node took one pipeline stage of one replica
    re_pp, re_dp = pp // 2, (gpus - H100.gpus_per_node) // (tp * pp // 2)
    plans = {"from": Layout(tp=tp, pp=pp, dp=dp, global_batch=batch, **common),
             "to": Layout(tp=tp, pp=pp, dp=dp_to, global_batch=dp_to * (batch // dp_to),
                          **common),
             "re": Layout(tp=tp, pp=re_pp, dp=re_dp, global_batch=re_dp * (batch // re_dp),
                          **common)}
    out = {"dp_from": dp, "dp_to": dp_to, "re_pp": re_pp, "re_dp": re_dp}
    tokens = {}
    for tag, lay in plans.items():
        mem = rank_memory(L70, lay, H100, dropout=False)
        st = step_time(L70, lay, H100, dropout=False)
        tokens[tag] = lay.global_batch * L70.seq_len / st.seconds
        out[f"peak_{tag}"] = mem.peak / GiB
        out[f"opt_{tag}"] = mem.optimizer_states.steady / GiB
    out.update({"batch_to": plans["to"].global_batch, "k_to": plans["to"].microbatches,
                "idle": nodes - 1 - plans["to"].gpus // H100.gpus_per_node,
                "share_to": tokens["to"] / tokens["from"],
                "share_re": tokens["re"] / tokens["from"]})
    return {k: v for k, v in out.items() if k != "opt_re"}


def q139(dp, tp, steps, rank, step):
    """A fault midway through a save: what the directory holds, what resume takes."""
    r = interrupted_save(dp, tp, steps, rank, step)
    if r["index"] or not r["equal"] or r["failed"] != rank:
        raise RuntimeError(f"the interrupted save did not go as the answer says: {r}")
    return {"files": r["files"], "last": r["last"], "skipped": ", ".join(r["skipped"]),
            "world": dp * tp, "next": r["last"] + 1}


def q140(dp_sim, per_gpu_gbs, fs_tbs, tp, pp, dp):
    """Who writes a sharded save: DDP's first replica, or every ZeRO rank."""
    files = writers(dp_sim)
    size = saved_bytes(L405)
    fs = fs_tbs * 1e12
    ddp_writers, zero_writers = tp * pp, tp * pp * dp
    ddp_s = size / min(ddp_writers * per_gpu_gbs * GB, fs)
    zero_s = size / min(zero_writers * per_gpu_gbs * GB, fs)
    return {"ddp_files": files[0], "zero_files": files[1], "ddp_writers": ddp_writers,
            "zero_writers": zero_writers, "ddp_gb": size / ddp_writers / GB,
            "zero_mb": size / zero_writers / 1e6, "ddp_s": ddp_s, "zero_s": zero_s}


def q141(world, layers, skipped):
    """An unused block under DDP: the bucket that never fires."""
    r = unused_block(world, layers, skipped, 0.002)
    return {"bucket": r["bucket"], "unit": r["unit"], "left": r["left"], "total": r["total"]}


def q142(world, slowdown, tflop, grad_mib, dp):
    """Tolerate a straggler, or drain its node and lose a replica?"""
    r = straggler(world, slowdown, tflop, grad_mib)
    return {"before_ms": r["before"] / MS, "after_ms": r["after"] / MS,
            "slower": r["after"] / r["before"] - 1, "drain": 1 / dp}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="13", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q131", dict(gpus=16384),
        "Llama 3 405B trains with mixed-precision AdamW on {gpus:,} GPUs. What must a "
        "checkpoint hold for the run to resume exactly, how many bytes a parameter is that, "
        "and how large is the checkpoint?",
        "The bf16 weights and the float32 master copy the optimizer updates, Adam's m and "
        "v, the step (Adam's bias correction and the learning-rate schedule depend on it), "
        "the random state of the dropout masks, and the data position; not the gradients, "
        "which a step leaves zeroed. A tiny bf16 GPT's save on a simulated device holds "
        "{measured:g} bytes a parameter: {w} of weights and {master_b:g} each of master, m "
        "and v, against the {held} Megatron-LM holds in memory (its float32 main_grad is not "
        "saved). For {psi_b:.1f}B parameters that is {size_tb:.2f} TB, {per_gpu_mb:.0f} MB "
        "from each GPU when every GPU writes its own part.",
        q131),
    entry(
        "q132", dict(gpus=16384, fs_tbs=2.0),
        "Llama 3 405B's checkpoint on {gpus:,} H100s: how long does a save take if every GPU "
        "writes its shard (the storage sustains {fs_tbs} TB/s), and if rank 0 gathers and "
        "writes the single-device tensors?",
        "Sharded, each GPU writes {per_gpu_mb:.0f} MB at once and the {size_tb:.2f} TB go at "
        "the storage's rate: {shard_s:.2f} s. Consolidated, everything first crosses rank "
        "0's own link, {link_gbs:.0f} GB/s of InfiniBand: at least {one_s:.0f} s, "
        "{ratio:.0f}x longer, and rank 0 would have to hold {devices:.0f} times its "
        "{hbm_gb:.0f} GB. At this scale a consolidated save is not slow but impossible: "
        "save sharded (DCP's dcp.save, Megatron's distributed checkpointing) and "
        "consolidate offline for export.",
        q132),
    entry(
        "q133", dict(days=54, planned=47, unexpected=419, fs_tbs=2.0),
        "Llama 3 405B was interrupted {planned} times by plan and {unexpected} times "
        "unexpectedly in a {days}-day snapshot. Its sharded checkpoint is written at "
        "{fs_tbs} TB/s. How often should it save, and what does it lose?",
        "The mean time between failures is the job's, from the unexpected interruptions "
        "only (a planned stop is preceded by a save): {mtbf_h:.2f} h. A save takes δ = "
        "{delta_s:.2f} s, so Young's interval sqrt(2δM) is {young_min:.1f} min, and saves "
        "plus redone half cycles cost {overhead:.3%} of the time. Counting all {total} "
        "interruptions gives M = {mtbf_all_h:.2f} h and τ = {young_all_min:.1f} min, which "
        "costs {overhead_all:.3%} against the true M: the optimum is flat, so the error is "
        "small, but the restarts it ignores are not.",
        q133),
    entry(
        "q134", dict(delta_min=20, mtbf_h=3),
        "A job fails every {mtbf_h} hours on average and a save stops it for {delta_min} "
        "minutes. Is Young's interval still the one to use?",
        "Young's sqrt(2δM) is {young_min:.1f} min, Daly's higher-order estimate "
        "sqrt(2δM)(1 + sqrt(δ/(2M))/3 + δ/(18M)) − δ is {daly_min:.1f} min, and the "
        "minimum of the exact expected time under exponential failures, M(e^((τ+δ)/M) − "
        "1)/τ − 1, is at {best_min:.1f} min. The overheads: {over_young:.2%} at Young's, "
        "{over_daly:.2%} at Daly's, {over_best:.2%} at the optimum; the first-order formula "
        "says {first_order:.2%}, too optimistic when δ is a sizeable share of M. Use Daly's, "
        "and make the save shorter: a sharded or asynchronous one.",
        q134),
    entry(
        "q135", dict(restart_min=10, effective=0.9),
        "Llama 3 405B saves its sharded checkpoint at Young's interval (419 failures in 54 "
        "days). If each restart takes {restart_min} minutes, how much do the failures cost "
        "over the 54 days, and how long could a restart take for the job to train "
        "{effective:.0%} of the time?",
        "A save takes δ = {delta_s:.2f} s and Young's τ is {tau_min:.1f} min. Each failure "
        "redoes half a cycle, (τ + δ)/2 = {redo_s:.0f} s, and waits "
        "{restart_min} min: over the 419 failures {lost_h:.1f} h, {lost_gpuh:,.0f} GPU-hours. "
        "With {save_h:.1f} h of saves the job trains {trained:.1%} of the time. "
        "{effective:.0%} leaves at most {r_max_min:.0f} min a failure for detecting it, "
        "rescheduling and reading the checkpoint: at frequent saves the restart, not the "
        "interval, is what to shorten (hot spares, fast failure detection, a checkpoint "
        "read from host memory).",
        q135),
    entry(
        "q136", dict(gpus_to=100000),
        "From Llama 3's failure rate (419 unexpected interruptions in 54 days on 16,384 "
        "GPUs), what is one GPU's mean time between failures, and what happens to the job's "
        "and to checkpointing on {gpus_to:,} GPUs with the same hardware and the same "
        "sharded save of Llama 3 405B?",
        "The job's M is {m_h:.2f} h, so a GPU with its share of the host fails every "
        "{gpu_years:.1f} years. Failures add up over GPUs: at {gpus_to:,} the job's M is "
        "{m_to_min:.0f} min, Young's interval for the {delta_s:.2f} s save "
        "{young_to_min:.1f} min, and saves plus redone "
        "work take {over_to:.2%} of the time instead of {over_now:.2%} — before any restart, "
        "which now comes every half hour. Faster saves alone do not rescue it: restarts must "
        "be shorter than a few minutes, or the job must survive a failure without stopping.",
        q136),
    entry(
        "q137", dict(numel=1003, n=6, m=4, rank=2),
        "A unit's flat buffer of {numel} elements was saved by ZeRO over {n} ranks and is "
        "loaded over {m}. Which pieces of the old shards does new rank {rank} read?",
        "A flat buffer over N ranks is padded to a multiple of N and cut in N equal shards: "
        "{old_s} elements a shard at {n} ({old_pad} of padding at the end), {new_s} at {m}. "
        "New rank {rank} needs flat elements [{lo}, {hi}): {pieces}, {count} pieces laid end "
        "to end. That is what DCP reads, the overlapping chunks; minipar reads the whole "
        "checkpoint and cuts, simpler and not frugal.",
        q137),
    entry(
        "q138", dict(nodes=48, tp=8, pp=4, batch=576),
        "Llama 3 70B trains on {nodes} nodes of 8 H100s with tp {tp} × pp {pp} and {batch} "
        "sequences a step, and one node dies with no spare. Resume on dp, or replan?",
        "The node held one pipeline stage of one replica, so the replica stops: dp "
        "{dp_from} to {dp_to}, and {idle} healthy nodes wait. {dp_to} does not divide "
        "{batch}, so the nearest global batch is {batch_to}, {k_to} micro-batches of one "
        "sequence a replica. Each rank keeps its layers; its optimizer-state shard grows "
        "from {opt_from:.2f} to {opt_to:.2f} GiB, its peak from {peak_from:.1f} to "
        "{peak_to:.1f} GiB, and the job keeps {share_to:.1%} of its throughput. Replanning "
        "to pp {re_pp} × dp {re_dp} would keep {share_re:.1%}, but every rank then holds "
        "twice the layers ({peak_re:.1f} GiB), the checkpoint is resharded across pp and the "
        "layout is untried: recover on dp first, replan for a long outage.",
        q138),
    entry(
        "q139", dict(dp=3, tp=2, steps=7, rank=1, step=5),
        "A dp {dp} × tp {tp} job saves after every step. Rank {rank} crashes in the middle of "
        "the save of step {step}. What is on disk, and where does the restarted job begin? "
        "(Simulated, {steps} steps.)",
        "The save of step {step} stopped after the {world} ranks wrote their files "
        "({files} rank files) and before the index, which is written last, once every file "
        "exists: {skipped} is an unfinished save. The newest complete one is step {last}'s, "
        "so the job resumes there and trains step {next} again; its losses then equal the "
        "never-failed run's bit for bit. Never trust a \"latest\" pointer written separately "
        "from the save: a crash can leave it pointing at the unfinished one.",
        q139),
    entry(
        "q140", dict(dp_sim=4, per_gpu_gbs=1.5, fs_tbs=2.0, tp=8, pp=16, dp=128),
        "Llama 3 405B on tp {tp} × pp {pp} × dp {dp}: how many ranks write a sharded "
        "checkpoint under DDP and under ZeRO-1, and how long does each save take if a GPU "
        "writes {per_gpu_gbs} GB/s and the storage takes {fs_tbs} TB/s?",
        "Under DDP every replica holds the same state, so only the first writes: on "
        "{dp_sim} simulated ranks DDP wrote {ddp_files} file, ZeRO-1 {zero_files}. At scale "
        "DDP's {ddp_writers} writers each write {ddp_gb:.1f} GB, {ddp_s:.1f} s; ZeRO-1's "
        "{zero_writers:,} write {zero_mb:.0f} MB each and the storage is the limit, "
        "{zero_s:.2f} s. Sharding the optimizer states also shards the save.",
        q140),
    entry(
        "q141", dict(world=2, layers=4, skipped=1),
        "A DDP job's forward skips block {skipped} of its {layers} (a layer switched off by a "
        "flag), on every one of its {world} ranks. What goes wrong?",
        "DDP launches a bucket's all-reduce once the backward of every unit it holds has "
        "ended, bucket after bucket in order. Block {skipped} runs no backward, so its "
        "bucket never fires, nor any after it: on simulated devices with small buckets, "
        "minipar stops at the end of the backward naming bucket {bucket} ({unit}) and "
        "{left} of the {total} buckets never averaged. Unchecked, each replica would step "
        "on its own gradients and drift apart silently; PyTorch refuses it at the next "
        "iteration unless built with find_unused_parameters=True, which costs a graph walk "
        "every step. Leave unused layers out of the model.",
        q141),
    entry(
        "q142", dict(world=8, slowdown=1.25, tflop=0.5, grad_mib=4, dp=128),
        "One GPU of a synchronous job computes {slowdown}x slower than the others. Tolerate "
        "it, or drain its node and give up one of the {dp} data-parallel replicas? "
        "(Simulated: {world} ranks, {tflop} TFLOP a step each, then an all-reduce of "
        "{grad_mib} MiB.)",
        "Every rank waits for the slowest at the all-reduce: the step goes from "
        "{before_ms:.3f} ms to {after_ms:.3f} ms on every rank, {slower:.1%} slower for "
        "the whole job because of one GPU. Draining its node costs one replica of {dp}, "
        "{drain:.2%} of the throughput. Drain it.",
        q142),
]
