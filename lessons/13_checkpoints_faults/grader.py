"""Grader for lesson 13: your checkpoint interval against Young's and Daly's formulas on drawn
jobs (Llama 3's interruptions among them); your reshard reads assembled from the shards of
minipar's FlatParameter over n ranks and compared with its shard over m, then from the
files of a real ZeRO-1 checkpoint saved at dp 3 against what a dp 2 run loads; your
smaller data-parallel step against minipar's split of the batch (split_data_parallel, then
split_microbatches) and, on simulated devices, the losses of a run resumed at dp 3 against
one device's; your diagnosis of a hang against the rank planted to diverge, and against a
swapped pair of all-reduces run on simulated devices and read from their traces.
A wrong answer is compared with the known mistakes on the drawn case, and the one it makes
is named."""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import example, given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_keys, expect_number, learner, world_sizes)
from minipar.data.batches import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.nn.parameter import Parameter
from minipar.parallel import FlatParameter, ParallelDims, checkpoint, parallelize

DAY = 86400


def close(a: float, b: float, rtol: float = 1e-9) -> bool:
    return abs(a - b) <= rtol * abs(b) + 1e-12


# ---- exercise 13.1: the checkpoint interval ------------------------------------------------
INTERVAL_KEYS = ("mtbf", "young", "daly", "lost_per_failure", "overhead")


def interval(delta, days, planned, unexpected, restart, **bug) -> dict:
    """Section 4's numbers, with a mistake switched on (the keys of INTERVAL_MISTAKES)."""
    failures = planned + unexpected if bug.get("total") else unexpected
    M = days * (24 if bug.get("hours") else DAY) / failures
    young = math.sqrt((1 if bug.get("no_2") else 2) * delta * M)
    if delta < 2 * M or bug.get("no_branch"):
        daly = math.sqrt(2 * delta * M) * (1 + math.sqrt(delta / (2 * M)) / 3
                                           + delta / (18 * M))
        daly -= 0 if bug.get("no_minus") else delta
    else:
        daly = M
    if bug.get("young_for_daly"):
        daly = young
    redone = {"whole": young + delta, "tau": young / 2}.get(bug.get("redone"),
                                                           (young + delta) / 2)
    lost = redone + (0 if bug.get("no_restart") else restart)
    overhead = delta / young + (0 if bug.get("saves_only") else lost / M)
    return {"mtbf": M, "young": young, "daly": daly, "lost_per_failure": lost,
            "overhead": overhead}


INTERVAL_MISTAKES = {
    "total": "you counted all the interruptions; planned ones (maintenance) are preceded by "
             "a save and lose no work: M = days / unexpected interruptions",
    "hours": "your M is in hours: the days are 86,400 s each, and every answer is in seconds",
    "no_2": "that is sqrt(δ·M): Young's interval is sqrt(2·δ·M) (from minimizing "
            "δ/τ + τ/(2M))",
    "no_minus": "you left out Daly's − δ: his interval counts the compute between two saves, "
                "sqrt(2δM)·(1 + ...) − δ",
    "no_branch": "Daly's estimate holds while δ < 2M; when a save takes 2M or longer the "
                 "interval is M",
    "young_for_daly": "you returned Young's interval for Daly's: Daly's adds the higher-order "
                      "terms sqrt(δ/(2M))/3 + δ/(18M) and subtracts δ",
    "redone": "the work a failure loses is half a cycle on average, (τ + δ)/2: the failure "
              "falls uniformly in the cycle of τ of compute and δ of saving",
    "no_restart": "you left the restart out: each failure also costs R before training "
                  "runs again",
    "saves_only": "the overhead counts the saves δ/τ and the failures, lost_per_failure / M",
}


def interval_diagnosis(got: dict, key: str, case: tuple) -> str:
    for name, words in INTERVAL_MISTAKES.items():
        options = ("whole", "tau") if name == "redone" else (True,)
        for value in options:
            wrong = interval(*case, **{name: value})
            if wrong[key] != interval(*case)[key] and close(got[key], wrong[key]):
                return words[0].upper() + words[1:]
    return ""


@exercise("13.1", "the checkpoint interval and its overhead")
@SETTINGS
@given(delta=st.floats(0.5, 2e5), days=st.integers(1, 120), planned=st.integers(0, 60),
       unexpected=st.integers(1, 600), restart=st.floats(0, 3600))
@example(delta=2.840973722, days=54, planned=47, unexpected=419, restart=600.0)  # Llama 3
@example(delta=1e5, days=10, planned=3, unexpected=40, restart=60.0)  # δ >= 2M
def check_checkpoint_interval(impl, delta, days, planned, unexpected, restart):
    case = (delta, days, planned, unexpected, restart)
    what = (f"checkpoint_interval(save_seconds={delta!r}, days={days}, planned={planned}, "
            f"unexpected={unexpected}, restart_seconds={restart!r})")
    got = expect_keys(learner(what, impl.checkpoint_interval, *case), INTERVAL_KEYS, what=what)
    got = {k: expect_number(v, what=f"{what}[{k!r}]") for k, v in got.items()}
    want = interval(*case)
    for key in INTERVAL_KEYS:  # M first: every other number is built on it
        if not close(got[key], want[key]):
            raise GradeFailure(
                f"{what}[{key!r}] is {got[key]:.6g}, expected {want[key]:.6g} (M = "
                f"{want['mtbf']:.6g} s, Young's τ = {want['young']:.6g} s). "
                f"{interval_diagnosis(got, key, case)}".rstrip())


# ---- exercise 13.2: which old shards a new rank reads ----------------------------------------
def flat_of(numel: int, world: int) -> FlatParameter:
    """minipar's flat layout of `numel` elements over `world` ranks (one parameter)."""
    return FlatParameter("unit", [Parameter("w", np.zeros(numel), charge=False)], world)


def reads(numel, n, m, rank, **bug) -> list:
    """The right reads, or with a mistake switched on (the keys of RESHARD_MISTAKES)."""
    size = (lambda w: numel // w) if bug.get("floor") else (lambda w: -(-numel // w))
    old, new = size(n), size(m)
    if bug.get("old_size"):
        new = old
    lo = rank * new
    hi = (rank + 1) * new if bug.get("padding") else min((rank + 1) * new, numel)
    out = []
    for k in range(n):
        start, stop = max(lo, k * old), min(hi, (k + 1) * old)
        if bug.get("inclusive"):
            stop -= 1
        if start < stop:
            base = 0 if bug.get("flat") else k * old
            out.append((k, start - base, stop - base))
    return out


RESHARD_MISTAKES = {
    "floor": "your shards are numel // n elements: the flat buffer is padded to a multiple "
             "of n, so a shard holds ceil(numel / n) (it differs when n does not divide numel)",
    "padding": "you read the padding: the new shard's last elements past numel are zeros "
               "the load fills in, not elements of any old shard; stop at numel",
    "flat": "your start and stop are offsets in the flat buffer; they are offsets inside old "
            "rank k's shard, which begins at k·ceil(numel / n)",
    "old_size": "you cut the new shards with the old shard size: the new ones are "
                "ceil(numel / m)",
    "inclusive": "your stop is inclusive: (k, start, stop) means elements [start, stop), "
                 "as a Python slice",
}


def reshard_diagnosis(got, numel, n, m, rank) -> str:
    for name, words in RESHARD_MISTAKES.items():
        wrong = reads(numel, n, m, rank, **{name: True})
        if wrong != reads(numel, n, m, rank) and got == wrong:
            return " " + words[0].upper() + words[1:]
    return ""


def read_pieces(got, numel, n, what) -> list:
    """The learner's list as (k, start, stop) ints, each a valid piece of an old shard."""
    size = flat_of(numel, n).shard_numel
    if not isinstance(got, (list, tuple)):
        raise GradeFailure(f"{what} returned {got!r:.80}; expected a list of (old_rank, "
                           f"start, stop)")
    out = []
    for piece in got:
        try:
            k, start, stop = (int(v) for v in piece)
        except (TypeError, ValueError):
            raise GradeFailure(f"{what} returned {piece!r:.60} among its pieces; expected "
                               f"(old_rank, start, stop), three integers") from None
        if not 0 <= k < n:
            raise GradeFailure(f"{what} reads old rank {k}; the checkpoint has ranks "
                               f"0..{n - 1}")
        if not 0 <= start < stop <= size:
            raise GradeFailure(f"{what} reads elements [{start}, {stop}) of old rank {k}'s "
                               f"shard, which holds {size} (ceil({numel}/{n})): expected "
                               f"0 <= start < stop <= {size}, offsets inside the shard.")
        out.append((k, start, stop))
    return out


@exercise("13.2", "which old shards a new rank reads")
def check_reshard_reads(impl):
    drawn_reshards(impl)  # on minipar's flat layout first, then on a real checkpoint's files
    real_checkpoint(impl)


@SETTINGS
@given(numel=st.integers(1, 60), n=world_sizes(1, 6, first=2), m=world_sizes(1, 6, first=3),
       pick=st.integers(0, 5))
@example(numel=10, n=4, m=3, pick=1)
def drawn_reshards(impl, numel, n, m, pick):
    rank = pick % m
    what = f"reshard_reads(numel={numel}, n={n}, m={m}, rank={rank})"
    got = learner(what, impl.reshard_reads, numel, n, m, rank)
    old = flat_of(numel, n)
    flat = np.concatenate([np.arange(1.0, numel + 1), np.zeros(old.padding)])  # the saved buffer
    shards = [flat[slice(*old.shard_range(k))] for k in range(n)]
    lo, hi = flat_of(numel, m).shard_range(rank)
    want = flat[lo:min(hi, numel)]  # the new shard's elements, padding left out
    hint = (f"the old shards are flat[k·{old.shard_numel} : (k + 1)·{old.shard_numel}] "
            f"(ceil({numel}/{n}), {old.padding} element(s) of padding at the end); rank "
            f"{rank} of {m} needs elements [{lo}, {min(hi, numel)}) of the flat buffer")
    try:
        pieces = read_pieces(got, numel, n, what)
    except GradeFailure as e:
        raise GradeFailure(f"{e}{reshard_diagnosis(got, numel, n, m, rank)}") from None
    assembled = np.concatenate([shards[k][a:b] for k, a, b in pieces] or [np.zeros(0)])
    if assembled.shape != want.shape or not np.array_equal(assembled, want):
        raise GradeFailure(
            f"{what} returned {pieces}, which laid end to end are elements "
            f"{[int(v) - 1 if v else 'pad' for v in assembled[:8]]}"
            f"{' ...' if assembled.size > 8 else ''} of the flat buffer ({assembled.size} "
            f"in all); expected [{lo}, {min(hi, numel)}) ({want.size} elements): {hint}."
            f"{reshard_diagnosis(pieces, numel, n, m, rank)}")


# the real thing, once: a tiny GPT saved by ZeRO-1 at dp 3, loaded by ZeRO-1 at dp 2
TINY = GPTConfig(vocab_size=11, seq_len=5, hidden=8, num_heads=2, num_layers=1)


@functools.lru_cache(maxsize=1)
def saved_and_loaded() -> tuple:
    """({unit: (numel, [rank files' 'unit/param' arrays at dp 3])}, {unit: [dp 2 shards]})."""
    ids = np.random.default_rng(3).integers(0, TINY.vocab_size, (TINY.seq_len, 6))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "ckpt"

        def save(ctx):
            run = parallelize(TINY, ParallelDims(dp_shard=3), zero=1, lr=1e-2)
            run.train_step(ids, np.roll(ids, -1, 0))
            checkpoint.save_sharded(run, d)

        def load(ctx):
            run = parallelize(TINY, ParallelDims(dp_shard=2), zero=1, lr=1e-2)
            checkpoint.load(run, d)
            return {s.flat.unit: s.arrays["param"].copy() for s in run.engine.local_state().units}

        mp.launch(save, 3)
        loaded = mp.launch(load, 2)
        files = []
        for k in range(3):
            with np.load(d / f"rank{k:05d}.npz") as f:
                files.append({name: f[name] for name in f.files})
    units = {u: (flat_numel(u), [files[k][f"{u}/param"] for k in range(3)])
             for u in loaded[0]}
    return units, {u: [loaded[j][u] for j in range(2)] for u in loaded[0]}


def flat_numel(unit: str) -> int:
    with mp.device():
        model = GPT(TINY)
    return sum(p.size for name, ps in model.units() if name == unit for p in ps)


def real_checkpoint(impl) -> None:
    units, loaded = saved_and_loaded()
    for unit, (numel, files) in units.items():
        for j in range(2):
            what = f"reshard_reads(numel={numel}, n=3, m=2, rank={j})"
            pieces = read_pieces(learner(what, impl.reshard_reads, numel, 3, 2, j), numel, 3,
                                 what)
            got = np.concatenate([files[k][a:b] for k, a, b in pieces] or [np.zeros(0)])
            shard = loaded[unit][j]  # [ceil(numel / 2)], padding included
            real = min(shard.size, max(0, numel - j * shard.size))
            expect_close(got, shard[:real], rtol=0, atol=0,
                         what=f"unit {unit!r} of a tiny GPT saved by ZeRO-1 at dp 3 and "
                              f"loaded at dp 2: the weights {what}'s pieces read from the "
                              f"rank files",
                         hint="they must be the shard the dp 2 run holds after "
                              "checkpoint.load (its padding left out)")


# ---- exercise 13.3: the accumulation that keeps the global batch --------------------------------
def shrunk(B, b, dp_old, dp_new, **bug) -> dict:
    """The right answer, or with a mistake switched on (the keys of SHRINK_MISTAKES)."""
    if bug.get("keep_k"):
        k = B // (dp_old * b)
    elif bug.get("inverse"):
        k = max(1, B // (dp_old * b) * dp_new // dp_old)
    elif bug.get("no_b"):
        k = B // dp_new
    else:
        k = B // (dp_new * b)
    batch = B if bug.get("same_batch") else dp_new * k * b
    block = batch // dp_new
    if bug.get("strided"):
        rows = [[(i * dp_new * b + d * b, i * dp_new * b + (d + 1) * b) for i in range(k)]
                for d in range(dp_new)]
    else:
        rows = [[(d * block + i * b, d * block + (i + 1) * b) for i in range(k)]
                for d in range(dp_new)]
    return {"accumulation": k, "global_batch": batch, "rows": rows}


SHRINK_MISTAKES = {
    "keep_k": "you kept the accumulation of dp_old: each replica then trains what it did "
              "before, and the global batch shrinks with dp (the learning rate schedule was "
              "tuned for the global batch): k = B / (dp_new·b)",
    "inverse": "you scaled the accumulation by dp_new/dp_old; fewer replicas need more "
               "micro-batches each, k = B / (dp_new·b)",
    "no_b": "you divided the batch by dp alone: that counts sequences a replica, not "
            "micro-batches of b; k = B / (dp_new·b)",
    "same_batch": "dp_new·b does not divide the global batch, so dp_new·k·b sequences are "
                  "trained, the largest multiple not above it; report that batch",
    "strided": "your replicas take every dp-th micro-batch; minipar gives replica d a "
               "contiguous block of B/dp sequences (split_data_parallel), cut into k "
               "micro-batches (split_microbatches)",
}


def minipar_rows(batch: int, dp: int, k: int) -> list:
    """(start, stop) of each replica's micro-batches, as minipar splits a [1, batch] batch."""
    cols = np.arange(batch)[None, :]
    rows = []
    for d in range(dp):
        block, _ = split_data_parallel(cols, cols, d, dp)
        rows.append([(int(x[0, 0]), int(x[0, -1]) + 1)
                     for x, _ in split_microbatches(block, block, k)])
    return rows


def shrink_diagnosis(got: dict, key: str, case: tuple) -> str:
    for name, words in SHRINK_MISTAKES.items():
        wrong = shrunk(*case, **{name: True})
        if wrong[key] != shrunk(*case)[key] and got.get(key) == wrong[key]:
            return " " + words[0].upper() + words[1:]
    return ""


@exercise("13.3", "the accumulation that keeps the global batch")
def check_shrink_dp(impl):
    drawn_shrinks(impl)  # the arithmetic and the split first, then a run at the smaller dp
    resumed_run(impl)


@SETTINGS
@given(b=st.integers(1, 4), dp_new=world_sizes(1, 8, first=3), fewer=st.integers(1, 3),
       k_old=st.integers(1, 6))
@example(b=1, dp_new=7, fewer=1, k_old=64)  # Llama 3 70B: dp 8 -> 7, 512 sequences
def drawn_shrinks(impl, b, dp_new, fewer, k_old):
    dp_old = dp_new + fewer
    B = dp_old * k_old * b
    case = (B, b, dp_old, dp_new)
    what = f"shrink_dp(global_batch={B}, micro_batch={b}, dp_old={dp_old}, dp_new={dp_new})"
    got = expect_keys(learner(what, impl.shrink_dp, *case),
                      ("accumulation", "global_batch", "rows"), what=what)
    k = B // (dp_new * b)
    batch = dp_new * k * b
    for key, want in (("accumulation", k), ("global_batch", batch)):
        if got[key] != want:
            raise GradeFailure(f"{what}[{key!r}] is {got[key]!r}, expected {want}: "
                               f"{dp_new} replicas × k = {k} micro-batches × b = {b}."
                               f"{shrink_diagnosis(got, key, case)}")
    try:
        rows = [[tuple(int(v) for v in r) for r in replica] for replica in got["rows"]]
    except (TypeError, ValueError):
        raise GradeFailure(f"{what}['rows'] is {got['rows']!r:.80}; expected one list a "
                           f"replica of (start, stop) a micro-batch") from None
    want = minipar_rows(batch, dp_new, k)
    if rows != want:
        d = next((d for d in range(min(len(rows), dp_new)) if rows[d] != want[d]),
                 min(len(rows), dp_new))
        shown = rows[d] if d < len(rows) else "nothing"
        raise GradeFailure(f"{what}['rows'][{d}] is {shown}, expected {want[d]} "
                           f"(minipar's split of the {batch} sequences: replica {d}'s block, "
                           f"then its micro-batches).{shrink_diagnosis(got, 'rows', case)}")


# on simulated devices, once: a step at dp 3 with the accumulation you chose is one device's
TINY_RUN = GPTConfig(vocab_size=13, seq_len=6, hidden=8, num_heads=2, num_layers=1)


@functools.lru_cache(maxsize=1)
def one_device_loss(batch: int) -> float:
    ids = np.random.default_rng(5).integers(0, TINY_RUN.vocab_size, (TINY_RUN.seq_len, 24))
    with mp.device():
        return GPT(TINY_RUN).loss_and_grad(ids[:, :batch], np.roll(ids, -1, 0)[:, :batch])


def resumed_run(impl) -> None:
    what = "shrink_dp(global_batch=24, micro_batch=2, dp_old=4, dp_new=3)"
    got = learner(what, impl.shrink_dp, 24, 2, 4, 3)
    k, batch = got["accumulation"], got["global_batch"]
    ids = np.random.default_rng(5).integers(0, TINY_RUN.vocab_size, (TINY_RUN.seq_len, 24))

    def program(ctx):
        run = parallelize(TINY_RUN, ParallelDims(dp_shard=3), zero=1, lr=1e-2)
        return run.forward_backward(ids[:, :batch], np.roll(ids, -1, 0)[:, :batch],
                                    micro_batches=k)

    loss = float(np.mean(mp.launch(program, 3)))
    expect_close(loss, one_device_loss(24), rtol=1e-12, atol=0,
                 what=f"the loss of a step at dp 3 × {k} micro-batches (from {what}) against "
                      f"one device's on the 24 sequences",
                 hint="the step at the smaller dp trains the same global batch")


# ---- exercise 13.4: the first rank to diverge -----------------------------------------------
FAULTS = ("skip", "swap", "extra", "shape", "stop", "none")


def recorded(world: int, calls: int, fault: str, culprit: int, at: int) -> list:
    """What each rank entered: `calls` distinct collectives, rank `culprit` with `fault` at
    call `at` (skip it, swap it with the next, an extra call before it, another shape, stop
    before it)."""
    plan = [("all_reduce" if i % 3 else "all_gather", (4 + i % 2,),
             f"train.py:{40 + 3 * i} in step") for i in range(calls)]
    entered = [list(plan) for _ in range(world)]
    mine = entered[culprit]
    if fault == "skip":
        del mine[at]
    elif fault == "swap":
        mine[at], mine[at + 1] = mine[at + 1], mine[at]
    elif fault == "extra":
        mine.insert(at, ("all_reduce", (1,), "train.py:97 in log_loss"))
    elif fault == "shape":
        mine[at] = (mine[at][0], (7,), mine[at][2])
    elif fault == "stop":
        del mine[at:]
    return entered


def diverged(entered, **bug):
    """The right answer, or with a mistake switched on (the keys of HANG_MISTAKES)."""
    if bug.get("last"):  # the last entry of each list only
        ends = [c[-1] if c else None for c in entered]
        if len(set(ends)) == 1:
            return None
        usual = max(set(ends), key=lambda e: (ends.count(e), -ends.index(e)))
        r = next(r for r, e in enumerate(ends) if e != usual)
        return r, max(len(entered[r]) - 1, 0)
    if bug.get("fewest"):
        lengths = [len(c) for c in entered]
        r = lengths.index(min(lengths))
        return (r, lengths[r]) if len(set(lengths)) > 1 else None
    longest = (min if bug.get("zip") else max)(len(c) for c in entered)
    for i in range(longest):
        at = [c[i] if i < len(c) else None for c in entered]
        if len(set(at)) > 1:
            if bug.get("last_vs_0"):
                r = max(r for r, e in enumerate(at) if e != at[0])
            else:
                usual = max(set(at), key=lambda e: (at.count(e), -at.index(e)))
                r = next(r for r, e in enumerate(at) if e != usual)
            return r, i + (1 if bug.get("one_based") else 0)
    return None


HANG_MISTAKES = {
    "fewest": "you blamed the rank that entered the fewest collectives (the one the others "
              "wait for): that finds a skip or a stop, not calls swapped, added or of another "
              "shape, and not where the lists part",
    "last_vs_0": "you blamed the last rank that disagrees with rank 0; when rank 0 is the one "
                 "that diverged, every other rank disagrees with it: compare each entry with "
                 "the one most ranks have",
    "zip": "you compared the lists only up to the shortest (zip stops there): a rank that "
           "stopped has no entry where the others have one, and that is the divergence",
    "one_based": "your index counts from 1; positions in the lists count from 0",
    "last": "you compared only the last collective each rank entered (where a hang shows): "
            "after a skip or a swap the ranks agree again; find where the lists part",
}


def hang_diagnosis(got, entered) -> str:
    for name, words in HANG_MISTAKES.items():
        wrong = diverged(entered, **{name: True})
        if wrong != diverged(entered) and got == wrong:
            return " " + words[0].upper() + words[1:]
    return ""


def shown(entered: list) -> str:
    return "; ".join(f"rank {r}: [{', '.join(f'{k}{s} at {w}' for k, s, w in c)}]"
                     for r, c in enumerate(entered))


@exercise("13.4", "the first rank to diverge")
def check_first_divergence(impl):
    drawn_hangs(impl)  # planted faults first, then a run's traces
    traced_swap(impl)


@SETTINGS
@given(world=world_sizes(3, 8, first=3), calls=st.integers(1, 6),
       fault=st.sampled_from(FAULTS), pick=st.integers(0, 7), where=st.integers(0, 5))
@example(world=4, calls=4, fault="skip", pick=2, where=1)
def drawn_hangs(impl, world, calls, fault, pick, where):
    culprit = pick % world
    at = where % (calls - 1) if fault == "swap" and calls > 1 else where % calls
    if fault == "swap" and calls == 1:
        fault = "shape"
    entered = recorded(world, calls, fault, culprit, at)
    want = None if fault == "none" else (culprit, at)
    what = f"first_divergence(entered) for {world} ranks"
    got = learner(what, impl.first_divergence, [list(c) for c in entered])
    if got is not None:
        try:
            got = tuple(int(v) for v in got)
        except (TypeError, ValueError):
            raise GradeFailure(f"{what} returned {got!r:.80}; expected (rank, index) or "
                               f"None") from None
    if got != want:
        story = {"none": "every rank entered the same collectives",
                 "skip": f"rank {culprit} skipped its call #{at}",
                 "swap": f"rank {culprit} made calls #{at} and #{at + 1} in the other order",
                 "extra": f"rank {culprit} made one call more, before call #{at}",
                 "shape": f"rank {culprit} made call #{at} with another shape",
                 "stop": f"rank {culprit} stopped before call #{at}"}[fault]
        raise GradeFailure(f"{what} returned {got}, expected {want}: {story}. What the ranks "
                           f"entered: {shown(entered)}.{hang_diagnosis(got, entered)}")


@functools.lru_cache(maxsize=1)
def swapped_traces() -> list:
    """On 4 simulated ranks, rank 1 issues its two all-reduces in the other order (equal
    shapes: no error, wrong sums); what each rank entered, read from its trace."""
    def program(ctx):
        grads, loss = np.full(3, 1.0 + ctx.rank), np.full(3, 10.0 * ctx.rank)
        mp.all_reduce(np.ones(2))  # a first call every rank makes alike
        if ctx.rank == 1:
            mp.all_reduce(loss)
            mp.all_reduce(grads)
        else:
            mp.all_reduce(grads)
            mp.all_reduce(loss)
        return [(e.name, e.nbytes, e.meta["where"]) for e in ctx.trace.events
                if e.stream == "comm"]
    return list(mp.launch(program, 4))


def traced_swap(impl) -> None:
    entered = swapped_traces()
    what = "first_divergence(entered) read from 4 simulated ranks' traces"
    got = learner(what, impl.first_divergence, [list(c) for c in entered])
    if got is None or tuple(int(v) for v in got) != (1, 1):
        raise GradeFailure(f"{what} returned {got}, expected (1, 1): rank 1 made its second "
                           f"and third all-reduces in the other order (equal shapes, so no "
                           f"error, only wrong sums). What the ranks entered: "
                           f"{shown(entered)}.{hang_diagnosis(got, entered)}")
