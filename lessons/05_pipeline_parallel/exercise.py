# Your file for lesson 05, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 05`.
"""Lesson 05 — pipeline parallelism: the exercises' answers.

Exercise 5.1 writes a schedule: plain data, one list of compute actions per pipeline rank
(`Action(stage, kind, microbatch)`, written `2F0` as torch.distributed.pipelining writes
it). Exercise 5.2 runs one rank's list with point-to-point messages in the pipeline group
(SPMD, like a Megatron or torch pipeline rank): the grader runs it on a 2-D mesh and
passes your pipeline group as `group`, so p = `group`'s size and r = this rank's *group
rank* (`mp.get_rank(group)`), and `group.ranks[r]` is the global rank send/recv take.
Exercise 5.3 is a design exercise: it returns a plan, which the grader runs.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Optional

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel.pp import B, F, Action, dry_run, lower, schedule, split_layers
from minipar.plan import activation_bytes_per_layer


def one_f_one_b(pp: int, microbatches: int) -> list[list[Action]]:
    """PipeDream-Flush (1F1B): for each rank r of p, the compute actions of stage r, in
    order, with at most min(p - r, m) micro-batches in flight and GPipe's bubble (p - 1)/m
    (lesson section 3).

    pp: p ranks, rank r holding stage r; microbatches: m >= 1 (m < p too). Returns p lists;
    rank r's holds Action(r, F, i) and Action(r, B, i) for every micro-batch i.
    """
    raise NotImplementedError("Exercise 5.1: the 1F1B schedule generator — see lesson.py, section 3")


def run_pipeline_rank(stage, actions: list[Action],
                      group: Optional[mp.ProcessGroup] = None) -> None:
    """Run this rank's compute actions in order, moving activations and gradients with
    point-to-point messages in `group` (lesson section 4).

    stage: this rank's stage, stage r = the group rank r of p:
        stage.forward(i, x) -> y     x: micro-batch i's input activations [b, h]; on the
                                     first stage pass x=None (it reads micro-batch i
                                     itself); y goes to the next stage (on the last stage
                                     y is the loss: keep it, send nothing)
        stage.backward(i, dy) -> dx  dy: the gradient of micro-batch i's output [b, h]; on
                                     the last stage pass dy=None (it starts from the loss);
                                     dx goes to the previous stage (the first stage's is None)
    actions: this rank's Action(r, F, i) / Action(r, B, i), in the order to run them (a
    GPipe or 1F1B schedule). The grader sends with rendezvous semantics, as NCCL does:
    a blocking mp.send returns only once its receiver has posted the recv.
    """
    raise NotImplementedError("Exercise 5.2: a pipeline rank's schedule run with send/recv — see lesson.py, section 4")


def choose_pipeline(cfg: GPTConfig, pp: int, global_batch: int, bubble_target: float,
                    activation_cap: float) -> dict:
    """A pipeline plan for training `cfg` over pp ranks on `global_batch` sequences a step,
    whose bubble (idle over ideal time, equal stages) is at most bubble_target and whose
    peak activation bytes per GPU are at most activation_cap (lesson section 8).

    Returns {"schedule": "gpipe" | "1f1b" | "interleaved_1f1b", "microbatches": m,
    "chunks": v}. The grader times the schedule with the dry run (equal stages) and trains
    one step with `parallelize(cfg, ParallelDims(pp=pp), ...)` on simulated devices: the
    ledger's activation peak on every rank, and one device's loss.
    """
    raise NotImplementedError("Exercise 5.3: micro-batches and chunks within a bubble and a memory budget — see lesson.py, section 8")
