"""Grader for lesson 06: your split MLP backward against the fused one (bit for bit), by the
FLOPs each half charges to the clock and the bytes it keeps for W (the ledger and what I
hands over); your ZB-H1 generator against the rules any schedule obeys (the validator, the
dry run's deadlock check), 1F1B's peak memory and the bubble (p - 1)(t_F + t_B - 2 t_W) on
the dry run's clock, never against minipar's own list; and your plan of exercise 6.3 timed
by the dry run against its bubble target and its activation cap."""

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import learner
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_within, world_sizes)
from minipar.course.grading import read_schedule as read_actions
from minipar.nn import GPT, MLP, GPTConfig, Module, Parameter, Saved
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.pp import (F, I, W, Action, ScheduleDeadlockError, ScheduleError,
                                 dry_run, lower, schedule, validate_schedule)

# ---- exercise 6.1: an MLP's backward split into I and W -----------------------------------

SHAPES = ("[N, h]", "[s, b, h]")  # the MLP's input: tokens flat, or Megatron's layout


def buffer(x: np.ndarray) -> int:
    """The address of the memory an array (or a view of it) lives in."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x.__array_interface__["data"][0]


def off_ledger(kept, on_ledger: set) -> tuple[int, list]:
    """Bytes and shapes of the arrays reachable from `kept` that the ledger does not count:
    not inside a Saved (the ledger holds those) and not a buffer in `on_ledger`; each
    buffer once. Walks tuples, lists, dicts, Saved and other objects' attributes (a store
    of records), not the model's modules and parameters."""
    seen: dict[int, tuple] = {}
    visited: set[int] = set()

    def walk(x, counted: bool) -> None:
        if id(x) in visited or isinstance(x, (Module, Parameter)) or callable(x):
            return
        visited.add(id(x))
        if isinstance(x, np.ndarray):
            key = buffer(x)
            if not counted and key not in on_ledger:
                seen[key] = max(seen.get(key, (0, ())), (x.nbytes, x.shape))
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, counted)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, counted)
        elif isinstance(x, Saved):
            walk(x.__dict__.get("_values", {}), True)  # on the ledger while unreleased
        elif hasattr(x, "__dict__"):
            walk(vars(x), counted)
    walk(kept, False)
    return sum(n for n, _ in seen.values()), [shape for _, shape in seen.values()]


def flops_of(ctx, start: int) -> dict:
    """FLOPs charged since trace event `start`, by kind: dgrad, wgrad, other matmuls."""
    out = {"dgrad": 0, "wgrad": 0, "other": 0}
    for e in ctx.trace.events[start:]:
        kind = "wgrad" if e.label.endswith("wgrad") else (
            "dgrad" if e.label.endswith("dgrad") else "other")
        out[kind] += e.flops
    return out



def exact(got, want, what: str, hint: str) -> None:
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        raise GradeFailure(f"{what}: received {got!r:.80} (shape "
                           f"{getattr(got, 'shape', None)}), expected an array of shape "
                           f"{want.shape}. {hint}")
    if not np.array_equal(got, want):
        close = np.allclose(got, want, rtol=1e-10, atol=1e-14)
        worst = float(np.max(np.abs(got - want)))
        raise GradeFailure(
            f"{what} is not the fused backward's (largest difference {worst:.3g}). " + (
                "It is equal to rounding but not bit for bit: the fused backward multiplies "
                "[N, ·] token matrices with matmul (linear_backward_input / _weight do) and "
                "sums db over the N tokens; do the same, in the same order" if close else hint))


@exercise("6.1", "an MLP's backward split into I and W")
@SETTINGS
@given(h=st.integers(2, 5), wide=st.integers(1, 3), shape=st.sampled_from(SHAPES),
       s=st.integers(1, 4), b=st.integers(1, 3), seed=st.integers(0, 99))
def check_split_backward(impl, h, wide, shape, s, b, seed):
    ffn = wide * h  # wide = 1: a square fc1 and fc2 (in = out)
    rng = np.random.default_rng(seed)
    dims = (s * b, h) if shape == SHAPES[0] else (s, b, h)
    x, dy = rng.standard_normal(dims), rng.standard_normal(dims)
    tokens, item = s * b, x.itemsize
    where = f"an MLP of h = {h}, ffn = {ffn} on x of shape {x.shape}"
    with mp.device() as ctx:
        mlp = MLP("mlp", h, ffn, seed=seed, std=0.5, out_std=0.5)
        _, saved = mlp.forward(x)
        base = len(ctx.trace.events)
        want_dx = mlp.backward(dy.copy(), saved)
        fused = flops_of(ctx, base)
        want = [p.grad.copy() for p in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight,
                                         mlp.fc2.bias)]
        for param in mlp.parameters():
            param.free_grad()  # the learner's halves start from no gradient
        _, saved = mlp.forward(x)
        start = len(ctx.trace.events)
        got = learner(f"mlp_backward_input on {where}", impl.mlp_backward_input, mlp, dy,
                      saved)
        if not isinstance(got, tuple) or len(got) != 2:
            raise GradeFailure(f"mlp_backward_input returned {got!r:.80}; expected a pair "
                               f"(dx, kept)")
        dx, kept = got
        i_flops, after_i = flops_of(ctx, start), ctx.ledger.held("activations")
        u_freed = saved[1].released
        held = {buffer(part.x) for part in saved if not part.released}
        extra, extra_shapes = off_ledger(kept, held)
        start = len(ctx.trace.events)
        grads = learner(f"mlp_backward_weight on {where}", impl.mlp_backward_weight, mlp,
                        kept)
        w_flops, after_w = flops_of(ctx, start), ctx.ledger.held("activations")
    half = fused["dgrad"]  # 2 matmuls of 2·N·h·ffn each: 4 N h ffn, and wgrad the same
    charged = i_flops["dgrad"] + i_flops["wgrad"] + i_flops["other"]
    if i_flops["wgrad"] or charged > half:
        raise GradeFailure(
            f"{where}: I charged {charged} FLOPs, of which {i_flops['wgrad']} for weight "
            f"gradients; I computes only dx: two matmuls dg = dy·W2 and dx = du·W1, "
            f"4·N·h·ffn = {half} FLOPs. The weight gradients' matmuls (another {half}) "
            f"belong to W: nobody upstream waits for them")
    if charged < half:
        raise GradeFailure(
            f"{where}: I charged {charged} FLOPs, expected 4·N·h·ffn = {half} (dg = dy·W2, "
            f"dx = du·W1): multiply with minipar's matmul or linear_backward_input, so the "
            f"clock counts the work")
    exact(dx, want_dx, f"{where}: dx from mlp_backward_input",
          "dx = (GeLU'(u) ⊙ (dy·W2))·W1: fc2's dgrad, the GeLU's backward, fc1's dgrad")
    w_charged = sum(w_flops.values())
    if w_charged != fused["wgrad"]:
        raise GradeFailure(
            f"{where}: W charged {w_charged} FLOPs, the fused backward's weight gradients "
            f"take 4·N·h·ffn = {fused['wgrad']} (dW2 = dyᵀ·g, dW1 = duᵀ·x). " + (
                "W recomputed input gradients, I's work (a Linear's own backward computes "
                "dx as well as dW): I already made du, so W multiplies only dyᵀ·g and duᵀ·x"
                if w_charged > fused["wgrad"]
                else "multiply with minipar's matmul, so the clock counts the work"))
    if not isinstance(grads, (tuple, list)) or len(grads) != 4:
        raise GradeFailure(f"mlp_backward_weight returned {grads!r:.80}; expected "
                           f"(dW1, db1, dW2, db2)")
    for name, g, w in zip(("dW1", "db1", "dW2", "db2"), grads, want):
        exact(g, w, f"{where}: {name} from mlp_backward_weight",
              "dW2 = dyᵀ·g and dW1 = duᵀ·x, summed over all N tokens ([N, out]ᵀ @ [N, in]; "
              "with x of shape [s, b, h] flatten the tokens first), db = Σ over the tokens")
    need = item * tokens * (2 * h + 2 * ffn)
    if after_i + extra > need:
        raise GradeFailure(
            f"{where}: after I, {after_i + extra} bytes wait for W ({after_i} on the ledger, "
            f"{extra} in what mlp_backward_input kept besides: arrays of shapes "
            f"{extra_shapes}); W needs {need} = {item}·N·(2h + 2ffn): fc1's input x and output "
            f"gradient du, fc2's input g and output gradient dy. " + (
                "The GeLU's input u [..., ffn] is I's alone: let I release it "
                "(gelu_backward releases its Saved)" if not u_freed else
                "Keep each linear's saved input and output gradient, nothing more: dg, for "
                "one, is I's alone (W needs du, which I computes from it)"))
    if after_w:
        raise GradeFailure(
            f"{where}: after W the ledger still holds {after_w} bytes of activations: W "
            f"must give the saved inputs x and g back once it has used them (Saved.release),"
            f" or a pipeline that defers W never frees its micro-batches")


# ---- exercise 6.2: the ZB-H1 schedule ------------------------------------------------------

#: the graded durations: equal (t_F = t_I = t_W), and uneven with t_W <= t_F, t_W <= t_I
DURATIONS = ({"F": 1, "I": 1, "W": 1}, {"F": 3, "I": 2, "W": 1})


def read_schedule(got, p: int, m: int) -> list[list[Action]]:
    """The learner's lists, their shape checked in the learner's terms."""
    return read_actions(got, p, what=f"zb_h1({p}, {m})", kinds=(F, I, W), rule=(
        "rank r runs stage r's F, I and W only (ZB-H1 splits every backward into I and W)"))


def deferred(actions) -> list[int]:
    """Per rank, the most W's left waiting when it moves on to an I: ZB-H1's rank r, r."""
    out = []
    for row in actions:
        waiting = peak = 0
        for a in row:
            if a.kind == I:
                peak = max(peak, waiting)
            waiting += (a.kind == I) - (a.kind == W)
        out.append(peak)
    return out


def defer_words(actions, p: int) -> str:
    return (f"Your ranks leave at most {deferred(actions)} W's waiting at once; ZB-H1's rank "
            f"r leaves r ({list(range(p))}): after each I from the r-th on it runs the oldest "
            f"deferred W. More holds more activations than 1F1B's peak (a micro-batch's "
            f"activations stay until its W); fewer leaves the cool-down's idle slots empty")


@exercise("6.2", "the ZB-H1 schedule generator")
@SETTINGS
@given(p=world_sizes(1, 6, first=2), m=st.integers(1, 10))
def check_zb_h1(impl, p, m):
    what = f"zb_h1({p}, {m})"
    actions = read_schedule(learner(what, impl.zb_h1, p, m), p, m)
    try:
        validate_schedule(actions, microbatches=m, stages=p)
    except ScheduleDeadlockError as e:
        raise GradeFailure(f"{what}: {e}\n    I of stage s needs I of stage s + 1, and F "
                           f"of stage s needs F of stage s - 1; W needs only its own I") from None
    except ScheduleError as e:
        raise GradeFailure(f"{what}: the validator refuses it: {e}") from None
    for t in DURATIONS:
        d = dry_run(lower(actions), t)  # also checks the lowered lists for a deadlock
        bound = min(p, m)
        if max(d.peak_in_flight) > bound:
            r = max(range(p), key=lambda q: d.peak_in_flight[q])
            raise GradeFailure(
                f"{what}: rank {r} holds {d.peak_in_flight[r]} micro-batches' activations "
                f"at its peak, over 1F1B's peak min(p, m) = {bound} (every rank: "
                f"{list(d.peak_in_flight)}). {defer_words(actions, p)}")
        if m < p:
            continue  # the formula counts a full pipeline: m >= p
        want = (p - 1) * (t["F"] + t["I"] + t["W"] - 2 * t["W"])
        if tuple(d.idle) != (want,) * p:
            raise GradeFailure(
                f"{what} at t_F = {t['F']}, t_I = {t['I']}, t_W = {t['W']}: the ranks idle "
                f"{list(d.idle)}, ZB-H1's bubble is (p - 1)(t_F + t_B - 2 t_W) = {want} on "
                f"every rank. {defer_words(actions, p)}")


# ---- exercise 6.3: a plan within a bubble target and an activation cap --------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    pp: int
    global_batch: int
    min_microbatch: int
    durations: dict  # a rank's layers on one micro-batch: F, I, W, F&B
    activation_cap: int  # sequences through a rank's layers, at the peak
    bubble_target: float
    back_to_back: bool  # the bubble between back-to-back steps (post-validation)

    def args(self) -> tuple:
        return (self.pp, self.global_batch, self.min_microbatch, dict(self.durations),
                self.activation_cap, self.bubble_target, self.back_to_back)


TIMES = {"F": 1, "I": 1, "W": 1, "F&B": Fraction(3, 2)}
#: the lesson's puzzle (section 7), then the same pipeline stepping back to back
SCENARIOS = (
    Scenario("4 ranks, 32 sequences, a flushed step, 8 sequences' activations a rank", 4,
             32, 2, TIMES, activation_cap=8, bubble_target=0.10, back_to_back=False),
    Scenario("4 ranks, 32 sequences, back-to-back steps, 16 sequences' activations", 4,
             32, 2, TIMES, activation_cap=16, bubble_target=0.01, back_to_back=True))


def read_plan(plan, sc: Scenario) -> tuple[str, int, int]:
    keys = ["chunks", "microbatches", "schedule"]
    if not isinstance(plan, dict) or sorted(plan) != keys:
        raise GradeFailure(f"{sc.name}: choose_zero_bubble(...) returned {plan!r:.100}, "
                           f"expected a dict with the keys {keys}")
    name, m, v = plan["schedule"], plan["microbatches"], plan["chunks"]
    names = ("1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev")
    if name not in names or not all(isinstance(k, (int, np.integer)) and k >= 1
                                    for k in (m, v)):
        raise GradeFailure(f"{sc.name}: the plan {plan!r:.100} needs a schedule among "
                           f"{names} and integers microbatches, chunks >= 1")
    if sc.global_batch % m or sc.global_batch // m < sc.min_microbatch:
        raise GradeFailure(
            f"{sc.name}: m = {m} micro-batches of a batch of {sc.global_batch} sequences: a "
            f"micro-batch holds B/m whole sequences, at least {sc.min_microbatch}, so m "
            f"divides {sc.global_batch} and m <= {sc.global_batch // sc.min_microbatch}")
    try:
        schedule(name, sc.pp, int(m), int(v))
    except ScheduleError as e:
        raise GradeFailure(f"{sc.name}: the plan {plan} is refused: {e}") from None
    return name, int(m), int(v)


def timed(sc: Scenario, name: str, m: int, v: int):
    """The plan's dry run: chunk times are a rank's layers' over v; t_B = t_I + t_W."""
    t = {k: Fraction(x) / v for k, x in sc.durations.items()}
    t["B"] = t["I"] + t["W"]
    return dry_run(lower(schedule(name, sc.pp, m, v)), t)


#: the model the plan trains for one step: 8 layers, one a stage under a V (2p = 8 stages)
MODEL = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=8, seed=0)


def trained_loss(sc: Scenario, name: str, m: int, v: int) -> tuple[float, float]:
    """(the pipeline's loss, one device's) after one training step on the scenario's batch."""
    rng = np.random.default_rng(1)
    ids, targets = (rng.integers(0, MODEL.vocab_size, (MODEL.seq_len, sc.global_batch))
                    for _ in range(2))

    def program(ctx):
        run = parallelize(MODEL, ParallelDims(pp=sc.pp), schedule=name, microbatches=m,
                          chunks=v, lr=1e-3)
        return run.train_step(ids, targets)

    losses = mp.launch(program, sc.pp)
    with mp.device():
        return losses[0], GPT(MODEL).loss_and_grad(ids, targets)


def memory_words(name: str, held, m: int, sc: Scenario) -> str:
    b = sc.global_batch // m
    return (f"{name} holds {held} micro-batches of a rank's layers at its peak, of b = B/m = "
            f"{b} sequences each. " + {
                "zb_h2": "ZB-H2 buys its zero bubble with 2p - 1 micro-batches in flight; "
                         "ZB-H1 and ZB-V hold 1F1B's p",
                "dualpipev": "DualPipeV holds PP + 1 = 2p + 1 chunk-micro-batches, "
                             "p + 1/2 of a rank's layers"}.get(
                name, "more, smaller micro-batches hold less"))


@exercise("6.3", "a zero-bubble plan within a bubble and a memory budget")
def check_choose_zero_bubble(impl):
    for sc in SCENARIOS:
        plan = impl.choose_zero_bubble(*sc.args())
        name, m, v = read_plan(plan, sc)
        d = timed(sc, name, m, v)
        layout = f"{name} with m = {m}, v = {v}"
        bubble = d.steady_bubble_over_ideal if sc.back_to_back else d.bubble_over_ideal
        which = "between back-to-back steps" if sc.back_to_back else "of a flushed step"
        expect_within(100 * float(bubble), 100 * sc.bubble_target, unit="%",
                      what=f"{sc.name}: the bubble of {layout} {which} (idle over busy time, "
                           f"the dry run)",
                      hint=("ZB-H1's bubble is (p - 1)(t_F + t_B - 2 t_W) in every step, "
                            "back to back too; ZB-H2 and ZB-V reach 0 only between back-to-back "
                            "steps" if name == "zb_h1" else
                            f"1F1B idles (p - 1)(t_F + t_B) a step: split the backward "
                            f"(ZB-H1, ZB-V), or raise m" if name == "1f1b" else
                            "raise m, or choose a zero-bubble schedule"))
        held = max(d.peak_activations)
        expect_within(float(held * Fraction(sc.global_batch, m)), sc.activation_cap,
                      unit="sequences' activations",
                      what=f"{sc.name}: the activation peak of {layout} (the dry run's "
                           f"micro-batches in flight x sequences a micro-batch)",
                      hint=memory_words(name, held, m, sc))
        got, want = trained_loss(sc, name, m, v)
        expect_close(got, want, rtol=1e-10, what=f"{sc.name}: the loss of {layout}, one "
                     f"training step through parallelize", hint="a pipeline trains the "
                     "model one device trains")
