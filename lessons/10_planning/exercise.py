# Your file for lesson 10, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 10`.
"""Lesson 10 — Planning a run: the exercises' answers.

Exercise 10.1 counts the memory of a layout's busiest rank, the first pipeline rank, from
the formulas of sections 1–3: its model states (weights, gradients and optimizer states,
sharded by ZeRO) and its activations (a layer's bytes times the layers of a stage times
the micro-batches in flight, plus the ends). Exercise 10.2 predicts pieces of a step's
time (sections 6–7): the pipeline's bubble in its two spellings, the first pipeline
rank's data-parallel gradient reduction on the cluster's links, and MFU and HFU from a
step time. Exercise 10.3 plans: it chooses, for a model on a number of GPUs, a layout
that keeps tensor parallelism inside the node, fits the device, and runs within 10 % of
the fastest plan (sections 8 and 10), using the planner's memory and time but not its
search.
"""

from __future__ import annotations

from minipar.plan import Layout, rank_memory, step_time


def rank_memory_estimate(model, layout) -> dict:
    """The first pipeline rank's steady bytes under `layout` (sections 1–3).

    model: a GPT-shaped plan.ModelSpec — model.layers L, model.hidden h, model.heads a,
    model.seq_len s, model.vocab V; a GeLU MLP of 4h, multi-head attention, biases,
    LayerNorm, learned positions, an untied head — trained as Megatron's GPT is, with
    dropout (1-byte masks) and bf16 activations (e = 2 bytes an element).
    layout: a plan.Layout with cp = ep = 1, one chunk, schedule "1f1b" or "gpipe", bf16:
    layout.tp t, layout.pp p, layout.dp N, layout.micro_batch b, layout.microbatches m,
    layout.sequence_parallel, layout.recompute ("none", "selective", "full"), layout.zero
    (0..3), layout.distributed_optimizer (ZeRO-1 by another name), layout.fp32_grads
    (Megatron's float32 main_grad: 4-byte gradients, else 2).

    Returns {"model_states": bytes, "activations": bytes}, each within 2 % of
    plan.rank_memory(model, layout) (scope "model", dropout on): model_states is its
    parameters + gradients + optimizer states, activations its activations, both steady.
    The first rank holds L/p layers (12h²/t weights each; biases and norms, under 0.5 %,
    may be left out), the embedding ceil(V/t)·h and the positions s·h, and when p = 1 the
    head ceil(V/t)·h too. Each micro-batch in flight keeps its L/p layers' activations,
    the embedding's dropout mask (s·b·h bytes, ÷ t under sequence parallelism) and when
    p = 1 the head's two inputs (2e·sbh, ÷ t under SP) and its float32 logits 4·s·b·ceil(V/t).
    """
    raise NotImplementedError("Exercise 10.1: the busiest rank's memory — see lesson.py, section 1")


def step_estimate(model, layout, cluster, step_seconds: float) -> dict:
    """Pieces of one step's time under `layout` on `cluster` (sections 6 and 7).

    model: a GPT-shaped plan.ModelSpec (as in 10.1); model.layer_parameters() is one
    layer's parameters (biases and norms included). layout: a plan.Layout, bf16, cp = 1,
    schedule "1f1b", "gpipe" or "interleaved_1f1b" with layout.chunks v, zero 0 or 1 or
    the distributed optimizer, tp and dp powers of two. cluster: a plan.ClusterSpec —
    cluster.gpus_per_node g, cluster.intra and cluster.inter links (.latency in seconds,
    .bandwidth in bytes/s a direction), cluster.device.peak("bfloat16") in FLOP/s.
    step_seconds: the step's predicted time.

    Returns a dict:

        bubble_over_ideal  a pipeline's idle time over its ideal time m·v·(t_F + t_B) a
                           rank, for p equal stages and free messages: (p − 1)/(v·m)
        idle_share         the same idle time as a share of the pipeline's makespan
        dp_seconds         the first pipeline rank's gradient reduction, before overlap:
                           an all-reduce of its gradients, or a reduce-scatter when the
                           optimizer states are sharded (zero >= 1 or the distributed
                           optimizer), 0 when dp = 1. Its gradients: Ψ_0 · (4 bytes with
                           fp32_grads, else 2), Ψ_0 = L/p · model.layer_parameters()/t +
                           V·h/t + s·h (+ the head V·h/t when p = 1). Its group: ranks
                           0, t, 2t, ..., (dp − 1)·t, rank r on node r // g. A group in
                           one node runs a ring on NVLink; one rank a node, a ring on
                           InfiniBand; k nodes of several ranks each, the hierarchical
                           algorithm: in the node, across the nodes on 1/(ranks a node)
                           of the data, in the node again. A ring all-reduce of S bytes
                           over n ranks takes 2(n − 1)·α + 2(n − 1)/n · S/B, a ring
                           reduce-scatter (n − 1)·α + (n − 1)/n · S/B (lesson 01).
        mfu, hfu           model FLOPs 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) (B = the
                           global batch) over step_seconds · GPUs · peak; HFU adds the
                           recomputed FLOPs: a layer's forward B(24sh² + 4s²h) for every
                           layer under full recomputation, the attention core's two s²
                           matmuls 4Bs²h a layer under selective recomputation
    """
    raise NotImplementedError("Exercise 10.2: a step's bubble, its data-parallel reduction, MFU and HFU — see lesson.py, section 6")


def choose_layout(model, gpus: int, cluster, global_batch: int) -> Layout:
    """A layout for `model` on `gpus` GPUs of `cluster`'s nodes with `global_batch`
    sequences a step (sections 8 and 10).

    model: a plan.ModelSpec (model.heads, model.kv key-value heads, model.layers);
    cluster: a plan.ClusterSpec (cluster.gpus_per_node, cluster.device.memory_bytes).
    Returns a plan.Layout of exactly `gpus` GPUs and `global_batch` sequences whose tp
    group stays inside a node, whose busiest rank fits the device —
    plan.rank_memory(model, layout, cluster, dropout=False).fits — and whose step,
    plan.step_time(model, layout, cluster, dropout=False).seconds, is within 10 % of the
    fastest plan the planner's search finds. Use rank_memory and step_time to compare
    the layouts you consider; plan.search is what grades you, and may not be called.
    """
    raise NotImplementedError("Exercise 10.3: a layout that fits and runs near the best — see lesson.py, section 8")
