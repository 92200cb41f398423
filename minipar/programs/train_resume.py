"""`minipar train --checkpoint-dir DIR --save-every N`, `--fail-at RANK:STEP[:POINT]` and
`--resume DIR`: a run that saves, loses a rank, and comes back.

    minipar train --dp 2 --pp 2 --tp 2 --micro-batches 2 --steps 6 --checkpoint-dir ck \\
                  --fail-at 5:4:1B1        # rank 5 fails at action 1B1 of step 4
    minipar train --dp 2 --pp 2 --tp 2 --micro-batches 2 --steps 6 --resume ck
    minipar train --dp 1 --pp 2 --tp 2 --micro-batches 2 --steps 6 --resume ck  # one replica

On every rank of the run (train_parallel.py calls these):

    start = resume_at(run, scheduler, recovery)   # the newest complete save: its step
    for step in range(start, steps):
        step_begins(step + 1)                     # a planned fault at "step" fires here
        ...                                       # the step
        save_if_due(run, step + 1, recovery)      # DIR/step-0000000n every N steps

What comes back from the checkpoint (parallel/checkpoint/steps.py): the weights, float32
masters, Adam's m and v and its step, cut for this run's layout; the learning-rate
schedule is set to the step, and the data of step n is a function of (seed, n), so the
continued run trains on the batches the uninterrupted one would. At the same layout it is
that run, bit for bit; with fewer data-parallel replicas the global batch stays, each
replica's share of it grows, and only the order of the reductions differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..files import CheckpointError
from ..parallel import checkpoint as ck
from ..runtime.errors import RankFailedError
from ..runtime.faults import Fault, InjectedFault

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Recovery:
    """Where a run saves (every `save_every` steps), where it resumes from, what fails."""

    checkpoint_dir: Optional[Path] = None
    save_every: int = 1
    resume: Optional[Path] = None
    faults: tuple[Fault, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.checkpoint_dir or self.resume or self.faults)

    @property
    def save_dir(self) -> Optional[Path]:
        """Where saves go: --checkpoint-dir, else the directory resumed from."""
        return self.checkpoint_dir or self.resume


def parse_fault(text: str) -> Fault:
    """"RANK:STEP" or "RANK:STEP:POINT" (POINT: step, save, or an action such as 2F1)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return Fault(int(parts[0]), int(parts[1]), parts[2] if len(parts) == 3 else "step")
    except ValueError:
        raise ValueError(f"--fail-at takes RANK:STEP or RANK:STEP:POINT (POINT: step, save, "
                         f"or a pipeline action such as 2F1; steps count from 1), got "
                         f"{text!r}") from None


def check_resumable(root: PathLike) -> ck.Latest:
    """The save a --resume would load, checked before any rank starts (a usage error
    otherwise): the newest complete one under root."""
    return ck.latest(root)


def resume_at(run, scheduler, recovery: Optional[Recovery]) -> int:
    """Load the newest complete save under recovery.resume into `run` (every rank), set
    the learning-rate schedule to its step; the step to continue from (0: a fresh run)."""
    if recovery is None or recovery.resume is None:
        return 0
    step = ck.resume(run, recovery.resume).step
    scheduler.load_state_dict({"last_step": step})
    return step


def save_if_due(run, step: int, recovery: Optional[Recovery]) -> None:
    """After step `step` (from 1): a sharded save into save_dir/step-NNNNNNNN if due."""
    if recovery is not None and recovery.save_dir is not None and \
            step % recovery.save_every == 0:
        ck.save_step(run, recovery.save_dir)


def failure_report(err: RankFailedError, recovery: Recovery) -> str:
    """What `minipar train` prints when a rank failed: the rank, its traceback, and where
    the run can go on from."""
    what = "an injected fault" if isinstance(err.original, InjectedFault) else "an error"
    lines = [f"minipar train: rank {err.rank} failed ({what}); the run stopped on every "
             f"rank.", str(err)]
    root = recovery.save_dir
    if root is None:
        lines.append("no checkpoints were saved (--checkpoint-dir DIR saves them)")
        return "\n".join(lines)
    try:
        last = ck.latest(root)
    except CheckpointError as e:
        lines.append(f"nothing to resume from: {e}")
        return "\n".join(lines)
    for d, why in last.skipped:
        lines.append(f"skipped {d.name}: {why}")
    lines.append(f"last complete checkpoint: {last.path} (step {last.step}); continue with "
                 f"--resume {root} (the same layout, or fewer --dp replicas)")
    return "\n".join(lines)
