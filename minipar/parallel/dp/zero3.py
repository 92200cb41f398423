"""ZeRO stage 3 (= FSDP FULL_SHARD): parameters partitioned too, gathered only while needed.

ZeRO (Rajbhandari et al. 2020, section 5.3) and PyTorch FSDP (Zhao et al. 2023, sections
3-4). Between steps rank r keeps only shard r of each unit's weights, gradient and optimizer
states: 2Psi'/N + 2Psi'/N + 12Psi'/N = 16Psi'/N bytes in bf16 with float32 Adam. Around
each use a unit's weights are all-gathered and freed again:

    forward_pre(u):   w_u = all_gather(w_u shard)           parameters whole for u's forward
    forward_post(u):  free w_u                               (reshard_after_forward)
    backward_pre(u):  w_u = all_gather(w_u shard) again      its backward needs them too
    backward_post(u): s = reduce_scatter(g_u, "avg")[r]; free w_u and g_u
    backward_input_post(u): a split backward's I is done (nn/weight_grads.py): free w_u, as
                      W reads no weight; W accumulates into g_u, still whole, and
                      backward_post reduces it after W, when it is complete
    recompute_pre(u): w_u = all_gather(w_u shard)           checkpoint segments only: a
                      segment's backward reruns its blocks' forwards first, so its k
                      blocks are whole together until each one's backward_post

The root unit (embeddings, final LayerNorm, head) is gathered at the start of the forward and
stays whole until the end of the backward, as FSDP's root does: its backward comes right
after its forward, so freeing it in between would only add an all-gather. Traffic per rank
and step:

    forward all-gathers     (N-1)/N Psi'
    backward all-gathers    (N-1)/N (Psi' - Psi'_root)
    reduce-scatters         (N-1)/N Psi'
    total                   3 (N-1)/N Psi' - (N-1)/N Psi'_root     elements

i.e. ZeRO's 3Psi (1.5x DDP's 2Psi) with the root's backward all-gather saved (checkpoint
segments move some backward gathers to recompute_pre, not adding any). With
reshard_after_forward=False units stay whole from their forward to their backward: no
backward all-gathers (2Psi of traffic, like ZeRO-2) for more live memory.

Overlap. `forward_prefetch` issues the next unit's all-gather (async, on the group's
communication stream) when a unit's forward starts; `backward_prefetch` does the same at
each backward_pre for the unit whose backward comes next. The all-gather then runs while
this unit computes, and the next unit's gather is already done (or nearly) when it is
needed. `prefetch_depth` (default 1) is how many units ahead each prefetch reaches: FSDP2's
`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` with several
modules, DeepSpeed's `stage3_prefetch_bucket_size`, and what FSDP without its rate limiter
does implicitly, since its CPU thread issues each unit's all-gather as soon as it reaches
the unit, often many units before the GPU computes it. `limit_all_gathers` bounds how many
non-root units may be whole or in flight at once (True = 2: the one computing and the one
prefetched; an int sets the bound; False: no bound; FSDP's "rate limiter", DeepSpeed's
`stage3_max_live_parameters`): a prefetch that would pass the bound is not issued, and the
unit is gathered when it is needed. The bound caps the peak of gathered parameters; without
it, a deep prefetch holds up to the whole model whole on top of the shards (incident
C, `minipar.programs.incidents.zero3_recompute`).

Under a pipeline (a rank's units are EMBED, blocks and HEAD of its stages; no root) every
unit is gathered around each use: its forward and its backward of every micro-batch, so
2m all-gathers per unit and step (m with reshard_after_forward=False), moving
2m (N-1)/N Psi'_stage elements, where one device's step of m micro-batches would be whole
once. Nothing is kept gathered across micro-batches: that would hold the stage's whole
weights for the whole step, ZeRO-2's weight memory (torch.distributed.pipelining keeps
FSDP units unsharded across micro-batches' backwards for that trade).

Memory is measured after the optimizer step, when every unit is resharded: the formula
above, exactly. During forward and backward, the live gathered buffers come on top (ledger
name `zero:{unit}.gathered`, category parameters; in flight, as comm_buffers).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Union

import numpy as np

from ...optim.adam import AdamW
from ...runtime.collectives import Work, all_gather
from ...runtime.group import ProcessGroup
from .engine import ROOT, ModelParallelNorm
from .zero import UnitState, ZeroEngine


def _limit(limit_all_gathers: Union[bool, int, None]) -> Optional[int]:
    if limit_all_gathers is True:
        return 2
    if limit_all_gathers is False or limit_all_gathers is None:
        return None
    if isinstance(limit_all_gathers, int) and limit_all_gathers >= 1:
        return limit_all_gathers
    raise ValueError(f"limit_all_gathers must be True (2 units), False (no bound) or an int "
                     f">= 1, got {limit_all_gathers!r}")


class Zero3Engine(ZeroEngine):
    """`Zero3Engine(model, AdamW, lr=..., reshard_after_forward=True, forward_prefetch=False,
    backward_prefetch=True, prefetch_depth=1, limit_all_gathers=True, max_grad_norm=None)`.

    process_group and replicate_group as in ZeroEngine (HYBRID_SHARD: shard inside a node,
    replicate across nodes).
    """

    stage = 3

    def __init__(self, model, optimizer_cls: type = AdamW, *,
                 process_group: Optional[ProcessGroup] = None,
                 replicate_group: Optional[ProcessGroup] = None,
                 max_grad_norm: Optional[float] = None, reshard_after_forward: bool = True,
                 forward_prefetch: bool = False, backward_prefetch: bool = True,
                 prefetch_depth: int = 1, limit_all_gathers: Union[bool, int] = True,
                 model_parallel: Optional[ModelParallelNorm] = None, **optimizer_kwargs):
        self.reshard_after_forward = bool(reshard_after_forward)
        self.forward_prefetch = bool(forward_prefetch)
        self.backward_prefetch = bool(backward_prefetch)
        if isinstance(prefetch_depth, bool) or not isinstance(prefetch_depth, int) \
                or prefetch_depth < 1:
            raise ValueError(f"prefetch_depth is how many units ahead a prefetch reaches: an "
                             f"int >= 1 (1: the next unit only), got {prefetch_depth!r}")
        self.prefetch_depth = prefetch_depth
        self.limit_all_gathers = _limit(limit_all_gathers)
        self._gathered: dict[str, np.ndarray] = {}  # unit -> whole weights [padded]
        self._inflight: dict[str, Work] = {}  # unit -> prefetching all-gather
        super().__init__(model, optimizer_cls, stage=3, process_group=process_group,
                         replicate_group=replicate_group, max_grad_norm=max_grad_norm,
                         model_parallel=model_parallel, **optimizer_kwargs)
        names = [name for name, _ in self.units]
        self._forward_order = names  # root, blocks.0, ..., blocks.L-1
        # root, blocks.L-1, ..., blocks.0; a pipeline rank's units (embed, blocks, head of
        # its stages) run their backward in reverse
        self._backward_order = (names[:1] + names[:0:-1] if names[0] == ROOT
                                else names[::-1])

    @staticmethod
    def _stages() -> tuple[int, ...]:
        return (3,)

    def _hooks(self) -> dict:
        return {"forward_pre": self._forward_pre, "forward_post": self._forward_post,
                "backward_pre": self._backward_pre, "backward_post": self._backward_post,
                "recompute_pre": self._recompute_pre,
                "backward_input_post": self._backward_input_post}

    # ---- the weights: a shard, gathered around each use ----------------------------------------
    def _place_parameters(self, u: UnitState) -> None:
        u.param_shard = u.flat.flatten()[u.lo:u.hi].copy()  # [shard]
        self._ledger.hold(f"zero:{u.name}.param_shard", u.param_shard, "parameters")
        u.flat.free_data()  # the full arrays the model was built with are dropped here

    def _owned_weights(self, u: UnitState) -> np.ndarray:
        return u.param_shard

    def _gather(self, u: UnitState) -> None:
        """Make u's weights whole: wait for its prefetch, or all-gather now (blocking)."""
        if u.name in self._gathered:
            return
        work = self._inflight.pop(u.name, None)
        full = work.wait() if work is not None else self._gather_flat(u.param_shard)
        self._ledger.hold(f"zero:{u.name}.gathered", full, "parameters")  # [padded]
        self._gathered[u.name] = full
        u.flat.use_data(full)

    def _prefetch(self, name: str) -> None:
        """Start the all-gather of unit `name` on the communication stream, unless it is
        whole or on its way, or limit_all_gathers would be passed."""
        if name in self._gathered or name in self._inflight or self.n == 1:
            return
        if self.limit_all_gathers is not None and self._live() >= self.limit_all_gathers:
            return
        self._inflight[name] = all_gather(self.state[name].param_shard, group=self.group,
                                          async_op=True)

    def _live(self) -> int:
        """Non-root units whose whole weights exist or are being gathered."""
        return len(({*self._gathered} | {*self._inflight}) - {ROOT})

    def _reshard(self, u: UnitState) -> None:
        if u.name in self._gathered:
            u.flat.free_data()
            self._ledger.release(f"zero:{u.name}.gathered")
            del self._gathered[u.name]

    def _ahead(self, order: list[str], name: str) -> list[str]:
        """The prefetch_depth units that come after `name` in `order`, nearest first."""
        i = order.index(name)
        return order[i + 1:i + 1 + self.prefetch_depth]

    # ---- hooks ---------------------------------------------------------------------------
    def _forward_pre(self, unit: str) -> None:
        self._gather(self.state[unit])
        if self.forward_prefetch:
            for name in self._ahead(self._forward_order, unit):
                self._prefetch(name)

    def _forward_post(self, unit: str) -> None:
        if unit != ROOT and self.reshard_after_forward:
            self._reshard(self.state[unit])

    def _backward_pre(self, unit: str) -> None:
        u = self.state[unit]
        self._gather(u)
        self._open_gradient(u)
        if self.backward_prefetch:
            for name in self._ahead(self._backward_order, unit):
                self._prefetch(name)

    def _recompute_pre(self, unit: str) -> None:
        """A checkpoint segment reruns `unit`'s forward inside the backward (nn/segments.py):
        its weights must be whole again, and stay so until its backward_post."""
        self._gather(self.state[unit])

    def _backward_post(self, unit: str) -> None:
        super()._backward_post(unit)  # reduce-scatter (and, at the root, finish them all)
        self._reshard(self.state[unit])

    def _backward_input_post(self, unit: str) -> None:
        """A split backward's I of `unit` is done: W needs its gradient buffer, not its
        weights (the root stays whole until its backward_post, as ever)."""
        if unit != ROOT:
            self._reshard(self.state[unit])

    # ---- around the step: the shards are the weights ----------------------------------------
    def _before_step(self) -> None:
        """Whole copies left by a forward without backward (or a prefetch still in flight)
        would be stale after the step: wait for them and drop them, so the step updates
        shards nobody is reading."""
        for name, work in list(self._inflight.items()):
            work.wait()
            del self._inflight[name]
        for u in self.state.values():
            self._reshard(u)

    def _after_step(self) -> None:
        """Nothing to gather: the next forward gathers each unit when it needs it."""

    @contextlib.contextmanager
    def summon_full_params(self, writeback: bool = True) -> Iterator[None]:
        """Gather every unit; on exit, keep hand-written values (writeback) and reshard."""
        self._wait_reductions()
        was_whole = set(self._gathered)
        for u in self.state.values():
            self._gather(u)
        try:
            yield
        finally:
            for u in self.state.values():
                if writeback:
                    u.param_shard[...] = self._gathered[u.name][u.lo:u.hi]
                if u.name not in was_whole:
                    self._reshard(u)
            if writeback:
                self.optimizer.refresh_masters()

    # ---- checkpoints ----------------------------------------------------------------------
    def _full_weights(self, u: UnitState) -> np.ndarray:
        return self._gather_flat(u.param_shard)

    def _load_weights(self, u: UnitState, w: np.ndarray) -> None:
        u.param_shard[...] = w[u.lo:u.hi]
        if u.name in self._gathered:
            self._gathered[u.name][...] = w
