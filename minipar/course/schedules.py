"""A learner's pipeline schedule, read before any check runs on it: one list of Actions per
rank, rank r running only stage r's compute actions of the kinds the exercise asks for.

    read_schedule(got, p, what="one_f_one_b(4, 8)", kinds=(F, B), rule="...")

A schedule generator's answer fails here, in the learner's terms, before the validator
(parallel/pp/validate.py) sees it: the wrong container, a rank list missing, an object
that is not an Action, another rank's stage, or a kind the exercise does not use.
"""

from __future__ import annotations

from typing import Iterable

from ..parallel.pp import Action, Kind
from .expect import GradeFailure


def read_schedule(got, p: int, *, what: str, kinds: Iterable[Kind],
                  rule: str) -> list[list[Action]]:
    """`got` as p lists of Actions (copies), or GradeFailure naming what is off.

    what: how the learner's call reads (`one_f_one_b(4, 8)`); kinds: the kinds rank r may
    run on stage r; rule: the sentence that says so, shown when an action breaks it."""
    kinds = tuple(kinds)
    if not isinstance(got, (list, tuple)) or len(got) != p:
        raise GradeFailure(f"{what} returned {got!r:.80}, expected a list of p = {p} lists "
                           f"of Actions, one per rank")
    for r, row in enumerate(got):
        if not isinstance(row, (list, tuple)) or not all(isinstance(a, Action) for a in row):
            raise GradeFailure(f"{what}: rank {r}'s list is {row!r:.80}, expected Actions "
                               f"such as Action({r}, F, 0)")
        for a in row:
            if a.stage != r or a.kind not in kinds:
                raise GradeFailure(f"{what}: rank {r} runs {a}; {rule.format(r=r)}")
    return [list(row) for row in got]
