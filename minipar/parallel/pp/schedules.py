"""Pipeline schedules as data: for each of p ranks, the ordered compute actions it runs.

    schedule("gpipe", pp=4, microbatches=8)                -> list of 4 lists of Actions
    schedule("interleaved_1f1b", pp=4, microbatches=8, chunks=2)

Pure functions of (p, m, v): no communication, no model, importable by plan and viz. The
sends and receives are added by lowering.py; validate.py checks any schedule; dry_run.py
times one. Rank r holds stage r (one chunk), or stages r, r + p, ..., r + (v-1)p (v chunks,
"interleaved", stage s on rank s mod p), or stages r and 2p - 1 - r (the V schedules
"zbv" and "dualpipev"): which rank holds a stage is read from the lists themselves,
placement(actions), never assumed. Micro-batches are 0..m-1.

The zero-bubble schedules, with the backward split into I and W, are in zero_bubble.py
("zb_h1", "zb_h2", "zbv") and dualpipe.py ("dualpipev", with overlapped F&B pairs).

GPipe (Huang et al. 2019), all forwards then all backwards:
    rank r:  F0 F1 ... F(m-1)  B0 B1 ... B(m-1)                 holds m micro-batches
1F1B, PipeDream-Flush (Narayanan et al. 2021; Megatron-LM's default):
    rank r:  w = min(p - r - 1, m) warm-up forwards F0..F(w-1),
             then m - w pairs  F(w+i) B(i),  then the cool-down B(m-w)..B(m-1)
    At most min(p - r, m) micro-batches are in flight on rank r (forward done, backward
    not yet), against GPipe's m; the bubble is the same: idle / ideal = (p - 1)/m.
Interleaved 1F1B (Narayanan et al. 2021, section 2.2; Megatron's grouping rule):
    v chunks per rank, n = m·v virtual micro-batches in Megatron's order: groups of p
    micro-batches run through chunk 0, then the same p through chunk 1, ...:
        virtual k:  j = k mod (p·v),  chunk = j // p (forward; v - 1 - j // p backward),
                    micro-batch = (k // (p·v))·p + k mod p
    w = min(2(p - r - 1) + (v - 1)·p, n) warm-up forwards, then n - w pairs F(w+i) B(i),
    then the cool-down backwards. The rule needs m % p == 0 (Megatron refuses anything
    else, and so does this function); the bubble falls to (p - 1)/(v·m). Megatron's newer
    code also runs all forwards first when w reaches n, which the min above does.
    torch.distributed.pipelining relaxes m % p == 0 to m % max(1, m // p) == 0 with
    rounds of m // rounds micro-batches; minipar follows Megatron's stricter rule.
"""

from __future__ import annotations

from typing import Callable, Optional

from .actions import B, F, Action, Schedule, ScheduleError
from .dualpipe import dualpipev
from .zero_bubble import check_v, zb_h1, zb_h2, zbv


def gpipe(pp: int, microbatches: int) -> Schedule:
    """All-forward-all-backward (GPipe): rank r runs r F0..F(m-1), then r B0..r B(m-1)."""
    m = microbatches
    return [[Action(r, F, i) for i in range(m)] + [Action(r, B, i) for i in range(m)]
            for r in range(pp)]


def one_f_one_b(pp: int, microbatches: int) -> Schedule:
    """PipeDream-Flush 1F1B: min(p - r - 1, m) warm-up forwards, F/B pairs, cool-down."""
    m = microbatches
    ranks = []
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        row = [Action(r, F, i) for i in range(warmup)]
        for i in range(m - warmup):                      # steady state: one F, one B
            row += [Action(r, F, warmup + i), Action(r, B, i)]
        row += [Action(r, B, i) for i in range(m - warmup, m)]  # cool-down
        ranks.append(row)
    return ranks


def interleaved_1f1b(pp: int, microbatches: int, chunks: int) -> Schedule:
    """Megatron's interleaved 1F1B: v = chunks stages per rank (stage s on rank s mod p)."""
    p, m, v = pp, microbatches, chunks
    if m % p:
        lower, upper = (m // p) * p, (m // p + 1) * p
        fix = f"{lower} or {upper}" if lower else f"{upper}"
        raise ScheduleError(
            f"interleaved_1f1b groups micro-batches by the pipeline size (Megatron's rule): "
            f"microbatches must be a multiple of pp = {p}, got {m}; use microbatches = "
            f"{fix}, or chunks=1 with '1f1b'")
    n = m * v

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        """(chunk, micro-batch) of the k-th forward (or backward) on a rank."""
        j = k % (p * v)
        chunk = j // p if forward else v - 1 - j // p
        return chunk, (k // (p * v)) * p + k % p

    ranks = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, n)

        def fwd(k: int) -> Action:
            chunk, mb = virtual(k, True)
            return Action(chunk * p + r, F, mb)

        def bwd(k: int) -> Action:
            chunk, mb = virtual(k, False)
            return Action(chunk * p + r, B, mb)

        row = [fwd(k) for k in range(warmup)]
        for i in range(n - warmup):
            row += [fwd(warmup + i), bwd(i)]
        row += [bwd(k) for k in range(n - warmup, n)]
        ranks.append(row)
    return ranks


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": zb_h1,
    "zb_h2": zb_h2,
    "zbv": zbv,
    "dualpipev": dualpipev,
}
MULTI_CHUNK = ("interleaved_1f1b",)  # the schedules that place several stages on a rank
V_SHAPED = ("zbv", "dualpipev")      # two chunks a rank, stages r and 2p - 1 - r


def own_chunks(name: str) -> int:
    """The chunks (stages) a rank holds under schedule `name` when none are asked for: 2 for
    the V schedules, 1 for the others (interleaved_1f1b takes any count)."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; the schedules are "
                            f"{', '.join(repr(k) for k in SCHEDULES)}")
    return 2 if name in V_SHAPED else 1


def _count(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"schedule needs {what} >= 1 (an integer), got {value!r}")
    return value


def schedule(name: str, pp: int, microbatches: int, chunks: Optional[int] = None) -> Schedule:
    """Each pipeline rank's ordered compute actions for schedule `name`.

    name: "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv" or "dualpipev";
    pp: pipeline ranks p; microbatches: m; chunks: model chunks v per rank (interleaved:
    any v >= 1, default 1, stage s on rank s mod p; the V schedules: 2, their own, stages
    r and 2p - 1 - r on rank r; the others: 1). Left out, chunks is the schedule's own.
    """
    own_chunks(name)  # a known name
    pp, microbatches = _count(pp, "pp"), _count(microbatches, "microbatches")
    if name in V_SHAPED:
        check_v(name, pp, chunks if chunks is None else _count(chunks, "chunks"))
        return SCHEDULES[name](pp, microbatches)
    chunks = 1 if chunks is None else _count(chunks, "chunks")
    if name in MULTI_CHUNK:
        return SCHEDULES[name](pp, microbatches, chunks)
    if chunks != 1:
        raise ScheduleError(f"{name!r} runs one stage per rank, got chunks={chunks}; for "
                            f"{chunks} chunks per rank use 'interleaved_1f1b'"
                            + (" (or 'zbv' or 'dualpipev': two in a V)" if chunks == 2 else ""))
    return SCHEDULES[name](pp, microbatches)
