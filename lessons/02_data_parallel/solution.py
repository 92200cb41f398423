"""Lesson 02 — data parallelism: the exercises' answers.

Models are minipar GPTs (`minipar.nn.GPT`): `model.parameters()` lists every parameter
once, `p.grad` is its accumulated gradient (same shape as `p.data`), and
`model.loss_and_grad(ids, targets, loss_scale=c)` runs forward and backward on one
[s, b] batch and adds the gradient of c · (mean loss of the batch) into every `p.grad`.
"""

from __future__ import annotations

import contextlib
from typing import Collection, Optional, Sequence

import numpy as np

import minipar as mp
from minipar.optim import AdamW
from minipar.parallel import DistributedDataParallel


def all_reduce_gradients(model, group: Optional[mp.ProcessGroup] = None) -> None:
    """p.grad ← the mean of p.grad over the ranks of `group`, for every parameter.

    Naive data parallelism (lesson.py, section 2): every rank of `group` (default: the
    whole world) calls this after its backward and before the optimizer step, with the
    gradient of its own shard of the batch in each `p.grad`. Afterwards every rank of the
    group holds, in `p.grad` (in place, or a new array of the same shape and dtype), the
    gradient one device would compute on the group's whole batch. Other groups may be
    doing the same at the same moment with their own batches.
    """
    # BEGIN SOLUTION Exercise 2.1: average every parameter's gradient over the group — see lesson.py, section 2
    for p in model.parameters():
        p.grad[...] = mp.all_reduce(p.grad, "avg", group=group)  # p.grad: p's full shape
    # END SOLUTION


def make_buckets(sizes_bytes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """buckets = the lists of parameter indices DistributedDataParallel groups for cap_bytes.

    sizes_bytes[i] is the size in bytes of parameter i's gradient, the parameters listed
    unit by unit as `model.units()` lists them (root first, then blocks.0, blocks.1, ...),
    each unit's parameters in its own order. Return the buckets in the order DDP launches
    them, each the list of the parameter indices it holds, in the order they are laid out
    in the bucket. Section 3 of lesson.py gives DDP's rule (mind the parameter that
    crosses the cap); `DistributedDataParallel(GPT(cfg), bucket_cap_mb=...).buckets`
    shows what it builds for a real model.
    """
    # BEGIN SOLUTION Exercise 2.2: DDP's bucket assignment — see lesson.py, section 3
    buckets: list[list[int]] = []
    current, nbytes = [], 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        nbytes += sizes_bytes[i]
        if nbytes >= cap_bytes:  # at least the cap: close it
            buckets.append(current)
            current, nbytes = [], 0
    if current:
        buckets.append(current)
    return buckets
    # END SOLUTION


def launch_after(bucket_units: Sequence[Collection[str]],
                 backward_order: Sequence[str]) -> list[str]:
    """launch[j] = the unit at whose backward_post DDP launches bucket j's all-reduce.

    bucket_units[j]: the names of the units whose gradients bucket j holds (buckets in
    launch order, as DDP's `bucket.units`); backward_order: every unit name in the order
    their `backward_post` hooks fire (for a GPT: blocks.L-1, ..., blocks.0, root; any
    names, in any order, in general). Return one unit name per bucket, by DDP's rule in
    lesson.py, section 3: ask what must hold of the bucket, and of the buckets ahead of
    it, at the moment it may go out.
    """
    # BEGIN SOLUTION Exercise 2.3: the backward_post at which each bucket is launched — see lesson.py, section 3
    position = {unit: i for i, unit in enumerate(backward_order)}
    launched, last = [], 0
    for units in bucket_units:
        last = max([last] + [position[u] for u in units])  # buckets go out in order
        launched.append(backward_order[last])
    return launched
    # END SOLUTION


def accumulate(model, micro_batches: Sequence[tuple[np.ndarray, np.ndarray]],
               engine=None) -> float:
    """∇ accumulated = ∇L and the return value = L, L the mean loss of every sequence given.

    micro_batches: [(ids, targets)], each pair [s, n_i] with the same s and any n_i >= 1.
    Run forward and backward on every micro-batch so that the gradients the model
    accumulates are exactly those of one backward on the whole batch, and return that
    batch's mean loss L. Lesson.py, section 5, shows the trap; section 1 what changes when
    the pieces are not of equal size.

    engine: None on one device; otherwise a data-parallel engine (DistributedDataParallel)
    wrapping `model`: then the step may cost one all-reduce per bucket, however many
    micro-batches there are (section 5 says how).
    """
    # BEGIN SOLUTION Exercise 2.4: gradient accumulation with the right loss scale — see lesson.py, section 5
    n = sum(x.shape[1] for x, _ in micro_batches)
    k = len(micro_batches)
    loss = 0.0
    for i, (x, y) in enumerate(micro_batches):  # x, y: [s, n_i]
        share = x.shape[1] / n  # 1/k when the micro-batches are equal
        quiet = engine is not None and i < k - 1
        with engine.no_sync() if quiet else contextlib.nullcontext():
            loss += share * model.loss_and_grad(x, y, loss_scale=share)
    return loss
    # END SOLUTION


def budgeted_step(model, ids: np.ndarray, targets: np.ndarray, group: mp.ProcessGroup,
                  max_sequences: int) -> None:
    """p.grad ← ∇ of the group's whole-batch loss, within section 6's memory and time budgets.

    model: a float64 GPT, built the same way on every rank of `group` (the data-parallel
    group; other groups run their own step beside it); ids, targets: [s, b], this rank's
    share of the group's batch. Afterwards every `p.grad` of `model` must hold the
    gradient of the mean loss over all the sequences of all the ranks of the group, the
    same on each of them. The grader runs it on section 6's simulated node and checks
    two budgets: the ledger may never hold the activations of more than `max_sequences`
    sequences at once, and the step, from its first forward to its last event, may last
    at most lesson.py's EXPOSED_BUDGET longer than its compute alone. How is yours to
    choose (section 6 names the levers); take no optimizer step.
    """
    # BEGIN SOLUTION Exercise 2.5: one step under a memory and a time budget — see lesson.py, section 6
    blocks = [ps for unit, ps in model.units() if unit != "root"]
    cap = max(sum(p.data.nbytes for p in ps) for ps in blocks)  # one bucket per block
    engine = DistributedDataParallel(model, AdamW, process_group=group,
                                     bucket_cap_mb=cap / 2**20)
    b = ids.shape[1]
    last = min(b, max_sequences)  # the last micro-batch as large as memory allows:
    edges = [*range(0, b - last, max_sequences), b - last, b]  # its backward hides buckets
    micro = [(ids[:, a:e], targets[:, a:e]) for a, e in zip(edges, edges[1:])]  # [s, n_i]
    accumulate(model, micro, engine)
    # END SOLUTION
