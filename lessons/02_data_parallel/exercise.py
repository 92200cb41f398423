# Your file for lesson 02, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 02`.
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


def all_reduce_gradients(model, group: Optional[mp.ProcessGroup] = None) -> None:
    """p.grad ← (1/N) Σ_r p.grad_r for every parameter, over the N ranks of `group`.

    Naive data parallelism: every rank of `group` (default: the whole world) calls this
    after its backward and before the optimizer step, with the gradient of its own shard
    of the batch in each `p.grad`. Afterwards every rank holds the same averaged gradient
    in `p.grad` (in place, or a new array of the same shape and dtype).
    """
    raise NotImplementedError("Exercise 2.1: average every parameter's gradient over the group — see lesson.py, section 2")


def make_buckets(sizes_bytes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """DDP's buckets: the parameters taken in reverse, a bucket closed once it holds >= cap_bytes.

    sizes_bytes[i] is the size in bytes of parameter i's gradient, the parameters listed
    unit by unit as `model.units()` lists them (root first, then blocks.0, blocks.1, ...),
    each unit's parameters in its own order. Return the buckets in the order DDP launches
    them, each the list of the parameter indices it holds, in the order they are laid out
    in the bucket. The rule of `DistributedDataParallel` (minipar/parallel/ddp.py):

    - walk the parameters from the last to the first (the order backward finishes them);
    - add each to the current bucket; as soon as the bucket holds at least cap_bytes it is
      closed (the parameter that reached the cap stays in it) and a new one begins;
    - what is left at the end forms a last, smaller bucket.
    """
    raise NotImplementedError("Exercise 2.2: DDP's bucket assignment — see lesson.py, section 3")


def launch_after(bucket_units: Sequence[Collection[str]],
                 backward_order: Sequence[str]) -> list[str]:
    """launch(j) = the first backward_post after which bucket j's units and buckets 0..j-1 are done.

    bucket_units[j]: the names of the units whose gradients bucket j holds (buckets in
    launch order, as DDP's `bucket.units`); backward_order: every unit name in the order
    their `backward_post` hooks fire (for a GPT: blocks.L-1, ..., blocks.0, root). DDP
    launches bucket j's all-reduce at the `backward_post` of the unit that completes it:
    once every unit it holds has finished its backward and every bucket before it has been
    launched. Return that unit's name for each bucket.
    """
    raise NotImplementedError("Exercise 2.3: the backward_post at which each bucket is launched — see lesson.py, section 3")


def accumulate(model, micro_batches: Sequence[tuple[np.ndarray, np.ndarray]],
               engine=None) -> float:
    """∇L = Σ_i (n_i/n) ∇L_i over micro-batches of n_i sequences; returns L = Σ_i (n_i/n) L_i.

    micro_batches: [(ids, targets)], each pair [s, n_i] with the same s and any n_i >= 1;
    n = Σ_i n_i. L_i is micro-batch i's mean loss, L the mean loss of all n sequences. Run
    forward and backward on every micro-batch so that the gradients the model accumulates
    are exactly ∇L, the gradient of the whole batch, and return L.

    engine: None on one device; otherwise a data-parallel engine (DistributedDataParallel)
    wrapping `model`: then only the last micro-batch may communicate (the others run
    inside `engine.no_sync()`), so the step costs one all-reduce per bucket.
    """
    raise NotImplementedError("Exercise 2.4: gradient accumulation with the right loss scale — see lesson.py, section 5")
