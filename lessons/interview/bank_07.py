"""Interview questions on lesson 07 (3-D composition and topology), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 07`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the layout's mesh
(ParallelDims, DeviceMesh), the placement check's per-step prices (minipar.parallel's
step_comm), the cost model (minipar.runtime.cost), the planning formulas (minipar.plan),
the dry run (minipar.parallel.pp) and a small 3-D run on simulated devices (minipar.launch).
"""

from __future__ import annotations

import functools
import math

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import ParallelDims, parallelize, step_comm
from minipar.parallel.pp import dry_run, lower, schedule
from minipar.plan import activation_bytes_per_layer, model_flops, model_state_bytes
from minipar.programs.incidents.tp_across_nodes import inter_node_bytes
from minipar.runtime.cost import collective_cost
from minipar.runtime.mesh import DeviceMesh

GB = 10**9
MS = 1e-3


# ---- helpers ---------------------------------------------------------------------------
def mesh_groups(dims: ParallelDims, rank: int) -> dict:
    """rank's coordinate and its tp, dp (dp_shard) and pp groups, read off the mesh."""
    mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
    groups = {n: list(mesh.get_group(d, rank).ranks)
              for n, d in (("tp", "tp"), ("dp", "dp_shard"), ("pp", "pp"))}
    return {"coordinate": mesh.coordinate(rank), **groups}


def ranks_text(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def bubble(p: int, m: int) -> float:
    """1F1B's idle over ideal time on the dry run's clock (t_B = 2 t_F)."""
    return float(dry_run(lower(schedule("1f1b", p, m)), {"F": 1, "B": 2}).bubble_over_ideal)


def gpt(h: int, layers: int, s: int, heads: int, vocab: int = 32000) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=heads,
                     num_layers=layers, dtype="bfloat16")


SIM = GPTConfig(vocab_size=24, seq_len=6, hidden=16, num_heads=2, num_layers=2, seed=3)
SIM_TOPO = mp.Topology.nodes(2, gpus_per_node=4)


@functools.lru_cache(maxsize=None)
def sim_run(batch: int, m: int, steps: int) -> dict:
    """`steps` AdamW steps of SIM at dp_shard=2 x pp=2 x tp=2 (ZeRO-1, 1F1B) on 2 nodes of
    4 and on one device: the losses, and the last step's bytes by (group, link class)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, SIM.vocab_size, (SIM.seq_len, batch))  # [s, B]
    targets = np.roll(ids, -1, axis=0)
    dims = ParallelDims(dp_shard=2, pp=2, tp=2)

    def program(ctx):
        run = parallelize(SIM, dims, zero=1, microbatches=m, lr=1e-3, placement="any")
        losses = []
        for _ in range(steps):
            first = len(ctx.trace.events)
            losses.append(run.train_step(ids, targets))
            ctx.resolve_pending()
        sent = {}
        for e in ctx.trace.events[first:]:
            if e.stream in ("comm", "p2p"):
                b = float(e.meta.get("sent_bytes", 0))
                ib = inter_node_bytes(e, SIM_TOPO) if e.stream == "comm" else b * (
                    e.meta["link"] == SIM_TOPO.inter.name)
                key = "pp" if e.stream == "p2p" else e.label
                nv_ib = sent.setdefault(key, [0.0, 0.0])
                nv_ib[0] += b - ib
                nv_ib[1] += ib
        return losses, sent

    res = mp.launch(program, 8, topology=SIM_TOPO)
    with mp.device():
        model = GPT(SIM)
        opt = AdamW(model.parameters(), lr=1e-3)
        single = []
        for _ in range(steps):
            single.append(model.loss_and_grad(ids, targets))
            opt.step()
            opt.zero_grad()
    totals = {}
    for _, sent in res:
        for k, (nv, ib) in sent.items():
            t = totals.setdefault(k, [0.0, 0.0])
            t[0] += nv
            t[1] += ib
    parallel = [float(np.mean([r[0][k] for r in res])) for k in range(steps)]
    return {"parallel": parallel, "single": single, "bytes": totals}


# ---- the questions' numbers ------------------------------------------------------------
def q54(tp, dp, pp, rank, gpus_per_node):
    """rank = tp_rank + tp (dp_rank + dp pp_rank); groups; the torch spelling; nodes."""
    dims = ParallelDims(dp_shard=dp, pp=pp, tp=tp)
    g = mesh_groups(dims, rank)
    c = g["coordinate"]
    shape = tuple(s for s, n in zip(dims.mesh_shape, dims.mesh_dim_names)
                  if n in ("pp", "dp_shard", "tp"))
    return {"world": dims.world_size, "tp_rank": c["tp"], "dp_rank": c["dp_shard"],
            "pp_rank": c["pp"], "tp_group": ranks_text(g["tp"]), "dp_group": ranks_text(g["dp"]),
            "pp_group": ranks_text(g["pp"]), "torch_shape": str(shape),
            "node": rank // gpus_per_node,
            "dp_nodes": len({r // gpus_per_node for r in g["dp"]}),
            "pp_nodes": ranks_text(sorted({r // gpus_per_node for r in g["pp"]}))}


def q55(batch, m):
    """Bytes by group and link class of one 2 x 2 x 2 step, from the trace."""
    b = sim_run(batch, m, 1)["bytes"]
    return {"tp_nv": int(b["tp"][0]), "tp_ib": int(b["tp"][1]),
            "dp_nv": int(b["dp_shard"][0]), "dp_ib": int(b["dp_shard"][1]),
            "pp_ib": int(b["pp"][1]), "pp_nv": int(b["pp"][0]),
            "share_tp": b["tp"][0] / sum(nv + ib for nv, ib in b.values())}


def q56(h, s, b, layers, tp, gpus_per_node):
    """4 L all-reduces of [s, b, h] in bf16 a step: in a node, a ring across 2 nodes,
    hierarchical across them."""
    topo = mp.Topology.nodes(2, gpus_per_node)
    S = s * b * h * 2
    half = tp // 2
    inside = list(range(tp))
    across = list(range(half)) + list(range(gpus_per_node, gpus_per_node + half))
    t_in = collective_cost("all_reduce", S, inside, topo).seconds
    t_ring = collective_cost("all_reduce", S, across, topo, algorithm="ring").seconds
    t_hier = collective_cost("all_reduce", S, across, topo).seconds
    k = 4 * layers
    return {"mb": S / 2**20, "in_ms": k * t_in / MS, "ring_ms": k * t_ring / MS,
            "hier_ms": k * t_hier / MS, "ring_x": t_ring / t_in, "hier_x": t_hier / t_in}


def q57(psi_b, gpus, gpus_per_node, tp, pp, dp, h, layers, s, m, gpu_gb):
    """The common 64-GPU 70B layout: states a GPU by ZeRO stage, and the placement check's
    communication a step with pp outermost (the default) or dp outermost."""
    per_gpu = psi_b * 1e9 / (tp * pp)
    cfg = gpt(h, layers, s, heads=64)
    topo = mp.Topology.nodes(gpus // gpus_per_node, gpus_per_node)
    default = step_comm(ParallelDims(dp_replicate=dp, pp=pp, tp=tp), topo, cfg,
                        microbatches=m)
    outer = step_comm(ParallelDims(dp_replicate=dp, pp=pp, tp=tp, order="tp-pp-dp"), topo, cfg,
                      microbatches=m)
    return {"per_gpu_b": per_gpu / 1e9,
            "ddp_gb": model_state_bytes(per_gpu, 0, dp)["total"] / GB,
            "z1_gb": model_state_bytes(per_gpu, 1, dp)["total"] / GB,
            "default_s": default.total, "outer_s": outer.total,
            "default_dp_s": default.dp, "outer_dp_s": outer.dp}


def q58(psi_b, n, gpu_gb, s, long_s, h, layers, heads):
    """The "<= 7B" rule: states under DDP, ZeRO-1, ZeRO-2; activations at two lengths."""
    psi = psi_b * 1e9
    act = lambda seq: layers * activation_bytes_per_layer(seq, 1, h, heads,
                                                          recompute="selective") / GB
    return {"ddp_gb": model_state_bytes(psi, 0, n)["total"] / GB,
            "z1_gb": model_state_bytes(psi, 1, n)["total"] / GB,
            "z2_gb": model_state_bytes(psi, 2, n)["total"] / GB,
            "act_gb": act(s), "long_act_gb": act(long_s), "pp2_bubble": bubble(2, 8)}


def q59(tp, pp, dp, failed, batch):
    """A failed GPU under tp x pp x dp: the replica it takes down, the run at dp - 1."""
    dims = ParallelDims(dp_shard=dp, pp=pp, tp=tp)
    c = mesh_groups(dims, failed)["coordinate"]
    mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
    replica = [r for r in range(dims.world_size)
               if mesh.coordinate(r)["dp_shard"] == c["dp_shard"]]
    return {"world": dims.world_size, "replica": c["dp_shard"], "replica_gpus": len(replica),
            "first": replica[0], "last": replica[-1], "left": dims.world_size - len(replica),
            "new_dp": dp - 1, "per_replica": batch // dp, "new_per_replica": batch / (dp - 1)}


def q60(h, s, b, tp, gpus_per_node):
    """A block's 4 tp all-reduces against its compute, inside a node and across two."""
    topo = mp.Topology.nodes(2, gpus_per_node)
    S = s * b * h * 2
    half = tp // 2
    t_in = collective_cost("all_reduce", S, list(range(tp)), topo).seconds
    t_x = collective_cost("all_reduce", S, list(range(half)) + list(
        range(gpus_per_node, gpus_per_node + half)), topo, algorithm="ring").seconds
    flops = model_flops(b, s, 1, h, 0) / tp  # one block, forward and backward, 1/tp of it
    compute = flops / topo.device.peak("bfloat16")
    return {"block_ms": compute / MS, "ar_in_ms": 4 * t_in / MS, "ar_x_ms": 4 * t_x / MS,
            "share_in": 4 * t_in / compute, "share_x": 4 * t_x / compute}


def q61(nodes, m):
    """PP = nodes or a factor of it: 1F1B's bubble at p = nodes, nodes/2, nodes/4."""
    return {"p1": nodes, "p2": nodes // 2, "p3": nodes // 4, "b1": bubble(nodes, m),
            "b2": bubble(nodes // 2, m), "b3": bubble(nodes // 4, m)}


def q62(gpus, days, interruptions, big, save_min, restart_min):
    """Failure rates at scale: the job's MTBF, one GPU's, at a larger cluster, and Young's
    checkpoint interval sqrt(2 C MTBF) with the time it loses."""
    job_h = days * 24 / interruptions
    gpu_h = job_h * gpus
    big_min = gpu_h / big * 60
    young = math.sqrt(2 * save_min * job_h * 60)
    lost = (save_min / young + (young / 2 + restart_min) / (job_h * 60))
    return {"job_h": job_h, "gpu_years": gpu_h / (24 * 365), "big_min": big_min,
            "per_day": 24 / job_h, "young_min": young, "lost": lost}


def q63(batch, m, steps):
    """A 2 x 2 x 2 run against one device, step by step."""
    r = sim_run(batch, m, steps)
    diff = max(abs(a - b) for a, b in zip(r["parallel"], r["single"]))
    return {"first_loss": r["single"][0], "last_loss": r["single"][-1], "max_diff": diff}


def q64(psi_b, gpus, gpus_per_node, tp, pp, dp, h, layers, s, m):
    """ZeRO-1 against ZeRO-3 on top of 3-D: the dp seconds a step, from the check."""
    cfg = gpt(h, layers, s, heads=64)
    topo = mp.Topology.nodes(gpus // gpus_per_node, gpus_per_node)
    dims = ParallelDims(dp_shard=dp, pp=pp, tp=tp)
    z1 = step_comm(dims, topo, cfg, microbatches=m, zero=1).dp
    z3 = step_comm(dims, topo, cfg, microbatches=m, zero=3).dp
    per_gpu = psi_b * 1e9 / (tp * pp)
    return {"z1_s": z1, "z3_s": z3, "z3_x": z3 / z1,
            "z1_gb": model_state_bytes(per_gpu, 1, dp)["total"] / GB,
            "z3_gb": model_state_bytes(per_gpu, 3, dp)["total"] / GB}


def q65(tp, dp, pp, gpus_per_node):
    """Megatron's order against a torch mesh read backwards: tp groups that span nodes."""
    right = ParallelDims(dp_shard=dp, pp=pp, tp=tp)
    wrong = ParallelDims(dp_shard=dp, pp=pp, tp=tp, order="pp-dp-tp")  # tp slowest
    out = {}
    for key, dims in (("right", right), ("wrong", wrong)):
        mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
        groups = mesh.groups("tp")
        spans = [len({r // gpus_per_node for r in g.ranks}) for g in groups]
        out[f"{key}_groups"] = len(groups)
        out[f"{key}_spanning"] = sum(x > 1 for x in spans)
        if key == "wrong":
            out["wrong_nodes"] = max(spans)
        out[f"{key}_rank0"] = ranks_text(mesh.get_group("tp", 0).ranks)
    return out


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="07", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q54", dict(tp=4, dp=9, pp=3, rank=60, gpus_per_node=8),
        "A job runs tp = {tp}, dp = {dp}, pp = {pp} in Megatron's default order "
        "(tp-cp-ep-dp-pp) on nodes of {gpus_per_node} GPUs. Where is global rank {rank}: its "
        "coordinates, its three groups, its node?",
        "Fastest first: rank = tp_rank + tp · (dp_rank + dp · pp_rank), over {world} ranks. "
        "Rank {rank} is tp rank {tp_rank}, dp rank {dp_rank}, pp rank {pp_rank}. Its tp group "
        "is consecutive ranks ({tp_group}), inside node {node}; its dp group steps by tp "
        "({dp_group}) and spans {dp_nodes} nodes; its pp group steps by tp · dp ({pp_group}) "
        "on nodes {pp_nodes}. PyTorch spells the same layout slowest first: "
        "init_device_mesh({torch_shape}, (\"pp\", \"dp\", \"tp\")), the last dimension "
        "fastest.",
        q54),
    entry(
        "q55", dict(batch=8, m=2),
        "On 2 nodes of 4 GPUs a small GPT trains at dp = 2 (ZeRO-1) × pp = 2 (1F1B, m = {m}) "
        "× tp = 2 with a batch of {batch} sequences. Which collectives run on NVLink and "
        "which on InfiniBand? Read one step's trace.",
        "In the default order tp and dp groups sit inside a node and the pp pairs (r, r + "
        "4) cross. Summed over the 8 GPUs: tp's all-reduces put {tp_nv} bytes on NVLink and "
        "{tp_ib} on InfiniBand ({share_tp:.0%} of all bytes sent); ZeRO-1's reduce-scatter "
        "and all-gather over dp {dp_nv} on NVLink and {dp_ib} across; the pipeline's sends "
        "(an activation forward, its gradient back, per micro-batch and tp rank) {pp_ib} on "
        "InfiniBand and {pp_nv} on NVLink. The dimension that talks most sits on the "
        "fastest link.",
        q55),
    entry(
        "q56", dict(h=6144, s=2048, b=2, layers=60, tp=8, gpus_per_node=8),
        "A tp = {tp} group is placed half on one node, half on another (nodes of "
        "{gpus_per_node} H100s). What does it cost? h = {h}, s = {s}, b = {b}, {layers} "
        "layers, bf16.",
        "Tensor parallelism all-reduces [s, b, h] ({mb:.0f} MiB) 4 times a layer and step, "
        "between matmuls that wait for it. Inside a node: {in_ms:.0f} ms a step. Split across "
        "two nodes, a ring runs at InfiniBand's pace: {ring_ms:.0f} ms ({ring_x:.1f}x); "
        "the hierarchical algorithm (reduce-scatter on NVLink, all-reduce of 1/4 across, "
        "all-gather) {hier_ms:.0f} ms ({hier_x:.1f}x). Incident A generalised: keep tp inside "
        "the NVLink domain and let pp or dp cross nodes.",
        q56),
    entry(
        "q57", dict(psi_b=70, gpus=64, gpus_per_node=8, tp=4, pp=2, dp=8, h=8192, layers=80,
                    s=4096, m=12, gpu_gb=94),
        "A common example: {psi_b}B parameters on {gpus} GPUs in nodes of {gpus_per_node}, "
        "TP = {tp}, PP = {pp}, DP = {dp}. Does it fit {gpu_gb} GB GPUs, and which dimension "
        "should cross the nodes, pp or dp? (h = {h}, {layers} layers, s = {s}, m = {m} "
        "micro-batches of one sequence.)",
        "A GPU holds {per_gpu_b:.2f}B parameters (1/(TP·PP)). Under DDP that is "
        "{ddp_gb:.0f} GB of states, over {gpu_gb} GB; ZeRO-1 on top shards the 12 optimizer "
        "bytes over DP: {z1_gb:.1f} GB, room left for activations. Placement, from the "
        "placement check's prices a step (nothing overlapped): Megatron's default order "
        "(pp outermost, two ranks of each dp group on a node) communicates {default_s:.2f} s "
        "a step per GPU, dp {default_dp_s:.2f} s of it; dp outermost (one rank of each dp "
        "group per node, a flat ring over InfiniBand) {outer_s:.2f} s, dp {outer_dp_s:.2f} s. "
        "With tp = 4 a node holds two tp groups, and whichever dimension fills the rest of "
        "the node talks on NVLink: the default order gives that room to dp.",
        q57),
    entry(
        "q58", dict(psi_b=7, n=16, gpu_gb=80, s=3072, long_s=32768, h=4096, layers=32,
                    heads=64),
        "\"Models of 7B or less need no 3-D parallelism: DDP + ZeRO-2 is enough, PP only adds "
        "a bubble.\" Check it on {n} GPUs of {gpu_gb} GB ({psi_b}B, h = {h}, {layers} layers, "
        "{heads} heads, bf16 with Adam, one sequence a GPU).",
        "Mostly right, for the reason it leaves out. Plain DDP does not fit: {ddp_gb:.0f} GB "
        "of states a GPU. ZeRO makes data parallelism enough: ZeRO-1 {z1_gb:.2f} GB, ZeRO-2 "
        "{z2_gb:.2f} GB, plus {act_gb:.2f} GB of activations at s = {s} (selective "
        "recomputation). PP = 2 with 8 micro-batches would idle {pp2_bubble:.1%} of the ideal "
        "time for nothing. But at s = {long_s} the activations alone are {long_act_gb:.0f} GB: "
        "a long-context 7B needs sequence, context or tensor parallelism (or full "
        "recomputation) after all. The rule is about memory, not the parameter count.",
        q58),
    entry(
        "q59", dict(tp=8, pp=4, dp=12, failed=211, batch=1536),
        "A GPU (global rank {failed}) dies in a tp = {tp} × pp = {pp} × dp = {dp} job "
        "(default order) training {batch} sequences a step. Why recover along the dp "
        "dimension first, and what runs afterwards?",
        "Rank {failed} belongs to data-parallel replica {replica}: the {replica_gpus} GPUs "
        "(tp × pp) that hold one whole copy of the model between them, here not a contiguous "
        "block ({first} ... {last}, tp fastest then dp). Its tp and pp partners cannot go "
        "on without its shard, but every other replica holds the same parameters: drop "
        "replica {replica} and continue on {left} of {world} GPUs at dp = {new_dp}, from the "
        "last checkpoint (or, under DDP, a surviving replica's weights), each replica now "
        "training {new_per_replica:.1f} sequences instead of {per_replica} (or keep the "
        "global batch with gradient accumulation). A tp or pp dimension cannot shrink "
        "without resharding every weight; dp can, which is why the tuning checklist says "
        "recover DP first. Under ZeRO the optimizer shards live once per dp rank, so the "
        "resumed run reshards them from a checkpoint.",
        q59),
    entry(
        "q60", dict(h=12288, s=2048, b=1, tp=8, gpus_per_node=8),
        "The checklist says: if communication exceeds 30 % of compute, change the layout. "
        "For one transformer block at tp = {tp} (h = {h}, s = {s}, b = {b}, bf16, H100s in "
        "nodes of {gpus_per_node}), compare the tp all-reduces with the block's compute, in "
        "a node and split across two.",
        "A block's forward and backward take {block_ms:.3f} ms of each GPU's compute (1/tp of "
        "72 s b h² (1 + s/6h) FLOPs at peak). Its four all-reduces of [s, b, h]: {ar_in_ms:.3f} "
        "ms on NVLink ({share_in:.0%} of compute), {ar_x_ms:.3f} ms as a ring across two "
        "nodes ({share_x:.0%}). Nothing hides them: each sits between two matmuls that need "
        "its result. Inside the node the share stays under 30 % at this width (it shrinks "
        "as 1/h, so narrower models pay more); across nodes no width saves it: shrink tp to "
        "the node. The shares are at peak FLOPs; at 50 % MFU the compute doubles and they "
        "halve.",
        q60),
    entry(
        "q61", dict(nodes=16, m=24),
        "\"PP = the number of nodes, or a factor of it.\" With {nodes} nodes and m = {m} "
        "micro-batches a step, how much does that choice cost in bubble?",
        "1F1B idles (p − 1)/m of the ideal time, on the dry run's clock: p = {p1} "
        "{b1:.1%}, p = {p2} {b2:.1%}, p = {p3} {b3:.1%}. The stage count is a bubble "
        "decision before it is a topology one: with few micro-batches choose the smaller "
        "factor and give the rest to dp (or raise m, or interleave).",
        q61),
    entry(
        "q62", dict(gpus=16384, days=54, interruptions=419, big=100000, save_min=2,
                    restart_min=10),
        "Llama 3's 405B pre-training saw {interruptions} unexpected interruptions in {days} "
        "days on {gpus} GPUs. What is the mean time between failures of the job, of one GPU, "
        "and of a {big}-GPU job? How often should it checkpoint if a save takes "
        "{save_min} min and a restart {restart_min} min?",
        "The job fails every {job_h:.2f} h ({per_day:.1f} times a day); one GPU, with its "
        "host and links, every {gpu_years:.1f} years; at {big} GPUs the same parts fail "
        "every {big_min:.0f} min. Young's interval sqrt(2 · C · MTBF) = {young_min:.1f} min "
        "between checkpoints; then about {lost:.1%} of the time goes to saving, recomputing "
        "the lost half-interval and restarting. At ten-thousand-GPU scale a failure is routine: "
        "asynchronous sharded checkpoints, fast restarts, and shrinking dp instead of "
        "waiting for a spare are what keep the GPUs busy.",
        q62),
    entry(
        "q63", dict(batch=8, m=2, steps=3),
        "How do you convince yourself that a 3-D layout trains the same model as one GPU? "
        "Run dp = 2 × pp = 2 × tp = 2 for {steps} steps on a batch of {batch} (m = {m}).",
        "Start both from the same full-shape initial weights (sharded after), feed the same "
        "global batch, run in float64 so that only reduction order differs, and compare. The "
        "single device's loss goes {first_loss:.6f} → {last_loss:.6f}; the mean of the dp "
        "blocks' losses at 2 × 2 × 2 differs from it by at most {max_diff:.1e} over the "
        "{steps} steps, rounding. A wrong dropout slice, a missed gradient reduction, or a "
        "norm counted twice shows up at the first step.",
        q63),
    entry(
        "q64", dict(psi_b=70, gpus=64, gpus_per_node=8, tp=4, pp=2, dp=8, h=8192,
                    layers=80, s=4096, m=12),
        "Why do 3-D recipes put ZeRO-1, not ZeRO-3, on top of the pipeline? The common "
        "layout: {psi_b}B on {gpus} GPUs in nodes of {gpus_per_node}, TP = {tp}, PP = {pp}, "
        "DP = {dp}, m = {m} micro-batches (h = {h}, {layers} layers, s = {s}).",
        "ZeRO-3 gathers a stage's weights before each micro-batch's forward and backward, "
        "2m all-gathers a step, where ZeRO-1 reduce-scatters and all-gathers once. The "
        "placement check's dp time a step: ZeRO-1 {z1_s:.2f} s, ZeRO-3 {z3_s:.2f} s "
        "({z3_x:.1f}x). What ZeRO-3 saves, {z1_gb:.1f} GB against {z3_gb:.1f} GB of states a "
        "GPU, TP × PP has mostly saved already. DeepSeek-V3, too, used ZeRO-1 with its "
        "pipeline.",
        q64),
    entry(
        "q65", dict(tp=4, dp=5, pp=2, gpus_per_node=8),
        "A script builds init_device_mesh((pp, dp, tp)) but passes the names fastest first, "
        "so tp ends up slowest. tp = {tp}, dp = {dp}, pp = {pp} on nodes of "
        "{gpus_per_node}: what happens to the tp groups?",
        "With tp fastest, the {right_groups} tp groups are consecutive ranks (rank 0's: "
        "{right_rank0}): {right_spanning} span nodes. With tp slowest, rank 0's tp group is "
        "{wrong_rank0}: {wrong_spanning} of {wrong_groups} groups span nodes, each across "
        "{wrong_nodes} nodes, and every all-reduce of every layer crosses InfiniBand. The "
        "run is still correct (the same math, a different placement), only slow: check the "
        "groups' nodes when a layout is built, as minipar's placement check does.",
        q65),
]
