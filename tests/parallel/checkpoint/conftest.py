"""A training session on any (dp, pp, tp) layout that saves, fails, resumes: the `ckrun`
fixture, for the reshard and the fault + resume tests.

    layout = Layout(ParallelDims(dp_shard=2, pp=2, tp=2), zero=1, schedule="1f1b", m=2)
    got = ckrun.session(kit, cfg, layout, batches, save_root=root, faults=[Fault(5, 4, "1B1")])
    got.losses        per step, every rank's loss (a list per rank): compared exactly
    got.mean_losses   per step, the mean over the dp blocks (what one device would report)
    got.state         the full state at the end (every rank's, tp shards gathered)
    got.snapshot      (the full state, the dropout generator's state) after step `snapshot`

The data of step n is batches[n - 1] whatever the layout: a resumed session starts at the
step its checkpoint holds, so the data position is the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import pytest

import minipar as mp
from minipar.parallel import ParallelDims, ShardingStrategy, parallelize
from minipar.parallel import checkpoint as ck
from minipar.parallel.checkpoint.full_state import parameter_of
from minipar.runtime.collectives import all_gather
from minipar.runtime.faults import inject, step_begins

CLIP = 0.05  # clips every step of these runs: the norm over dp, tp and pp matters


@dataclass(frozen=True)
class Layout:
    dims: ParallelDims
    zero: Union[int, ShardingStrategy] = 0  # a ZeRO stage, or an FSDP strategy
    schedule: Optional[str] = None  # None: no pipeline (pp must be 1)
    m: int = 2
    sp: bool = False
    cp_method: str = "ring"  # under context parallelism (dims.cp > 1)

    def kwargs(self) -> dict:
        engine = "sharding_strategy" if isinstance(self.zero, ShardingStrategy) else "zero"
        kw: dict = {engine: self.zero, "sequence_parallel": self.sp}
        if self.dims.cp > 1:
            kw.update(cp_method=self.cp_method, placement="any")
        if self.schedule is not None:
            kw.update(schedule=self.schedule, microbatches=self.m)
        return kw

    def __str__(self) -> str:
        d = self.dims
        engine = getattr(self.zero, "name", f"zero {self.zero}")
        cp = f", cp {d.cp} {self.cp_method}" if d.cp > 1 else ""
        return (f"(dp {d.dp}, pp {d.pp}, tp {d.tp}{cp}) {engine} "
                f"{self.schedule or 'no pipeline'}{' SP' if self.sp else ''}")


@dataclass
class Session:
    losses: list  # per rank: its loss per step
    mean_losses: np.ndarray
    state: dict
    snapshot: Optional[tuple[dict, Any]]
    resumed: Optional[ck.Latest] = None
    saved: list = field(default_factory=list)


def gathered(run) -> dict:
    """This rank's full_state_dict with its tp shards all-gathered (a collective)."""
    sd, params = run.engine.full_state_dict(), run.model.named_parameters()
    for key in list(sd):
        p = params.get(parameter_of(key))
        if p is not None and getattr(p, "partition_count", 1) > 1:
            sd[key] = all_gather(sd[key], axis=p.partition_dim, group=run.groups.tp)
    return sd


def session(kit, cfg, layout: Layout, batches, *, steps: Optional[int] = None,
            resume_from=None, load_dir=None, from_memory=None, resave_to=None,
            save_root=None, save_every: int = 1, snapshot: Optional[int] = None,
            faults=()) -> Session:
    """On every rank of `layout`: resume (from the newest complete save under resume_from,
    a save directory load_dir, or a (full state, generator state) from_memory), save
    again at once if asked, then train steps start+1 .. `steps` (default: every batch),
    saving under save_root every `save_every` steps; `faults` planted."""
    steps = len(batches) if steps is None else steps

    def program(ctx):
        run = parallelize(cfg, layout.dims, max_grad_norm=CLIP, **layout.kwargs(), **kit.OPT)
        resumed = ck.resume(run, resume_from) if resume_from is not None else None
        if load_dir is not None:
            ck.load(run, load_dir)
        if from_memory is not None:  # the tensors cut by load_state; the generator by hand
            ck.load_state(run, from_memory[0])
            run.model.dropout_generator.bit_generator.state = from_memory[1]
        if resave_to is not None:
            ck.save_sharded(run, resave_to)
        start, losses, snap, saved = run.engine.steps, [], None, []
        for n in range(start + 1, steps + 1):
            step_begins(n)
            losses.append(run.train_step(*batches[n - 1]))
            if save_root is not None and n % save_every == 0:
                saved.append(ck.save_step(run, save_root))
            if n == snapshot:
                snap = (gathered(run), run.model.dropout_generator.bit_generator.state)
        where = run.groups.coordinate
        return (losses, gathered(run), snap, where["pp"] == where["tp"] == 0, resumed, saved)

    res = mp.launch(inject(program, *faults), layout.dims.world_size)
    state = {k: a for r in res for k, a in r[1].items()}  # the union over the stages
    snap = None if snapshot is None else (
        {k: a for r in res for k, a in r[2][0].items()}, res[0][2][1])
    return Session([r[0] for r in res], np.mean([r[0] for r in res if r[3]], axis=0), state,
                   snap, res[0][4], res[0][5])


@pytest.fixture(scope="session")
def ckrun():
    import types
    return types.SimpleNamespace(session=session, Layout=Layout, CLIP=CLIP)
