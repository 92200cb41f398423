"""The runner: one rank's lowered schedule executed with isend/irecv in the pipeline group.

    runner = PipelineRunner(stages, schedule("1f1b", pp, m), group=pp_group)
    loss = runner.step(ids, targets)   # one global batch [s, B]: m micro-batches [s, B/m]
    optimizer.step()                   # over runner.parameters(); then runner.zero_grad()

Each rank runs its own list of lower(actions) in order (lowering.py's contract):

    RECV_F, RECV_B   irecv from the peer stage's rank, waited at once (a pair's RECV_B:
                     when its B half starts)
    F  (sF i)        stage s's forward of micro-batch i: its input is the RECV'd tensor,
                     the previous stage's output if that stage is on this rank, or (s = 0)
                     the micro-batch's ids; the last stage computes the micro-batch's loss
    B  (sB i)        stage s's backward of micro-batch i from the RECV'd gradient (the last
                     stage from the loss scaled by 1/m, so the accumulated gradient is the
                     gradient of the mean loss over the m micro-batches)
    I  (sI i)        the backward split (zero-bubble schedules): B's input gradient only,
                     what SEND_B carries to the previous stage; the weights' gradients
                     wait in the stage's WeightGradStore for micro-batch i
    W  (sW i)        those weight gradients, accumulated: only after a parameter's last W
                     is its gradient complete
    (sF i; tB j)     an overlapped pair (DualPipe): its forward, then its backward (B or
                     I), on the one compute stream, their p2p on the p2p stream: the F
                     half's SEND_F is posted the moment the F half ends, so the
                     activations travel while the B half computes, and the B half's
                     RECV_B, posted with the pair's receives, is waited only when the B
                     half starts, so the gradient travels while the F half computes
                     (lowering.py's pair_overlap; the dry run without "F&B" times it so).
                     Not overlapped: the two halves' compute (one stream), and the
                     experts' all-to-all DualPipe was built to hide (this model has no
                     all-to-all yet; the dry run's t_F&B stands for it)
    SEND_F, SEND_B   isend to the peer stage's rank; every send is waited at the end
                     of the list

Before anything communicates, `check_deadlock` (dry_run.py) proves the lists finish. After
the last backward (the last W of a split schedule: every gradient is complete only once
the whole list has run), with tied embeddings on two ranks, the first and last stages' copies of
wte's gradient are summed over the embedding group (Megatron-LM's `_allreduce_embedding_
grads` over its embedding group: the first and last pipeline ranks), so both copies take
the same optimizer step. Then `grads_ready()` is called: the place where a data-parallel
engine reduces the gradients accumulated over the micro-batches, or an optimizer steps.

With data parallelism (parallel/mesh composes it; this module knows no engine), two more
things are handed in, as Megatron-LM's schedules take `no_sync_func` and
`finalize_model_grads_func`: `no_sync`, a context the whole list runs inside, so no
micro-batch's backward reduces anything, and `grads_ready`, which then reduces each
gradient once (the engine's finish_grad_sync). `batch_shard = (d, dp)`: the global batch
is cut into the m global micro-batches first, and this rank runs block d of dp of each
([s, B/m] -> [s, B/(m·dp)]); the dropout stream counts the global micro-batch's draws,
and the model slices its masks to its block (TensorParallelGPT's batch_shard), so the
masks are those of one device running the m global micro-batches in order.

Records. Every F, B, I and W appears in this rank's trace as one "compute" event drawn
around the kernels it ran (name "F", "B", "I" or "W", label "2F0", meta: stage, kind,
micro-batch, the ledger's activation bytes after it); its flops are 0, so FLOP counts,
which sum the kernels, stay right (a sum of compute durations must pick one of the two: kernels or
actions). The ledger holds each in-flight micro-batch's activations: its
forward's `Saved` records, charged at F and released at B; split, what only I reads is
released at I, and W's records (nn/weight_grads.py) at W. `last_step` holds the times.
Dropout masks are the single device's (stage.py's DropoutStream).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional, Sequence

import numpy as np

from ...data.batches import split_data_parallel, split_microbatches
from ...runtime.collectives import all_reduce, new_group
from ...runtime.context import current
from ...runtime.faults import fault_point
from ...runtime.group import ProcessGroup
from ...runtime.p2p import irecv, isend
from ...runtime.trace import Event
from .actions import (B, F, RECV_B, RECV_F, SEND_B, SEND_F, W, OverlapFB, Schedule,
                      ScheduleError, by_content)
from .dry_run import check_deadlock
from .lowering import lower, pair_overlap
from .stage import DropoutStream, PipelineStage
from .validate import ScheduleInfo, validate_schedule


@dataclass(frozen=True)
class StepTimes:
    """Simulated seconds of one step on this rank."""

    start: float        # the compute stream when step() began
    schedule_end: float  # the list done and every send waited (what dry_run predicts)
    end: float          # after the embedding all-reduce and grads_ready()


@by_content()
def _prepared(actions: Schedule) -> tuple[Schedule, ScheduleInfo, list[list]]:
    """(the lowered lists, their ScheduleInfo, each action's Message per rank), checked
    before anything communicates: valid, and no hang (check_deadlock). Once per schedule,
    not once per rank: the runner only reads them."""
    lowered = actions if any(a.is_communication for row in actions for a in row) \
        else lower(actions)
    info = validate_schedule(lowered)
    return lowered, info, check_deadlock(lowered, info)


class PipelineRunner:
    """Runs this rank's part of `actions` (compute actions for every pipeline rank, or
    their lowering) on `stages`, this rank's PipelineStages.

    group: the pipeline group (default: the world); pipeline rank r is its r-th member.
    embedding_group: the group summing tied wte gradients (default: the group of the ranks
    holding the first and last stages). grads_ready: called after each step's backward.
    no_sync: a context manager factory the step's list runs inside (a data-parallel
    engine's no_sync). batch_shard: (d, dp), this rank's block of each micro-batch;
    sequence_shard(ids, targets) -> (ids, targets): this rank's rows of that block, when
    another form splits the sequence (context parallelism: the mesh passes it)."""

    def __init__(self, stages: Sequence[PipelineStage], actions: Schedule,
                 group: Optional[ProcessGroup] = None, *,
                 embedding_group: Optional[ProcessGroup] = None,
                 grads_ready: Optional[Callable[[], None]] = None,
                 no_sync: Optional[Callable[[], ContextManager]] = None,
                 batch_shard: tuple[int, int] = (0, 1),
                 sequence_shard: Optional[Callable] = None):
        ctx = current()
        self.group = ctx.world if group is None else group
        self.pp_rank = self.group.group_rank(ctx.rank)
        if len(actions) != self.group.size:
            raise ScheduleError(f"the schedule has {len(actions)} ranks' lists but the "
                                f"pipeline group {self.group} has {self.group.size} ranks")
        lowered, self.info, messages = _prepared(actions)
        self._messages = messages[self.pp_rank]
        self.actions = lowered[self.pp_rank]
        self.stages = {st.index: st for st in stages}
        want = self.info.stages_of(self.pp_rank)
        if sorted(self.stages) != want or any(st.num_stages != self.info.stages
                                              for st in stages):
            raise ScheduleError(
                f"pipeline rank {self.pp_rank} runs stages {want} of {self.info.stages} in "
                f"this schedule, but was given {[repr(st) for st in stages]}: build them "
                f"with build_stages(model, info.placement, {self.pp_rank})")
        self.grads_ready, self.no_sync = grads_ready, no_sync
        index, count = batch_shard
        if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
            raise ScheduleError(f"batch_shard is (index, count) with 0 <= index < count: this "
                                f"rank's block of each micro-batch; got {batch_shard!r}")
        self.batch_shard = (index, count)
        self.sequence_shard = sequence_shard
        for st in stages:
            if count > 1 and st.model.cfg.dropout > 0 and \
                    tuple(getattr(st.model, "batch_shard", (0, 1))) != self.batch_shard:
                raise ScheduleError(
                    f"this rank runs block {index} of {count} of each micro-batch, so with "
                    f"dropout on its model must draw that block of the global micro-batch's "
                    f"masks: build it with batch_shard={self.batch_shard} (TensorParallelGPT"
                    f"; parallel.mesh.parallelize does), got "
                    f"{getattr(st.model, 'batch_shard', None)}")
        self.embedding_group = embedding_group or self._embedding_group()
        self.losses: list[float] = []
        self.last_step: Optional[StepTimes] = None

    def _embedding_group(self) -> Optional[ProcessGroup]:
        """The first and last stages' ranks when the embeddings are tied and they differ."""
        where, S = self.info.placement, self.info.stages
        model = next(iter(self.stages.values())).model
        if not model.cfg.tie_embeddings or where[0] == where[S - 1]:
            return None
        ranks = [self.group.ranks[where[0]], self.group.ranks[where[S - 1]]]
        return new_group(ranks, f"embedding/{self.group.name}")

    @property
    def loss_rank(self) -> int:
        """The pipeline rank holding the last stage, whose step() returns the loss (the
        last rank for the 1F1B family; rank 0 in a V)."""
        return self.info.placement[self.info.stages - 1]

    def parameters(self) -> list:
        """This rank's parameters, each once (stage order): what its optimizer steps."""
        out, seen = [], set()
        for s in sorted(self.stages):
            for p in self.stages[s].parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.free_grad()

    # ---- one step -------------------------------------------------------------------------
    def step(self, ids: np.ndarray, targets: np.ndarray) -> Optional[float]:
        """Forward and backward of the global batch ids, targets: int [s, B] (the same on
        every rank), cut into m micro-batches (and each into its batch_shard block);
        gradients accumulate in the parameters. Returns the mean micro-batch loss (of this
        rank's blocks) on the rank holding the last stage, else None."""
        ctx = current()
        m, S = self.info.microbatches, self.info.stages
        micro = split_microbatches(ids, targets, m)  # m x ([s, B/m], [s, B/m])
        seq, b = micro[0][0].shape  # the global micro-batch: what dropout draws over
        if self.batch_shard[1] > 1:
            micro = [split_data_parallel(x, y, *self.batch_shard)  # [s, B/(m·dp)]
                     for x, y in micro]
        if self.sequence_shard is not None:
            micro = [self.sequence_shard(x, y) for x, y in micro]  # [s/cp, B/(m·dp)]
        streams = {id(st.model): DropoutStream(st.model.dropout_generator, st.model.cfg,
                                               seq, b, m) for st in self.stages.values()}
        pending: list = []   # the isends' Works, waited at the end of the list
        losses: dict = {}    # micro-batch -> its loss (the last stage)
        start = ctx.clock.compute
        with self.no_sync() if self.no_sync is not None else contextlib.nullcontext():
            self._run(micro, streams, losses, pending)
        for work in pending:
            work.wait()
        schedule_end = ctx.clock.compute
        self._allreduce_embedding_grads()
        for stream in streams.values():
            stream.finish()
        if self.grads_ready is not None:
            self.grads_ready()
        self.last_step = StepTimes(start, schedule_end, ctx.clock.compute)
        self.losses = [losses[i] for i in sorted(losses)]
        return float(np.mean(self.losses)) if S - 1 in self.stages else None

    def _run(self, micro: list, streams: dict, losses: dict, pending: list) -> None:
        """This rank's lowered list, action by action (the module docstring's table)."""
        inputs: dict = {}    # (stage, i) -> its input activations [s, b, h]
        grads: dict = {}     # (stage, i) -> the gradient of its output [s, b, h]
        outgoing: dict = {}  # (stage, i, kind) -> the tensor a SEND moves
        tensors = (inputs, grads, outgoing)
        pairs = pair_overlap(self.actions)  # a pair -> its RECV_B, SEND_F timed per half
        by_half = {q: k for k, ends in pairs.items() for q in ends if q is not None}
        posted: dict = {}    # position of a pair's RECV_B -> its irecv's Work
        for pos, (item, msg) in enumerate(zip(self.actions, self._messages)):
            if item.is_communication:
                if item.kind is RECV_F or item.kind is RECV_B:
                    work = irecv(self.group.ranks[msg.src], self.group, msg.tag)
                    if pos in by_half:  # waited when its pair's B half starts
                        posted[pos] = work
                    else:
                        self._received(item, work, tensors)
                elif pos not in by_half:  # else sent when its pair's F half ended
                    self._send(item, msg, outgoing, pending)
                continue
            if pos not in pairs:
                self._compute(item, micro, streams, losses, tensors, None)
                continue
            recv, send = pairs[pos]
            self._compute(item.forward, micro, streams, losses, tensors, item)
            if send is not None:
                self._send(self.actions[send], self._messages[send], outgoing, pending)
            if recv is not None:
                self._received(self.actions[recv], posted.pop(recv), tensors)
            self._compute(item.backward, micro, streams, losses, tensors, item)

    def _received(self, a, work, tensors: tuple) -> None:
        """Wait for a RECV's message: the input activations or the output's gradient."""
        inputs, grads, _ = tensors
        x = work.wait()  # x: [s, b, h]
        (inputs if a.kind is RECV_F else grads)[(a.stage, a.microbatch)] = x

    def _send(self, a, msg, outgoing: dict, pending: list) -> None:
        """isend what a SEND moves; its Work is waited at the end of the list."""
        x = outgoing.pop((a.stage, a.microbatch, a.kind))
        pending.append(isend(x, self.group.ranks[msg.dst], self.group, msg.tag,
                             meta={"message": str(a), "stage": a.stage,
                                   "microbatch": a.microbatch}))

    def _compute(self, a, micro: list, streams: dict, losses: dict, tensors: tuple,
                 pair: Optional[OverlapFB]) -> None:
        """One F, B, I or W; its input from `tensors`, its output into them."""
        inputs, grads, outgoing = tensors
        fault_point(str(a))  # a fault planned at this action fires before it computes
        key, stage = (a.stage, a.microbatch), self.stages[a.stage]
        if a.kind is F:
            x, y = micro[a.microbatch]
            rng = self._rng(streams, stage, a.microbatch)
            out = self._timed(a, lambda: stage.forward(
                a.microbatch, x if stage.is_first else inputs.pop(key), y, rng), pair)
            self._check_draws(streams, stage, a.microbatch, rng)
            if stage.is_last:
                losses[a.microbatch] = out
            elif a.stage + 1 in self.stages:
                inputs[(a.stage + 1, a.microbatch)] = out  # same rank: in memory
            else:
                outgoing[(a.stage, a.microbatch, SEND_F)] = out
        elif a.kind is W:
            self._timed(a, lambda: stage.backward_weight(a.microbatch), pair)
        else:  # B or I
            run = stage.backward if a.kind is B else stage.backward_input
            dy = None if stage.is_last else grads.pop(key)
            m = self.info.microbatches
            dx = self._timed(a, lambda: run(a.microbatch, dy, 1.0 / m), pair)
            if a.stage > 0 and a.stage - 1 in self.stages:
                grads[(a.stage - 1, a.microbatch)] = dx
            elif a.stage > 0:
                outgoing[(a.stage, a.microbatch, SEND_B)] = dx

    def _rng(self, streams: dict, stage: PipelineStage, i: int) -> np.random.Generator:
        stream = streams[id(stage.model)]
        return stream.at(stream.position(i, stage.lo, stage.is_first))

    def _check_draws(self, streams: dict, stage: PipelineStage, i: int, rng) -> None:
        """The generator must stand where the next stage's forward starts (stage.py)."""
        stream = streams[id(stage.model)]
        drawn = (stage.hi - stage.lo) * stream.block + (stream.embed if stage.is_first else 0)
        want = stream.at(stream.position(i, stage.lo, stage.is_first) + drawn)
        if rng.bit_generator.state != want.bit_generator.state:
            raise RuntimeError(
                f"stage {stage.index}'s forward of micro-batch {i} drew another number of "
                f"dropout values than {stream.embed} per embedding and {stream.block} per "
                f"block (stage.dropout_draws): a layer that draws from the generator must "
                f"have its draws counted there, or the pipeline's masks would not be one "
                f"device's")

    def _timed(self, a, run, pair: Optional[OverlapFB] = None):
        """Run one F, B, I or W and record it in the trace with its stage and micro-batch
        (and, inside an overlapped pair, the pair)."""
        ctx = current()
        begin = ctx.clock.compute
        out = run()
        meta = {"action": str(a), "stage": a.stage, "kind": a.kind.value,
                "microbatch": a.microbatch, "pipeline_rank": self.pp_rank,
                "activations": ctx.ledger.held("activations")}
        if pair is not None:
            meta["pair"] = str(pair)
        ctx.trace.record(Event(ctx.rank, "compute", a.kind.value, begin, ctx.clock.compute,
                               label=str(a), meta=meta))
        return out

    def _allreduce_embedding_grads(self) -> None:
        """Tied embeddings: wte's gradient summed over the first and last stages' copies."""
        if self.embedding_group is None:
            return
        stage = self.stages.get(0) or self.stages.get(self.info.stages - 1)
        if stage is None:
            return  # a middle rank: not in the embedding group
        w = stage.model.wte.weight
        grad = w.grad if w.grad is not None else np.zeros_like(w.data)
        total = all_reduce(grad, "sum", group=self.embedding_group)  # total: [V, h]
        if w.grad is None:
            w.accumulate(total)
        else:
            w.grad[...] = total
