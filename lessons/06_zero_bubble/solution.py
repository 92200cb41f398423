"""Lesson 06 — zero-bubble pipelines and DualPipe: the exercises' answers.

Exercise 6.1 splits an MLP's backward in two: I, the gradient of the input (what the
previous pipeline stage waits for), and W, the weights' gradients (what only the optimizer
waits for). Exercise 6.2 writes the ZB-H1 schedule: plain data, one list of compute actions
per pipeline rank (`Action(stage, kind, microbatch)` with kinds F, I, W, written `2I0` as
torch.distributed.pipelining writes it). Exercise 6.3 is a design exercise: it returns a
plan, which the grader times on the dry run's clock.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from minipar.nn import MLP, matmul
from minipar.nn.gelu import gelu_backward
from minipar.nn.linear import linear_backward_input
from minipar.parallel.pp import F, I, W, Action, ScheduleError, dry_run, lower, schedule


def mlp_backward_input(mlp: MLP, dy: np.ndarray, saved) -> tuple[np.ndarray, tuple]:
    """I of y = fc2(GeLU(fc1(x))): dx = (GeLU'(u) ⊙ (dy · W2)) · W1, and what W needs
    (lesson section 1).

    mlp: the MLP whose forward made `saved`; mlp.fc1.weight.data is W1 [ffn, h],
    mlp.fc2.weight.data W2 [h, ffn]. dy: [..., h], the gradient of the MLP's output.
    saved = (s1, s_act, s2), what mlp.forward kept on the ledger: s1.x the input x [..., h]
    of fc1, s_act.x the GeLU's input u = fc1(x) [..., ffn], s2.x fc2's input g = GeLU(u)
    [..., ffn]. Returns (dx [..., h], kept): kept is whatever you choose to hand to
    mlp_backward_weight, and no more than W needs. Charge no weight-gradient FLOPs here:
    multiply with minipar's matmul (or linear_backward_input), so the clock counts them.
    """
    # BEGIN SOLUTION Exercise 6.1: an MLP's backward split into I and W — see lesson.py, section 1
    s1, s_act, s2 = saved
    dg = linear_backward_input(dy, mlp.fc2.weight.data, mlp.fc2.name)  # dg: [..., ffn]
    du = gelu_backward(dg, s_act)  # du: [..., ffn]; frees u, which W does not need
    dx = linear_backward_input(du, mlp.fc1.weight.data, mlp.fc1.name)  # dx: [..., h]
    return dx, (dy, s2, du, s1)  # each linear's output gradient and saved input
    # END SOLUTION


def mlp_backward_weight(mlp: MLP, kept) -> tuple:
    """W of the MLP: dW2 = dyᵀ·g, db2 = Σ dy, dW1 = duᵀ·x, db1 = Σ du over the tokens, from
    what mlp_backward_input kept; gives the saved inputs back to the ledger once used.

    Returns (dW1 [ffn, h], db1 [ffn], dW2 [h, ffn], db2 [h]), equal bit for bit to what the
    fused mlp.backward accumulates: multiply [N, ·] token matrices (N tokens) with matmul.
    """
    # BEGIN SOLUTION Exercise 6.1: an MLP's backward split into I and W — see lesson.py, section 1
    dy, s2, du, s1 = kept
    dy2 = dy.reshape(-1, dy.shape[-1])  # dy2: [N, h]
    g2 = s2.x.reshape(-1, s2.x.shape[-1])  # g2: [N, ffn]
    du2 = du.reshape(-1, du.shape[-1])  # du2: [N, ffn]
    x2 = s1.x.reshape(-1, s1.x.shape[-1])  # x2: [N, h]
    dw2 = matmul(dy2.T, g2, label=f"{mlp.fc2.name}.wgrad")  # dw2: [h, ffn]
    dw1 = matmul(du2.T, x2, label=f"{mlp.fc1.name}.wgrad")  # dw1: [ffn, h]
    s1.release()
    s2.release()
    return dw1, du2.sum(axis=0), dw2, dy2.sum(axis=0)
    # END SOLUTION


def zb_h1(pp: int, microbatches: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023): for each rank r of p, the compute actions of stage r, every
    backward split into I and a W that may wait, with 1F1B's peak memory (at most min(p, m)
    micro-batches in flight on any rank) and a bubble of (p - 1)(t_F + t_B - 2 t_W) on the
    clock (lesson section 2).

    pp: p ranks, rank r holding stage r; microbatches: m >= 1 (m < p too). Returns p lists;
    rank r's holds Action(r, F, i), Action(r, I, i) and Action(r, W, i) for every i.
    """
    # BEGIN SOLUTION Exercise 6.2: the ZB-H1 schedule generator — see lesson.py, section 2
    m = microbatches
    ranks = []
    for r in range(pp):
        warmup = min(pp - r - 1, m)  # 1F1B's warm-up: p - r - 1 forwards
        row = [Action(r, F, i) for i in range(warmup)]
        done = 0  # W's run so far, oldest first
        for k in range(m):
            if warmup + k < m:
                row.append(Action(r, F, warmup + k))
            row.append(Action(r, I, k))  # the previous stage waits for this one
            if k >= r:  # rank r keeps r W's back for its cool-down
                row.append(Action(r, W, done))
                done += 1
        row += [Action(r, W, i) for i in range(done, m)]  # the deferred W's fill the bubble
        ranks.append(row)
    return ranks
    # END SOLUTION


#: the schedules exercise 6.3 may choose, and the chunks each places on a rank
CHOICES = {"1f1b": 1, "interleaved_1f1b": None, "zb_h1": 1, "zb_h2": 1, "zbv": 2,
           "dualpipev": 2}


def choose_zero_bubble(pp: int, global_batch: int, min_microbatch: int, durations: dict,
                       activation_cap: float, bubble_target: float,
                       back_to_back: bool) -> dict:
    """A pipeline plan over pp ranks for global_batch sequences a step (lesson section 7).

    durations: the times of a rank's layers on one micro-batch, "F", "I", "W" (t_B = t_I +
    t_W) and "F&B" (a forward and a backward overlapped, DualPipe's pair); only their
    ratios matter to a bubble fraction. A schedule of v chunks a rank runs a chunk in 1/v
    of them. A micro-batch holds at least min_microbatch sequences (smaller ones waste the
    GPU), and m divides the batch.
    activation_cap: the most activations a rank may hold, in sequences through all of its
    layers (peak micro-batches in flight x sequences a micro-batch). bubble_target: idle
    over busy time, of a flushed step, or of back-to-back steps when back_to_back (the
    optimizer's post-validation). Returns {"schedule": one of CHOICES, "microbatches": m,
    "chunks": v}. The grader times the plan on the dry run's clock and trains one step of
    a small GPT with it through parallelize: one device's loss.
    """
    # BEGIN SOLUTION Exercise 6.3: a zero-bubble plan within a bubble and a memory budget — see lesson.py, section 7
    plans = [(name, v) for name, v in CHOICES.items() if v] + [("interleaved_1f1b", 2)]
    for m in range(global_batch // min_microbatch, 0, -1):  # most micro-batches first
        if global_batch % m:
            continue
        for name, v in plans:
            try:
                actions = schedule(name, pp, m, v)
            except ScheduleError:  # dualpipev below 2p, interleaving with m % p
                continue
            t = {k: Fraction(x) / v for k, x in durations.items()}  # one chunk's times
            t["B"] = t["I"] + t["W"]
            d = dry_run(lower(actions), t)
            bubble = d.steady_bubble_over_ideal if back_to_back else d.bubble_over_ideal
            held = max(d.peak_activations) * Fraction(global_batch, m)
            if bubble <= bubble_target and held <= activation_cap:
                return {"schedule": name, "microbatches": m, "chunks": v}
    raise ValueError(f"no plan of {pp} ranks meets a bubble of {bubble_target:.0%} within "
                     f"{activation_cap} sequences' activations a rank")
    # END SOLUTION
