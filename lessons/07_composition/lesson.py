# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 07 — 3-D composition and topology
#
# Compose data, tensor and pipeline parallelism on one cluster (N = TP × PP × DP): which rank sits where, which collective crosses which link, what a misplaced tp group costs, the tuning checklist's items measured, the "≤ 7B" rule tested, and a 3-D run equal to one device.
#
# Lessons 02–06 built each form alone. A real run uses them together: N GPUs are a grid of
# shape tp × dp × pp (practitioners write N = TP × PP × DP, with EP folded in for MoE), every
# GPU holds 1/tp of each weight matrix of 1/pp of the layers and trains on 1/dp of the
# batch. The grid is only half the story; the other half is where it lands on the
# machines. Inside a node GPUs talk over NVLink (450 GB/s a direction on H100s here),
# between nodes over InfiniBand (50 GB/s a GPU). The common rule: tensor parallelism
# inside a node, pipeline stages across nodes, data parallelism outermost, ZeRO-1 on top.
# In the kitchen picture: cooks sharing one pan stand in one kitchen, the stations of a
# line may sit on different floors, and the copies of the kitchen can be in other towns.
#
# In minipar a layout is `ParallelDims` and a rank's groups are `ParallelGroups`
# (`minipar/parallel/mesh/`); `parallelize` builds the model, the engine and the pipeline
# of any layout (Megatron-LM, Narayanan et al. 2021, "Efficient Large-Scale Language Model
# Training on GPU Clusters", sections 2–3). Everything below runs in float64 on simulated
# devices.
#
# To see it: `minipar demo` writes a page whose **architecture** mode
# (`demo.html#architecture`) lays the kitchen (DP 2 × TP 4 × PP 3) and the 70B layout
# (TP 4, PP 2, DP 8) on nodes of 8 GPUs and lights any GPU's three groups; the other
# three modes show a 3-D step's batch, memory and time (docs/demo.md).

# %%
import collections

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import (ParallelDims, ParallelGroups, check_placement, parallelize,
                              step_comm)
from minipar.parallel.pp import dry_run, lower, schedule
from minipar.plan import activation_bytes_per_layer, model_flops, model_state_bytes
from minipar.programs.incidents.tp_across_nodes import inter_node_bytes
from minipar.runtime.cost import collective_cost
from minipar.viz import figures

GB = 10**9
CLUSTER = mp.Topology.nodes(2, gpus_per_node=4)  # 8 H100s: NVLink 4 inside, IB NDR across
print(CLUSTER.describe())

# %% [markdown]
# ## 1. The mesh and its coordinates
#
# minipar lays ranks out in Megatron's order `tp-cp-ep-dp-pp`, fastest first: tp varies
# fastest, then dp, then pp. With cp = ep = 1 a rank's coordinates are
#
#     rank = tp_rank + tp · (dp_rank + dp · pp_rank)
#
# so a tp group is tp consecutive ranks (inside a node when tp divides the node), a dp
# group steps by tp, and a pp group by tp · dp. PyTorch spells the same layout slowest
# first, the last dimension fastest: `init_device_mesh((pp, dp, tp), ("pp", "dp", "tp"))`.
# Here is the 2 × 2 × 2 layout on our 8 GPUs, from ParallelGroups on every rank.

# %%
DIMS = ParallelDims(dp_shard=2, pp=2, tp=2)
print(f"{DIMS}: torch spelling init_device_mesh({DIMS.mesh_shape}, {DIMS.mesh_dim_names})")


def where(ctx):
    g = ParallelGroups(DIMS)
    c = g.coordinate
    return {"node": CLUSTER.node_of(ctx.rank), "pp": c["pp"], "dp": c["dp_shard"],
            "tp": c["tp"], "tp group": list(g.tp.ranks), "dp group": list(g.dp.ranks),
            "pp group": list(g.pp.ranks)}


coords = mp.launch(where, DIMS.world_size)
print("rank  node  (pp, dp, tp)  tp group  dp group  pp group")
for r, c in enumerate(coords):
    print(f"{r:>4}  {c['node']:>4}  ({c['pp']}, {c['dp']}, {c['tp']})     "
          f"{str(c['tp group']):<9} {str(c['dp group']):<9} {c['pp group']}")

# %% [markdown]
# Each tp group is a pair of neighbours on one node; the dp groups ({0, 2}, {1, 3}, ...)
# stay inside a node too; only the pp groups ({0, 4}, ...) cross between the nodes. That
# is the default order's promise: the dimension that talks most varies fastest and sits
# closest. **Exercise 7.1** asks you to compute these groups from the rank alone.

# %% [markdown]
# ## 2. Which collective runs on which link
#
# One training step of a small GPT on that layout (ZeRO-1 over dp, 1F1B over pp with two
# micro-batches, Megatron tp), with every rank's trace read afterwards: each communication
# event's bytes, split into what this rank put on NVLink and on InfiniBand (a ring hop to
# the next node, the cross-node part of a hierarchical collective, a send to the other
# node).

# %%
MODEL = GPTConfig(vocab_size=32, seq_len=8, hidden=32, num_heads=4, num_layers=4, seed=0)
BATCH = 12
rng = np.random.default_rng(7)
ids = rng.integers(0, MODEL.vocab_size, (MODEL.seq_len, BATCH))  # [s, B]
targets = np.roll(ids, -1, axis=0)


def step(ctx, dims, zero, m, steps=1):
    """`steps` training steps of MODEL at `dims`; per rank the losses, the ledger's peak,
    the last step's bytes by (group, link class) and its seconds by group."""
    run = parallelize(MODEL, dims, zero=zero, lr=1e-3, placement="any",
                      **({"microbatches": m} if dims.pp > 1 else {}))
    losses = []
    for _ in range(steps):
        first = len(ctx.trace.events)
        ctx.ledger.reset_peak()
        losses.append(run.train_step(ids, targets))
        ctx.resolve_pending()
    links, seconds = collections.Counter(), collections.Counter()
    for e in ctx.trace.events[first:]:
        if e.stream not in ("comm", "p2p"):
            continue
        sent = float(e.meta.get("sent_bytes", 0))
        inter = (inter_node_bytes(e, CLUSTER) if e.stream == "comm"
                 else sent * (e.meta["link"] == CLUSTER.inter.name))
        key = "pp (send)" if e.stream == "p2p" else f"{e.label} ({e.name})"
        links[(key, "NVLink")] += sent - inter
        links[(key, "IB")] += inter
        seconds[key] += e.duration
    return losses, ctx.ledger.peak(), links, seconds


res_222 = mp.launch(lambda ctx: step(ctx, DIMS, 1, 2), 8, topology=CLUSTER)
link_bytes = sum((r[2] for r in res_222), collections.Counter())  # all 8 GPUs
peak_222 = max(r[1] for r in res_222)
print(f"{'group (collective)':<26}{'NVLink bytes':>14}{'IB bytes':>12}   (all 8 GPUs, one step)")
for k in sorted({k for k, _ in link_bytes}):
    print(f"{k:<26}{link_bytes[(k, 'NVLink')]:>14,.0f}{link_bytes[(k, 'IB')]:>12,.0f}")
cross_222 = sum(v for (_, link), v in link_bytes.items() if link == "IB")
print(f"bytes crossing nodes: {cross_222:,.0f}; the busiest GPU's peak: {peak_222:,} bytes")

# %%
groups_222 = sorted({k for k, _ in link_bytes})
figures.bars("07_link_bytes", "One step on 2 × 2 × 2: each group's bytes by link (all 8 GPUs)",
             groups_222, {link: [link_bytes[(k, link)] / 2**10 for k in groups_222]
                          for link in ("NVLink", "IB")},
             ylabel="KiB sent", stacked=True, annotate="{:,.0f}")

# %% [markdown]
# The tp all-reduces (4 a layer and micro-batch: g after attention and MLP in the forward,
# f before each in the backward) carry most of the bytes, all on NVLink; ZeRO-1's
# reduce-scatter and all-gather of the gradients and parameters stay inside the node; the
# only bytes on InfiniBand are the pipeline's activations and their gradients, one
# [s, b, h] per micro-batch at the stage boundary, sent by every tp rank.

# %% [markdown]
# ## 3. Placement: what happens when a group lands on the wrong link
#
# The same 2 × 2 × 2 grid in three orders. In `tp-pp-dp` dp becomes the slowest
# dimension, so the gradients cross the nodes instead of the activations; in `pp-dp-tp`
# tp is slowest and every tp all-reduce crosses InfiniBand — incident A (tp = 16 over
# nodes of 8 on a 70B model, steps 8–10× slower), generalised to any layout.

# %%
placement = {}
for order in ("tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp"):
    dims = ParallelDims(dp_shard=2, pp=2, tp=2, order=order)
    res = mp.launch(lambda ctx: step(ctx, dims, 1, 2), 8, topology=CLUSTER)
    total = sum((r[2] for r in res), collections.Counter())
    crossing = {k: v for (k, link), v in total.items() if link == "IB" and v}
    tp_seconds = max(r[3]["tp (all_reduce)"] for r in res)
    placement[order] = {"cross": sum(crossing.values()), "by group": crossing,
                        "tp seconds": tp_seconds}
    print(f"order {order:<15} crossing nodes {sum(crossing.values()):>9,.0f} bytes "
          f"({', '.join(f'{k} {v:,.0f}' for k, v in crossing.items())}); "
          f"tp all-reduces {tp_seconds * 1e6:.1f} us a GPU")

# %%
crossers = sorted({k for row in placement.values() for k in row["by group"]})
figures.bars("07_placement", "The same 2 × 2 × 2 grid in three orders: what crosses the nodes",
             list(placement), {k: [row["by group"].get(k, 0) / 2**10 for row in
                                   placement.values()] for k in crossers},
             ylabel="KiB on InfiniBand (all 8 GPUs)", stacked=True, annotate="{:,.0f}")

# %% [markdown]
# `check_placement(dims, topology, cfg, ...)` (minipar.parallel) prices the same question
# before anything runs: each dimension's collectives a step, per rank, on the links its
# worst group crosses (none of it overlapped), and it names a tp group across nodes and a
# cheaper order of the same sizes. On our three orders (b = 3 sequences a micro-batch,
# m = 2, ZeRO-1):

# %%
findings = {}
for order in placement:
    dims = ParallelDims(dp_shard=2, pp=2, tp=2, order=order)
    priced = step_comm(dims, CLUSTER, MODEL, micro_batch=3, microbatches=2, zero=1)
    findings[order] = check_placement(dims, CLUSTER, MODEL, micro_batch=3, microbatches=2,
                                      zero=1)
    placement[order]["priced"] = priced
    print(f"order {order:<15} tp {priced.tp * 1e6:6.1f} + dp {priced.dp * 1e6:5.1f} + pp "
          f"{priced.pp * 1e6:5.1f} us a step; findings: "
          f"{[(f.kind, round(f.ratio, 2)) for f in findings[order]] or 'none'}")
print(findings["pp-dp-tp"][0].message)

# %% [markdown]
# Bytes are not seconds. The default order moves the fewest bytes across nodes, yet the
# check prefers `tp-pp-dp` for this tiny model: pp's many small sends each pay
# InfiniBand's latency, dp's two collectives a step pay it once each. At scale the bytes
# decide, as a common 64-GPU example shows (70B, h = 8192, 80 layers, s = 4096, nodes of
# 8, TP = 4, PP = 2, DP = 8, m = 8 micro-batches of one sequence):

# %%
BIG70 = GPTConfig(vocab_size=32000, seq_len=4096, hidden=8192, num_heads=64, num_layers=80,
                  dtype="bfloat16")
NODES8 = mp.Topology.nodes(8, gpus_per_node=8)
example_64 = {}
for order in ("tp-cp-ep-dp-pp", "tp-pp-dp"):
    dims = ParallelDims(dp_replicate=8, pp=2, tp=4, order=order)
    example_64[order] = step_comm(dims, NODES8, BIG70, micro_batch=1, microbatches=8)
    c = example_64[order]
    print(f"64 GPUs, order {order:<15}: tp {c.tp:.2f} + dp {c.dp:.2f} + pp {c.pp:.3f} = "
          f"{c.total:.2f} s of communication a step per rank")
incident_a = check_placement(ParallelDims(dp_replicate=4, tp=16), NODES8, BIG70,
                             micro_batch=1, microbatches=8)[0]
print(f"tp = 16 on nodes of 8 ({incident_a.kind}): {incident_a.ratio:.2f}x tp = 8's "
      f"all-reduce time")

# %% [markdown]
# With a literal "DP outermost" (`tp-pp-dp`) every dp group spans nodes and the
# gradients of 1/8 of 70B cross InfiniBand from every GPU on a flat ring; Megatron's
# default keeps pp outermost and puts two ranks of each dp group on a node (a
# hierarchical all-reduce sends half the bytes across), and communicates less. The rule
# that holds in both: tp innermost. (Neither figure counts overlap: a dp all-reduce
# hides behind the backward, a tp all-reduce never does.) Incident A's tp = 16 runs its
# all-reduces hierarchically here, the kindest algorithm; a flat ring across nodes pays
# the larger factor below.

# %% [markdown]
# The tiny model sends little, so the simulated time is latency-bound; at scale the cost
# model tells the size of the effect. A 70B-class layer (h = 8192, s = 4096,
# b = 1, 80 layers, bf16): one tp all-reduce of [s, b, h] inside a node of 8, as a ring
# across two nodes of 4 each, and hierarchically across them; a step runs 4 · 80 of them.

# %%
S_AR = 4096 * 1 * 8192 * 2  # bytes of [s, b, h] in bf16
BIG = mp.Topology.nodes(4, gpus_per_node=8)
in_node = collective_cost("all_reduce", S_AR, list(range(8)), BIG)
ring_x = collective_cost("all_reduce", S_AR, list(range(4)) + list(range(8, 12)), BIG,
                         algorithm="ring")
hier_x = collective_cost("all_reduce", S_AR, list(range(4)) + list(range(8, 12)), BIG)
tp_step = {k: 4 * 80 * c.seconds for k, c in
           (("in node", in_node), ("ring across", ring_x), ("hierarchical", hier_x))}
for k, t in tp_step.items():
    print(f"tp = 8 {k:<13}: {t * 1e3:7.1f} ms of tp all-reduces a step "
          f"({t / tp_step['in node']:.1f}x)")

# %% [markdown]
# A ring that crosses nodes runs at InfiniBand's pace, about the bandwidth ratio slower;
# the hierarchical algorithm recovers some, but not the NVLink figure. The simulation has
# no congestion, so incident A's sudden 8–10× slow steps (a saturated fabric) are not
# reproduced; the steady factor is.

# %% [markdown]
# ## 4. The tuning checklist, the items minipar can show
#
# A widely used ten-item tuning checklist, each item with the number minipar computes
# (the 70B model of the common "64 GPUs, nodes of 8: TP = 4, PP = 2, DP = 8" example,
# Ψ = 70e9).
#
# 1. *Compute memory first.* Model states per GPU under TP × PP = 8 (Ψ/8 parameters a
#    GPU) and DP = 8, by ZeRO stage:

# %%
PSI = 70e9
states = {z: model_state_bytes(PSI / 8, z, 8)["total"] / GB for z in (0, 1, 2, 3)}
for z, gb in states.items():
    print(f"   ZeRO-{z}: {gb:6.1f} GB of model states a GPU")

# %% [markdown]
#    Plain DDP (16 bytes a parameter, 140 GB) does not fit an 80 GB H100; ZeRO-1 on top
#    (the recipes' "ZeRO-1 on top") brings it to 48 GB, room left for activations.
# 2. *TP fixed to the node*: section 3's factor. 3. *PP = nodes or a factor*, and its
#    bubble (p − 1)/m on the dry run's clock, 1F1B with t_B = 2 t_F:

# %%
bubbles = {}
for p, m in ((2, 8), (4, 8), (8, 8)):
    d = dry_run(lower(schedule("1f1b", p, m)), {"F": 1, "B": 2})
    bubbles[(p, m)] = float(d.bubble_over_ideal)
    print(f"   pp = {p}, m = {m}: bubble {bubbles[(p, m)]:.3f} of the ideal time "
          f"((p - 1)/m = {(p - 1) / m:.3f})")

# %% [markdown]
# 4. *DP last*: data parallelism communicates once a step, the gradients of a GPU's
#    Ψ/(tp·pp) parameters; with 8 replicas across nodes, bf16 gradients, hierarchical:

# %%
dp_ranks = [8 * i for i in range(8)]  # one GPU per node: dp crosses 8 nodes
dp_ar = collective_cost("all_reduce", 2 * PSI / 8, dp_ranks, NODES8)
step_flops = model_flops(512, 4096, 80, 8192, 32000) / 64  # a GPU's share of 512 sequences
step_compute = step_flops / (NODES8.device.peak("bfloat16") * 0.5)  # at 50 % MFU
print(f"   dp all-reduce of {2 * PSI / 8 / GB:.1f} GB: {dp_ar.seconds:.2f} s, against "
      f"{step_compute:.1f} s of compute a step at 50 % MFU "
      f"({dp_ar.seconds / step_compute:.1%}, and it overlaps the backward)")

# %% [markdown]
# 7. *Watch the communication share* (> 30 % of compute: fewer PP stages, or smaller TP):
#    section 3's tp all-reduces against a layer's compute tell which lever to pull.
# 9. *Recover from the DP dimension first*: under DDP every dp replica holds the whole
#    model state, so a lost replica is rebuilt from a surviving one; with ZeRO each dp
#    rank's shard exists once, so recovery starts from the last sharded checkpoint.
# 10. *≤ 7B: DDP + ZeRO-2, no PP* — the next section.
#
# (5 is MoE's expert parallelism, lesson 08; 6, FSDP prefetch, lesson 03; 8, sharded
# checkpoints, lesson 13.)

# %% [markdown]
# ## 5. The "≤ 7B" rule: when data parallelism alone suffices
#
# The claim: "small models (≤ 7B) don't need 3-D parallelism: DDP + ZeRO-2 is enough;
# forcing PP makes it slower because of the bubble" (小模型（≤7B）别用 3D 并行：DDP + ZeRO-2
# 就够). Tested on 16 H100s of 80 GB (2 nodes), a 7B model (h = 4096, 32 layers, 32 heads),
# bf16 with Adam:

# %%
PSI7, H7, L7, A7 = 7e9, 4096, 32, 32
seven_b = {"ddp": model_state_bytes(PSI7, 0, 16)["total"] / GB,
           "zero1": model_state_bytes(PSI7, 1, 16)["total"] / GB,
           "zero2": model_state_bytes(PSI7, 2, 16)["total"] / GB}
for s in (4096, 32768):
    seven_b[f"act {s}"] = L7 * activation_bytes_per_layer(s, 1, H7, A7, recompute="selective") / GB
for k, v in seven_b.items():
    print(f"   {k:<10} {v:6.1f} GB a GPU")
d2 = dry_run(lower(schedule("1f1b", 2, 8)), {"F": 1, "B": 2})
print(f"   pp = 2 with m = 8 would idle {float(d2.bubble_over_ideal):.1%} of the ideal time")

# %% [markdown]
# What holds: with ZeRO-2 the states take 20 GB and a 4k-token micro-batch's activations
# (selective recomputation, 34 sbh a layer) 18 GB, so 7B trains on data parallelism alone,
# and pp = 2 would only add a bubble. Where the claim overstates: *plain* DDP does not fit
# (112 GB of states on an 80 GB GPU) — it is ZeRO that makes "DP alone" work, ZeRO-1
# already (33 GB); and at 32k tokens the activations alone (146 GB) exceed the GPU,
# whatever the ZeRO stage: long sequences need tensor/sequence or context parallelism (or
# full recomputation) even at 7B. The rule is about memory and sequence length, not only
# the parameter count.

# %% [markdown]
# ## 6. Placing a layout under two budgets (exercise 7.2)
#
# The cluster of section 2, the batch of 12 sequences: choose dims, a ZeRO stage and m so
# that the busiest GPU's ledger stays under 650,000 bytes and all GPUs together put under
# 150,000 bytes on InfiniBand in a step. Some candidates, measured:

# %%
candidates = {"dp=2 pp=2 tp=2, DDP": (ParallelDims(dp_replicate=2, pp=2, tp=2), 0, 2),
              "dp=2 pp=2 tp=2, ZeRO-1": (ParallelDims(dp_shard=2, pp=2, tp=2), 1, 2),
              "dp=2 tp=4, ZeRO-2": (ParallelDims(dp_shard=2, tp=4), 2, 1),
              "pp=2 tp=4": (ParallelDims(pp=2, tp=4), 0, 2),
              "pp=4 tp=2": (ParallelDims(pp=4, tp=2), 0, 4)}
design = {}
for name, (dims, zero, m) in candidates.items():
    res = mp.launch(lambda ctx: step(ctx, dims, zero, m), 8, topology=CLUSTER)
    total = sum((r[2] for r in res), collections.Counter())
    design[name] = (max(r[1] for r in res),
                    sum(v for (_, link), v in total.items() if link == "IB"))
    print(f"   {name:<24} peak {design[name][0]:>9,} bytes, crossing nodes {design[name][1]:>9,.0f} bytes")

# %% [markdown]
# DDP is over memory (every replica keeps all optimizer states); dp across nodes sends the
# gradients over InfiniBand; tp = 4 makes four ranks send each boundary's activations.
# Two of these fit both budgets. The grader also asks for 4 nodes of 2 GPUs.
# **Exercise 7.3** predicts the pipeline's part of these bytes before anything runs: each
# rank whose next stage sits on another node sends 2m messages of [s, B/(m·dp), h].

# %% [markdown]
# ## 7. A 3-D run equals one device
#
# Three training steps at 2 × 2 × 2 against one device with the same initial weights and
# batch: the mean of the dp blocks' losses is the global loss.

# %%
res = mp.launch(lambda ctx: step(ctx, DIMS, 1, 2, steps=3), 8, topology=CLUSTER)
parallel_losses = [float(np.mean([r[0][k] for r in res])) for k in range(3)]
with mp.device():
    model = GPT(MODEL)
    opt = AdamW(model.parameters(), lr=1e-3)
    single_losses = []
    for _ in range(3):
        single_losses.append(model.loss_and_grad(ids, targets))
        opt.step()
        opt.zero_grad()
equal = np.allclose(parallel_losses, single_losses, rtol=1e-12)
print("2 x 2 x 2:", [f"{x:.12f}" for x in parallel_losses])
print("1 device: ", [f"{x:.12f}" for x in single_losses], "equal:", equal)

# %% [markdown]
# ## Exercises
#
# - **7.1** `groups_of(rank, dims)`: the ranks of a rank's tp, dp and pp groups from its
#   coordinates, in the default order (section 1). Graded against ParallelGroups on every
#   rank of layouts up to 64 GPUs.
# - **7.2** `place_layout(cfg, topology, global_batch, memory_budget, cross_node_budget)`:
#   a layout, ZeRO stage and micro-batch count for the cluster (section 6). Graded by
#   training one step on the simulated cluster: the ledger's peak, the trace's bytes
#   across nodes, and one device's loss.
# - **7.3** `pipeline_cross_node_bytes(cfg, dims, topology, global_batch, microbatches)`:
#   the bytes the pipeline's sends put on inter-node links in a step (section 6), graded
#   against the sends a run's trace records, over drawn layouts and clusters.
#
# `minipar grade 07` grades `exercise.py`.
#
# ## Summary
#
# - rank = tp_rank + tp · (dp_rank + dp · pp_rank): tp fastest, so tp groups are
#   neighbours inside a node; PyTorch writes the same mesh slowest first.
# - Read the trace by link class: tp's all-reduces are most of the bytes and must stay on
#   NVLink; pp sends one [s, b, h] per micro-batch and boundary; dp sends the gradients
#   once a step. Which of pp and dp crosses the nodes is a matter of their bytes.
# - A tp group across nodes multiplies its all-reduce time by about the bandwidth ratio:
#   incident A, on any layout.
# - The checklist's numbers: 70B at TP × PP = 8, DP = 8 needs ZeRO-1 to fit; the bubble is
#   (p − 1)/m; the dp all-reduce is a small share of a step.
# - "≤ 7B: DP alone" holds with ZeRO, not with plain DDP, and not at long sequences.
