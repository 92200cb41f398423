"""Incident A: tensor parallelism across nodes. t_TP = 4 l · t_AR([s, b, h] in bf16) a step,
on the slowest link the tp group crosses.

The rule: keep each tensor-parallel group inside the NVLink domain of one node, and cross
nodes only with what communicates rarely (pipeline stages, data-parallel gradients once a
step). Megatron's tensor parallelism all-reduces the activations [s, b, h] four times per
layer and step (g after the attention and after the MLP in the forward, f before each in
the backward). Each sits between two matmuls that need its result, so nothing hides it:
at 70B scale it costs a fifth of the layer's compute over NVLink, as much as the compute
or several times it over InfiniBand (the analytical lines of the report).

The case: a 70B model on 32 nodes with TP = 16, so that every tp group spanned nodes (4
GPUs of each node in it). MFU was 35 %, and some steps ran 8-10x slower once the
all-reduces saturated InfiniBand. The fix: TP = 8 inside each node, PP = 4 and DP = 8
across nodes; MFU went back up to 48 %.

How the run reproduces it: one bf16 training step (AdamW under DDP) of a GPT under
TensorParallelGPT on 2 simulated nodes of 4 A100s (NVLink 3 inside a node, InfiniBand
HDR, 200 Gb/s a GPU, between nodes), the same global batch in every layout, each built by
`parallelize` (with placement="any": its placement check would warn about the first two,
which is the point here). Ranks fill a node before the next (node = rank // 4):

    tp=8 over 2 nodes, dp=1     ParallelDims(tp=8): the seed's layout, tp spans nodes
    tp=4 across nodes, dp=2     ParallelDims(dp_replicate=2, tp=4, order="dp-tp"): dp
                                fastest, so tp groups {0,2,4,6} and {1,3,5,7} straddle
                                the nodes and dp pairs share one: placement alone
    tp=4 in node, dp=2 across   ParallelDims(dp_replicate=2, tp=4) (order "tp-cp-ep-dp-pp"):
                                the tp groups are the nodes and only the gradient
                                all-reduce crosses InfiniBand (the fix)

Every layout charges each GPU the same matmul FLOPs (1/8 of the step's), so step times
differ by communication alone. Step time is read from the simulated clocks (from a
barrier to the last rank's end), the communication share from `viz.timeline.measure`,
and MFU = model FLOPs a GPU / (step time x bf16 peak), where the model FLOPs
(plan.model_flops / 8) are checked to equal what the clock was charged. A collective
whose group spans nodes with several ranks on each runs hierarchically (reduce-scatter on
NVLink, all-reduce of 1/m of the data across nodes, all-gather on NVLink), the kindest
algorithm for the cross-node layouts.

What differs from the seed, and how large the effect is. The model is tiny (hidden 256,
one block, 4,096 tokens a step), so every layout is bound by communication latency and
the simulated MFU is a few percent, not 35-48 %: compare the ratios. (A100s are simulated
rather than H100s because their slower clock more than doubles the compute's share of the
step at this size; on H100s the fix's MFU is 3.1 %.) With the default sizes the cross-node
layouts' steps take about 2.7x (tp=8) and 2.1x (tp=4, placement alone) the fix's, and
their TP all-reduces about 3.9x and 3.0x as long. The simulation has no congestion, so
the seed's sudden 8-10x slow steps (a saturated fabric) do not appear; the analytical
lines at 70B scale show where such a factor comes from: an all-reduce run as a flat ring
over InfiniBand takes about the links' bandwidth ratio longer than over NVLink (12.8x here,
300 / 25 GB/s and the longer ring; ~9.7x for NDR vs NVLink 4 on H100s), a hierarchical
one 3.4x. There is no pipeline parallelism here: in the fix, DP alone crosses the nodes,
where the seed's fix puts PP there too.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional

import numpy as np

from ...nn import GPTConfig
from ...parallel import ParallelDims, accumulate_gradients, check_tensor_parallel, parallelize
from ...plan import model_flops
from ...runtime import barrier
from ...runtime.cost import collective_cost
from ...runtime.device import DeviceSpec
from ...runtime.launch import launch
from ...runtime.topology import Link, Topology
from ...runtime.trace import Event
from ...viz.timeline import measure as measure_times
from .planned import SEED_70B, plan_a, report_a

# 2 nodes of 4 A100s: NVLink 3 (300 GB/s a direction) inside, IB HDR (25 GB/s a GPU) across
CLUSTER = Topology.nodes(2, 4, DeviceSpec.a100_80gb(), Link.nvlink3(), Link.infiniband_hdr())
MODEL = GPTConfig(vocab_size=256, seq_len=256, hidden=256, num_heads=8, num_layers=1,
                  dropout=0.0, dtype="bfloat16", seed=0)
GLOBAL_BATCH = 16  # sequences a step, shared by the dp ranks
OPT = dict(lr=1e-3, weight_decay=0.1)
# the seed's model, for the analytical lines (a GPT-shaped layer: MLP 4h, full attention):
# SEED_70B, from planned.py, which predicts the same model whole


def layouts(topo: Topology) -> dict[str, tuple[str, ParallelDims]]:
    """key -> (label, ParallelDims) for n nodes of g GPUs: tp over all ranks; tp = g across
    nodes (order "dp-tp": dp varies fastest, so a tp group takes every n-th rank); tp = g
    in a node (Megatron's default order: tp fastest, a tp group is a node)."""
    n, g = topo.num_nodes, topo.gpus_per_node
    if n < 2 or g < 2:
        raise ValueError(f"incident A needs at least 2 nodes of at least 2 GPUs, got "
                         f"{topo.num_nodes} x {topo.gpus_per_node}")
    return {
        "tp_all": (f"tp={n * g} over {n} nodes, dp=1", ParallelDims(tp=n * g)),
        "tp_across": (f"tp={g} across nodes, dp={n}",
                      ParallelDims(dp_replicate=n, tp=g, order="dp-tp")),
        "tp_in_node": (f"tp={g} in node, dp={n} across", ParallelDims(dp_replicate=n, tp=g)),
    }


def inter_node_bytes(e: Event, topo: Topology) -> float:
    """Bytes rank e.rank put on the inter-node link in collective event `e`.

    hierarchical all_reduce 2(k-1)/k * S/m (k nodes of m group ranks each), all_gather and
    reduce_scatter (k-1)/k * S/m; ring: all the rank sends when its successor in the ring
    (the group in rank order) is on another node, else 0; a group inside one node: 0.
    """
    if e.stream != "comm" or not e.group:
        return 0.0
    nodes = {topo.node_of(r) for r in e.group}
    if len(nodes) == 1:
        return 0.0
    algorithm = e.meta.get("algorithm", "ring")
    if algorithm == "hierarchical":
        k = len(nodes)
        m = len(e.group) // k
        factor = 2 if e.name == "all_reduce" else 1
        return factor * (k - 1) / k * e.nbytes / m
    if algorithm != "ring":
        raise ValueError(f"inter_node_bytes models ring and hierarchical collectives, not "
                         f"{algorithm!r} ({e.name} on group {e.group})")
    i = e.group.index(e.rank)
    successor = e.group[(i + 1) % len(e.group)]
    if topo.node_of(successor) == topo.node_of(e.rank):
        return 0.0
    return float(e.meta.get("sent_bytes", 0.0))


def measure(layout: str, cfg: GPTConfig = MODEL, global_batch: int = GLOBAL_BATCH,
            topology: Topology = CLUSTER) -> dict[str, Any]:
    """One training step in `layout` (a key of `layouts(topology)`), from the simulated
    clocks and traces.

    Returns {"label", "mesh", "step_seconds", "flops" (a GPU's, from its clock),
    "compute_seconds", "mfu", "comm_share", "exposed_share", "tp_comm_seconds",
    "dp_comm_seconds" (a GPU's total, mean over GPUs), "ib_bytes" (a GPU's mean),
    "tp_group", "dp_group" (rank 0's), "loss"}.
    """
    table = layouts(topology)
    if layout not in table:
        raise KeyError(f"no layout {layout!r}; the layouts are {sorted(table)}")
    label, dims = table[layout]
    world = topology.world_size
    dp, tp = dims.dp, dims.tp
    check_tensor_parallel(cfg, tp)
    if global_batch % dp:
        raise ValueError(f"the global batch of {global_batch} sequences must divide among "
                         f"dp = {dp} ranks in layout {layout!r}")
    rng = np.random.default_rng(cfg.seed)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, global_batch))  # [s, B]
    targets = np.roll(ids, -1, axis=0)  # [s, B]: the next token

    def program(ctx):
        run = parallelize(cfg, dims, zero=0, placement="any", **OPT)  # 1/tp of each matrix; DDP
        tp_group, dp_group = run.groups.tp, run.groups.dp
        x, y = run.local_batch(ids, targets)  # [s, B/dp] each
        barrier()  # every rank's clock at the same time
        start, first = ctx.clock.now, len(ctx.trace.events)
        loss = accumulate_gradients(run.model, run.engine, [(x, y)])
        run.engine.step()
        ctx.resolve_pending()
        events = ctx.trace.events[first:]
        comm = {g: sum(e.duration for e in events if e.stream == "comm" and e.label == g)
                for g in ("tp", "dp")}  # mesh groups are named after their dimension
        return {"start": start, "end": ctx.clock.elapsed(), "loss": loss,
                "flops": sum(e.flops for e in events if e.stream == "compute"),
                "ib_bytes": sum(inter_node_bytes(e, topology) for e in events),
                "comm": comm, "groups": (tp_group.ranks, dp_group.ranks)}

    res = launch(program, world, topology=topology)
    start = res[0]["start"]
    end = max(r["end"] for r in res)  # the step ends when the last rank is done
    times = measure_times(res, world, start=start, end=end)
    step = end - start
    peak = topology.device.peak(cfg.dtype)
    flops = res[0]["flops"]
    formula = model_flops(global_batch, cfg.seq_len, cfg.num_layers, cfg.hidden,
                          cfg.vocab_size) / world  # each GPU: 1/tp of the matmuls of B/dp
    if not np.isclose(flops, formula, rtol=1e-9):
        raise RuntimeError(f"{layout}: the clock charged rank 0 {flops:,.0f} FLOPs, the "
                           f"model formula gives {formula:,.0f}; MFU would be wrong")
    return {"label": label, "mesh": {"dp": dp, "tp": tp}, "step_seconds": step,
            "flops": flops, "compute_seconds": flops / peak, "mfu": flops / (step * peak),
            "comm_share": statistics.mean(t.comm_share for t in times),
            "exposed_share": statistics.mean(t.exposed_comm / t.window for t in times),
            "tp_comm_seconds": statistics.mean(r["comm"]["tp"] for r in res),
            "dp_comm_seconds": statistics.mean(r["comm"]["dp"] for r in res),
            "ib_bytes": statistics.mean(r["ib_bytes"] for r in res),
            "tp_group": res[0]["groups"][0], "dp_group": res[0]["groups"][1],
            "loss": res[0]["loss"]}


def at_scale(topology: Topology = CLUSTER, hidden: int = SEED_70B["hidden"],
             seq_len: int = SEED_70B["seq_len"], micro_batch: int = SEED_70B["micro_batch"],
             layers: int = SEED_70B["layers"]) -> dict[str, Any]:
    """The seed's 70B layer, analytically: 4 AR(s·b·h bf16) vs 72 s b h^2 (1 + s/6h) / tp.

    Per layer and micro-batch, on nodes of 8 of `topology`'s GPUs and links: the time of
    the 4 tensor-parallel all-reduces (none overlapped) against the layer's matmuls at the
    bf16 peak (a GPT-shaped layer: MLP 4h, full attention). Nothing else is counted: no
    embedding or head, no DP or PP traffic, no pipeline bubble, no congestion; `busy` =
    compute / (compute + TP comm) is therefore an upper bound on MFU, not a prediction.
    TP = 16 takes 4 GPUs of each of 4 nodes, as in the seed. "model_comm_seconds" is the
    TP communication of one micro-batch through all `layers`.
    """
    topo = Topology.nodes(4, 8, topology.device, topology.intra, topology.inter)
    S = seq_len * micro_batch * hidden * 2  # bytes of one all-reduce: [s, b, h] in bf16
    layer_flops = model_flops(micro_batch, seq_len, 1, hidden, 0)
    spread = [node * 8 + g for node in range(4) for g in range(4)]  # 4 GPUs of 4 nodes
    cases = {  # key -> (label, tp, global ranks of one tp group, algorithm)
        "tp8_in_node": ("TP=8 in one node", 8, list(range(8)), "auto"),
        "tp16_hierarchical": ("TP=16 over 4 nodes, hierarchical", 16, spread, "auto"),
        "tp16_ring": ("TP=16 over 4 nodes, flat ring", 16, spread, "ring"),
    }
    rows = {}
    for key, (label, tp, ranks, algorithm) in cases.items():
        c = collective_cost("all_reduce", S, ranks, topo, algorithm)
        compute = layer_flops / tp / topo.device.peak("bfloat16")
        comm = 4 * c.seconds
        rows[key] = {"label": label, "tp": tp, "all_reduce_seconds": c.seconds,
                     "algorithm": c.algorithm, "link": c.link, "comm_seconds": comm,
                     "compute_seconds": compute, "busy": compute / (compute + comm),
                     "model_comm_seconds": layers * comm}
    return {"hidden": hidden, "seq_len": seq_len, "micro_batch": micro_batch,
            "layers": layers, "all_reduce_bytes": S, "topology": topo.describe(), "rows": rows}


def run(out: Callable[[str], Any] = print, cfg: Optional[GPTConfig] = None,
        global_batch: Optional[int] = None, topology: Optional[Topology] = None
        ) -> dict[str, Any]:
    """Run every layout, print the table and the explanation through `out`, and return
    {"model": {...}, "layouts": {key: measure(...) + "vs_fix"}, "at_scale": at_scale()}.
    None takes the module's MODEL, GLOBAL_BATCH and CLUSTER (read at call time)."""
    cfg = cfg if cfg is not None else MODEL
    global_batch = global_batch if global_batch is not None else GLOBAL_BATCH
    topology = topology if topology is not None else CLUSTER
    results = {key: measure(key, cfg, global_batch, topology) for key in layouts(topology)}
    fix = results["tp_in_node"]
    for r in results.values():
        r["vs_fix"] = r["step_seconds"] / fix["step_seconds"]
    model = {"layers": cfg.num_layers, "hidden": cfg.hidden, "heads": cfg.num_heads,
             "seq_len": cfg.seq_len, "vocab": cfg.vocab_size, "global_batch": global_batch,
             "dtype": cfg.dtype, "parameters": cfg.num_parameters(),
             "topology": topology.describe(), "world": topology.world_size}
    scale, planned = at_scale(topology), plan_a()
    for line in report(model, results, scale, topology) + report_a(planned):
        out(line)
    return {"model": model, "layouts": results, "at_scale": scale, "planned": planned}


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{{{ranks[0]}..{ranks[-1]}}}"
    return "{" + ",".join(map(str, ranks)) + "}"


def report(model: dict, results: dict[str, dict], scale: dict, topology: Topology
           ) -> list[str]:
    """The table and the explanation, with the measured numbers."""
    us, ms = 1e6, 1e3
    peak = topology.device.peak(model["dtype"])
    fix, tp_all, across = results["tp_in_node"], results["tp_all"], results["tp_across"]
    heads = ["tp group", "step", "vs fix", "TP comm", "DP comm", "comm share", "MFU",
             "IB MB/GPU"]
    lines = [
        "Incident A: tensor parallelism across nodes",
        f"GPT, {model['layers']} block(s), hidden {model['hidden']}, {model['heads']} heads, "
        f"vocabulary {model['vocab']} ({model['parameters']:,} parameters, {model['dtype']}); "
        f"{model['global_batch']} x {model['seq_len']} tokens a step; AdamW under DDP",
        f"on {model['topology']}",
        f"every layout charges each GPU {fix['flops'] / 1e9:.3f} GFLOP of matmuls a step = "
        f"{fix['compute_seconds'] * us:.1f} us at the bf16 peak ({peak / 1e12:g} TFLOP/s)",
        f"  {'one step, per GPU (mean)':<27}" + "".join(f"{h:>11}" for h in heads),
    ]
    for r in results.values():
        cells = [_ranks(r["tp_group"]), f"{r['step_seconds'] * us:.1f} us",
                 f"{r['vs_fix']:.2f}x", f"{r['tp_comm_seconds'] * us:.1f} us",
                 f"{r['dp_comm_seconds'] * us:.1f} us", f"{100 * r['comm_share']:.1f} %",
                 f"{100 * r['mfu']:.1f} %", f"{r['ib_bytes'] / 1e6:.2f}"]
        lines.append(f"  {r['label']:<27}" + "".join(f"{c:>11}" for c in cells))
    lines += [
        "  MFU = matmul FLOPs a GPU / (step x peak); comm share = time communicating / step; "
        "IB MB = sent over InfiniBand",
        "",
        "Why: tensor parallelism all-reduces [s, b, h] 4 times a block and step, between "
        "matmuls that wait for the result.",
        f"When the tp group spans nodes, those all-reduces cross InfiniBand: TP time "
        f"{tp_all['tp_comm_seconds'] / fix['tp_comm_seconds']:.1f}x the fix's at "
        f"tp={tp_all['mesh']['tp']}, {across['tp_comm_seconds'] / fix['tp_comm_seconds']:.1f}x "
        f"at tp={across['mesh']['tp']}",
        "(the fix's sizes: placement alone). The fix keeps TP on NVLink and sends only the "
        "gradients across nodes, once a step",
        f"({fix['dp_comm_seconds'] * us:.1f} us). This model is tiny, so every layout is "
        f"latency-bound: compare the ratios, not the MFU.",
        "",
        f"At the seed's scale (analytical, a 70B layer: h={scale['hidden']}, "
        f"s={scale['seq_len']}, b={scale['micro_batch']}; nodes of 8 of these GPUs). Per "
        f"layer and micro-batch:",
        f"4 all-reduces of {scale['all_reduce_bytes'] / 2**20:.0f} MiB, none overlapped, vs "
        f"the layer's matmuls at the bf16 peak; nothing else counted:",
    ]
    rows = scale["rows"]
    for r in rows.values():
        lines.append(f"  {r['label']:<34} TP comm 4 x {r['all_reduce_seconds'] * ms:.3f} = "
                     f"{r['comm_seconds'] * ms:5.2f} ms, compute {r['compute_seconds'] * ms:.2f} "
                     f"ms: busy at most {100 * r['busy']:.0f} %")
    base = rows["tp8_in_node"]["all_reduce_seconds"]
    lines.append(f"  an all-reduce across nodes takes "
                 f"{rows['tp16_hierarchical']['all_reduce_seconds'] / base:.1f}x "
                 f"(hierarchical) to {rows['tp16_ring']['all_reduce_seconds'] / base:.1f}x "
                 f"(flat ring) as long as inside a node;")
    totals = ", ".join(f"{r['model_comm_seconds'] * ms:.0f} ms ({name})" for name, r in
                       zip(("TP=8", "TP=16 hierarchical", "flat ring"), rows.values()))
    lines.append(f"  a micro-batch through all {scale['layers']} layers: TP comm {totals}")
    return lines
