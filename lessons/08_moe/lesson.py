# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 08 — Mixture of experts and expert parallelism
#
# Replace a block's MLP with E experts and a router that sends each token to k of them: how the router chooses, which tokens a full expert drops, how the balancing losses are normalised and weighted, the all-to-all that moves rows to the experts' ranks, the 1/ep of an expert's gradient, and what "671B total, 37B active" means.
#
# A mixture of experts (MoE) grows the parameters E-fold and the work per token only
# k-fold. The price is paid in details: a discrete choice with no gradient, experts that
# drop what exceeds their capacity, balancing losses whose normalisation and weight are
# easy to get wrong, and, once the experts live on different GPUs (expert parallelism,
# EP), two all-to-alls a layer and an expert's gradient with its own reduction.
#
# minipar's pieces: `minipar/nn/moe/`, `minipar/parallel/ep/` and `parallelize` for dp × ep
# (`docs/moe.md`). The papers: GShard (Lepikhin et al. 2020), Switch Transformer (Fedus et
# al. 2021), ST-MoE (Zoph et al. 2022), DeepSeek-V3 (DeepSeek-AI 2024, section 2.1.2).
# Everything below runs in float64 on simulated devices.

# %%
import numpy as np

import minipar as mp
from minipar.data.batches import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.nn.moe import (MoE, MoEConfig, TopKRouter, aux_loss_of, capacity, expert_counts,
                            plan_routing, sequence_aux_loss, switch_aux_loss,
                            update_expert_bias, z_loss)
from minipar.nn.moe.router import scores_of
from minipar.nn.saved import release_all
from minipar.optim import AdamW, clip_grad_norm_
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.ep import ExpertParallelMoE
from minipar.plan import model_state_bytes
from minipar.plan.moe import DEEPSEEK_V3
from minipar.runtime.cost import BUSBW_FACTOR, bytes_sent, collective_cost
from minipar.viz import figures

np.set_printoptions(precision=3, suppress=True)
H = 8  # the hidden size of every tiny example

# %% [markdown]
# ## 1. Routing: scores, the top k, the weights
#
# The router is one matrix W_r [E, h]: logits = x W_rᵀ. Scores come from the logits by a
# softmax over the experts (GShard, Switch, Mixtral) or an elementwise sigmoid
# (DeepSeek-V3); each token picks the k experts of highest score, and its weights are
# those k scores, normalised to sum to 1. Eight experts, k = 2, four tokens, one matrix
# scored both ways:

# %%
E, K = 8, 2
x = np.random.default_rng(0).standard_normal((4, H))  # x: [T, h]
routers, out = {}, {}
with mp.device():
    for name, kw in (("softmax", {}), ("sigmoid", {"score_function": "sigmoid"}),
                     ("grouped", {"num_groups": 4, "topk_groups": 1}), ("biased", {})):
        routers[name] = TopKRouter(f"router.{name}", H, E, K, seed=1, std=0.5, **kw)
        routers[name].linear.weight.data[...] = routers["softmax"].linear.weight.data
    routers["biased"].expert_bias[5] = 0.3  # a selection bias on expert 5
    for name, router in routers.items():
        w, top, saved = router.forward(x)
        out[name] = (w, top, saved.logits, saved.scores)
        release_all(saved)
(w_soft, top_soft, logits, _), (w_sig, top_sig, _, _) = out["softmax"], out["sigmoid"]
softmax_of_chosen = scores_of(np.take_along_axis(logits, top_soft, axis=-1), "softmax")
for t in range(len(x)):
    print(f"token {t}: softmax picks {top_soft[t]} w {w_soft[t]}   sigmoid picks "
          f"{top_sig[t]} w {w_sig[t]}")
print("softmax weights = softmax of the k chosen logits:", np.allclose(w_soft, softmax_of_chosen))

# %% [markdown]
# Both score functions increase with the logit, so they pick the same experts; the
# weights differ. Sigmoid scores are not a distribution (the experts compete only in the
# top-k), and normalising the k chosen ones makes the weights. With softmax and
# normalisation the weights are a softmax over the k chosen logits alone (Megatron-LM's
# default, and Mixtral's): the other E − k logits do not matter.
#
# DeepSeek-V3's **selection bias** b_i is added to the scores for the choice only. Above,
# the "biased" router adds b = 0.3 to expert 5; a token that now picks it still weighs it
# by its *score*:

# %%
w_bias, top_bias, _, scores = out["biased"]
bias = routers["biased"].expert_bias
for t in np.flatnonzero([5 in b and 5 not in a for a, b in zip(top_soft, top_bias)]):
    g, gb = scores[t, top_bias[t]], scores[t, top_bias[t]] + bias[top_bias[t]]
    print(f"token {t}: now picks {top_bias[t]}, weights {w_bias[t]} = scores {g} / "
          f"{g.sum():.3f}; with the bias in them: {gb / gb.sum()}")

# %% [markdown]
# A bias that also weighed would change what the layer computes, and the model would
# learn around it; used for the choice alone, it moves load between experts and nothing
# else. The choice itself is a step function of the scores, so no gradient flows through
# it: the router learns only through the weights (and the balancing losses below).
#
# **Group-limited routing** (DeepSeek-V3) splits the experts into G groups — one group a
# node when experts are spread over nodes — scores each group by the sum of its two best
# scores, keeps the best M groups and chooses the k experts inside them. The "grouped"
# router: four groups of two, M = 1, so every token's experts sit in one group.

# %%
top_grouped = out["grouped"][1]
for t in range(len(x)):
    print(f"token {t}: free {top_soft[t]} in groups {top_soft[t] // 2}, limited "
          f"{top_grouped[t]} in groups {top_grouped[t] // 2}")

# %% [markdown]
# ## 2. Capacity and dropped tokens
#
# A GPU kernel wants fixed shapes, so each expert takes at most
#
#     C = ceil(k · T / E · capacity_factor)
#
# of the T·k (token, choice) pairs of a forward; the even share is k·T/E. The pairs over C
# are dropped: they add nothing, and their token keeps only its residual stream (and any
# shared expert). Which pairs: `"probs"` keeps the C of highest weight (Megatron-LM's
# default), `"position"` the first C in token order (GShard, Switch). `capacity_factor =
# None` is dropless. A skewed batch of 12 tokens, E = 4, k = 2, factor 1.0:

# %%
T, E2 = 12, 4
with mp.device():
    skewed = TopKRouter("router.skewed", H, E2, K, seed=4, std=0.5)
    lean = skewed.linear.weight.data[0] / np.linalg.norm(skewed.linear.weight.data[0])
    xs = np.random.default_rng(1).standard_normal((T, H)) + lean  # every token leans to 0
    w_skew, top_skew, s3 = skewed.forward(xs)
    release_all(s3)
C = capacity(T, E2, K, 1.0)
plans = {p: plan_routing(top_skew, w_skew, E2, C, p) for p in ("probs", "position")}
print(f"C = ceil({K}·{T}/{E2} · 1.0) = {C}; choices per expert {expert_counts(top_skew, E2)}")
print("token  experts  weights       kept by probs  kept by position")
for t in range(T):
    print(f"{t:>5}  {top_skew[t]}    {w_skew[t]}   {plans['probs'].kept[t].astype(int)}"
          f"          {plans['position'].kept[t].astype(int)}")
for p, plan in plans.items():
    print(f"{p:>8}: {plan.dropped} pairs dropped, kept per expert {plan.counts}, tokens "
          f"with nothing kept {np.flatnonzero(~plan.kept.any(axis=1)).tolist()}")
dropless = plan_routing(top_skew, w_skew, E2)
padded = plan_routing(top_skew, w_skew, E2, C, pad=True)
print(f"dropless: rows per expert {dropless.rows_per_expert}; padded to C: "
      f"{padded.rows_per_expert}, {int((padded.tokens < 0).sum())} of {len(padded.tokens)} "
      f"rows are zeros")

# %% [markdown]
# Expert 0 is chosen far more often than it can keep, the last expert by nobody. "probs"
# drops the weakest votes for expert 0 wherever they sit; "position" drops whoever comes last, here
# a token that loses both of its experts. Dropless keeps everything and lets the blocks
# be uneven (grouped GEMMs handle it); padding keeps the shapes fixed and runs E·C rows
# whatever the load: the zero rows cost FLOPs, not results. Capacity is counted over the
# tokens of one forward, so a layout routing other groups of tokens drops other pairs.
# **Exercises 8.1 and 8.2** build the row order and the kept pairs.

# %% [markdown]
# ## 3. The balancing losses
#
# With f_i the fraction of the T·k choices that went to expert i and P_i the mean
# probability the router gave it, the auxiliary loss (GShard, Switch) is
# L = α · E · Σ_i f_i P_i, f_i = c_i / (T·k). At perfect balance f_i = P_i = 1/E and
# L = α. The k in f_i is Megatron-LM's normalisation for top-k: counting c_i / T instead
# puts the balanced value at α·k, so a coefficient tuned for top-1 would be k times too
# strong at top-k.

# %%
ALPHA, S_, B_ = 0.01, 4, 2  # tokens are [s, b] flattened: token t = i_s·b + i_b
i_s = np.arange(S_ * B_) // B_
balanced = np.stack([i_s % 4, (i_s + 1) % 4], axis=1)  # each sequence uses each expert twice
uniform = np.full((S_ * B_, 4), 0.25)
aux_balanced, _ = switch_aux_loss(uniform, balanced, ALPHA)
seq_balanced, _ = sequence_aux_loss(uniform, balanced, S_, ALPHA)
without_k = ALPHA * 4 * float(np.dot(expert_counts(balanced, 4) / (S_ * B_), uniform.mean(0)))
print(f"balanced: aux {aux_balanced:.4f}, sequence-wise {seq_balanced:.4f} (alpha = {ALPHA}); "
      f"with f_i = c_i / T it would be {without_k:.4f} = alpha · k")

# %% [markdown]
# DeepSeek-V3 adds a **sequence-wise** loss: the same product inside each sequence,
# averaged over sequences. The two see different imbalance. Below, sequence 0 sends all
# its tokens to experts 0 and 1, sequence 1 to experts 2 and 3, each with high
# probability: the batch is perfectly even, each sequence is not.

# %%
split = np.where((np.arange(S_ * B_) % B_ == 0)[:, None], [0, 1], [2, 3])  # [T, k]
logits_split = np.zeros((S_ * B_, 4))
np.put_along_axis(logits_split, split, 3.0, axis=-1)
probs_split = scores_of(logits_split, "softmax")
aux_split, _ = switch_aux_loss(probs_split, split, ALPHA)
seq_split, _ = sequence_aux_loss(probs_split, split, S_, ALPHA)
print(f"batch-even, sequence-skewed: aux {aux_split:.4f}, sequence-wise {seq_split:.4f}")

# %% [markdown]
# The router **z-loss** (ST-MoE) is α · mean_t (logsumexp_i logits_ti)²: it keeps the
# logits small, where bf16 stores them finely (its steps grow with the magnitude) and the
# router trains stably. Softmax ignores a common shift of the logits, so the choice, the
# weights and the balancing loss cannot see one; the z-loss does:

# %%
for shift in (0.0, 10.0):
    zl, _ = z_loss(logits_split + shift, 0.001)
    same = np.allclose(scores_of(logits_split + shift, "softmax"), probs_split)
    print(f"logits + {shift:>4}: z-loss {zl:.6f}, softmax unchanged: {same}")

# %% [markdown]
# ## 4. Balancing without a loss: the bias over steps
#
# DeepSeek-V3's auxiliary-loss-free balancing moves the selection bias after each step:
# b_i += γ · sign(mean load − load_i). An overloaded expert becomes harder to pick, an idle
# one easier; no gradient is involved, and the weights never see b. Each bias moves by γ
# every step, so the load settles near even and then jitters by a step's worth; replicas
# must sum their counts over dp first, or their biases drift apart (parallelize does).
# A router whose 256 tokens all lean toward expert 0, E = 8, k = 2, γ = 0.005; the
# busiest expert's load over the idlest's:

# %%
with mp.device():
    biased = TopKRouter("router.bias", H, 8, K, seed=2, std=0.5)
    lean = biased.linear.weight.data[0] / np.linalg.norm(biased.linear.weight.data[0])
    tokens = np.random.default_rng(2).standard_normal((256, H)) + 1.5 * lean
    load_ratio, loads = [], []
    for step in range(80):
        _, chosen, s4 = biased.forward(tokens)
        release_all(s4)
        load = expert_counts(chosen, 8)
        loads.append(load)
        load_ratio.append(load.max() / max(load.min(), 1))
        biased.expert_bias = update_expert_bias(biased.expert_bias, load, 0.005)
print("max/min load at steps 0, 10, ..., 70:", [round(float(r), 2) for r in load_ratio[::10]])
print(f"the last 10 steps: at most {max(load_ratio[-10:]):.2f}; bias {biased.expert_bias}")

# %%
figures.bars("08_expert_load", "Tokens per expert: a skewed router, then the bias at work "
             "(256 tokens, k = 2)", [f"expert {e}" for e in range(8)],
             {"step 0": loads[0], f"step {len(loads) - 1}": loads[-1]},
             ylabel="(token, expert) pairs", annotate="{:.0f}",
             hline=(256 * K / 8, f"even: {256 * K // 8}"))
figures.lines("08_load_ratio", "The busiest expert's load over the idlest's, step by step",
              list(range(len(load_ratio))), {"max/min load": load_ratio},
              xlabel="step", ylabel="max / min load", hline=(1, "even"))

# %% [markdown]
# ## 5. The losses' weight under gradient accumulation
#
# The objective of a step of m micro-batches is the mean over them of CE + the balancing
# losses. The backward weights each micro-batch's cross-entropy by 1/m; the balancing
# losses' gradients enter inside the MoE layer's backward and must get the same 1/m
# (minipar passes it as `loss_scale`; Megatron-LM keeps it in `MoEAuxLossAutoScaler`).
# A router gradient against a finite difference of that objective, and with the 1/m
# planted out (`MoE.takes_loss_scale = False`: the losses at weight 1). Only the balancing
# part is then m times too large, so the error is no constant factor: the router is pushed
# toward balance harder than the objective says, the more so the more micro-batches.

# %%
ACC = GPTConfig(vocab_size=16, seq_len=4, hidden=H, num_heads=2, num_layers=1, ffn_hidden=8,
                init_std=0.3, seed=0, moe=MoEConfig(num_experts=4, top_k=2,
                                                    aux_loss_coeff=0.5, z_loss_coeff=0.1))
data = np.random.default_rng(3).integers(0, 16, (2, 4, 6))  # ids, targets: [s, B]
M = 3
with mp.device():
    model = GPT(ACC)
    router_w = next(p for p in model.parameters() if p.name.endswith("router.weight"))
    grads = {}
    for planted in (False, True):
        MoE.takes_loss_scale = not planted
        for ids, tgt in split_microbatches(data[0], data[1], M):
            model.loss_and_grad(ids, tgt, loss_scale=1 / M)
        grads[planted] = router_w.grad.copy()
        model.zero_grad()
    MoE.takes_loss_scale = True
    at, eps, objective = (1, 3), 1e-6, []
    for sign in (1, -1):
        router_w.data[at] += sign * eps
        total = 0.0
        for ids, tgt in split_microbatches(data[0], data[1], M):
            loss, cache = model.forward(ids, tgt)
            release_all(cache)
            total += (loss + aux_loss_of(model)) / M
        router_w.data[at] -= sign * eps
        objective.append(total)
fd = (objective[0] - objective[1]) / (2 * eps)
print(f"dJ/dW_r{at}: finite difference {fd:.10f}, minipar {grads[False][at]:.10f}, "
      f"without the 1/m {grads[True][at]:.10f}")
accum_err = np.abs(grads[True] - grads[False]).max() / np.abs(grads[False]).max()
print(f"the planted bug moves the router's gradient by {accum_err:.0%} of its largest entry")

# %% [markdown]
# Over which tokens is the balance measured? Each forward computes the losses on the
# tokens it routes: under data parallelism, one rank's block of one micro-batch. The mean
# of the ranks' E·Σ f_i·P_i is not the global batch's (a mean of products is not a
# product of means), and a small block measures balance noisily. Megatron-LM's
# `global_aux_loss` sums the counts c_i over the data-parallel ranks before the loss, keeps
# each rank's own P, and the averaged gradients are then those of one device routing every
# rank's tokens at once; here `MoEConfig(global_aux_loss=True)`, proven against that
# device in tests/parallel/mesh/test_moe.py. On four blocks of drawn routing:

# %%
draw = np.random.default_rng(8)
blocks = []
for r in range(4):  # each block favours another expert
    block_logits = draw.standard_normal((16, 4)) + 2.0 * np.eye(4)[r]  # [16, E]
    block_probs = np.exp(block_logits) / np.exp(block_logits).sum(axis=1, keepdims=True)
    blocks.append((block_probs, np.argsort(-block_probs, axis=1)[:, :2]))
all_probs = np.concatenate([p for p, _ in blocks])
all_topk = np.concatenate([t for _, t in blocks])
whole = switch_aux_loss(all_probs, all_topk, 1.0)[0]
local = np.mean([switch_aux_loss(p, t, 1.0)[0] for p, t in blocks])
summed = expert_counts(all_topk, 4)
global_ = np.mean([switch_aux_loss(p, t, 1.0, summed)[0] for p, t in blocks])
print(f"the global batch's loss {whole:.4f}; the mean of the blocks' own {local:.4f}; "
      f"with the counts summed over the blocks {global_:.4f}")

# %% [markdown]
# ## 6. Expert parallelism: the all-to-all dispatch
#
# With ep ranks, rank p holds experts p·L .. p·L + L − 1 (L = E/ep) and routes its own
# tokens. Megatron-LM's all-to-all dispatcher then (a) permutes the rows by global expert,
# (b) all-to-alls the counts — a rank cannot size what it receives before the others say
# what they send — (c) all-to-alls the rows with uneven splits, and (d) sorts them from
# (source, expert) to (expert, source), one block per local expert. After the experts the
# combine runs (d) and (c) backwards. Four ranks, E = 8, 12 tokens each:

# %%
EP = 4


def dispatch_step(ctx):
    g = mp.new_group(list(range(EP)), "ep")
    layer = ExpertParallelMoE("moe", H, 16, 8, K, group=g, seed=3, std=0.5)
    x = np.random.default_rng(10 + ctx.rank).standard_normal((4, 3, H))  # [s, b, h]
    first = len(ctx.trace.events)
    y, saved = layer.forward(x)
    ctx.resolve_pending()
    record = saved[3][0]  # the dispatcher's record: splits and counts
    events = [(e.name, e.nbytes, e.meta["sent_bytes"], e.meta["busbw"] / e.meta["algbw"])
              for e in ctx.trace.events[first:] if e.stream == "comm"]
    return (layer.last_plan.rows_per_expert, record.input_splits, record.output_splits,
            record.num_global_tokens_per_local_expert, events)


a2a = mp.launch(dispatch_step, EP)
for r, (rows, sent_splits, recv_splits, per_local, events) in enumerate(a2a):
    print(f"rank {r}: rows per expert {rows}, sends {sent_splits}, receives {recv_splits}, "
          f"per (source, local expert) {per_local.tolist()}")
    print("        " + "; ".join(f"{n} S={s} sent={b:.0f} (busbw/algbw {f:.2f})"
                                 for n, s, b, f in events))

# %%
figures.bars("08_dispatch", f"The dispatch's rows per expert, by the rank they come from "
             f"(ep = {EP}, E = 8)", [f"expert {e} on rank {e // (8 // EP)}" for e in range(8)],
             {f"from rank {r}": got[0] for r, got in enumerate(a2a)},
             ylabel="rows (token, expert) received", stacked=True, annotate="{:.0f}")

# %% [markdown]
# Each rank's three collectives: the counts (E int64s, of which it keeps its own L), the
# rows (its R rows of h float64s), and the rows coming back. The trace counts what a rank
# put on the wire: its rows for the other ranks, not the ones it keeps; for the rows out,
# that is (R − rows for itself) · h · 8 bytes. Under uniform routing a rank keeps 1/n of
# its rows, so an all-to-all sends (n − 1)/n of S, the factor nccl-tests uses for busbw.
# At DeepSeek-V3's width (h = 7168, k = 8, bf16) with 4096 tokens a rank, from the cost
# model, the dispatch's rows inside one node of 8 and over 4 nodes of 8:

# %%
S_rows = 4096 * 8 * 7168 * 2  # bytes of one rank's rows
ep_cost = {}
for nodes, n in ((1, 8), (4, 32)):
    topo = mp.Topology.nodes(nodes, gpus_per_node=8)
    even = [[S_rows / n] * n for _ in range(n)]  # uniform routing: S/n to every rank
    c = collective_cost("all_to_all", S_rows, list(range(n)), topo, traffic=even)
    ep_cost[n] = (bytes_sent("all_to_all", "ring", S_rows, n, 0, traffic_row=even[0]),
                  c.seconds)
    print(f"ep = {n:>2} on {nodes} node(s): a rank sends {ep_cost[n][0] / 1e6:.0f} MB = "
          f"{BUSBW_FACTOR['all_to_all'](n):.3f} of S = {S_rows / 1e6:.0f} MB; "
          f"{c.seconds * 1e3:.2f} ms on {c.link}")

# %% [markdown]
# Across nodes most rows ride InfiniBand, four all-to-alls a layer (dispatch and combine,
# forward and backward), idle time unless a schedule overlaps them (DualPipe, lesson 06).
# Hence group-limited routing: with one group a node, a token reaches at most M nodes, and
# a dispatcher that sends it once a node and fans it out over NVLink (DeepSeek-V3's; here
# one row goes per (token, expert)) puts at most M copies on InfiniBand instead of k. Load
# matters as much as bytes: an all-to-all ends with its busiest rank, and a hot expert
# makes its whole ep group wait — a straggler made by the router.

# %% [markdown]
# ## 7. EP on the mesh: dp × ep and the 1/ep
#
# Megatron-LM folds expert parallelism into data parallelism: an ep group's ranks are
# data-parallel ranks, each with its own batch block, sharing the experts. A dense
# parameter (router, attention) is averaged over dp. An expert lives on dp/ep ranks, the
# **edp** group, and its owner computed its gradient from the rows all ep ranks sent it:
# the *sum* of ep data-parallel shares. Averaged over edp, that is ep times one device's
# average over dp: hence the 1/ep (`expert_gradient_scaling_factor`). dp = 4, ep = 2,
# against one device that routes each rank's block on its own (capacity is per forward):

# %%
MOE = GPTConfig(vocab_size=16, seq_len=4, hidden=H, num_heads=2, num_layers=2, ffn_hidden=8,
                init_std=0.3, seed=0, moe=MoEConfig(num_experts=4, top_k=2,
                                                    aux_loss_coeff=0.05))
DIMS = ParallelDims(dp_replicate=4, ep=2)
batch = np.random.default_rng(4).integers(0, 16, (3, 2, 4, 8))  # 3 steps of (ids, targets)
EXPERT = "blocks.0.mlp.experts.0.fc1.weight"


def dp_ep(ctx, scale, steps):
    run = parallelize(MOE, DIMS, lr=1e-2, max_grad_norm=0.1, placement="any")
    for b in run.engine.buckets:
        if b.scale != 1.0:  # the expert buckets: 1/ep, or a planted value
            b.scale = scale
    g = run.groups
    where = (list(g.ep.ranks), list(g.edp.ranks), run.model.blocks[0].mlp.experts.expert_ids)
    run.forward_backward(*batch[0])
    grad = {p.name: p.grad.copy() for p in run.model.parameters() if p.grad is not None}
    run.step()
    for ids, tgt in batch[1:steps]:
        run.train_step(ids, tgt)
    return where, grad, {p.name: p.data.copy() for p in run.model.parameters()}


runs = {scale: mp.launch(lambda ctx: dp_ep(ctx, scale, 3), 4) for scale in (1 / DIMS.ep, 1.0)}
with mp.device():
    one = GPT(MOE)
    opt = AdamW(one.parameters(), lr=1e-2)
    for step, (ids, tgt) in enumerate(batch):
        for d in range(4):
            one.loss_and_grad(*split_data_parallel(ids, tgt, d, 4), loss_scale=1 / 4)
        for p in one.parameters():  # an expert no token chose: a zero gradient, as DDP's
            if p.grad is None:
                p.accumulate(np.zeros_like(p.data))
        if step == 0:
            want_grad = {p.name: p.grad.copy() for p in one.parameters()}
        clip_grad_norm_(one.parameters(), 0.1)
        opt.step()
        opt.zero_grad()
    want = {p.name: p.data.copy() for p in one.parameters()}
for r, (where, _, _) in enumerate(runs[1 / DIMS.ep]):
    print(f"rank {r}: ep group {where[0]}, edp group {where[1]}, experts {where[2]}")
ratio = {s: runs[s][0][1][EXPERT] / want_grad[EXPERT] for s in runs}
drift = {s: max(np.abs(v - want[n]).max() for res in runs[s] for n, v in res[2].items())
         for s in runs}
for s in runs:
    print(f"scale {s}: expert 0's gradient / one device's in [{ratio[s].min():.3f}, "
          f"{ratio[s].max():.3f}]; after 3 clipped AdamW steps the weights differ by "
          f"{drift[s]:.1e}")

# %% [markdown]
# With 1/ep the layout is one device, to rounding; without it the experts' gradients are
# exactly ep times too large. Adam alone would hide a constant factor on a parameter
# (it divides by the gradient's own scale); the clipped global norm does not, and the run
# drifts from the first step. **Exercise 8.3** writes this reduction.

# %% [markdown]
# ## 8. Active and total parameters
#
# `num_parameters()` counts every expert; `num_active_parameters()` counts what one token
# runs through: the router, the shared experts and k of the E routed ones. A tiny model
# with an MoE in every second block:

# %%
TINY = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=4,
                 moe=MoEConfig(num_experts=8, top_k=2, moe_every=2))
tiny = (TINY.num_parameters(), TINY.num_active_parameters(),
        TINY.with_(moe=None).num_parameters())
print(f"total {tiny[0]:,}, active {tiny[1]:,}, the dense model {tiny[2]:,}")

# %% [markdown]
# DeepSeek-V3's report gives **671B parameters in total and 37B activated per token**
# (published figures). `minipar.plan.moe` counts its published architecture as it is
# built: multi-head latent attention (low-rank query and key-value projections), SwiGLU
# feed-forward layers of three matrices without biases, 61 blocks of which the first 3 are
# dense (width 18432), 256 routed experts and 1 shared in each of the others, each of width
# 2048, top 8, a vocabulary of 129,280, RMSNorm gains. Counted, not typed in:

# %%
v3_total, v3_active = DEEPSEEK_V3.total_parameters(), DEEPSEEK_V3.active_parameters()
v3 = (v3_total / 1e9, v3_active / 1e9)
v3_states = model_state_bytes(v3_total, 0, 1)["total"] / 1e12  # bf16 + Adam, 16 B a weight
v3_flops = DEEPSEEK_V3.flops_per_token()  # training FLOPs a token, weights only
print(f"DeepSeek-V3 counted: {v3_total:,} total ({v3[0]:.1f}B), {v3_active:,} active "
      f"({v3[1]:.1f}B, {v3_active / v3_total:.1%} of the weights a token); model states "
      f"{v3_states:.1f} TB; {v3_flops:.2e} training FLOPs a token")

# %% [markdown]
# minipar's trainable GPT has plain multi-head attention, learned positions and two-matrix
# MLPs with biases. The same widths in a GPTConfig (a SwiGLU of width f holds the weights
# of a two-matrix MLP of width 1.5 f, so the widths are 1.5 times the published ones) give
# a neighbour, not the model: the attention alone differs by billions.

# %%
V3 = GPTConfig(vocab_size=129280, seq_len=4096, hidden=7168, num_heads=128, num_layers=61,
               ffn_hidden=18432 * 3 // 2, dtype="bfloat16",
               moe=MoEConfig(num_experts=256, top_k=8, first_dense=3, ffn_hidden=2048 * 3 // 2,
                             shared_ffn_hidden=2048 * 3 // 2, score_function="sigmoid",
                             num_groups=8, topk_groups=4, scaling_factor=2.5))
v3_gpt = (V3.num_parameters() / 1e9, V3.num_active_parameters() / 1e9)
print(f"as a minipar GPT: {v3_gpt[0]:.1f}B total, {v3_gpt[1]:.1f}B active")

# %% [markdown]
# What such a pair means: a token costs the FLOPs of a dense model of the active size (6 a
# weight to train), while every weight must be held (16 bytes each in bf16 with Adam):
# memory follows the total, compute the active count, and expert parallelism spreads the
# total.

# %% [markdown]
# ## Exercises
#
# - **8.1** `permute_rows` and `unpermute_rows`: the rows grouped by expert, then token,
#   and the weighted sum back at each token (section 2), against nn/moe's `permute` and
#   `unpermute` on drawn routings.
# - **8.2** `kept_pairs`: the (token, choice) pairs a full expert keeps, by "probs" or by
#   "position" (section 2), against `plan_routing` on skewed routings, ties included.
# - **8.3** `reduce_expert_grad`: an expert's gradient on its owner → one device's, under
#   dp × ep (section 7), on simulated meshes of up to 12 ranks.
#
# `minipar grade 08` grades `exercise.py`.
#
# ## Summary
#
# - The router scores (softmax or sigmoid), picks the top k, and weighs by the chosen
#   scores; the choice carries no gradient, a selection bias chooses and never weighs,
#   and group-limited routing keeps a token's experts inside M groups (nodes).
# - C = ceil(k·T/E · factor) pairs an expert; "probs" drops the weakest votes, "position"
#   the latest tokens; dropless keeps all; padding costs FLOPs, not results.
# - The aux loss is α at perfect balance because f_i divides by T·k; sequence-wise and
#   batch-wise losses see different imbalance; the z-loss sees what softmax ignores.
# - The aux-loss-free bias evens a skewed router within tens of steps, without gradients;
#   under gradient accumulation the balancing losses take the micro-batch's 1/m too;
#   measured over each rank's block, the aux loss is not the global batch's until the
#   counts are summed over dp (`global_aux_loss`).
# - EP: counts first, rows with uneven splits, sorted by local expert; (n − 1)/n of the
#   rows leave a rank; the busiest expert sets the pace.
# - dp × ep: experts are averaged over edp and scaled by 1/ep; dense parts over dp.
# - Total parameters cost memory, active parameters cost FLOPs.
