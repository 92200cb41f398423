"""Open design and debugging questions, answered with the planner and the simulator; part of
bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson design`. An entry is a dict of the
Question's fields: the example data (`given`), the question and the answer as format
strings, and `compute`, which returns every number the answer shows. The design questions
(which layout, which memory plan, how to checkpoint, what a longer context or more GPUs
change) are answered by the planner (minipar.plan: search, rank_memory, step_time); the
debugging ones (a slow fabric, a divergence, a hang, a skipped collective, a straggler) by
runs on simulated devices (minipar.launch) whose losses, diagnoses and traces are read back,
and by the planner with a link slowed down.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tempfile
import time
from pathlib import Path

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import ParallelDims, checkpoint, parallelize
from minipar.plan import CLUSTERS, MODELS, Layout, ModelSpec, rank_memory, search, step_time
from minipar.plan.rank_states import bytes_per_parameter
from minipar.plan.search import candidates
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError)
from minipar.runtime.topology import Link

GB, GiB, MS = 10**9, 2**30, 1e-3
H100, A100 = CLUSTERS["h100"], CLUSTERS["a100"]
LLAMA70 = MODELS["llama3-70b"]
# incident A's model (lesson 10, section 9): a 70B GPT of Megatron's shape
M70 = ModelSpec("a 70B GPT", 80, 8192, 64, 4 * 8192, 51200, 4096)


# ---- helpers ---------------------------------------------------------------------------
def describe(lay: Layout) -> str:
    """'tp 4 × pp 4 × dp 32, 1F1B, the distributed optimizer, selective recompute'."""
    dims = " × ".join(f"{n} {getattr(lay, n)}" for n in ("tp", "pp", "cp", "dp")
                      if getattr(lay, n) > 1)
    parts = [dims]
    if lay.pp > 1:
        parts.append({"1f1b": "1F1B", "interleaved_1f1b": f"interleaved 1F1B ({lay.chunks} "
                      "chunks)"}.get(lay.schedule, lay.schedule))
    if lay.zero:
        parts.append(f"ZeRO-{lay.zero}")
    elif lay.distributed_optimizer:
        parts.append("the distributed optimizer")
    parts.append(f"{lay.recompute} recompute" if lay.recompute != "none" else "no recompute")
    return ", ".join(parts)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def states(r) -> float:
    """Parameters + gradients + optimizer states of a RankMemory, steady, bytes."""
    return r.parameters.steady + r.gradients.steady + r.optimizer_states.steady


def megatron(tp: int, pp: int, dp: int, batch: int, cp: int = 1, **kw) -> Layout:
    """Megatron's usual plan: SP, selective recomputation, the distributed optimizer."""
    args = dict(sequence_parallel=tp > 1, recompute="selective", distributed_optimizer=True)
    args.update(kw)
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=batch, **args)


@functools.lru_cache(maxsize=None)
def planned(model: ModelSpec, lay: Layout, cluster_name: str = "h100"):
    """(step_time, rank_memory) of a layout, without dropout (as Llama trains)."""
    cluster = CLUSTERS[cluster_name]
    return (step_time(model, lay, cluster, dropout=False),
            rank_memory(model, lay, cluster, dropout=False))


@functools.lru_cache(maxsize=None)
def searched(gpus: int, batch: int) -> tuple:
    """(candidate count, every plan that fits, fastest first) for Llama 3 70B on H100s."""
    count = sum(1 for _ in candidates(LLAMA70, gpus, H100, batch))
    return count, tuple(search(LLAMA70, gpus, H100, batch, top=None))


# the tiny GPT the simulated runs train (float64: only the reduction order differs)
TINY = GPTConfig(vocab_size=22, seq_len=7, hidden=12, num_heads=4, num_layers=2, seed=4)


def tiny_batch(n: int, seed: int):
    """n sequences of TINY, and their next-token targets: ids, targets [s, n]."""
    ids = np.random.default_rng(seed).integers(0, TINY.vocab_size, (TINY.seq_len, n))
    return ids, np.roll(ids, -1, axis=0)


# ---- runs on simulated devices ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def batch_run(batch: int, steps: int, lr: float) -> dict:
    """TINY trained `steps` AdamW steps on one device and on dp = 2 at the same global
    batch; and the first step at `batch` and at twice it (the per-GPU batch kept): the
    gradient's norm and the largest move of a weight."""
    data = [tiny_batch(2 * batch, k) for k in range(steps)]

    def program(ctx):
        run = parallelize(TINY, ParallelDims(dp_replicate=2), lr=lr, weight_decay=0.0)
        return [run.train_step(ids[:, :batch], tgt[:, :batch]) for ids, tgt in data]

    per_rank = mp.launch(program, 2)
    parallel = [float(np.mean([r[k] for r in per_rank])) for k in range(steps)]
    with mp.device():
        model = GPT(TINY)
        opt = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        single = []
        for ids, tgt in data:
            single.append(model.loss_and_grad(ids[:, :batch], tgt[:, :batch]))
            opt.step()
            opt.zero_grad()
    first = {}
    for n in (batch, 2 * batch):
        with mp.device():
            model = GPT(TINY)
            opt = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            before = [p.data.copy() for p in model.parameters()]
            model.loss_and_grad(data[0][0][:, :n], data[0][1][:, :n])
            norm = math.sqrt(sum(float(np.sum(p.grad ** 2)) for p in model.parameters()))
            opt.step()
            move = max(float(np.max(np.abs(p.data - b)))
                       for p, b in zip(model.parameters(), before))
        first[n] = (norm, move)
    return {"max_diff": max(abs(a - b) for a, b in zip(parallel, single)), "first": first}


@functools.lru_cache(maxsize=None)
def reshard_run(dp_from: int, dp_to: int, tp: int, batch: int) -> dict:
    """ZeRO-1 on dp_from x tp: a step, a sharded save, a step; then on dp_to x tp from that
    save: a load and the same second step. The files, and the two second steps compared."""
    data = [tiny_batch(batch, k) for k in (0, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)

        def program(ctx, dp, resume):
            run = parallelize(TINY, ParallelDims(dp_shard=dp, tp=tp), zero=1, lr=3e-3,
                              placement="any")
            if resume:
                checkpoint.load(run, d / "saved")
            else:
                run.train_step(*data[0])
                checkpoint.save_sharded(run, d / "saved")
            loss = run.train_step(*data[1])
            checkpoint.save_consolidated(run, d / f"after_dp{dp}")
            return loss

        first = mp.launch(lambda ctx: program(ctx, dp_from, False), dp_from * tp)
        second = mp.launch(lambda ctx: program(ctx, dp_to, True), dp_to * tp)
        files = sorted((d / "saved").glob("rank*.npz"))
        with np.load(files[0]) as f:
            shard = sum(f[k].size for k in f.files if not k.startswith("meta/"))
        a, b = (checkpoint.read_full_state(d / f"after_dp{dp}") for dp in (dp_from, dp_to))
    params = sum(v.size for k, v in a.items() if k.startswith("param/"))
    diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a if k != "meta/step")
    # a dp block's loss is its mean; the global batch's is the mean over the blocks
    losses = [float(np.mean(first)), float(np.mean(second))]
    return {"files": len(files), "shard": int(shard), "params": int(params),
            "losses": losses, "max_diff": diff}


def write_checkpoint_alone(seconds: float) -> None:
    """Rank 0 writing the whole checkpoint by itself: work minipar does not see."""
    time.sleep(seconds)


@functools.lru_cache(maxsize=None)
def hang_run(world: int, save_every: int, timeout_s: float, save_s: float) -> dict:
    """Every step all-reduces; after step save_every rank 0 also writes a checkpoint alone,
    for longer than the watchdog's timeout. The watchdog's diagnosis, read back."""

    def program(ctx):
        for step in range(1, save_every + 2):
            mp.all_reduce(np.full(4, float(step)))  # the step's gradients
            if step % save_every == 0 and ctx.rank == 0:
                write_checkpoint_alone(save_s)

    try:
        mp.launch(program, world, timeout=timeout_s)
    except CollectiveTimeoutError as e:
        text = str(e)
    else:
        raise RuntimeError("the watchdog did not fire: the save was shorter than the timeout")
    absent = re.search(r"Ranks that never arrived: \[([\d, ]+)\]", text).group(1)
    where = re.search(r"never arrived: running outside minipar, now at \S+ in (\w+)", text)
    calls = {int(c) for c in re.findall(r"waiting in all_reduce .*?\(call #(\d+)", text)}
    waiting = len(re.findall(r"^  rank \d+: waiting in", text, re.M))
    if len(calls) != 1:
        raise RuntimeError(f"the waiting ranks wait in different calls: {calls}")
    return {"absent": absent, "where": where.group(1), "call": calls.pop(),
            "waiting": waiting}


@functools.lru_cache(maxsize=None)
def skip_run(world: int, steps: int, rank: int, skip_step: int) -> dict:
    """Rank `rank` skips its all-reduce of step `skip_step` (it saw a non-finite loss and
    skipped the step on its own); then one rank issues two all-reduces in swapped order,
    equal shapes, and again with different shapes. What the runtime says, what ranks get."""
    got: dict[int, list] = {r: [] for r in range(world)}

    def grads(step, r):
        return np.full(3, 1000.0 * step + r)  # each step's and rank's values unique

    def skipping(ctx):
        for step in range(1, steps + 1):
            if ctx.rank == rank and step == skip_step:
                continue
            got[ctx.rank].append((step, mp.all_reduce(grads(step, ctx.rank))[0]))

    try:
        mp.launch(skipping, world)
    except DeadlockError as e:
        text = str(e)
    else:
        raise RuntimeError("a skipped collective was not diagnosed")
    hang = {int(c) for c in re.findall(r"\(call #(\d+) of that group\)", text)}
    finished = re.findall(r"^  rank (\d+): finished", text, re.M)
    expected = lambda step: sum(1000.0 * step + r for r in range(world))
    wrong = [step for step, value in got[0] if value != expected(step)]

    def swapped(shapes):
        def program(ctx):
            a, b = np.full(shapes[0], 1.0 + ctx.rank), np.full(shapes[1], 10.0 * (1 + ctx.rank))
            if ctx.rank == rank:
                y, x = mp.all_reduce(b), mp.all_reduce(a)
            else:
                x, y = mp.all_reduce(a), mp.all_reduce(b)
            return x[0], y[0]
        return program

    res = mp.launch(swapped((4, 4)), world)
    right = (sum(1.0 + r for r in range(world)), sum(10.0 * (1 + r) for r in range(world)))
    try:
        mp.launch(swapped((4, 6)), world)
    except CollectiveMismatchError as e:
        caught = type(e).__name__
    else:
        raise RuntimeError("all-reduces of different shapes were not diagnosed")
    if len(hang) != 1:
        raise RuntimeError(f"the waiting ranks wait in different calls: {hang}")
    return {"hang": hang.pop(), "finished": ", ".join(finished), "wrong": len(wrong),
            "first_wrong": min(wrong), "swap_wrong": sum(r != right for r in res),
            "caught": caught}


@functools.lru_cache(maxsize=None)
def straggler_run(world: int, slow_rank: int, slowdown: float, onset: int, steps: int,
                  tflop: float, grad_mib: int) -> dict:
    """Each step: `tflop` TFLOPs of compute, then an all-reduce of `grad_mib` MiB of float32
    gradients; from step `onset` rank `slow_rank` computes `slowdown` times slower. Each
    rank's all-reduces: (issued, start, end) on the simulated clock."""
    grads = np.ones(grad_mib * 2**20 // 4, np.float32)

    def program(ctx):
        out = []
        for step in range(1, steps + 1):
            slow = slowdown if ctx.rank == slow_rank and step >= onset else 1.0
            ctx.compute(tflop * 1e12 * slow, dtype="bfloat16")
            start = len(ctx.trace.events)
            mp.all_reduce(grads)
            e = [e for e in ctx.trace.events[start:] if e.stream == "comm"][0]
            out.append((e.meta["issued"], e.start, e.end))
        return out

    return {"events": mp.launch(program, world, topology=mp.Topology.single_node(world))}


# ---- the questions' numbers ------------------------------------------------------------
def q143(gpus, batch):
    """Pick TP/PP/DP for Llama 3 70B: the search's best, runner-up and TP 8 x PP 8."""
    count, plans = searched(gpus, batch)
    best, second = plans[0], plans[1]
    rank88, p88 = next((i + 1, p) for i, p in enumerate(plans)
                       if p.layout.tp == 8 and p.layout.pp == 8)
    t = best.time
    return {"cands": count, "fit": len(plans), "cap_gib": H100.device.memory_bytes / GiB,
            "best": describe(best.layout),
            "best_s": t.seconds, "best_mfu": t.mfu, "best_peak_gib": best.memory.peak / GiB,
            "z3_raw_s": t.communication["zero3"], "z3_exposed_s": t.terms["zero3"],
            "compute_s": t.compute, "second": describe(second.layout),
            "second_more": second.time.seconds / t.seconds - 1,
            "second_bubble": second.time.terms["pipeline"] / second.time.seconds,
            "second_peak_gib": second.memory.peak / GiB, "rank88": ordinal(rank88),
            "t88_s": p88.time.seconds, "t88_more": p88.time.seconds / t.seconds - 1}


def q144(dp, tp, pp, m):
    """ZeRO-3 alone against ZeRO-1 with full recompute (and ZeRO-3 with selective), for
    Llama 3 70B at 8k on dp x tp x pp A100s."""
    out = {"cap_gib": A100.device.memory_bytes / GiB}
    for tag, zero, rc in (("z3", 3, "none"), ("z1f", 1, "full"), ("z3s", 3, "selective")):
        lay = Layout(dp=dp, tp=tp, pp=pp, global_batch=m * dp, sequence_parallel=True,
                     recompute=rc, zero=zero, fp32_grads=False)
        st, mem = planned(LLAMA70, lay, "a100")
        out[f"{tag}_peak_gib"] = mem.peak / GiB
        out[f"{tag}_states_gib"] = states(mem) / GiB
        out[f"{tag}_acts_gib"] = mem.activations.steady / GiB
        out[f"{tag}_s"], out[f"{tag}_mfu"] = st.seconds, st.mfu
        if tag == "z3":
            out["held"] = mem.in_flight
    out["z1f_more"] = out["z1f_s"] / out["z3s_s"] - 1
    out["layers"] = LLAMA70.layers // pp
    shown = {"cap_gib", "held", "layers", "z1f_more", "z3_peak_gib", "z3_states_gib",
             "z3_acts_gib", "z1f_peak_gib", "z1f_states_gib", "z1f_acts_gib", "z1f_s",
             "z1f_mfu", "z3s_peak_gib", "z3s_s", "z3s_mfu"}
    return {k: v for k, v in out.items() if k in shown}


def q145(gpus, tp, pp, batch, s_to, cp):
    """Llama 3 70B from 8k to s_to tokens at the same tokens a step: memory, recompute,
    context parallelism, the bubble and attention's s²."""
    s_from = LLAMA70.seq_len
    long = dataclasses.replace(LLAMA70, seq_len=s_to)
    b_to = batch * s_from // s_to
    dp = gpus // (tp * pp)
    st8, mem8 = planned(LLAMA70, megatron(tp, pp, dp, batch))
    st32, mem32 = planned(long, megatron(tp, pp, dp, b_to))
    full, full_mem = planned(long, megatron(tp, pp, dp, b_to, recompute="full"))
    ctx, ctx_mem = planned(long, megatron(tp, pp, dp // cp, b_to, cp=cp))
    return {"tokens_m": batch * s_from / 1e6, "b_to": b_to, "peak8": mem8.peak / GiB,
            "peak32": mem32.peak / GiB, "full_peak": full_mem.peak / GiB,
            "full_s": full.seconds, "sel_s": st32.seconds, "cp_dp": dp // cp,
            "cp_peak": ctx_mem.peak / GiB, "cp_s": ctx.seconds, "m32": st32.microbatches,
            "cp_m": ctx.microbatches, "bub32": st32.bubble_fraction,
            "cp_bub": ctx.bubble_fraction, "attn8_s": st8.terms["attention"],
            "attn32_s": ctx.terms["attention"], "step8_s": st8.seconds}


def q146(batch, tp, pp, gpus_from, gpus_to, pp_fix):
    """Strong scaling at a fixed global batch: m = B/dp falls and the bubble grows."""
    out = {"ideal": gpus_to // gpus_from}
    for tag, gpus, p in (("from", gpus_from, pp), ("to", gpus_to, pp), ("fix", gpus_to,
                                                                        pp_fix)):
        dp = gpus // (tp * p)
        st, mem = planned(LLAMA70, megatron(tp, p, dp, batch))
        out[f"dp_{tag}"], out[f"m_{tag}"] = dp, st.microbatches
        out[f"{tag}_s"], out[f"mfu_{tag}"] = st.seconds, st.mfu
        out[f"bub_{tag}"] = st.bubble_fraction
        if tag == "fix":
            out["fix_peak_gib"] = mem.peak / GiB
    out["speedup"] = out["from_s"] / out["to_s"]
    return out


def q147(gpus, node_write_gbs, fs_gbs, mtbf_h):
    """Llama 3 70B's checkpoint: its bytes, a save through one rank against every rank
    writing its shard, and Young's interval sqrt(2 δ MTBF) for each."""
    psi = LLAMA70.parameters()
    w, g, k = bytes_per_parameter(Layout(distributed_optimizer=True))
    size = psi * (w + k)  # the weights and the optimizer's states; gradients are not saved
    nodes = gpus // H100.gpus_per_node
    one_s = size / (node_write_gbs * GB)
    rate = min(nodes * node_write_gbs, fs_gbs) * GB
    shard_s = size / rate
    M = mtbf_h * 3600
    out = {"psi_b": psi / 1e9, "saved_b": w + k, "held_b": w + g + k, "ckpt_gb": size / GB,
           "per_gpu_gb": size / gpus / GB, "one_min": one_s / 60, "nodes": nodes,
           "rate_gbs": rate / GB, "shard_s": shard_s}
    for tag, delta in (("one", one_s), ("shard", shard_s)):
        tau = math.sqrt(2 * delta * M)
        out[f"young_{tag}_min"] = tau / 60
        out[f"lost_{tag}"] = delta / tau + tau / (2 * M)  # saving + half an interval redone
    return out


def q148(dp_from, dp_to, tp, batch):
    """Resuming a ZeRO-1 run on fewer data-parallel replicas from a sharded checkpoint."""
    r = reshard_run(dp_from, dp_to, tp, batch)
    return {"files": r["files"], "shard": r["shard"], "params": r["params"],
            "loss": r["losses"][0], "loss_diff": abs(r["losses"][0] - r["losses"][1]),
            "max_diff": r["max_diff"], "world_to": dp_to * tp,
            "per_from": batch // dp_from, "per_to": batch // dp_to}


def q149(gpus_from, gpus_to, per_gpu, s, lr, sim_batch, sim_steps, sim_lr):
    """Loss diverged after 8 -> 64 GPUs at the same per-GPU batch (lr scaled linearly)."""
    r = batch_run(sim_batch, sim_steps, sim_lr)
    (n_small, step_small), (n_big, step_big) = (r["first"][n]
                                                for n in (sim_batch, 2 * sim_batch))
    ratio = gpus_to / gpus_from
    return {"batch_from": gpus_from * per_gpu, "batch_to": gpus_to * per_gpu,
            "tokens_from_m": gpus_from * per_gpu * s / 1e6,
            "tokens_to_m": gpus_to * per_gpu * s / 1e6, "lr_linear": lr * ratio,
            "lr_sqrt": lr * math.sqrt(ratio), "sim_batch2": 2 * sim_batch,
            "step_small": step_small, "step_big": step_big, "norm_ratio": n_big / n_small,
            "same_diff": r["max_diff"]}


def q150(gpus, batch, slower):
    """'TP 16 is 8x slower': the planner's tp 16 against tp 8, and the inter-node bandwidth
    at which tp 16's step would be `slower` times tp 8's."""
    t16 = Layout(tp=16, pp=4, dp=gpus // 64, global_batch=batch, sequence_parallel=True,
                 distributed_optimizer=True)
    t8 = dataclasses.replace(t16, tp=8, dp=gpus // 32)
    base8, _ = planned(M70, t8)
    base16, _ = planned(M70, t16)
    target = slower * base8.seconds

    def at(bw):
        cluster = dataclasses.replace(H100, inter=Link(H100.inter.name, bw,
                                                       H100.inter.latency))
        return step_time(M70, t16, cluster, dropout=False)

    # the step grows with x = 1/bandwidth, almost linearly (the collectives' S/B terms):
    # regula falsi on x, Illinois' variant, keeping the root bracketed
    a, b = 1 / H100.inter.bandwidth, 1 / 1e6  # the nominal link, and 1 MB/s
    fa, fb = at(1 / a).seconds - target, at(1 / b).seconds - target
    if not fa < 0 < fb:
        raise RuntimeError("the target step is not between the nominal link's and 1 MB/s's")
    kept = 0
    for _ in range(100):
        x = (a * fb - b * fa) / (fb - fa)
        fx = at(1 / x).seconds - target
        if abs(fx) <= 1e-9 * target:
            break
        if fx < 0:
            a, fa = x, fx
            fb, kept = (fb / 2, -1) if kept == -1 else (fb, -1)
        else:
            b, fb = x, fx
            fa, kept = (fa / 2, 1) if kept == 1 else (fa, 1)
    else:
        raise RuntimeError("regula falsi did not converge")
    hi = 1 / x
    slow = at(hi)
    return {"tp8_s": base8.seconds, "tp16_s": base16.seconds,
            "ratio": base16.seconds / base8.seconds, "target_s": target,
            "bw_gbs": hi / GB, "bw_factor": H100.inter.bandwidth / hi,
            "ib_gbs": H100.inter.bandwidth / GB,
            "node_gbit": hi * H100.gpus_per_node * 8 / 1e9,
            "tp_share": slow.terms["tp"] / slow.seconds}


def q151(world, save_every, timeout_s, save_s):
    """A hang at a round step: the watchdog names the rank that never arrived."""
    r = hang_run(world, save_every, timeout_s, save_s)
    return {"waiting": r["waiting"], "call": r["call"], "wait_step": r["call"] + 1,
            "absent": r["absent"], "where": r["where"]}


def q152(world, steps, rank, skip_step):
    """One rank skipped one collective: where the runtime notices, and what it does not."""
    r = skip_run(world, steps, rank, skip_step)
    return {"hang": r["hang"], "hang_step": r["hang"] + 1, "finished": r["finished"],
            "wrong": r["wrong"], "first_wrong": r["first_wrong"],
            "swap_wrong": r["swap_wrong"], "caught": r["caught"]}


def q153(world, slow_rank, slowdown, onset, steps, tflop, grad_mib):
    """A straggler: everyone's step grows; the trace names the rank that does not wait."""
    ev = straggler_run(world, slow_rank, slowdown, onset, steps, tflop, grad_mib)["events"]
    ends = [e[2] for e in ev[0]]
    step = [b - a for a, b in zip([0.0] + ends, ends)]  # each step's length on the clock
    waits = [e[onset - 1][1] - e[onset - 1][0] for e in ev]  # start - issued, at `onset`
    found = min(range(world), key=lambda r: waits[r])
    others = [w for r, w in enumerate(waits) if r != found]
    return {"before_ms": step[onset - 2] / MS, "after_ms": step[onset - 1] / MS,
            "slower_pct": step[onset - 1] / step[onset - 2] - 1, "found": found,
            "wait_ms": max(others) / MS, "own_ms": waits[found] / MS}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="design", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q143", dict(gpus=512, batch=1536),
        "Pick TP, PP and DP for Llama 3 70B on {gpus} H100s (nodes of 8, 80 GB), {batch} "
        "sequences of 8192 tokens a step. Which layout, why, and what does the runner-up "
        "lose?",
        "Of the {cands} layouts the planner enumerates (`plan.search`: tp a power of two, pp "
        "a divisor of the 80 layers, dp the rest; schedule, ZeRO and recompute choices), "
        "{fit} fit in {cap_gib:.1f} GiB. The fastest is {best}: {best_s:.2f} s a step, MFU "
        "{best_mfu:.1%}, peak {best_peak_gib:.1f} GiB. tp 4 stays inside a node, no pipeline "
        "means no bubble, and ZeRO-3's {z3_raw_s:.1f} s of all-gathers and reduce-scatters a "
        "step hide behind {compute_s:.1f} s of compute ({z3_exposed_s:.2f} s exposed) — if "
        "the prefetch overlaps them, which is the first thing to verify in a profile. The "
        "runner-up, {second}, is {second_more:.1%} slower: its bubble is {second_bubble:.1%} "
        "of the step and it peaks at {second_peak_gib:.1f} GiB, little room for "
        "fragmentation. The textbook TP 8 × PP 8 comes {rank88} ({t88_s:.2f} s, "
        "{t88_more:.1%} slower).",
        q143),
    entry(
        "q144", dict(dp=8, tp=4, pp=2, m=6),
        "Llama 3 70B at 8192 tokens on A100s of 80 GB, dp {dp} × tp {tp} × pp {pp} with SP "
        "and 1F1B over {m} micro-batches, does not fit. Which fixes it: ZeRO-3 alone, or "
        "ZeRO-1 with full recomputation?",
        "ZeRO-1 with full recomputation. ZeRO shards model states, and they are not the "
        "problem: ZeRO-3 cuts them to {z3_states_gib:.1f} GiB, but the first pipeline rank "
        "still holds {held} micro-batches of {layers} layers' activations, {z3_acts_gib:.0f} "
        "GiB, a peak of {z3_peak_gib:.0f} GiB against the device's {cap_gib:.1f} GiB. Full "
        "recomputation keeps each layer's input only ({z1f_acts_gib:.1f} GiB) beside "
        "ZeRO-1's {z1f_states_gib:.1f} GiB of states: {z1f_peak_gib:.1f} GiB at the peak, a "
        "step of {z1f_s:.2f} s, MFU {z1f_mfu:.1%}. Faster still: ZeRO-3 with selective "
        "recomputation, {z3s_peak_gib:.1f} GiB and {z3s_s:.2f} s, MFU {z3s_mfu:.1%} (ZeRO-1 "
        "with full recomputation takes {z1f_more:.1%} longer). Count activations before "
        "reaching for ZeRO.",
        q144),
    entry(
        "q145", dict(gpus=384, tp=8, pp=4, batch=1152, s_to=32768, cp=2),
        "Llama 3 70B trains on {gpus} H100s with tp {tp} × pp {pp}, SP, selective "
        "recomputation and the distributed optimizer, {batch} sequences of 8192 tokens a "
        "step. The next phase needs {s_to}-token sequences at the same tokens a step. What "
        "breaks, and what is the fix?",
        "The same {tokens_m:.1f}M tokens are {b_to} sequences. A sequence's activations grow "
        "with its length, so the first rank peaks at {peak32:.0f} GiB instead of "
        "{peak8:.1f}: it no longer fits. Full recomputation fits ({full_peak:.1f} GiB) at "
        "{full_s:.1f} s a step (selective, if it fitted: {sel_s:.1f} s). Context parallelism "
        "over cp {cp} (dp {cp_dp}) divides the sequence instead: {cp_peak:.1f} GiB, "
        "{cp_s:.1f} s, and gives back micro-batches, m = {cp_m} instead of {m32}, and with "
        "them the bubble: {cp_bub:.1%} instead of {bub32:.1%}. No layout removes attention's "
        "s²: its GEMMs take {attn32_s:.1f} s a step against {attn8_s:.1f} s at 8k, so the "
        "step grows from {step8_s:.1f} s whatever the plan.",
        q145),
    entry(
        "q146", dict(batch=480, tp=8, pp=16, gpus_from=256, gpus_to=1536, pp_fix=4),
        "A Llama 3 70B run at tp {tp} × pp {pp} with {batch} sequences a step (the batch its "
        "learning-rate schedule was tuned for) moves from {gpus_from} to {gpus_to} H100s. "
        "Does the step shrink in proportion? If not, why, and what helps?",
        "No. dp goes from {dp_from} to {dp_to}, so each pipeline runs m = B/dp = {m_from} "
        "micro-batches, then {m_to}. The planner: {from_s:.2f} s, then {to_s:.2f} s, x"
        "{speedup:.2f} for {ideal}x the GPUs; MFU {mfu_from:.1%}, then {mfu_to:.1%}, because "
        "the bubble of the dry run grows from {bub_from:.1%} to {bub_to:.1%} of the ideal "
        "time: the pipeline's fill and drain do not shrink with the work. Fewer stages help: "
        "pp {pp_fix} (dp {dp_fix}, m = {m_fix}, bubble {bub_fix:.1%}) steps in {fix_s:.2f} "
        "s at MFU {mfu_fix:.1%} and still fits ({fix_peak_gib:.1f} GiB). Past that, only a "
        "larger global batch, if the optimization tolerates it, uses more GPUs well.",
        q146),
    entry(
        "q147", dict(gpus=512, node_write_gbs=2.5, fs_gbs=120, mtbf_h=41),
        "Llama 3 70B trains with AdamW on {gpus} H100s. How large is a checkpoint, how long "
        "does a save take if rank 0 writes it at one node's {node_write_gbs} GB/s, or every "
        "rank its shard (the file system takes {fs_gbs} GB/s in all), and how often should "
        "the job save if it fails every {mtbf_h} h?",
        "Ψ = {psi_b:.2f}B. A checkpoint holds the bf16 weights and the float32 master, m and "
        "v: {saved_b} bytes a parameter of the {held_b} in memory (the float32 gradients are "
        "not saved), {ckpt_gb:.0f} GB. Through rank 0 a save takes "
        "{one_min:.1f} min (and needs the whole state on one host); sharded, each GPU writes "
        "{per_gpu_gb:.2f} GB and the {nodes} nodes together {rate_gbs:.0f} GB/s, the file "
        "system's limit: {shard_s:.1f} s. Young's interval sqrt(2 δ MTBF) is "
        "{young_one_min:.0f} min against {young_shard_min:.1f} min, and the time lost to "
        "saving and redoing half an interval {lost_one:.1%} against {lost_shard:.2%}.",
        q147),
    entry(
        "q148", dict(dp_from=4, dp_to=3, tp=2, batch=36),
        "A node of a ZeRO-1 job on dp {dp_from} × tp {tp} ({batch} sequences a step) dies and "
        "there is no spare. Can the job resume at dp {dp_to} from its last sharded "
        "checkpoint, and is it then the same run?",
        "Yes, if the checkpoint records where each piece sits in the full tensors: a load at "
        "another layout cuts the same full state another way. On simulated devices, a tiny "
        "GPT of {params:,} parameters wrote {files} rank files of {shard:,} elements each "
        "(1/{dp_from} of one tp half's weights, Adam's m and v, with the LayerNorms both "
        "halves hold); resumed on {world_to} ranks at dp {dp_to}, the next step's loss is "
        "{loss:.6f}, {loss_diff:.1e} "
        "from the run that went on at dp {dp_from}, and every weight and moment after it "
        "agrees to {max_diff:.1e} (float64: only the order of the sums differs). The global "
        "batch stays {batch}: {per_to} sequences a replica instead of {per_from}. Keep the "
        "global batch, not the per-GPU one, and it is the same run; tp and pp could change "
        "the same way, at the price of reading every shard.",
        q148),
    entry(
        "q149", dict(gpus_from=8, gpus_to=64, per_gpu=3, s=4096, lr=3e-4, sim_batch=6,
                     sim_steps=4, sim_lr=3e-3),
        "A run trained well on {gpus_from} GPUs, {per_gpu} sequences of {s} tokens each, "
        "AdamW with a peak learning rate of {lr}. On {gpus_to} GPUs, with the same per-GPU "
        "batch and the learning rate scaled with the GPU count as the team's recipe says, "
        "the loss diverged. What changed, and how do you show it is not the parallelism?",
        "The global batch went from {batch_from} to {batch_to} sequences ({tokens_from_m:.3f}M "
        "to {tokens_to_m:.3f}M tokens a step) and the peak learning rate to {lr_linear:.1e}. "
        "Scaling it with the batch is SGD's rule, whose step is lr · g; Adam divides by the "
        "gradient's RMS, so its step is about lr whatever the batch. On a simulated device a "
        "tiny GPT's first AdamW step at lr {sim_lr} moves a weight by at most "
        "{step_small:.6f} at {sim_batch} sequences and {step_big:.6f} at {sim_batch2}, though "
        "the larger batch's gradient norm is {norm_ratio:.1%} of the smaller's: the scaled "
        "run's steps grow with its learning rate. Use at most the square-root rule "
        "({lr_sqrt:.1e}) with a longer warm-up, and retune. The parallelism itself is exact: "
        "dp = 2 at the same "
        "global batch of {sim_batch} follows one device's loss to {same_diff:.1e} over "
        "{sim_steps} steps.",
        q149),
    entry(
        "q150", dict(gpus=256, batch=512, slower=8),
        "A 70B GPT (80 layers, h = 8192, s = 4096) on {gpus} H100s with tp 16 × pp 4, SP, "
        "{batch} sequences a step, is {slower}x slower than the same run with tp 8 inside "
        "the node. Is tp 16 crossing the node the whole story?",
        "No. The planner puts tp 16 at {tp16_s:.2f} s and tp 8 at {tp8_s:.2f} s: "
        "x{ratio:.2f}, not {slower}. A {target_s:.1f} s step needs the inter-node links to "
        "carry {bw_gbs:.2f} GB/s a GPU, 1/{bw_factor:.0f} of InfiniBand NDR's {ib_gbs:.0f} "
        "({node_gbit:.0f} Gb/s a node; the tensor-parallel collectives would then be "
        "{tp_share:.0%} of the step). That is the rate of NCCL over TCP sockets on the "
        "hosts' Ethernet, or of a fabric saturated by other jobs, not of a healthy fabric: "
        "check NCCL_DEBUG=INFO for NET/Socket instead of NET/IB, run nccl-tests across two "
        "nodes, then bring tp back inside the node.",
        q150),
    entry(
        "q151", dict(world=6, save_every=3, timeout_s=0.1, save_s=0.4),
        "A job dies with an NCCL timeout at step 10,000 exactly, after 9,999 clean steps. "
        "What do you suspect, and how do you find the rank? (Simulated: {world} ranks, a "
        "save every {save_every} steps, launch(timeout={timeout_s}).)",
        "Something done every so many steps by some ranks only: a checkpoint written by rank "
        "0, an evaluation, a log call that holds a collective. The watchdog names it: "
        "{waiting} ranks wait in all-reduce call #{call}, step {wait_step}'s gradients, and "
        "rank {absent} never arrived, running outside the runtime in {where} ({save_s} s "
        "against a {timeout_s} s timeout). The rank to look at is the one missing from the "
        "collective, not the ones that report the timeout (in PyTorch, compare the ranks' "
        "last collective sequence numbers, e.g. in the NCCL flight recorder's dumps: the "
        "laggard's is behind). Fix "
        "the cause: every rank writes its shard, or the save runs asynchronously; raising "
        "the timeout past the save only hides it.",
        q151),
    entry(
        "q152", dict(world=7, steps=6, rank=3, skip_step=2),
        "Rank {rank} of {world} saw a non-finite loss at step {skip_step} and skipped that "
        "step — and its gradient all-reduce — on its own. What does the runtime notice, "
        "and when? (Simulated, {steps} steps.)",
        "Collectives are matched by their order in the group, so nothing is noticed at step "
        "{skip_step}: from there rank {rank}'s step k + 1 gradients are summed with the "
        "others' step k, {wrong} wrong all-reduces from step {first_wrong}, without an "
        "error. Only at step {hang_step} (call #{hang}) is it caught, as a deadlock here and "
        "a timeout on a cluster: rank {finished} has no call left and the others wait for "
        "it. Two all-reduces of equal shapes "
        "issued in swapped order on one rank are never caught: all {swap_wrong} ranks get "
        "wrong sums. With different shapes minipar raises {caught}; NCCL itself checks "
        "nothing "
        "(PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does). Decide to skip a step "
        "collectively (all-reduce the overflow flag), and look for the cause before the hang.",
        q152),
    entry(
        "q153", dict(world=6, slow_rank=5, slowdown=1.3, onset=3, steps=4, tflop=1.5,
                     grad_mib=2),
        "From step 10,000 on, a data-parallel job's steps are slower, with no error and a "
        "normal loss. How do you find the cause? (Simulated: {world} ranks, each step "
        "{tflop} TFLOP of compute a rank, then an all-reduce of {grad_mib} MiB of gradients; "
        "from step {onset} of {steps} one GPU computes {slowdown}x slower.)",
        "A synchronous step runs at the pace of its slowest rank: the all-reduce starts when "
        "the last rank arrives. On the simulated clock every rank's step goes from "
        "{before_ms:.3f} ms to {after_ms:.3f} ms (+{slower_pct:.1%}), so the step time names "
        "no one. The trace does: at step {onset} the other ranks wait {wait_ms:.3f} ms inside "
        "the all-reduce for it to start, and rank {found} waits {own_ms:.3f} ms. The "
        "straggler is the rank that does not wait (here rank {slow_rank}, throttled). On a "
        "cluster: each rank's time before its collectives (or its time inside NCCL "
        "kernels), then that GPU's clocks and throttle reasons (nvidia-smi -q -d "
        "PERFORMANCE), or drain the node.",
        q153),
]
