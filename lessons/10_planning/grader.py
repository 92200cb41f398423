"""Grader for lesson 10: your count of the busiest rank's memory against plan.rank_memory on
drawn GPTs and layouts (tp, pp, dp, GPipe or 1F1B, micro-batches, SP, recomputation, ZeRO or
the distributed optimizer, 16 or 18 bytes a parameter); your step pieces against the
planner's — the bubble and idle share from the pipeline's dry run on equal stages, the
first pipeline rank's gradient reduction from the runtime's cost model on the group
plan.comm_time lays out, MFU and HFU from plan.step_time's FLOP counts; and your chosen
layouts against plan.search's best on a set of models and clusters, checked with
plan.rank_memory and plan.step_time.
A wrong answer is compared with the known mistakes, on the drawn case and on a few fixed
ones, and the one it makes is named."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
from functools import lru_cache

from hypothesis import example, given, strategies as st

import minipar.plan as plan_package
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_keys,
                                    expect_number, learner)
from minipar.plan import CLUSTERS, MODELS, Layout, ModelSpec, rank_memory, step_time
from minipar.plan.comm_time import groups_of, topology_of
from minipar.plan.pipeline_time import pipeline_dry_run
from minipar.runtime.cost import collective_cost
from minipar.runtime.device import GB

SEARCH = importlib.import_module("minipar.plan.search")  # the module (plan.search is a function)
GiB = 2**30
TOLERANCE = 0.02  # 10.1 and 10.2's dp_seconds: biases, norms and ceilings may be left out


def gpt(h: int, layers: int, s: int, vocab: int) -> ModelSpec:
    """A GPT of Megatron's shape: heads of 128, a GeLU MLP of 4h, biases, learned positions."""
    return ModelSpec(f"a GPT (L = {layers}, h = {h}, s = {s}, V = {vocab})", layers, h, h // 128,
                     4 * h, vocab, s)


def relative(got: float, want: float) -> float:
    return abs(got - want) / abs(want) if want else abs(got)


def read(result, keys: tuple, what: str) -> dict:
    """The learner's dict at `keys`, each value a finite number."""
    return {k: expect_number(v, what=f"{what}[{k!r}]")
            for k, v in expect_keys(result, keys, what=what).items()}


# ---- exercise 10.1: the busiest rank's memory ---------------------------------------------

def estimate(model: ModelSpec, lay: Layout, **bug) -> tuple[float, float]:
    """(model states, activations) of the first pipeline rank by section 1's formulas, with
    a mistake switched on (the keys of MEMORY_MISTAKES); without one, within 0.5 % of
    plan.rank_memory for the drawn GPTs (biases and norms left out)."""
    L, h, a, s, V = model.layers, model.hidden, model.heads, model.seq_len, model.vocab
    t, p, N, b, m = lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.microbatches
    split = t if lay.sequence_parallel and not bug.get("sp_ignored") else 1
    rows = -(-V // t)
    layers = (L if bug.get("all_layers") else L // p) * 12 * h * h / (1 if bug.get("no_tp") else t)
    ends = 0 if bug.get("no_ends") else rows * h + s * h + (rows * h if p == 1 else 0)
    g = 2 if bug.get("bf16_grads") or not lay.fp32_grads else 4
    k = 8 if bug.get("no_master") else 12
    z = lay.zero if bug.get("no_dist_opt") else max(lay.zero, 1 if lay.distributed_optimizer
                                                    else 0)
    grads_from = 1 if bug.get("zero1_grads") else 2
    states = (layers + ends) * (2 / (N if z >= 3 else 1) + g / (N if z >= grads_from else 1)
                                + k / (N if z >= 1 else 1))
    sbh = s * b * h
    if lay.recompute == "full":
        A = 2 * sbh / split
    else:
        A = sbh * (10 / split + 24 / t)
        if lay.recompute == "none" or bug.get("selective_core"):
            A += 5 * a * s * s * b / t
    n = {"one": 1, "m": m, "p": p if lay.schedule == "1f1b" else m,
         "gpipe_p": min(p, m)}.get(bug.get("n"), m if lay.schedule == "gpipe" else min(p, m))
    per = L // p * A + (0 if bug.get("no_act_ends") else sbh / split)
    if p == 1 and not bug.get("no_act_ends"):
        per += 4 * sbh / split + 4 * s * b * rows
    acts = n * per / (N if bug.get("over_dp") else 1)
    return states, acts


MEMORY_MISTAKES = {  # bug -> (the quantity it changes, what the hint says)
    "bf16_grads": ("model_states",
                   "your gradients are 2 bytes a parameter: with fp32_grads Megatron keeps a "
                   "float32 main_grad beside the bf16 weights, 2 + 4 + 12 = 18 bytes a "
                   "parameter, not ZeRO's 16"),
    "no_dist_opt": ("model_states",
                    "you left the distributed optimizer out: it is ZeRO-1 by another name, "
                    "the 12 bytes of optimizer states a parameter sharded over dp"),
    "zero1_grads": ("model_states",
                    "you sharded the gradients at ZeRO-1: stage 1 shards the optimizer "
                    "states only, stage 2 the gradients too, stage 3 the weights too"),
    "no_ends": ("model_states",
                "you counted the layers alone, as Korthikanti et al.'s Figure 1 does: the "
                "first stage also holds the embedding ceil(V/t)·h and the positions s·h "
                "(and with pp = 1 the head ceil(V/t)·h)"),
    "no_tp": ("model_states",
              "your layers are whole on the rank: tensor parallelism gives each tp rank 1/t "
              "of every layer's matrices, 12h²/t"),
    "all_layers": ("model_states",
                   "you counted all L layers: the first pipeline rank holds L/p of them"),
    "no_master": ("model_states",
                  "your optimizer states are 8 bytes a parameter (Adam's m and v): mixed "
                  "precision also keeps a float32 master copy of the weights, 12 bytes"),
    "n": ("activations", ""),  # one of N_HINTS, by its value
    "sp_ignored": ("activations",
                   "your activations are not divided by t under sequence parallelism: SP "
                   "splits the 10sbh between the blocks (and a full recomputation's kept "
                   "input 2sbh, the embedding's mask, the head's inputs) over the tp ranks: "
                   "sbh(10/t + 24/t) = 34sbh/t a layer"),
    "selective_core": ("activations",
                       "you kept the attention core's 5as²b/t under selective recomputation: "
                       "selective recomputation drops exactly that term and reruns it"),
    "no_act_ends": ("activations",
                    "you counted the layers alone: each micro-batch in flight also keeps the "
                    "embedding's 1-byte dropout mask (sbh, ÷ t with SP), and with pp = 1 the "
                    "head's inputs 2e·sbh and its float32 logits 4·s·b·ceil(V/t)"),
    "over_dp": ("activations",
                "you divided the activations by dp: data parallelism splits the global "
                "batch into micro-batches, and each rank still keeps whole micro-batches of "
                "b sequences"),
}
N_HINTS = {
    "one": "you counted one micro-batch's activations: the first pipeline rank holds "
           "several in flight — min(p, m) under 1F1B (its warm-up forwards before the first "
           "backward), all m under GPipe — each of L/p layers",
    "m": "you counted all m micro-batches under 1F1B: that is GPipe's count; 1F1B's first "
         "rank starts its first backward after p forwards, so it holds min(p, m)",
    "p": "you counted p micro-batches in flight under 1F1B: it is min(p, m) — when m < p "
         "there are only m to hold",
    "gpipe_p": "you counted min(p, m) micro-batches under GPipe: GPipe runs every forward "
               "before any backward, so its first rank holds all m",
}
FORMULA_10_1 = ("model states: Ψ_r (L/p·12h²/t + ceil(V/t)·h + s·h, + ceil(V/t)·h at pp = 1) "
                "× (2 + g + 12) bytes, g = 4 with fp32_grads, ZeRO stage z over dp sharding "
                "the 12 (z ≥ 1, the distributed optimizer too), g (z ≥ 2), the 2 (z = 3); "
                "activations: n (1F1B min(p, m), GPipe m) × (L/p · A + the ends), A = "
                "sbh(10/sp + 24/t + 5as/(ht)) with sp = t under SP, no 5as/(ht) term under "
                "selective recomputation, 2sbh/sp under full")

# (h, k layers a stage, s, V, t, p, dp, b, m, schedule, sp, recompute, zero, dist, fp32)
MEMORY_PROBES = [
    (2048, 2, 2048, 51200, 4, 4, 2, 1, 8, "1f1b", True, "selective", 0, True, True),
    (1024, 1, 1024, 32000, 2, 1, 4, 2, 3, "gpipe", True, "none", 2, False, True),
    (3072, 3, 2048, 50257, 8, 3, 2, 1, 2, "1f1b", False, "full", 3, False, False),
    (4096, 2, 4096, 51200, 2, 2, 8, 1, 4, "gpipe", True, "selective", 1, False, True),
]


def memory_case(h, k, s, V, t, p, dp, b, m, schedule, sp, rec, zero, dist, fp32):
    model = gpt(h, p * k, s, V)
    lay = Layout(tp=t, pp=p, dp=dp, micro_batch=b, global_batch=b * dp * m, schedule=schedule,
                 sequence_parallel=sp and t > 1, recompute=rec, zero=zero,
                 distributed_optimizer=dist, fp32_grads=fp32)
    return model, lay


def memory_truth(model: ModelSpec, lay: Layout) -> dict:
    r = rank_memory(model, lay)
    return {"model_states": r.parameters.steady + r.gradients.steady + r.optimizer_states.steady,
            "activations": r.activations.steady}


def bugs_for(key: str) -> list[dict]:
    out = []
    for bug, (affects, _) in MEMORY_MISTAKES.items():
        if affects != key:
            continue
        out += [{"n": n} for n in N_HINTS] if bug == "n" else [{bug: True}]
    return out


def memory_call(impl, model, lay) -> tuple[dict, str]:
    what = f"rank_memory_estimate({model.name}, Layout({lay}))"
    got = learner(what, impl.rank_memory_estimate, model, lay)
    return read(got, ("model_states", "activations"), what), what


def memory_mistake(impl, key: str, model, lay, got: float) -> str:
    """The hint of the known mistake your value makes on the drawn case and on every probe
    where that mistake shows (differs from the truth by more than the tolerance)."""
    index = 0 if key == "model_states" else 1
    for bug in bugs_for(key):
        want_bug = estimate(model, lay, **bug)[index]
        if relative(got, want_bug) > 0.01:
            continue
        probes_agree = True
        for probe in MEMORY_PROBES:
            pm, pl = memory_case(*probe)
            wrong = estimate(pm, pl, **bug)[index]
            if relative(wrong, memory_truth(pm, pl)[key]) <= TOLERANCE:
                continue
            mine = memory_call(impl, pm, pl)[0][key]
            if relative(mine, wrong) > 0.01:
                probes_agree = False
                break
        if probes_agree:
            name = next(iter(bug))
            return N_HINTS[bug["n"]] if name == "n" else MEMORY_MISTAKES[name][1]
    return ""


@exercise("10.1", "the busiest rank's memory")
@SETTINGS
@example(h=2048, k=2, s=2048, V=51200, t=4, p=4, dp=2, b=1, m=8, schedule="1f1b", sp=True,
         rec="selective", zero=0, dist=True, fp32=True)
@example(h=1024, k=3, s=1024, V=32000, t=2, p=4, dp=2, b=1, m=2, schedule="1f1b", sp=True,
         rec="none", zero=0, dist=False, fp32=True)
@example(h=1024, k=1, s=2048, V=50257, t=2, p=1, dp=4, b=2, m=3, schedule="gpipe", sp=True,
         rec="full", zero=1, dist=False, fp32=False)
@example(h=3072, k=2, s=2048, V=51200, t=8, p=2, dp=2, b=1, m=4, schedule="gpipe", sp=False,
         rec="selective", zero=2, dist=False, fp32=True)
@given(h=st.sampled_from([2048, 1024, 3072, 4096]), k=st.integers(1, 4),
       s=st.sampled_from([2048, 1024, 4096]), V=st.sampled_from([51200, 32000, 50257]),
       t=st.sampled_from([2, 4, 8, 1]), p=st.sampled_from([2, 4, 3, 1]),
       dp=st.sampled_from([2, 4, 8, 1]), b=st.sampled_from([1, 2]), m=st.integers(1, 8),
       schedule=st.sampled_from(["1f1b", "gpipe"]), sp=st.booleans(),
       rec=st.sampled_from(["selective", "none", "full"]), zero=st.sampled_from([0, 1, 2, 3]),
       dist=st.booleans(), fp32=st.sampled_from([True, False]))
def check_rank_memory(impl, h, k, s, V, t, p, dp, b, m, schedule, sp, rec, zero, dist, fp32):
    model, lay = memory_case(h, k, s, V, t, p, dp, b, m, schedule, sp, rec, zero, dist, fp32)
    want = memory_truth(model, lay)
    got, what = memory_call(impl, model, lay)
    for key in ("model_states", "activations"):
        if relative(got[key], want[key]) <= TOLERANCE:
            continue
        hint = memory_mistake(impl, key, model, lay, got[key]) or FORMULA_10_1
        raise GradeFailure(
            f"{what}: {key} expected {want[key]:,.0f} B ({want[key] / GiB:.3f} GiB, "
            f"plan.rank_memory), received {got[key]:,.0f} B ({got[key] / GiB:.3f} GiB): "
            f"{100 * relative(got[key], want[key]):.1f} % off, over the {TOLERANCE:.0%} "
            f"tolerance. {hint}")


# ---- exercise 10.2: a step's bubble, its data-parallel reduction, MFU and HFU -------------

STEP_KEYS = ("bubble_over_ideal", "idle_share", "dp_seconds", "mfu", "hfu")
STEP_CLUSTERS = {"h100": CLUSTERS["h100"], "a100": CLUSTERS["a100"]}


def step_case(h, k, s, V, cluster, t, p, v, dp, j, sp, rec, zero, dist, fp32):
    """The model, layout and cluster of a drawn case: m = j·p micro-batches when
    interleaved (v = 2: Megatron needs m % p == 0), else m = j."""
    schedule = "interleaved_1f1b" if v > 1 and p > 1 else ("gpipe" if v == 0 else "1f1b")
    chunks = 2 if schedule == "interleaved_1f1b" else 1
    m = j * p if chunks > 1 else j
    model = gpt(h, p * chunks * k, s, V)
    lay = Layout(tp=t, pp=p, dp=dp, global_batch=dp * m, schedule=schedule, chunks=chunks,
                 sequence_parallel=sp and t > 1, recompute=rec, zero=zero,
                 distributed_optimizer=dist, fp32_grads=fp32)
    return model, lay, STEP_CLUSTERS[cluster]


@lru_cache(maxsize=256)
def step_truth(model: ModelSpec, lay: Layout, cluster_name: str) -> dict:
    """The planner's values: the dry run of minipar's own schedule on equal stages (t_F = 1,
    t_B = 2, free messages), the first pipeline rank's reduction over the dp group
    plan.comm_time lays out, priced by the runtime's collective_cost (what plan.step_time
    charges, without its zero-byte expert reduction on a dense model), and step_time's
    MFU and HFU at its own step time."""
    cluster = STEP_CLUSTERS[cluster_name]
    stages = lay.pp * lay.chunks
    run = pipeline_dry_run(lay.schedule, lay.pp, lay.microbatches, lay.chunks,
                           {"F": [1.0] * stages, "B": [2.0] * stages})
    psi = 0.0
    for i in range(0, stages, lay.pp):  # rank 0's stages: 0, p, 2p, ...
        psi += model.layers // stages * model.layer_parameters() / lay.tp
        if i == 0:
            psi += model.vocab * model.hidden / lay.tp + model.seq_len * model.hidden
        if i == stages - 1:
            psi += model.vocab * model.hidden / lay.tp + 2 * model.hidden
    sharded = lay.zero >= 1 or lay.distributed_optimizer
    group = groups_of(lay).dp_cp
    dp_seconds = (collective_cost("reduce_scatter" if sharded else "all_reduce",
                                  psi * (4 if lay.fp32_grads else 2), group,
                                  topology_of(cluster, lay)).seconds if len(group) > 1 else 0.0)
    st_ = step_time(model, lay, cluster)
    return {"bubble_over_ideal": float(run.bubble_over_ideal),
            "idle_share": float(run.bubble_over_total), "dp_seconds": dp_seconds,
            "mfu": st_.mfu, "hfu": st_.hfu, "step_seconds": st_.seconds,
            "model_flops": st_.model_flops}


def dp_variant(model, lay, cluster, **bug) -> float:
    """The first pipeline rank's reduction with a mistake switched on (DP_MISTAKES)."""
    t, p, dp, g = lay.tp, lay.pp, lay.dp, cluster.gpus_per_node
    if dp == 1:
        return 0.0
    L, h, s, V = model.layers, model.hidden, model.seq_len, model.vocab
    psi = L // p * model.layer_parameters() / t + V * h / t + s * h + (V * h / t if p == 1 else 0)
    S = psi * (2 if bug.get("bf16_grads") or not lay.fp32_grads else 4)
    all_reduce = bug.get("all_reduce") or not (lay.zero >= 1 or lay.distributed_optimizer)
    factor = (lambda n: 1.0) if bug.get("no_factor") else (lambda n: (n - 1) / n)

    def ring(S, n, link, ar):
        steps = 2 if ar else 1
        return steps * ((n - 1) * link.latency + factor(n) * S / link.bandwidth)

    nodes = len({i * t // g for i in range(dp)})
    per = dp // nodes
    if bug.get("nvlink"):
        return ring(S, dp, cluster.intra, all_reduce)
    if nodes == 1:
        return ring(S, dp, cluster.intra, all_reduce)
    if per == 1 or bug.get("flat"):
        return ring(S, dp, cluster.inter, all_reduce)
    if not all_reduce:
        return ring(S, per, cluster.intra, False) + ring(S / per, nodes, cluster.inter, False)
    return 2 * ring(S, per, cluster.intra, False) + ring(S / per, nodes, cluster.inter, True)


DP_MISTAKES = {
    "no_factor": "your reduction moves all S bytes over each link: a ring all-reduce sends "
                 "2(n − 1)/n · S a rank (a reduce-scatter (n − 1)/n · S), each of the "
                 "2(n − 1) steps one n-th of the buffer",
    "all_reduce": "you priced an all-reduce, but the optimizer states are sharded (ZeRO-1 or "
                  "the distributed optimizer): each rank needs only its shard of the summed "
                  "gradients, a reduce-scatter, half the traffic (the updated weights are "
                  "all-gathered after the step)",
    "bf16_grads": "your gradients are 2 bytes: with fp32_grads Megatron reduces its float32 "
                  "main_grad, 4 bytes a parameter",
    "nvlink": "you priced the dp group on NVLink, but its ranks 0, t, 2t, ... span nodes "
              "once (dp − 1)·t reaches the node's GPUs: between nodes the ring runs at "
              "InfiniBand's bandwidth (hierarchically when a node holds several of the group)",
    "flat": "you ran a flat ring over InfiniBand, but the group has several ranks on each "
            "node: the runtime reduces inside each node on NVLink, across the nodes on "
            "1/(ranks a node) of the buffer, then inside again (hierarchical)",
}
BUBBLE_HINTS = {  # (key, the wrong value as a function of p, v, m) -> hint
    ("bubble_over_ideal", "no_v"): (
        lambda p, v, m: (p - 1) / m,
        "you left the chunks out: interleaved 1F1B with v chunks a rank cuts the bubble over "
        "the ideal time to (p − 1)/(v·m)"),
    ("bubble_over_ideal", "share"): (
        lambda p, v, m: (p - 1) / (v * m + p - 1),
        "that is the idle share of the makespan; over the ideal time m·v·(t_F + t_B) the "
        "bubble is (p − 1)/(v·m)"),
    ("idle_share", "over_ideal"): (
        lambda p, v, m: (p - 1) / (v * m),
        "that is the bubble over the ideal time, (p − 1)/(v·m); as a share of the makespan "
        "(the ideal time plus the bubble) it is (p − 1)/(v·m + p − 1)"),
    ("idle_share", "no_v"): (
        lambda p, v, m: (p - 1) / (m + p - 1),
        "you left the chunks out: with v chunks a rank the idle share is "
        "(p − 1)/(v·m + p − 1)"),
}


def flops_variants(model, lay) -> dict:
    """name -> (MFU's numerator, HFU's numerator) of a known mistake."""
    B, s, L, h, V = lay.global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    right = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    extra = {"none": 0.0, "selective": B * L * 4 * s * s * h,
             "full": B * L * (24 * s * h * h + 4 * s * s * h)}[lay.recompute]
    tokens = B * s
    return {"hfu_as_mfu": (right + extra, right + extra),
            "six_psi": (6 * model.parameters() * tokens, 6 * model.parameters() * tokens + extra),
            "qk_only": (right, right + extra / 2 if lay.recompute == "selective" else None),
            "full_logits": (right, right * 4 / 3 if lay.recompute == "full" else None)}


FLOPS_HINTS = {
    "hfu_as_mfu": "your MFU counts the recomputed FLOPs: that is HFU; MFU counts the model's "
                  "FLOPs alone, 72·B·s·L·h²(1 + s/(6h) + V/(12·L·h)), whatever is "
                  "recomputed",
    "six_psi": "you used 6·Ψ·tokens: it counts every parameter (embedding and positions "
               "included) and no attention; the model FLOPs are 72·B·s·L·h²(1 + s/(6h) + "
               "V/(12·L·h)), the s/(6h) term being the s² matmuls",
    "qk_only": "your selective recomputation reruns Q Kᵀ only: it reruns the whole attention "
               "core, Q Kᵀ and the product with V, 4·B·s²·h a layer",
    "full_logits": "your full recomputation reruns the logits too (4/3 of the model FLOPs): "
                   "it reruns every layer's forward, B(24sh² + 4s²h) a layer, not the head",
}


def gpu_words(lay: Layout, got: float, want: float) -> str:
    """A ratio of the GPUs counted: dp, tp, pp alone."""
    for name, n in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("tp·pp", lay.tp * lay.pp)):
        if n > 1 and n != lay.gpus and math.isclose(got, want * lay.gpus / n, rel_tol=1e-6):
            return (f"you divided by {name} = {n} GPUs' peak: the step runs on all "
                    f"{lay.gpus} = tp·pp·dp GPUs")
    return ""


STEP_FORMULAS = {
    "bubble_over_ideal": "bubble over ideal: (p − 1)/(v·m)",
    "idle_share": "idle share: (p − 1)/(v·m + p − 1)",
    "dp_seconds": "the first pipeline rank's gradients Ψ_0·g over ranks 0, t, ..., "
                  "(dp − 1)·t: a ring in the node (NVLink), a ring across nodes (InfiniBand), "
                  "or hierarchical; all-reduce 2(n − 1)α + 2(n − 1)/n·S/B, reduce-scatter "
                  "when sharded (n − 1)α + (n − 1)/n·S/B",
    "mfu": "MFU = 72·B·s·L·h²(1 + s/(6h) + V/(12·L·h)) / (step_seconds · GPUs · peak)",
    "hfu": "HFU = (model FLOPs + recomputed FLOPs) / (step_seconds · GPUs · peak)",
}


def step_mistake(key: str, model, lay, cluster, got: float, want: dict) -> str:
    p, v, m = lay.pp, lay.chunks, lay.microbatches
    for (k, _), (fn, hint) in BUBBLE_HINTS.items():
        if k == key and math.isclose(got, fn(p, v, m), rel_tol=1e-9, abs_tol=1e-12):
            return hint
    if key == "dp_seconds":
        for bug, hint in DP_MISTAKES.items():
            if math.isclose(got, dp_variant(model, lay, cluster, **{bug: True}), rel_tol=0.01):
                return hint
    if key in ("mfu", "hfu"):
        denom = want["step_seconds"] * lay.gpus * cluster.device.peak("bfloat16")
        index = 0 if key == "mfu" else 1
        for name, values in flops_variants(model, lay).items():
            if values[index] is not None and math.isclose(got, values[index] / denom,
                                                         rel_tol=1e-4):
                return FLOPS_HINTS[name]
        return gpu_words(lay, got, want[key])
    return ""


@exercise("10.2", "a step's bubble, its data-parallel reduction, MFU and HFU")
@SETTINGS
@example(h=2048, k=2, s=2048, V=51200, cluster="h100", t=8, p=4, v=2, dp=4, j=1, sp=True,
         rec="selective", zero=0, dist=True, fp32=True)
@example(h=1024, k=1, s=2048, V=32000, cluster="h100", t=2, p=2, v=1, dp=8, j=4, sp=True,
         rec="full", zero=0, dist=False, fp32=True)
@example(h=1024, k=2, s=1024, V=51200, cluster="a100", t=1, p=3, v=0, dp=2, j=5, sp=False,
         rec="none", zero=1, dist=False, fp32=False)
@given(h=st.sampled_from([2048, 1024, 4096]), k=st.integers(1, 3),
       s=st.sampled_from([2048, 1024]), V=st.sampled_from([51200, 32000]),
       cluster=st.sampled_from(["h100", "a100"]), t=st.sampled_from([8, 2, 4, 1, 16]),
       p=st.sampled_from([4, 2, 3, 1]), v=st.sampled_from([2, 1, 0]),
       dp=st.sampled_from([4, 8, 2, 16, 1]), j=st.integers(1, 6), sp=st.booleans(),
       rec=st.sampled_from(["selective", "full", "none"]), zero=st.sampled_from([0, 1]),
       dist=st.booleans(), fp32=st.sampled_from([True, False]))
def check_step_estimate(impl, h, k, s, V, cluster, t, p, v, dp, j, sp, rec, zero, dist, fp32):
    model, lay, spec = step_case(h, k, s, V, cluster, t, p, v, dp, j, sp, rec, zero, dist, fp32)
    want = step_truth(model, lay, cluster)
    what = (f"step_estimate({model.name}, Layout({lay}), CLUSTERS[{cluster!r}], "
            f"step_seconds={want['step_seconds']:.6g})")
    got = read(learner(what, impl.step_estimate, model, lay, spec, want["step_seconds"]),
               STEP_KEYS, what)
    for key in STEP_KEYS:
        tol = TOLERANCE if key == "dp_seconds" else 1e-6
        if relative(got[key], want[key]) <= tol or abs(got[key] - want[key]) <= 1e-12:
            continue
        hint = step_mistake(key, model, lay, spec, got[key], want) or STEP_FORMULAS[key]
        raise GradeFailure(f"{what}: {key} expected {want[key]:.6g}, received {got[key]:.6g} "
                           f"({100 * relative(got[key], want[key]):.3g} % off). {hint}")


# ---- exercise 10.3: a layout that fits and runs near the best -----------------------------

SLACK = 0.10  # within 10 % of the search's best step
H40 = dataclasses.replace(CLUSTERS["h100"], name="DGX H100 with 40 GB devices",
                          device=CLUSTERS["h100"].device.with_memory(40 * GB))
LAYOUT_CASES = [  # (model, GPUs, cluster, global batch)
    ("llama3-8b", 8, CLUSTERS["h100"], 16),
    ("llama2-7b", 16, CLUSTERS["h100"], 64),
    ("llama3-70b", 64, CLUSTERS["h100"], 128),
    ("22b", 16, CLUSTERS["a100"], 32),
    ("llama3-8b", 16, H40, 32),
    ("175b", 64, CLUSTERS["a100"], 64),
]


@lru_cache(maxsize=None)
def best_plan(index: int):
    name, gpus, cluster, batch = LAYOUT_CASES[index]
    return SEARCH.search(MODELS[name], gpus, cluster, batch, top=1)[0]


@contextlib.contextmanager
def without_search():
    """plan.search (and its candidates) refuse to run while the learner plans."""
    def refuse(*args, **kwargs):
        raise GradeFailure("choose_layout called plan.search (or its candidates): the search "
                           "is what grades you. Compare the layouts you consider with "
                           "plan.rank_memory (memory first) and plan.step_time")

    saved = (SEARCH.search, SEARCH.candidates, plan_package.search)
    SEARCH.search = SEARCH.candidates = plan_package.search = refuse
    try:
        yield
    finally:
        SEARCH.search, SEARCH.candidates, plan_package.search = saved


def where_time_goes(mine, best) -> str:
    """The term of your plan's step that exceeds the best plan's the most, in words."""
    words = {"pipeline": "the pipeline's bubble: fewer stages, or more micro-batches a stage",
             "recompute": "recomputation: recompute less (selective before full) where memory "
                          "allows",
             "tp": "tensor parallelism's exposed collectives: a smaller tp, inside the node",
             "zero3": "ZeRO-3's gathers", "dp": "the data-parallel reduction",
             "param_gather": "the distributed optimizer's all-gather",
             "matmul": "the GEMMs themselves (smaller GEMMs run at a lower efficiency)",
             "attention": "attention's s² matmuls", "elementwise": "elementwise work",
             "optimizer": "the optimizer step", "cp": "context parallelism", "ep": "experts"}
    excess = {k: mine.terms[k] - best.terms[k] for k in mine.terms}
    order = sorted(excess, key=excess.get, reverse=True)
    shown = [k for k in order if excess[k] > 0.05 * best.seconds][:3] or order[:1]
    return "where your step loses: " + "; ".join(
        f"{excess[k]:.3g} s more in {words[k]} ({mine.terms[k]:.3g} s against "
        f"{best.terms[k]:.3g} s)" for k in shown)


def read_layout(lay, name: str, gpus: int, cluster, batch: int, what: str) -> None:
    if not isinstance(lay, Layout):
        raise GradeFailure(f"{what} returned {lay!r:.80}; expected a plan.Layout")
    if lay.gpus != gpus:
        raise GradeFailure(f"{what} returned {lay}: tp·pp·dp·cp = {lay.gpus} GPUs, expected "
                           f"{gpus}")
    if lay.global_batch != batch:
        raise GradeFailure(f"{what} returned a global batch of {lay.global_batch}, expected "
                           f"{batch}: the batch is the run's, not the layout's to choose")
    if lay.tp > cluster.gpus_per_node:
        raise GradeFailure(f"{what} returned {lay}: tp {lay.tp} crosses a node of "
                           f"{cluster.gpus_per_node} GPUs, so every layer's tensor-parallel "
                           f"collectives go over {cluster.inter.name}; expected tp <= "
                           f"{cluster.gpus_per_node} (checklist 2: TP inside the node)")
    try:
        memory = rank_memory(MODELS[name], lay, cluster, dropout=False)
    except ValueError as e:
        raise GradeFailure(f"{what} returned {lay}, which {MODELS[name].name} cannot take: "
                           f"{e}") from None
    if not memory.fits:
        parts = ", ".join(f"{c} {t.peak / GiB:.1f}" for c, t in memory.terms().items())
        steady = (f"; its steady bytes ({memory.steady / GiB:.1f} GiB) fit, but the peak adds "
                  f"the transients (a recomputed layer, gathered weights, buffers)"
                  if memory.steady <= memory.capacity else "")
        raise GradeFailure(f"{what} returned {lay}, which does not fit: its busiest rank "
                           f"peaks at {memory.peak / GiB:.2f} GiB ({parts}), the device "
                           f"holds {memory.capacity / GiB:.2f} GiB{steady}. Memory first: "
                           f"check plan.rank_memory(...).fits before timing a layout")


@exercise("10.3", "a layout that fits and runs near the best")
def check_choose_layout(impl):
    for value in vars(impl).values():
        if any(value is forbidden for forbidden in (SEARCH, SEARCH.search, SEARCH.candidates)):
            raise GradeFailure("your file imports plan.search (or its candidates): the search "
                               "is what grades you. Compare the layouts you consider with "
                               "plan.rank_memory and plan.step_time")
    chosen = []
    for index, (name, gpus, cluster, batch) in enumerate(LAYOUT_CASES):
        what = (f"choose_layout({MODELS[name].name}, {gpus} GPUs, {cluster.name}, "
                f"global_batch={batch})")
        with without_search():
            lay = learner(what, impl.choose_layout, MODELS[name], gpus, cluster, batch)
        read_layout(lay, name, gpus, cluster, batch, what)
        chosen.append((what, name, cluster, lay))
    worst = None
    for index, (what, name, cluster, lay) in enumerate(chosen):
        mine = step_time(MODELS[name], lay, cluster, dropout=False)
        best = best_plan(index)
        ratio = mine.seconds / best.time.seconds
        if ratio > 1 + SLACK and (worst is None or ratio > worst[0]):
            worst = (ratio, what, lay, mine, best)
    if worst is not None:
        ratio, what, lay, mine, best = worst
        raise GradeFailure(f"{what} returned {lay}: a step of {mine.seconds:.3f} s, expected "
                           f"within {SLACK:.0%} of the search's best, {best.time.seconds:.3f} s "
                           f"({best.layout}); yours is {ratio - 1:.1%} over the search's best. "
                           f"{where_time_goes(mine, best.time)}")
