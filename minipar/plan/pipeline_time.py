"""The pipeline's part of a step: the real schedule, run by the dry run on the per-stage
durations the planner computed, at full scale.

    run = pipeline_dry_run("interleaved_1f1b", pp=8, microbatches=64, chunks=3,
                           durations={"F": [...24 stages], "B": [...], ...}, p2p=seconds)

The schedule is minipar.parallel.pp's own (schedules.py, zero_bubble.py, dualpipe.py: plain
data, which the planner may import), lowered with its sends and receives (lowering.py) and
timed by its dry run (dry_run.py): compute serial on each rank, each receive waiting for
its message, a message taking p2p(message) seconds on the p2p stream. So the bubble is
the schedule's own, with unequal stages (the first holds the embedding, the last the
logits and the loss) and the p2p time included: nothing is assumed about its shape.

The analytical figures, for equal stages and no p2p (tested equal to the dry run):

    GPipe, 1F1B                 bubble / ideal = (p - 1) / m
    interleaved 1F1B, v chunks  bubble / ideal = (p - 1) / (v m)      (m a multiple of p)
    ZB-H1 (t_F = t_I = t_W)     bubble / ideal = (p - 1) / (3 m)      (m >= p)

where ideal = m (t_F + t_B) a rank and bubble = makespan - ideal (Narayanan et al. 2021,
section 2.2; Qi et al. 2023, section 3 for ZB-H1).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Callable, Mapping, Sequence, Union

from ..parallel.pp.dry_run import DryRun, dry_run
from ..parallel.pp.lowering import Message, lower
from ..parallel.pp.schedules import schedule


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers of each of `stages` stages: layers // stages each, one more on the first
    layers % stages (Megatron asks for an even split; an uneven model still runs)."""
    if stages > layers:
        raise ValueError(f"{layers} layers cannot fill {stages} pipeline stages (pp x chunks): "
                         f"use fewer stages")
    q, r = divmod(layers, stages)
    return [q + (1 if i < r else 0) for i in range(stages)]


@lru_cache(maxsize=64)  # a search times some 30 distinct schedules, several times each
def _lowered(name: str, pp: int, microbatches: int, chunks: int):
    return lower(schedule(name, pp, microbatches, chunks))


def pipeline_dry_run(name: str, pp: int, microbatches: int, chunks: int,
                     durations: Mapping[str, Sequence[float]],
                     p2p: Union[float, Callable[[Message], float]] = 0) -> DryRun:
    """Schedule `name` for pp ranks, m micro-batches and `chunks` stages a rank, lowered and
    run by the dry run with `durations` ("F", "B", and "I", "W" for a split backward: one
    value per stage) and p2p seconds per message (or a function of the Message)."""
    return dry_run(_lowered(name, pp, microbatches, chunks), durations, p2p)


def analytic_bubble(name: str, pp: int, microbatches: int, chunks: int = 1) -> Fraction:
    """bubble / ideal for equal stages and no p2p (module docstring): (p - 1)/(v m) for
    GPipe, 1F1B and interleaved 1F1B; (p - 1)/(3m) for ZB-H1 at t_F = t_I = t_W."""
    p, m, v = pp, microbatches, chunks
    if name in ("gpipe", "1f1b", "interleaved_1f1b"):
        return Fraction(p - 1, v * m)
    if name == "zb_h1":
        return Fraction(p - 1, 3 * m)
    raise ValueError(f"no closed form here for {name!r}: its bubble is the dry run's")
