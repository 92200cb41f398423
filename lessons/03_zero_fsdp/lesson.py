# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 03 — ZeRO and FSDP
#
# ZeRO-1/2/3 and FSDP partition Adam's states, gradients and weights; fit a step to a budget.
#
# Data parallelism (DDP) copies the whole kitchen: every rank holds the same weights,
# the same gradients after the all-reduce and the same Adam states, and runs the same
# optimizer step on them. Only the batch differs between the copies. ZeRO (Rajbhandari et
# al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC20)
# observes that all this duplication is waste: the N kitchens need one recipe notebook
# between them, not N, as long as each cook keeps a different part of it and they tell
# each other what changed. PyTorch's FSDP (Zhao et al. 2023) is the same idea under other
# names.
#
# Run this file with `python lessons/03_zero_fsdp/lesson.py`, or open it as a notebook.
# Every number below is computed by minipar.
#
# To see it: the **state** mode of `minipar demo` (`demo.html#state`) draws every rank's
# memory by category over a real step; pick ZeRO 1, 2 or 3 and watch which category
# shrinks by dp (docs/demo.md).

# %%
import numpy as np

import minipar as mp
from minipar.data import split_microbatches
from minipar.programs.incidents import zero3_recompute
from minipar.nn import GPT, GPTConfig, Parameter
from minipar.optim import AdamW
from minipar.parallel import FullyShardedDataParallel, ShardingStrategy, zero_engine
from minipar.parallel.dp import accumulate_gradients
from minipar.plan import STAGE_NAMES, dp_comm_elements, flat_padding, model_state_bytes
from minipar.viz import figures

GB = 1e9

# %% [markdown]
# ## 1. What DDP replicates, and what ZeRO partitions
#
# With mixed-precision Adam every parameter costs 16 bytes: 2 for the bf16 weight, 2 for
# its bf16 gradient, and K = 12 for the float32 master weight, m and v (lesson 00). Under
# DDP each of the N ranks holds all 16Ψ, so the cluster stores N copies of one model
# state. ZeRO cuts the redundant copies away in three stages, each partitioning one more
# kind of state into N shards, rank r keeping shard r:
#
# | stage | ZeRO's name | partitioned | bytes per rank |
# | --- | --- | --- | --- |
# | 0 | DDP | nothing | 2Ψ + 2Ψ + 12Ψ = 16Ψ |
# | 1 | P_os | optimizer states | 2Ψ + 2Ψ + 12Ψ/N |
# | 2 | P_os+g | + gradients | 2Ψ + 2Ψ/N + 12Ψ/N |
# | 3 | P_os+g+p | + weights | 16Ψ/N |
#
# Stage 1 already removes most of the waste, because the optimizer states are 12 of the 16
# bytes. Counted over the whole cluster, for a 7B model on N = 8 ranks:

# %%
psi, n = 7e9, 8
for stage, name in STAGE_NAMES.items():
    per_rank = model_state_bytes(psi, stage, n)["total"]
    print(f"  {name:<18} {per_rank / GB:7.2f} GB per rank, {n * per_rank / GB:7.1f} GB in the "
          f"cluster = {n * per_rank / (16 * psi):4.2f} copies of the 16Ψ model state")

# %%
by_stage = {name: model_state_bytes(psi, stage, n) for stage, name in STAGE_NAMES.items()}
figures.bars("03_zero_memory", f"Model states per rank, 7B on N = {n}, by ZeRO stage",
             list(by_stage), {"bf16 weights": [c["parameters"] / GB for c in by_stage.values()],
                              "bf16 gradients": [c["gradients"] / GB for c in by_stage.values()],
                              "Adam (fp32 master, m, v)": [c["optimizer_states"] / GB
                                                           for c in by_stage.values()]},
             ylabel="GB per rank", stacked=True, annotate="{:.1f}",
             hline=(80, "an H100's 80 GB"))

# %% [markdown]
# Only ZeRO-3 keeps exactly one copy. ZeRO-1 and ZeRO-2 still replicate the bf16 weights
# (and ZeRO-1 the gradients), because the forward and backward of every rank read them.
#
# ## 2. The ZeRO-1 step by hand
#
# ZeRO-1 lays the parameters end to end in a flat buffer padded with zeros to a multiple
# of N, Ψ' = Ψ + ((−Ψ) mod N) elements, and gives rank r the shard
# `flat[r·Ψ'/N : (r+1)·Ψ'/N]`. It keeps Adam's m and v (and, in mixed precision, the
# master weights) for that shard only. The backward is DDP's, every rank computing a full
# local gradient g_r on its own micro-batch; what changes is the step:
#
#     s_r = reduce_scatter(g, "avg")[r]     the averaged gradient, shard r only  [Ψ'/N]
#     w_r = AdamW(w_r, s_r; m_r, v_r)       the update of the elements rank r owns
#     w   = all_gather(w_r)                 every rank has the whole new weights  [Ψ']
#
# AdamW is elementwise, so updating N disjoint shards with the averaged gradient is the
# single-device step, cut in N. Here it is on 4 ranks, in float64, for a buffer of 10
# elements (so 2 of padding): `AdamW` from minipar steps a `Parameter` holding the shard,
# exactly what `ShardedOptimizer` does inside the engines.

# %%
psi, n = 10, 4
hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
padded = psi + flat_padding(psi, n)
w0 = np.linspace(-1.0, 1.0, psi)  # the same initial weights on every rank
local_grads = [np.cos(np.arange(psi) * 0.7 + r) * (r + 1) for r in range(n)]  # g_r: [Ψ]


def zero1_by_hand(ctx):
    r, shard = ctx.rank, padded // ctx.world_size
    w = np.zeros(padded)  # the flat weights, [Ψ'], zeros in the padding
    w[:psi] = w0
    g = np.zeros(padded)  # this rank's local gradient, [Ψ']
    g[:psi] = local_grads[r]
    s = mp.reduce_scatter(g, "avg")  # [Ψ'/N]: rank r's chunk of the average
    p = Parameter(f"flat[{r * shard}:{(r + 1) * shard}]", w[r * shard:(r + 1) * shard].copy())
    opt = AdamW([p], **hyper)  # m and v for Ψ'/N elements only
    p.grad = s
    opt.step()
    w = mp.all_gather(p.data)  # [Ψ']: the whole updated weights again
    mp.all_reduce(g[:psi], "avg")  # what DDP would send instead, for comparison
    sent = {e.name: e.meta["sent_bytes"] for e in ctx.trace.of("comm")}
    return w[:psi], opt.state_nbytes(), sent


res = mp.launch(zero1_by_hand, n)
with mp.device():  # one device, the averaged gradient, one AdamW step
    p = Parameter("w", w0.copy())
    opt = AdamW([p], **hyper)
    p.grad = sum(local_grads) / n  # (((g_0 + g_1) + g_2) + g_3) / N, the collective's order
    opt.step()
    one_device, one_device_state = p.data, opt.state_nbytes()
print(f"Ψ = {psi}, N = {n}: Ψ' = {padded}, each rank owns {padded // n} elements")
for r, (w, state, _) in enumerate(res):
    print(f"  rank {r}: Adam state {state} bytes (one device: {one_device_state}); "
          f"weights equal the one-device step bit for bit: {np.array_equal(w, one_device)}")
sent = res[0][2]
print(f"  bytes rank 0 sent: reduce-scatter {sent['reduce_scatter']:g} + all-gather "
      f"{sent['all_gather']:g} = {sent['reduce_scatter'] + sent['all_gather']:g}; "
      f"DDP's all-reduce of the unpadded Ψ: {sent['all_reduce']:g}")

# %% [markdown]
# Each rank keeps a quarter of Adam's state, and the weights come out identical to the
# single-device step (the reduce-scatter adds the ranks in the same order as the sum on
# one device). The communication is DDP's: a ring all-reduce *is* a reduce-scatter
# followed by an all-gather (lesson 01), each sending (N−1)/N of the buffer, so
#
#     reduce-scatter Ψ'(N−1)/N  +  all-gather Ψ'(N−1)/N  =  2Ψ'(N−1)/N  =  DDP's all-reduce
#
# up to the padding (the 2 extra elements above). ZeRO-1 moves the all-gather half of the
# all-reduce to after the step: the ranks exchange updated weights instead of averaged
# gradients, and the memory saving is free of extra traffic. ZeRO-2 runs the same
# collectives, but frees each unit's whole gradient as soon as its reduce-scatter is done,
# keeping only the averaged shard.
#
# **Exercise 3.1** asks you to write this step as a function, with Adam's update written
# out rather than borrowed.
#
# ## 3. Memory per stage, on the ledger
#
# The engines of `minipar.parallel` do the same on a real model: `zero_engine(model,
# stage=...)` gives DDP, ZeRO-1, ZeRO-2 or ZeRO-3. They never look inside the model: it
# comes cut into *units*, one per transformer block plus the "root" holding embeddings,
# final LayerNorm and head, and each unit gets its own flat buffer (`FlatParameter`,
# FSDP's name), padded to a multiple of N on its own. So at stages ≥ 1 every formula
# holds with Ψ' = Σ over units of the padded sizes in place of Ψ.
#
# Below: a tiny bf16 GPT on N = 3 ranks (3 does not divide a block), one training step
# under each stage; after `engine.step()` each rank reads its ledger, and
# `model_state_bytes(psi, stage, N, padding=...)` gives the formula.

# %%
cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=8, num_heads=2, num_layers=2,
                dtype="bfloat16")
n = 3
rng = np.random.default_rng(0)
ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, 2 * n))  # [s, B]: 2 sequences a rank
CATS = ("parameters", "gradients", "optimizer_states")


def one_step(ctx, stage):
    model = GPT(cfg)
    engine = zero_engine(model, stage=stage, lr=1e-2, weight_decay=0.1)
    ctx.ledger.reset_peak()  # forget the whole model every rank built before sharding
    start = len(ctx.trace.events)
    x = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]  # this rank's 2 sequences
    model.loss_and_grad(x, np.roll(x, -1, axis=0))
    engine.step()  # read right after the step: every unit resharded, nothing in flight
    units = [] if stage == 0 else list(engine.state.values())
    return {"held": {c: ctx.ledger.held(c) for c in CATS},
            "peak": {c: ctx.ledger.peak(c) for c in CATS},
            "sent": sum(e.meta["sent_bytes"] for e in ctx.trace.events[start:]
                        if e.stream == "comm"),
            "units": [(u.name, u.flat.numel, u.flat.padded_numel) for u in units]}


runs = {stage: mp.launch(lambda ctx, stage=stage: one_step(ctx, stage), n)
        for stage in STAGE_NAMES}
units = runs[1][0]["units"]
psi = cfg.num_parameters()
pad = sum(padded - numel for _, numel, padded in units)
print(f"Ψ = {psi:,} in units " + ", ".join(f"{name} {numel}→{padded}"
                                              for name, numel, padded in units)
      + f" for N = {n}: Ψ' = Ψ + {pad} = {psi + pad:,}")
print(f"  {'bytes per rank after the step':<30}" + "".join(f"{c:>18}" for c in CATS)
      + f"{'total':>9}")
for stage, name in STAGE_NAMES.items():
    held = runs[stage][0]["held"]
    formula = model_state_bytes(psi, stage, n, padding=pad if stage else 0)
    alike = all(r["held"] == held for r in runs[stage])
    print(f"  {name:<18} ledger     " + "".join(f"{held[c]:>18,}" for c in CATS)
          + f"{sum(held.values()):>9,}   (every rank alike: {alike})")
    print(f"  {'':<18} formula    " + "".join(f"{formula[c]:>18,.0f}" for c in CATS)
          + f"{formula['total']:>9,.0f}")

# %% [markdown]
# The ledger matches the formulas to the byte, padding included: ZeRO-1 holds the bf16
# weights and gradients whole (2Ψ' + 2Ψ') and 12Ψ'/N of Adam; ZeRO-2 also divides the
# gradients; ZeRO-3 divides everything. DDP pads nothing, since an all-reduce needs no
# equal blocks.
#
# These are the bytes *between* steps. During a step more is alive. ZeRO-2 keeps a unit's
# whole gradient buffer from the start of its backward until its reduce-scatter is done:
# the root's for the whole backward (its backward spans it: the head first, the
# embeddings last), plus up to two blocks' (the one computing and the one whose
# reduce-scatter is in flight). ZeRO-3 holds the weights it gathered: the root's, which
# stay whole from forward to backward, and the block in use. In bf16 (2 bytes an
# element), the peaks of the same step:

# %%
shards = 2 * (psi + pad) // n  # 2Ψ'/N: a bf16 shard of every unit
root, block = units[0][2], units[1][2]  # padded sizes of the root and of one block
print(f"  ZeRO-2 peak gradients  {runs[2][0]['peak']['gradients']:>6,} B = shards {shards:,}"
      f" + whole root {2 * root:,} + two whole blocks {2 * 2 * block:,}")
print(f"  ZeRO-3 peak parameters {runs[3][0]['peak']['parameters']:>6,} B = shards {shards:,}"
      f" + whole root {2 * root:,} + one whole block {2 * block:,}")

# %% [markdown]
# ## 4. ZeRO-3 and FSDP: gather each unit around its use
#
# Under ZeRO-3 (FSDP's FULL_SHARD) a rank keeps only its shard of each unit's weights. A
# unit's forward and backward need the whole weights, so the engine gathers them just
# before and frees them just after:
#
#     forward_pre(u):   w_u = all_gather(w_u shard)
#     forward_post(u):  free w_u                                  (reshard_after_forward)
#     backward_pre(u):  w_u = all_gather(w_u shard)               again
#     backward_post(u): s_u = reduce_scatter(g_u, "avg")[r]; free w_u and g_u
#
# The root is the exception, as in FSDP: its backward starts right where its forward
# ends, so it stays whole from the start of the forward to the end of the backward and
# one all-gather is saved. `backward_prefetch` (on by default) issues the next unit's
# all-gather when a unit's backward starts, so that it runs on the communication stream
# while this unit computes. Watch it on a 3-block GPT over 3 ranks, with hooks registered
# after the engine's (so they see what the engine just did), reading rank 0's ledger:

# %%
cfg3 = cfg.with_(num_layers=3)


def watch_zero3(ctx):
    model = GPT(cfg3)
    engine = zero_engine(model, stage=3, lr=1e-2, weight_decay=0.1)
    log = []  # (hook, unit, units whole, all-gathers in flight, parameter bytes held)
    for event in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
        model.hooks.register(event, lambda unit, event=event: log.append((
            event, unit,
            [a.name[5:-9] for a in ctx.ledger.live() if a.name.endswith(".gathered")],
            sum(a.name.startswith("comm:all_gather") for a in ctx.ledger.live()),
            ctx.ledger.held("parameters"))))
    x = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]
    model.loss_and_grad(x, np.roll(x, -1, axis=0))
    engine.step()
    return log, sum(u.param_shard.nbytes for u in engine.state.values())


log, shard_bytes = mp.launch(watch_zero3, n)[0]
print(f"{cfg3.num_layers} blocks; rank 0's weight shards alone: 2Ψ'/N = {shard_bytes:,} bytes")
print(f"{'hook':<14}{'unit':<10}{'whole after the hook':<22}{'gathers in flight':>18}"
      f"{'parameters held':>17}")
for event, unit, whole, flying, held in log:
    print(f"{event:<14}{unit:<10}{', '.join(whole) or '-':<22}{flying:>18}{held:>17,}")

# %% [markdown]
# The root stays whole throughout; each block is whole only around its own forward and
# its own backward; in the backward the next block's gather is already in flight while
# the current one computes (its buffer counts as a communication buffer until it lands).
# After the root's backward only the shards are left.
#
# **Traffic.** ZeRO-3 gathers the weights twice (forward and backward) and reduce-scatters
# the gradients once: 3Ψ'(N−1)/N elements, 1.5 times DDP's 2Ψ(N−1)/N (ZeRO paper, section
# 7). Keeping the root whole saves its backward all-gather, Ψ'_root(N−1)/N. The bytes
# each rank sent in the step of section 3 (2 bytes an element), against
# `dp_comm_elements`:

# %%
for stage, name in STAGE_NAMES.items():
    theory = 2 * dp_comm_elements(psi, stage, n, padding=pad if stage else 0)
    saved = 2 * root * (n - 1) / n if stage == 3 else 0.0
    print(f"  {name:<18} sent {runs[stage][0]['sent']:>8,.0f} B; theory {theory:>8,.0f} B"
          + (f" less the root's backward all-gather {saved:,.0f} B = {theory - saved:,.0f} B"
             if stage == 3 else "")
          + f"  ({runs[stage][0]['sent'] / runs[0][0]['sent']:.3f}x DDP)")

# %% [markdown]
# The ratio is below 1.5 by the root's share: on this tiny model the root (embeddings and
# head) is a large part of Ψ. On a real model the blocks dominate and the ratio is close
# to 1.5.
#
# **FSDP's names.** PyTorch's `FullyShardedDataParallel` picks the stage with a
# `sharding_strategy`; DeepSpeed names the same things by stage number:
#
# | FSDP `ShardingStrategy` | DeepSpeed | partitioned |
# | --- | --- | --- |
# | `NO_SHARD` | stage 0 (DDP) | nothing |
# | (`ZeroRedundancyOptimizer` around DDP) | stage 1 | optimizer states |
# | `SHARD_GRAD_OP` | stage 2 | + gradients (weights whole during forward and backward) |
# | `FULL_SHARD` | stage 3 | + weights |
# | `HYBRID_SHARD` | stage 3 with MiCS (`mics_shard_size`) | all three inside a node; replicated across |
#
# HYBRID_SHARD shards inside a node (fast NVLink for the gathers) and replicates across
# nodes, so only a gradient shard's all-reduce crosses the slow links; memory is ZeRO-3's
# with N = the GPUs of one node. On 2 nodes of 2 GPUs, each strategy's engine, the
# optimizer states per rank and the groups it shards and replicates over:

# %%
topo = mp.Topology.nodes(2, gpus_per_node=2)


def build(ctx, strategy):
    model = GPT(cfg)
    fsdp = FullyShardedDataParallel(model, sharding_strategy=strategy, lr=1e-2)
    replicate = getattr(fsdp.engine, "replicate_group", None)
    return (type(fsdp.engine).__name__, getattr(fsdp.engine, "stage", 0),
            ctx.ledger.held("optimizer_states"), fsdp.engine.group.ranks,
            replicate.ranks if replicate else None)


print(f"Ψ = {psi:,}: 12Ψ = {12 * psi:,} bytes of Adam state for the whole model")
for strategy in ShardingStrategy:
    engine, stage, optim, group, replicate = mp.launch(
        lambda ctx: build(ctx, strategy), 4, topology=topo)[0]
    print(f"  {strategy.name:<14} {engine:<24} stage {stage}: rank 0 holds {optim:>6,} B of "
          f"Adam state; group {group}"
          + (f", replicated across {replicate}" if replicate else ""))

# %% [markdown]
# The other knobs, with their FSDP names (all arguments of `Zero3Engine` and
# `FullyShardedDataParallel`): `reshard_after_forward=False` keeps blocks whole from their
# forward to their backward (no backward gathers, ZeRO-2's traffic, more memory);
# `forward_prefetch` gathers the next unit during this one's forward; `prefetch_depth`
# reaches several units ahead; and `limit_all_gathers` bounds how many blocks may be whole
# or in flight at once (True: 2). That last one is the fix of the next section.
#
# ## 5. Incident C: ZeRO-3 with activation checkpointing peaks above ZeRO-2
#
# A 13B model was moved from ZeRO-2 to ZeRO-3 with activation checkpointing, to save
# memory; its peak memory per GPU went *up*, about 20 % above ZeRO-2. The shards were
# small, but the gathered weights were not: with nothing holding the all-gathers back,
# FSDP's CPU thread runs ahead of the GPU and issues the gathers of many later layers at
# once; their outputs stay allocated, on top of the recomputed forward's activations.
# The reported fix: `limit_all_gathers=True` (at most 2 units whole or in flight) and
# changing the checkpoint granularity "from per layer to groups of 2 layers".
#
# Groups of 2 layers are *checkpoint segments* (Chen et al. 2016, "Training Deep Nets with
# Sublinear Memory Cost"): keep only the input of every second layer, and in the backward
# rerun the forward of two layers at a time before backpropagating through them. That is
# `GPTConfig(recompute="segments", recompute_segment=2)`. It is not "recompute every second
# layer and keep everything in the others", which holds *more* at every moment.
#
# `minipar incident c` reproduces the mechanism on 40 layers, a 13B's depth; here it runs
# on 8 layers to stay fast. "Run-ahead" is prefetching every later unit with no limit,
# what FSDP's host thread does when nothing holds it back:

# %%
cfg_c = zero3_recompute.MODEL.with_(num_layers=8)
result = zero3_recompute.run(cfg=cfg_c)
with mp.device():
    block_bytes = 2 * sum(p.size for p in GPT(cfg_c).units()[1][1])  # one bf16 block, whole
print()
for key in ("zero2", "zero3", "zero3_limit"):
    r = result["scenarios"][key]
    comm = r["peak"]["comm_buffers"]
    print(f"  {r['label']:<30} peak communication buffers {comm:>7,} B = "
          f"{comm / block_bytes:4.2f} whole blocks of {block_bytes:,} B")

# %%
incident = [result["scenarios"][key] for key in ("zero2", "zero3", "zero3_limit")]
figures.bars("03_incident_c", f"Incident C on {cfg_c.num_layers} layers: the peak per rank, "
             "and the all-gathers' share of it", [r["label"] for r in incident],
             {"peak of all categories": [r["peak"]["total"] / 2**10 for r in incident],
              "its communication buffers' own peak": [r["peak"]["comm_buffers"] / 2**10
                                                      for r in incident]},
             ylabel="KiB per rank", annotate="{:,.0f}")

# %% [markdown]
# ZeRO-3's parameters column is well below ZeRO-2's (shards, plus the root and the block in
# use), and its gradients and optimizer states are the same. What pushes it over is the
# comm column: with no limit, every block's all-gather is in flight at the same moment, so
# the whole model exists gathered again on top of the shards (ZeRO-2's one block there is
# the all-gather of a block's updated weights after the step). `limit_all_gathers=True`
# admits two blocks at a time and the peak falls well below ZeRO-2's. The ledger counts
# only what is allocated; the reported 20 % also needs effects it does not model, such as
# allocator fragmentation.
#
# Segments trade one term for another. With I the bytes of a layer's input (2sbh) and A
# what a layer keeps when it keeps everything, per-layer checkpoints hold at most
# (L − 1)·I + A at once (the inputs below, one layer rerun), and segments of k hold
# (L/k − 1)·I + k·A: fewer inputs, a bigger rerun. Segments of k win by (k − 1)(L·I/k − A),
# so only when L > k·A/I. For this model's layers, and on 8 layers (the table's activ
# column) against the same model 40 layers deep, one device, ledger against
# `plan.training_memory`:

# %%
for k in (1, 2, 3):
    cfg_k = zero3_recompute.MODEL.with_(recompute="segments", recompute_segment=k)
    with mp.device() as ctx:
        model = GPT(cfg_k)
        ctx.ledger.reset_peak()
        ids = np.random.default_rng(0).integers(0, cfg_k.vocab_size, (cfg_k.seq_len, 1))
        model.loss_and_grad(ids, np.roll(ids, -1, axis=0))
        measured = ctx.ledger.peak("activations")
    print(f"  {cfg_k.num_layers} layers, segments of {k}: activation peak {measured:>7,} B "
          f"(ledger), {zero3_recompute.planned_activations(cfg_k):>9,.0f} B (formula)")
for layers in (cfg_c.num_layers, zero3_recompute.MODEL.num_layers):
    t = zero3_recompute.segment_terms(layers, cfg_c.seq_len, 1, cfg_c.hidden, cfg_c.num_heads)
    print(f"  {layers} layers: A = {t['A'] / t['I']:g} I, segments of 2 help above 2A/I = "
          f"{t['threshold']:g} layers; {t['segments'] - t['per_layer']:+,.0f} B "
          f"= {(t['segments'] - t['per_layer']) / t['I']:+g} I for the blocks; best k = "
          f"{t['best']} (sqrt(L I / A) = {t['sqrt_rule']:.2f}, sqrt(L) = {t['sqrt_l']:.2f})")

# %% [markdown]
# Deep enough, segments of 2 do lower the activations, and segments of 3 raise them again:
# the best segment sits near √(L·I/A), not at Chen et al.'s √L, which holds for a chain
# whose layers keep no more than their inputs (A = I); a transformer layer keeps many
# times its input. So the seed's second lever is real but small and depth dependent —
# bytes beside the model state's MiB — and under ZeRO-3 it costs something too: a
# segment's rerun needs its 2 blocks' weights whole together (the params column of the
# segments rows). The limit is what brings the peak back. (`minipar incident c` prints the
# 40-layer table and the same reasoning.)

# %% [markdown]
# ## 6. A budget to fit: the task of Exercise 3.4
#
# A real run starts from the other end: a GPU has so many bytes, the network so much time,
# and the job is a plan that fits both. Exercise 3.4 gives you one such budget on a small
# model, in float64 (8 bytes of weight, 8 of gradient and 16 of Adam's m and v per
# parameter), and asks for a plan; the grader runs your plan on simulated devices and
# reads the ledger and the trace:
#
# - the model: 4 blocks, hidden 16, 2 heads, a vocabulary of 32, sequences of 16 tokens;
# - n = 2, 3 or 4 data-parallel ranks, each training on 1, 2, 4 or 8 sequences a step;
# - **memory**: at most 520 KiB per rank at the peak of the step;
# - **traffic**: each rank sends at most one ring all-reduce of the padded gradients,
#   2Ψ'(n−1)/n elements of 8 bytes, what data parallelism pays anyway;
# - **correctness**: the updated weights are one device's AdamW step on the whole batch.
#
# A plan picks the ZeRO stage (sections 3 and 4), the recomputation of each block
# (`"recompute"`: what a block keeps for its backward, lesson 00), how many micro-batches
# the rank's sequences are cut into (`"micro_batches"`: gradients accumulate over them),
# whether every micro-batch but the last skips communication (`"no_sync"`, as DDP's
# `no_sync()`), and ZeRO-3's knobs. DDP alone, on 2 ranks with 8 sequences each:

# %%
cfg6 = GPTConfig(vocab_size=32, seq_len=16, hidden=16, num_heads=2, num_layers=4)
budget, n6, batch6 = 520 * 1024, 2, 8
with mp.device():
    psi6 = cfg6.num_parameters()
    padded6 = sum(numel + flat_padding(numel, n6) for numel in
                  (sum(p.size for p in params) for _, params in GPT(cfg6).units()))
traffic_budget = 8 * 2 * padded6 * (n6 - 1) / n6  # bytes: one all-reduce of Ψ' float64
ALL = CATS + ("activations", "comm_buffers")


def budget_step(ctx, stage, micro_batches=1, no_sync=True):
    model = GPT(cfg6)
    engine = zero_engine(model, stage=stage, lr=1e-2, weight_decay=0.1)
    ctx.ledger.reset_peak()
    sent = ctx.trace.bytes_sent()
    ids = np.random.default_rng(ctx.rank).integers(0, cfg6.vocab_size,
                                                   (cfg6.seq_len + 1, batch6))  # [s + 1, b]
    micro = split_microbatches(ids[:-1], ids[1:], micro_batches)  # k × [s, b/k]
    accumulate_gradients(model, engine, micro, no_sync=no_sync)
    engine.step()
    return ({c: ctx.ledger.peak(c) for c in ALL}, ctx.ledger.peak(),
            ctx.trace.bytes_sent() - sent)


KiB = 1024
ddp_peaks, ddp_peak, ddp_sent = mp.launch(lambda ctx: budget_step(ctx, 0), n6)[0]
print(f"Ψ = {psi6:,}, Ψ' = {padded6:,} on {n6} ranks; budgets: {budget / KiB:g} KiB, "
      f"{traffic_budget / KiB:g} KiB sent")
print("  DDP peaks " + ", ".join(f"{c} {ddp_peaks[c] / KiB:g}" for c in ALL)
      + f" KiB; together {ddp_peak / KiB:g} KiB = {ddp_peak / budget:.2f}x the budget; "
      f"sent {ddp_sent / KiB:g} KiB")

# %% [markdown]
# More than three times the budget, and not only because of the model state: the
# activations of 8 sequences are the largest category, and no ZeRO stage shards them. One trap before you
# start: section 2 says ZeRO-2 frees each unit's whole gradient once its reduce-scatter
# is done. With gradient accumulation under `no_sync` there is no reduce-scatter until the
# last micro-batch, so every unit's whole gradient stays, and the shards come on top.
# Reducing every micro-batch instead holds the shards plus the whole gradients of the
# units in flight, as without accumulation, but sends a reduce-scatter per micro-batch (PyTorch's FSDP offers the same two choices, `no_sync()` or not). ZeRO-2 on
# the same 8 sequences, in 2 micro-batches:

# %%
accumulated = {no_sync: mp.launch(lambda ctx: budget_step(ctx, 2, 2, no_sync), n6)[0]
               for no_sync in (True, False)}
for no_sync, (peaks, _, sent) in accumulated.items():
    print(f"  ZeRO-2, 2 micro-batches, no_sync={no_sync!s:<5}: gradients peak "
          f"{peaks['gradients']:,} B (whole 8Ψ = {8 * psi6:,}, shards 8Ψ'/n = "
          f"{8 * padded6 // n6:,}); sent {sent / traffic_budget:.2f}x the traffic budget")

# %% [markdown]
# Under `no_sync` the gradients peak at exactly 8Ψ + 8Ψ'/n, more than ZeRO-1 ever holds
# (8Ψ); without it the step sends (k + 1)Ψ'(n − 1)/n elements for k micro-batches, here
# 1.5 times the budget. Which levers, together, fit every case is yours to find: more than
# one plan does. `minipar grade 03` runs yours.
#
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 03`. The grader compares your functions with
# minipar's own over many sizes and world sizes and says which case fails first.
#
# - **Exercise 3.1** — `zero1_step(flat_params, flat_grad, m, v, step, group=None, lr=...,
#   betas=..., eps=..., weight_decay=...)`: this rank's ZeRO-1 AdamW step on a padded flat
#   float64 buffer: reduce-scatter the averaged gradient, AdamW on the owned shard with this
#   rank's m and v, all-gather the weights; returns the new whole weights and the new m, v.
# - **Exercise 3.2** — `zero_bytes_per_rank(psi, stage, n, param_bytes=2, grad_bytes=2,
#   k=12)`: bytes of parameters, gradients and optimizer states one rank holds at a ZeRO
#   stage, with the flat buffer padded to a multiple of n.
# - **Exercise 3.3** — `zero_comm_elements(psi, stage, n)`: elements one rank sends per
#   step under DDP and ZeRO-1/2/3 (ring collectives, padded buffer).
# - **Exercise 3.4** — `fit_plan(cfg, n, batch, memory_budget, traffic_budget)`: a plan
#   (ZeRO stage, recomputation, micro-batches, no_sync, ZeRO-3's knobs) whose training step
#   stays within 520 KiB per rank and one all-reduce of traffic, for every n and batch of
#   section 6; graded by running it on simulated devices, not against a formula.
#
# ## Summary
#
# - DDP keeps N copies of the 16Ψ model state. ZeRO partitions the optimizer states
#   (stage 1), the gradients (2) and the weights (3) over the N ranks: 4Ψ' + 12Ψ'/N,
#   2Ψ' + 14Ψ'/N, 16Ψ'/N bytes per rank, with Ψ' the buffer padded to a multiple of N.
# - ZeRO-1's step: reduce-scatter the averaged gradient, Adam on the owned shard, all-gather
#   the weights. Reduce-scatter + all-gather = all-reduce, so ZeRO-1/2 cost DDP's traffic.
# - ZeRO-3 (FSDP FULL_SHARD) gathers each unit's weights around its forward and its
#   backward: 3Ψ'(N−1)/N elements, 1.5x DDP, less the root's saved backward gather.
#   Prefetching hides the gathers behind compute.
# - Between steps the ledger matches the formulas to the byte; during a step, gathered
#   weights and whole gradient buffers come on top.
# - Unbounded gathers can make ZeRO-3 peak above ZeRO-2 (incident C); `limit_all_gathers`
#   bounds the live gathered units. Checkpoint segments of k layers keep L/k inputs but
#   rerun k layers at once: they help only when L > kA/I.
# - Activations are not model state: no ZeRO stage shards them; recomputation and smaller
#   micro-batches do. Gradient accumulation under `no_sync` makes ZeRO-2/3 hold whole
#   gradients plus shards (8Ψ + 8Ψ'/n in float64); reducing every micro-batch costs k
#   reduce-scatters instead. A budget is met by combining levers, checked on the ledger.
