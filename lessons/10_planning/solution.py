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
    # BEGIN SOLUTION Exercise 10.1: the busiest rank's memory — see lesson.py, section 1
    L, h, a, s, V = model.layers, model.hidden, model.heads, model.seq_len, model.vocab
    t, p, N = layout.tp, layout.pp, layout.dp
    b, m = layout.micro_batch, layout.microbatches
    split = t if layout.sequence_parallel else 1  # what SP divides between the blocks
    rows = -(-V // t)  # the vocabulary-parallel embedding's rows on a tp rank
    psi = L // p * 12 * h * h / t + rows * h + s * h  # layers, embedding, positions
    if p == 1:
        psi += rows * h  # the first rank is also the last: the untied head
    w, g, k = 2, (4 if layout.fp32_grads else 2), 12  # bf16 weights, gradients, master + m + v
    zero = max(layout.zero, 1 if layout.distributed_optimizer else 0)
    states = psi * (w / (N if zero >= 3 else 1) + g / (N if zero >= 2 else 1)
                    + k / (N if zero >= 1 else 1))
    sbh = s * b * h
    if layout.recompute == "full":
        A = 2 * sbh / split  # the layer's input alone
    else:
        A = sbh * (10 / split + 24 / t)  # between the blocks, and inside them
        if layout.recompute == "none":
            A += 5 * a * s * s * b / t  # the attention core's scores, softmax and mask
    n = m if layout.schedule == "gpipe" else min(p, m)  # micro-batches in flight on rank 0
    per_pass = L // p * A + sbh / split  # the stage's layers and the embedding's mask
    if p == 1:
        per_pass += 4 * sbh / split + 4 * s * b * rows  # the head's inputs, float32 logits
    return {"model_states": states, "activations": n * per_pass}
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 10.2: a step's bubble, its data-parallel reduction, MFU and HFU — see lesson.py, section 6
    p, v, m = layout.pp, layout.chunks, layout.microbatches
    bubble = (p - 1) / (v * m)  # over the ideal time
    idle = (p - 1) / (v * m + p - 1)  # of the makespan
    L, h, s, V = model.layers, model.hidden, model.seq_len, model.vocab
    t, dp, g = layout.tp, layout.dp, cluster.gpus_per_node
    psi = L // p * model.layer_parameters() / t + V * h / t + s * h
    if p == 1:
        psi += V * h / t
    S = psi * (4 if layout.fp32_grads else 2)  # the rank's gradient bytes
    sharded = layout.zero >= 1 or layout.distributed_optimizer
    nv, ib = cluster.intra, cluster.inter

    def ring(S, n, link, all_reduce):  # a ring all-reduce or reduce-scatter
        steps = 2 if all_reduce else 1
        return steps * ((n - 1) * link.latency + (n - 1) / n * S / link.bandwidth)

    if dp == 1:
        dp_seconds = 0.0
    else:
        nodes = len({i * t // g for i in range(dp)})
        per_node = dp // nodes
        if nodes == 1:
            dp_seconds = ring(S, dp, nv, not sharded)
        elif per_node == 1:
            dp_seconds = ring(S, dp, ib, not sharded)
        elif sharded:  # reduce-scatter in the node, then across the nodes on 1/per_node
            dp_seconds = ring(S, per_node, nv, False) + ring(S / per_node, nodes, ib, False)
        else:  # reduce-scatter in the node, all-reduce across, all-gather in the node
            dp_seconds = (2 * ring(S, per_node, nv, False)
                          + ring(S / per_node, nodes, ib, True))
    B = layout.global_batch
    flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    extra = {"none": 0.0, "selective": B * L * 4 * s * s * h,
             "full": B * L * (24 * s * h * h + 4 * s * s * h)}[layout.recompute]
    capacity = step_seconds * layout.gpus * cluster.device.peak("bfloat16")
    return {"bubble_over_ideal": bubble, "idle_share": idle, "dp_seconds": dp_seconds,
            "mfu": flops / capacity, "hfu": (flops + extra) / capacity}
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 10.3: a layout that fits and runs near the best — see lesson.py, section 8
    options = []
    tp = 1
    while tp <= min(cluster.gpus_per_node, gpus):  # checklist 2: tp inside the node
        if model.heads % tp == 0 and model.kv % tp == 0 and gpus % tp == 0:
            for pp in range(1, model.layers + 1):
                if model.layers % pp or gpus % (tp * pp):
                    continue
                dp = gpus // (tp * pp)
                if global_batch % dp:
                    continue
                for recompute in ("none", "selective", "full"):  # the first that fits
                    layout = Layout(tp=tp, pp=pp, dp=dp, global_batch=global_batch,
                                    sequence_parallel=tp > 1, recompute=recompute,
                                    zero=3 if pp == 1 else 0, distributed_optimizer=pp > 1)
                    try:
                        memory = rank_memory(model, layout, cluster, dropout=False)
                    except ValueError:  # a split the model refuses
                        break
                    if memory.fits:  # checklist 1: memory first, then time
                        seconds = step_time(model, layout, cluster, dropout=False).seconds
                        options.append((seconds, recompute != "none", layout))
                        break
        tp *= 2
    return min(options, key=lambda option: option[:2])[2]
    # END SOLUTION
