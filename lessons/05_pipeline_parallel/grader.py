"""Grader for lesson 05: your 1F1B schedule against the rules any schedule obeys (the
validator, the dry run's deadlock check), the memory bound min(p - r, m) and GPipe's bubble
on the dry run's clock, never against minipar's own list; your pipeline rank run on a 2-D
mesh (data x pipeline parallel, the pp groups consecutive or strided) with rendezvous
sends, against one device's chain of the same stages; and your pipeline plan of exercise
5.3 timed by the dry run and trained on simulated devices, against its budgets (the clock,
the ledger) and one device's loss."""

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_equal, expect_within, mesh_of, on_mesh,
                                    world_sizes)
from minipar.course.grading import read_schedule as read_actions
from minipar.nn import GPT, GPTConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.pp import (B, F, Action, ScheduleDeadlockError, ScheduleError, dry_run,
                                 gpipe, lower, schedule, validate_schedule)
from minipar.runtime.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                    DeadlockError, WorldAborted)

# ---- exercise 5.1: the 1F1B schedule ------------------------------------------------------

#: equal stages: t_F = 1, t_B = 2 (a backward costs about two forwards)
EQUAL = {"F": 1, "B": 2}
OFF_BY_ONE = ("One forward too many on every rank, off by one: Megatron runs p - r - 1 "
              "warm-up forwards, then pairs 'F, then B'. torch's Schedule1F1B says it warms "
              "up with p - r forwards, but it then pairs 'B, then F': its (p - r)-th forward is "
              "Megatron's first steady one. p - r warm-up forwards followed by F-then-B "
              "pairs holds one micro-batch more than 1F1B needs")


def read_schedule(got, p: int, m: int) -> list[list[Action]]:
    """The learner's lists, their shape checked in the learner's terms."""
    return read_actions(got, p, what=f"one_f_one_b({p}, {m})", kinds=(F, B), rule=(
        "rank r runs stage r's forwards and backwards only (F and B): Action({r}, F, i), "
        "Action({r}, B, i); the lowering adds the messages"))


PROBE = (4, 8)  # the configuration a memory failure is diagnosed on: p = 4, m = 8


def forwards_first(actions) -> list[int]:
    """Per rank, the forwards it runs before its first backward."""
    return [next((k for k, a in enumerate(row) if a.kind == B), len(row)) for row in actions]


def memory_hint(impl) -> str:
    """Name the learner's pattern, read off their schedule at p = 4, m = 8 (at the smallest
    failing size, GPipe, the off-by-one and the same warm-up can be one list)."""
    p, m = PROBE
    try:
        got = forwards_first(read_schedule(impl.one_f_one_b(p, m), p, m))
    except Exception:  # noqa: BLE001 (the failure above is what the learner needs)
        got = None
    want = [min(p - r, m) for r in range(p)]
    seen = (f"At p = {p}, m = {m} your ranks run {got} forwards before their first "
            f"backward; 1F1B runs min(p - r, m) = {want}. " if got else "")
    if got == [m] * p:
        return seen + ("That is GPipe's order (every forward before any backward): every "
                       "rank holds all m micro-batches. 1F1B starts rank r's backwards "
                       "after p - r - 1 warm-up forwards and frees one per backward")
    if got == [min(p - r + 1, m) for r in range(p)]:
        return seen + OFF_BY_ONE
    if got and len(set(got)) == 1:
        return seen + ("Every rank runs the same warm-up, but a later stage gets its first "
                       "gradient sooner: rank r needs only p - r - 1 warm-up forwards (the "
                       "last rank none)")
    return seen + ("A backward frees its micro-batch's activations: run rank r's next "
                   "backward as soon as p - r micro-batches are in flight")


@exercise("5.1", "the 1F1B schedule generator")
@SETTINGS
@given(p=world_sizes(1, 6, first=2), m=st.integers(1, 10))
def check_one_f_one_b(impl, p, m):
    what = f"one_f_one_b({p}, {m})"
    actions = read_schedule(impl.one_f_one_b(p, m), p, m)
    try:
        validate_schedule(actions, microbatches=m, stages=p)
    except ScheduleDeadlockError as e:
        raise GradeFailure(
            f"{what}: {e}\n    A backward needs the next stage's backward of the same "
            f"micro-batch, which needs every forward before it: rank r can run at most "
            f"p - r - 1 forwards before its first backward's gradient arrives, and the "
            f"later the stage, the fewer (warm-up min(p - r - 1, m) on rank r)") from None
    except ScheduleError as e:
        raise GradeFailure(f"{what}: the validator refuses it: {e}") from None
    d = dry_run(lower(actions), EQUAL)  # also checks the lowered lists for a deadlock
    bound = [min(p - r, m) for r in range(p)]
    peaks = list(d.peak_in_flight)
    for r in range(p):
        if peaks[r] > bound[r]:
            raise GradeFailure(
                f"{what}: rank {r} holds {peaks[r]} micro-batches' activations at its peak, "
                f"over 1F1B's bound min(p - r, m) = {bound[r]} (every rank: {peaks}, the "
                f"bound: {bound}). {memory_hint(impl)}")
    ideal = dry_run(lower(gpipe(p, m)), EQUAL)
    if d.makespan != ideal.makespan:
        raise GradeFailure(
            f"{what}: with equal stages (t_F = 1, t_B = 2) the step takes {d.makespan}, "
            f"GPipe's takes (m + p - 1)(t_F + t_B) = {ideal.makespan}: the bubble is "
            f"{d.bubble_over_ideal} of the ideal time, not (p - 1)/m = "
            f"{Fraction(p - 1, m)}. Too few forwards in flight leave the pipeline unfilled: "
            f"rank r runs min(p - r - 1, m) warm-up forwards before its first backward")


# ---- exercise 5.2: a pipeline rank with send/recv ---------------------------------------

class ToyStage:
    """Stage r of a chain of tanh layers, y = tanh(x W_r); the last stage's loss is
    sum(y²)/(2m) a micro-batch. It checks what it is given against one device's chain and
    records the order it was run in."""

    def __init__(self, r: int, p: int, m: int, weights, inputs, acts, grads, who: str):
        self.r, self.p, self.m, self.who = r, p, m, who
        self.w, self.inputs, self.acts, self.grads = weights[r], inputs, acts, grads
        self.ran: list[Action] = []
        self.saved: dict[int, tuple] = {}
        self.dw = np.zeros_like(self.w)
        self.losses: dict[int, float] = {}

    def _expect(self, got, want, i: int, name: str, source: str, table) -> None:
        if not isinstance(got, np.ndarray) or got.shape != want.shape:
            raise GradeFailure(f"{self.who}: stage {self.r}'s {name} of micro-batch {i} got "
                               f"{got!r:.60}, expected an array of shape {want.shape}: "
                               f"{source}")
        if not np.allclose(got, want, rtol=1e-12, atol=1e-14):
            found = [f"micro-batch {j}" for j in range(self.m)
                     if np.allclose(got, table[j], rtol=1e-12, atol=1e-14)]
            which = (f"it holds {found[0]}'s, not micro-batch {i}'s: messages between two "
                     f"ranks arrive in the order they were sent" if found else
                     "it is no micro-batch's of this pipeline: is it from a rank of another "
                     "pp group? send/recv take global ranks: group.ranks[r - 1] and "
                     "group.ranks[r + 1], r being the group rank")
            raise GradeFailure(f"{self.who}: stage {self.r}'s {name} of micro-batch {i} is "
                               f"not what {source}: {which}")

    def forward(self, i, x=None):
        r = self.r
        self.ran.append(Action(r, F, int(i)))
        if r == 0:
            if x is not None:
                raise GradeFailure(f"{self.who}: stage 0's forward of micro-batch {i} was "
                                   f"given an input; the first stage reads its micro-batch "
                                   f"itself: call stage.forward(i, None)")
            x = self.inputs[i]
        else:
            self._expect(x, self.acts[r][i], i, "input", f"stage {r - 1} sent (receive "
                         f"it from the previous rank, group.ranks[r - 1])", self.acts[r])
        y = np.tanh(x @ self.w)  # y: [b, h]
        self.saved[i] = (x, y)
        if r == self.p - 1:
            self.losses[i] = float((y ** 2).sum() / (2 * self.m))
            return self.losses[i]
        return y

    def backward(self, i, dy=None):
        r = self.r
        self.ran.append(Action(r, B, int(i)))
        if i not in self.saved:
            raise GradeFailure(f"{self.who}: stage {r}'s backward of micro-batch {i} ran "
                               f"before its forward")
        x, y = self.saved.pop(i)
        if r == self.p - 1:
            if dy is not None:
                raise GradeFailure(f"{self.who}: the last stage's backward starts from its "
                                   f"loss: call stage.backward(i, None)")
            dy = y / self.m
        else:
            self._expect(dy, self.grads[r + 1][i], i, "output gradient", f"stage {r + 1} "
                         f"sent (receive it from the next rank, group.ranks[r + 1])",
                         self.grads[r + 1])
        dz = dy * (1 - y ** 2)
        self.dw += x.T @ dz
        return None if r == 0 else dz @ self.w.T


def one_device_chain(weights, inputs, m: int):
    """acts[s][i]: stage s's input; grads[s][i]: the gradient of stage s's input; dW."""
    p = len(weights)
    acts = [[None] * m for _ in range(p)]
    grads = [[None] * m for _ in range(p)]
    dws = [np.zeros_like(w) for w in weights]
    for i in range(m):
        x, ys = inputs[i], []
        for s in range(p):
            acts[s][i] = x
            x = np.tanh(x @ weights[s])
            ys.append(x)
        dy = ys[-1] / m
        for s in reversed(range(p)):
            dz = dy * (1 - ys[s] ** 2)
            dws[s] += acts[s][i].T @ dz
            dy = dz @ weights[s].T
            grads[s][i] = dy
    return acts, grads, dws


DEADLOCK_HINT = (
    "In 1F1B's steady state rank r sends micro-batch i + 1's activations to rank r + 1 "
    "while rank r + 1 sends micro-batch i's gradient to rank r: with blocking sends each "
    "waits for the other's receive, forever (GPipe survives them: its messages flow one way "
    "at a time). Post every send with mp.isend and wait on the Works once the list has run "
    "(the lowering's contract: a receive waited at once, sends waited at the end)")


#: failures of the whole run, not of one rank's code: launch reports them itself
WORLD_FAILURES = (WorldAborted, DeadlockError, CollectiveTimeoutError, CollectiveMismatchError)


@exercise("5.2", "a pipeline rank's schedule run with send/recv")
@SETTINGS
@given(p=world_sizes(1, 4, first=2), m=st.integers(1, 4),
       name=st.sampled_from(["1f1b", "gpipe"]), strided=st.booleans(), seed=st.integers(0, 99))
def check_run_pipeline_rank(impl, p, m, name, strided, seed):
    h, b = 3, 2
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((h, h)) for _ in range(p)]
    data = [rng.standard_normal((m, b, h)) for _ in range(2)]  # one batch per dp replica
    plans = [one_device_chain(weights, data[d], m) for d in range(2)]
    actions = schedule(name, p, m)
    shape, names, dim = mesh_of(p, 2, strided, ("pp", "dp") if strided else ("dp", "pp"))

    def program(ctx, spmd):
        r, who = spmd.rank, spmd.words
        d = spmd.mesh.coordinate(ctx.rank)["dp"]
        acts, grads, dws = plans[d]
        stage = ToyStage(r, p, m, weights, data[d], acts, grads, who)
        start = len(ctx.trace.events)
        impl.run_pipeline_rank(stage, list(actions[r]), spmd.group)
        events = ctx.trace.events[start:]
        if ctx.clock.compute < ctx.clock.p2p:
            raise GradeFailure(f"{who}: run_pipeline_rank returned while a send it posted "
                               f"was still in flight: wait on every isend's Work before "
                               f"returning (the transport may still be reading the tensor, "
                               f"and a step is not over until its messages are)")
        used = sorted({e.name for e in events if e.stream == "comm"})
        if used:
            raise GradeFailure(f"{who}: run_pipeline_rank called {', '.join(used)}; a "
                               f"pipeline moves tensors between neighbours with "
                               f"point-to-point messages only (mp.isend, mp.recv)")
        expect_equal(" ".join(map(str, stage.ran)), " ".join(map(str, actions[r])), rank=who,
                     what=f"the order stage {r} ran in ({name}, p = {p}, m = {m})",
                     hint="run the actions in the order given: the schedule is the order")
        sends = sum(e.stream == "p2p" for e in events)
        want = m * ((r > 0) + (r < p - 1))
        expect_equal(sends, want, rank=who, what=f"the messages stage {r} sent", hint=(
            "one per micro-batch to each neighbour: activations to the next stage after "
            "each forward, gradients to the previous one after each backward"))
        expect_close(stage.dw, dws[r], rank=who, what=f"stage {r}'s weight gradient after "
                     f"the {m} micro-batches", hint="every backward adds x^T dz")
        if r == p - 1:
            expect_close(sum(stage.losses.values()), sum(
                (np.tanh(acts[r][i] @ weights[r]) ** 2).sum() / (2 * m) for i in range(m)),
                rank=who, what="the last stage's loss summed over the micro-batches")

    crashed: dict = {}  # global rank -> the failed check or crash there

    def settled(ctx, spmd):
        """A failure is kept, not raised, so the other ranks' fate (finishing, or waiting
        on the failed rank until the deadlock is seen) cannot change the report."""
        try:
            return program(ctx, spmd)
        except WORLD_FAILURES:
            raise
        except Exception as exc:  # noqa: BLE001 (reported below, lowest rank first)
            exc.add_note(f"(raised on {spmd.words})")
            crashed[ctx.rank] = exc
            return None

    deadlock = None
    try:
        on_mesh(settled, shape, names, dim)
    except DeadlockError as e:
        deadlock = e
    if crashed:
        raise crashed[min(crashed)]
    if deadlock is not None:
        raise GradeFailure(f"deadlock (DeadlockError) running {name} on p = {p} ranks with "
                           f"m = {m}: {deadlock}\n    {DEADLOCK_HINT}")


# ---- exercise 5.3: a plan within a bubble target and a memory cap ------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    cfg: GPTConfig
    pp: int
    global_batch: int
    bubble_target: float  # idle over ideal time, equal stages
    activation_cap: float  # bytes a GPU: the ledger's activation peak during a step


MODEL = GPTConfig(vocab_size=32, seq_len=16, hidden=16, num_heads=2, num_layers=8, seed=0)
#: the lesson's puzzle (section 8), then the same question with a tighter bubble
SCENARIOS = (Scenario("the lesson's pipeline, 8 layers on 4 ranks, 32 sequences", MODEL, 4,
                      32, bubble_target=0.25, activation_cap=700e3),
             Scenario("8 layers on 4 ranks, 16 sequences, a 10 % bubble", MODEL, 4, 16,
                      bubble_target=0.10, activation_cap=500e3))
NAMES = ("gpipe", "1f1b", "interleaved_1f1b")


def batch(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """One (ids, targets) global batch of [s, B] tokens."""
    rng = np.random.default_rng(1)
    return tuple(rng.integers(0, sc.cfg.vocab_size, (sc.cfg.seq_len, sc.global_batch))
                 for _ in range(2))


def read_plan(plan, sc: Scenario) -> tuple[str, int, int]:
    """(schedule, m, v), refused in the learner's terms before anything runs."""
    keys = ["chunks", "microbatches", "schedule"]
    if not isinstance(plan, dict) or sorted(plan) != keys:
        raise GradeFailure(f"{sc.name}: choose_pipeline(...) returned {plan!r:.100}, "
                           f"expected a dict with the keys {keys}")
    name, m, v = plan["schedule"], plan["microbatches"], plan["chunks"]
    if name not in NAMES or not all(isinstance(k, (int, np.integer)) and k >= 1
                                    for k in (m, v)):
        raise GradeFailure(f"{sc.name}: the plan {plan!r:.100} needs a schedule among "
                           f"{NAMES} and integers microbatches, chunks >= 1")
    if sc.global_batch % m:
        raise GradeFailure(
            f"{sc.name}: m = {m} micro-batches do not divide the global batch of "
            f"{sc.global_batch} sequences: a micro-batch holds B/m whole sequences, so m "
            f"must divide {sc.global_batch} (Megatron asserts it too)")
    try:
        schedule(name, sc.pp, int(m), int(v))
    except ScheduleError as e:
        raise GradeFailure(f"{sc.name}: the plan {plan} is refused: {e}") from None
    return name, int(m), int(v)


def measure(sc: Scenario, name: str, m: int, v: int) -> dict:
    """One training step on pp simulated devices: each rank's activation peak and loss."""
    ids, targets = batch(sc)

    def program(ctx):
        run = parallelize(sc.cfg, ParallelDims(pp=sc.pp), schedule=name, microbatches=m,
                          chunks=v, lr=1e-3)
        mp.barrier()
        ctx.ledger.reset_peak()
        base = ctx.ledger.held("activations")
        loss = run.train_step(ids, targets)
        return ctx.ledger.peak("activations") - base, loss

    res = mp.launch(program, sc.pp)
    return {"peaks": [r[0] for r in res], "loss": res[0][1]}


def memory_words(name: str, m: int, v: int, sc: Scenario) -> str:
    b = sc.global_batch // m
    if name == "gpipe":
        return (f"GPipe holds all m micro-batches of b = {b} sequences on every rank, m·b = "
                f"{sc.global_batch}: the whole batch's activations whatever m is. 1F1B holds "
                f"min(p - r, m), so more micro-batches make what it holds smaller")
    if name == "interleaved_1f1b":
        return (f"interleaving warms up 2(p - r - 1) + (v - 1)p chunk forwards on rank r, "
                f"so it holds more micro-batches than 1F1B's min(p - r, m); fewer chunks, "
                f"or more (smaller) micro-batches, hold less")
    return (f"1F1B holds min(p - r, m) micro-batches of b = B/m = {b} sequences on rank r: "
            f"more micro-batches make each one smaller")


@exercise("5.3", "micro-batches and chunks within a bubble and a memory budget")
def check_choose_pipeline(impl):
    for sc in SCENARIOS:
        plan = impl.choose_pipeline(sc.cfg, sc.pp, sc.global_batch, sc.bubble_target,
                                    sc.activation_cap)
        name, m, v = read_plan(plan, sc)
        d = dry_run(lower(schedule(name, sc.pp, m, v)), {"F": Fraction(1, v),
                                                          "B": Fraction(2, v)})
        layout = f"{name} with m = {m}, v = {v}"
        expect_within(100 * float(d.bubble_over_ideal), 100 * sc.bubble_target, unit="%",
                      what=f"{sc.name}: the bubble of {layout} (idle over ideal time, equal "
                           f"stages, the dry run)",
                      hint=f"the bubble is (p - 1)/(v·m) = {sc.pp - 1}/{v * m}: raise m "
                           f"(a divisor of {sc.global_batch}) or interleave v chunks")
        got = measure(sc, name, m, v)
        worst = max(range(sc.pp), key=lambda r: got["peaks"][r])
        expect_within(got["peaks"][worst] / 1e3, sc.activation_cap / 1e3, unit="kB",
                      what=f"{sc.name}: the activation peak of {layout} on pipeline rank "
                           f"{worst} (the ledger, one training step)",
                      hint=memory_words(name, m, v, sc))
        with mp.device():
            want = GPT(sc.cfg).loss_and_grad(*batch(sc))
        expect_close(got["loss"], want, rtol=1e-10, what=f"{sc.name}: the loss of {layout}",
                     hint="a pipeline trains the model one device trains")
