"""Fault injection: a chosen rank fails at a chosen step, at a chosen point of it.

    program = inject(train, Fault(rank=3, step=2, at="2F1"))  # rank 3, step 2, action 2F1
    mp.launch(program, 8)   # -> RankFailedError: rank 3 raised InjectedFault ... + its traceback

A cluster loses a GPU in the middle of a step (an ECC error, a fallen link, a killed
process), and the job must end, not hang: NCCL's watchdog aborts the communicator and
torchrun tears the other processes down. Here the failing rank raises `InjectedFault` (a
RuntimeError, as a crashed kernel would be, not one of minipar's diagnoses), so `launch`
wakes every other rank out of what it waits in (they see WorldAborted) and raises
RankFailedError, which names the rank and carries its traceback.

Where a fault can fire (its `at`), each a call of `fault_point(name)` in the code that
reaches that point:

    "step"    as step `step` begins (the training loop calls `step_begins(step)`)
    "2F1"     a pipeline action, in torch.distributed.pipelining's notation (stage 2's
              forward of micro-batch 1; "1B0", "0I3", "3W2" likewise): the runner reaches
              it in step `step`; it fires before the action computes anything
    "save"    midway through a sharded checkpoint save in step `step`: this rank's file is
              written, the index (written last) is not, so the directory is an unfinished
              save that no load mistakes for a complete one

Steps count from 1, as the progress display does: a checkpoint saved after step s holds
s optimizer steps, and a fault at step s + 1 leaves that checkpoint the last complete one.
A fault that its rank never reached by the end of its program is an error too
(FaultNotReached): a test that planned a fault where the run never goes would otherwise
pass without failing anything.

The plan lives in each rank's Context (`ctx.faults`), installed by `inject`: no global
state, and a launch without `inject` never fails on purpose.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from .context import Context, current
from .errors import MiniparError


class InjectedFault(RuntimeError):
    """The failure a Fault plants: raised on its rank at its point (a simulated crash)."""


class FaultNotReached(MiniparError):
    """A rank finished its program without reaching a point its Fault was planned at."""


@dataclass(frozen=True)
class Fault:
    """Rank `rank` raises InjectedFault at point `at` of step `step` (counted from 1)."""

    rank: int
    step: int
    at: str = "step"

    def __post_init__(self):
        for name in ("rank", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (name == "step"):
                raise ValueError(f"Fault.{name} must be an integer >= {int(name == 'step')} "
                                 f"(steps count from 1, as the progress display does), got "
                                 f"{value!r}")
        if not isinstance(self.at, str) or not self.at:
            raise ValueError(f"Fault.at names a point: 'step', 'save' or a pipeline action "
                             f"such as '2F1'; got {self.at!r}")

    def __str__(self) -> str:
        if self.at == "step":
            return f"rank {self.rank} as step {self.step} begins"
        return f"rank {self.rank} at {self.at} of step {self.step}"


@dataclass
class FaultPlan:
    """One rank's planned faults and the step it is in (set by step_begins)."""

    faults: list[Fault]
    step: int = 0
    fired: list[Fault] = field(default_factory=list)
    reached: set = field(default_factory=set)  # (step, point) pairs seen, for the report


def inject(fn: Callable[[Context], Any], *faults: Fault) -> Callable[[Context], Any]:
    """`fn` with `faults` planted: on each rank, that rank's faults are installed in its
    Context before fn(ctx) runs; a fault the rank never reached is a FaultNotReached."""
    for f in faults:
        if not isinstance(f, Fault):
            raise TypeError(f"inject(fn, *faults) takes Fault(rank, step, at) objects, got "
                            f"{type(f).__name__} {f!r}")

    @functools.wraps(fn)
    def with_faults(ctx: Context) -> Any:
        if not all(f.rank < ctx.world_size for f in faults):
            bad = [str(f) for f in faults if f.rank >= ctx.world_size]
            raise ValueError(f"planned {bad}, but the world has ranks 0..{ctx.world_size - 1}")
        plan = FaultPlan([f for f in faults if f.rank == ctx.rank])
        ctx.faults = plan
        try:
            out = fn(ctx)
        finally:
            ctx.faults = None
        missed = [f for f in plan.faults if f not in plan.fired]
        if missed:
            f = missed[0]
            seen = sorted(p for s, p in plan.reached if s == f.step)
            fix = (f"train at least {f.step} steps (the last step begun was {plan.step})"
                   if plan.step < f.step else "plan the fault at a point this rank reaches")
            raise FaultNotReached(f"rank {ctx.rank} finished without reaching {f}: at step "
                                  f"{f.step} it passed {seen or 'no fault point'}; {fix}")
        return out

    return with_faults


def step_begins(step: int) -> None:
    """Tell this rank's plan that step `step` (from 1) begins; fires a fault at "step"."""
    plan = _plan()
    if plan is not None:
        plan.step = step
    fault_point("step")


def fault_point(name: str) -> None:
    """Point `name` of the current step is reached on this rank: raise InjectedFault if a
    fault is planned there (no-op without a plan)."""
    plan = _plan()
    if plan is None:
        return
    plan.reached.add((plan.step, name))
    for f in plan.faults:
        if f.step == plan.step and f.at == name and f not in plan.fired:
            plan.fired.append(f)
            raise InjectedFault(f"injected fault: {f} (simulated crash of this rank; "
                                f"planned with minipar.runtime.faults.Fault)")


def _plan():
    return current().faults
