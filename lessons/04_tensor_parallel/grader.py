"""Grader for lesson 04: your tensor- and sequence-parallel pieces against minipar's own
ColumnParallelLinear, RowParallelLinear, cross_entropy_forward and layernorm_backward, in
float64, on a 2-D mesh (data x tensor parallel, the tp groups consecutive or strided) with
your tp group passed as `group`; and your layout of exercise 4.5 trained on a simulated
cluster, against its budgets (the ledger, the clock) and one device's losses."""

from dataclasses import dataclass, fields

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, calls, exercise, expect_close,
                                    expect_equal, expect_within, mesh_of, on_mesh,
                                    world_sizes)
from minipar.nn import GPT, GPTConfig
from minipar.nn.cross_entropy import cross_entropy_forward
from minipar.nn.layernorm import layernorm_backward
from minipar.nn.saved import Saved
from minipar.optim import AdamW
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear

SEED = st.integers(0, 2**16)
TP = world_sizes(1, 4, first=2)  # the tp group's size t: 2 first, then 3, 4; 1 last


def tp_mesh(t: int, strided: bool):
    """(shape, names, dim) of a 2 x t mesh whose "tp" groups hold t ranks: consecutive
    ranks (tp varies fastest, as Megatron places it) or ranks 2 apart (strided)."""
    return mesh_of(t, 2, strided, ("tp", "dp") if strided else ("dp", "tp"))


def bias_values(n: int) -> np.ndarray:
    """A bias with a different, non-zero value in every entry."""
    return 0.5 + np.arange(n) / 4.0


def traced(ctx, spmd, fn, *args, names):
    """calls(ctx, fn, *args) and the comm events it issued (name, group, bytes)."""
    start = len(ctx.trace.events)
    call = calls(ctx, fn, *args, names=names, rank=spmd.words)
    return call, [e for e in ctx.trace.events[start:] if e.stream == "comm"]


def expect_three(got, who: str, fn: str, names: str) -> tuple:
    expect_equal(isinstance(got, tuple) and len(got), 3, rank=who,
                 what=f"{fn}(...) returns ({names}): its length")
    return got


def expect_comm(events, want: int, spmd, *, what: str, hint: str, most_bytes=None) -> None:
    """`want` all-reduces (at most, when most_bytes is given: each of at most that many
    bytes), every one over `group`: checked before any value, it names the bug best."""
    ranks = tuple(spmd.group.ranks)
    for e in events:
        if e.group != ranks:
            raise GradeFailure(
                f"{spmd.words}: {what} ran {e.name} over global ranks {list(e.group)}, not "
                f"over `group` = {list(ranks)}: pass group=group to every collective (the "
                f"world holds every tp group, and the data-parallel replicas too)")
    ran = [f"{e.name} of {e.nbytes} bytes" for e in events]
    if most_bytes is None:
        ok = [e.name for e in events] == ["all_reduce"] * want
        expected = f"{want} all-reduce{'s' * (want != 1)}" if want else "no collective"
    else:
        ok = (len(events) <= want and all(e.name == "all_reduce" and e.nbytes <= most_bytes
                                          for e in events))
        expected = f"at most {want} all-reduces of at most {most_bytes} bytes"
    if not ok:
        raise GradeFailure(f"{spmd.words}: {what} ran {ran or 'no collective'}, expected "
                           f"{expected}. {hint}")


@exercise("4.1", "the column-parallel linear layer and its f")
@SETTINGS
@given(t=TP, strided=st.booleans(), s=st.integers(1, 3), b=st.integers(1, 2),
       n_in=st.integers(1, 5), out_per_rank=st.integers(1, 3), seed=SEED)
def check_column_parallel_linear(impl, t, strided, s, b, n_in, out_per_rank, seed):
    n_out = out_per_rank * t
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, b, n_in))  # the same input on every rank
    dy = rng.standard_normal((s, b, n_out))  # dL/dy of the whole layer; rank r gets a slice

    def program(ctx, spmd):
        g, r, who = spmd.group, spmd.rank, spmd.words
        lin = ColumnParallelLinear("lin", n_in, n_out, g, seed=seed, std=1.0)
        lin.bias.set_data(np.split(bias_values(n_out), t)[r])
        w_r, b_r = lin.weight.data.copy(), lin.bias.data.copy()
        (y_want, _), saved = lin.forward(x)  # y_r: [s, b, n_out/t]
        dy_r = np.split(dy, t, axis=-1)[r]
        dx_want = lin.backward(dy_r, saved)

        fwd, events = traced(ctx, spmd, impl.column_parallel_linear_forward, x, w_r, b_r, g,
                             names=["x", "w_shard", "b_shard", "group"])
        expect_comm(events, 0, spmd, what="column_parallel_linear_forward", hint=(
            "f is the identity in forward: every rank holds the whole x already, and y_r is "
            "only this rank's out/t outputs; the sum belongs to the row-parallel layer (g)"))
        expect_close(fwd.result, y_want, rank=who, what="column_parallel_linear_forward(x, "
                     "w_shard, b_shard)", hint="this rank's out/t outputs of x W^T + b")
        bwd, events = traced(ctx, spmd, impl.column_parallel_linear_backward, dy_r, x, w_r, g,
                             names=["dy_shard", "x", "w_shard", "group"])
        got = expect_three(bwd.result, who, "column_parallel_linear_backward", "dx, dw_shard, "
                           "db_shard")
        expect_comm(events, 1, spmd, what="column_parallel_linear_backward", hint=(
            "f's backward is one all-reduce, of dx: every rank's outputs used the whole x. "
            "dW_r and db_r are complete on rank r, the only rank that uses W_r and b_r"))
        dx, dw, db = got
        expect_close(dw, lin.weight.grad, rank=who, what="dw_shard of column_parallel_"
                     "linear_backward", hint="dW_r sums dy_r^T x over the s·b tokens")
        expect_close(db, lin.bias.grad, rank=who, what="db_shard of column_parallel_"
                     "linear_backward", hint="db_r sums dy_r over the s·b tokens")
        expect_close(dx, dx_want, rank=who, what="dx of column_parallel_linear_backward",
                     n=t, ratios={"1/n": "averaged over the group where f's backward sums"},
                     hint="dx is the SUM over the group of each rank's dy_r W_r")

    on_mesh(program, *tp_mesh(t, strided))


@exercise("4.2", "the row-parallel linear layer and its g")
@SETTINGS
@given(t=TP, strided=st.booleans(), s=st.integers(1, 3), b=st.integers(1, 2),
       in_per_rank=st.integers(1, 3), n_out=st.integers(1, 5), seed=SEED)
def check_row_parallel_linear(impl, t, strided, s, b, in_per_rank, n_out, seed):
    n_in = in_per_rank * t
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, b, n_in))  # the whole input; rank r gets a slice
    dy = rng.standard_normal((s, b, n_out))  # the same dL/dy on every rank

    def program(ctx, spmd):
        g, r, who = spmd.group, spmd.rank, spmd.words
        lin = RowParallelLinear("lin", n_in, n_out, g, seed=seed, std=1.0)
        lin.bias.set_data(bias_values(n_out))
        w_r, bias = lin.weight.data.copy(), lin.bias.data.copy()
        x_r = np.split(x, t, axis=-1)[r]  # [s, b, n_in/t]
        (y_want, _), saved = lin.forward(x_r)
        dx_want = lin.backward(dy, saved)

        fwd, events = traced(ctx, spmd, impl.row_parallel_linear_forward, x_r, w_r, bias, g,
                             names=["x_shard", "w_shard", "b", "group"])
        expect_comm(events, 1, spmd, what="row_parallel_linear_forward", hint=(
            "g is one all-reduce in forward: each rank's x_r W_r^T is a partial sum of y"))
        y = fwd.result
        if t > 1 and np.shape(y) == y_want.shape and np.allclose(y, y_want + (t - 1) * bias):
            raise GradeFailure(f"{who}: row_parallel_linear_forward: received y = expected + "
                               f"(t − 1)·b with t = {t}: every rank added the bias before the "
                               f"all-reduce, so the sum holds it t times; add it once, after g")
        expect_close(y, y_want, rank=who, what="row_parallel_linear_forward(x_shard, "
                     "w_shard, b)", hint="y = x W^T + b, the same on every rank")
        bwd, events = traced(ctx, spmd, impl.row_parallel_linear_backward, dy, x_r, w_r, g,
                             names=["dy", "x_shard", "w_shard", "group"])
        got = expect_three(bwd.result, who, "row_parallel_linear_backward", "dx_shard, "
                           "dw_shard, db")
        expect_comm(events, 0, spmd, what="row_parallel_linear_backward", hint=(
            "g's backward is the identity: dy is already whole on every rank, and each "
            "rank's dx_r, dW_r and db need nothing from the others"))
        dx, dw, db = got
        expect_close(dx, dx_want, rank=who, what="dx_shard of row_parallel_linear_backward",
                     hint="this rank's in/t columns of dL/dx")
        expect_close(dw, lin.weight.grad, rank=who, what="dw_shard of row_parallel_linear_"
                     "backward", hint="dW_r sums dy^T x_r token by token, over the s·b tokens")
        expect_close(db, lin.bias.grad, rank=who, what="db of row_parallel_linear_backward",
                     n=t, ratios={"n": "db was summed over the group, but every rank holds "
                                       "the whole dy already"},
                     hint="db sums dy over the s·b tokens")

    on_mesh(program, *tp_mesh(t, strided))


def expect_loss(loss, want: float, *, who: str, what: str, hint: str) -> None:
    """A scalar loss within 1e-10 of one device's (a ratio of two numbers names nothing)."""
    try:
        value = float(loss)
    except (TypeError, ValueError):
        raise GradeFailure(f"{who}: {what} returned {loss!r:.80}, expected a float like "
                           f"{want!r}") from None
    want = float(want)
    if not abs(value - want) <= 1e-12 + 1e-10 * abs(want):
        how = (f"{value!r}, not a finite number" if not np.isfinite(value)
               else f"{value!r}, off by {abs(value - want):.3g}")
        raise GradeFailure(f"{who}: {what}: expected {want!r} but received {how}. {hint}")


MAX_NOTE = (f"a float64 exp overflows past {np.log(np.finfo(np.float64).max):.1f}; subtract "
            "each token's maximum over the WHOLE vocabulary (an all-reduce with op 'max' of "
            "one number a token) before exp, and add it back after the log")


@exercise("4.3", "cross-entropy over a vocabulary split across ranks")
@SETTINGS
@given(t=TP, strided=st.booleans(), s=st.integers(1, 3), b=st.integers(1, 2),
       vocab_per_rank=st.integers(2, 4), seed=SEED)
def check_vocab_parallel_cross_entropy(impl, t, strided, s, b, vocab_per_rank, seed):
    V = vocab_per_rank * t
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, V, (s, b))
    targets.flat[0], targets.flat[-1] = V - 1, 0  # a target on the last rank, one on the first
    # probe: every logit 0 but the targets' (-1), so every shard's max is 0: only the target
    # logit's lookup (the vocabulary offset) can go wrong
    probe = np.zeros((s, b, V))
    np.put_along_axis(probe, targets[..., None], -1.0, axis=-1)
    # a wide range, so that a max over one shard only is not the token's max
    wide = rng.standard_normal((s, b, V)) * 4 + np.arange(V) * 3.0 / V
    # logits near +1000 for the first token, near -1000 for the others: exp overflows
    extreme = rng.standard_normal((s, b, V)) + np.where(np.arange(s * b) == 0, 1000.0,
                                                        -1000.0).reshape(s, b, 1)
    small = s * b * 8  # bytes of one float64 a token: [s, b]

    def program(ctx, spmd):
        g, r, who = spmd.group, spmd.rank, spmd.words
        lo, hi = r * vocab_per_rank, (r + 1) * vocab_per_rank
        for name, logits in (("probe", probe), ("wide", wide), ("extreme", extreme)):
            want, saved = cross_entropy_forward(logits, targets)  # one device, full logits
            saved.release()
            shard = np.ascontiguousarray(np.split(logits, t, axis=-1)[r])  # [s, b, V/t]
            call, events = traced(ctx, spmd, impl.vocab_parallel_cross_entropy_loss, shard,
                                  targets, g, names=["logits_shard", "targets", "group"])
            expect_comm(events, 3, spmd, most_bytes=small, what=(
                "vocab_parallel_cross_entropy_loss"), hint=(
                "no rank may gather the logits: all-reduce one number a token, three times "
                "at most (the max, the target's logit, the sum of exponentials)"))
            loss, what = call.result, f"vocab_parallel_cross_entropy_loss on {name} logits"
            hint = {
                "probe": f"every logit here is 0 but the target's, -1, so the loss is log(V − "
                         f"1 + e^-1) + 1 whatever the max; the target's logit was not found. "
                         f"Rank r of `group` holds vocabulary entries [r·V/t, (r+1)·V/t), r "
                         f"being its group rank (mp.get_rank(group) = {r} here, entries "
                         f"[{lo}, {hi})), not its global rank ({spmd.global_rank})",
                "wide": "subtract from each token's logits their maximum over all t shards "
                        "(a max over this rank's shard differs from rank to rank), and add "
                        "the shards' sums of exponentials",
                "extreme": f"these logits lie near ±1000: {MAX_NOTE}; a single maximum "
                           f"over all tokens leaves the tokens far below it at exp = 0, "
                           f"and log 0 = -inf"}[name]
            expect_loss(loss, want, who=who, what=what, hint=hint)

    on_mesh(program, *tp_mesh(t, strided))


@exercise("4.4", "sequence-parallel LayerNorm gradients")
@SETTINGS
@given(t=TP, strided=st.booleans(), tokens_per_rank=st.integers(1, 3), b=st.integers(1, 2),
       h=st.integers(3, 6), seed=SEED)
def check_sequence_parallel_layernorm(impl, t, strided, tokens_per_rank, b, h, seed):
    s = tokens_per_rank * t
    rng = np.random.default_rng(seed)
    # every position of the sequence on its own scale, so that each rank's part differs
    x = rng.standard_normal((s, b, h)) * (1 + np.arange(s))[:, None, None] + 0.3
    dy = rng.standard_normal((s, b, h))
    gamma = 1.0 + rng.standard_normal(h) / 2
    dx_full, dgamma, dbeta = layernorm_backward(dy, Saved("ln", x=x.copy()), gamma)

    def program(ctx, spmd):
        g, r, who = spmd.group, spmd.rank, spmd.words
        x_r, dy_r = np.split(x, t, axis=0)[r], np.split(dy, t, axis=0)[r]  # [s/t, b, h]
        call, events = traced(ctx, spmd, impl.sequence_parallel_layernorm_grads, dy_r, x_r, gamma,
                              g, names=["dy_shard", "x_shard", "gamma", "group"])
        got = expect_three(call.result, who, "sequence_parallel_layernorm_grads",
                           "dx_shard, dgamma, dbeta")
        expect_comm(events, 2, spmd, most_bytes=2 * h * 8, what=(
            "sequence_parallel_layernorm_grads"), hint=(
            "only dgamma and dbeta ([h] each) need a reduction; LayerNorm normalises each "
            "token over its own h features, so dx needs no communication"))
        dx, dg, db = got
        ratios = {"1/n": "averaged over the group, where each rank's sum over its own tokens "
                         "is one part of a sum: add them, do not average",
                  "n": "every rank's partial sum was counted t times"}
        expect_close(dx, np.split(dx_full, t, axis=0)[r], rank=who,
                     what="dx_shard of sequence_parallel_layernorm_grads",
                     hint="dx of this rank's tokens needs only this rank's data: dx needs "
                          "no communication")
        expect_close(dg, dgamma, rank=who, what="dgamma of sequence_parallel_layernorm_grads",
                     n=t, ratios=ratios, hint="each rank saw s/t of the tokens: dgamma is "
                     "the sum over ALL t ranks of the group of their partial Σ dy·xhat")
        expect_close(db, dbeta, rank=who, what="dbeta of sequence_parallel_layernorm_grads",
                     n=t, ratios=ratios, hint="dbeta is the sum over all t ranks of the "
                     "group of their partial Σ dy")

    on_mesh(program, *tp_mesh(t, strided))


# ---- exercise 4.5: a layout, trained on a simulated cluster -------------------------------

def a100_nodes(nodes: int, gpus: int) -> mp.Topology:
    """nodes x gpus A100s: NVLink 3 inside a node (300 GB/s), InfiniBand HDR across (25)."""
    return mp.Topology.nodes(nodes, gpus, mp.DeviceSpec.a100_80gb(), mp.Link.nvlink3(),
                             mp.Link.infiniband_hdr())


@dataclass(frozen=True)
class Scenario:
    name: str
    topology: mp.Topology
    cfg: GPTConfig
    global_batch: int
    activation_budget: float  # bytes a GPU
    tp_comm_budget: float  # seconds a GPU and step


MODEL = GPTConfig(vocab_size=64, seq_len=64, hidden=64, num_heads=8, num_layers=2,
                  dropout=0.1, seed=0)
#: the lesson's puzzle (section 7), then the same question on another cluster and model
SCENARIOS = (Scenario("the lesson's cluster, 2 nodes x 4 GPUs", a100_nodes(2, 4), MODEL,
                      global_batch=2, activation_budget=700e3, tp_comm_budget=150e-6),
             Scenario("4 nodes x 2 GPUs, 3 layers", a100_nodes(4, 2),
                      MODEL.with_(num_layers=3), global_batch=4, activation_budget=1.8e6,
                      tp_comm_budget=100e-6))
LR, STEPS = 1e-2, 2
HOW = ("recompute", "recompute_segment")  # what a layout may change: how the model computes


def batches(sc: Scenario) -> np.ndarray:
    """STEPS (ids, targets) pairs of [s, global_batch] tokens: [STEPS, 2, s, B]."""
    shape = (STEPS, 2, sc.cfg.seq_len, sc.global_batch)
    return np.random.default_rng(1).integers(0, sc.cfg.vocab_size, shape)


def one_device(sc: Scenario) -> np.ndarray:
    """The losses of STEPS AdamW steps of one GPT on the whole global batch."""
    with mp.device():
        model = GPT(sc.cfg)
        opt = AdamW(model.parameters(), lr=LR)
        losses = []
        for ids, targets in batches(sc):
            losses.append(model.loss_and_grad(ids, targets))
            opt.step()
            opt.zero_grad()
    return np.array(losses)


def read_plan(plan, sc: Scenario):
    """(dims, sequence_parallel, cfg) of a plan, refused in the learner's terms."""
    keys = ["cfg", "dims", "sequence_parallel"]
    if not isinstance(plan, dict) or sorted(plan) != keys:
        raise GradeFailure(f"{sc.name}: choose_tensor_parallel_layout(...) returned "
                           f"{plan!r:.100}, expected a dict with the keys {keys}")
    dims, sp, cfg = plan["dims"], plan["sequence_parallel"], plan["cfg"]
    if not (isinstance(dims, ParallelDims) and isinstance(sp, (bool, np.bool_))
            and isinstance(cfg, GPTConfig)):
        raise GradeFailure(f"{sc.name}: the plan holds {dims!r:.60}, {sp!r:.20}, {cfg!r:.40}; "
                           f"expected ParallelDims(dp_replicate=..., tp=...), True or False, "
                           f"and a GPTConfig")
    world = sc.topology.world_size
    if dims.world_size != world or sc.global_batch % dims.dp:
        raise GradeFailure(
            f"{sc.name}: the plan's mesh has dp x tp = {dims.dp} x {dims.tp} = "
            f"{dims.world_size} ranks for {world} GPUs and {sc.global_batch} sequences a "
            f"step; every GPU trains, so dp x tp = {world}, and dp must divide "
            f"{sc.global_batch} (each dp rank trains whole sequences)")
    return dims, bool(sp), cfg


def train(sc: Scenario, dims: ParallelDims, sp: bool, cfg: GPTConfig) -> dict:
    """STEPS steps on the simulated cluster; step 1's activation peak and tp collective
    time on every rank, and the losses averaged over the dp ranks."""
    data = batches(sc)

    def program(ctx):
        run = parallelize(cfg, dims, zero=0, sequence_parallel=sp, lr=LR,
                          placement="any")  # graded by the clock, not warned
        tp = tuple(run.groups.tp.ranks)
        losses = []
        for i, (ids, targets) in enumerate(data):
            mp.barrier()
            if i == 0:
                ctx.ledger.reset_peak()
                base, first = ctx.ledger.held("activations"), len(ctx.trace.events)
            losses.append(run.train_step(ids, targets))
            if i == 0:
                ctx.resolve_pending()
                peak = ctx.ledger.peak("activations") - base
                comm = sum(e.duration for e in ctx.trace.events[first:]
                           if e.stream == "comm" and e.group == tp)
        return losses, peak, comm, tp, run.groups.coordinate["tp"]

    res = mp.launch(program, sc.topology.world_size, topology=sc.topology)
    peak = max(range(len(res)), key=lambda q: res[q][1])
    slow = max(range(len(res)), key=lambda q: res[q][2])
    return {"losses": np.mean([r[0] for r in res if r[4] == 0], axis=0),
            "peak": res[peak][1], "peak_rank": peak, "comm": res[slow][2],
            "comm_rank": slow, "tp_group": res[slow][3]}


def memory_hint(sp: bool, cfg: GPTConfig) -> str:
    why = []
    if not sp:
        why.append("sequence parallelism is off, so what lies between the blocks (LayerNorm "
                   "and dropout inputs, their masks) is whole on every GPU of a tp group "
                   "(section 5)")
    if cfg.recompute == "none":
        why.append("nothing is recomputed, so every layer keeps its attention scores and "
                   "probabilities (selective recomputation drops them; lesson 00)")
    return "; ".join(why) + "; the ledger counts every byte a layer keeps for backward"


def time_hint(sc: Scenario, ranks: tuple, cfg: GPTConfig) -> str:
    topo = sc.topology
    nodes = sorted({topo.node_of(q) for q in ranks})
    if len(nodes) > 1:
        return (f"its tp group {list(ranks)} spans nodes {nodes}: its collectives cross "
                f"{topo.inter.name} ({topo.inter.bandwidth / 1e9:g} GB/s a GPU) instead of "
                f"{topo.intra.name} ({topo.intra.bandwidth / 1e9:g} GB/s) inside a node "
                f"(section 6)")
    if cfg.recompute == "full":
        return ("full recomputation runs every block's forward again in backward, its "
                "tensor-parallel collectives included")
    return "each tp collective of a larger group moves more and waits on more ranks"


@exercise("4.5", "a tensor-parallel layout within a memory and a time budget")
def check_tensor_parallel_layout(impl):
    for sc in SCENARIOS:
        plan = impl.choose_tensor_parallel_layout(sc.cfg, sc.topology, sc.global_batch,
                                                  sc.activation_budget, sc.tp_comm_budget)
        dims, sp, cfg = read_plan(plan, sc)
        got = train(sc, dims, sp, cfg)
        changed = [f"{f.name} {getattr(sc.cfg, f.name)!r} -> {getattr(cfg, f.name)!r}"
                   for f in fields(GPTConfig) if f.name not in HOW
                   and getattr(cfg, f.name) != getattr(sc.cfg, f.name)]
        expect_close(got["losses"], one_device(sc), rtol=1e-9, atol=1e-12, what=(
            f"{sc.name}: the losses of {STEPS} training steps"), hint=(
            f"your plan's cfg changes what the model computes ({', '.join(changed)}); a "
            f"layout may change only how ({' or '.join(HOW)})" if changed else
            "the layout must train the model one device trains"))
        layout = (f"dp={dims.dp}, tp={dims.tp}, sequence_parallel={sp}, "
                  f"recompute={cfg.recompute!r}")
        expect_within(got["peak"] / 1e3, sc.activation_budget / 1e3, unit="kB", what=(
            f"{sc.name}: with {layout}, the peak of activations on global rank "
            f"{got['peak_rank']}"), hint=memory_hint(sp, cfg))
        expect_within(got["comm"] * 1e6, sc.tp_comm_budget * 1e6, unit="us", what=(
            f"{sc.name}: with {layout}, the time global rank {got['comm_rank']} spends in "
            f"tensor-parallel collectives a step"), hint=time_hint(sc, got["tp_group"], cfg))
