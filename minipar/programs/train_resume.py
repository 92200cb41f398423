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

    def check(self, steps: int) -> Optional[ck.Latest]:
        """Before any rank starts: the save a resume will load (None: no resume), refused
        (CheckpointError) if there is none or it leaves nothing of `steps` to train."""
        if self.resume is None:
            return None
        last = ck.latest(self.resume)
        if last.step >= steps:
            raise CheckpointError(f"its newest complete checkpoint is at step {last.step}, "
                                  f"and a run of {steps} steps leaves nothing to train; "
                                  f"give more than {last.step} steps")
        return last


def parse_fault(text: str) -> Fault:
    """"RANK:STEP" or "RANK:STEP:POINT" (POINT: step, save, or an action such as 2F1)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        rank, step = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"--fail-at takes RANK:STEP or RANK:STEP:POINT (POINT: step, save, "
                         f"or a pipeline action such as 2F1; steps count from 1), got "
                         f"{text!r}") from None
    return Fault(rank, step, parts[2] if len(parts) == 3 else "step")  # its own checks


def recovery_from_args(args, cfg) -> Recovery:
    """--checkpoint-dir, --save-every, --resume, --fail-at -> a Recovery, checked before
    any rank starts (usage errors, exit status 2, in flag names): a fault's rank in the
    world, a --resume directory holding a complete save short of --steps."""
    faults = []
    for text in args.fail_at:
        try:
            faults.append(parse_fault(text))
        except ValueError as e:
            args.parser.error(str(e))
        if faults[-1].rank >= cfg.world_size or faults[-1].step > cfg.steps:
            args.parser.error(f"--fail-at {text}: the run has ranks 0..{cfg.world_size - 1} "
                              f"and steps 1..{cfg.steps}")
    if cfg.ep > 1 and (args.checkpoint_dir or args.resume):
        args.parser.error(f"--checkpoint-dir/--resume with --ep {cfg.ep}: checkpoints of "
                          f"experts spread over ranks are not written yet; use --ep 1")
    rec = Recovery(Path(args.checkpoint_dir) if args.checkpoint_dir else None,
                   args.save_every, Path(args.resume) if args.resume else None, tuple(faults))
    try:
        rec.check(cfg.steps)
    except CheckpointError as e:
        args.parser.error(f"--resume {args.resume}: "
                          + str(e).replace(f"a run of {cfg.steps} steps", f"--steps {cfg.steps}"))
    return rec


def resume_note(recovery: Recovery) -> str:
    """The lines printed before a resumed run: which save, and the newer ones skipped."""
    if recovery.resume is None:
        return ""
    last = ck.latest(recovery.resume)
    lines = [f"minipar train: skipped {d}: {why}\n" for d, why in last.skipped]
    return "".join(lines) + (f"minipar train: resuming from {last.path} (step {last.step}); "
                             f"steps {last.step + 1}.. follow\n")


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


def failure_report(err: Union[RankFailedError, CheckpointError], recovery: Recovery) -> str:
    """What `minipar train` prints when a rank failed: the rank, its traceback, and where
    the run can go on from (or why the checkpoint could not be loaded)."""
    if isinstance(err, CheckpointError):
        return f"minipar train: cannot resume from {recovery.resume}: {err}"
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
