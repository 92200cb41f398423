"""An action of a pipeline schedule: (stage, kind, micro-batch), written `2F0`.

torch.distributed.pipelining's notation (its `_Action`, read so a learner can hold the two
side by side): the stage index, the kind, the micro-batch index, with nothing between.

    2F0        stage 2 runs the forward of micro-batch 0
    2B0        stage 2 runs the full backward of micro-batch 0 (input and weight gradients)
    2I0, 2W0   the backward split in two (zero-bubble schedules): I computes the gradient
               of the stage's input (what stage 1 waits for), W the weights' gradients
    2SEND_F0   stage 2 sends micro-batch 0's output activations to stage 3
    3RECV_F0   stage 3 receives them: the input of 3F0
    3SEND_B0   stage 3 sends the gradient of its input for micro-batch 0 to stage 2
    2RECV_B0   stage 2 receives it: the output gradient 2B0 (or 2I0) starts from
    (0F7;7B3)OVERLAP_F_B   one overlapped pair (DualPipe): stage 0's forward of micro-batch
               7 and stage 7's backward of micro-batch 3 run at once, each one's
               communication hidden behind the other's compute; torch's spelling

A schedule is one ordered list of actions per pipeline rank, `list[list[Action]]`; the
compute actions (F, B, I, W, and OverlapFB pairs of an F and a B or I) are what a
schedule generator writes, and the four communication kinds are added by one lowering
step (lowering.py), never by hand. An Action stays the 3-tuple (stage, kind, micro-batch);
a pair is its own 2-tuple (forward, backward) of Actions, and `parts(a)` gives the Actions
any compute item stands for, so code that counts or checks actions reads through pairs.
"""

from __future__ import annotations

import functools
import re
from collections import namedtuple
from enum import Enum
from typing import Callable, Iterable, Optional, Union


class ScheduleError(ValueError):
    """A schedule, an action or an argument that cannot be run: the message says why."""


class Kind(str, Enum):
    """What an action does; the value is torch's spelling."""

    F = "F"            # forward
    B = "B"            # full backward: input and weight gradients
    I = "I"            # backward for the input only   # noqa: E741 (torch's name)
    W = "W"            # backward for the weights only
    SEND_F = "SEND_F"  # send this stage's output activations to stage + 1
    RECV_F = "RECV_F"  # receive this stage's input activations from stage - 1
    SEND_B = "SEND_B"  # send the gradient of this stage's input to stage - 1
    RECV_B = "RECV_B"  # receive the gradient of this stage's output from stage + 1


F, B, I, W = Kind.F, Kind.B, Kind.I, Kind.W  # noqa: E741
SEND_F, RECV_F, SEND_B, RECV_B = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B
COMPUTE = (F, B, I, W)
COMMUNICATION = (SEND_F, RECV_F, SEND_B, RECV_B)

_KINDS = "|".join(sorted((k.value for k in Kind), key=len, reverse=True))
_PATTERN = re.compile(rf"(\d+)({_KINDS})(\d+)")


class Action(namedtuple("Action", "stage kind microbatch")):
    """One step of one rank: `stage` runs `kind` on `microbatch`. str() gives `2F0`.

    A named tuple, as torch's `_Action` is: cheap to build, hash and compare by the hundred
    thousand (a 64-stage dry run holds that many)."""

    __slots__ = ()

    def __new__(cls, stage: int, kind, microbatch: int) -> "Action":
        if not (type(stage) is int and type(microbatch) is int and stage >= 0
                and microbatch >= 0 and type(kind) is Kind):
            kind = _checked(stage, kind, microbatch)
        return super().__new__(cls, stage, kind, microbatch)

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @property
    def is_communication(self) -> bool:
        return self.kind in COMMUNICATION

    @staticmethod
    def parse(text: str) -> "Action":
        """The action `text` spells: Action.parse("2SEND_F0") == Action(2, SEND_F, 0)."""
        match = _PATTERN.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ScheduleError(
                f"cannot read {text!r} as an action: write stage, kind, micro-batch with "
                f"nothing between, e.g. 2F0 or 3RECV_B1 (kinds: "
                f"{', '.join(k.value for k in Kind)})")
        stage, kind, microbatch = match.groups()
        return Action(int(stage), Kind(kind), int(microbatch))


def _checked(stage, kind, microbatch) -> Kind:
    """The kind as a Kind, once stage and micro-batch are shown to be integers >= 0."""
    for what, value in (("stage", stage), ("microbatch", microbatch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScheduleError(f"Action {what} must be an integer >= 0, got {value!r}")
    try:
        return Kind(kind)
    except ValueError:
        raise ScheduleError(f"Action kind must be one of {', '.join(k.value for k in Kind)}; "
                            f"got {kind!r}") from None


OVERLAP_F_B = "OVERLAP_F_B"  # torch's name of the pair's kind (_ComputationType.OVERLAP_F_B)
_PAIR = re.compile(r"\((\S+?);(\S+?)\)" + OVERLAP_F_B)


class OverlapFB(namedtuple("OverlapFB", "forward backward")):
    """An overlapped forward-and-backward pair on one rank (DeepSeek-V3's DualPipe): the F
    of one chunk and the B (or I) of another run together, as one item of the rank's list:
    the F half, then the B half, each one's message overlapping the other's compute, or
    one block of t_F&B <= t_F + t_B in the dry run. str() is torch's: `(0F7;7B3)OVERLAP_F_B`."""

    __slots__ = ()
    kind = OVERLAP_F_B
    is_compute, is_communication = True, False

    def __new__(cls, forward: Action, backward: Action) -> "OverlapFB":
        if not (isinstance(forward, Action) and forward.kind == Kind.F and
                isinstance(backward, Action) and backward.kind in (Kind.B, Kind.I)):
            raise ScheduleError(f"an overlapped pair is (a forward, a backward): OverlapFB("
                                f"Action(s, F, i), Action(t, B or I, j)), got "
                                f"({forward!r}, {backward!r})")
        if (forward.stage, forward.microbatch) == (backward.stage, backward.microbatch):
            raise ScheduleError(f"({forward};{backward}) pairs a backward with its own "
                                f"forward, which it must wait for: pair it with another "
                                f"stage's or micro-batch's forward")
        return super().__new__(cls, forward, backward)

    def __str__(self) -> str:
        return f"({self.forward};{self.backward}){OVERLAP_F_B}"

    def __repr__(self) -> str:
        return f"OverlapFB({str(self)!r})"


Item = Union[Action, OverlapFB]


def parts(a: Item) -> tuple:
    """The Actions a list item stands for: (a,) for an Action, (F, B) for a pair."""
    return (a.forward, a.backward) if isinstance(a, OverlapFB) else (a,)


def parse_action(text: str) -> Item:
    """An Action (`2F0`, `3RECV_B1`) or an overlapped pair (`(0F7;7B3)OVERLAP_F_B`)."""
    match = _PAIR.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        return Action.parse(text)
    return OverlapFB(Action.parse(match.group(1)), Action.parse(match.group(2)))


Schedule = list[list[Item]]  # one ordered list of actions per pipeline rank


def parse_schedule(text: Union[str, Iterable[str]]) -> Schedule:
    """One rank per line, actions separated by spaces; a `rank N:` prefix is allowed.

    parse_schedule('''rank 0: 0F0 0B0
                      rank 1: 1F0 1B0''') == [[Action(0, F, 0), ...], [...]]
    """
    lines = text.splitlines() if isinstance(text, str) else list(text)
    ranks = []
    for line in lines:
        body = re.sub(r"^\s*rank\s+\d+\s*:", "", line).strip()
        if body or re.match(r"^\s*rank\s+\d+\s*:", line):
            ranks.append([parse_action(word) for word in body.split()])
    return ranks


def format_schedule(actions: Schedule) -> str:
    """The inverse of parse_schedule: `rank 0: 0F0 0F1 0B0 0B1`, one line per rank."""
    return "\n".join(f"rank {r}: " + " ".join(map(str, row)) for r, row in enumerate(actions))


def content_key(actions) -> Optional[tuple]:
    """The schedule as a hashable tuple of tuples, or None when it is not one (the checks
    then run on it as given, and name what is wrong; a hashable item that is no action is
    refused by the check itself, never cached)."""
    if not isinstance(actions, (list, tuple)) or \
            not all(isinstance(row, (list, tuple)) for row in actions):
        return None
    key = tuple(tuple(row) for row in actions)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def by_content(copy: Callable = lambda x: x):
    """Memoize fn(actions, ...) on the schedule's content: a schedule is plain data, and
    its checks are pure functions of it, so the thousands of ranks of one pipeline layout
    (every dp replica runs the same lists) check it once. `copy` hands each caller its own
    copy of a mutable result. Failures are not cached: a bad schedule raises every time."""

    def decorate(fn):
        cached = functools.lru_cache(maxsize=128)(fn)

        @functools.wraps(fn)
        def wrapper(actions, *args, **kwargs):
            key = content_key(actions)
            if key is None:
                return fn(actions, *args, **kwargs)
            return copy(cached(key, *args, **kwargs))

        return wrapper

    return decorate


@by_content(copy=dict)
def placement(actions: Schedule) -> dict[int, int]:
    """stage -> the rank whose list runs its compute actions (stages in order).

    Raises ScheduleError if one stage's compute actions are on two ranks (a pair's two
    actions both count: its stages live on its rank)."""
    where: dict[int, tuple[int, Action]] = {}
    for rank, row in enumerate(actions):
        if not isinstance(row, (list, tuple)):
            raise ScheduleError(f"rank {rank}'s actions are {row!r}: give a list of Actions "
                                f"(parse_schedule reads them from text)")
        for item in row:
            if not isinstance(item, (Action, OverlapFB)):
                raise ScheduleError(f"rank {rank}: {item!r} is not an Action; build one with "
                                    f"Action(stage, kind, microbatch) or Action.parse('2F0')")
            for a in parts(item) if item.is_compute else ():
                _place(where, rank, a)
    return {s: where[s][0] for s in sorted(where)}


def _place(where: dict, rank: int, a: Action) -> None:
    seen = where.setdefault(a.stage, (rank, a))
    if seen[0] != rank:
        raise ScheduleError(
            f"rank {rank}: {a} puts stage {a.stage} on rank {rank}, but rank "
            f"{seen[0]} already runs {seen[1]}: every stage lives on one rank")
