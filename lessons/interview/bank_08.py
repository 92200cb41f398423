"""Interview questions on lesson 08 (mixture of experts and expert parallelism), part of
bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 08`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from nn/moe (capacity,
plan_routing, the balancing losses, the router and the layer, MoEConfig's parameter
counts), the cost model (minipar.runtime.cost), the groups of a dp × ep layout
(ParallelGroups) and small runs on simulated devices (minipar.launch, parallelize).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.data.batches import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.nn.moe import (MoE, MoEConfig, TopKRouter, capacity, expert_counts,
                            plan_routing, switch_aux_loss, update_expert_bias, z_loss)
from minipar.nn.moe.router import scores_of, select_topk
from minipar.nn.saved import release_all
from minipar.parallel import ParallelDims, ParallelGroups, parallelize
from minipar.runtime.cost import bytes_sent, collective_cost

MB, GB, MS = 10**6, 10**9, 1e-3


# ---- helpers ---------------------------------------------------------------------------
def ranks_text(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def skewed_routing(name: str, tokens: int, experts: int, k: int, lean: float, seed: int,
                   hidden: int = 8):
    """(weights, experts [T, k]) of a router whose tokens all lean toward expert 0."""
    with mp.device():
        router = TopKRouter(name, hidden, experts, k, seed=seed, std=0.5)
        w0 = router.linear.weight.data[0]
        x = np.random.default_rng(seed).standard_normal((tokens, hidden))
        w, top, saved = router.forward(x + lean * w0 / np.linalg.norm(w0))
        release_all(saved)
    return w, top


def uniform_traffic(S: float, n: int) -> list:
    return [[S / n] * n for _ in range(n)]


# ---- the questions' numbers ------------------------------------------------------------
def q66(tokens, experts, k, factor, hot):
    """Capacity on a routing with one hot expert: drops by position."""
    pairs = tokens * k
    hot_pairs = round(hot * pairs)
    cycle = iter(np.tile(np.arange(1, experts), pairs))  # the other experts, in turn
    top = np.array([[0] * (t < hot_pairs) + [int(next(cycle)) for _ in range(k - (t < hot_pairs))]
                    for t in range(tokens)])
    C = capacity(tokens, experts, k, factor)
    counts = expert_counts(top, experts)
    plan = plan_routing(top, np.ones(top.shape), experts, C, "position")
    return {"cap": C, "even": k * tokens / experts, "pairs": pairs,
            "hot_pairs": int(counts[0]), "dropped": plan.dropped,
            "dropped_pct": plan.dropped / pairs, "other_max": int(counts[1:].max()),
            "needed": counts.max() / (k * tokens / experts)}


def q67(alpha, experts, k, tokens):
    """The aux loss at balance, without the k, and at full collapse."""
    balanced = (np.arange(tokens * k).reshape(tokens, k)) % experts  # each expert T·k/E
    uniform = np.full((tokens, experts), 1 / experts)
    collapsed = np.tile(np.arange(k), (tokens, 1))  # every token on experts 0..k-1
    probs = np.zeros((tokens, experts))
    probs[:, :k] = 1 / k
    no_k = lambda top, p: alpha * experts * float(np.dot(expert_counts(top, experts) / tokens,
                                                         p.mean(axis=0)))
    return {"balanced": switch_aux_loss(uniform, balanced, alpha)[0],
            "without_k": no_k(balanced, uniform),
            "collapsed": switch_aux_loss(probs, collapsed, alpha)[0],
            "collapsed_no_k": no_k(collapsed, probs)}


def q68(alpha, experts, small, large):
    """z-loss at two logit scales; a bf16 logit's rounding step there."""
    pattern = np.linspace(-1.0, 1.0, experts)[None, :]  # one token's logits, shifted
    bf16 = ml_dtypes.bfloat16
    step = lambda v: float((np.array(v, bf16).view(np.uint16) + 1).view(bf16)) - v
    same = np.allclose(scores_of(pattern + small, "softmax"), scores_of(pattern + large, "softmax"))
    return {"z_small": z_loss(pattern + small, alpha)[0], "z_large": z_loss(pattern + large, alpha)[0],
            "step_small": step(small), "step_large": step(large),
            "jump": float(np.exp(step(large))), "same": "the same" if same else "different"}


def q69(tokens, experts, k, rate, lean, steps):
    """The aux-loss-free bias on a skewed router: the load ratio over steps; the weights of
    the tokens whose choice stayed."""
    with mp.device():
        router = TopKRouter("q69.router", 8, experts, k, seed=6, std=0.5)
        w0 = router.linear.weight.data[0]
        x = np.random.default_rng(6).standard_normal((tokens, 8)) + lean * w0 / np.linalg.norm(w0)
        ratios, first = [], None
        for _ in range(steps):
            w, top, saved = router.forward(x)
            release_all(saved)
            if first is None:
                first = (w, top)
            load = expert_counts(top, experts)
            ratios.append(load.max() / max(load.min(), 1))
            router.expert_bias = update_expert_bias(router.expert_bias, load, rate)
    stay = (np.sort(first[1], axis=1) == np.sort(top, axis=1)).all(axis=1)
    order = lambda t: np.argsort(t, axis=1)
    w_stay = np.take_along_axis(w, order(top), 1)[stay]
    w_first = np.take_along_axis(first[0], order(first[1]), 1)[stay]
    below = next(i for i, r in enumerate(ratios) if r < 2)
    return {"ratio0": ratios[0], "below_step": below, "last_lo": min(ratios[-10:]),
            "last_hi": max(ratios[-10:]),
            "stayed": int(stay.sum()), "w_change": float(np.abs(w_stay - w_first).max()),
            "bias_lo": float(router.expert_bias.min()), "bias_hi": float(router.expert_bias.max())}


def q70(tokens, k, h, ep, gpus_per_node, layers):
    """The dispatch's bytes and time inside a node and over two, uniform routing."""
    S = tokens * k * h * 2
    topo = mp.Topology.nodes(ep // gpus_per_node, gpus_per_node)
    across = collective_cost("all_to_all", S, list(range(ep)), topo, traffic=uniform_traffic(S, ep))
    inside = collective_cost("all_to_all", S, list(range(gpus_per_node)), topo,
                             traffic=uniform_traffic(S, gpus_per_node))
    sent = bytes_sent("all_to_all", "ring", S, ep, 0, traffic_row=uniform_traffic(S, ep)[0])
    return {"s_mb": S / MB, "sent_mb": sent / MB, "ib_mb": S * (ep - gpus_per_node) / ep / MB,
            "t_ms": across.seconds / MS, "node_ms": inside.seconds / MS,
            "step_ms": 4 * layers * across.seconds / MS, "slower": across.seconds / inside.seconds}


SIM = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=2, ffn_hidden=8,
                init_std=0.3, seed=0, moe=MoEConfig(num_experts=4, top_k=2, aux_loss_coeff=0.05))


@functools.lru_cache(maxsize=None)
def expert_grad_ratio(dp: int, ep: int, scale: float) -> float:
    """An expert's reduced gradient on its owner over one device's, at dp x ep with the
    expert buckets scaled by `scale` (1/ep is right)."""
    ids, tgt = np.random.default_rng(4).integers(0, 16, (2, 4, 2 * dp))
    name = "blocks.0.mlp.experts.0.fc1.weight"

    def program(ctx):
        run = parallelize(SIM, ParallelDims(dp_replicate=dp, ep=ep), lr=1e-2, placement="any")
        for b in run.engine.buckets:
            b.scale = scale if b.scale != 1.0 else 1.0
        run.forward_backward(ids, tgt)
        return {p.name: p.grad.copy() for p in run.model.parameters() if p.grad is not None}

    got = mp.launch(program, dp)[0][name]
    with mp.device():
        one = GPT(SIM)
        for d in range(dp):
            one.loss_and_grad(*split_data_parallel(ids, tgt, d, dp), loss_scale=1 / dp)
        want = {p.name: p.grad for p in one.parameters()}[name]
    return float(np.median(got / want))


def q71(dp, ep, experts, rank, sim_dp, sim_ep):
    """A rank's ep and edp groups and experts; the measured 1/ep."""
    dims = ParallelDims(dp_replicate=dp, ep=ep)
    where = mp.launch(lambda ctx: ParallelGroups(dims), dp)[rank]
    L = experts // ep
    p = where.ep.group_rank(rank)
    return {"ep_group": ranks_text(where.ep.ranks), "edp_group": ranks_text(where.edp.ranks),
            "per_rank": L, "first_expert": p * L, "last_expert": p * L + L - 1,
            "replicas": where.edp.size,
            "right_ratio": expert_grad_ratio(sim_dp, sim_ep, 1 / sim_ep),
            "wrong_ratio": expert_grad_ratio(sim_dp, sim_ep, 1.0)}


def q72(hidden, experts, tokens):
    """The router's gradient from the main loss: top-2 normalised (against a finite
    difference), top-1 normalised (none), top-1 raw (Switch)."""
    seed = 5
    x, dy = np.random.default_rng(seed).standard_normal((2, tokens, 1, hidden))
    norms, fd_err = {}, None
    with mp.device():
        for key, k, normalize in (("k2", 2, True), ("k1", 1, True), ("switch", 1, False)):
            layer = MoE(f"q72.{key}", hidden, 2 * hidden, experts, k, normalize=normalize,
                        seed=seed, std=0.5)
            y, saved = layer.forward(x)
            layer.backward(dy, saved)
            wr = layer.router.linear.weight
            norms[key] = float(np.linalg.norm(wr.grad))
            if key == "k2":
                at, eps, f = (1, 2), 1e-6, []
                for sign in (1, -1):
                    wr.data[at] += sign * eps
                    y2, s2 = layer.forward(x)
                    release_all(s2)
                    wr.data[at] -= sign * eps
                    f.append(float((y2 * dy).sum()))
                fd_err = abs((f[0] - f[1]) / (2 * eps) - wr.grad[at]) / abs(wr.grad[at])
    return {"norm_k2": norms["k2"], "fd_err": fd_err, "norm_k1": norms["k1"],
            "norm_switch": norms["switch"]}


def q73(tokens, experts, k, lean, f1, f2):
    """Drops and padding at two capacity factors against dropless, on a skewed router."""
    w, top = skewed_routing("q73.router", tokens, experts, k, lean, seed=7)
    out = {}
    for key, f in (("1", f1), ("2", f2)):
        C = capacity(tokens, experts, k, f)
        plan = plan_routing(top, w, experts, C, "probs")
        out.update({f"cap{key}": C, f"drop{key}": plan.dropped / (tokens * k),
                    f"pad{key}": 1 - plan.counts.sum() / (experts * C)})
    load = expert_counts(top, experts)
    out.update({"busiest": int(load.max()), "mean": load.mean(), "straggle": load.max() / load.mean()})
    return out


def q74(h, f, experts, k, shared):
    """A layer's parameters, total and active, with and without the shared experts."""
    with_shared = MoEConfig(num_experts=experts, top_k=k, ffn_hidden=f, shared_ffn_hidden=shared)
    without = MoEConfig(num_experts=experts, top_k=k, ffn_hidden=f)
    (total, active), (total0, active0) = (c.layer_parameters(h, f) for c in (with_shared, without))
    return {"total_m": total / 1e6, "active_m": active / 1e6, "active0_m": active0 / 1e6,
            "shared_m": (active - active0) / 1e6, "shared_pct": (active - active0) / active}


def q75(nodes, experts, k, kept, h, tokens):
    """Nodes a token's experts reach, free and group-limited (random sigmoid scores); the
    bf16 bytes on InfiniBand per token when a token crosses once a remote node."""
    scores = scores_of(np.random.default_rng(11).standard_normal((tokens, experts)), "sigmoid")
    per = experts // nodes
    reach = {}
    for key, m in (("free", nodes), ("limited", kept)):
        top = select_topk(scores, k, nodes, m)
        node_sets = [set(row // per) for row in top]
        reach[key] = (np.mean([len(s) for s in node_sets]),
                      np.mean([len(s - {0}) for s in node_sets]))  # home: node 0
        reach[key + "_over"] = np.mean([len(s) > kept for s in node_sets])
    return {"free_nodes": reach["free"][0], "limited_nodes": reach["limited"][0],
            "over": reach["free_over"], "free_kb": reach["free"][1] * h * 2 / 1e3,
            "limited_kb": reach["limited"][1] * h * 2 / 1e3, "rows_kb": k * h * 2 / 1e3}


def q76(vocab, h, layers, first_dense, experts, k, f, shared, dense_ffn):
    """Total and active parameters of an MoE GPT; model states and training FLOPs."""
    cfg = GPTConfig(vocab_size=vocab, seq_len=4096, hidden=h, num_heads=16, num_layers=layers,
                    ffn_hidden=dense_ffn, dtype="bfloat16",
                    moe=MoEConfig(num_experts=experts, top_k=k, first_dense=first_dense,
                                  ffn_hidden=f, shared_ffn_hidden=shared))
    total, active = cfg.num_parameters(), cfg.num_active_parameters()
    return {"total_b": total / 1e9, "active_b": active / 1e9, "active_pct": active / total,
            "states_gb": 16 * total / GB, "dense_gb": 16 * active / GB,
            "gflops": 6 * active / 1e9}


def q77(tokens, experts, k, ep, lean, h):
    """A skewed router under ep: the busiest rank's rows and the all-to-all's time against
    uniform routing (every rank routes alike)."""
    _, top = skewed_routing("q77.router", tokens, experts, k, lean, seed=9)
    per_rank = expert_counts(top, experts).reshape(ep, -1).sum(axis=1)  # rows each rank runs
    row = per_rank * h * 2  # bytes every source sends to each rank
    topo = mp.Topology.nodes(1, ep)
    skew = collective_cost("all_to_all", row.sum(), list(range(ep)), topo,
                           traffic=[list(row) for _ in range(ep)])
    even = collective_cost("all_to_all", row.sum(), list(range(ep)), topo,
                           traffic=uniform_traffic(row.sum(), ep))
    return {"busiest_rows": int(per_rank.max()), "mean_rows": per_rank.mean(),
            "expert_x": per_rank.max() / per_rank.mean(), "a2a_us": skew.seconds * 1e6,
            "even_us": even.seconds * 1e6, "a2a_x": skew.seconds / even.seconds}


def q78(m, alpha):
    """The router's gradient under m micro-batches: right, planted (losses at weight 1),
    and the balancing part alone."""
    data = np.random.default_rng(3).integers(0, 16, (2, 4, 2 * m))

    def router_grad(coeff, scaled):
        cfg = SIM.with_(num_layers=1, moe=MoEConfig(num_experts=4, top_k=2,
                                                    aux_loss_coeff=coeff, z_loss_coeff=coeff))
        MoE.takes_loss_scale = scaled
        try:
            with mp.device():
                model = GPT(cfg)
                for ids, tgt in split_microbatches(data[0], data[1], m):
                    model.loss_and_grad(ids, tgt, loss_scale=1 / m)
                return {p.name: p.grad for p in model.parameters()}["blocks.0.mlp.router.weight"]
        finally:
            MoE.takes_loss_scale = True

    right, planted, ce = router_grad(alpha, True), router_grad(alpha, False), router_grad(0.0, True)
    balancing = right - ce  # (1/m) Σ of the micro-batches' balancing gradients
    excess = planted - right
    return {"excess_ratio": float(np.median(excess / balancing)),
            "rel": float(np.abs(excess).max() / np.abs(right).max()), "alpha_eff": m * alpha}


def q79(dp, experts, k, tokens, lean):
    """The aux loss of dp blocks that each favour another expert: the global batch's, the
    mean of the blocks' own, and with the counts summed over the blocks."""
    g = np.random.default_rng(8)
    blocks = []
    for r in range(dp):
        logits = g.standard_normal((tokens, experts)) + lean * np.eye(experts)[r % experts]
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        blocks.append((probs, np.argsort(-probs, axis=1)[:, :k]))
    probs = np.concatenate([p for p, _ in blocks])
    topk = np.concatenate([t for _, t in blocks])
    summed = expert_counts(topk, experts)
    return {"whole": switch_aux_loss(probs, topk, 1.0)[0],
            "local": float(np.mean([switch_aux_loss(p, t, 1.0)[0] for p, t in blocks])),
            "global_": float(np.mean([switch_aux_loss(p, t, 1.0, summed)[0]
                                      for p, t in blocks]))}


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="08", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q66", dict(tokens=1536, experts=12, k=3, factor=1.15, hot=0.3),
        "A micro-batch of {tokens} tokens is routed top-{k} over {experts} experts with "
        "capacity factor {factor}; one expert receives {hot:.0%} of the choices. What is "
        "the capacity, and what is dropped (drop by position)?",
        "C = ceil(k·T/E · factor) = {cap} (token, choice) pairs an expert; the even share "
        "is k·T/E = {even:.0f}. The hot expert is chosen {hot_pairs} times of {pairs} and "
        "keeps {cap}: {dropped} pairs are dropped, {dropped_pct:.1%} of all, while the "
        "others get at most {other_max} and drop nothing. A dropped pair adds nothing: its "
        "token keeps its residual stream (and any shared expert). To drop nothing the "
        "factor would have to be {needed:.2f} — memory and padding for every expert, paid "
        "for one: balance the load instead.",
        q66),
    entry(
        "q67", dict(alpha=0.013, experts=24, k=6, tokens=120),
        "The load-balancing loss is α · E · Σ f_i P_i with α = {alpha}, E = {experts}, "
        "top-{k}. What is it at perfect balance, and why does Megatron-LM divide the counts "
        "by T·k? ({tokens} tokens.)",
        "With f_i = c_i/(T·k) both f and P sum to 1, and at balance f_i = P_i = 1/E: L = "
        "{balanced:.3f}, the coefficient itself, for any k. Counting f_i = c_i/T instead "
        "gives {without_k:.3f} = α·k at the same balance, so a coefficient tuned at top-1 "
        "is k times stronger at top-k. At full collapse (every token on the same k experts, "
        "all probability there) it is α·E/k = {collapsed:.3f} (without the k, α·E = "
        "{collapsed_no_k:.3f}). f is a count, with no gradient; only P carries one.",
        q67),
    entry(
        "q68", dict(alpha=0.001, experts=16, small=2.5, large=90),
        "What is the router z-loss for, and what does it see that the other losses do not? "
        "Compare a token's {experts} logits around {small} and the same logits shifted to "
        "around {large} (α = {alpha}).",
        "z = α · mean_t (logsumexp_i logits)²: {z_small:.4f} around {small}, {z_large:.2f} "
        "around {large}, while the softmax (so the choice, the weights and the balancing "
        "losses) is {same}. Large logits are what bf16 handles badly: a logit near {large} "
        "is stored in steps of {step_large:g} (near {small}, {step_small:g}), so one "
        "rounding step changes a probability ratio by {jump:.2f}x. ST-MoE adds the z-loss "
        "to keep the router's logits small and its training stable.",
        q68),
    entry(
        "q69", dict(tokens=512, experts=16, k=4, rate=0.002, lean=1.2, steps=150),
        "DeepSeek-V3 balances its experts without an auxiliary loss: a per-expert bias "
        "b_i += γ · sign(mean load − load_i) after each step. Why is the bias used for the "
        "selection only? Simulate: {tokens} tokens leaning toward one of {experts} "
        "experts, top-{k}, γ = {rate}, lean {lean}, {steps} steps.",
        "The busiest expert's load over the idlest's starts at {ratio0:.1f}, falls below "
        "2 at step {below_step}, and over the last ten steps alternates between "
        "{last_lo:.2f} and {last_hi:.2f} (each bias moves ±γ a step, so it never settles "
        "exactly); the biases end between {bias_lo:.3f} and {bias_hi:.3f}. Of the "
        "{stayed} tokens whose experts stayed the same, the weights moved by at most "
        "{w_change:.0e}, the rounding of adding the same k scores in another order: the "
        "bias changes who is chosen, never how much an expert's output counts. A bias in "
        "the weights would change the function the model computes and fight the gradient; "
        "in the choice it only moves load, with no gradient and no interference with the "
        "loss.",
        q69),
    entry(
        "q70", dict(tokens=3072, k=6, h=5120, ep=16, gpus_per_node=8, layers=27),
        "An MoE layer routes each rank's {tokens} tokens top-{k} (h = {h}, bf16) with "
        "ep = {ep} over nodes of {gpus_per_node}. What do its all-to-alls move, and what do "
        "they cost a step over {layers} MoE layers?",
        "Dispatch sends each rank's T·k rows to the experts' ranks ({s_mb:.0f} MB a rank; "
        "after the counts, which size the receive buffers); combine brings them back; the "
        "backward runs both again, the splits swapped: 4 all-to-alls a layer. Under "
        "uniform routing a rank sends (n − 1)/n of S, {sent_mb:.0f} MB, {ib_mb:.0f} MB of "
        "it to the other node: {t_ms:.2f} ms each on InfiniBand, {step_ms:.0f} ms a step. "
        "Inside one node of {gpus_per_node}, the same all-to-all takes {node_ms:.2f} ms: "
        "crossing nodes makes it {slower:.1f}x slower. Nothing computes through them "
        "unless a schedule overlaps them (DualPipe).",
        q70),
    entry(
        "q71", dict(dp=24, ep=8, experts=40, rank=13, sim_dp=4, sim_ep=2),
        "With dp = {dp} and ep = {ep} (Megatron folds ep into dp), {experts} experts: which "
        "ranks does rank {rank} share experts with, which hold copies of its experts, and "
        "why is an expert's gradient scaled by 1/ep?",
        "Rank {rank}'s ep group is {ep_group}: they split the {experts} experts, "
        "{per_rank} each; rank {rank} holds {first_expert}–{last_expert}. Its experts' "
        "replicas, the edp group, are {edp_group}: dp/ep = {replicas} ranks, over which "
        "their gradients are averaged. Each owner computed its expert's gradient from the "
        "rows all ep ranks sent it, the sum of ep data-parallel shares, so the replicas' "
        "mean is ep times one device's mean over dp: hence 1/ep. Measured at dp = "
        "{sim_dp}, ep = {sim_ep}: an expert's gradient over one device's is "
        "{right_ratio:.3f} with the factor and {wrong_ratio:.3f} without it.",
        q71),
    entry(
        "q72", dict(hidden=12, experts=6, tokens=10),
        "The top-k choice is not differentiable. How does the router learn, and what "
        "happens at top-1 with normalised weights? (An MoE layer of {experts} experts, "
        "h = {hidden}, {tokens} tokens, no balancing loss.)",
        "Only the weights carry a gradient: the choice is a step function, constant for "
        "small changes, so the gradient of the output through the chosen scores is exact. "
        "Top-2, normalised: the router's gradient has norm {norm_k2:.4f}, and a finite "
        "difference agrees to {fd_err:.1e}. Top-1, normalised: every weight is 1 whatever "
        "the scores, and the norm is {norm_k1:.1f} — the router learns nothing from the "
        "loss, only from balancing losses. Switch keeps the raw probability as the gate "
        "for this reason: norm {norm_switch:.4f}.",
        q72),
    entry(
        "q73", dict(tokens=640, experts=10, k=2, lean=0.9, f1=1.1, f2=1.6),
        "Token dropping or dropless? A skewed router sends {tokens} tokens top-{k} over "
        "{experts} experts (lean {lean}). Compare capacity factors {f1} and {f2} with "
        "dropless.",
        "Factor {f1}: C = {cap1}, {drop1:.1%} of the pairs dropped, and padding to C "
        "leaves {pad1:.1%} of the rows zeros; factor {f2}: C = {cap2}, {drop2:.1%} "
        "dropped, {pad2:.1%} padding. Dropless drops nothing, but the busiest expert runs "
        "{busiest} rows against a mean of {mean:.0f} ({straggle:.2f}x): the step waits for "
        "it, and buffers must hold the worst case. Dropping bounds time and memory and "
        "costs quality (dropped tokens skip the layer); dropless keeps quality and pays in "
        "uneven work — which is why it goes with good balancing.",
        q73),
    entry(
        "q74", dict(h=2048, f=1408, experts=64, k=6, shared=2816),
        "What is a shared expert, and what does it cost? A layer of {experts} routed "
        "experts of width {f}, top-{k}, h = {h}, plus shared experts of total width "
        "{shared}.",
        "A shared expert is an MLP every token runs, beside its k routed ones "
        "(DeepSeekMoE): knowledge all tokens need is learned once instead of in every "
        "routed expert, and a dropped token still gets its output. The layer holds "
        "{total_m:.1f}M parameters; a token runs {active_m:.2f}M of them, {shared_m:.2f}M "
        "({shared_pct:.0%}) in the shared experts; without them {active0_m:.2f}M. It is "
        "replicated on every ep rank, not dispatched: no all-to-all.",
        q74),
    entry(
        "q75", dict(nodes=16, experts=192, k=7, kept=4, h=7168, tokens=4000),
        "Why does DeepSeek-V3 limit each token to M nodes? {experts} experts on {nodes} "
        "nodes, top-{k}, M = {kept} (group-limited routing, one group a node), h = {h}, "
        "{tokens} tokens with random scores.",
        "Free top-{k} reaches {free_nodes:.2f} nodes a token on average, and {over:.1%} of "
        "the tokens reach more than {kept}; limited, {limited_nodes:.2f}, never more than "
        "{kept}. With a dispatcher that sends a token once to each remote node and fans it "
        "out over NVLink, a token puts {free_kb:.1f} kB on InfiniBand free against "
        "{limited_kb:.1f} kB limited (one row per expert would be up to {rows_kb:.1f} kB). "
        "The limit caps the cross-node traffic of the all-to-all, the slowest link, at a "
        "small cost in routing freedom.",
        q75),
    entry(
        "q76", dict(vocab=102400, h=2048, layers=28, first_dense=1, experts=64, k=6, f=1408,
                    shared=2816, dense_ffn=10944),
        "An MoE GPT: {layers} blocks ({first_dense} dense block first, width {dense_ffn}), "
        "{experts} routed experts of width {f} top-{k} plus shared experts of width "
        "{shared}, h = {h}, vocabulary {vocab}. Total and active parameters, and what each "
        "costs?",
        "minipar counts {total_b:.2f}B parameters in total and {active_b:.2f}B active a "
        "token ({active_pct:.0%}). Memory follows the total: {states_gb:.0f} GB of model "
        "states at 16 bytes a parameter (bf16, Adam), where a dense model of the active "
        "size would need {dense_gb:.0f} GB. FLOPs follow the active count: about "
        "{gflops:.1f} GFLOPs to train on a token (6 a weight). DeepSeek-V3's published "
        "\"671B total, 37B active\" reads the same way.",
        q76),
    entry(
        "q77", dict(tokens=2048, experts=32, k=4, ep=8, lean=1.1, h=4096),
        "Why is expert load imbalance a straggler problem? {tokens} tokens a rank, "
        "{experts} experts over ep = {ep} ranks of one node, top-{k}, a router leaning "
        "toward one expert (lean {lean}), h = {h}, bf16.",
        "The busiest rank runs {busiest_rows} rows against a mean of {mean_rows:.0f} "
        "({expert_x:.2f}x): its experts finish last and every rank waits for the combine. "
        "The all-to-all, too, ends with its busiest receiver: {a2a_us:.0f} us against "
        "{even_us:.0f} us for uniform routing ({a2a_x:.2f}x). A synchronous step runs at "
        "the pace of its hottest expert, which is why balancing matters beyond quality.",
        q77),
    entry(
        "q78", dict(m=5, alpha=0.02),
        "A step accumulates m = {m} micro-batches, and the balancing losses (α = {alpha}) "
        "are backpropagated at weight 1 while the cross-entropy gets 1/m. What goes wrong?",
        "The objective is the mean over micro-batches of CE plus the balancing losses, so "
        "both need 1/m. At weight 1 the router receives the balancing gradient m times, "
        "an extra (m − 1) times it: measured {excess_ratio:.3f}. The router's gradient "
        "moves by {rel:.0%} of its largest entry, as if α were {alpha_eff:g}, and the "
        "error grows with m: a bug that appears when the batch settings change. Megatron's "
        "MoEAuxLossAutoScaler (minipar's loss_scale) carries the 1/m to them.",
        q78),
    entry(
        "q79", dict(dp=4, experts=8, k=2, tokens=64, lean=2.0),
        "dp = {dp} ranks each compute the load-balancing loss (α = 1, {experts} experts, "
        "top-{k}) on their own {tokens} tokens, and each rank's tokens lean toward another "
        "expert (a logit bonus of {lean}). Is the mean of their losses the global batch's? "
        "What would make it so?",
        "No. The loss is E·Σ f_i·P_i, a product of two means, and the mean of products is "
        "not the product of means: the ranks' own losses average {local:.3f}, the global "
        "batch's is {whole:.3f}. Every rank sees more imbalance than the batch holds (1 "
        "is perfect balance), and the router is pushed to fix what is not there. Summing the counts c_i over dp before "
        "the loss (one all-reduce of E numbers a layer) and keeping each rank's own P gives "
        "{global_:.3f}, the global value exactly, and the gradients averaged over dp become "
        "the global batch's: Megatron's global_aux_loss (minipar's "
        "MoEConfig(global_aux_loss=True)). f has no gradient, so nothing else changes.",
        q79),
]
