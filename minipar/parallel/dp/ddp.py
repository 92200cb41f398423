"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced in
buckets while the backward is still running.

    g = all_reduce(g_r, op="avg")  =  (1/N) sum_r g_r               (on every rank)

(PyTorch DDP, Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", sections 3.2 and 4.2.) What it does, in order:

1. At construction the parameters are broadcast from the group's first rank. They are
   already equal (initialisation depends on the seed and the name only), but DDP broadcasts
   anyway: a model loaded or perturbed on one rank must not silently diverge.
2. Gradients live in *buckets*: flat buffers of about `bucket_cap_mb` MiB, filled in reverse
   unit order (the order backward produces gradients: last block first, root last). Each
   parameter's `grad` is a view of its bucket (PyTorch's gradient_as_bucket_view), so
   backward accumulates straight into the buffer that is communicated.
3. When a unit's backward ends (`backward_post`), every bucket whose parameters are all
   final is launched: `all_reduce(bucket, "avg", async_op=True)`. It runs on the group's
   communication stream while the backward of the earlier units goes on: on the simulated
   clock the all-reduce overlaps the remaining backward compute.
4. At the end of the backward (the root's `backward_post`, as PyTorch's final autograd
   callback) every bucket is waited on, so the optimizer step sees averaged gradients.
5. `no_sync()`: backward passes inside only accumulate into the buckets; the first backward
   outside all-reduces the sum (gradient accumulation over k micro-batches, one all-reduce).
   `finish_grad_sync()` all-reduces whatever buckets are still unreduced and waits: how a
   pipeline rank, whose units have no root to end its backward, reduces once per step
   after its last micro-batch (no overlap with the backward: Megatron-LM overlaps the last
   micro-batch's reduction with its backward; here every bucket starts at the end).
6. Expert parameters (`experts=ExpertDataParallel(...)`, a mixture of experts over an
   expert-parallel group) are broadcast and all-reduced over their own replicas, in
   buckets of their own, and scaled by 1/ep after the average (engine.py says why).

Memory (bf16 weights, float32 master and Adam moments): 2Psi weights + 2Psi buckets +
12Psi optimizer states = 16Psi bytes per rank, with no padding (an all-reduce needs none);
with `main_grad=True` the buckets are float32 (engine.py): 2Psi + 4Psi + 12Psi = 18Psi, and
the all-reduce adds and sends float32.
Traffic per step, ring all-reduce: 2(N-1)/N * Psi elements sent by each rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...optim.adam import AdamW
from ...runtime.collectives import Work, all_reduce, broadcast
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .engine import (ROOT, DataParallelEngine, ExpertDataParallel, LocalState,
                     ModelParallelNorm, _check_optimizer)
from .flat import FlatParameter, FlatShard
from .sharded_optimizer import OwnedPiece, ShardedOptimizer

MIB = 2 ** 20  # bucket_cap_mb counts MiB, as in PyTorch


@dataclass
class Bucket:
    """Gradients of some parameters, end to end: buffer [numel], grad views into it."""

    index: int
    flat: FlatParameter  # the layout (world=1: no padding)
    buffer: np.ndarray  # [flat.numel], the parameters' dtype
    units: frozenset  # units whose backward must end before the bucket is final
    group: ProcessGroup  # averaged over: the dp group, or an expert's replicas
    scale: float = 1.0  # applied after the average (1/ep for expert gradients)
    work: Optional[Work] = None  # the all-reduce in flight
    launched: bool = False  # reduced (or, on a group of one, due) and not yet waited on
    launched_after: Optional[str] = None  # the unit whose backward_post launched it (last pass)


class DistributedDataParallel(DataParallelEngine):
    """`DistributedDataParallel(model, AdamW, lr=..., bucket_cap_mb=25, max_grad_norm=None)`.

    model:          a GPT built the same way on every rank of `process_group`
    optimizer_cls:  Adam or AdamW; `**optimizer_kwargs` are its hyperparameters
    process_group:  the data-parallel group (default: the world)
    bucket_cap_mb:  a bucket is closed once it holds at least this many MiB of gradients
    max_grad_norm:  clip by the global gradient norm before the step (None: no clipping)
    model_parallel: with a model split across ranks, how its gradient norm is completed
                    (engine.py; parallel.mesh.parallelize passes it)
    experts:        how a mixture of experts' expert parameters are reduced (engine.py's
                    ExpertDataParallel; parallelize passes it), None: like the others
    main_grad:      float32 buckets for a bfloat16 model: gradients accumulate and are
                    all-reduced in float32 (Megatron's main_grad; engine.py)
    """

    stage = 0

    def __init__(self, model, optimizer_cls: type = AdamW, *,
                 process_group: Optional[ProcessGroup] = None, bucket_cap_mb: float = 25.0,
                 max_grad_norm: Optional[float] = None,
                 model_parallel: Optional[ModelParallelNorm] = None,
                 experts: Optional[ExpertDataParallel] = None, main_grad: bool = False,
                 **optimizer_kwargs):
        _check_optimizer(optimizer_cls, optimizer_kwargs)
        super().__init__(model, process_group or current().world, None, max_grad_norm,
                         model_parallel, experts, main_grad=main_grad)
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self.bucket_cap_bytes = bucket_cap_mb * MIB
        self._ledger = current().ledger
        self._take_over_parameters()
        self._broadcast_parameters()
        self.buckets = self._make_buckets()
        self._grad_of = {p.name: v.reshape(-1) for b in self.buckets
                         for p, v in zip(b.flat.params, b.flat.views(b.buffer))}
        params = [p for _, ps in self.units for p in ps]
        self.optimizer = ShardedOptimizer(  # each rank owns every parameter, whole
            [OwnedPiece(p.name, p.data.reshape(-1), [(p.name, 0, p.size)]) for p in params],
            optimizer_cls, **optimizer_kwargs)
        self._done: set[str] = set()
        self._next_bucket = 0
        self._register(backward_pre=self._backward_pre, backward_post=self._backward_post)

    # ---- construction -------------------------------------------------------------------
    def _take_over_parameters(self) -> None:
        """The engine keeps the ledger from here on: weights stay "param:{name}" (now
        charged by DDP), gradients are the buckets."""
        for _, ps in self.units:
            for p in ps:
                if not p.data.flags.c_contiguous:
                    p.set_data(np.ascontiguousarray(p.data))
                p.release()
                self._ledger.hold(f"param:{p.name}", p.data, "parameters")

    def _reduced_over(self, p) -> tuple[ProcessGroup, float]:
        """(the group p's gradient is averaged and its weights broadcast over, the factor
        after the average): the data-parallel group, or an expert's replicas and 1/ep."""
        e = self.experts
        if e is not None and e.is_expert(p.name):
            return e.group, e.scale
        return self.group, 1.0

    def _broadcast_parameters(self) -> None:
        """Every rank gets the weights of its group's first rank, one unit at a time (an
        expert's from the first of its replicas: the others hold other experts)."""
        for unit, ps in self.units:
            for group in dict.fromkeys(self._reduced_over(p)[0] for p in ps):
                mine = [p for p in ps if self._reduced_over(p)[0] == group]
                if group.size == 1:
                    continue
                flat = FlatParameter(unit, mine, 1)
                got = broadcast(flat.flatten(), src=group.ranks[0], group=group)  # [numel]
                for p, v in zip(mine, flat.views(got)):
                    p.data[...] = v  # in place: the optimizer's pieces view these arrays

    def _make_buckets(self) -> list[Bucket]:
        """Parameters in reverse unit order (reverse within a unit too), cut into buckets
        of at least bucket_cap_bytes (the last one may be smaller); a bucket also ends
        where the next parameter is reduced over another group (experts)."""
        order = [(unit, p) for unit, ps in reversed(self.units) for p in reversed(ps)]
        buckets: list[Bucket] = []
        current_ps, current_units, nbytes = [], set(), 0
        for i, (unit, p) in enumerate(order):
            current_ps.append(p)
            current_units.add(unit)
            nbytes += p.data.nbytes
            group, scale = self._reduced_over(p)
            if (nbytes >= self.bucket_cap_bytes or i == len(order) - 1
                    or self._reduced_over(order[i + 1][1])[0] != group):
                k = len(buckets)
                flat = FlatParameter(f"bucket{k}", current_ps, 1)
                buf = np.zeros(flat.padded_numel, dtype=self.grad_dtype)  # buf: [numel]
                self._ledger.hold(f"ddp:bucket{k}", buf, "gradients")
                flat.use_grads(buf)
                buckets.append(Bucket(k, flat, buf, frozenset(current_units), group, scale))
                current_ps, current_units, nbytes = [], set(), 0
        return buckets

    # ---- hooks --------------------------------------------------------------------------
    def _backward_pre(self, unit: str) -> None:
        if unit != ROOT:
            return
        # the first unit of a backward pass: start counting finished units
        self._done, self._next_bucket = set(), 0
        self._check_views()

    def _check_views(self) -> None:
        for b in self.buckets:
            detached = b.flat.detached_grads()
            if detached:
                raise RuntimeError(
                    f"rank {current().rank}: the gradients of {detached[:4]} are no longer "
                    f"views of DDP's bucket {b.index}; something replaced or freed them "
                    "(model.zero_grad(), an optimizer's zero_grad()?). Call engine.zero_grad()")

    def _backward_post(self, unit: str) -> None:
        self._done.add(unit)
        if not self._sync:
            self._unsynced = True
            return
        while (self._next_bucket < len(self.buckets)
               and self.buckets[self._next_bucket].units <= self._done):
            self.buckets[self._next_bucket].launched_after = unit
            self._launch(self.buckets[self._next_bucket])
            self._next_bucket += 1
        if unit == ROOT:  # the end of the backward: wait for every bucket
            if self._next_bucket < len(self.buckets):
                self._never_launched()
            self._wait_reductions()
            self._unsynced = False

    def _never_launched(self) -> None:
        """The backward ended with buckets never launched: some unit ran no backward, so
        its parameters took no part in the loss, and those buckets (and the ones after
        them, launched in order) would stay unreduced on this rank while the others reduce
        or wait. PyTorch's DDP refuses the same at the next iteration (find_unused_parameters)."""
        left = self.buckets[self._next_bucket:]
        unused = sorted(set().union(*(b.units for b in left)) - self._done)
        raise RuntimeError(
            f"rank {current().rank}: the backward ended, but DDP's bucket {left[0].index} "
            f"never fired: unit(s) {unused} ran no backward, so their parameters were not "
            f"used in producing the loss, and {len(left)} of the {len(self.buckets)} "
            "buckets (launched in order) were never averaged: the replicas would drift "
            "apart, or the ranks that used them would wait. Use every parameter in every "
            "forward on every rank, or leave the unused ones out of the model (PyTorch's "
            "DDP refuses this too, unless built with find_unused_parameters=True)")

    def _launch(self, b: Bucket) -> None:
        b.launched = True
        if b.group.size > 1:
            b.work = all_reduce(b.buffer, "avg", group=b.group, async_op=True)

    def finish_grad_sync(self) -> None:
        """Launch every bucket not launched since the last backward began (none if no
        backward ran since the last reduction), then wait."""
        self._check_views()
        if self._done:
            for b in self.buckets[self._next_bucket:]:
                self._launch(b)
        self._wait_reductions()
        self._done, self._next_bucket = set(), 0
        self._unsynced = False

    def _wait_reductions(self) -> None:
        for b in self.buckets:
            if b.work is not None:
                np.copyto(b.buffer, b.work.wait())  # the average, into the bucket
                b.work = None
            if b.launched and b.scale != 1.0:  # experts: 1/ep, even on a group of one
                b.buffer *= np.asarray(b.scale, dtype=b.buffer.dtype)
            b.launched = False

    # ---- gradients and state ----------------------------------------------------------------
    def zero_grad(self) -> None:
        """Zero the buckets in place (the gradients stay views of them)."""
        self._wait_reductions()
        for b in self.buckets:
            b.buffer.fill(0)
        self._done, self._next_bucket = set(), 0
        self._unsynced = False

    def _owned_grads(self) -> list[np.ndarray]:
        return [self._grad_of[piece.key] for piece in self.optimizer.pieces]

    def full_grads(self) -> dict[str, np.ndarray]:
        self._wait_reductions()
        return {name: v.reshape(self.param_shapes[name]).copy()
                for name, v in self._grad_of.items()}

    def _check_no_expert_parallelism(self, what: str) -> None:
        e = self.experts
        if e is not None and e.expert_group.size > 1:
            raise ValueError(f"rank {current().rank}: {what} of a model whose experts are "
                             f"spread over an expert-parallel group ({e.expert_group}) is not "
                             f"written yet: this rank holds only its own experts. Save the "
                             f"model at ep = 1")

    def _full_values(self):
        self._check_no_expert_parallelism("the full state")
        params = {p.name: p.data.copy() for _, ps in self.units for p in ps}
        states = {}
        for i, piece in enumerate(self.optimizer.pieces):
            shape = self.param_shapes[piece.key]
            states[piece.key] = {k: a.reshape(shape).copy()
                                 for k, a in self.optimizer.state_arrays(i).items()}
        return params, states

    def _load_values(self, params, states) -> None:
        for _, ps in self.units:
            for p in ps:
                p.data[...] = params[p.name]
        for i, piece in enumerate(self.optimizer.pieces):
            for k, arr in self.optimizer.state_arrays(i).items():
                np.copyto(arr, states[piece.key][k].reshape(-1), casting="same_kind")

    def local_state(self) -> LocalState:
        """Every unit whole (one shard of one), replicated over the group; the weights and
        moments laid out as a FlatParameter of world 1 (no padding), so copies."""
        self._check_no_expert_parallelism("a sharded checkpoint")
        moments = {piece.key: self.optimizer.state_arrays(i)
                   for i, piece in enumerate(self.optimizer.pieces)}
        units = []
        for unit, ps in self.units:
            flat = FlatParameter(unit, ps, 1)
            arrays = {"param": flat.flatten()}  # [numel]
            for kind in moments[ps[0].name]:
                arrays[kind] = np.concatenate([moments[p.name][kind] for p in ps])
            units.append(FlatShard(flat, arrays))
        return LocalState(units, None, self.group if self.group.size > 1 else None, self.steps)
