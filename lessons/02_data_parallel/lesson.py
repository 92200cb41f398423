# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 02 — Data parallelism
#
# Copies of the model on N devices: why averaging gradients is exact, DDP's buckets and overlap, and the gradient-accumulation trap.
#
# Picture a restaurant that opens copies of its kitchen: every kitchen has the same recipe
# book (the weights) and cooks a different batch of orders (its slice of the data). At the
# end of the shift the cooks put their tasting notes (gradients) side by side, agree on
# the average, and every kitchen corrects its recipes the same way. Data parallelism (DP)
# is exactly that, and the whole art is in the last step: averaging the notes without
# keeping the kitchens waiting.
#
# Run this file with `python lessons/02_data_parallel/lesson.py`, or open it as a notebook.
# Every number below is computed by minipar on simulated devices.
#
# To see it: `minipar demo` writes a page; its **data** mode (`demo.html#data`) steps one
# global batch through a real run, cut into each replica's sequences, and ends on DDP's
# gradient all-reduce over the dp group (docs/demo.md).

# %%
import numpy as np

import minipar as mp
from minipar.data import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.optim import SGD, AdamW, clip_coef, global_grad_norm
from minipar.parallel import DistributedDataParallel, accumulate_gradients
from minipar.runtime.cost import collective_cost, ring_all_reduce_time
from minipar.viz import figures, measure, render_timeline

MIB = 2**20  # bucket_cap_mb counts MiB, as PyTorch does
US = 1e-6
tiny = GPTConfig(vocab_size=16, seq_len=8, hidden=8, num_heads=2, num_layers=2)  # float64
rng = np.random.default_rng(0)
B, N = 8, 4  # global batch (sequences) and data-parallel ranks
ids, targets = rng.integers(0, tiny.vocab_size, (2, tiny.seq_len, B))  # [s, B] each

# %% [markdown]
# ## 1. The data-parallel identity
#
# The loss of a batch of B sequences is a mean, L = (1/B) Σₙ lₙ. Cut the batch into N
# equal shards of B/N sequences and let rank r compute the mean loss of its shard,
# L_r = (N/B) Σ_{n ∈ shard r} lₙ. Then
#
#     L = (1/N) Σ_r L_r      and so      ∇L = (1/N) Σ_r ∇L_r
#
# a mean of means is the mean when the shards are equal. Each rank computes ∇L_r on its
# own, and one **all-reduce with op "avg"** gives every rank ∇L: the gradient one device
# would have computed on the whole batch. Nothing is approximated.
#
# Check it on one device first: the tiny GPT's gradient on the whole batch of 8, then on
# each of the 4 shards that `split_data_parallel` hands the ranks.

# %%
with mp.device():
    model = GPT(tiny)
    params = model.parameters()
    flat_grad = lambda: np.concatenate([p.grad.ravel() for p in params])  # [Ψ]
    whole_loss = model.loss_and_grad(ids, targets)
    whole = flat_grad()
    shard_losses, shard_grads = [], []
    for r in range(N):
        model.zero_grad()
        shard_losses.append(model.loss_and_grad(*split_data_parallel(ids, targets, r, N)))
        shard_grads.append(flat_grad())
    # unequal shards: 2 and 6 sequences
    model.zero_grad()
    model.loss_and_grad(ids[:, :2], targets[:, :2])
    g_small = flat_grad()
    model.zero_grad()
    model.loss_and_grad(ids[:, 2:], targets[:, 2:])
    g_large = flat_grad()

rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
print(f"Ψ = {whole.size:,} parameters; loss on the whole batch {whole_loss:.6f}, "
      f"mean of the shard losses {np.mean(shard_losses):.6f}")
for r, g in enumerate(shard_grads):
    print(f"  shard {r}: ‖g_r − g‖/‖g‖ = {rel(g, whole):.3f}")
mean_grad = np.mean(shard_grads, axis=0)  # (1/N) Σ_r g_r
print(f"  mean of the {N} shard gradients: ‖ḡ − g‖/‖g‖ = {rel(mean_grad, whole):.1e}")
print(f"unequal shards of 2 and 6: plain mean  {rel((g_small + g_large) / 2, whole):.3f}, "
      f"weighted 2/8 and 6/8  {rel(2 / 8 * g_small + 6 / 8 * g_large, whole):.1e}")

# %% [markdown]
# Each shard's gradient is far from the whole-batch gradient (two random sequences are a
# very noisy estimate of it: the difference is larger than the gradient itself), and
# yet their mean matches the whole-batch gradient to the last bits. With unequal
# shards the plain mean over-weights the small shard; weighting each by its share of the
# sequences (more precisely, of the tokens that count in the loss) restores the identity.
# Section 5 meets the same weighting again, inside one rank.
#
# ## 2. DDP by hand, then DistributedDataParallel
#
# The simplest data-parallel training step, written out: every rank builds the same model
# (minipar initialises each parameter from the seed and its name, so the weights agree),
# runs forward and backward on its shard, averages the gradients with **one all-reduce of
# all of them laid end to end**, and takes the optimizer step. Since every rank then holds
# the same gradient, every rank takes the same step and the copies never drift apart.
#
# `DistributedDataParallel` does the same with three additions: it broadcasts the weights
# from the first rank at construction (a model loaded or changed on one rank must not
# silently diverge), it cuts the gradients into **buckets** (section 3), and it launches
# each bucket's all-reduce from a hook *during* the backward (section 4). Below, three
# AdamW steps both ways on 4 ranks, against one device that takes the whole batch.

# %%
STEPS = 3
OPT = dict(lr=1e-2, weight_decay=0.1)
batches = [tuple(rng.integers(0, tiny.vocab_size, (2, tiny.seq_len, B))) for _ in range(STEPS)]


def ddp_by_hand(ctx):
    """Naive data parallelism: one all-reduce of every gradient, flattened, per step."""
    model = GPT(tiny)
    params = model.parameters()
    opt = AdamW(params, **OPT)
    cuts = np.cumsum([p.size for p in params])[:-1]  # where each parameter ends in flat
    for x, y in batches:
        model.loss_and_grad(*split_data_parallel(x, y, ctx.rank, ctx.world_size))
        flat = np.concatenate([p.grad.ravel() for p in params])  # flat: [Ψ]
        flat = mp.all_reduce(flat, "avg")  # (1/N) Σ_r g_r, on every rank
        for p, g in zip(params, np.split(flat, cuts)):
            p.grad[...] = g.reshape(p.shape)
        opt.step()
        opt.zero_grad()
    return {p.name: p.data.copy() for p in params}


def ddp_engine(ctx):
    """The same steps with DistributedDataParallel."""
    model = GPT(tiny)
    ddp = DistributedDataParallel(model, AdamW, **OPT)
    for x, y in batches:
        model.loss_and_grad(*split_data_parallel(x, y, ctx.rank, ctx.world_size))
        ddp.step()  # the all-reduces already ran in the backward's hooks
        ddp.zero_grad()
    return {p.name: p.data.copy() for p in model.parameters()}


with mp.device():
    model = GPT(tiny)
    opt = AdamW(model.parameters(), **OPT)
    for x, y in batches:
        model.loss_and_grad(x, y)
        opt.step()
        opt.zero_grad()
    one_device = {p.name: p.data.copy() for p in model.parameters()}

by_hand = mp.launch(ddp_by_hand, N)
engine = mp.launch(ddp_engine, N)
worst = lambda got: max(float(np.abs(got[k] - w).max()) for k, w in one_device.items())
same_everywhere = lambda res: all(all(np.array_equal(r[k], res[0][k]) for k in r) for r in res)
print(f"after {STEPS} AdamW steps on {N} ranks, max |w − w_one_device|:")
print(f"  by hand  {worst(by_hand[0]):.1e}   every rank bit-identical: {same_everywhere(by_hand)}")
print(f"  DDP      {worst(engine[0]):.1e}   every rank bit-identical: {same_everywhere(engine)}")
print(f"  by hand and DDP bit-identical: "
      f"{all(np.array_equal(by_hand[0][k], engine[0][k]) for k in one_device)}")
for name, res in (("by hand", by_hand), ("DDP", engine)):
    comm = res.contexts[0].trace.of("comm")
    calls = {c: sum(e.name == c for e in comm) for c in sorted({e.name for e in comm})}
    print(f"  {name:<8} rank 0's collectives: {calls}, "
          f"{res.contexts[0].trace.bytes_sent():,.0f} bytes sent")
psi = whole.size
print(f"  ring all-reduce theory: {STEPS} steps × 2(N−1)/N · Ψ · 8 bytes = "
      f"{STEPS * 2 * (N - 1) / N * psi * 8:,.0f} bytes")

# %% [markdown]
# Both runs equal the single device to about 1e-15 (float64; the only difference is the
# order in which the ranks' contributions are added), and every rank holds the same bits.
# By hand and DDP agree bit for bit: the all-reduce adds the ranks in the same order
# whatever the grouping of the elements. The traffic is the same too, apart from DDP's
# one broadcast per unit at construction: a ring all-reduce sends 2(N−1)/N of the buffer
# from each rank. DDP needed one all-reduce a step because the whole tiny model fits in
# one 25 MiB bucket.
#
# ## 3. Buckets: fewer, larger all-reduces that can start early
#
# One all-reduce per parameter and one all-reduce for everything are the two bad ends. A
# ring all-reduce of S bytes over N ranks costs
#
#     t = 2(N−1)·α + 2(N−1)/N · S/β        (α: latency of a step, β: link bandwidth)
#
# so every call pays 2(N−1) latencies whatever its size, while a single call for the whole
# model cannot start before the backward has produced the very last gradient. PyTorch DDP
# (Li et al. 2020, "PyTorch Distributed", section 3.2) takes the middle: gradients are
# grouped into buckets of `bucket_cap_mb` (25 MiB by default), and a bucket is all-reduced
# as soon as all of its gradients are final.
#
# minipar's `DistributedDataParallel` builds its buckets like this (`_make_buckets` in
# `minipar/parallel/dp/ddp.py`):
#
# 1. List the parameters in the order backward finishes them: units in reverse
#    (`model.units()` is `root, blocks.0, …, blocks.L−1`, so: the last block first, the
#    root last), and inside each unit its parameters reversed too.
# 2. Walk that list, adding each parameter's bytes to the current bucket; **close the
#    bucket as soon as it holds at least the cap** (the parameter that crosses the cap
#    stays in it). Whatever is left at the end is the last, smaller bucket.
# 3. A bucket is launched at the `backward_post` hook of the last of its units to finish,
#    and buckets are launched in order.
#
# PyTorch closes buckets by the same "at least the cap" rule; it also caps the *first*
# bucket at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`) so that the first all-reduce
# starts early, and it can rebuild the buckets after the first iteration in the order the
# gradients actually arrived. minipar keeps one cap and the fixed reverse order.
#
# The model for the rest of the lesson: 4 blocks of h = 192 in bfloat16, small
# vocabulary, so that its 4 blocks hold nearly all of the weights. Its buckets at three
# caps (buckets are built without any compute, so this is instant):

# %%
mid = GPTConfig(vocab_size=64, seq_len=64, hidden=192, num_heads=4, num_layers=4,
                dtype="bfloat16")
block_mib = (12 * mid.hidden**2 + 13 * mid.hidden) * 2 / MIB  # one block's bf16 gradients
caps = {"25 MiB (PyTorch's default)": 25.0, "2 blocks": 2 * block_mib, "1 block": block_mib}
print(f"Ψ = {mid.num_parameters():,} ({mid.num_parameters() * 2 / MIB:.2f} MiB of bf16 "
      f"gradients); one block = {block_mib:.4f} MiB")
buckets = {}  # label -> DDP's buckets on one device (a fresh device for each: new ledger)
for label, cap in caps.items():
    with mp.device():
        buckets[label] = DistributedDataParallel(GPT(mid), AdamW, bucket_cap_mb=cap).buckets
    print(f"bucket_cap_mb = {cap:.4f}  ({label}): {len(buckets[label])} bucket(s)")
    for b in buckets[label]:
        print(f"   bucket {b.index}: {len(b.flat.params):>2} parameters "
              f"{b.buffer.nbytes / MIB:6.3f} MiB, waits for {sorted(b.units)}")

# %% [markdown]
# The 25 MiB bucket holds everything, so it waits for the root, whose `backward_post`
# fires last (the root's backward spans the whole pass: the head first, the embeddings at
# the very end). With the cap at exactly one block, each block gets its own bucket, and
# the root's few parameters form the last one. A cap a little smaller than a block would
# spill the block's last parameters into the next bucket, which then waits for the next
# unit; exercise 2.2 asks you to reproduce these buckets from the sizes alone.
#
# What the three choices cost in all-reduce time, from the cost model alone, for 2 H100s
# on NVLink — and against one all-reduce per parameter:

# %%
DP = 2  # data-parallel ranks from here on: one node of 2 H100s
topo = mp.Topology.nodes(1, gpus_per_node=DP)
link = topo.intra  # NVLink 4
for label, bs in buckets.items():
    t = sum(ring_all_reduce_time(b.buffer.nbytes, DP, link) for b in bs)
    print(f"  {label:<27} {len(bs):>2} all-reduce(s): {t / US:6.2f} µs")
sizes = [p.data.nbytes for b in buckets["1 block"] for p in b.flat.params]
per_param = sum(ring_all_reduce_time(s, DP, link) for s in sizes)
print(f"  {'one per parameter':<27} {len(sizes):>2} all-reduce(s): {per_param / US:6.2f} µs "
      f"({len(sizes)} × 2(N−1)α = {len(sizes) * 2 * (DP - 1) * link.latency / US:.0f} µs of it "
      "latency)")

# %% [markdown]
# ## 4. Overlap on the simulated clock
#
# Buckets pay more latency than one big all-reduce; what they buy is *time*: a bucket's
# all-reduce runs on the communication stream while the compute stream carries on with the
# backward of the earlier blocks. Only the communication left over when the backward ends
# is **exposed** and lengthens the step.
#
# One training step of the model above on 2 H100s (one node, NVLink), 24 sequences of 64
# tokens a rank, at each of the three caps. The clock charges each matmul its FLOPs at
# the bf16 peak and each all-reduce what the α-β model says; `measure` splits the step
# into compute, communication, their overlap and the exposed rest.

# %%
mid_ids, mid_targets = rng.integers(0, mid.vocab_size, (2, mid.seq_len, 24 * DP))  # [s, 48]


def ddp_step(ctx, cap_mb):
    """One DDP training step; returns when it started on the simulated clock."""
    model = GPT(mid)
    ddp = DistributedDataParallel(model, AdamW, lr=1e-3, bucket_cap_mb=cap_mb)
    x, y = split_data_parallel(mid_ids, mid_targets, ctx.rank, ctx.world_size)  # [s, 24]
    mp.barrier()  # start together, after DDP's broadcast
    start = ctx.clock.now
    model.loss_and_grad(x, y)
    ddp.step()
    return start


runs = {label: mp.launch(lambda ctx, cap=cap: ddp_step(ctx, cap), DP, topology=topo)
        for label, cap in caps.items()}
print(f"{'buckets':<28}{'step':>9}{'compute':>9}{'comm':>9}{'overlap':>9}{'exposed':>9}")
for label, res in runs.items():
    t = measure(res, DP, start=res[0])[0]  # rank 0; both ranks are alike
    print(f"{label:<28}" + "".join(f"{v / US:7.2f}µs" for v in
                                   (t.window, t.compute, t.comm, t.overlap, t.exposed_comm)))
for label in ("25 MiB (PyTorch's default)", "2 blocks"):
    print(f"\n{label}:")
    print(render_timeline(runs[label], DP, width=64, start=runs[label][0]))

# %%
split = {label: measure(res, DP, start=res[0])[0] for label, res in runs.items()}  # rank 0
figures.bars("02_overlap", "One DDP step on 2 H100s: where the time goes, by bucket cap",
             list(split), {"compute": [t.compute / US for t in split.values()],
                           "exposed communication": [t.exposed_comm / US
                                                     for t in split.values()]},
             ylabel="µs of the step (rank 0)", stacked=True, annotate="{:.1f}")
figures.timelines("02_ddp_buckets", "One DDP step on the clock: one bucket, or buckets of "
                  "2 blocks under the backward", {label: runs[label] for label in
                                                  ("25 MiB (PyTorch's default)", "2 blocks")},
                  starts={label: res[0] for label, res in runs.items()})

# %% [markdown]
# With one 25 MiB bucket nothing overlaps: the all-reduce starts when the backward is over,
# and the whole of it is exposed. With two blocks a bucket, the first all-reduce starts
# after block 3 and block 2 are done and runs while blocks 1 and 0 compute (the ▓ cells):
# the step gets shorter although the communication takes longer (one more round of
# latencies per extra bucket). With one block a bucket, the extra latencies outweigh the
# extra overlap on this small model: the best cap is in between, the trade-off Li et al.
# describe. The block 0 bucket can never overlap anything (block 0 is the last block to
# compute), so at best (L−1)/L of the block traffic is hidden.
#
# Whether the all-reduce *can* hide depends on tokens per rank. The backward costs about
# 4Ψ FLOPs a token (two thirds of the 6Ψ of a training step), and the ring all-reduce
# moves 2(N−1)/N · 2Ψ bytes whatever the batch, so Ψ cancels out:

# %%
peak, bw = topo.device.peak("bfloat16"), link.bandwidth
tokens_per_rank = mid.seq_len * 24
t_star = (DP - 1) / DP * peak / bw
print(f"backward time = all-reduce bandwidth time at T* = (N−1)/N · peak/β = "
      f"{t_star:,.0f} tokens per rank (H100 bf16 {peak / 1e12:.0f} TFLOP/s, NVLink "
      f"{bw / 1e9:.0f} GB/s); this run has {tokens_per_rank:,}")

# %% [markdown]
# That T* holds for N = 2 only. The factor (N−1)/N is ½ at N = 2 and tends to 1, and once
# the group leaves the node the gradients cross InfiniBand. Below, T* for a 7B-parameter
# model (large enough that the latencies add less than 1 %) from the cost model the
# simulated clock uses: T* = (all-reduce time of its 2Ψ bytes) / (backward time of one
# token, 4Ψ/peak), on one node of N GPUs, on nodes of 8 (where minipar's all-reduce is
# the hierarchical one: reduce-scatter in the node, all-reduce across, all-gather in the
# node), and on nodes of one GPU each (a flat ring over InfiniBand).

# %%
PSI_7B = 7e9
layouts = {"1 node of 2": (1, 2), "1 node of 4": (1, 4), "1 node of 8": (1, 8),
           "2 nodes of 8": (2, 8), "8 nodes of 8": (8, 8), "64 nodes of 8": (64, 8),
           "2 nodes of 1": (2, 1), "8 nodes of 1": (8, 1)}
t_stars = {}  # layout -> T*, tokens per rank
for label, (nodes, per_node) in layouts.items():
    cluster = mp.Topology.nodes(nodes, gpus_per_node=per_node)
    cost = collective_cost("all_reduce", 2 * PSI_7B, range(nodes * per_node), cluster)
    t_stars[label] = cost.seconds * cluster.device.peak("bfloat16") / (4 * PSI_7B)
    print(f"  N = {nodes * per_node:>3} ({label:<13}) {cost.algorithm:<12} "
          f"T* = {t_stars[label]:6,.0f} tokens per rank")

# %%
figures.bars("02_t_star", "T*: tokens per rank above which the backward can hide the "
             "all-reduce (7B, bf16)", list(t_stars), {"T*": list(t_stars.values())},
             ylabel="tokens per rank", annotate="{:,.0f}")

# %% [markdown]
# Inside a node T* rises from 1,099 tokens at N = 2 to 1,924 at N = 8, and can never pass
# peak/β ≈ 2,198 however many GPUs share the NVLink. Across nodes of 8, InfiniBand carries
# 1/8 of the gradient from each GPU: T* is 3,160 at 16 GPUs and creeps up to 4,380 at 512,
# toward twice the NVLink limit (about 4,400). Without an NVLink domain to reduce in
# first, a ring over InfiniBand needs 9,890 tokens at N = 2 (nine times the NVLink figure,
# the bandwidth ratio) and 17,310 at N = 8. Below T* tokens per rank, gradient
# communication is longer than the backward and can only be partly hidden; well above
# it, buckets hide nearly all of it. That is why large runs keep the per-rank batch large,
# and why gradient accumulation (next) helps: k micro-batches give k times the compute
# per all-reduce.
#
# ## 5. Gradient accumulation and the scaling trap
#
# When the batch a rank must process does not fit in memory at once, cut it into k
# micro-batches, run forward and backward on each, and let the gradients add up in
# `.grad` before one optimizer step. With DDP, the first k−1 backwards run inside
# `ddp.no_sync()` (no all-reduce); the last one all-reduces the sum:
#
#     for i, (x, y) in enumerate(micro_batches):
#         with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
#             model.loss_and_grad(x, y, loss_scale=1 / k)
#     ddp.step()
#
# (`accumulate_gradients(model, ddp, micro_batches)` is this loop.) The `loss_scale=1 / k`
# is the part that goes wrong. Each micro-batch's loss L_i is a mean over its own
# sequences, and L = (1/k) Σ L_i, so the backward must start from L_i / k. Forget it —
# sum the micro-batch losses — and the accumulated gradient is Σ ∇L_i = **k ∇L**.

# %%
k = 4
micro = split_microbatches(ids, targets, k)  # 4 micro-batches of [s, 2]
with mp.device():
    model = GPT(tiny)
    params = model.parameters()
    model.loss_and_grad(ids, targets)
    g_whole, n_whole = flat_grad(), global_grad_norm(params)
    grads, norms = {}, {}
    for label, scale in (("1/k", 1 / k), ("1 (the trap)", 1.0)):
        model.zero_grad()
        for x, y in micro:
            model.loss_and_grad(x, y, loss_scale=scale)
        grads[label], norms[label] = flat_grad(), global_grad_norm(params)
print(f"whole batch: ‖g‖ = {n_whole:.5f}")
for label in grads:
    print(f"k = {k} micro-batches, loss_scale {label:<13} ‖g‖ = {norms[label]:.5f} "
          f"= {norms[label] / n_whole:.4f} × ‖g_whole‖, ‖g − g_whole‖/‖g_whole‖ = "
          f"{rel(grads[label], g_whole):.1e}")

# %% [markdown]
# What the k× gradient does depends on the optimizer. Take one step from the same weights
# with the right gradient and with the trapped one, and compare how far the weights move:

# %%
for opt_cls, kw in ((SGD, dict(lr=0.1)), (AdamW, dict(lr=1e-3, weight_decay=0.0))):
    moved = {}
    for label, scale in (("1/k", 1 / k), ("1 (the trap)", 1.0)):
        with mp.device():
            model = GPT(tiny)
            params = model.parameters()
            before = np.concatenate([p.data.ravel() for p in params])
            for x, y in micro:
                model.loss_and_grad(x, y, loss_scale=scale)
            opt_cls(params, **kw).step()
            moved[label] = np.concatenate([p.data.ravel() for p in params]) - before
    ratio = np.linalg.norm(moved["1 (the trap)"]) / np.linalg.norm(moved["1/k"])
    print(f"{opt_cls.__name__:<6} ‖Δw‖ with the trap / ‖Δw‖ with 1/k = {ratio:.4f}")
max_norm = 1.0
print(f"clip_grad_norm_(max_norm={max_norm}) coefficient: "
      f"{clip_coef(norms['1/k'], max_norm):.3f} with 1/k, "
      f"{clip_coef(norms['1 (the trap)'], max_norm):.3f} with the trap")

# %% [markdown]
# Under SGD the step is k times too long: exactly a learning rate multiplied by k, which
# can be enough to make a run tuned at the right rate diverge. Under Adam the update is m̂ / (√v̂ + ε), which
# does not change when every gradient is multiplied by k (up to ε): the trap hides. It is
# still there: the gradient norm you log is k times too large, gradient clipping compares
# that norm with `max_norm` and scales by a different coefficient (or clips when it should
# not), and changing k — say, when the run moves to more GPUs and fewer micro-batches —
# silently changes the effective learning rate of any SGD-like part. The fix is one line:
# `loss_scale=1 / k` (minipar's `loss_scale_for_accumulation(k)`).
#
# Two more details. First, 1/k is right only for **equal** micro-batches, for the reason
# of section 1: with n_i of the batch's n sequences (tokens, with padding or masking) in
# micro-batch i, the weight is n_i / n. Second, with data parallelism the all-reduce
# averages over the N ranks, so each micro-batch gradient is multiplied by 1/(k·N) in
# total. Below, k = 4 micro-batches on each of 2 ranks, with and without `no_sync`:

# %%
def accumulate_step(ctx, use_no_sync):
    """k micro-batches under DDP; returns the averaged gradients."""
    model = GPT(tiny)
    ddp = DistributedDataParallel(model, AdamW, **OPT)
    mine = split_data_parallel(ids, targets, ctx.rank, ctx.world_size)  # [s, 4]
    accumulate_gradients(model, ddp, split_microbatches(*mine, k), no_sync=use_no_sync)
    grads = ddp.full_grads()  # {name: averaged gradient}
    return np.concatenate([grads[p.name].ravel() for p in model.parameters()])


for use_no_sync in (True, False):
    res = mp.launch(lambda ctx: accumulate_step(ctx, use_no_sync), 2)
    calls = len(res.contexts[0].trace.of("comm", "all_reduce"))
    print(f"no_sync={use_no_sync!s:<5}: {calls} all-reduce(s) of the gradients, "
          f"‖g − g_whole‖/‖g_whole‖ = {rel(res[0], g_whole):.1e}")

# %% [markdown]
# The gradient is right either way; without `no_sync` every micro-batch pays a full
# all-reduce (k times the traffic), with it one all-reduce per bucket per step, whatever k.
#
# ## 6. A step on a budget
#
# Exercise 2.5 hands you the levers of this lesson and two budgets, and grades what the
# ledger and the clock measure, not a formula. The setting: a node of 4 H100s, laid out
# as a 2 × 2 mesh; your data-parallel group is one of its dimensions (the grader tries
# both), and the other group takes its own step beside yours. The model is a float64 GPT
# (so your gradients can be checked against one device's to 1e-10), with h = 128 and 4
# blocks. Each rank of your group has 24 sequences of 32 tokens (the grader also tries
# 16, which fit one forward). On an H100 float64 runs at 67 TFLOP/s and each gradient is
# 8 bytes: T* (section 4) for this dtype, from the same cost model:

# %%
budget_cfg = GPTConfig(vocab_size=64, seq_len=32, hidden=128, num_heads=4, num_layers=4)
PER_RANK, MAX_SEQUENCES = 24, 16  # sequences per rank; at most this many in one forward
EXPOSED_BUDGET = 9.5 * US  # how much longer than its compute the step may last
node = mp.Topology.nodes(1, gpus_per_node=4)
fp64_ar = collective_cost("all_reduce", 8 * PSI_7B, range(2), node).seconds  # ranks 0, 1
t_star_fp64 = fp64_ar * node.device.peak("float64") / (4 * PSI_7B)
print(f"float64, N = 2 in a node: T* = {t_star_fp64:,.0f} tokens per rank; "
      f"exercise 2.5 has {PER_RANK * budget_cfg.seq_len:,}")
budget_ids, budget_targets = rng.integers(0, budget_cfg.vocab_size,
                                          (2, budget_cfg.seq_len, 2 * PER_RANK))  # [s, 48]


def naive_step(ctx):
    """DDP with the default bucket, the whole batch in one forward: (step − compute,
    peak activations)."""
    model = GPT(budget_cfg)
    ddp = DistributedDataParallel(model, AdamW, bucket_cap_mb=25.0)
    ctx.ledger.reset_peak()
    model.loss_and_grad(*split_data_parallel(budget_ids, budget_targets, ctx.rank, 2))
    ddp.full_grads()
    first = min(e.start for e in ctx.trace.of("compute"))
    t = measure(ctx.trace.events, ctx.world_size, start=first)[ctx.rank]
    return t.window - t.compute, ctx.ledger.peak("activations")


naive_over, naive_peak = mp.launch(naive_step, 2, topology=topo)[0]  # one group, NVLink
activation_budget = naive_peak * MAX_SEQUENCES / PER_RANK  # every activation has a batch dim
print(f"budgets: activations {activation_budget / MIB:.2f} MiB (what {MAX_SEQUENCES} "
      f"sequences hold), step − compute {EXPOSED_BUDGET / US:.1f} µs")
print(f"DDP's defaults, all {PER_RANK} sequences at once: activations {naive_peak / MIB:.2f} "
      f"MiB, step − compute {naive_over / US:.2f} µs")

# %% [markdown]
# The step that ignores both budgets holds the activations of all 24 sequences and
# leaves its whole all-reduce exposed. (Every tensor a forward saves has a batch
# dimension, so the ledger's activations are proportional to the sequences: 16 hold
# 16/24 of what 24 hold.) Your `budgeted_step(model, ids, targets, group,
# max_sequences)` must fill every `p.grad` with the gradient of the group's whole batch
# (as 2.1 would leave it), never hold more than the activations of 16 sequences, and
# finish at most 9.5 µs after its compute would alone (the window runs from the first
# forward to the last event, so communication hidden under compute costs nothing, and
# compute added to hide it does). The levers: `bucket_cap_mb`; how many micro-batches,
# of what sizes, in what order; `no_sync()`; or no engine at all, your own all-reduces
# launched from `model.hooks` (DDP's `backward_post`). Think first about which
# all-reduces can still overlap anything once the last backward begins, and what a
# bucket costs besides its bytes; then measure with `measure` as section 4 does. There
# is more than one way in, and both budgets are tight enough that the first guess may
# not be.
#
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 02`. The grader runs your functions on simulated
# ranks and compares them with minipar's `DistributedDataParallel` and with one device.
#
# - **Exercise 2.1** — `all_reduce_gradients(model, group=None)`: naive data parallelism,
#   after the backward: replace every parameter's `.grad` by its average over the ranks
#   of `group`.
# - **Exercise 2.2** — `make_buckets(sizes_bytes, cap_bytes)`: DDP's bucket assignment
#   from the parameters' sizes in `model.units()` order; the buckets as lists of indices,
#   in the order they are launched.
# - **Exercise 2.3** — `launch_after(bucket_units, backward_order)`: for each bucket, the
#   unit at whose `backward_post` DDP launches its all-reduce.
# - **Exercise 2.4** — `accumulate(model, micro_batches, engine=None)`: gradient
#   accumulation over micro-batches of any sizes whose accumulated gradient equals the
#   whole batch's; with an engine, one all-reduce per bucket.
# - **Exercise 2.5** — `budgeted_step(model, ids, targets, group, max_sequences)`: the
#   design exercise of section 6. One step's gradients on a 2 × 2 mesh of H100s, with the
#   activations of at most 16 sequences on the ledger and at most 9.5 µs of the step not
#   covered by compute on the clock; the grader runs your choice and measures both.
#
# The checks run every function that takes a group on a 2-D mesh, your data-parallel
# group being its consecutive or its strided dimension, beside another group doing the
# same, so code that ignores `group` fails; failures name the rank as "dp rank 1 of 2 =
# global rank 3 of 4, the second dp group [2, 3]".
#
# ## Summary
#
# - Averaging the gradients of N equal shards gives exactly the whole-batch gradient:
#   data parallelism changes where the work runs, not what is computed.
# - DDP = same weights everywhere (broadcast at start) + gradient all-reduce with op "avg"
#   + a local optimizer step; every rank holds all 16Ψ bytes of model states.
# - Buckets trade latency (2(N−1)α per all-reduce) against overlap: launched from the
#   `backward_post` hooks in reverse unit order, they run under the rest of the backward.
#   Too large and nothing overlaps; too small and latency dominates.
# - Communication hides only when the backward is long enough: the break-even point T*
#   is (N−1)/N · peak/β tokens per rank on one node — 1,099 on NVLink H100s at N = 2
#   only, 1,924 at N = 8 — and more across nodes: 3,160 for 16 GPUs in nodes of 8,
#   9,890 on a ring over InfiniBand at N = 2.
# - Gradient accumulation must scale each micro-batch loss by its share (1/k for equal
#   micro-batches) and run all but the last backward under `no_sync()`. Without the scale
#   the gradient is k times too large: SGD steps k times too far; Adam hides it, but the
#   gradient norm and clipping do not.
# - Only what runs under the backward is hidden: under a memory budget, how the batch is
#   cut and how the buckets are sized decide how much of the all-reduce the last backward
#   can cover (exercise 2.5).
