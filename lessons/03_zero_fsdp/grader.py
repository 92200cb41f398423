"""Grader for lesson 03: your ZeRO-1 step on a 2-D mesh, over the group it is given, against
one device running minipar's AdamW; your byte and traffic counts against minipar.plan's;
your plan of Exercise 3.4 run on simulated devices against its budgets and one device."""

import dataclasses
import functools
import re

import numpy as np
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, calls, exercise, expect_close,
                                    expect_equal, expect_within, mesh_of, on_mesh, on_ranks,
                                    world_sizes)
from minipar.data import split_microbatches
from minipar.nn import GPT, GPTConfig, Parameter
from minipar.optim import AdamW
from minipar.parallel import zero_engine
from minipar.parallel.dp import accumulate_gradients
from minipar.plan import dp_comm_elements, flat_padding, model_state_bytes
from minipar.runtime.errors import MiniparError, SimulatedOutOfMemoryError
from minipar.runtime.ledger import CATEGORIES, fmt_bytes
from minipar.runtime.mesh import DeviceMesh
from minipar.runtime.reference import reduce_blocks

BETAS = (0.9, 0.99)  # not the defaults: the hyperparameters passed in must be the ones used
EPS = 1e-8


def initial_weights(numel: int) -> np.ndarray:
    return np.sin(1.0 + 0.37 * np.arange(numel))  # [numel]


def local_grad(rank: int, t: int, numel: int, which: int, scale: float) -> np.ndarray:
    """Group rank `rank`'s gradient at step t in group `which`: different on every rank,
    index, step and group (a learner's code that mixes groups gets other numbers)."""
    i = np.arange(numel)
    return scale * ((rank + 1) * np.cos(0.7 * i + 1.3 * rank + 0.5 * t + 2.1 * which)
                    + 0.1 * (i - rank - which))  # [numel]


def padded_to(x: np.ndarray, padded: int) -> np.ndarray:
    out = np.zeros(padded)
    out[:x.size] = x
    return out


def one_device(numel: int, n: int, steps: int, hyper: dict, which: int,
               scale: float) -> list[tuple]:
    """minipar's AdamW on one device with group `which`'s averaged gradient: (w, m, v)
    after each step, each [numel]. The average is the collective's, ((g_0 + g_1) + ...) / n."""
    out = []
    with mp.device():
        p = Parameter("w", initial_weights(numel))
        opt = AdamW([p], **hyper)
        for t in range(1, steps + 1):
            p.grad = reduce_blocks([local_grad(r, t, numel, which, scale) for r in range(n)],
                                   "avg")
            opt.step()
            state = opt.state["w"]
            out.append((p.data.copy(), state["m"].copy(), state["v"].copy()))
    return out


def wrong_group(events, spmd, error: str = "") -> str:
    """What the call's collectives did with the group, if not what it should: from the
    trace, or from a collective's error that names another group."""
    used = [(e.name, list(e.group)) for e in events
            if e.stream == "comm" and tuple(e.group) != tuple(spmd.group.ranks)]
    for kind, ranks in re.findall(r"(\w+) over group \w*\[([\d, ]+)\]", error):
        if [int(x) for x in ranks.split(",")] != list(spmd.group.ranks):
            used.append((kind, [int(x) for x in ranks.split(",")]))
    if not used:
        return ""
    kind, ranks = used[0]
    return (f"{spmd.words}: zero1_step ran {kind} over ranks {ranks}, not over `group` = "
            f"{list(spmd.group.ranks)}: pass group=group to every collective, and take r and "
            "n from the group: mp.get_rank(group), mp.get_world_size(group)")


RANK_HINT = ("; r is this rank's position in `group`, mp.get_rank(group) (here {rank}), "
             "not its global rank ({global_rank})")


def call_on_group(ctx, spmd, fn, args: tuple, kwargs: dict, what: str, rank_hint: str):
    """calls(fn, *args, **kwargs), with what it did wrong on the group said in the group's
    words: a collective over another group (from the trace, or from the error it raised),
    a collective's error on a rank whose group rank is not its global rank."""
    start = len(ctx.trace.events)
    try:
        call = calls(ctx, fn, *args, **kwargs, rank=spmd.words,
                     names=["flat_params", "flat_grad", "m", "v", "step"])
    except (GradeFailure, NotImplementedError):
        raise
    except Exception as e:
        problem = wrong_group(ctx.trace.events[start:], spmd, str(e))
        if problem:
            raise GradeFailure(problem) from e
        if isinstance(e, MiniparError) and rank_hint:
            raise GradeFailure(f"{spmd.words}: {what} raised {type(e).__name__}: "
                               f"{str(e).splitlines()[0]}{rank_hint}") from e
        raise
    problem = wrong_group(ctx.trace.events[start:], spmd)
    if problem:
        raise GradeFailure(problem)
    return call


@exercise("3.1", "the ZeRO-1 AdamW step: reduce-scatter, Adam on the shard, all-gather")
@SETTINGS
@given(n=world_sizes(1, 4, first=2), strided=st.booleans(), numel=st.integers(1, 13),
       steps=st.integers(1, 3), lr=st.sampled_from([1e-2, 1e-3]),
       weight_decay=st.sampled_from([0.0, 0.1]), scale=st.sampled_from([1.0, 1e-7]))
def check_zero1_step(impl, n, strided, numel, steps, lr, weight_decay, scale):
    shape, names, dim = mesh_of(n, strided=strided)
    groups = [tuple(g.ranks) for g in DeviceMesh(shape, names).groups(dim)]
    padded = numel + flat_padding(numel, n)
    shard = padded // n
    hyper = dict(lr=lr, betas=BETAS, eps=EPS, weight_decay=weight_decay)
    expected = [one_device(numel, n, steps, hyper, i, scale) for i in range(len(groups))]
    wire = 2 * padded * (n - 1) / n * 8  # bytes: reduce-scatter + all-gather of float64
    ratios = {"n": "the gradient was summed over the group, not averaged: reduce_scatter(..., "
                   "'avg')", "1/n": "the average was divided by n once more"}

    def program(ctx, spmd):
        r, which = spmd.rank, groups.index(tuple(spmd.group.ranks))
        lo, hi = r * shard, (r + 1) * shard
        rank_hint = "" if r == spmd.global_rank else RANK_HINT.format(
            rank=r, global_rank=spmd.global_rank)
        w, m, v = padded_to(initial_weights(numel), padded), np.zeros(shard), np.zeros(shard)
        for t, (ew, em, ev) in enumerate(expected[which], start=1):  # [numel] each
            what = (f"zero1_step(flat_params [{padded}], flat_grad [{padded}], m [{shard}], "
                    f"v [{shard}], step={t}, group of {n}, lr={lr}, betas={BETAS}, eps={EPS}, "
                    f"weight_decay={weight_decay})")
            g = padded_to(local_grad(r, t, numel, which, scale), padded)
            call = call_on_group(ctx, spmd, impl.zero1_step, (w, g, m, v, t),
                                 dict(group=spmd.group, **hyper), what, rank_hint)
            if n > 1:
                expect_equal(call.collectives, ["reduce_scatter", "all_gather"], rank=spmd.words,
                             what=f"the collectives {what} ran",
                             hint="each rank needs only its own shard of the averaged gradient "
                                  "(a reduce-scatter sends half an all-reduce's bytes) and every "
                                  "rank needs the whole updated weights afterwards (lesson.py, "
                                  "section 2)")
            out = call.result
            if not (isinstance(out, tuple) and len(out) == 3):
                raise GradeFailure(f"{spmd.words}: {what} returned {type(out).__name__}, "
                                   "expected a tuple (new flat_params, new m, new v)")
            w, m, v = (np.asarray(a) for a in out)
            ew, em, ev = (padded_to(a, padded) for a in (ew, em, ev))  # [padded] each
            expect_equal(w.shape, (padded,), rank=spmd.words,
                         what=f"the shape of the flat_params {what} returned",
                         hint="return the whole flat weights, padding included, as all_gather "
                              "assembles them from every rank's shard" + rank_hint)
            own = (f"the shard this rank owns, flat[{lo}:{hi}] (group rank {r} of {n})"
                   + rank_hint)
            expect_close(m, em[lo:hi], rank=spmd.words, what=f"{what}: the new m", n=n,
                         ratios=ratios, hint=f"m is Adam's first moment of {own}")
            expect_close(v, ev[lo:hi], rank=spmd.words, what=f"{what}: the new v", n=n,
                         hint=f"v is Adam's second moment (of g²) of {own}")
            expect_close(w[lo:hi], ew[lo:hi], rank=spmd.words, n=n,
                         what=f"{what}: flat_params[{lo}:{hi}], the shard this rank updated",
                         hint="AdamW on the owned shard as minipar/optim/adam.py computes it: "
                              "bias correction with this step's t (m̂ = m/(1 − β1^t)), decoupled "
                              "decay before the Adam update, ε outside the square root; the "
                              "shard is contiguous, the chunk reduce_scatter returns to this rank"
                              + rank_hint)
            expect_close(w, ew, rank=spmd.words, what=f"{what}: the new flat_params", n=n,
                         hint="this rank's own shard is right, so the others' are not: every "
                              "rank r must update flat[r·Ψ'/n:(r+1)·Ψ'/n] and all_gather puts "
                              "the shards back in group-rank order")
            expect_close(call.bytes_sent, wire, rank=spmd.words, rtol=1e-12, atol=1e-9, n=n,
                         what=f"bytes this rank sent during {what}",
                         ratios={"2": "the whole buffer was gathered or reduced where a shard "
                                      "was enough"},
                         hint="one reduce_scatter of the padded gradient and one all_gather of "
                              "the updated shard, float64: DDP's all-reduce volume, no more")

    on_mesh(program, shape, names, dim)


PSI = st.integers(1, 10**12)  # parameter counts that rarely divide n: padding matters
N = st.one_of(world_sizes(1, 8, first=2), st.sampled_from([64, 1000]))
DTYPES = st.sampled_from([(2, 2, 12), (8, 8, 16), (4, 4, 8)])  # bf16 + fp32 Adam; fp64; fp32


def padding_slip(got, expected, unpadded, padded, stage: int, psi: int, n: int) -> str:
    """The padding mistake `got` is, if it is one (every value explained by it): Ψ counted
    where the stage pads to Ψ', or DDP padded. Values: numbers, or dicts of numbers."""
    def same(a, b) -> bool:
        keys = sorted(a) if isinstance(a, dict) else [None]
        pick = (lambda d, k: d[k]) if isinstance(a, dict) else (lambda d, k: d)
        return all(np.isclose(float(pick(a, k)), float(pick(b, k)), rtol=1e-12, atol=0)
                   for k in keys)

    pad = flat_padding(psi, n)
    if not pad or same(got, expected):
        return ""
    if stage >= 1 and same(got, unpadded):
        return (f"it counts Ψ = {psi} elements, but stage {stage} pads the flat buffer to "
                f"Ψ' = {psi + pad}, a multiple of n = {n}, and holds Ψ'/n-element shards of "
                "what it partitions, Ψ' elements of what it keeps whole (lesson.py, section 2)")
    if stage == 0 and same(got, padded):
        return ("it counts the padded Ψ', but DDP pads nothing: an all-reduce needs no equal "
                "shards, so it holds and sends the Ψ elements as they are")
    return ""


@exercise("3.2", "model-state bytes per rank, padding included")
@SETTINGS
@given(psi=PSI, stage=st.integers(0, 3), n=N, sizes=DTYPES)
def check_zero_bytes_per_rank(impl, psi, stage, n, sizes):
    pb, gb, k = sizes

    def bytes_with(padding: int) -> dict:
        return model_state_bytes(psi, stage, n, k=k, param_bytes=pb, grad_bytes=gb,
                                 padding=padding)

    pad = flat_padding(psi, n)
    expected = bytes_with(pad if stage else 0)
    unpadded = bytes_with(0)
    padded = (model_state_bytes(psi + pad, 0, n, k=k, param_bytes=pb, grad_bytes=gb)
              if stage == 0 else expected)  # DDP counting Ψ' (model_state_bytes pads no DDP)
    call = (f"zero_bytes_per_rank(psi={psi}, stage={stage}, n={n}, param_bytes={pb}, "
            f"grad_bytes={gb}, k={k})")
    got = impl.zero_bytes_per_rank(psi, stage, n, param_bytes=pb, grad_bytes=gb, k=k)
    if not isinstance(got, dict):
        raise GradeFailure(f"{call} returned {type(got).__name__}, expected a dict with keys "
                           "'parameters', 'gradients', 'optimizer_states' and 'total'")
    expect_equal(sorted(got), sorted(expected), what=f"the keys of {call}",
                 hint="use the ledger's category names, plus 'total'")
    slip = padding_slip(got, expected, unpadded, padded, stage, psi, n)
    if slip:
        raise GradeFailure(f"{call} is {got!r}, expected {expected!r}: {slip}")
    held = {"parameters": 3, "gradients": 2, "optimizer_states": 1}  # partitioned from stage
    for key in ("parameters", "gradients", "optimizer_states", "total"):
        whole = key != "total" and stage < held[key]
        ratios = ({"1/n": f"stage {stage} keeps the {key.replace('_', ' ')} whole, "
                          "not partitioned"} if whole else
                  {"n": f"stage {stage} partitions the {key.replace('_', ' ')} over the n "
                        "ranks"} if key != "total" else {})
        expect_close(got[key], expected[key], rtol=1e-12, atol=0, what=f"{call}[{key!r}]",
                     n=n, ratios=ratios,
                     hint="at stages >= 1 every term counts the padded Ψ' = Ψ + ((−Ψ) mod n) "
                          "elements (a shard is Ψ'/n); DDP pads nothing (lesson.py, section 3)")


@exercise("3.3", "elements sent per rank and step under DDP and ZeRO-1/2/3")
@SETTINGS
@given(psi=PSI, stage=st.integers(0, 3), n=N)
def check_zero_comm_elements(impl, psi, stage, n):
    expected = dp_comm_elements(psi, stage, n, padding=flat_padding(psi, n) if stage else 0)
    call = f"zero_comm_elements(psi={psi}, stage={stage}, n={n})"
    got = impl.zero_comm_elements(psi, stage, n)
    if isinstance(got, (int, float, np.number)) and not isinstance(got, bool):
        slip = padding_slip(got, expected, dp_comm_elements(psi, stage, n),
                            dp_comm_elements(psi + flat_padding(psi, n), 0, n), stage, psi, n)
        if slip:
            raise GradeFailure(f"{call} is {got!r}, expected {expected!r}: {slip}")
    per_pass = ("1/n of the buffer counted per pass, where a ring rank sends (n−1)/n of it "
                "(lesson 01)")
    one_pass = ("an all-reduce counted as one pass over the buffer: a ring all-reduce is a "
                "reduce-scatter plus an all-gather")
    ratios = {"1/(n-1)": per_pass, "1/2": one_pass}
    if n == 3:  # ½ = 1/(n − 1): either mistake
        ratios["1/2"] = f"either {one_pass}, or {per_pass}"
    passes = {(3, 2 / 3): "received = ⅔ expected: ZeRO-3 gathers the weights for the forward "
                          "and again for the backward (section 4)",
              (2, 1.5): "received = 1.5× expected: only ZeRO-3 gathers the weights a second "
                        "time"}  # a pass too few or too many, which only this exercise names
    for (kind, ratio), meaning in passes.items():
        if (stage == 3) == (kind == 3) and expected and isinstance(got, (int, float)) \
                and np.isclose(got / expected, ratio, rtol=1e-12, atol=0):
            raise GradeFailure(f"{call} is {got!r}, expected {expected!r}: {meaning}")
    expect_close(got, expected, rtol=1e-12, atol=0, n=n, what=call, ratios=ratios,
                 hint="which collectives this stage runs and over which buffer: lesson.py "
                      "sections 2 and 4; stages >= 1 send the padded Ψ'")


# ---- Exercise 3.4: a plan, run on simulated devices ---------------------------------------

CFG = GPTConfig(vocab_size=32, seq_len=16, hidden=16, num_heads=2, num_layers=4)
MEMORY_BUDGET = 520 * 1024  # bytes per rank
HYPER = dict(lr=1e-2, betas=BETAS, eps=EPS, weight_decay=0.1)
STAGE3 = ("limit_all_gathers", "reshard_after_forward", "forward_prefetch",
          "backward_prefetch", "prefetch_depth")
STEP = ("stage", "micro_batches", "no_sync")
FIELDS = tuple(f.name for f in dataclasses.fields(GPTConfig))


@functools.cache
def padded_numel(n: int) -> int:
    """Ψ': every unit's flat buffer padded to a multiple of n, summed."""
    with mp.device():
        return sum(numel + flat_padding(numel, n) for numel in
                   (sum(p.size for p in params) for _, params in GPT(CFG).units()))


def traffic_budget(n: int) -> float:
    """Bytes of one ring all-reduce of the padded float64 gradients: 2Ψ'(n − 1)/n · 8."""
    return 8 * 2 * padded_numel(n) * (n - 1) / n


def tokens(n: int, batch: int) -> np.ndarray:
    return np.random.default_rng(n * 100 + batch).integers(
        0, CFG.vocab_size, (CFG.seq_len + 1, n * batch))  # [s + 1, n·batch]


def read_plan(plan, batch: int) -> dict:
    """The plan's parts, or a GradeFailure saying what a plan is."""
    if not isinstance(plan, dict):
        raise GradeFailure(f"fit_plan returned {type(plan).__name__} {plan!r:.60}, expected a "
                           "dict such as {'stage': 1, 'micro_batches': 2}")
    unknown = sorted(set(plan) - set(STEP) - set(STAGE3) - set(FIELDS))
    if unknown:
        raise GradeFailure(f"the plan's keys {unknown} mean nothing here: a plan has {STEP}, "
                           f"ZeRO-3's {STAGE3}, and GPTConfig fields")
    stage, k = plan.get("stage"), plan.get("micro_batches", 1)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise GradeFailure(f"the plan's 'stage' is {stage!r}: give a ZeRO stage, 0 (DDP), 1, 2 "
                           "or 3 (FSDP FULL_SHARD)")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or batch % k:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise GradeFailure(f"the plan's 'micro_batches' is {k!r} for a batch of {batch} "
                           f"sequences per rank: it must divide it, one of {divisors}")
    knobs = {key: plan[key] for key in STAGE3 if key in plan}
    if knobs and stage != 3:
        raise GradeFailure(f"{sorted(knobs)} are ZeRO-3's knobs; the plan's stage is {stage}")
    no_sync = plan.get("no_sync", True)
    if not isinstance(no_sync, bool):
        raise GradeFailure(f"the plan's 'no_sync' is {no_sync!r}: True (the micro-batches but "
                           "the last skip communication) or False (each one reduces)")
    return {"stage": stage, "k": k, "no_sync": no_sync, "engine": knobs,
            "model": {key: plan[key] for key in FIELDS if key in plan}}


def run_plan(parts: dict, n: int, batch: int, capacity=None) -> list[dict]:
    """One training step as the plan says, on n simulated ranks: per rank its mean loss,
    the ledger's peaks (total and by category), the bytes it sent and the whole new weights.
    capacity: the ledger's, from when the engine is built (over it: out of memory)."""
    ids = tokens(n, batch)

    def program(ctx):
        model = GPT(CFG.with_(**parts["model"]))
        engine = zero_engine(model, stage=parts["stage"], **HYPER, **parts["engine"])
        ctx.ledger.reset_peak()  # the whole model each rank built before sharding is gone
        ctx.ledger.capacity, sent = capacity, ctx.trace.bytes_sent()
        cols = slice(ctx.rank * batch, (ctx.rank + 1) * batch)
        micro = split_microbatches(ids[:-1, cols], ids[1:, cols], parts["k"])
        loss = accumulate_gradients(model, engine, micro, no_sync=parts["no_sync"])
        engine.step()
        ctx.ledger.capacity = None
        out = {"loss": loss, "peak": ctx.ledger.peak(), "sent": ctx.trace.bytes_sent() - sent,
               "peaks": {c: ctx.ledger.peak(c) for c in CATEGORIES}}
        return {**out, "weights": engine.full_state_dict()}

    return on_ranks(program, n)


@functools.cache
def reference(n: int, batch: int) -> tuple[float, dict]:
    """One device, the whole batch of n·batch sequences, one AdamW step: (loss, weights)."""
    ids = tokens(n, batch)
    with mp.device():
        model = GPT(CFG)
        opt = AdamW(model.parameters(), **HYPER)
        loss = model.loss_and_grad(ids[:-1], ids[1:])
        opt.step()
        return loss, {p.name: p.data.copy() for p in model.parameters()}


def memory_advice(parts: dict, peaks: dict, oom: str) -> str:
    """What the ledger says about where the bytes went, and which lever moves them."""
    psi = CFG.num_parameters()
    lines = ["each category's own peak: " + ", ".join(
        f"{c} {fmt_bytes(peaks[c])}" for c in sorted(peaks, key=lambda c: -peaks[c])
        if peaks[c])]
    if parts["stage"] in (2, 3) and parts["k"] > 1 and parts["no_sync"] \
            and peaks["gradients"] >= 8 * psi:
        lines.append("under no_sync, ZeRO-2 and ZeRO-3 keep every unit's whole gradient until "
                     "the last micro-batch, on top of the gradient shards (section 6)")
    if max(peaks, key=peaks.get) == "activations":
        lines.append("activations are the largest: ZeRO does not shard them; they grow with "
                     "the sequences of a micro-batch and with what each block keeps for its "
                     "backward")
    elif parts["stage"] == 0:
        lines.append("DDP holds the whole model state on every rank (section 3)")
    if oom:
        lines.append("where it first went over: " + oom.split("\nShard more")[0])
    return ";\n    ".join(lines)


def traffic_advice(parts: dict) -> str:
    """Which part of the plan sends more than one all-reduce."""
    said = []
    if parts["stage"] == 3:
        said.append("ZeRO-3 all-gathers each unit's weights for its forward and again for its "
                    "backward, besides the reduce-scatter (section 4), and again for every "
                    "micro-batch")
    if not parts["no_sync"] and parts["k"] > 1:
        said.append(f"no_sync=False reduces the gradients of every micro-batch: {parts['k']} "
                    "reductions in the step")
    return "; ".join(said)


@exercise("3.4", "fit a training step under a memory and a traffic budget")
@settings(SETTINGS, max_examples=12)
@given(n=world_sizes(2, 4, first=2), batch=st.sampled_from([1, 2, 4, 8]))
def check_fit_plan(impl, n, batch):
    budget = traffic_budget(n)
    plan = impl.fit_plan(CFG, n, batch, MEMORY_BUDGET, budget)
    parts = read_plan(plan, batch)
    what = f"the plan {plan} (n={n} ranks, batch={batch} sequences each)"
    oom = ""
    try:
        ranks = run_plan(parts, n, batch, capacity=MEMORY_BUDGET)
    except SimulatedOutOfMemoryError as e:
        oom, ranks = str(e), run_plan(parts, n, batch)  # again, to measure the whole peak
    loss, weights = reference(n, batch)
    changed = {k: v for k, v in parts["model"].items()
               if not k.startswith("recompute") and v != getattr(CFG, k)}
    hint = ("the plan changes what the model computes: " + ", ".join(
        f"{k}={v!r} (the model's: {getattr(CFG, k)!r})" for k, v in changed.items())
        + "; a plan may change how the step runs (sharding, recomputation, micro-batches), "
          "not its numbers") if changed else "every rank must take one device's step"
    for name, w in weights.items():  # the arrays first: they say more than the loss
        expect_close(ranks[0]["weights"][f"param/{name}"], w, rtol=1e-9, atol=1e-12,
                     what=f"{what}: {name} after the step", hint=hint)
    expect_close(np.mean([r["loss"] for r in ranks]), loss, what=f"{what}: the loss",
                 hint=hint)
    for r, out in enumerate(ranks):
        expect_within(out["peak"] / 1024, MEMORY_BUDGET / 1024, rank=r, unit="KiB",
                      what=f"{what}: the peak memory", hint=memory_advice(parts, out["peaks"], oom))
        expect_within(out["sent"] / 1024, budget * (1 + 1e-12) / 1024, rank=r, unit="KiB",
                      what=f"{what}: the bytes sent in the step ({out['sent'] / budget:.3g}× "
                           "one all-reduce of the gradients)", hint=traffic_advice(parts))
