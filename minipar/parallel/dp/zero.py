"""ZeRO stages 1 and 2: partition the optimizer states (1), and the gradients too (2).

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", section 5; DeepSpeed's stage numbers). Each unit's parameters form one
flat buffer padded to a multiple of N (see flat.py); rank r owns shard r of it, the elements
[r*Psi_u/N, (r+1)*Psi_u/N). One step, per unit:

    backward_post:  s_r = reduce_scatter(g, "avg")[r]       the averaged gradient shard
    step:           Adam on shard r only (float32 master, m, v: 12 bytes an element)
    after the step: w   = all_gather(w_shard)               every rank whole again

    stage 1: every rank keeps the whole local gradient buffer (backward writes into it;
             after the reduce-scatter only shard r of it holds averaged values)
    stage 2: the whole unit gradient lives only from the unit's backward_pre until its
             reduce-scatter is done; between steps a rank keeps only its gradient shard

Memory per rank with bf16 weights and float32 Adam (Psi' = padded Psi, see flat.py):

    stage 1:  2Psi' + 2Psi'   + 12Psi'/N  =  4Psi' + 12Psi'/N
    stage 2:  2Psi' + 2Psi'/N + 12Psi'/N  =  2Psi' + 14Psi'/N

measured after the step (stage 2 holds one unit's whole gradient during its backward).
Traffic per rank and step: reduce-scatter (N-1)/N Psi' + all-gather (N-1)/N Psi' =
2 (N-1)/N Psi' elements, the same as DDP's all-reduce, which is a reduce-scatter followed
by an all-gather.

Reduce-scatters are launched asynchronously at each unit's backward_post; one stays in
flight while the next unit's backward runs, and the rest are finished at the end of the
backward. With a `replicate_group` (HYBRID_SHARD), each averaged shard is then all-reduced
across it: states are partitioned inside the shard group and replicated across groups.

Gradient accumulation: under `no_sync()` backward only accumulates locally (stage 2 then
keeps whole unit gradients between micro-batches, as FSDP's no_sync does); without it,
stage 2 reduce-scatters every micro-batch and adds into the shard. Stage 1 reduces once per
step, as DeepSpeed's stage 1 does at the accumulation boundary: run every micro-batch but
the last inside no_sync(). `finish_grad_sync()` reduce-scatters every unit left unreduced
and waits: a pipeline rank (no root unit ends its backward) runs all its micro-batches
unreduced and calls it once, so each unit is reduced once per step, stage 2 holding its
stage's whole gradients until then.

Stage 3 (parameters partitioned too) is in zero3.py; stage 0 is DDP (ddp.py); `zero_engine` (fsdp.py)
picks one by number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...optim.adam import AdamW
from ...runtime.collectives import Work, all_gather, all_reduce, reduce_scatter
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .engine import ROOT, DataParallelEngine, LocalState, ModelParallelNorm, _check_optimizer
from .flat import FlatParameter, FlatShard
from .sharded_optimizer import OwnedPiece, ShardedOptimizer


@dataclass
class UnitState:
    """One unit on one rank: its layout and the buffers this rank holds for it."""

    name: str
    flat: FlatParameter
    lo: int  # this rank's shard: flat[lo:hi]
    hi: int
    param: Optional[np.ndarray] = None  # stages 1-2: whole weights [padded]; stage 3: None
    param_shard: Optional[np.ndarray] = None  # stage 3: [shard]
    grad: Optional[np.ndarray] = None  # whole gradient buffer [padded] while it exists
    grad_shard: Optional[np.ndarray] = None  # stages 2-3: the averaged shard [shard]
    reduced: bool = False  # stage 1: shard lo:hi of `grad` holds averaged values


@dataclass
class Reduction:
    """A unit's gradient on its way: reduce-scatter, then (hybrid) all-reduce of the shard."""

    unit: UnitState
    rs: Optional[Work] = None
    ar: Optional[Work] = None
    done: bool = False


class ZeroEngine(DataParallelEngine):
    """`ZeroEngine(model, AdamW, stage=1 | 2, lr=..., max_grad_norm=...)`.

    process_group:    the group states are partitioned over (default: the world), N ranks
    replicate_group:  optional group across which shards are replicated (HYBRID_SHARD):
                      gradients are averaged over shard group x replicate group
    model_parallel:   with a model split across ranks, how its gradient norm is completed
    main_grad:        float32 gradient buffers for a bfloat16 model (engine.py): stage 1
                      with it is Megatron's distributed optimizer, 6Psi' + 12Psi'/N
    """

    def __init__(self, model, optimizer_cls: type = AdamW, *, stage: int = 1,
                 process_group: Optional[ProcessGroup] = None,
                 replicate_group: Optional[ProcessGroup] = None,
                 max_grad_norm: Optional[float] = None,
                 model_parallel: Optional[ModelParallelNorm] = None, main_grad: bool = False,
                 **optimizer_kwargs):
        if stage not in self._stages():
            raise ValueError(f"{type(self).__name__} implements ZeRO stage(s) {self._stages()}, "
                             f"got stage={stage!r}; use zero_engine(model, stage=...) for 0-3")
        _check_optimizer(optimizer_cls, optimizer_kwargs)
        shard = process_group or current().world
        super().__init__(model, shard, shard, max_grad_norm, model_parallel,
                         main_grad=main_grad)
        self.stage = stage
        self.replicate_group = replicate_group
        if replicate_group is not None and current().rank not in replicate_group:
            raise ValueError(f"rank {current().rank} is not in replicate_group {replicate_group}")
        self.n = shard.size
        self.me = shard.group_rank(current().rank)
        self._ledger = current().ledger
        self.state: dict[str, UnitState] = {}
        for unit, ps in self.units:
            flat = FlatParameter(unit, ps, self.n)
            lo, hi = flat.shard_range(self.me)
            u = UnitState(unit, flat, lo, hi)
            for p in ps:
                p.release()  # the engine charges the flat buffers from here on
            self._place_parameters(u)
            self._place_gradients(u)
            self.state[unit] = u
        self.optimizer = ShardedOptimizer(
            [OwnedPiece(u.name, self._owned_weights(u),
                        [(s.name, s.start - u.lo, s.stop - u.lo) for s in u.flat.segments(self.me)])
             for u in self.state.values()],
            optimizer_cls, **optimizer_kwargs)
        self._pending: list[Reduction] = []
        self._unreduced: dict[str, UnitState] = {}  # backward ran inside no_sync()
        self._register(**self._hooks())

    @staticmethod
    def _stages() -> tuple[int, ...]:
        return (1, 2)

    def _hooks(self) -> dict:
        return {"backward_pre": self._backward_pre, "backward_post": self._backward_post}

    # ---- where things live (stage 3 overrides the weights) ------------------------------------
    def _place_parameters(self, u: UnitState) -> None:
        u.param = u.flat.flatten()  # [padded]: every rank keeps the whole weights
        self._ledger.hold(f"zero:{u.name}.param", u.param, "parameters")
        u.flat.use_data(u.param)

    def _owned_weights(self, u: UnitState) -> np.ndarray:
        return u.param[u.lo:u.hi]  # [shard], a view: the step writes the weights in place

    def _place_gradients(self, u: UnitState) -> None:
        if self.stage == 1:  # the whole gradient buffer, for good
            u.grad = np.zeros(u.flat.padded_numel, dtype=self.grad_dtype)  # [padded]
            self._ledger.hold(f"zero:{u.name}.grad", u.grad, "gradients")
            u.flat.use_grads(u.grad)
        else:  # only the averaged shard between steps
            u.grad_shard = np.zeros(u.flat.shard_numel, dtype=self.grad_dtype)  # [shard]
            self._ledger.hold(f"zero:{u.name}.grad_shard", u.grad_shard, "gradients")

    def _open_gradient(self, u: UnitState) -> None:
        """Before a unit's backward: make sure its whole gradient buffer exists."""
        if u.grad is None:  # stages 2-3: a whole buffer for this backward, freed once reduced
            u.grad = np.zeros(u.flat.padded_numel, dtype=self.grad_dtype)  # [padded]
            self._ledger.hold(f"zero:{u.name}.grad_full", u.grad, "gradients")
            u.flat.use_grads(u.grad)
        detached = u.flat.detached_grads()
        if detached:
            raise RuntimeError(
                f"rank {current().rank}: the gradients of {detached[:4]} are no longer views "
                f"of unit {u.name!r}'s gradient buffer (did model.zero_grad() or an "
                "optimizer's zero_grad() run?). Call engine.zero_grad() instead")
        if self.stage == 1 and u.reduced:
            raise RuntimeError(
                f"rank {current().rank}: ZeRO-1 reduces gradients once per step, but unit "
                f"{u.name!r} runs a backward after its gradients were reduced and before "
                "step()/zero_grad(). Run all micro-batches but the last inside "
                "engine.no_sync() (or use stage 2, which reduces every micro-batch)")

    def _close_gradient(self, u: UnitState) -> None:
        """Stages 2-3: the whole gradient buffer is no longer needed: free it."""
        if self.stage >= 2 and u.grad is not None:
            u.flat.drop_grads()
            self._ledger.release(f"zero:{u.name}.grad_full")
            u.grad = None

    # ---- hooks --------------------------------------------------------------------------
    def _backward_pre(self, unit: str) -> None:
        self._open_gradient(self.state[unit])

    def _backward_post(self, unit: str) -> None:
        if not self._sync:
            self._unsynced = True
            self._unreduced.setdefault(unit, self.state[unit])
        else:
            self._unreduced.pop(unit, None)
            self._reduce(self.state[unit])
        if unit == ROOT:  # the end of the backward
            self._wait_reductions()
            if self._sync:
                self._unsynced = False

    # ---- gradient reduction -----------------------------------------------------------------
    def _reduce(self, u: UnitState) -> None:
        """Launch the unit's reduce-scatter; move older reductions one stage on, so that
        one reduce-scatter stays in flight during the next unit's backward."""
        red = Reduction(u)
        if self.n > 1:
            red.rs = reduce_scatter(u.grad, "avg", group=self.group, async_op=True)
        else:  # a group of one: the whole buffer is the shard, nothing to scatter
            self._scattered(red, u.grad.copy())
        self._pending.append(red)
        for older in self._pending[:-1]:
            self._advance(older)
        self._pending = [r for r in self._pending if not r.done]

    def _advance(self, red: Reduction) -> None:
        if red.rs is not None:
            shard = red.rs.wait()  # [shard]: the average over the shard group
            red.rs = None
            self._scattered(red, shard)
        elif red.ar is not None:
            self._accumulate(red.unit, red.ar.wait())
            red.ar, red.done = None, True

    def _scattered(self, red: Reduction, shard: np.ndarray) -> None:
        """The shard group's average has arrived: free the whole buffer (stages 2-3), then
        average across the replicate group (HYBRID_SHARD) or keep it."""
        self._close_gradient(red.unit)
        if self.replicate_group is not None and self.replicate_group.size > 1:
            red.ar = all_reduce(shard, "avg", group=self.replicate_group, async_op=True)
        else:
            self._accumulate(red.unit, shard)
            red.done = True

    def _accumulate(self, u: UnitState, shard: np.ndarray) -> None:
        if self.stage == 1:  # the averaged shard replaces the local one
            u.grad[u.lo:u.hi] = shard
            u.reduced = True
        else:  # micro-batches add up in the shard
            u.grad_shard += shard

    def finish_grad_sync(self) -> None:
        """Reduce-scatter each unit whose backward ran unreduced, in the order the backward
        finished them (the same on every rank), then wait for every reduction."""
        for u in self._unreduced.values():
            self._reduce(u)
        self._unreduced = {}
        self._wait_reductions()
        self._unsynced = False

    def _wait_reductions(self) -> None:
        for red in self._pending:
            while not red.done:
                self._advance(red)
        self._pending = []

    def _owned_grads(self) -> list[np.ndarray]:
        return [u.grad[u.lo:u.hi] if self.stage == 1 else u.grad_shard
                for u in self.state.values()]

    def zero_grad(self) -> None:
        """Zero what this rank keeps (stage 1: the whole buffer; 2-3: the shard); whole
        unit gradients left by no_sync() passes are freed."""
        self._wait_reductions()
        for u in self.state.values():
            if self.stage == 1:
                u.grad.fill(0)
                u.reduced = False
            else:
                u.grad_shard.fill(0)
                self._close_gradient(u)
        self._unreduced = {}
        self._unsynced = False

    # ---- after the step: everyone whole again -----------------------------------------
    def _after_step(self) -> None:
        """w = all_gather(w_shard), one unit at a time. DeepSpeed gathers straight into the
        flat weights (all_gather_into_tensor), with no second copy; the functional
        all_gather here returns a new [padded] buffer, so gathering unit by unit keeps that
        transient to one unit's size instead of a second copy of the whole model. The
        gathers queue on the group's one comm stream either way: no time is lost."""
        if self.n == 1:
            return
        for u in self.state.values():
            np.copyto(u.param, all_gather(u.param[u.lo:u.hi], group=self.group))  # [padded]

    # ---- gathering for inspection and checkpoints ------------------------------------
    def _gather_flat(self, shard: np.ndarray) -> np.ndarray:
        """[shard] on each rank -> [padded] on every rank (over the shard group)."""
        return all_gather(shard, group=self.group) if self.n > 1 else shard.copy()

    def full_grads(self) -> dict[str, np.ndarray]:
        self._wait_reductions()
        out = {}
        for u, g in zip(self.state.values(), self._owned_grads()):
            out.update(u.flat.unflatten(self._gather_flat(g)))
        return out

    def _full_weights(self, u: UnitState) -> np.ndarray:
        return u.param

    def _full_values(self):
        params, states = {}, {}
        for i, u in enumerate(self.state.values()):
            params.update(u.flat.unflatten(self._full_weights(u)))
            for kind, arr in self.optimizer.state_arrays(i).items():
                for name, a in u.flat.unflatten(self._gather_flat(arr)).items():
                    states.setdefault(name, {})[kind] = a
        return params, states

    def _load_values(self, params, states) -> None:
        for i, u in enumerate(self.state.values()):
            sl = u.flat.slices()
            w = np.zeros(u.flat.padded_numel, dtype=self.dtype)
            for name, s in sl.items():
                w[s] = params[name].reshape(-1)
            self._load_weights(u, w)
            for kind, arr in self.optimizer.state_arrays(i).items():
                full = np.zeros(u.flat.padded_numel, dtype=arr.dtype)
                for name, s in sl.items():
                    full[s] = states[name][kind].reshape(-1)
                arr[...] = full[u.lo:u.hi]

    def _load_weights(self, u: UnitState, w: np.ndarray) -> None:
        u.param[...] = w

    def local_state(self) -> LocalState:
        """Shard `me` of every unit's flat weights and states, as views: ZeRO-1/2 hold the
        whole weights but only this shard is theirs (the other ranks own the rest); ZeRO-3
        holds only it. HYBRID_SHARD: replicated over the replicate group."""
        units = [FlatShard(u.flat, {"param": self._owned_weights(u),
                                    **self.optimizer.state_arrays(i)})
                 for i, u in enumerate(self.state.values())]
        replicas = self.replicate_group
        return LocalState(units, self.group,
                          replicas if replicas is not None and replicas.size > 1 else None,
                          self.steps)
