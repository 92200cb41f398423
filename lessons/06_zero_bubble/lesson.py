# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 06 — Zero-bubble pipelines and DualPipe
#
# Split each backward into I (the input's gradient) and W (the weights'), let W wait, and fill 1F1B's bubble: ZB-H1, ZB-H2, ZB-V and DualPipeV side by side on one clock, their activation memory, and why DeepSeek-V3 trained with DualPipe.
#
# Lesson 05 ended with 1F1B: every rank idles (p − 1)(t_F + t_B) a step, whatever m is,
# and only more micro-batches (or interleaved chunks) make that a smaller share. This
# lesson removes most of the idle time itself. The papers: Qi et al. 2023, "Zero Bubble
# Pipeline Parallelism" (ZB-H1, ZB-H2, the optimizer's post-validation); Qi et al. 2024,
# "Pipeline Parallelism with Controllable Memory" (ZB-V); DeepSeek-AI 2024, the
# DeepSeek-V3 technical report, section 3.2.1 (DualPipe), and DeepSeek's DualPipe
# repository (DualPipeV and its bubble table).
#
# Every schedule here is plain data, as in lesson 05: one list of actions per rank in
# torch.distributed.pipelining's notation, now with two more kinds, `2I0` (stage 2's
# backward for the input of micro-batch 0) and `2W0` (its backward for the weights), and
# DualPipe's overlapped pairs `(0F7;7B3)OVERLAP_F_B`. The same validator checks them, the
# same lowering adds their messages, the same dry run times them (`minipar/parallel/pp/`,
# `docs/zero_bubble.md`). Everything below runs in float64.

# %%
from fractions import Fraction

import numpy as np

import minipar as mp
from minipar.nn import GPT, Block, GPTConfig, WeightGradStore
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.pp import (I, W, Action, ScheduleError, dry_run, format_schedule, lower,
                                 placement, schedule)
from minipar.viz import figures, render_pipeline

cfg = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=4, seed=0)
s, b, h, p = cfg.seq_len, 2, cfg.hidden, 4  # micro-batches of b sequences, p stages
UNIT = {"F": 1, "I": 1, "W": 1, "B": 2}  # t_F = t_I = t_W = 1, t_B = t_I + t_W = 2


# %% [markdown]
# ## 1. Why W can wait
#
# A linear layer y = x·Wᵀ has two gradients in its backward (`minipar/nn/linear.py`):
#
# - **dX = dY·W**, the gradient of its *input*: the layer below needs it to start its own
#   backward, and in a pipeline the previous stage is waiting for it — this is **I**;
# - **dW = dYᵀ·X**, the gradient of its *weights*: nobody needs it until the optimizer
#   step at the end of the batch — this is **W**.
#
# Both are one matmul of the same size, so a linear layer's backward is two halves of
# equal FLOPs. A transformer block has more in I than in W: the attention core
# (softmax(QKᵀ)V) has no weights, and its backward is input gradients only. Every layer of
# minipar runs its backward either way: fused, `block.backward(dy, saved)`, or split,
# `block.backward(dy, saved, store=store)` for I and `store.run()` for W later — the
# store keeps what W will read on the ledger (`minipar/nn/weight_grads.py`, DualPipe's
# `WeightGradStore`). One block, split, every matmul's FLOPs read from the trace, and the
# gradients against the fused backward of the same block:

# %%
x0 = np.random.default_rng(0).standard_normal((s, b, h))  # x0: [s, b, h]
dy0 = np.random.default_rng(1).standard_normal((s, b, h))
with mp.device():
    fused = Block("blocks.0", cfg)
    fused.backward(dy0, fused.forward(x0, np.random.default_rng(2))[1])
with mp.device() as ctx0:
    block = Block("blocks.0", cfg)  # the same weights: initialised from (seed, name)
    y0, saved0 = block.forward(x0, np.random.default_rng(2))
    held = {a.name: a.nbytes for a in ctx0.ledger.live() if a.category == "activations"}
    first = len(ctx0.trace.events)
    store = WeightGradStore()
    block.backward(dy0, saved0, store=store)  # I: dx, and W's records pushed to the store
    middle = len(ctx0.trace.events)
    after_i = {"ledger": ctx0.ledger.held("activations"), "records": store.nbytes()}
    store.run()  # W: the weights' gradients, later
    after_w = ctx0.ledger.held("activations")
    flops = {"I": sum(e.flops for e in ctx0.trace.events[first:middle]),
             "W": sum(e.flops for e in ctx0.trace.events[middle:])}
    w_labels = {e.label.rsplit(".", 1)[-1] for e in ctx0.trace.events[middle:]}
    i_labels = {e.label.rsplit(".", 1)[-1] for e in ctx0.trace.events[first:middle]}
    same = all(np.array_equal(p1.grad, p2.grad)
               for p1, p2 in zip(fused.parameters(), block.parameters()))
N = s * b  # tokens in the micro-batch
by_hand = {"I": 24 * N * h * h + 8 * b * s * s * h, "W": 24 * N * h * h}
print(f"one block, s = {s}, b = {b}, h = {h}: I charged {flops['I']} FLOPs, W {flops['W']}, "
      f"I + W = {flops['I'] + flops['W']} = B; the split gradients equal the fused ones bit "
      f"for bit: {same}")
print(f"by hand: I = 24·N·h² (the four linears' dX) + 8·b·s²·h (the attention core) = "
      f"{by_hand['I']}; W = 24·N·h² = {by_hand['W']}")
print(f"W's matmuls: {sorted(w_labels)}; I's: {sorted(i_labels)}")

# %% [markdown]
# What does W need when it runs later? Each linear's input X — which the forward saved
# anyway — and the gradient of its output dY, which I computes on its way down; the
# LayerNorms' dγ and dβ ([h] each), which I reduces while it has x̂ at hand. Everything
# else the forward saved (the LayerNorms' inputs, Q, K and V, the softmax's output, the
# GeLU's input) is used by I alone and freed there. The forward's ledger, entry by entry,
# and the ledger after I and after W:

# %%
linear_inputs = {k: n for k, n in held.items() if k.split("#")[0].endswith(".x")
                 and any(f".{name}." in k for name in ("qkv", "proj", "fc1", "fc2"))}
for name, n in held.items():
    print(f"  {name:<28} {n:>6} bytes  {'kept for W' if name in linear_inputs else 'I only'}")
outputs = {"qkv": 3 * h, "proj": h, "fc1": 4 * h, "fc2": h}  # each linear's output width
dy_bytes = sum(N * width * 8 for width in outputs.values())
kept_for_w = {"inputs": sum(linear_inputs.values()), "output grads": dy_bytes,
              "layernorms": 2 * 2 * h * 8,
              "freed at I": sum(held.values()) - sum(linear_inputs.values())}
print(f"the forward saved {sum(held.values())} bytes; after I the ledger holds "
      f"{after_i['ledger']} (W's records: {after_i['records']}), after W {after_w}")
print(f"= the linears' inputs {kept_for_w['inputs']} (7·s·b·h·8) + their output gradients "
      f"{dy_bytes} (9·s·b·h·8) + the LayerNorms' dγ, dβ {kept_for_w['layernorms']} "
      f"(4·h·8); I freed {kept_for_w['freed at I']}")

# %% [markdown]
# So deferring W is not free: until it runs, a micro-batch keeps 7sbh of saved inputs
# *and* 9sbh of output gradients alive — here nearly what the forward kept. A pipeline
# counts that micro-batch as in flight until its W (the dry run does: +1 at F, −1 at W
# when the backward is split). Exercise 6.1 asks you to split an MLP's backward into
# these two halves.
#
# ## 2. ZB-H1: the cool-down filled with deferred W's
#
# 1F1B idles at the ramps: a rank waits for the first forward to reach it, for the first
# gradient to come back, and, in the cool-down, between its backwards for the gradients
# of the ranks after it. ZB-H1 keeps 1F1B's order of F's and I's, and on rank r holds back
# r W's, to run them in those cool-down gaps; and since the previous stage gets its
# gradient after I, not after a whole B, the gradient wave runs back faster too. The
# lists and their clock at p = 4, m = 6, t_F = t_I = t_W = 1:

# %%
print(format_schedule(schedule("zb_h1", p, 6)))
zb1 = dry_run(lower(schedule("zb_h1", p, 6)), UNIT)
print(render_pipeline(zb1))

# %% [markdown]
# On the clock, with t_B = t_I + t_W the full backward (DualPipe's README writes it so):
#
# - 1F1B idles **(p − 1)(t_F + t_B)** per rank;
# - ZB-H1 idles **(p − 1)(t_F + t_B − 2t_W)**: each of the p − 1 ramp slots shrinks by two
#   W's, one that no longer sits on the gradient's path, one that fills the slot. At
#   t_F = t_I = t_W it is (p − 1)·t, **a third** of 1F1B's (p − 1)·3t;
# - memory: rank r holds p − r micro-batches under 1F1B, p under ZB-H1 (it spends the
#   spare memory of the later ranks on deferred W's): **1F1B's peak**, p on rank 0.

# %%
zb_h1_table = {}
for t in ({"F": 1, "I": 1, "W": 1}, {"F": 3, "I": 2, "W": 1}, {"F": 1, "I": 1, "W": 2}):
    t_b = t["I"] + t["W"]
    one = dry_run(lower(schedule("1f1b", p, 8)), {"F": t["F"], "B": t_b})
    zb = dry_run(lower(schedule("zb_h1", p, 8)), t)
    formula = (p - 1) * (t["F"] + t_b - 2 * t["W"])
    zb_h1_table[tuple(t.values())] = (one.idle[0], zb.idle, formula, one.peak_in_flight,
                                      zb.peak_in_flight)
    print(f"t_F, t_I, t_W = {t['F']}, {t['I']}, {t['W']}: 1F1B idles {one.idle[0]} = (p - 1)"
          f"(t_F + t_B); ZB-H1 idles {zb.idle[0]} per rank, the formula says {formula}; in "
          f"flight 1F1B {one.peak_in_flight}, ZB-H1 {zb.peak_in_flight}")

# %% [markdown]
# The third line is where the formula breaks: with t_W > t_F (here t_W = 2, t_F = 1) it
# says 0, but a W longer than the slot it fills cannot be hidden, and the clock still
# gives (p − 1)·t_F. The formula holds when t_W ≤ t_F and t_W ≤ t_I.
#
# What if one splits the backward but runs every W straight after its I — a "split
# 1F1B", the first thing one writes? The gradient reaches the previous stage a W sooner,
# so the ramp shrinks by one t_W, not two:

# %%
split_1f1b = [[a for x in row for a in ((Action(x.stage, I, x.microbatch),
                                          Action(x.stage, W, x.microbatch))
                                         if x.kind.value == "B" else (x,))]
              for row in schedule("1f1b", p, 8)]
split_idle = dry_run(lower(split_1f1b), {"F": 3, "I": 2, "W": 1}).idle
print(f"split 1F1B at t_F, t_I, t_W = 3, 2, 1: idles {split_idle[0]} = (p - 1)(t_F + t_B - "
      f"t_W) = {(p - 1) * (3 + 3 - 1)}; ZB-H1 {zb_h1_table[(3, 2, 1)][1][0]}")

# %% [markdown]
# ## 3. ZB-H2 and ZB-V: no bubble between steps, for memory or for a V
#
# ZB-H2 lets each rank run more forwards before its first I — up to 2p − 1 micro-batches
# in flight — so that the start of the step is full too, and runs its W's where the I's
# thin out at the end: every rank busy from its first action to its last, a
# parallelogram. ZB-V gets there with 1F1B's memory by a placement: 2p stages, and rank r
# holds stage r and stage 2p − 1 − r, a V, so the last rank turns the forward around in
# its own memory and rank 0 holds both the first and the last stage:

# %%
v_place = placement(schedule("zbv", p, 8))
print("ZB-V placement, stage -> rank:", v_place)
print(f"rank r holds stages r and 2p - 1 - r: "
      f"{all(v_place[r] == v_place[2 * p - 1 - r] == r for r in range(p))}")
HALF = {"F": Fraction(1, 2), "I": Fraction(1, 2), "W": Fraction(1, 2), "B": 1}  # a chunk
flushed = {}
for name, t in (("zb_h1", UNIT), ("zb_h2", UNIT), ("zbv", HALF)):
    d = dry_run(lower(schedule(name, p, 8)), t)
    flushed[name] = (d.idle[0], d.bubble_over_ideal, d.steady_bubble_over_ideal,
                     d.peak_activations[0])
    print(f"{name:>5}: a flushed step idles {d.idle[0]} per rank (bubble {d.bubble_over_ideal}"
          f"); back-to-back steps: bubble {d.steady_bubble_over_ideal}; in flight "
          f"{d.peak_activations[0]} micro-batches of a rank's layers")

# %% [markdown]
# Read the two bubbles with care, because the papers' "zero" is the second:
#
# - **a flushed step**: every rank waits for the last one before the optimizer steps. Real
#   optimizer steps do synchronise — a global gradient-norm clip needs every rank's
#   gradients, a NaN/inf check must pass before the weights change — so the next step's
#   forwards cannot start until then. ZB-H2 and ZB-V still pay their ramp there,
#   (p − 1)·t_F per rank: at t_F = t_I = t_W, ZB-H2 idles exactly as much as ZB-H1.
# - **back-to-back steps**: the zero-bubble paper's *post-validation* (section 4) lets
#   each rank step its optimizer at once and checks the global conditions afterwards,
#   rolling the step back in the rare case one fails. Then rank r starts step n + 1 as soon
#   as it ends step n, every rank shifted by the same period, and the parallelograms of
#   consecutive steps fit into each other. Only there are ZB-H2's and ZB-V's bubbles 0.
#
# The price: ZB-H2 holds 2p − 1 micro-batches, about twice 1F1B's peak; ZB-V holds p of a
# rank's layers (2p chunk-micro-batches of half the layers each), 1F1B's peak, but sends
# twice the messages (2p − 1 stage boundaries, 2p − 2 of them between ranks).
#
# ## 4. DualPipeV: a forward and a backward at once
#
# DeepSeek-V3 trains a mixture of experts with PP = 16 and EP = 64. Its experts live on
# other nodes, so every MoE layer's forward and backward each run two all-to-alls
# (dispatch the tokens to their experts, combine the results); the report puts the
# ratio of computation to communication at about 1:1, which no amount of pipeline
# filling hides. DualPipe's answer is the **overlapped pair**: a rank runs the forward of one
# micro-batch and the backward of another at once, and while one's all-to-all is on the
# wire the other computes — the pair's communication runs on the communication stream
# behind the other half's compute. A pair takes t_F&B: t_F + t_B if nothing overlaps, down
# to t_B when the forward hides entirely.
#
# DualPipe itself is bidirectional: micro-batches enter the pipeline from both ends,
# through **two copies of the model** (rank r holds stage r of one copy and stage
# p − 1 − r of the other), so it keeps twice the parameters a device and sums the two
# copies' gradients before the step. DualPipeV, the "cut-in-half" variant, folds that
# into a V like ZB-V — one copy, 2p stages, rank r holds r and 2p − 1 − r — with the same
# pairs. minipar builds the V: its schedules are one chain of stages every micro-batch
# crosses, one copy of each stage's weights (docs/zero_bubble.md says what the
# bidirectional one would take).

# %%
print(format_schedule(schedule("dualpipev", p, 8))[:400] + " ...")
dual = {}
for fb in (3, 2):  # F&B per chunk: 3 = F + B (no overlap), 2 = B (the forward hidden)
    d = dry_run(lower(schedule("dualpipev", p, 8)), dict(HALF, **{"F&B": Fraction(fb, 2)}))
    formula = (p - 1) * (Fraction(fb, 2) + 1 - 3 * Fraction(1, 2))  # (PP/2 - 1)(F&B + B - 3W)
    dual[fb] = (d.idle, formula, d.peak_in_flight, d.makespan)
    print(f"F&B = {Fraction(fb, 2)} (a chunk's F = I = W = 1/2, B = 1): idle per rank "
          f"{[str(i) for i in d.idle]}; (PP/2 - 1)(F&B + B - 3W) = {formula}; in flight "
          f"{d.peak_in_flight} chunk-micro-batches = PP + 1 = {2 * p + 1}")
try:
    schedule("dualpipev", p, p)
except ScheduleError as e:
    dual_refusal = str(e)
print(f"m = p = {p}: {dual_refusal}")

# %% [markdown]
# DualPipe's README gives the bubble as (PP/2 − 1)(t_F&B + t_B − 3t_W) with PP = 2p
# stages: the last two ranks idle exactly that; earlier ranks run more pairs and idle
# less when the pair overlaps. Its memory is PP + 1 chunk-micro-batches on every rank
# (p + ½ of a rank's layers). The README's "2× parameters" counts stages of a PP-stage
# model: both DualPipe and DualPipeV hold two a device. What differs is the model's share:
# the bidirectional DualPipe's PP devices each hold 2/PP of it (two copies over PP
# devices), where 1F1B over the same PP devices holds 1/PP; DualPipeV's p = PP/2 devices
# each hold 2/PP = 1/p, exactly what 1F1B over p devices holds. And DualPipeV needs
# m ≥ 2p micro-batches: its steady state runs m − 2p + r + 1 times on rank r.
#
# ## 5. The schedules side by side on the clock
#
# p = 4 ranks, m = 8 micro-batches, the same layers a rank: a rank's layers take F = I =
# W = 2 (B = 4); the two-chunk schedules run a chunk (half the layers) in F = I = W = 1,
# B = 2; DualPipeV's pair takes F&B = 3 (no overlap) or 2 (the forward hidden).

# %%
WHOLE = {"F": 2, "I": 2, "W": 2, "B": 4}
CHUNK = {"F": 1, "I": 1, "W": 1, "B": 2}
RUNS = (("1F1B", "1f1b", None, WHOLE), ("interleaved 1F1B, v = 2", "interleaved_1f1b", 2, CHUNK),
        ("ZB-H1", "zb_h1", None, WHOLE), ("ZB-H2", "zb_h2", None, WHOLE),
        ("ZB-V", "zbv", None, CHUNK), ("DualPipeV, F&B = 3", "dualpipev", None,
                                       dict(CHUNK, **{"F&B": 3})),
        ("DualPipeV, F&B = 2", "dualpipev", None, dict(CHUNK, **{"F&B": 2})))
side, messages = {}, {}
print(f"{'schedule':<24}{'makespan':>9}{'idle/rank':>13}{'flushed':>9}{'steady':>8}"
      f"{'in flight':>10}{'sends':>7}")
for label, name, v, t in RUNS:
    lowered = lower(schedule(name, p, 8, v))
    d = dry_run(lowered, t)
    side[label] = d
    sent = sum(isinstance(a, Action) and a.kind.value.startswith("SEND") for row in lowered
               for a in row)
    messages[label] = sent
    idle = str(d.idle[0]) if len(set(d.idle)) == 1 else ",".join(map(str, d.idle))
    print(f"{label:<24}{str(d.makespan):>9}{idle:>13}{str(d.bubble_over_ideal):>9}"
          f"{str(d.steady_bubble_over_ideal):>8}{str(d.peak_activations[0]):>10}"
          f"{sent:>7}")
for label in ("1F1B", "ZB-H1", "ZB-V", "DualPipeV, F&B = 2"):
    print(f"\n{label}:\n{render_pipeline(side[label], ascii=True)}")

# %%
figures.timelines("06_schedules", f"Four schedules on one clock: p = {p}, m = 8, the same "
                  "layers a rank", {label: side[label] for label in
                                    ("1F1B", "ZB-H1", "ZB-V", "DualPipeV, F&B = 2")})
figures.bars("06_bubbles", "Bubble over the ideal time: one step flushed, or steps back "
             "to back", list(side), {"flushed": [d.bubble_over_ideal for d in side.values()],
                                     "back to back": [d.steady_bubble_over_ideal
                                                      for d in side.values()]},
             ylabel="bubble over the ideal time", annotate="{:.2f}")

# %% [markdown]
# "in flight" is rank 0's peak in micro-batches of a rank's layers (1F1B's rank r holds
# p − r; the zero-bubble schedules hold their peak on every rank). Reading the table:
#
# - ZB-H1 takes a third of 1F1B's bubble (6 against 18 per rank) at 1F1B's peak memory
#   and messages: the one to try first.
# - ZB-H2 reaches 0 only between back-to-back steps and holds 7 micro-batches, not 4.
# - ZB-V: a sixth of 1F1B's flushed bubble, 0 back to back, 1F1B's memory, 2× messages.
# - Interleaving (lesson 05) halves the bubble for 2.3× the messages and more memory.
# - DualPipeV's busy time falls with the overlap (a pair does F + B of work in F&B), which
#   is why its makespan drops below the others' 48 of compute: it is the only row that
#   makes the work itself shorter, and that is what hides an MoE's all-to-all.
#
# ## 6. The trap: W runs after "the backward"
#
# A data-parallel engine reduces gradients when the backward is done: DDP's hooks fire as
# autograd produces each gradient, Megatron calls `finalize_model_grads` after the last
# micro-batch's backward. With a split backward the last I is not the end: rank r still
# has W's to run after its last I. torch's pipelining ran W outside autograd, so DDP's
# gradient hooks never fired for those weight gradients (pytorch issue 144530): the
# reduced gradients missed part of the step. The dry run's clock shows how much each rank
# still owes after its last I:

# %%
trap = dry_run(lower(schedule("zb_h1", p, 8)), UNIT)
owed = []
for r, spans in enumerate(trap.timeline):
    last_i = max(sp.end for sp in spans if isinstance(sp.action, Action)
                 and sp.action.kind == I)
    late = [sp.action for sp in spans if isinstance(sp.action, Action)
            and sp.action.kind == W and sp.end > last_i]
    owed.append(len(late))
    print(f"rank {r}: last I ends at {last_i}; {len(late)} W's run after it "
          f"({' '.join(map(str, late))}): a reduction fired at the last I misses "
          f"{len(late)} of the m = 8 micro-batches' weight gradients")

# %% [markdown]
# Rank r owes r + 1 W's: its last I's own W and the r it deferred, so the last stage's
# reduction would miss the most. The rule: reduce a parameter's gradient after its *last
# W*, and let the pipeline runner, not autograd, say when that is. minipar's runner runs
# its list inside the engine's `no_sync()` and calls `grads_ready()` after the whole
# list, the last W included (a unit's `backward_post` hook fires at its W, not its I).
# A ZB-H1 step on 2 pipeline ranks × 2 data-parallel replicas under DDP, with when each
# rank's last I and last W end and when its data-parallel all-reduces start, read from
# the trace; and the loss against one device's on the same batch:

# %%
dims = ParallelDims(dp_replicate=2, pp=2)
ids6, tgt6 = (np.random.default_rng(3).integers(0, cfg.vocab_size, (s, 8)) for _ in range(2))


def zb_program(ctx):
    run6 = parallelize(cfg, dims, zero=0, schedule="zb_h1", microbatches=4, lr=1e-3)
    dp = tuple(run6.groups.dp.ranks)
    first = len(ctx.trace.events)  # the step's events only
    loss = run6.forward_backward(ids6, tgt6)
    step = ctx.trace.events[first:]
    last = {k: max(e.end for e in step if e.meta.get("kind") == k) for k in ("I", "W")}
    dp_starts = [e.start for e in step if e.stream == "comm" and e.group == dp]
    return loss, last, dp_starts, run6.groups.coordinate


SLOW = mp.DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s: compute > a message
zb_run = mp.launch(zb_program, dims.world_size,
                   topology=mp.Topology.single_node(dims.world_size, device=SLOW))
with mp.device():
    loss_one = GPT(cfg).loss_and_grad(ids6, tgt6)
zb_blocks = {c[3]["dp_replicate"]: c[0] for c in zb_run}  # each dp block's mean loss
print(f"the two dp blocks' mean loss {np.mean(list(zb_blocks.values())):.15f}; one device "
      f"{loss_one:.15f}")
for r, (loss6, last, starts, coord) in enumerate(zb_run):
    print(f"rank {r} (pp {coord['pp']}, dp {coord['dp_replicate']}): last I ends "
          f"{last['I'] * 1e3:6.3f} ms, last W {last['W'] * 1e3:6.3f} ms; {len(starts)} dp "
          f"all-reduce(s) from {min(starts) * 1e3:6.3f} ms")

# %% [markdown]
# Every all-reduce starts after the rank's last W. (`tests/parallel/mesh/
# test_pipeline_engines.py` builds the wrong order on purpose — the reduction at the
# last I — and shows its gradients wrong; DDP, ZeRO-1 and ZeRO-3 all reduce at W.)
#
# ## 7. A design exercise: a schedule and m within two budgets
#
# Sections 2–5 are prices: ZB-H1 cuts the bubble at no memory, ZB-H2 removes it between
# steps at twice the memory, ZB-V removes it with a V and twice the messages, DualPipeV
# needs 2p micro-batches and holds p + ½. Exercise 6.3 asks for (schedule, m, chunks) on
# p = 4 ranks, 32 sequences a step, micro-batches of at least 2 sequences, t_F = t_I = t_W
# (F&B = 1.5) for a rank's layers, under an activation cap counted in sequences through a
# rank's layers (micro-batches in flight × sequences a micro-batch), graded on the dry
# run, and by one training step through `parallelize` that must give one device's loss.
# Two plans that miss the first puzzle (a flushed step, a 10 % bubble, 8 sequences),
# measured as the grader measures them:

# %%
PUZZLE = dict(pp=4, global_batch=32, min_microbatch=2, bubble_target=0.10, activation_cap=8)
missed = {}
for name, t in (("1f1b", {"F": 1, "B": 2}), ("zb_h2", UNIT)):
    d = dry_run(lower(schedule(name, 4, 16)), t)
    missed[name] = (d.bubble_over_ideal, max(d.peak_activations) * 2)
    print(f"{name} with m = 16: bubble {100 * float(d.bubble_over_ideal):.2f} % (target 10 %),"
          f" activations {max(d.peak_activations) * 2} sequences (cap 8)")

# %% [markdown]
# 1F1B fits the memory and misses the bubble; ZB-H2 meets the bubble and misses the
# memory. The grader asks a second question too (back-to-back steps, a 1 % bubble, 16
# sequences), so write the reasoning, not one answer.
#
# ## Exercises
#
# Open `exercise.py` in this directory, replace each `raise NotImplementedError(...)` with
# your answer, and run `minipar grade 06`.
#
# - **Exercise 6.1** — `mlp_backward_input(mlp, dy, saved) -> (dx, kept)` and
#   `mlp_backward_weight(mlp, kept) -> (dW1, db1, dW2, db2)`: an MLP's backward in two
#   halves (section 1). Graded bit for bit against the fused `mlp.backward`, by the FLOPs
#   each half charges (I computes no weight gradient, W recomputes no input gradient), by
#   the bytes I keeps for W, and by the ledger after each half.
# - **Exercise 6.2** — `zb_h1(pp, microbatches) -> list[list[Action]]`: the ZB-H1
#   schedule (section 2), graded by the rules and never against minipar's list: the
#   validator, the dry run's deadlock check, 1F1B's peak memory min(p, m) on every rank,
#   and the bubble (p − 1)(t_F + t_B − 2t_W) on the clock at equal and uneven durations.
# - **Exercise 6.3** (design) — `choose_zero_bubble(pp, global_batch, min_microbatch,
#   durations, activation_cap, bubble_target, back_to_back) -> {"schedule",
#   "microbatches", "chunks"}`: section 7's puzzle and the back-to-back one, graded by the
#   dry run's bubble and micro-batches in flight, and one training step of a small GPT
#   through `parallelize` against one device's loss.
#
# ## Summary
#
# - A linear layer's backward is dX = dY·W (I, on the critical path: the previous stage
#   waits for it) and dW = dYᵀ·X (W, waited for by the optimizer only); I + W = B. A block
#   has more I than W (the attention core has no weights). Deferring W keeps each
#   linear's input and output gradient alive until it runs.
# - ZB-H1 defers r W's on rank r into the cool-down: a bubble of (p − 1)(t_F + t_B − 2t_W),
#   a third of 1F1B's at equal times, at 1F1B's peak memory; with t_W > t_F the formula
#   undercounts.
# - ZB-H2 (2p − 1 in flight) and ZB-V (a V placement, 1F1B's memory, 2× messages) reach a
#   zero bubble between back-to-back steps — with post-validation of the optimizer step —
#   and still pay their ramp in a flushed step.
# - DualPipeV overlaps a forward with a backward, hiding one's communication (an MoE's
#   all-to-all) behind the other's compute: a bubble of (PP/2 − 1)(t_F&B + t_B − 3t_W),
#   PP + 1 chunk-micro-batches in flight, m ≥ 2p. DeepSeek-V3 used the bidirectional
#   DualPipe (PP = 16), at 2× parameters; the V variant keeps one copy.
# - A data-parallel reduction must wait for a parameter's last W, not the last I.
