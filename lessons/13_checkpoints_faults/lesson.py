# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 13 — Checkpoints, faults and hangs
#
# What a checkpoint holds and how long a save takes, sharded saves and loading them at another layout, how often to save (Young and Daly, with Llama 3's interruption rate), resuming at a smaller dp after a node is lost, and the hangs of a distributed job — a skipped collective, swapped collectives, an unused parameter, a straggler, a stuck rank — run and diagnosed on the simulator.
#
# A job on thousands of GPUs fails often. Llama 3 405B trained on 16,384 H100s and, over a
# 54-day snapshot of its pre-training, was interrupted 466 times: 47 planned stops
# (firmware upgrades, configuration and dataset changes) and 419 unexpected ones, about
# 78 % of those attributed to confirmed or suspected hardware issues, GPUs and their HBM3
# memory first (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4). It still
# spent more than 90 % of its time training. Two things make that possible: saving the
# state often and cheaply, so that a failure costs little work, and finding why a job
# stopped — or stopped making progress — quickly.
#
# This lesson measures both on simulated devices: a real sharded save and its files
# (`minipar/parallel/checkpoint/`, docs/checkpoints.md), a load at another layout, a rank
# that crashes mid-run (`minipar/runtime/faults.py`) and a run resumed with one
# data-parallel replica fewer; then the failures that do not crash but hang or corrupt,
# each run on the simulator and diagnosed by what minipar says (docs/runtime.md).

# %%
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel import DistributedDataParallel, ParallelDims, checkpoint, parallelize
from minipar.plan import CLUSTERS, MODELS, Layout, rank_memory, step_time
from minipar.plan.rank_states import bytes_per_parameter
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError, RankFailedError)
from minipar.runtime.faults import Fault, inject, step_begins
from minipar.viz import figures

GB, GiB, DAY = 10**9, 2**30, 86400
H100 = CLUSTERS["h100"]
SCRATCH = tempfile.TemporaryDirectory(prefix="minipar-lesson13-")  # removed at exit
WORK = Path(SCRATCH.name)

# %% [markdown]
# ## 1. What a checkpoint holds
#
# To continue as if nothing had happened, a resumed run needs five things:
#
# - the **weights**: in mixed precision the bf16 copy the forward uses *and* the float32
#   master copy the optimizer updates;
# - the **optimizer's states**: Adam's m and v, float32;
# - the **step**: Adam's bias correction and the learning-rate schedule are functions of it;
# - the **random state**: the generator the dropout masks are drawn from;
# - the **data position**: which batch comes next.
#
# The gradients are not among them: a step ends with them zeroed. In minipar the batch of
# step n and the learning rate are functions of n, so the step carries the data position
# and the schedule; the dropout generator's state is recorded beside the arrays. A save of
# a two-layer GPT in bfloat16 on one device, after one step:

# %%
BF16 = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2,
                 dtype="bfloat16")
ids16 = np.random.default_rng(0).integers(0, 16, (8, 4))


def one_bf16_step(ctx):
    run = parallelize(BF16, ParallelDims(), zero=1, lr=3e-3)
    run.train_step(ids16, np.roll(ids16, -1, 0))
    checkpoint.save_sharded(run, WORK / "bf16")


mp.launch(one_bf16_step, 1)
held = {}
with np.load(WORK / "bf16" / "rank00000.npz") as f:
    for name in f.files:
        kind = name.split("/")[-1]
        held[kind] = held.get(kind, 0) + f[name].nbytes
meta16 = json.loads((WORK / "bf16" / "index.json").read_text())["meta"]
per_param16 = sum(v for k, v in held.items() if k != "step") / BF16.num_parameters()
print(f"{BF16.num_parameters():,} parameters; the file holds, by kind: "
      + ", ".join(f"{k} {v:,} B" for k, v in held.items()))
print(f"  {per_param16:g} bytes a parameter; the index records step {meta16['step']}, the "
      f"dropout generator ({meta16['dropout_generator']['bit_generator']}) and the "
      f"config")

# %% [markdown]
# 2 bytes of bf16 weights and 4 each of master, m and v: 14 bytes a parameter, of the 18
# that Megatron-LM holds in memory (lesson 10: its float32 `main_grad` is the other 4).
# `minipar.plan` counts the same bytes for a real model. How long a save takes depends on
# where it goes: Llama 3's storage (Tectonic, Meta's distributed file system) sustains
# 2 TB/s and peaks at 7 TB/s, and the paper names checkpoint writes, "highly bursty", as
# what saturates it (Dubey et al. 2024, section 3.3.1).

# %%
w, g, k = bytes_per_parameter(Layout())  # bf16 weights, float32 main_grad, master + m + v
STORAGE = 2e12  # bytes/s: Llama 3's Tectonic, sustained
size = {}
for key, gpus in (("llama3-70b", 256), ("llama3-405b", 16384)):
    psi = MODELS[key].parameters()
    size[key] = psi * (w + k)
    print(f"{MODELS[key].name}: {psi / 1e9:.1f}B parameters x {w + k} B = "
          f"{size[key] / 1e12:.2f} TB a checkpoint; {size[key] / gpus / 1e6:,.0f} MB from each "
          f"of {gpus:,} GPUs; {size[key] / STORAGE:.2f} s at 2 TB/s")
save405 = size["llama3-405b"] / STORAGE

# %% [markdown]
# 5.7 TB for the 405B model, 347 MB a GPU (the paper reports from 1 MB to 4 GB a GPU), 2.8
# seconds at the file system's sustained rate — *if* every GPU writes its own part at once.
# That is the next section.

# %% [markdown]
# ## 2. Sharded against consolidated
#
# A consolidated checkpoint is one file of the single-device tensors, written by one rank:
# every other rank first sends it what it holds (FSDP's `FULL_STATE_DICT` with
# `rank0_only`). A sharded checkpoint is one file a rank, each written by the rank that
# holds it, plus an index of where every piece sits in the full tensors
# (torch.distributed.checkpoint's `dcp.save`, Megatron-LM's `dist_checkpointing`). Both,
# from a dp 2 × pp 2 × tp 2 run with ZeRO-1 (8 ranks) after two steps:

# %%
CFG = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=4)
B8 = 8
data = np.random.default_rng(1).integers(0, 16, (4, 8, B8))  # 4 steps of [s, B]
batches = [(x, np.roll(x, -1, axis=0)) for x in data]
MESH8 = ParallelDims(dp_shard=2, pp=2, tp=2)
PIPE = dict(schedule="1f1b", microbatches=2)


def save_both(ctx):
    run = parallelize(CFG, MESH8, zero=1, lr=3e-3, placement="any", **PIPE)
    losses = [run.train_step(*b) for b in batches[:2]]
    marks = [len(ctx.trace.events)]
    checkpoint.save_sharded(run, WORK / "sharded")
    marks.append(len(ctx.trace.events))
    checkpoint.save_consolidated(run, WORK / "whole")
    marks.append(len(ctx.trace.events))
    sent = [sum(e.meta.get("sent_bytes", 0) for e in ctx.trace.events[a:b])
            for a, b in zip(marks, marks[1:])]
    losses += [run.train_step(*b) for b in batches[2:]]  # the run that never stops
    return losses, sent


saved = mp.launch(save_both, 8)
straight = np.mean([r[0] for r in saved], axis=0)  # each step's loss over the dp blocks
shard_elems = {}
for path in sorted((WORK / "sharded").glob("rank*.npz")):
    with np.load(path) as f:
        shard_elems[path.name] = sum(f[n].size for n in f.files if n.endswith("/param"))
    print(f"  {path.name}: {path.stat().st_size:,} bytes, {shard_elems[path.name]:,} weights "
          f"(and as many m and v)")
whole_file = (WORK / "whole.npz").stat().st_size
largest = max(shard_elems.values())
print(f"the model: {CFG.num_parameters():,} parameters; the largest rank file holds "
      f"{largest:,} of them ({largest / CFG.num_parameters():.0%})")
print(f"bytes each rank sent to save: sharded {max(r[1][0] for r in saved):,.0f}, "
      f"consolidated {max(r[1][1] for r in saved):,.0f} (rank 0 then writes "
      f"{whole_file:,} bytes alone)")

# %% [markdown]
# Eight files, one a rank, each about 1/8 of the state: no rank ever holds the whole
# model, and the save moves no parameters (a broadcast of the save's id, barriers, and
# under a pipeline a gather of a few kilobytes of descriptions). The consolidated save
# sends every rank's state to rank 0, which writes it alone. At Llama 3 405B's scale,
# what that one rank must receive, at an H100's 50 GB/s of InfiniBand, and hold:

# %%
link = H100.inter.bandwidth
one_rank = size["llama3-405b"] / link
print(f"consolidated: {size['llama3-405b'] / 1e12:.2f} TB into one GPU's {link / GB:.0f} GB/s: "
      f"at least {one_rank:.0f} s, and {size['llama3-405b'] / H100.device.memory_bytes:.0f}x "
      f"its {H100.device.memory_bytes / GB:.0f} GB; sharded: {save405:.2f} s")

# %% [markdown]
# At least 114 s and 71 devices' memory against 2.8 s: at scale a consolidated save is
# not slow, it is impossible, and every framework saves sharded (DCP, Megatron's
# distributed checkpointing, DeepSpeed's `zero_pp_rank_*` files). Consolidate offline,
# for inference or export (`checkpoint.read_full_state`, DCP's `dcp_to_torch_save`).
# Writes can also leave the critical path: copy the shard to host memory, resume
# training, and let a thread write it (DCP's `async_save`); the training then pauses only
# for the copy.

# %% [markdown]
# ## 3. Loading at another layout
#
# A sharded checkpoint records each piece's place (docs/checkpoints.md): a flat buffer a
# unit (a block, the embedding), cut over dp_shard; inside it each parameter's offset;
# each parameter's cut over tp; each unit's pipeline stage. So any layout can read it. The
# save above, after step 2 of 4, resumed at the same layout, at dp 4 with ZeRO-2, at
# tp 2 × pp 2 and on one device, each training steps 3 and 4:

# %%
def resume_at(ctx, dims, kw):
    run = parallelize(CFG, dims, lr=3e-3, placement="any", **kw)
    checkpoint.load(run, WORK / "sharded")
    return [run.train_step(*b) for b in batches[2:]]


resumed = {}
for label, dims, kw in (("dp 2 x pp 2 x tp 2", MESH8, dict(zero=1, **PIPE)),
                        ("dp 4, ZeRO-2", ParallelDims(dp_shard=4), dict(zero=2)),
                        ("tp 2 x pp 2", ParallelDims(tp=2, pp=2), PIPE),
                        ("one device", ParallelDims(), {})):
    out = mp.launch(lambda ctx: resume_at(ctx, dims, kw), dims.world_size)
    resumed[label] = np.mean(out, axis=0)
    gap = np.max(np.abs(resumed[label] / straight[2:] - 1))
    print(f"  {label:<19} losses {resumed[label][0]:.15f} {resumed[label][1]:.15f}: "
          + ("equal (==) to the run that never stopped" if gap == 0 else
             f"{gap:.1e} from the run that never stopped"))

# %% [markdown]
# At the same layout the continued run *is* the uninterrupted one, bit for bit. At another
# layout it agrees to the last bits of float64: another layout adds its partial sums in
# another order (dp averages over other blocks, tp splits the matmuls' inner sums), so
# equality bit for bit is not the right claim; agreement to the reduction-order bound is
# (docs/data_parallel.md derives it; `tests/parallel/checkpoint/test_reshard.py` checks
# every layout of up to 8 ranks into every other).
#
# minipar's load reads the whole checkpoint and cuts what it needs. DCP reads only the
# pieces that overlap: a rank of the new layout finds, in the index, which old shards
# cover its range. For the first block's flat buffer on a tp rank, saved over
# dp_shard = 2 and read at dp 3 × tp 2:

# %%
index = json.loads((WORK / "sharded" / "index.json").read_text())
unit = next(u for u in index["meta"]["units"] if u["name"] == "blocks.0")
S_old = unit["shard_numel"]
S_new = -(-unit["numel"] // 3)  # ceil: a flat buffer over 3 ranks
print(f"blocks.0 on a tp rank: {unit['numel']:,} elements, {S_old:,} a shard at dp 2, "
      f"{S_new:,} at dp 3")
for j in range(3):
    lo, hi = j * S_new, min((j + 1) * S_new, unit["numel"])
    pieces = [(r, max(lo, r * S_old) - r * S_old, min(hi, (r + 1) * S_old) - r * S_old)
              for r in range(2) if max(lo, r * S_old) < min(hi, (r + 1) * S_old)]
    print(f"  new dp rank {j} reads " + " and ".join(f"old shard {r}[{a}:{b}]"
                                                     for r, a, b in pieces))

# %% [markdown]
# Exercise 13.2 writes that rule for any sizes, padding included: a flat buffer over N
# ranks is padded to a multiple of N, and the padding is never read.

# %% [markdown]
# ## 4. How often to save: Young and Daly
#
# Save every τ seconds of training; a save stops training for δ; failures come at random,
# a mean time M apart. Each save costs δ/τ of the time; each failure loses the work since
# the last save, half a cycle of τ + δ on average, plus the restart R. To first order the
# share of time lost is
#
#     overhead(τ) = δ/τ + ((τ + δ)/2 + R)/M
#
# and its minimum is at Young's interval τ = sqrt(2·δ·M) (Young 1974, "A first order
# approximation to the optimum checkpoint interval"), where the saves and the lost work
# cost the same, sqrt(δ/(2M)) each. Daly (2006, "A higher order estimate of the optimum
# checkpoint interval for restart dumps") kept the higher-order terms of the exact
# expected time under exponential failures, T(τ) = M·e^(R/M)·(e^((τ+δ)/M) − 1)/τ per
# unit of work, and found τ = sqrt(2δM)·(1 + sqrt(δ/(2M))/3 + δ/(18M)) − δ while δ < 2M.
#
# M is the job's, not a GPU's: 419 unexpected interruptions in 54 days. The 47 planned
# ones are announced and preceded by a save: they lose no work. Llama 3 405B's sharded
# save of section 1, and the consolidated one's lower bound:

# %%
M = 54 * DAY / 419
print(f"M = 54 days / 419 = {M:,.0f} s = {M / 3600:.2f} h for the job; a GPU's: "
      f"16,384 x M = {16384 * M / (365 * DAY):.1f} years")
taus = np.geomspace(30, 3 * 3600, 200)
exact = {}
interval = {}
for label, delta in (("sharded", save405), ("consolidated", one_rank)):
    young = math.sqrt(2 * delta * M)
    daly = young * (1 + math.sqrt(delta / (2 * M)) / 3 + delta / (18 * M)) - delta
    T = M * (np.exp((taus + delta) / M) - 1) / taus - 1  # Daly's exact overhead, R = 0
    exact[label] = T
    best = taus[np.argmin(T)]
    interval[label] = (delta, young, daly)
    print(f"  {label:<12} δ = {delta:6.1f} s: Young {young / 60:5.1f} min, Daly "
          f"{daly / 60:5.1f} min (the exact model's minimum on the grid: {best / 60:.1f} min);"
          f" overhead at Young {delta / young + (young + delta) / (2 * M):.2%}")
figures.lines("13_checkpoint_interval", "Time lost to saves and failures (Llama 3 405B, M = "
              f"{M / 3600:.1f} h)", [t / 60 for t in taus],
              {f"sharded, δ = {save405:.1f} s": 100 * exact["sharded"],
               f"consolidated, δ = {one_rank:.0f} s": 100 * exact["consolidated"]},
              xlabel="checkpoint interval τ (minutes)", ylabel="overhead (% of the time)",
              logx=True, logy=True)

# %% [markdown]
# A job that fails every 3.1 hours should save its sharded state every 4.2 minutes; it then
# loses 2.3 % of its time, half to the saves and half to redoing work. A consolidated save
# would lose about 15 % at best. The curve is flat near its minimum: twice or half Young's
# interval costs only a quarter more, so a round number near it will do. Daly's correction
# matters only when δ is a sizeable share of M.
#
# Is the expected loss per failure really half a cycle? Failures of an exponential
# process, against saves every τ + δ:

# %%
delta, tau = save405, interval["sharded"][1]
fails = np.cumsum(np.random.default_rng(7).exponential(M, 100_000))
lost = np.mod(fails, tau + delta)  # the time since the cycle began: what is redone
print(f"simulated: {lost.mean():.1f} s redone a failure on average, (τ + δ)/2 = "
      f"{(tau + delta) / 2:.1f} s")
left = 0.10 - (delta / tau + (tau + delta) / (2 * M))
print(f"Llama 3 trained more than 90 % of the time: saves and redone work take "
      f"{1 - 0.90 - left:.1%}, which leaves R <= {left * M / 60:.0f} min a failure to "
      f"detect, reschedule and reload")

# %% [markdown]
# The other term is the restart R: detecting the failure, draining the bad node,
# rescheduling 16,384 GPUs, initialising NCCL, reading the checkpoint. With saves every
# 4 minutes, R dominates: Llama 3's 90 % leaves at most 14 minutes a failure for it. Fast
# detection (the watchdog of section 10), hot spares and reading the checkpoint from host
# memory are how large jobs shrink it.

# %% [markdown]
# ## 5. A node lost: resume at a smaller dp
#
# When a node dies and no spare is at hand, the job can continue on fewer GPUs. The rule
# of thumb is to **recover from the data-parallel dimension first**: give up the replica
# that held the lost node and keep tp and pp as they were. Each remaining rank keeps the
# same slice of every layer; only the ZeRO-sharded optimizer states spread over one rank
# fewer, and the global batch stays the same with more gradient accumulation.
#
# On the simulator: dp 4 × tp 2 with ZeRO-1 on 4 nodes of 2 GPUs (tp inside a node), 24
# sequences a step, micro-batches of 2 (k = 3 a replica), a save after every step. Rank 5
# fails as step 3 begins:

# %%
CFG2 = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2)
B24, b, STEPS = 24, 2, 4
data24 = np.random.default_rng(2).integers(0, 16, (STEPS, 8, B24))
batches24 = [(x, np.roll(x, -1, axis=0)) for x in data24]
root = WORK / "run"


def training(ctx, dp, save, resume):
    run = parallelize(CFG2, ParallelDims(dp_shard=dp, tp=2), zero=1, lr=3e-3,
                      placement="any")
    start = checkpoint.resume(run, root).step if resume else 0
    k = B24 // (dp * b)  # the global batch kept: micro-batches of b a replica
    losses = []
    for n in range(start + 1, STEPS + 1):
        step_begins(n)  # a planned Fault at "step" fires here
        losses.append(run.train_step(*batches24[n - 1], micro_batches=k))
        if save:
            checkpoint.save_step(run, root)  # root/step-0000000n
    return losses


never_failed = np.mean(mp.launch(lambda ctx: training(ctx, 4, False, False), 8,
                                 topology=mp.Topology.nodes(4, 2)), axis=0)
try:
    mp.launch(inject(lambda ctx: training(ctx, 4, True, False), Fault(rank=5, step=3)), 8,
              topology=mp.Topology.nodes(4, 2))
except RankFailedError as e:
    print(str(e).split("\n--- traceback")[0])
last = checkpoint.latest(root)
print(f"saved: {sorted(p.name for p in root.iterdir())}; the newest complete: step {last.step}")
after = np.mean(mp.launch(lambda ctx: training(ctx, 3, True, True), 6,
                          topology=mp.Topology.nodes(3, 2)), axis=0)
for n, (x, y) in enumerate(zip(never_failed[last.step:], after), start=last.step + 1):
    print(f"  step {n}: never failed {x:.15f}, resumed at dp 3 x tp 2 (k = {B24 // (3 * b)}) "
          f"{y:.15f}, {abs(y / x - 1):.1e} apart")

# %% [markdown]
# The fault stops every rank (the others are woken out of their collectives; `launch`
# reports the rank that failed and its traceback). Rank 5 sits on node 2 with rank 4, one
# tp group, one replica. The newest complete save is step 2's; resumed on the 3 remaining
# nodes at dp 3, each replica accumulates 4 micro-batches instead of 3 and the run goes on
# as the one that never failed, to the reduction order.
#
# At scale: Llama 3 70B on 32 nodes with tp 8 × pp 4 × dp 8 (lesson 10) loses a node. The
# node was one pipeline stage of one replica, so the replica stops: dp 7, 28 nodes at
# work, 3 healthy ones idle until the bad one is replaced. 7 does not divide the 512
# sequences; the nearest global batch is 511 (73 micro-batches of 1 a replica). Against
# replanning on all 31 nodes:

# %%
L70 = MODELS["llama3-70b"]
before = Layout(tp=8, pp=4, dp=8, global_batch=512, sequence_parallel=True,
                recompute="selective", distributed_optimizer=True)
options = {"before: dp 8": before,
           "dp first: dp 7": Layout(tp=8, pp=4, dp=7, global_batch=7 * (512 // 7),
                                    sequence_parallel=True, recompute="selective",
                                    distributed_optimizer=True),
           "replanned: pp 2, dp 15": Layout(tp=8, pp=2, dp=15, global_batch=15 * (512 // 15),
                                            sequence_parallel=True, recompute="selective",
                                            distributed_optimizer=True)}
recovery = {}
for label, lay in options.items():
    mem = rank_memory(L70, lay, H100, dropout=False)
    st = step_time(L70, lay, H100, dropout=False)
    tokens = lay.global_batch * L70.seq_len / st.seconds
    share = tokens / recovery["before: dp 8"][4] if recovery else 1.0
    recovery[label] = (lay.gpus, mem.optimizer_states.steady / GiB, mem.peak / GiB,
                       st.seconds, tokens, share)
    print(f"  {label:<23} {lay.gpus} GPUs, {lay.global_batch} sequences: optimizer states "
          f"{recovery[label][1]:.2f} GiB, peak {recovery[label][2]:.1f} GiB, step "
          f"{st.seconds:.2f} s, {tokens / 1e3:,.0f}k tokens/s ({share:.0%})")

# %% [markdown]
# Recovering on dp keeps 88 % of the throughput and changes almost nothing on a rank: its
# layers are the same, its optimizer-state shard grows by 8/7 (3.17 to 3.63 GiB), the
# peak by half a GiB. Replanning to pp 2 × dp 15 would use 240 GPUs and keep 96 %, but
# every rank then holds twice the layers (a peak of 50 GiB), the checkpoint must be
# resharded across pp, and the new layout has never run: a longer, riskier restart for a
# node that comes back in hours. Hence the checklist's order: DP first, replan only for a
# long outage.

# %% [markdown]
# ## 6. A skipped collective
#
# The failures above crash: a rank raises and the job ends. The harder ones do not.
# Collectives are matched by their *order* in a group, nothing else: the k-th all-reduce
# of every rank meets the k-th of every other. Rank 2 decides on its own to skip step 2
# (it saw a non-finite loss, say) and with it step 2's all-reduce:

# %%
entered: dict = {}
sums: dict = {}


def skipping(ctx):
    entered[ctx.rank], sums[ctx.rank] = [], []
    for step in range(1, 5):
        if ctx.rank == 2 and step == 2:
            continue  # rank 2 skips the step: its gradients are never sent
        entered[ctx.rank].append(step)
        sums[ctx.rank].append(mp.all_reduce(np.full(2, 100.0 * step + ctx.rank))[0])


try:
    mp.launch(skipping, 4)
except DeadlockError as e:
    print(e)
right = [sum(100.0 * s + r for r in range(4)) for s in range(1, 5)]
print(f"the steps each rank entered: {entered}")
print(f"rank 0's sums: {[float(x) for x in sums[0]]} (right: {right[:len(sums[0])]})")

# %% [markdown]
# Nothing is noticed at step 2: rank 2's step-3 gradients meet the others' step-2 ones,
# and steps 2 and 3 average wrong numbers on every rank, silently. The run stops only at
# the end, where ranks 0, 1 and 3 wait in a fourth all-reduce rank 2 never makes. On a
# cluster that is an NCCL timeout, minutes later and far from the cause, and every waiting
# rank reports it. The culprit is found from what each rank *entered*: the lists agree,
# then part, and the rank that parts from the others is the one to look at — not the
# ranks that report the timeout. PyTorch's flight recorder (`TORCH_NCCL_TRACE_BUFFER_SIZE`)
# dumps exactly those lists; minipar's trace records each collective with its call site.
# Exercise 13.4 reads them.
#
# The fix: decide to skip a step collectively (all-reduce the overflow flag, as a loss
# scaler does), never on one rank.

# %% [markdown]
# ## 7. Collectives in another order
#
# Rank 1 reduces its loss before its gradients; the others do the opposite. With equal
# shapes the pairs still match:

# %%
def swapped(ctx, shapes):
    grads = np.full(shapes[0], 1.0 + ctx.rank)
    loss = np.full(shapes[1], 10.0 * (1 + ctx.rank))
    if ctx.rank == 1:
        l_sum = mp.all_reduce(loss)  # the loss first
        g_sum = mp.all_reduce(grads)
    else:
        g_sum = mp.all_reduce(grads)
        l_sum = mp.all_reduce(loss)
    return g_sum[0], l_sum[0], [e.meta["where"] for e in ctx.trace.events]


same = mp.launch(lambda ctx: swapped(ctx, ((3,), (3,))), 3)
print(f"gradient sums {[float(r[0]) for r in same]} (right: {sum(1.0 + r for r in range(3))}), "
      f"loss sums {[float(r[1]) for r in same]} (right: {sum(10.0 * (1 + r) for r in range(3))})")
for r, (_, _, where) in enumerate(same):
    print(f"  rank {r} entered: {where}")
try:
    mp.launch(lambda ctx: swapped(ctx, ((3,), (5,))), 3)
except CollectiveMismatchError as e:
    print(e)

# %% [markdown]
# With equal shapes no error is possible anywhere — not here, not in NCCL — and every rank
# gets wrong sums; only the call sites in the trace show that rank 1 went another way (had
# both orders been one line, a loop over a list of tensors, not even they would). With
# different shapes minipar checks each call's kind, shape, dtype, op and root against the
# others' and stops at the first that differs, naming each rank's call and line. NCCL
# checks nothing (mismatched sizes hang or corrupt); PyTorch's
# `TORCH_DISTRIBUTED_DEBUG=DETAIL` adds a check of the collective and its shapes before
# each call, at a cost.

# %% [markdown]
# ## 8. An unused parameter in DDP
#
# DDP reduces gradients in buckets, each launched once the backward of every unit it
# holds has ended, in order (lesson 02). A unit the forward did not use has no backward:
# its bucket never fires, nor any after it. Here the second block is skipped on every
# rank (a layer switched off by a configuration flag, say):

# %%
CFG3 = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=3)
ids3 = np.random.default_rng(3).integers(0, 16, (4, 4))


def unused_block(ctx):
    model = GPT(CFG3)
    DistributedDataParallel(model, lr=1e-2, bucket_cap_mb=0.002)  # its hooks do the rest
    mine = slice(2 * ctx.rank, 2 * ctx.rank + 2)
    x, s_embed = model.embed_forward(ids3[:, mine], None)
    x, s0 = model.blocks_forward(x, None, 0, 1)
    x, s2 = model.blocks_forward(x, None, 2, 3)  # block 1 is never called
    loss, s_head = model.head_forward(x, np.roll(ids3, -1, 0)[:, mine])
    dx = model.blocks_backward(model.head_backward(s_head, 1.0), s2, 2, 3)
    model.embed_backward(model.blocks_backward(dx, s0, 0, 1), s_embed)


try:
    mp.launch(unused_block, 2)
except RankFailedError as e:
    print(str(e).split("\n--- traceback")[0])

# %% [markdown]
# minipar refuses it at the end of the backward, on every rank: without the refusal each
# rank would step on its own unreduced gradients and the replicas would drift apart with
# no error, or, if only some ranks skipped the block, the others would wait in its bucket.
# PyTorch refuses it at the next iteration ("Expected to have finished reduction in the
# prior iteration ...") unless DDP is built with `find_unused_parameters=True`, which
# walks the autograd graph after every forward to mark the unused parameters ready — a
# cost on every step, for models whose forward really varies (mixture-of-experts
# branches, a frozen tower).

# %% [markdown]
# ## 9. A straggler
#
# No error, no hang: from step 3 the job's steps are slower. Four ranks compute, then
# all-reduce their gradients; from step 3 rank 3 computes 1.5x slower (a GPU throttled by
# its temperature, a failing HBM stack, a noisy neighbour on the host):

# %%
grads = np.ones(2**18, np.float32)  # 1 MiB of gradients


def straggling(ctx):
    ends, waits = [], []
    for step in range(1, 5):
        slow = 1.5 if ctx.rank == 3 and step >= 3 else 1.0
        ctx.compute(0.2e12 * slow, dtype="bfloat16")  # the step's forward and backward
        first = len(ctx.trace.events)
        mp.all_reduce(grads)
        e = [e for e in ctx.trace.events[first:] if e.stream == "comm"][0]
        waits.append(e.start - e.meta["issued"])  # in the all-reduce, waiting for the last
        ends.append(e.end)
    return ends, waits


strag = mp.launch(straggling, 4)
ends = strag[0][0]
steps = [b - a for a, b in zip([0.0] + ends, ends)]
print("each step, on every rank: " + ", ".join(f"{s * 1e3:.3f} ms" for s in steps))
for r in range(4):
    print(f"  rank {r} waited in step 3's all-reduce: {strag[r][1][2] * 1e3:.3f} ms")
figures.timeline("13_straggler", "A straggler: rank 3 computes 1.5x slower from step 3",
                 strag)

# %% [markdown]
# Every rank's step grows by the same 0.1 ms: a synchronous step runs at the pace of its
# slowest rank, so the step time names no one. The waits do: the three healthy ranks sit
# in the all-reduce for the 0.1 ms rank 3 takes longer, and rank 3 waits for nobody. The
# straggler is the rank that does not wait. On a cluster: each rank's time from the start
# of the step to the issue of its collective (or its time inside NCCL kernels); then that
# GPU's clocks and throttle reasons (`nvidia-smi -q -d PERFORMANCE`), or drain the node.

# %% [markdown]
# ## 10. A stuck rank and the watchdog
#
# A rank that never comes back — a loop that does not end, a read from a dead file system,
# a lock of its own — leaves its peers waiting in their next collective for ever. NCCL's
# watchdog ends such a job after a timeout (10 minutes by default in PyTorch, `timeout=`
# of `init_process_group`). minipar's `launch(..., timeout=T)` does the same, and says who
# never arrived and where it is:

# %%
def stuck(ctx):
    for step in range(1, 4):
        if ctx.rank == 3 and step == 2:
            time.sleep(0.5)  # rank 3 hangs outside any collective
        mp.all_reduce(np.ones(2))


try:
    mp.launch(stuck, 4, timeout=0.2)
except CollectiveTimeoutError as e:
    print(e)

# %% [markdown]
# Three ranks wait in the second all-reduce; rank 3 "never arrived" and is named with the
# line it is at, the sleep. That is the difference with section 6: a deadlock between
# ranks minipar diagnoses at once, because every rank waits in minipar; a rank running
# outside it can only be timed out. A timeout must be longer than the longest legitimate
# pause between collectives (a save written by one rank, an evaluation on some ranks),
# else it fires on a healthy job; better, make those pauses collective too.

# %% [markdown]
# ## Exercises
#
# - **13.1** `checkpoint_interval`: the job's MTBF from its unexpected interruptions,
#   Young's and Daly's intervals, the expected loss a failure and the overhead at Young's
#   interval (section 4), on drawn jobs and on Llama 3's.
# - **13.2** `reshard_reads`: which pieces of the old shards a rank reads when a flat
#   buffer saved over n ranks is loaded over m (section 3), checked on minipar's flat
#   layout and on the files of a real ZeRO-1 checkpoint loaded at another dp.
# - **13.3** `shrink_dp`: the gradient accumulation that keeps the global batch at a
#   smaller dp, and which sequences each replica's micro-batches take (section 5), checked
#   against minipar's split of the batch and a run on simulated devices.
# - **13.4** `first_divergence`: from what each rank entered, the rank that diverged first
#   and where (sections 6 and 7), on planted faults and on a run's traces.
#
# `minipar grade 13` grades `exercise.py`.
#
# ## Summary
#
# - A checkpoint holds the weights (bf16 and the float32 master), Adam's m and v, the step,
#   the random state and the data position: 14 bytes a parameter, 5.7 TB for Llama 3 405B.
# - Save sharded: each rank writes its part, no rank holds the whole model, and the save
#   runs at the file system's rate (2.8 s for 405B at 2 TB/s); a consolidated save through
#   one rank needs at least 114 s and 71 GPUs' memory. An index of where each piece sits
#   lets any layout load it; the continued run equals the uninterrupted one bit for bit at
#   the same layout and to the reduction order at another.
# - Save every sqrt(2·δ·M) (Young; Daly's correction matters only when δ is a sizeable
#   share of M). With Llama 3's 419 unexpected interruptions in 54 days, M = 3.1 h: every
#   4.2 minutes, 2.3 % lost to saves and redone work; the restart is what remains.
# - A node lost: drop its data-parallel replica, keep tp and pp, keep the global batch by
#   accumulating more micro-batches; the run continues as before, to the reduction order.
# - Collectives match by order: a skipped or swapped call corrupts silently until a hang or
#   a shape check; find the first rank whose list of collectives parts from the others'.
#   An unused parameter leaves a DDP bucket that never fires. A straggler is the rank that
#   does not wait. A stuck rank is named by the watchdog, with the line it is at.
