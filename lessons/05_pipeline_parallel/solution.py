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
    # BEGIN SOLUTION Exercise 5.1: the 1F1B schedule generator — see lesson.py, section 3
    m = microbatches
    ranks = []
    for r in range(pp):
        warmup = min(pp - r - 1, m)  # Megatron: p - r - 1 forwards before the first B
        row = [Action(r, F, i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: one forward, one backward
            row += [Action(r, F, warmup + i), Action(r, B, i)]
        row += [Action(r, B, i) for i in range(m - warmup, m)]  # cool-down
        ranks.append(row)
    return ranks
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 5.2: a pipeline rank's schedule run with send/recv — see lesson.py, section 4
    r, p = mp.get_rank(group), mp.get_world_size(group)
    prev = group.ranks[r - 1] if r > 0 else None  # global ranks of my neighbours
    nxt = group.ranks[r + 1] if r + 1 < p else None
    pending = []  # isends: waited once the list has run (the lowering's contract)
    for a in actions:
        i = a.microbatch
        if a.kind == F:
            x = mp.recv(prev, group=group) if prev is not None else None  # x: [b, h]
            y = stage.forward(i, x)
            if nxt is not None:
                pending.append(mp.isend(y, nxt, group=group))
        else:
            dy = mp.recv(nxt, group=group) if nxt is not None else None  # dy: [b, h]
            dx = stage.backward(i, dy)
            if prev is not None:
                pending.append(mp.isend(dx, prev, group=group))
    for work in pending:
        work.wait()
    # END SOLUTION


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
    # BEGIN SOLUTION Exercise 5.3: micro-batches and chunks within a bubble and a memory budget — see lesson.py, section 8
    s, h, a = cfg.seq_len, cfg.hidden, cfg.num_heads
    per_sequence = activation_bytes_per_layer(  # one layer, one sequence (lesson 00)
        s, 1, h, a, act_bytes=cfg.np_dtype.itemsize, dropout=cfg.dropout > 0)
    for v in range(1, cfg.num_layers // pp + 1):  # fewest chunks first: v x the messages
        name = "1f1b" if v == 1 else "interleaved_1f1b"
        for m in range(1, global_batch + 1):  # fewest micro-batches first: larger kernels
            if global_batch % m or (v > 1 and m % pp):
                continue  # micro-batches of whole sequences; Megatron's m % p == 0
            d = dry_run(lower(schedule(name, pp, m, v)),
                        {"F": Fraction(1, v), "B": Fraction(2, v)})  # equal stages
            blocks = [hi - lo for lo, hi in split_layers(cfg.num_layers, pp * v)]
            peak = max(  # (chunk, micro-batch) pairs in flight x the largest chunk's blocks
                d.peak_in_flight[r] * max(blocks[r::pp]) for r in range(pp))
            # 15 % for what Table 2 does not count: the embedding's output, the logits
            estimate = 1.15 * peak * per_sequence * (global_batch // m)
            if d.bubble_over_ideal <= bubble_target and estimate <= activation_cap:
                return {"schedule": name, "microbatches": m, "chunks": v}
    raise ValueError(f"no 1F1B or interleaved plan of {pp} ranks meets a bubble of "
                     f"{bubble_target:.0%} within {activation_cap:.3g} bytes a GPU")
    # END SOLUTION
