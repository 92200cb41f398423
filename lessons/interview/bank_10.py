"""Interview questions on lesson 10 (planning a run), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 10`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the planner (minipar.plan:
rank_memory, step_time, the GEMM efficiency, the elementwise bytes, the pipeline's dry run,
the FLOP counts and ZeRO's table) and the runtime's cost model (minipar.runtime.cost).
"""

from __future__ import annotations

import dataclasses
import functools

from minipar.plan import (A100_MEGATRON, CLUSTERS, MODELS, Layout, ModelSpec, model_flops,
                          model_flops_full_recompute, model_state_bytes, pipeline_dry_run,
                          rank_memory, selective_recompute_extra_flops, step_time)
from minipar.plan.compute_time import layer_bytes, layer_gemms, shape_of
from minipar.plan.rank_states import bytes_per_parameter
from minipar.runtime.cost import collective_cost
from minipar.runtime.topology import Topology

GB, GiB, MS = 10**9, 2**30, 1e-3
H100, A100 = CLUSTERS["h100"], CLUSTERS["a100"]


def gpt(name: str, layers: int, h: int, heads: int, s: int, vocab: int = 51200) -> ModelSpec:
    """A GPT of Megatron's shape: a GeLU MLP of 4h, biases, LayerNorm, learned positions."""
    return ModelSpec(name, layers, h, heads, 4 * h, vocab, s)


# the three incidents' models at their reported scale (lesson 10, section 9)
M70 = gpt("a 70B GPT", 80, 8192, 64, 4096)
M200 = gpt("a 200B dense GPT", 128, 11264, 88, 2048)
M13 = gpt("GPT-3 13B", 40, 5120, 40, 2048)


def states(r) -> float:
    """Parameters + gradients + optimizer states of a RankMemory, steady, bytes."""
    return r.parameters.steady + r.gradients.steady + r.optimizer_states.steady


@functools.lru_cache(maxsize=None)
def timed(model: ModelSpec, lay: Layout, cluster_name: str = "h100"):
    """(step_time, rank_memory) of a layout, Llama-style without dropout."""
    cluster = CLUSTERS[cluster_name]
    return (step_time(model, lay, cluster, dropout=False),
            rank_memory(model, lay, cluster, dropout=False))


# ---- the questions' numbers ------------------------------------------------------------
def q92(psi_b, mp, dp, gpu_gb):
    """Megatron's 18 bytes a parameter against ZeRO's 16, and the distributed optimizer."""
    psi = psi_b * 1e9 / mp  # a GPU's parameters under tp x pp = mp
    w, g, k = bytes_per_parameter(Layout())  # bf16 with Megatron's fp32 main_grad
    w16, g16, k16 = bytes_per_parameter(Layout(fp32_grads=False))
    dist = model_state_bytes(psi, 1, dp, k=k, param_bytes=w, grad_bytes=g)["total"]
    return {"b18": w + g + k, "b16": w16 + g16 + k16, "gb18": psi * (w + g + k) / GB,
            "gb16": psi * (w16 + g16 + k16) / GB, "dist_b": dist / psi, "dist_gb": dist / GB,
            "under": 1 - (w16 + g16 + k16) / (w + g + k), "left_gb": gpu_gb - dist / GB}


def q93(tp, pp, chunks):
    """Korthikanti et al.'s Figure 1 for the 530B: the layers alone, and the whole stage."""
    lay = Layout(tp=tp, pp=pp, schedule="interleaved_1f1b", chunks=chunks, global_batch=280,
                 sequence_parallel=True, recompute="selective")
    layers, whole = (rank_memory(MODELS["530b"], lay, scope=scope) for scope in ("layers",
                                                                                 "model"))
    return {"layers_per_rank": layers.params.layers, "layers_gib": states(layers) / GiB,
            "model_gib": states(whole) / GiB, "more": states(whole) / states(layers) - 1,
            "ends_m": whole.params.ends / 1e6,
            "acts_gib": layers.activations.steady / GiB, "held": layers.in_flight}


def q94(layers, h, a, s, t, p, m, v):
    """Micro-batches in flight on the first rank: GPipe, 1F1B and interleaved 1F1B."""
    model = gpt("a GPT", layers, h, a, s)
    out = {}
    for name, sched, chunks in (("gpipe", "gpipe", 1), ("f1b", "1f1b", 1),
                                ("inter", "interleaved_1f1b", v)):
        lay = Layout(tp=t, pp=p, schedule=sched, chunks=chunks, global_batch=m,
                     sequence_parallel=True, recompute="selective")
        r = rank_memory(model, lay, scope="layers")
        out[f"{name}_n"] = r.in_flight
        out[f"{name}_layers"] = r.in_flight * layers // (p * chunks)
        out[f"{name}_gb"] = r.activations.steady / GB
    out["layer_mb"] = r.layer_activations / 1e6
    return out


def q95(layers, h, a, s, vocab, batch, gpus, step_s):
    """MFU against HFU from the FLOP counts, and the two conventions for selective."""
    model = gpt("a GPT", layers, h, a, s, vocab)
    peak = A100.device.peak("bfloat16")
    denom = step_s * gpus * peak
    mflops = model_flops(batch, s, layers, h, vocab)
    sel = step_time(model, Layout(tp=8, pp=gpus // 8, global_batch=batch,
                                  sequence_parallel=True, recompute="selective"), A100)
    return {"model_pf": mflops / 1e15, "mfu": mflops / denom,
            "hfu_full": model_flops_full_recompute(batch, s, layers, h, vocab) / denom,
            "hfu_sel": sel.hardware_flops / denom,
            "hfu_qk": (mflops + selective_recompute_extra_flops(batch, s, layers, h)) / denom}


def q96(s, h, d, t, peak_tflops):
    """The GEMM efficiency: attention's s² matmuls against the MLP's."""
    scores = (s, s, d)  # one head: (s, s, d)
    mlp = (s, 4 * h // t, h)  # the MLP's up-projection on a tp rank
    out = {}
    for name, (M, N, K) in (("scores", scores), ("mlp", mlp)):
        out[f"{name}_eff"] = A100_MEGATRON(M, N, K)
        out[f"{name}_us_per_gflop"] = A100_MEGATRON.seconds(M, N, K, peak_tflops * 1e12) \
            / (2 * M * N * K / 1e9) / 1e-6
    out["g_d"] = A100_MEGATRON.g(d)
    out["slower"] = out["scores_us_per_gflop"] / out["mlp_us_per_gflop"]
    return out


def q97(s, b, h, a, t):
    """A layer's elementwise bytes at HBM speed against its GEMMs (tp + SP, dropout)."""
    model = gpt("a GPT", 1, h, a, s)
    sh = shape_of(model, Layout(tp=t, micro_batch=b, global_batch=b, sequence_parallel=True))
    x = layer_bytes(sh)
    peak = H100.device.peak("bfloat16")
    gemm = 3 * sum(A100_MEGATRON.seconds(g.M, g.N, g.K, peak, g.count)
                   for g in layer_gemms(sh))
    total = x.forward + x.backward + x.core_forward + x.core_backward
    return {"stream_gb": (x.forward + x.backward) / GB,
            "core_gb": (x.core_forward + x.core_backward) / GB,
            "ms": total / H100.memory_bandwidth / MS, "gemm_ms": gemm / MS,
            "share": total / H100.memory_bandwidth / gemm}


def q98(p, m, t_f_ms, t_b_ms, last_f_ms, last_b_ms):
    """A heavier last stage stretches 1F1B's bubble: the dry run against the closed form."""
    F = [t_f_ms] * (p - 1) + [last_f_ms]
    B = [t_b_ms] * (p - 1) + [last_b_ms]
    run = pipeline_dry_run("1f1b", p, m, 1, {"F": F, "B": B})
    even = pipeline_dry_run("1f1b", p, m, 1, {"F": [t_f_ms] * p, "B": [t_b_ms] * p})
    busy0 = m * (t_f_ms + t_b_ms)
    return {"even_ms": float(even.makespan), "even_idle": 1 - busy0 / float(even.makespan),
            "step_ms": float(run.makespan), "idle": 1 - busy0 / float(run.makespan),
            "closed": (p - 1) / (m + p - 1)}


def q99(psi_r_b, dp, gpus_per_node):
    """The first pipeline rank's gradient reduction over dp, by collective and placement."""
    S = psi_r_b * 1e9 * 4  # float32 gradients
    out = {"s_gb": S / GB}
    for tag, t in (("one", gpus_per_node), ("two", gpus_per_node // 2)):
        ranks = [i * t for i in range(dp)]  # tp fastest: rank 0's dp group
        topo = Topology.nodes(dp * t // gpus_per_node, gpus_per_node)
        ar = collective_cost("all_reduce", S, ranks, topo)
        rs = collective_cost("reduce_scatter", S, ranks, topo)
        out[f"{tag}_ar_s"], out[f"{tag}_rs_s"] = ar.seconds, rs.seconds
        if tag == "two":
            out["two_algo"] = ar.algorithm
    out["naive_s"] = S / Topology.nodes(2, gpus_per_node).inter.bandwidth
    return out


def q100(gpus, batch):
    """Incident A at its reported scale: tp 16 over two nodes against tp 8 in one."""
    out = {}
    for tp in (16, 8):
        lay = Layout(tp=tp, pp=4, dp=gpus // (4 * tp), global_batch=batch,
                     sequence_parallel=True, distributed_optimizer=True)
        st_, mem = timed(M70, lay)
        out[f"mfu{tp}"], out[f"tp{tp}_s"] = st_.mfu, st_.communication["tp"]
        out[f"fits{tp}"] = "fits" if mem.fits else "does not fit"
    out["gain"] = out["mfu8"] / out["mfu16"]
    out["tp_ratio"] = out["tp16_s"] / out["tp8_s"]
    out["reported_gain"] = 48 / 35
    return out


def q101(p, m_seed, m_fix):
    """Incident B at its reported scale: the dry run's bubble and the planner's MFU."""
    out = {}
    for tag, m in (("seed", m_seed), ("fix", m_fix)):
        lay = Layout(tp=8, pp=p, global_batch=m, sequence_parallel=True,
                     recompute="selective", distributed_optimizer=True)
        st_, _ = timed(M200, lay)
        out[f"{tag}_closed"] = (p - 1) / m
        out[f"{tag}_dry"] = st_.bubble_fraction
        out[f"{tag}_bound"] = m / (m + p - 1)
        out[f"{tag}_mfu"] = st_.mfu
    return out


def q102(dp):
    """Incident C at its reported scale: ZeRO-3 with checkpointing against ZeRO-2."""
    z2 = rank_memory(M13, Layout(dp=dp, global_batch=dp, zero=2, fp32_grads=False), H100,
                     dropout=False)
    z3 = rank_memory(M13, Layout(dp=dp, global_batch=dp, zero=3, recompute="full",
                                 fp32_grads=False), H100, dropout=False)
    layer = 2 * z3.params.layer  # one layer's bf16 weights, gathered whole
    return {"psi_b": M13.parameters() / 1e9, "z2_states_gb": states(z2) / GB,
            "z3_states_gb": states(z3) / GB, "z2_peak_gb": z2.peak / GB,
            "z3_peak_gb": z3.peak / GB, "ratio": z3.peak / z2.peak,
            "layers_needed": (1.2 * z2.peak - z3.peak) / layer}


def q103(gpus, batch):
    """"Communication over 30 % of compute: lower PP" — which lever moves the share."""
    out = {}
    for tag, tp, pp in (("tp16_pp4", 16, 4), ("tp16_pp1", 16, 1), ("tp8_pp4", 8, 4)):
        lay = Layout(tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=batch,
                     sequence_parallel=True, distributed_optimizer=True)
        st_, _ = timed(M70, lay)
        out[tag] = st_.exposed_communication / st_.compute
    return out


def q104(gpus, batch):
    """The "≤ 7B: DDP + ZeRO-2, no PP" rule on Llama 2 7B."""
    model = MODELS["llama2-7b"]
    psi = model.parameters()
    z2 = model_state_bytes(psi, 2, gpus, grad_bytes=4)["total"]
    times = {}
    for tag, kw in (("z2", dict(dp=gpus, zero=2)),
                    ("pp2", dict(pp=2, dp=gpus // 2, distributed_optimizer=True))):
        st_, mem = timed(model, Layout(global_batch=batch, **kw))
        times[tag] = st_.seconds
    ddp_mem = timed(model, Layout(dp=gpus, global_batch=batch))[1]
    return {"psi_b": psi / 1e9, "ddp_gb": 18 * psi / GB, "z2_gb": z2 / GB,
            "ddp_peak_gib": ddp_mem.peak / GiB, "z2_s": times["z2"], "pp2_s": times["pp2"],
            "pp2_more": times["pp2"] / times["z2"] - 1}


def q105(gpus, batch):
    """`minipar plan`'s question: Llama 3 70B on 512 H100s with TP 8, PP 8."""
    model = MODELS["llama3-70b"]
    question = Layout(tp=8, pp=8, dp=gpus // 64, global_batch=batch, sequence_parallel=True,
                      recompute="selective", distributed_optimizer=True,
                      schedule="interleaved_1f1b", chunks=2)
    without = dataclasses.replace(question, recompute="none")
    st_, mem = timed(model, question)
    out = {"none_peak_gib": rank_memory(model, without, H100, dropout=False).peak / GiB,
           "sel_peak_gib": mem.peak / GiB, "sel_s": st_.seconds, "sel_mfu": st_.mfu,
           "tokens_k": batch * model.seq_len / st_.seconds / 1e3}
    best, _ = timed(model, Layout(tp=4, dp=gpus // 4, global_batch=batch,
                                  sequence_parallel=True, recompute="selective", zero=3))
    out["best_s"] = best.seconds
    out["slower"] = out["sel_s"] / best.seconds - 1
    return out


def q106(dp, pp, tp):
    """The dry run at full scale: a Llama-3-405B-sized GPT on dp x pp x tp GPUs."""
    from minipar.plan.sized import as_gpt
    from minipar.plan.timeline import timeline
    layout = Layout(dp=dp, pp=pp, tp=tp, schedule="interleaved_1f1b", chunks=2,
                    global_batch=16 * dp, sequence_parallel=True, recompute="selective")
    tl = timeline(as_gpt(MODELS["llama3-405b"]), layout, H100.topology(dp * pp * tp // 8),
                  compute_model="calibrated")
    events = sum(len(r.events) for r in tl.ranks)
    return {"world": dp * pp * tp, "ranks": len(tl.ranks), "events": events,
            "step_s": tl.step_time, "share": len(tl.ranks) / (dp * pp * tp)}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="10", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q92", dict(psi_b=34, mp=8, dp=24, gpu_gb=80),
        "A {psi_b}B model trains with Megatron-LM in bf16 with Adam, tp x pp = {mp}, on "
        "{gpu_gb} GB GPUs. How many bytes a parameter do its model states take, and how many "
        "GB a GPU, without sharding and with the distributed optimizer over dp = {dp}?",
        "{b18} bytes a parameter: 2 (bf16 weights) + 4 (Megatron's float32 main_grad) + 12 "
        "(float32 master, m, v), not ZeRO's {b16}; {gb18:.1f} GB a GPU, which a count at "
        "{b16} bytes ({gb16:.1f} GB) underestimates by {under:.1%} (Calculon's error against "
        "Korthikanti et al.'s Figure 1). The distributed optimizer is ZeRO-1: it shards the 12 "
        "over dp, {dist_b:.2f} bytes a parameter, {dist_gb:.1f} GB, leaving {left_gb:.1f} GB "
        "for activations and buffers.",
        q92),
    entry(
        "q93", dict(tp=8, pp=35, chunks=3),
        "Korthikanti et al.'s Figure 1 gives the 530B model (105 layers, h = 20480) on "
        "tp = {tp}, pp = {pp}, interleaved with {chunks} chunks, 31.64 GiB of parameters and "
        "optimizer states a GPU. Reproduce it, and say what it leaves out.",
        "The figure counts the first rank's {layers_per_rank} layers' weight matrices, "
        "12h²/t each, at 18 bytes: {layers_gib:.6f} GiB, exactly. The first stage also holds "
        "the embedding ceil(V/t)·h and the positions s·h ({ends_m:.1f}M parameters) and the "
        "layers' biases and norms: {model_gib:.3f} GiB, {more:.1%} more — a lot, because a "
        "stage holds only 3 layers. Its activations with SP and selective recomputation, "
        "{held} passes of one layer held at once, are {acts_gib:.4f} GiB.",
        q93),
    entry(
        "q94", dict(layers=48, h=6144, a=64, s=2048, t=8, p=6, m=12, v=2),
        "A GPT of {layers} layers (h = {h}, {a} heads, s = {s}) on tp = {t} with SP and "
        "selective "
        "recomputation, p = {p} stages, m = {m} micro-batches: how many micro-batches and "
        "layers' worth of activations does the first rank hold under GPipe, 1F1B and "
        "interleaved 1F1B with v = {v}?",
        "A layer keeps 34sbh/t = {layer_mb:.2f} MB a micro-batch. GPipe: every forward before "
        "any backward, {gpipe_n} micro-batches of L/p layers, {gpipe_layers} layers' worth, "
        "{gpipe_gb:.2f} GB. 1F1B: min(p, m) = {f1b_n}, {f1b_layers} layers' worth = L at any "
        "p, {f1b_gb:.2f} GB. Interleaved: {inter_n} chunk passes of L/(pv) layers, "
        "{inter_layers} layers' worth = L(1 + (p − 1)/(pv)), {inter_gb:.2f} GB: the smaller "
        "bubble costs memory on the first rank.",
        q94),
    entry(
        "q95", dict(layers=48, h=6144, a=24, s=2048, vocab=51200, batch=96, gpus=64,
                    step_s=5.3),
        "A GPT (L = {layers}, h = {h}, {a} heads, s = {s}, V = {vocab}) trains a batch of "
        "{batch} "
        "sequences a step in {step_s} s on {gpus} A100s (312 TFLOP/s bf16). What are its MFU "
        "and its HFU with full and with selective recomputation?",
        "Model FLOPs 72·B·s·L·h²(1 + s/(6h) + V/(12·L·h)) = {model_pf:.2f} PFLOP a step: "
        "MFU {mfu:.1%}, whatever is recomputed. Full recomputation reruns every layer's "
        "forward (96·B·s·L·h²(1 + s/(6h) + V/(16·L·h))): HFU {hfu_full:.1%}. Selective "
        "recomputation reruns the attention core's two s² matmuls, 4Bs²h a layer: HFU "
        "{hfu_sel:.1%} (the planner's count); counting Q Kᵀ alone gives {hfu_qk:.1%}. Quote "
        "MFU: HFU rises with the work wasted.",
        q95),
    entry(
        "q96", dict(s=3000, h=5120, d=128, t=4, peak_tflops=989),
        "The planner's GEMM efficiency is e_max·g(M)·g(N)·g(K), g(x) = x/(x + 128). On s = "
        "{s} tokens, how fast does one head's score matmul (s, s, d = {d}) run against the "
        "MLP's up-projection (s, 4h/t, h) with h = {h}, t = {t}, on a {peak_tflops} TFLOP/s "
        "GPU?",
        "g({d}) = {g_d:.2f}: the scores run at {scores_eff:.3f} of peak, {scores_us_per_gflop:.3f} "
        "µs a GFLOP; the MLP at {mlp_eff:.3f}, {mlp_us_per_gflop:.3f} µs a GFLOP: the same "
        "FLOPs take {slower:.2f}x as long in attention's s² matmuls, because the head size is "
        "one tile. Any small dimension costs so: a small micro-batch, or tp cutting f/t thin.",
        q96),
    entry(
        "q97", dict(s=3000, b=2, h=5120, a=40, t=4),
        "A GPT layer (h = {h}, {a} heads, s = {s}, b = {b}) on tp = {t} with sequence "
        "parallelism and dropout, on an H100 (3.35 TB/s, 989 TFLOP/s): how many bytes do its "
        "elementwise ops move in a forward and backward, and how long against its GEMMs?",
        "The stream's ops (LayerNorms, bias-dropout-adds, GeLU, q/k/v layouts) move "
        "{stream_gb:.3f} GB and the attention core's softmax and dropout over the s² scores "
        "{core_gb:.3f} GB: {ms:.3f} ms at HBM speed, {share:.1%} of the layer's "
        "{gemm_ms:.3f} ms of GEMMs, for almost no FLOPs. They are memory-bound (a few FLOPs "
        "a byte against the GPU's ~295): fusing them, or FlashAttention's keeping the scores "
        "on chip, removes bytes, not FLOPs.",
        q97),
    entry(
        "q98", dict(p=6, m=10, t_f_ms=5, t_b_ms=11, last_f_ms=7, last_b_ms=13),
        "1F1B over p = {p} stages, m = {m} micro-batches, t_F = {t_f_ms} ms and t_B = "
        "{t_b_ms} ms a stage — but the last stage also computes the logits and the loss: "
        "{last_f_ms} ms and {last_b_ms} ms. How long is the step, and what share does the "
        "first rank idle?",
        "With equal stages the dry run gives {even_ms:.0f} ms, (m + p − 1)(t_F + t_B), the "
        "first rank idle {even_idle:.1%}: the closed form (p − 1)/(m + p − 1) = {closed:.1%}, "
        "exactly. With the "
        "heavier last stage: {step_ms:.0f} ms = (p − 1)(t_F + t_B) + m(t_F' + t_B'), the "
        "steady state running at the slowest stage's pace, and the first rank idle "
        "{idle:.1%}. The closed form assumes equal stages; the planner runs the real "
        "schedule on each stage's own time.",
        q98),
    entry(
        "q99", dict(psi_r_b=1.3, dp=12, gpus_per_node=8),
        "The first pipeline rank holds {psi_r_b}B parameters with float32 gradients; dp = "
        "{dp} (H100 nodes of {gpus_per_node}: NVLink 450 GB/s, NDR 50 GB/s a GPU). How long "
        "is its gradient reduction at tp = 8, and at tp = 4, as an all-reduce (DDP) and as a "
        "reduce-scatter (distributed optimizer)?",
        "S = {s_gb:.1f} GB. At tp = 8 the dp group is one GPU on each of {dp} nodes: a ring on "
        "InfiniBand, all-reduce {one_ar_s:.3f} s = 2(n − 1)α + 2(n − 1)/n·S/B (not S/B = "
        "{naive_s:.3f} s), reduce-scatter {one_rs_s:.3f} s. At tp = 4 two of the group share "
        "each node and the runtime goes {two_algo}: in the node on NVLink, across on half "
        "the buffer: {two_ar_s:.3f} s and {two_rs_s:.3f} s. It hides behind the last "
        "micro-batch's backward when that is long enough.",
        q99),
    entry(
        "q100", dict(gpus=256, batch=512),
        "Incident A: a 70B model on 32 nodes of 8 H100s ran at 35 % MFU with TP = 16, and at "
        "48 % with TP = 8, PP = 4, DP = 8. What does the planner predict for a 70B GPT "
        "(80 layers, h = 8192, s = 4096) on {gpus} H100s, {batch} sequences a step, SP, no "
        "recomputation, pp 4, and which of the reported numbers hold?",
        "MFU {mfu16:.1%} at tp 16 (dp 4; {fits16}) and {mfu8:.1%} at tp 8 ({fits8}): "
        "x{gain:.2f}, against the reported x{reported_gain:.2f} — the gain holds, the levels "
        "run 3–4 points lower. The tensor-parallel collectives take {tp16_s:.2f} s against "
        "{tp8_s:.2f} s ({tp_ratio:.2f}x): tp 16 spans two nodes and its all-gathers and "
        "reduce-scatters cross InfiniBand. The reported 8–10x slow steps (a saturated "
        "fabric) are not in a model without congestion.",
        q100),
    entry(
        "q101", dict(p=64, m_seed=4, m_fix=32),
        "Incident B: PP = {p} with m = {m_seed} micro-batches on 512 H100s ran at 28 % MFU, "
        "\"bubble (64 − 1)/4 = 1575 %\"; m = {m_fix} brought \"200 %\" and 51 %. The planner "
        "on a dense 196B GPT (128 layers, tp 8, dp 1, SP, selective recomputation): what "
        "holds?",
        "The bubbles hold as bubble over the ideal time: (p − 1)/m = {seed_closed:.2f} and "
        "{fix_closed:.2f}; the dry run of the real schedule finds {seed_dry:.2f} and "
        "{fix_dry:.2f}, the last stage carrying the logits. The MFUs cannot: a rank computes "
        "at most m/(m + p − 1) = {seed_bound:.1%} and {fix_bound:.1%} of the step, and the "
        "planner predicts {seed_mfu:.1%} and {fix_mfu:.1%} MFU, not 28 % and 51 %.",
        q101),
    entry(
        "q102", dict(dp=8),
        "Incident C: on a 13B model, ZeRO-3 with activation checkpointing peaked 20 % above "
        "ZeRO-2. What does the planner count for GPT-3 13B on dp = {dp} (b = 1, s = 2048, "
        "16 bytes a parameter)?",
        "Ψ = {psi_b:.2f}B. Model states: ZeRO-2 2Ψ + 14Ψ/N = {z2_states_gb:.1f} GB, ZeRO-3 "
        "16Ψ/N = {z3_states_gb:.1f} GB. Peaks, with activations and transients: ZeRO-2 "
        "without checkpointing {z2_peak_gb:.1f} GB, ZeRO-3 with it {z3_peak_gb:.1f} GB, "
        "{ratio:.2f}x — less, not 20 % more. To pass ZeRO-2 by 20 %, un-throttled all-gathers "
        "would have to hold {layers_needed:.0f} layers' weights at once, more than the "
        "model's 40: the ledger's accounting cannot reach the report; fragmentation must.",
        q102),
    entry(
        "q103", dict(gpus=256, batch=512),
        "A tuning checklist says: when all-reduce time exceeds 30 % of compute, lower the PP "
        "degree. On a 70B GPT ({gpus} H100s, {batch} sequences, SP) with tp 16 over two nodes "
        "and pp 4, the exposed communication is over 30 % of the compute. Does lowering pp "
        "fix it?",
        "No: at tp 16 the exposed communication is {tp16_pp4:.1%} of the compute with pp 4 "
        "and {tp16_pp1:.1%} with pp 1 — the all-reduces over 30 % are tensor parallelism's, "
        "which pp does not touch (a pipeline sends one activation per micro-batch and "
        "boundary). Bringing tp back inside the node does: {tp8_pp4:.1%} at tp 8, pp 4. "
        "Lower the degree of the dimension that communicates.",
        q103),
    entry(
        "q104", dict(gpus=16, batch=64),
        "\"≤ 7B: DDP + ZeRO-2, no PP.\" Test it on Llama 2 7B on {gpus} H100s, {batch} "
        "sequences of 4096 tokens a step.",
        "Ψ = {psi_b:.2f}B. Plain DDP holds 18 bytes a parameter on every GPU, {ddp_gb:.0f} GB, "
        "{ddp_peak_gib:.0f} GiB at its peak with activations: it does not fit. ZeRO-2 holds "
        "2Ψ + 16Ψ/N = {z2_gb:.1f} GB of states and steps in {z2_s:.3f} s; a pipeline of 2 "
        "with the distributed optimizer takes {pp2_s:.3f} s, {pp2_more:.1%} more, its bubble. "
        "So: no PP, yes; but it is ZeRO, not DDP, that makes data parallelism alone fit.",
        q104),
    entry(
        "q105", dict(gpus=512, batch=1024),
        "`minipar plan --model llama3-70b --gpus {gpus}`: will Llama 3 70B fit on {gpus} H100s "
        "with TP 8, PP 8 (interleaved, 2 chunks, {batch} sequences of 8192 tokens), and how "
        "fast?",
        "Without recomputation the first rank peaks at {none_peak_gib:.0f} GiB: no. With "
        "selective recomputation {sel_peak_gib:.1f} GiB of 74.5: yes, a step of {sel_s:.2f} s, "
        "{tokens_k:.0f}k tokens a second, MFU {sel_mfu:.1%}. But tp 4 with ZeRO-3 and no "
        "pipeline steps in {best_s:.2f} s: TP 8, PP 8 is {slower:.1%} slower, its bubble and "
        "its tensor-parallel collectives over 8 GPUs the difference.",
        q105),
    entry(
        "q106", dict(dp=128, pp=16, tp=8),
        "How can a laptop time one training step of a 405B-sized model on dp {dp} x pp {pp} x "
        "tp {tp} GPUs kernel by kernel, and what does the answer give up?",
        "By symmetry: every rank of one pipeline coordinate runs the same program on the same "
        "shapes, so `minipar dry-run` runs {ranks} ranks of {world:,} ({share:.2%}), one a "
        "pipeline coordinate, each collective costed on that rank's own group: {events:,} "
        "events, a {step_s:.2f} s step on the calibrated clock. The {ranks} are exact (on small "
        "layouts the test holds every rank to the real simulated run, event by event, within "
        "a nanosecond); the others are representative: a rank whose group crosses other links "
        "than its representative's would pay more, and the dry run would not show it.",
        q106),
]
