"""What every data-parallel engine shares: the training-step API, clipping, checkpoints.

Data parallelism: N ranks hold the same model, each trains on its 1/N of the global batch,
and gradients are averaged before the step, so every rank takes the step one device would
take on the whole batch:

    g = (1/N) sum_r g_r          g_r: the gradient of rank r's mean loss on its B/N samples
      = grad of the mean loss over all B samples     (equal shards: a mean of means)

The engines differ in what each rank keeps (Rajbhandari et al. 2020, "ZeRO", section 5):

    engine                          keeps per rank (bf16 + float32 Adam, Psi parameters)
    DDP          (stage 0)          2Psi weights + 2Psi grads + 12Psi optimizer  = 16Psi
    ZeRO-1                          2Psi + 2Psi + 12Psi/N                        = 4Psi + 12Psi/N
    ZeRO-2                          2Psi + 2Psi/N + 12Psi/N                      = 2Psi + 14Psi/N
    ZeRO-3 (FSDP FULL_SHARD)        2Psi/N + 2Psi/N + 12Psi/N                    = 16Psi/N

A training step, the same with every engine:

    engine = FullyShardedDataParallel(model, AdamW, lr=1e-3, max_grad_norm=1.0)
    for i, (x, y) in enumerate(micro_batches):                 # this rank's B/N columns
        with engine.no_sync() if i < k - 1 else nullcontext():  # no communication until the last
            loss = model.loss_and_grad(x, y, loss_scale=1 / k)  # the hooks communicate
    engine.step()          # global-norm clip, optimizer step on this rank's shard, gather
    engine.zero_grad()

(`accumulate_gradients` below writes that loop.) The engines hook the model's units
(`model.hooks`) and use only the `Parameter` API; the model never knows it is distributed.

Clipping by the global norm. Each rank holds a disjoint shard of the averaged gradient, so

    ||g||^2 = sum over shards of ||g_shard||^2      -> all_reduce the *squares*, then sqrt

and every rank scales by the same min(1, max_norm / (||g|| + 1e-6)). Clipping each shard by
its own norm is the classic bug: the coefficients differ between ranks, the update is no
longer the single-device update, and shards drift apart (tests/parallel show it).

When the model itself is split (tensor parallelism on a dp x tp mesh) the gradient is split
across the model-parallel group too. The engine does not know which form split it: it is
given a `ModelParallelNorm` (parallel/mesh builds it) naming the group to sum the squares
over and which parameters this rank counts — a parameter replicated across the group
(LayerNorms, biases of row-parallel layers, position embeddings) is counted once, on its
first rank, as Megatron's `param_is_not_tensor_parallel_duplicate`:

    ||g||^2 = all_reduce over the model-parallel group of
              (sum over the shard group of the squares this rank counts)

`main_grad=True` (Megatron-LM's, Narayanan et al. 2021): buffer₃₂ += float32(g₁₆) each
backward, reduced in float32: 4 bytes of gradient a parameter (DDP 18Ψ; ZeRO-1, Megatron's
distributed optimizer, 6Ψ + 12Ψ/N), twice the bytes sent (sharded_optimizer.grad_dtype).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from ...nn.hooks import ROOT  # "root", the unit GPT.units() lists first
from ...nn.parameter import Parameter
from ...optim.clip import clip_coef
from ...runtime.collectives import all_reduce
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .experts import ExpertDataParallel
from .flat import FlatShard
from .sharded_optimizer import ShardedOptimizer, check_optimizer_class, grad_dtype, is_half


@dataclass(frozen=True)
class ModelParallelNorm:
    """How a gradient norm is completed across the ranks that split the model.

    group:    the squares of every rank's counted gradients are summed over it
    counted:  counted(parameter name) -> bool: whether this rank adds that parameter's
              squares (a parameter replicated across `group` is counted on one rank only)
    """

    group: ProcessGroup
    counted: Callable[[str], bool]


@dataclass(frozen=True)
class LocalState:
    """What one rank holds of the training state, and where it sits: `local_state()`.

    units:          one FlatShard per unit, in unit order (flat.py): this rank's shard of
                    the unit's flat weights, m, v (and masters), each [shard_numel]
    shard_group:    the ranks the flat buffers are split over, shard i on group rank i
                    (None: this rank holds every unit whole, as DDP does)
    replica_group:  the ranks holding these same shards (DDP's group, HYBRID_SHARD's
                    replicate group; None: nobody else), so the first one's copy is enough
    step:           optimizer steps taken

    Each parameter in a unit is this rank's array of that name; a model split across ranks
    (tensor parallelism) tags its shards with where they sit in the full tensor.
    """

    units: list[FlatShard]
    shard_group: Optional[ProcessGroup]
    replica_group: Optional[ProcessGroup]
    step: int

    def shard(self) -> tuple[int, int]:
        """(index, count): this rank holds shard `index` of `count` of every unit."""
        g = self.shard_group
        return (0, 1) if g is None else (g.group_rank(current().rank), g.size)

    def replica(self) -> tuple[int, int]:
        """(index, count) among the ranks that hold the same shards (0: the first)."""
        g = self.replica_group
        return (0, 1) if g is None else (g.group_rank(current().rank), g.size)


class DataParallelEngine:
    """Base of DDP, ZeRO-1/2/3 and FSDP. Subclasses provide the gradient and parameter
    traffic (through the model's hooks) and where the owned gradients live."""

    #: ZeRO stage this engine implements (0 = DDP)
    stage: int = 0

    def __init__(self, model, group: ProcessGroup, shard_group: Optional[ProcessGroup],
                 max_grad_norm: Optional[float],
                 model_parallel: Optional[ModelParallelNorm] = None,
                 experts: Optional[ExpertDataParallel] = None, main_grad: bool = False):
        ctx = current()
        self.experts = experts  # how expert parameters are reduced (DDP only; None: none)
        for g in (group, shard_group, model_parallel and model_parallel.group):
            if g is not None and ctx.rank not in g:
                raise ValueError(
                    f"rank {ctx.rank} is not a member of process group {g}: build the engine "
                    "on every rank of its group, passing the group this rank belongs to")
        if model_parallel is not None and set(group.ranks) & set(model_parallel.group.ranks) \
                != {ctx.rank}:
            raise ValueError(
                f"rank {ctx.rank}: the data-parallel group {group} and the model-parallel "
                f"group {model_parallel.group} share ranks "
                f"{sorted(set(group.ranks) & set(model_parallel.group.ranks) - {ctx.rank})}: "
                "ranks holding different shards of the model would average (and DDP would "
                "overwrite) each other's weights. Take both groups from one ParallelGroups")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None to not clip), "
                             f"got {max_grad_norm}")
        if not hasattr(model, "units") or not hasattr(model, "hooks"):
            raise TypeError(f"{type(self).__name__} wraps a model with units() and hooks "
                            f"(minipar.nn.GPT); got {type(model).__name__}")
        self.model = model
        self.model_parallel = model_parallel
        self.group = group  # DDP: the all-reduce group; ZeRO: the shard group
        self.shard_group = shard_group  # where states are partitioned (None: nowhere)
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm: Optional[float] = None
        self.units: list[tuple[str, list[Parameter]]] = model.units()
        names = [u for u, _ in self.units]
        if not names or (ROOT in names and names[0] != ROOT):
            raise ValueError(f"the model's units must be {ROOT!r} first (fired first in "
                             f"forward, last in backward), or a pipeline rank's (no "
                             f"{ROOT!r}, at least one unit); got {names}")
        dtypes = {p.data.dtype for _, ps in self.units for p in ps}
        if len(dtypes) != 1:
            raise TypeError(f"the model mixes parameter dtypes {sorted(map(str, dtypes))}; "
                            "build it in one dtype (GPTConfig(dtype=...))")
        self.dtype = dtypes.pop()
        # full shapes, recorded before any engine shards a parameter's storage away
        self.param_shapes = {p.name: tuple(p.shape) for _, ps in self.units for p in ps}
        split = [p.name for _, ps in self.units for p in ps
                 if getattr(p, "partition_count", 1) > 1]
        if split and max_grad_norm is not None and model_parallel is None:
            raise ValueError(
                f"rank {ctx.rank}: the model holds tensor-parallel shards ({split[0]}, ...), "
                "so its gradient norm needs the squares of the other shards too, but no "
                "model_parallel=ModelParallelNorm(group, counted) was given. Build the run "
                "with minipar.parallel.mesh.parallelize, which passes it")
        if self.dtype == np.float16:
            raise TypeError("float16 training needs loss scaling, which the data-parallel "
                            "engines do not implement; use dtype='bfloat16' (float32's range)")
        self.mixed_precision = is_half(self.dtype)
        self.grad_dtype = grad_dtype(main_grad, self.dtype)  # the gradient buffers' dtype
        self.main_grad = bool(main_grad)
        self.optimizer: ShardedOptimizer  # made by the subclass
        # False inside no_sync(). A pipeline rank's units have no ROOT, so no hook ends
        # its backward: it reduces only when told, in finish_grad_sync()
        self._sync = ROOT in names
        self._unsynced = False  # a backward ran inside no_sync() and no synced one since
        self._handles: list = []

    # ---- hooks -----------------------------------------------------------------------
    def _register(self, **fns) -> None:
        """fns: event name -> fn(unit); registered on the model's hooks."""
        for event, fn in fns.items():
            self._handles.append(self.model.hooks.register(event, fn))

    def remove_hooks(self) -> None:
        """Detach from the model (its forward and backward then do no communication)."""
        for remove in self._handles:
            remove()
        self._handles.clear()

    # ---- the training-loop API ------------------------------------------------------
    def finish_grad_sync(self) -> None:
        """Reduce every gradient a backward left unreduced (inside no_sync(), or on a
        pipeline rank), and wait for all reductions: after it, step() may run. A pipeline
        calls it once, after its last micro-batch's backward (Megatron-LM's
        finalize_model_grads -> DistributedDataParallel.finish_grad_sync)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, with no communication; the
        first backward outside communicates the sum (gradient accumulation)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:  # what LRScheduler sets
        self.optimizer.lr = value

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored by load_full_state_dict)."""
        return self.optimizer.step_count

    def step(self) -> None:
        """Finish gradient communication, clip by the global norm, step the owned shard,
        then bring the parameters up to date where the engine keeps them whole."""
        self._wait_reductions()
        self._before_step()
        if self._unsynced:
            raise RuntimeError(
                f"rank {current().rank}: step() after a backward inside no_sync() with no "
                "synchronised backward since: the gradients were never averaged across "
                "ranks. Run the last micro-batch outside no_sync(), or call "
                "finish_grad_sync() first (a pipeline rank must)")
        grads = self._owned_grads()
        coef = 1.0
        if self.max_grad_norm is not None:
            total = self._sum_over_shards(self._squares(grads))
            mp = self.model_parallel
            if mp is not None and mp.group.size > 1:
                total = float(all_reduce(np.array([total]), "sum", group=mp.group)[0])
            self.last_grad_norm = math.sqrt(total)
            # inf: 0, nan: nan, applied all the same, as clip_grad_norm_ (and torch) do
            coef = clip_coef(self.last_grad_norm, self.max_grad_norm)
        self.optimizer.step(grads, coef)
        self._after_step()

    def _squares(self, grads: list[np.ndarray]) -> float:
        """This rank's counted squares; with experts, theirs summed over the expert group
        too (each rank holds other experts), added to the dense ones."""
        counted = self._counted()
        if self.experts is None:
            return self.optimizer.squared_grad_norm(grads, counted)
        base, is_expert = counted or (lambda name: True), self.experts.is_expert
        dense = self.optimizer.squared_grad_norm(
            grads, lambda name: base(name) and not is_expert(name))
        mine = self.optimizer.squared_grad_norm(grads, lambda name: base(name) and is_expert(name))
        if self.experts.expert_group.size > 1:
            mine = float(all_reduce(np.array([mine]), "sum", group=self.experts.expert_group)[0])
        return dense + mine

    def _counted(self) -> Optional[Callable[[str], bool]]:
        """Which parameters' squares this rank adds to the norm (None: all of them)."""
        mp = self.model_parallel
        return None if mp is None or mp.group.size == 1 else mp.counted

    def _sum_over_shards(self, local: float) -> float:
        """||g||^2 = sum over the shard group of each rank's sum of squares (replicas of a
        shard, across a replicate group, hold the same values and are counted once)."""
        if self.shard_group is None or self.shard_group.size == 1:
            return local
        return float(all_reduce(np.array([local]), "sum", group=self.shard_group)[0])

    # ---- what subclasses provide ------------------------------------------------------
    def zero_grad(self) -> None:
        raise NotImplementedError

    def _wait_reductions(self) -> None:
        raise NotImplementedError

    def _owned_grads(self) -> list[np.ndarray]:
        """The averaged gradient pieces, aligned with `self.optimizer.pieces`."""
        raise NotImplementedError

    def _before_step(self) -> None:
        pass

    def _after_step(self) -> None:
        pass

    def full_grads(self) -> dict[str, np.ndarray]:
        """{name: the averaged full gradient} on every rank (a collective)."""
        raise NotImplementedError

    def _full_values(self) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
        """({name: full weights}, {name: {"m", "v"[, "master"]: full arrays}}) (a collective)."""
        raise NotImplementedError

    def _load_values(self, params: dict[str, np.ndarray],
                     states: dict[str, dict[str, np.ndarray]]) -> None:
        raise NotImplementedError

    def local_state(self) -> LocalState:
        """What this rank holds, with no communication: its shard of every unit's weights
        and optimizer states, and the groups they are split and replicated over. A sharded
        checkpoint is written from it (parallel/checkpoint)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def summon_full_params(self, writeback: bool = True) -> Iterator[None]:
        """Inside, every parameter holds its full values (FSDP's summon_full_params). With
        `writeback`, values written by hand are kept (and become the float32 masters)."""
        yield
        if writeback:
            self.optimizer.refresh_masters()

    # ---- checkpoints ----------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, np.ndarray]:
        """The whole training state as full float arrays, on every rank (a collective):

            "param/<name>"          the weights (float32 for bfloat16 models: exact)
            "optim/<name>.m", ".v"  Adam's moments
            "optim/<name>.master"   the float32 master (bfloat16 models only)
            "meta/step"             steps taken, a 0-d int64 array

        Independent of the engine, stage and dp size that wrote it: any engine loads it.
        """
        params, states = self._full_values()
        out: dict[str, np.ndarray] = {}
        for name, w in params.items():
            out[f"param/{name}"] = w.astype(np.float32) if is_half(w.dtype) else w
        for name, kinds in states.items():
            for kind, arr in kinds.items():
                out[f"optim/{name}.{kind}"] = arr
        out["meta/step"] = np.array(self.steps, dtype=np.int64)
        return out

    def load_full_state_dict(self, sd: dict[str, np.ndarray]) -> None:
        """Restore what `full_state_dict` returned (from any engine, stage or dp size),
        bit for bit. Every rank passes the same full dict; no communication."""
        shapes = self.param_shapes
        kinds = ("m", "v", "master") if self.mixed_precision else ("m", "v")
        expected = {"meta/step"} | {f"param/{n}" for n in shapes} | {
            f"optim/{n}.{k}" for n in shapes for k in kinds}
        missing, extra = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or extra:
            hint = (" (a float64 checkpoint has no masters: load it into a float64 model)"
                    if any(k.endswith(".master") for k in missing) else "")
            raise KeyError(f"load_full_state_dict: missing keys {missing[:6]}, unexpected "
                           f"keys {extra[:6]}{hint}; was the checkpoint written for this model?")
        for name, shape in shapes.items():
            for key in [f"param/{name}"] + [f"optim/{name}.{k}" for k in kinds]:
                if tuple(np.shape(sd[key])) != shape:
                    raise ValueError(f"load_full_state_dict: {key} has shape "
                                     f"{np.shape(sd[key])}, but {name} has shape {shape} in "
                                     "this model; was the checkpoint written for this model?")
        params = {n: np.asarray(sd[f"param/{n}"]).astype(self.dtype) for n in shapes}
        states = {n: {k: np.asarray(sd[f"optim/{n}.{k}"]) for k in kinds} for n in shapes}
        self._load_values(params, states)
        self.optimizer.set_step_count(int(sd["meta/step"]))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(stage={self.stage}, group={self.group}, dtype="
                f"{self.dtype}, max_grad_norm={self.max_grad_norm}, main_grad={self.main_grad})")


def accumulate_gradients(model, engine: DataParallelEngine,
                         micro_batches: Sequence[tuple[np.ndarray, np.ndarray]],
                         no_sync: bool = True) -> float:
    """Forward and backward over this rank's micro-batches, each loss scaled by 1/k;
    all but the last inside `engine.no_sync()` (with `no_sync=False` every micro-batch
    communicates: ZeRO-2/3 then hold only gradient shards between micro-batches).
    Returns this rank's mean micro-batch loss."""
    k = len(micro_batches)
    if k == 0:
        raise ValueError("accumulate_gradients needs at least one micro-batch")
    losses = []
    for i, (x, y) in enumerate(micro_batches):
        quiet = no_sync and i < k - 1
        with engine.no_sync() if quiet else contextlib.nullcontext():
            losses.append(model.loss_and_grad(x, y, loss_scale=1.0 / k))
    return float(np.mean(losses))


def _check_optimizer(optimizer_cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse what the engines cannot shard, before anything is built or charged."""
    check_optimizer_class(optimizer_cls)
    if "params" in kwargs:
        raise TypeError("the engine builds the optimizer over the parameters it owns; pass "
                        "the optimizer class and its hyperparameters (lr=..., ...), not params")
