"""Grader for lesson 00: byte counts against minipar.plan's, and a plan run on simulated GPUs.

Exercises 0.1-0.3 are pure functions: each check states the most specific fact first (one
GPU shards nothing; what a stage keeps whole; then the value at the drawn size) and names
ratios. Exercise 0.4 is graded on the simulated cluster, not against a formula: the plan's
step runs on 4 GPUs, its gradient is compared with one device's (a float64 twin), its
FLOPs are read from the trace and its memory from every GPU's ledger.
"""

from functools import lru_cache

import numpy as np
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_equal, expect_within)
from minipar.nn import GPT, GPTConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.plan import activation_bytes_per_layer, model_state_bytes

FAST = settings(SETTINGS, max_examples=60)  # checks of pure functions: more examples, ms each
PSI = st.integers(1, 10**12).map(lambda k: k * 1024)  # parameter counts that are not round
# n shrinks toward 2 (the first entry); 1, the edge case, is tried last
N = st.sampled_from([2, 4, 3, 8, 16, 64, 1024, 1])
WHOLE = {0: "DDP (stage 0) replicates: every GPU holds all of the model states, whatever n",
         1: "ZeRO-1 shards the optimizer states (the fp32 master weights and both Adam "
            "moments) and keeps the bf16 weights and gradients whole",
         2: "ZeRO-2 shards the gradients too: only the bf16 weights stay whole",
         3: "ZeRO-3 shards the weights too: nothing stays whole"}


def split(f, psi, stage):
    """(replicated, sharded) bytes of a count of the form R + S/n, read at n = 1 and 2."""
    one, two = float(f(psi, stage, 1)), float(f(psi, stage, 2))
    return 2 * two - one, 2 * (one - two)


def reference_states(psi, stage, n):
    return model_state_bytes(psi, stage, n)["total"]


@exercise("0.1", "model-state bytes per GPU for DDP and ZeRO-1/2/3")
@FAST
@given(psi=PSI, stage=st.integers(0, 3), n=N)
def check_model_state_bytes(impl, psi, stage, n):
    f = impl.model_state_bytes_per_gpu
    call = f"model_state_bytes_per_gpu(psi={psi}, stage={stage}, n={{}})"
    one, want_one = f(psi, stage, 1), reference_states(psi, stage, 1)
    expect_close(one, want_one, rtol=1e-12, atol=0, what=call.format(1),
                 ratios={"1/2": "counts half of the bytes a parameter costs"},
                 hint=f"with one GPU nothing is sharded, at any stage: received "
                      f"{float(one) / psi:g} bytes a parameter; section 1 lists what each "
                      "parameter costs in mixed-precision Adam")
    (r, s), (r0, s0) = split(f, psi, stage), split(reference_states, psi, stage)
    if not np.isclose(r, r0, rtol=1e-9, atol=1e-6 * psi):
        raise GradeFailure(
            f"{call.format('1 and 2')}: your count keeps {r / psi:g} bytes a parameter whole "
            f"on every GPU (the part no n divides) and shards {s / psi:g}; ZeRO stage "
            f"{stage} keeps {r0 / psi:g} whole and shards {s0 / psi:g}. {WHOLE[stage]}")
    expect_close(f(psi, stage, n), reference_states(psi, stage, n), rtol=1e-12, atol=0,
                 what=call.format(n),
                 hint=f"your count is right at n = 1 and n = 2 but not at n = {n}: does it "
                      "stop dividing the sharded bytes beyond some n? They are split over "
                      "all n GPUs")


@exercise("0.2", "activation bytes of a whole model, per recomputation mode")
@FAST
@given(s=st.integers(1, 8192), b=st.integers(1, 16), heads=st.integers(1, 64),
       head_dim=st.integers(1, 256), layers=st.integers(1, 128),
       recompute=st.sampled_from(["none", "selective", "full"]))
def check_activation_bytes(impl, s, b, heads, head_dim, layers, recompute):
    h = heads * head_dim
    per = {m: activation_bytes_per_layer(s, b, h, heads, m)
           for m in ("none", "selective", "full")}
    got = impl.activation_bytes(s, b, h, heads, layers, recompute)
    expected = layers * per[recompute]
    hint = ""
    if isinstance(got, (int, float, np.number)) and not np.isclose(got, expected,
                                                                  rtol=1e-12, atol=0):
        same = [m for m in per if m != recompute and np.isclose(got, layers * per[m])]
        c, c0 = float(got) / (layers * s * b * h), expected / (layers * s * b * h)
        hint = (f"your count for recompute={recompute!r} is the count of {same[0]!r}; "
                if same else "")
        if not np.isclose(got, per[recompute], rtol=1e-12, atol=0):  # not one layer's count
            hint += f"per layer and per element of s·b·h it is {c:.6g} bytes where {c0:.6g} " \
                    "were expected"
        if recompute == "full" and float(got) == 0:
            hint += ("; full recomputation still keeps each layer's input: the backward "
                     "reruns the layer's forward from it")
        if c.is_integer() and not c0.is_integer():
            hint += ("; the expected count is not a whole number of bytes per element here: "
                     "did an integer division (//) drop a fraction?")
    expect_close(got, expected, rtol=1e-12, atol=0, n=layers,
                 ratios={"1/n": "one layer's count: the model has `layers` of them"},
                 what=f"activation_bytes(s={s}, b={b}, h={h}, a={heads}, layers={layers}, "
                      f"recompute={recompute!r})", hint=hint)


def fewest_gpus(psi, stage, gpu):
    """The smallest n with minipar's model-state count within gpu (None: no n up to 2^62),
    found by bisection: the count never grows with n."""
    def fits(n):
        return reference_states(psi, stage, n) <= gpu
    if not fits(2**62):
        return None
    lo, hi = 0, 1  # fits(hi), and lo = 0 or not fits(lo)
    while not fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


FLOOR = {1: (4, 12), 2: (2, 14)}  # stage: bytes a parameter kept whole, sharded
GPU_GB = st.sampled_from([80, 16, 24, 40, 141])
PLAIN = st.tuples(st.integers(1, 2000).map(lambda k: k * 10**8 + 7), st.integers(0, 3),
                  GPU_GB.map(lambda g: g * 1e9))


@st.composite
def exact_fit(draw):
    """A model that fills the GPUs exactly at some n: the budget is its count there."""
    n, stage = draw(st.integers(1, 5000)), draw(st.integers(1, 3))
    psi = n * draw(st.integers(1, 10**6))
    return psi, stage, reference_states(psi, stage, n)


@st.composite
def many_gpus(draw):
    """ZeRO-1/2 just above their floor: thousands of GPUs and more."""
    stage, gpu = draw(st.sampled_from([1, 2])), draw(GPU_GB) * 1e9
    whole, sharded = FLOOR[stage]
    return int(gpu / (whole + sharded / draw(st.integers(1025, 10**6)))), stage, gpu


@exercise("0.3", "the fewest GPUs whose memory holds the model states")
@FAST
@given(case=st.one_of(PLAIN, exact_fit(), many_gpus()))
def check_min_gpus(impl, case):
    psi, stage, gpu = case
    expected, got = fewest_gpus(psi, stage, gpu), impl.min_gpus(psi, stage, gpu)
    what = f"min_gpus(psi={psi}, stage={stage}, gpu_bytes={gpu!r})"
    if got == expected:
        return
    if expected is None:
        hint = (f"no number of GPUs is enough: even n = 2^40 GPUs hold "
                f"{reference_states(psi, stage, 2**40):,.0f} bytes each, over "
                f"{gpu:,.0f}: what no n divides does not fit. {WHOLE[stage]}")
    elif got is None or not isinstance(got, (int, np.integer)) or got < 1:
        hint = (f"n = {expected} GPUs hold {reference_states(psi, stage, expected):,.0f} "
                f"bytes each, within {gpu:,.0f}: an answer exists"
                + (" (more than a thousand GPUs: does your search stop early?)"
                   if expected > 1000 else ""))
    elif got < expected:
        have = reference_states(psi, stage, int(got))
        hint = f"at n = {got} each GPU holds {have:,.0f} bytes, over {gpu:,.0f} by {have - gpu:,.0f}"
    else:
        have = reference_states(psi, stage, expected)
        hint = (f"fewer GPUs already fit: at n = {expected} each GPU holds {have:,.0f} bytes, "
                f"within {gpu:,.0f}" + (" (exactly the budget: a model that fills the memory "
                                        "exactly fits)" if have == gpu else ""))
    expect_equal(got, expected, what=what, hint=hint)


# ---- Exercise 0.4: a plan, run on simulated GPUs ------------------------------------------
MODEL = dict(vocab_size=128, hidden=64, num_heads=4, num_layers=4)
GPUS, GLOBAL_BATCH, BUDGET, MAX_FLOPS_RATIO = 4, 16, 3_000_000, 1.10
SEQ_LENS = (32, 64, 128)
KEYS = ("zero", "recompute", "micro_batch", "accumulation")
RERUNS = {"full": "full recomputation reruns every layer's whole forward in the backward",
          "selective": "selective recomputation reruns the attention scores in the backward",
          "none": "with no recomputation the step runs each forward once"}
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "comm_buffers")


def stream(seq_len, sequences):
    """The data: `sequences` sequences of seq_len tokens, [s, B], the same every run."""
    ids = np.random.default_rng(seq_len).integers(0, MODEL["vocab_size"],
                                                  (seq_len, max(sequences, GLOBAL_BATCH)))
    return ids[:, :sequences], np.roll(ids, -1, axis=0)[:, :sequences]


TWIN_SEQ_LEN = 8  # the float64 twin's sequences: the plan's batching, engine and recompute


@lru_cache(maxsize=None)
def one_device(seq_len, dtype, sequences):
    """One device, no recomputation: ({name: gradient}, FLOPs) of a forward and backward."""
    cfg = GPTConfig(seq_len=seq_len, dtype=dtype, **MODEL)
    ids, targets = stream(seq_len, sequences)
    with mp.device() as ctx:
        model = GPT(cfg)
        model.loss_and_grad(ids, targets)
        flops = sum(e.flops for e in ctx.trace.events)
        return {p.name: p.grad.astype(np.float64) for p in model.parameters()}, flops


def run_plan(plan, seq_len, dtype):
    """The plan's step on GPUS simulated GPUs: per rank (peak bytes, {category: peak},
    FLOPs, {name: full gradient} (float64 only))."""
    cfg = GPTConfig(seq_len=seq_len, dtype=dtype, recompute=plan["recompute"], **MODEL)
    dims = ParallelDims(dp_replicate=GPUS) if plan["zero"] == 0 else ParallelDims(dp_shard=GPUS)
    ids, targets = stream(seq_len, GPUS * plan["micro_batch"] * plan["accumulation"])

    def step(ctx):
        run = parallelize(cfg, dims, zero=plan["zero"], lr=1e-3)
        ctx.ledger.reset_peak()  # the budget counts from the start of the step
        start = len(ctx.trace.events)
        run.forward_backward(ids, targets, micro_batches=plan["accumulation"])
        grads = run.engine.full_grads() if dtype == "float64" else None
        if dtype != "float64":
            run.step()
        flops = sum(e.flops for e in ctx.trace.events[start:])
        return (ctx.ledger.peak(), {c: ctx.ledger.peak(c) for c in CATEGORIES}, flops,
                grads)
    return mp.launch(step, GPUS)


def valid(plan, seq_len):
    """Refuse what is not a plan, in the plan's words."""
    call = f"plan_step({seq_len}) returned {plan!r}"
    if not isinstance(plan, dict) or sorted(plan) != sorted(KEYS):
        raise GradeFailure(f"{call}: expected a dict with the keys {', '.join(KEYS)}")
    if plan["zero"] not in (0, 1, 2, 3) or isinstance(plan["zero"], bool):
        raise GradeFailure(f"{call}: zero is a ZeRO stage, 0 (DDP), 1, 2 or 3")
    if plan["recompute"] not in ("none", "selective", "full"):
        raise GradeFailure(f"{call}: recompute is 'none', 'selective' or 'full'")
    for key in ("micro_batch", "accumulation"):
        v = plan[key]
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 1 <= v <= 64:
            raise GradeFailure(f"{call}: {key} is a whole number of sequences from 1 to 64")
    return call


@exercise("0.4", "a training step within 3 MB a GPU")
def check_plan_step(impl):
    for seq_len in SEQ_LENS:
        plan = impl.plan_step(seq_len)
        call = valid(plan, seq_len)
        trained = GPUS * plan["micro_batch"] * plan["accumulation"]
        # 1. the global batch: a float64 twin of the plan against one device's gradient
        want, _ = one_device(TWIN_SEQ_LEN, "float64", GLOBAL_BATCH)
        twin = run_plan(plan, TWIN_SEQ_LEN, "float64")[0][3]
        for name, g in want.items():
            expect_close(twin[name], g, rtol=1e-9, atol=1e-12 * float(np.abs(g).max()),
                         what=f"{call}: the gradient of {name} after the step's backward",
                         hint=f"one step trains on GPUS × micro_batch × accumulation = "
                              f"{GPUS} × {plan['micro_batch']} × {plan['accumulation']} = "
                              f"{trained} sequences, and the global batch is {GLOBAL_BATCH}"
                              if trained != GLOBAL_BATCH else "")
        # 2. the FLOPs of every GPU, against one GPU's share of the step without recomputation
        runs = run_plan(plan, seq_len, "bfloat16")
        _, plain = one_device(seq_len, "float64", GLOBAL_BATCH // GPUS)
        expect_within(round(max(r[2] for r in runs) / plain, 4), MAX_FLOPS_RATIO, unit="×",
                      what=f"{call}: the step's FLOPs over those of the step without "
                           "recomputation",
                      hint=RERUNS[plan["recompute"]])
        # 3. the memory of every GPU, from its ledger
        for rank, (peak, parts, _, _) in enumerate(runs):
            top = max(parts, key=parts.get)
            expect_within(peak / 1e6, BUDGET / 1e6, unit="MB",
                          what=f"{call}: GPU {rank} of {GPUS}'s peak memory during the step",
                          hint="each category's own peak, in bytes: " + ", ".join(
                              f"{c} {parts[c]:,}" for c in CATEGORIES)
                          + f"; the largest is {top}. ZeRO's stage divides the first three "
                            "(section 1); recomputation and the micro-batch size divide the "
                            "activations (sections 2 and 3)")
