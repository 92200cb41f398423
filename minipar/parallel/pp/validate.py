"""The validator: the rules every pipeline schedule obeys, checked on any list of lists.

With S stages and m micro-batches (read from the actions, or given):
    once      every (stage s, micro-batch i) has one F, and one B or else one I and one W
              (each (s, i) chooses: DualPipeV runs some backwards whole, some split)
    placed    each stage's compute actions are on one rank; every rank holds a stage
    own F     on a rank, sB i (or sI i) comes after sF i, and sW i after sI i
    forward   sF i needs (s-1)F i: the forward of stage s follows that of stage s - 1
    backward  sB i (sI i) needs the input gradient of (s+1) for i: (s+1)B i or (s+1)I i,
              whichever stage s + 1 runs: gradients flow from the last stage
An overlapped pair (F; B) is one item of its rank's list: it starts once both its
actions' inputs are done, and both are done when it ends.
A rank runs its list in order, so the last two rules across ranks ask for more than a
position: that some interleaving of the ranks' lists meets every dependency. The validator
runs the lists against the dependencies alone (no clock): a rank moves on while its next
action's inputs are done; if every unfinished rank waits, the schedule can never run and
the error names each rank, the action it waits at, what it waits for and the rule.
Communication actions, if present (a lowered schedule), are skipped here; dry_run.py checks
them. Returns ScheduleInfo: stages, micro-batches, placement, per-rank counts and which
(stage, micro-batch) backwards are split.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Collection, Optional, Union

from .actions import (OVERLAP_F_B, B, F, I, W, Action, Schedule, ScheduleError, by_content,
                      parts, placement)


class ScheduleDeadlockError(ScheduleError):
    """Every unfinished rank waits on an action no rank can reach: the schedule never ends."""


@dataclass(frozen=True)
class ScheduleInfo:
    """What a valid schedule is made of, as the runner and the dry run need it."""

    stages: int                            # S
    microbatches: int                      # m
    placement: dict                        # stage -> rank
    counts: tuple                          # per rank: {"F": n, "B": n, ...} compute actions
    split_backward: bool                   # True when some backward is I + W, not B
    split: frozenset = frozenset()         # the (stage, micro-batch) whose backward is I + W

    def input_grad(self, stage: int, microbatch: int) -> Action:
        """The action that makes the gradient of `stage`'s input: its I, or else its B."""
        return Action(stage, I if (stage, microbatch) in self.split else B, microbatch)

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in self.placement.items() if r == rank]


RULES = {
    "forward": "the forward of stage s follows the forward of stage s - 1",
    "backward": "the backward of stage s follows the backward of stage s + 1",
    "own F": "a backward needs its own forward's activations",
    "own I": "W (weight gradients) follows I (input gradients) of the same micro-batch",
}


def dependencies(a: Action, stages: int,
                 split: Union[bool, Collection]) -> list[tuple[Action, str]]:
    """The compute actions `a` needs done first, each with the rule that asks for it.
    split: True (every backward is I + W), False (none) or the (stage, micro-batch) pairs
    whose backward is split."""
    s, i = a.stage, a.microbatch
    is_split = split if isinstance(split, bool) else (s + 1, i) in split
    grad = I if is_split else B
    if a.kind == F:
        return [(Action(s - 1, F, i), "forward")] if s > 0 else []
    if a.kind in (B, I):
        needs = [(Action(s, F, i), "own F")]
        return needs + ([(Action(s + 1, grad, i), "backward")] if s + 1 < stages else [])
    return [(Action(s, I, i), "own I")]  # W


@by_content()  # ScheduleInfo is frozen: one shared by every caller
def validate_schedule(actions: Schedule, microbatches: Optional[int] = None,
                      stages: Optional[int] = None) -> ScheduleInfo:
    """Check `actions` (one list per rank) against every rule; ScheduleError if one breaks."""
    if not isinstance(actions, (list, tuple)) or not actions:
        raise ScheduleError(f"a schedule is a non-empty list with one list of actions per "
                            f"rank, got {actions!r}")
    where = placement(actions)
    compute = [[a for a in row if a.is_compute] for row in actions]
    flat = [[x for a in row for x in parts(a)] for row in compute]
    if not where:
        raise ScheduleError("the schedule has no compute action (F, B, I, W) on any rank")
    S = max(where) + 1 if stages is None else stages
    m = 1 + max(a.microbatch for row in flat for a in row) if microbatches is None \
        else microbatches
    for rank, row in enumerate(flat):
        if not row:
            raise ScheduleError(f"rank {rank} runs no compute action: every pipeline rank "
                                f"holds at least one stage")
        for a in row:
            if a.stage >= S or a.microbatch >= m:
                raise ScheduleError(f"rank {rank}: {a} is outside the schedule's {S} stages "
                                    f"x {m} micro-batches")
    missing = [s for s in range(S) if s not in where]
    if missing:
        raise ScheduleError(f"stage {missing[0]} appears on no rank: stages 0..{S - 1} each "
                            f"need a rank")
    split = _check_once(compute, S, m, where)
    _check_own_order(compute)
    _check_runnable(compute, S, split)
    counts = tuple(dict(sorted(Counter(a.kind.value for a in row).items()))
                   for row in flat)
    for count, row in zip(counts, compute):
        pairs = sum(a.kind == OVERLAP_F_B for a in row)
        if pairs:
            count[OVERLAP_F_B] = pairs
    return ScheduleInfo(S, m, where, counts, bool(split), split)


def _check_once(compute: Schedule, S: int, m: int, where: dict) -> frozenset:
    """Every (stage, micro-batch) computed once per kind, with B, or I and W, never both.
    Returns the (stage, micro-batch) pairs whose backward is split."""
    seen: dict[Action, tuple[int, int]] = {}
    for rank, row in enumerate(compute):
        for pos, item in enumerate(row):
            for a in parts(item):
                if a in seen:
                    raise ScheduleError(
                        f"rank {rank}: {a} appears twice (compute positions {seen[a][1]} "
                        f"and {pos}): every (stage, micro-batch) is computed once per kind")
                seen[a] = (rank, pos)
    split = frozenset((a.stage, a.microbatch) for a in seen if a.kind in (I, W))
    for s in range(S):
        for i in range(m):
            backward = (I, W) if (s, i) in split else (B,)
            for kind in (F,) + backward:
                if Action(s, kind, i) not in seen:
                    other = ("" if kind == F else f", or {Action(s, B, i)} alone"
                             if kind != B else f", or {Action(s, I, i)} and {Action(s, W, i)}")
                    raise ScheduleError(
                        f"rank {where[s]} never runs {Action(s, kind, i)}: every (stage, "
                        f"micro-batch) is computed once per kind (F, and B, or I and W)"
                        f"; write {Action(s, kind, i)}{other}")
            if (s, i) in split and Action(s, B, i) in seen:
                rank, _ = seen[Action(s, B, i)]
                raise ScheduleError(
                    f"rank {rank}: {Action(s, B, i)} runs a full backward of micro-batch {i} "
                    f"on stage {s}, which its I or W also computes: one of "
                    f"{Action(s, B, i)}, or {Action(s, I, i)} and {Action(s, W, i)}")
    return split


def _check_own_order(compute: Schedule) -> None:
    """On a rank: sB i / sI i after sF i, sW i after sI i (a pair's actions share its place)."""
    for rank, row in enumerate(compute):
        position = {a: p for p, item in enumerate(row) for a in parts(item)}
        for a in position:
            before = {B: F, I: F, W: I}.get(a.kind)
            need = Action(a.stage, before, a.microbatch) if before else None
            if need is not None and position[need] >= position[a]:
                rule = RULES["own F" if before == F else "own I"]
                raise ScheduleError(
                    f"rank {rank}: {a} (compute position {position[a]}) comes before {need} "
                    f"(position {position[need]}): {rule}")


def _check_runnable(compute: Schedule, S: int, split: frozenset) -> None:
    """Run the lists against their dependencies; ScheduleDeadlockError if every rank waits."""
    rank_of = {a: r for r, row in enumerate(compute) for item in row for a in parts(item)}
    at = [0] * len(compute)
    done: set[Action] = set()

    def waiting(item) -> list[tuple[Action, str]]:
        inside = parts(item)
        return [(d, why) for a in inside for d, why in dependencies(a, S, split)
                if d not in done and d not in inside]

    progress = True
    while progress:
        progress = False
        for r, row in enumerate(compute):
            while at[r] < len(row) and not waiting(row[at[r]]):
                done.update(parts(row[at[r]]))
                at[r] += 1
                progress = True
    stuck = [r for r, row in enumerate(compute) if at[r] < len(row)]
    if not stuck:
        return
    lines = []
    for r in stuck:
        a = compute[r][at[r]]
        dep, rule = waiting(a)[0]
        q = rank_of[dep]
        waits = (f"which rank {q} would run only later in its own list" if q == r else
                 f"which rank {q} has not reached: it waits at {compute[q][at[q]]}")
        lines.append(f"rank {r} waits at {a} (compute position {at[r]}) for {dep} "
                     f"({RULES[rule]}), {waits}")
    raise ScheduleDeadlockError("the schedule can never finish, every unfinished rank waits:\n  "
                                + "\n  ".join(lines))
