"""A run's checkpoints, one directory per step; resuming from the last complete one.

    save_step(run, root)           -> root/step-00000004/, a sharded save after step 4
    latest(root)                   -> Latest(path, step, skipped): the newest complete save
    resume(run, root)              -> 4: that save loaded into run (any layout); its step

(Megatron-LM's iter_0000004 directories and latest_checkpointed_iteration.txt; torchtitan's
step-4 folders.) A save that was interrupted — a rank failed after writing its file, before
the index was written (runtime/faults.py's "save" point), or files of two saves mixed in
one directory — is never mistaken for a complete one: `latest` reads every candidate as a
load would (the index, written last; each rank's file, its save id, coordinate, arrays and
step) from the newest down, skips the ones that fail, and says why. No separate "latest"
file: a pointer written after the save could itself be the thing a crash leaves behind,
while the index of a directory exists only once every file of it does.

What a resumed run needs, and where it comes from:

    weights, masters, Adam's m, v      the checkpoint's full tensors, cut for this layout
    the optimizer step (Adam's t)      the checkpoint's step
    the dropout masks' generator       the checkpoint's dropout_generator state
    the data position                  the step: the batch of step n depends on (seed, n)
    the learning rate schedule         the step (a scheduler is a function of it)

Resuming with fewer data-parallel replicas keeps the global batch: each replica's share of
it grows, the data order is the same, and the run is the same computation, reduced in
another order (so it equals a run at the new layout from the same state bit for bit, and
the never-failed run at the old one to the reduction-order tolerance).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from ...files import CheckpointError
from ...runtime.collectives import barrier
from ...runtime.context import current
from .full_state import load_state, read
from .layout import rank_layout, unwrap
from .sharded import save_sharded

PathLike = Union[str, os.PathLike]
STEP_DIR = re.compile(r"step-(\d{8})")


def step_dir(root: PathLike, step: int) -> Path:
    """root/step-{step:08d}: where the save after `step` optimizer steps goes."""
    return Path(root) / f"step-{step:08d}"


def save_step(engine, root: PathLike, groups=None) -> Path:
    """Every rank of the world calls this after a step: a sharded save into
    root/step-NNNNNNNN, N the optimizer steps taken. Returns the directory.

    A directory of that step already there (the save a fault interrupted, met again by the
    resumed run) is first renamed step-NNNNNNNN.old-K by world rank 0, never written
    into: the new save's files do not mix with the old one's (nor does a smaller layout
    leave the old layout's extra files beside its own)."""
    e, groups = unwrap(engine, groups)
    d = step_dir(root, rank_layout(e, groups).state.step)
    ctx = current()
    if ctx.rank == 0 and d.exists():
        k = 1
        while d.with_name(f"{d.name}.old-{k}").exists():
            k += 1
        d.rename(d.with_name(f"{d.name}.old-{k}"))
    if ctx.world_size > 1:
        barrier(group=ctx.world)  # set aside before anyone writes
    save_sharded(engine, d, groups)
    return d


@dataclass(frozen=True)
class Latest:
    """The newest complete save under a root, and the newer ones that were not."""

    path: Path
    step: int
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (directory, why)


def saves(root: PathLike) -> list[tuple[int, Path]]:
    """(step, directory) of every step-NNNNNNNN directory under root, newest first."""
    r = Path(root)
    if not r.is_dir():
        raise CheckpointError(f"{r} is not a directory of checkpoints; pass the directory "
                              "the run saved into (its step-NNNNNNNN folders are inside)")
    found = [(int(m.group(1)), p) for p in r.iterdir()
             if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))]
    return sorted(found, reverse=True)


def why_incomplete(d: PathLike, step: Optional[int] = None) -> Optional[str]:
    """None if `d` is a complete sharded save (of `step` optimizer steps, when given),
    else why not: everything a load checks, read and checked."""
    try:
        _, meta = read(Path(d))
    except FileNotFoundError as e:
        return (f"{e.filename} is missing: the save did not finish (the index is written "
                "last, once every rank's file exists)")
    except CheckpointError as e:
        return str(e)
    if step is not None and meta["step"] != step:
        return (f"its index says step {meta['step']}, its name step {step}: it was moved "
                "or renamed")
    return None


def latest(root: PathLike) -> Latest:
    """The newest complete save under root; refused if there is none, naming each
    directory and why it is not one."""
    skipped: list[tuple[Path, str]] = []
    found = saves(root)
    for step, d in found:
        why = why_incomplete(d, step)
        if why is None:
            return Latest(d, step, skipped)
        skipped.append((d, why))
    listed = "".join(f"\n  {d.name}: {why}" for d, why in skipped)
    raise CheckpointError(f"{root} holds no complete checkpoint ({len(found)} step "
                          f"directories){listed or ''}; start the run afresh, without resuming")


def resume(engine, root: PathLike) -> Latest:
    """Load the newest complete save under root into `engine` (or parallelize's run), on
    every rank, at whatever layout this run has; returns it (its step: the steps taken)."""
    last = latest(root)
    sd, meta = read(last.path)
    load_state(engine, sd, meta, last.path)
    return last
