"""The dry run: lowered action lists executed on a clock, with no arithmetic on tensors.

Each rank runs its list in order on two streams, as the runtime's clock does (p2p.py):

    F, B, I, W   compute:  start = now,  now += duration[kind][stage]
    (F; B) pair  without "F&B" in durations, its two halves on the compute stream, their
                 p2p on the p2p stream (lowering.py's pair_overlap, what the runner does):
                     now = max(now, arrival of its RECV_F);  now += t_F
                     its SEND_F is posted here, while the B half computes
                     now = max(now, arrival of its RECV_B);  now += t_B (or t_I)
                 so the gradient's transfer overlaps the F half and the activations'
                 the B half; nothing else overlaps (this model has no all-to-all).
                 With "F&B": start = max(now, both arrivals), now += duration["F&B"][stage
                 of its F], both sends posted at its end: DualPipe's t_F&B, the time of the
                 two overlapped chunks, the communication each hides behind the other's
                 compute (the experts' all-to-all, on a run's comm stream) inside it
    SEND         isend:    start = max(now, p2p),  arrives = start + p2p_cost,  p2p = arrives
    RECV         wait:     now = max(now, arrival of the matching SEND)
    end of list  the rank waits for its sends:  finish = max(now, p2p)

so compute actions are serial on a rank and a receive waits for its send. Durations may
be numbers or Fractions (then every result is exact). From the clock:

    makespan   = max over ranks of finish                     the step's time
    busy_r     = sum of rank r's compute durations            ideal: the step with no bubble
    idle_r     = makespan - busy_r                            the bubble on rank r
    bubble_over_ideal = sum idle / sum busy    = (p - 1)/m        with equal stages, no p2p
    bubble_over_total = sum idle / (p·makespan) = (p - 1)/(m + p - 1)
The first is the papers' "bubble fraction" (GPipe, Megatron-LM: bubble time over ideal
time); the second is the share of the step a rank stands idle, so a pipelined step reaches
at most (1 - bubble_over_total) of the utilisation its stages reach alone.

    start_r       = when rank r's first compute action starts
    steady_period = max over ranks of (finish_r - start_r)
    steady_bubble_over_ideal = (p·steady_period - sum busy) / sum busy
The steady figures are those of back-to-back steps with no flush between them: when no
optimizer synchronisation waits for every rank (the zero-bubble paper's "post-validation",
Qi et al. 2023 section 4), rank r starts step n + 1 as soon as it ends step n, every rank
shifted by the same period, which keeps every dependency. ZB-H2's and ZB-V's
parallelograms reach 0 there; a flushed step still pays their ramp (bubble_over_ideal).

In flight: the micro-batches whose activations a rank holds, +1 at sF i, -1 at sB i (at sW
i when that backward is split: W still reads the saved inputs); a pair counts its F before
its B releases, since both run at once. peak_in_flight counts
(stage, micro-batch) pairs; peak_activations divides by the rank's stage count, in units
of one micro-batch through all of the rank's layers (v chunks each hold 1/v of them).

Before any clock runs, the lists are checked: the compute rules (validate_schedule), every
RECV matched by one SEND of the same message and the reverse, every cross-rank input
received before it is used, and no deadlock: a rank may pass a RECV only once the SEND has
been reached; if every unfinished rank waits, ScheduleDeadlockError names who waits on what.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import Callable, Mapping, NamedTuple, Sequence, Union

from .actions import (B, F, RECV_B, RECV_F, SEND_B, SEND_F, W, Action, OverlapFB, Schedule,
                      ScheduleError, by_content, parts)
from .lowering import Message, message, pair_overlap
from .validate import ScheduleDeadlockError, ScheduleInfo, validate_schedule

Durations = Mapping[str, Union[Real, Sequence[Real]]]  # "F" -> seconds, or one per stage
PAIR = "F&B"  # the durations key of an overlapped pair (DualPipe's README writes t_F&B)


class Span(NamedTuple):
    """One action's simulated interval on its rank (a SEND's is on the p2p stream)."""

    action: Action
    start: Real
    end: Real


@dataclass(frozen=True)
class DryRun:
    """What the clock says of one pass of the lists (every field per rank is rank-ordered)."""

    makespan: Real
    busy: tuple            # per rank: seconds of compute
    idle: tuple            # per rank: makespan - busy
    finish: tuple          # per rank: when its last action (or send) ends
    bubble_over_ideal: Real  # sum idle / sum busy: (p - 1)/m for GPipe and 1F1B
    bubble_over_total: Real  # sum idle / (p · makespan): (p - 1)/(m + p - 1)
    peak_in_flight: tuple    # per rank: most (stage, micro-batch) pairs held at once
    peak_activations: tuple  # per rank: peak_in_flight / stages on the rank (Fraction)
    timeline: tuple          # per rank: tuple of Span, in list order
    info: ScheduleInfo
    start: tuple = ()        # per rank: when its first compute action starts
    steady_period: Real = 0  # max over ranks of finish - start: back-to-back steps
    steady_bubble_over_ideal: Real = 0  # (p · steady_period - sum busy) / sum busy


def _ratio(a: Real, b: Real) -> Real:
    if b == 0:
        return 0 * a
    return Fraction(a, b) if isinstance(a, int) and isinstance(b, int) else a / b


def _table(durations: Durations, kinds: set, S: int) -> dict:
    """kind -> per-stage durations, checked."""
    if not isinstance(durations, Mapping):
        raise ScheduleError(f"durations is a mapping like {{'F': 1.0, 'B': 2.0}}, got "
                            f"{durations!r}")
    table = {}
    for kind in sorted(kinds, key=lambda k: getattr(k, "value", k)):
        name = getattr(kind, "value", kind)
        value = durations.get(name, durations.get(kind))
        if value is None:
            raise ScheduleError(f"durations has no {name!r} but the schedule runs "
                                f"{name} actions: give seconds, or one per stage")
        per_stage = list(value) if isinstance(value, (list, tuple)) else [value] * S
        if len(per_stage) != S:
            raise ScheduleError(f"durations[{name!r}] has {len(per_stage)} values; "
                                f"the schedule has {S} stages: give one per stage or one number")
        for t in per_stage:
            if not isinstance(t, Real) or isinstance(t, bool) or t < 0:
                raise ScheduleError(f"durations[{name!r}] holds {t!r}: a duration is "
                                    f"a number of seconds >= 0")
        table[kind] = per_stage
    return table


def _messages(lowered: Schedule, info: ScheduleInfo) -> tuple[dict, list]:
    """(Message -> ((send rank, position), (recv rank, position)), per rank the Message of
    each action or None), every rule checked: a SEND follows the action that made its
    tensor, a RECV comes before the action that uses it, one of each per message, each on
    its stage's rank, never within one rank."""
    where, found, table = info.placement, {}, []
    for r, row in enumerate(lowered):
        seen: set[Action] = set()  # what this rank has run so far
        table.append([None] * len(row))
        for pos, item in enumerate(row):
            if item.is_communication:
                table[r][pos] = _check_end(item, r, pos, where, seen, found, info)
                seen.add(item)
                continue
            for a in parts(item):
                if a.kind == F and a.stage > 0 and where[a.stage - 1] != r:
                    _need(seen, Action(a.stage, RECV_F, a.microbatch), a, r, pos)
                elif a.kind != F and a.kind != W and a.stage + 1 < info.stages and \
                        where[a.stage + 1] != r:
                    _need(seen, Action(a.stage, RECV_B, a.microbatch), a, r, pos)
            seen.update(parts(item))
    for msg, (send, recv) in found.items():
        if send is None:
            raise ScheduleError(f"rank {recv[0]}: {msg.recv} waits for {msg.send}, which "
                                f"rank {msg.src} never runs")
    # a RECV missing for a SEND was refused above: its consumer found no RECV before it
    return {m: tuple(v) for m, v in found.items()}, table


def _check_end(a: Action, r: int, pos: int, where: dict, seen: set, found: dict,
               info: ScheduleInfo) -> Message:
    """One SEND or RECV: on its stage's rank, a peer on another rank, once, after its source."""
    if where[a.stage] != r:
        raise ScheduleError(f"rank {r}: {a} acts for stage {a.stage}, which lives on rank "
                            f"{where[a.stage]}")
    msg = message(a, where)
    if msg.src == msg.dst:
        raise ScheduleError(f"rank {r}: {a} would send between stages {msg.src_stage} and "
                            f"{msg.dst_stage}, both on rank {r}: they share the tensor in "
                            f"memory, with no message")
    side = 0 if a.kind in (SEND_F, SEND_B) else 1
    ends = found.setdefault(msg, [None, None])
    if ends[side] is not None:
        raise ScheduleError(f"rank {r}: {a} appears twice (positions {ends[side][1]} and "
                            f"{pos}): one message each")
    ends[side] = (r, pos)
    if side == 0:
        source = Action(a.stage, F, a.microbatch) if a.kind == SEND_F else \
            info.input_grad(a.stage, a.microbatch)
        if source not in seen:
            raise ScheduleError(f"rank {r}: {a} (position {pos}) sends what {source} makes, "
                                f"but {source} has not run before it on rank {r}")
    return msg


def _need(seen: set, recv: Action, a: Action, r: int, pos: int) -> None:
    if recv not in seen:
        raise ScheduleError(f"rank {r}: {a} (position {pos}) uses stage "
                            f"{recv.stage - 1 if recv.kind == RECV_F else recv.stage + 1}'s "
                            f"tensor from another rank, but no {recv} comes before it; "
                            f"lower the compute schedule with lower(actions)")


def check_deadlock(lowered: Schedule, info: ScheduleInfo) -> list[list]:
    """Run the lists on messages alone: ScheduleDeadlockError if every unfinished rank waits.
    Returns, per rank, each action's Message (None for a compute action)."""
    ends, msgs = _messages(lowered, info)
    at, sent = [0] * len(lowered), set()
    progress = True
    while progress:
        progress = False
        for r, row in enumerate(lowered):
            mine, k = msgs[r], at[r]
            while k < len(row):
                msg, kind = mine[k], row[k].kind
                if kind is RECV_F or kind is RECV_B:
                    if msg not in sent:
                        break
                elif msg is not None:
                    sent.add(msg)
                k += 1
            progress |= k > at[r]
            at[r] = k
    stuck = [r for r, row in enumerate(lowered) if at[r] < len(row)]
    if stuck:
        lines = []
        for r in stuck:
            a, msg = lowered[r][at[r]], msgs[r][at[r]]
            q, pos = ends[msg][0]
            lines.append(f"rank {r} waits at {a} (position {at[r]}) for {msg.send}, which "
                         f"rank {q} runs at position {pos} but is itself waiting at "
                         f"{lowered[q][at[q]]} (position {at[q]})")
        raise ScheduleDeadlockError("these lists deadlock, every unfinished rank waits on "
                                    "a receive:\n  " + "\n  ".join(lines))
    return msgs


def dry_run(lowered: Schedule, durations: Durations,
            p2p: Union[Real, Callable[[Message], Real]] = 0) -> DryRun:
    """Time lowered lists (lower(schedule(...))): durations per kind ("F", "B", "I", "W",
    and "F&B" for a pair taken as one block) as seconds or one per stage; p2p: seconds per
    message, or a function of the Message (its src and dst ranks name the link, its kind
    activations or gradients)."""
    block = PAIR in durations if isinstance(durations, Mapping) else False
    info, msgs, pairs, half, peak = _structure(lowered, block)
    table = _table(durations, {k for row in lowered for a in row if a.is_compute
                               for k in ((PAIR,) if block and isinstance(a, OverlapFB)
                                         else (b.kind for b in parts(a)))}, info.stages)
    cost = p2p if callable(p2p) else (lambda a: p2p)
    if not callable(p2p) and (not isinstance(p2p, Real) or isinstance(p2p, bool) or p2p < 0):
        raise ScheduleError(f"p2p is the seconds one message takes (a number >= 0, or a "
                            f"function of the Message), got {p2p!r}")
    P = len(lowered)
    clock = _Clock(P, cost)
    at = [0] * P
    while any(at[r] < len(lowered[r]) for r in range(P)):
        for r, row in enumerate(lowered):  # deadlock-free: some rank always moves on
            while at[r] < len(row):
                k = at[r]
                a, msg = row[k], msgs[r][k]
                if msg is None and k in pairs[r]:  # a pair, per half
                    recv, send = pairs[r][k]
                    t0 = clock.now[r]
                    clock.compute(r, table[F][a.forward.stage])
                    if send is not None:
                        clock.send(r, send, msgs[r][send], row[send])
                    if recv is not None:
                        clock.wait(r, recv, msgs[r][recv], row[recv])
                    clock.compute(r, table[a.backward.kind][a.backward.stage])
                    clock.spans[r][k] = Span(a, t0, clock.now[r])
                elif msg is None:  # compute
                    t = table[PAIR][a.forward.stage] if isinstance(a, OverlapFB) else \
                        table[a.kind][a.stage]
                    clock.spans[r][k] = Span(a, clock.now[r], clock.now[r] + t)
                    clock.compute(r, t)
                elif a.kind is SEND_F or a.kind is SEND_B:
                    if k not in half[r]:  # else posted by its pair's F half
                        clock.send(r, k, msg, a)
                else:
                    if msg not in clock.arrival:
                        break
                    if k not in half[r]:  # else waited by its pair's B half
                        clock.wait(r, k, msg, a)
                at[r] += 1
    now, stream, busy = clock.now, clock.stream, clock.busy
    spans = [[row[k] for k in sorted(row)] for row in clock.spans]
    finish = tuple(max(n, s) for n, s in zip(now, stream))
    makespan = max(finish)
    idle = tuple(makespan - b for b in busy)
    start = tuple(next(s.start for s in row if s.action.is_compute) for row in spans)
    period = max(f - s for f, s in zip(finish, start))
    return DryRun(makespan, tuple(busy), idle, finish,
                  _ratio(sum(idle), sum(busy)), _ratio(sum(idle), P * makespan),
                  tuple(peak),
                  tuple(Fraction(peak[r], len(info.stages_of(r))) for r in range(P)),
                  tuple(tuple(s) for s in spans), info, start, period,
                  _ratio(P * period - sum(busy), sum(busy)))


@by_content()  # read-only results: one shared by every caller
def _structure(lowered: Schedule, block: bool) -> tuple:
    """What a dry run needs of the lists alone, whatever the durations: (ScheduleInfo, each
    action's Message, each rank's (F; B) pairs, the positions a pair's half times, the peak
    in flight), the lists validated and checked for deadlock. A planner times one schedule
    under many durations (each layout of a search, each calibration), so it is memoized on
    the lists' contents, as the schedule checks are: an edited list is checked anew."""
    info = validate_schedule(lowered)
    msgs = check_deadlock(lowered, info)
    pairs = [{} if block else pair_overlap(row) for row in lowered]
    half = [{q: k for k, ends in rank.items() for q in ends if q is not None}
            for rank in pairs]  # position of a message timed by its pair's half -> the pair
    return info, msgs, pairs, half, peak_in_flight(lowered)


class _Clock:
    """Each rank's compute stream (now), p2p stream, busy seconds and spans by position;
    the arrival time of every message sent so far."""

    def __init__(self, P: int, cost: Callable[[Message], Real]):
        self.now, self.stream, self.busy = [0] * P, [0] * P, [0] * P
        self.spans: list[dict[int, Span]] = [{} for _ in range(P)]
        self.arrival: dict[Message, Real] = {}
        self.cost = cost

    def compute(self, r: int, t: Real) -> None:
        self.now[r] += t
        self.busy[r] += t

    def send(self, r: int, k: int, msg: Message, a: Action) -> None:
        start = max(self.now[r], self.stream[r])
        self.stream[r] = self.arrival[msg] = start + self.cost(msg)
        self.spans[r][k] = Span(a, start, self.stream[r])

    def wait(self, r: int, k: int, msg: Message, a: Action) -> None:
        end = max(self.now[r], self.arrival[msg])
        self.spans[r][k] = Span(a, self.now[r], end)
        self.now[r] = end


def peak_in_flight(actions: Schedule) -> list[int]:
    """Per rank, the most (stage, micro-batch) pairs with F done and B (or W) not yet: a
    full backward B releases its activations, a split one at its W (I still leaves them
    to W). A pair's F is counted before its B releases."""
    peaks = []
    for row in actions:
        held = peak = 0
        for item in row:
            for a in parts(item):
                held += a.kind == F
                peak = max(peak, held)
            held -= sum(a.kind == B or a.kind == W for a in parts(item))
        peaks.append(peak)
    return peaks
