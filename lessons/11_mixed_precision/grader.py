"""Grader for lesson 11: your bf16 rounding against ml_dtypes' cast on drawn float32 bits
(ordinary values, exact ties, carries into the exponent, subnormals, negatives,
infinities); your loss-scale update against minipar's DynamicLossScaler over drawn runs of
overflows and hyperparameters; your bytes a parameter against the planner's
(plan.rank_states.bytes_per_parameter, plan.model_state_bytes); your precision plan run on
simulated devices — every rank's peak memory against the budget, the reduced gradient
against the exact float64 sum of the same bf16 micro-batch gradients.
A wrong answer is compared with the known mistakes and the one it makes is named."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from hypothesis import example, given, settings, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_within, learner,
                                    on_ranks)
from minipar.data import split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.optim import HALF_DTYPES, AdamW, DynamicLossScaler, half_dtype
from minipar.parallel import zero_engine
from minipar.parallel.dp import accumulate_gradients
from minipar.plan import Layout, model_state_bytes
from minipar.plan.rank_states import bytes_per_parameter, zero_stage
from minipar.runtime.ledger import CATEGORIES, fmt_bytes

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- exercise 11.1: rounding to bf16 --------------------------------------------------------
KINDS = ("ordinary", "ties", "carry", "negative", "subnormal", "infinity")


def float32_bits(kind: str, seed: int, n: int) -> np.ndarray:
    """n float32 bit patterns of a kind (uint32), never NaN; "ordinary" mixes them all."""
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exponent = rng.integers(1, 255, n, dtype=np.uint32) << 23  # normal numbers
    top = rng.integers(0, 1 << 7, n, dtype=np.uint32) << 16  # the bits bf16 keeps
    low = rng.integers(0, 1 << 16, n, dtype=np.uint32)  # the bits it rounds away
    if kind == "ordinary":
        return (exponent | top | low)  # positive, normal
    if kind == "ties":
        return exponent | top | np.uint32(0x8000)  # exactly halfway, odd and even alike
    if kind == "carry":
        return exponent | np.uint32(0x7F0000) | (low | np.uint32(0x8000))  # rounds up past 1.11..1
    if kind == "negative":
        return np.uint32(1 << 31) | exponent | top | low
    if kind == "subnormal":
        return sign | top | low  # exponent 0
    edges = np.array([0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
                      0x7F7F7FFF, 0x00000000, 0x80000000], dtype=np.uint32)  # ±inf, ±max, ±0
    return edges[rng.integers(0, len(edges), n)]


def classify_rounding(bits: np.ndarray, got: np.ndarray, want: np.ndarray) -> str:
    """What the answer got wrong, in the terms of section 1 (the first element it missed)."""
    trunc = (bits >> 16).astype(np.int64)
    if np.array_equal(got, trunc):
        return ("you truncated: kept the top 16 bits without rounding. That moves every "
                "value toward zero by half a step on average; round to the nearest bf16 "
                "value, ties to even (add 0x7FFF + the last kept bit, then shift)")
    bad = np.flatnonzero(got != want)
    i = bad[0]
    b = int(bits[i])
    low, kept = b & 0xFFFF, b >> 16
    exponent = (b >> 23) & 0xFF
    x = float(np.array(b, dtype=np.uint32).view(np.float32))
    where = (f"x = {x!r} (float32 0x{b:08X}) should give 0x{int(want[i]):04X}, you gave "
             f"0x{int(got[i]) & 0xFFFFFFFF:04X}")
    ties = [j for j in bad if int(bits[j]) & 0xFFFF == 0x8000]
    if len(ties) == len(bad) and all(int(got[j]) == trunc[j] + 1 for j in ties):
        return (f"{where}: an exact tie (the low 16 bits are 0x8000) rounded up; ties go to "
                "the even neighbour, the one whose last kept bit is 0, so half of them round "
                "down (round half to even, IEEE 754's default)")
    if b >> 31 and (int(got[i]) >> 15) & 1 != 1:
        return (f"{where}: the sign bit (bit 15 of the result) is lost on a negative value; "
                "a negative value rounds as its magnitude does, its sign kept")
    if exponent == 0xFF:
        return (f"{where}: ±infinity must stay infinity (its bits are 0x7F80 or 0xFF80 "
                "shifted), and a finite value past bf16's largest rounds to it")
    if (int(want[i]) >> 7) & 0xFF != (kept >> 7) & 0xFF:
        return (f"{where}: here rounding up carries out of the mantissa into the exponent "
                "(1.11…1 × 2^E becomes 1.0 × 2^(E+1)); adding to the whole 32-bit pattern "
                "lets the carry run")
    if exponent == 0 and low:
        return (f"{where}: a subnormal (exponent bits 0, |x| < 2^-126). bf16 keeps "
                "float32's exponent, so its subnormals are float32's top 16 bits too: round "
                "the bits the same way, no special case (frexp-based rounding to 8 "
                "significant bits is finer than bf16's subnormals)")
    return (f"{where}: round to the nearest bf16 value, ties to even, on the 32-bit "
            "pattern (section 1)")


def forbidden_cast(impl) -> str:
    """The name of a bfloat16 cast the learner's module holds, if any."""
    for name, value in vars(impl).items():
        if value is ml_dtypes or value is HALF_DTYPES or value is half_dtype \
                or value is ml_dtypes.bfloat16 or (isinstance(value, np.dtype) and value == BF16):
            return name
    return ""


@exercise("11.1", "round a float32 to bf16, nearest, ties to even")
@SETTINGS
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**16), n=st.integers(1, 12),
       rows=st.sampled_from([0, 2]))
@example(kind="ties", seed=0, n=8, rows=0)
@example(kind="carry", seed=0, n=8, rows=0)
@example(kind="subnormal", seed=0, n=8, rows=0)
@example(kind="negative", seed=0, n=8, rows=2)
@example(kind="infinity", seed=0, n=8, rows=0)
def check_round_to_bf16_bits(impl, kind, seed, n, rows):
    name = forbidden_cast(impl)
    if name:
        raise GradeFailure(f"your file holds `{name}`, a bfloat16 cast: compute the bits "
                           "yourself from x.view(np.uint32) (the cast is what grades you)")
    bits = float32_bits(kind, seed, n * max(rows, 1))
    x = bits.view(np.float32).reshape((rows, n) if rows else (n,))
    what = f"round_to_bf16_bits(x) with x float32 of shape {x.shape} ({kind} values)"
    got = learner(what, impl.round_to_bf16_bits, x.copy())
    got = np.asarray(got)
    if got.shape != x.shape:
        raise GradeFailure(f"{what} has shape {got.shape}, expected x's shape {x.shape}")
    if not np.issubdtype(got.dtype, np.integer):
        raise GradeFailure(f"{what} is {got.dtype}, expected the bf16 bit patterns as "
                           "integers (np.uint16)")
    want = x.astype(BF16).view(np.uint16).astype(np.int64).reshape(-1)
    g = got.astype(np.int64).reshape(-1)
    if not np.array_equal(g, want):
        raise GradeFailure(f"{what}: {classify_rounding(bits, g, want)}")
    if got.dtype != np.uint16:
        raise GradeFailure(f"{what}: the bits are right but the dtype is {got.dtype}; return "
                           "np.uint16, as a bf16 tensor's .view(np.uint16) would be")


# ---- exercise 11.2: the dynamic loss scaler -------------------------------------------------
def scaler_trace(flags, init, growth, backoff, interval, floor):
    """DynamicLossScaler's (take, scale, count) after each step of `flags`."""
    s = DynamicLossScaler(init_scale=init, growth_factor=growth, backoff_factor=backoff,
                          growth_interval=interval, min_scale=floor)
    out = []
    for found in flags:
        s.update(found)
        out.append((not found, s.scale, s.growth_tracker))
    return out


def scaler_mistake(flags, got_trace, init, growth, backoff, interval, floor) -> str:
    """Which known mistake reproduces the learner's whole trace, if one does."""
    def run(rule):
        scale, clean, out = init, 0, []
        for found in flags:
            take, scale, clean = rule(scale, clean, found)
            out.append((take, scale, clean))
        return out

    def right(scale, clean, found, g=growth, b=backoff, iv=interval, fl=floor, reset=True,
              skip=True):
        if found:
            return (not skip), max(scale * b, fl), (0 if reset else clean)
        clean += 1
        if clean == iv:
            return True, scale * g, 0
        return True, scale, clean

    mistakes = {
        "the scale grows on every clean step: it must wait for growth_interval clean steps "
        "in a row": lambda s, c, f: right(s, c, f, iv=1),
        "an overflowing step was taken: its gradients hold inf or nan, so it must be "
        "skipped (take = False) while the scale backs off":
            lambda s, c, f: right(s, c, f, skip=False),
        "the count of clean steps was not restarted at an overflow: growth needs "
        "growth_interval clean steps in a row since the last overflow":
            lambda s, c, f: right(s, c, f, reset=False),
        "the scale went below min_scale: backing off stops at the floor":
            lambda s, c, f: right(s, c, f, fl=0.0),
        "you used 2 and 0.5 where growth_factor and backoff_factor were given":
            lambda s, c, f: right(s, c, f, g=2.0, b=0.5),
    }
    for words, rule in mistakes.items():
        trace = run(rule)
        if all(t == g[0] and np.isclose(s, g[1], rtol=1e-12) and k == g[2]
               for (t, s, k), g in zip(trace, got_trace)):
            return words
    return ""


@exercise("11.2", "a dynamic loss scaler's update")
@SETTINGS
@given(flags=st.lists(st.booleans(), min_size=1, max_size=30),
       init=st.sampled_from([2.0**16, 2.0**4, 8.0]),
       factors=st.sampled_from([(2.0, 0.5), (4.0, 0.25), (1.5, 0.8)]),
       interval=st.integers(1, 5), floor=st.sampled_from([1.0, 2.0**3]))
@example(flags=[False, False, True, False, False, False], init=2.0**16, factors=(2.0, 0.5),
         interval=3, floor=1.0)
@example(flags=[True] * 6, init=2.0**4, factors=(2.0, 0.5), interval=2, floor=2.0**3)
@example(flags=[False, True, False, False], init=2.0**16, factors=(4.0, 0.25), interval=2,
         floor=1.0)
def check_loss_scale_update(impl, flags, init, factors, interval, floor):
    growth, backoff = factors
    want = scaler_trace(flags, init, growth, backoff, interval, floor)
    hyper = (f"growth_factor={growth}, backoff_factor={backoff}, growth_interval={interval}, "
             f"min_scale={floor}")
    scale, clean, got = init, 0, []
    for step, found in enumerate(flags):
        what = (f"loss_scale_update({scale!r}, {clean!r}, found_overflow={found}, {hyper}) at "
                f"step {step} of the overflows {['x' if f else '.' for f in flags[:step + 1]]}")
        out = learner(what, impl.loss_scale_update, scale, clean, found, growth, backoff,
                      interval, floor)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise GradeFailure(f"{what} returned {out!r:.80}; expected a tuple (take the "
                               "step?, the next scale, the next count of clean steps)")
        take, scale, clean = out
        got.append((bool(take), float(scale), int(clean)))
        t, s, k = want[step]
        if (bool(take), float(scale), int(clean)) != (t, s, k) and not (
                bool(take) == t and np.isclose(scale, s, rtol=1e-12) and int(clean) == k):
            said = scaler_mistake(flags[:step + 1], got, init, growth, backoff, interval,
                                  floor)
            raise GradeFailure(f"{what} returned (take={bool(take)}, scale={float(scale)!r}, "
                               f"count={int(clean)}), expected (take={t}, scale={s!r}, "
                               f"count={k})" + (f": {said}" if said else
                                                "; see DynamicLossScaler.update (section 3)"))


# ---- exercise 11.3: bytes a parameter -------------------------------------------------------
def state_bytes(precision, fp32_grads, zero, dist, d, **bug) -> dict:
    """The planner's bytes a parameter, or a known mistake's (the keys of STATE_MISTAKES)."""
    lay = Layout(precision=precision, fp32_grads=fp32_grads, zero=zero,
                 distributed_optimizer=dist)
    w, g, k = bytes_per_parameter(lay)
    if bug.get("bf16_grads") and precision == "bf16":
        g = 2
    if bug.get("fp32_as_bf16") and precision == "fp32":
        w, g, k = 2, (4 if fp32_grads else 2), 12
    if bug.get("fp32_master") and precision == "fp32":
        k = 12
    stage = zero if bug.get("dist_ignored") else zero_stage(lay)
    out = model_state_bytes(1, stage, d, k=k, param_bytes=w, grad_bytes=g)
    if dist and zero < 3 and bug.get("dist_shards_weights"):
        out["parameters"] = w / d
    if dist and zero < 2 and bug.get("dist_shards_grads"):
        out["gradients"] = g / d
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer_states"]
    return out


STATE_MISTAKES = {
    "bf16_grads": "your gradients are 2 bytes a parameter, but with fp32_grads Megatron keeps "
                  "a float32 main_grad: 4 bytes, 18 bytes a parameter in all, not ZeRO's 16",
    "dist_ignored": "the distributed optimizer was left out: it is ZeRO-1 by another name, "
                    "the optimizer states sharded over d",
    "dist_shards_weights": "you divided the weights by d too: the distributed optimizer "
                           "shards the 12 bytes of master, m and v only, 6 + 12/d with "
                           "float32 gradients",
    "dist_shards_grads": "you divided the gradients by d: the distributed optimizer keeps "
                         "the whole float32 gradient buffer (its reduce-scatter fills this "
                         "rank's part, the buffer stays whole), 6 + 12/d",
    "fp32_as_bf16": "an fp32 run counted as bf16: its weights and gradients are 4 bytes and "
                    "it keeps no master copy, 4 + 4 + 8 = 16",
    "fp32_master": "an fp32 run keeps no float32 master (its weights are float32 already): "
                   "the optimizer states are Adam's m and v, 8 bytes",
}


@exercise("11.3", "bytes a parameter by precision and sharding")
@SETTINGS
@given(precision=st.sampled_from(["bf16", "fp32"]), fp32_grads=st.booleans(),
       zero=st.integers(0, 3), dist=st.booleans(),
       d=st.sampled_from([8, 1, 2, 3, 64, 1000]))
@example(precision="bf16", fp32_grads=True, zero=0, dist=True, d=8)
@example(precision="bf16", fp32_grads=True, zero=0, dist=False, d=8)
@example(precision="fp32", fp32_grads=True, zero=0, dist=True, d=8)
def check_state_bytes_per_parameter(impl, precision, fp32_grads, zero, dist, d):
    want = state_bytes(precision, fp32_grads, zero, dist, d)
    what = (f"state_bytes_per_parameter({precision!r}, fp32_grads={fp32_grads}, zero={zero}, "
            f"distributed_optimizer={dist}, d={d})")
    got = learner(what, impl.state_bytes_per_parameter, precision, fp32_grads, zero, dist, d)
    if not isinstance(got, dict) or sorted(got) != sorted(want):
        raise GradeFailure(f"{what} returned {got!r:.100}; expected a dict with the keys "
                           f"{sorted(want)}")
    try:
        values = {key: float(got[key]) for key in want}
    except (TypeError, ValueError):
        raise GradeFailure(f"{what} returned {got!r:.100}; expected numbers") from None
    if all(np.isclose(values[key], want[key], rtol=1e-9, atol=0) for key in want):
        return
    for bug, words in STATE_MISTAKES.items():
        wrong = state_bytes(precision, fp32_grads, zero, dist, d, **{bug: True})
        if wrong != want and all(np.isclose(values[key], wrong[key], rtol=1e-9, atol=0)
                                 for key in want):
            raise GradeFailure(f"{what} is {values}, expected {want}: {words}")
    key = next(key for key in want if not np.isclose(values[key], want[key], rtol=1e-9, atol=0))
    raise GradeFailure(f"{what}[{key!r}] is {values[key]!r}, expected {want[key]!r} (the whole "
                       f"answer: {want}). Weights, gradients, optimizer states: (2, 4 or 2, "
                       f"12) in bf16, (4, 4, 8) in fp32; stage z shards the optimizer states "
                       f"from 1, the gradients from 2, the weights at 3 (section 4)")


# ---- exercise 11.4: a plan under a memory and an error budget -------------------------------
CFG = GPTConfig(vocab_size=64, seq_len=32, hidden=32, num_heads=2, num_layers=2,
                dtype="bfloat16")
MEMORY_BUDGET = 460_000  # bytes a rank: 15.0 bytes a parameter of CFG (Ψ = 30,592)
MAX_ERROR = 1e-5
PLAN_KEYS = ("main_grad", "stage", "micro_batches")


def tokens(n: int, batch: int) -> np.ndarray:
    return np.random.default_rng(n * 100 + batch).integers(
        0, CFG.vocab_size, (CFG.seq_len + 1, n * batch))  # [s + 1, n·batch]


def read_plan(plan, batch: int) -> dict:
    if not isinstance(plan, dict):
        raise GradeFailure(f"fit_precision returned {type(plan).__name__} {plan!r:.60}, "
                           "expected a dict such as {'main_grad': True, 'stage': 1, "
                           "'micro_batches': 2}")
    unknown = sorted(set(plan) - set(PLAN_KEYS))
    if unknown:
        raise GradeFailure(f"the plan's keys {unknown} mean nothing here: a plan has "
                           f"{list(PLAN_KEYS)}")
    main, stage, k = plan.get("main_grad", False), plan.get("stage", 0), plan.get(
        "micro_batches", 1)
    if not isinstance(main, (bool, np.bool_)):
        raise GradeFailure(f"the plan's 'main_grad' is {main!r}: True or False")
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise GradeFailure(f"the plan's 'stage' is {stage!r}: a ZeRO stage, 0 (DDP) to 3")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or batch % k:
        raise GradeFailure(f"the plan's 'micro_batches' is {k!r} for a batch of {batch} "
                           f"sequences a rank: one of {[d for d in range(1, batch + 1) if batch % d == 0]}")
    return {"main_grad": bool(main), "stage": stage, "k": k}


def run_plan(parts: dict, n: int, batch: int) -> list[dict]:
    """One step's gradient reduction as the plan says, on n ranks: each rank's peaks and
    its reduced gradient (flat, float64, in parameter order)."""
    ids = tokens(n, batch)

    def program(ctx):
        model = GPT(CFG)
        engine = zero_engine(model, AdamW, stage=parts["stage"], lr=1e-3,
                             main_grad=parts["main_grad"])
        ctx.ledger.reset_peak()  # the whole model each rank built before sharding is gone
        cols = slice(ctx.rank * batch, (ctx.rank + 1) * batch)
        micro = split_microbatches(ids[:-1, cols], ids[1:, cols], parts["k"])
        accumulate_gradients(model, engine, micro)
        grads = engine.full_grads()
        engine.step()
        flat = np.concatenate([np.asarray(grads[p.name], np.float64).ravel()
                               for p in model.parameters()])
        return {"peak": ctx.ledger.peak(), "peaks": {c: ctx.ledger.peak(c) for c in CATEGORIES},
                "grad": flat}

    return on_ranks(program, n)


@functools.lru_cache(maxsize=None)
def exact_gradient(n: int, batch: int, k: int) -> np.ndarray:
    """The float64 average over the ranks of the float64 sum of each rank's k bf16
    micro-batch gradients (each with loss scale 1/k, as accumulate_gradients runs them)."""
    ids = tokens(n, batch)
    total = 0.0
    with mp.device():
        model = GPT(CFG)
        for r in range(n):
            cols = slice(r * batch, (r + 1) * batch)
            for x, y in split_microbatches(ids[:-1, cols], ids[1:, cols], k):
                model.loss_and_grad(x, y, loss_scale=1.0 / k)
                total = total + np.concatenate([p.grad.astype(np.float64).ravel()
                                                for p in model.parameters()])
                for p in model.parameters():
                    p.free_grad()
    return total / n


def memory_advice(parts: dict, peaks: dict, batch: int) -> str:
    psi = CFG.num_parameters()
    lines = ["each category's own peak: " + ", ".join(
        f"{c} {fmt_bytes(peaks[c])}" for c in sorted(peaks, key=lambda c: -peaks[c])
        if peaks[c])]
    if parts["stage"] == 0:
        per = 18 if parts["main_grad"] else 16
        lines.append(f"DDP keeps all {per} bytes a parameter on every rank ({per * psi:,} "
                     f"bytes here): shard the optimizer states — stage 1 with main_grad is "
                     f"Megatron's distributed optimizer, 6 + 12/n bytes")
    if parts["stage"] >= 2 and parts["k"] > 1:
        lines.append("under no_sync, ZeRO-2 and ZeRO-3 keep every unit's whole gradient "
                     "until the last micro-batch, on top of the shards")
    if batch // parts["k"] > 1:
        lines.append(f"activations grow with the sequences of a micro-batch ({batch // parts['k']}"
                     " here): cut the rank's batch into more micro-batches")
    return ";\n    ".join(lines)


@exercise("11.4", "a precision plan within a memory and an error budget")
@settings(SETTINGS, max_examples=8)
@given(n=st.integers(2, 4), batch=st.sampled_from([1, 2, 4, 8]))
@example(n=2, batch=2)
def check_fit_precision(impl, n, batch):
    what = (f"fit_precision(CFG, n={n}, batch={batch}, memory_budget={MEMORY_BUDGET:,}, "
            f"max_error={MAX_ERROR:g})")
    plan = learner(what, impl.fit_precision, CFG, n, batch, MEMORY_BUDGET, MAX_ERROR)
    parts = read_plan(plan, batch)
    ranks = run_plan(parts, n, batch)
    what = f"the plan {plan} (n={n} ranks, batch={batch} sequences each)"
    for r, out in enumerate(ranks):
        expect_within(out["peak"] / 1024, MEMORY_BUDGET / 1024, rank=r, unit="KiB",
                      what=f"{what}: the peak memory",
                      hint=memory_advice(parts, out["peaks"], batch))
    exact = exact_gradient(n, batch, parts["k"])
    error = float(np.linalg.norm(ranks[0]["grad"] - exact) / np.linalg.norm(exact))
    if error > MAX_ERROR:
        words = [f"{what}: the reduced gradient is {error:.3g} away from the exact sum of the "
                 f"same bf16 micro-batch gradients (relative, in norm), over its budget of "
                 f"{MAX_ERROR:g}"]
        if not parts["main_grad"]:
            words.append(f"the gradients were accumulated over {parts['k']} micro-batch(es) "
                         f"and averaged over {n} ranks in bf16 buffers, every partial sum "
                         "rounded to 8 significant bits: main_grad=True keeps the buffers, "
                         "and the reduction, in float32 (sections 5 and 6)")
            if parts["stage"]:
                words.append(f"sharding (ZeRO-{parts['stage']}) changes where the gradients "
                             "live, not their precision")
        raise GradeFailure(";\n    ".join(words))
