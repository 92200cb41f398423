"""Lesson 08 — Mixture of experts and expert parallelism: the exercises' answers.

Exercise 8.1 builds the dispatch permutation of a mixture of experts: each (token, choice)
pair becomes a row, the rows grouped by expert and, inside an expert, in token order
(Megatron-LM's layout, nn/moe's `permute`); and its inverse, which scatters each
expert's output back to its pair and sums a token's k outputs with its routing weights.
Exercise 8.2 decides which pairs a full expert keeps: at most C = ceil(k·T/E · factor),
by routing weight ("probs") or by token order ("position"). Exercise 8.3 reduces an
expert's gradient under dp × ep so that it equals one device's.
"""

from __future__ import annotations

import math

import numpy as np

import minipar as mp
from minipar.parallel import ParallelDims, ParallelGroups


def permute_rows(x: np.ndarray, experts: np.ndarray, num_experts: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(xs, counts): the tokens' rows grouped by expert (lesson section 2).

    x: [T, h] tokens; experts: int [T, k], each token's k distinct experts (pair (t, j)
    is token t's j-th choice). Returns xs [T·k, h], one row per pair: first expert 0's
    pairs, then expert 1's, ..., each expert's pairs in token order, row r holding the
    token of its pair; and counts [E], the rows of each expert (0 for an expert no token
    chose). Nothing is dropped.
    """
    # BEGIN SOLUTION Exercise 8.1: the dispatch permutation and its inverse — see lesson.py, section 2
    T, k = experts.shape
    flat = experts.reshape(-1)  # flat: [T·k], pair p = t·k + j
    order = np.argsort(flat, kind="stable")  # by expert; equal experts keep token order
    xs = x[order // k]  # xs: [T·k, h], row r holds the token of pair order[r]
    counts = np.bincount(flat, minlength=num_experts)  # counts: [E]
    return xs, counts
    # END SOLUTION


def unpermute_rows(ys: np.ndarray, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """y [T, h], y[t] = Σ_j weights[t, j] · (the row of pair (t, j) in ys) (section 2).

    ys: [T·k, h], the experts' outputs in permute_rows' row order; experts: int [T, k];
    weights: [T, k], the routing weights.
    """
    # BEGIN SOLUTION Exercise 8.1: the dispatch permutation and its inverse — see lesson.py, section 2
    T, k = experts.shape
    order = np.argsort(experts.reshape(-1), kind="stable")  # row r came from pair order[r]
    per_pair = np.empty_like(ys)  # per_pair: [T·k, h] in pair order
    per_pair[order] = ys  # the inverse permutation: a scatter
    return np.einsum("tk,tkh->th", weights, per_pair.reshape(T, k, -1))  # y: [T, h]
    # END SOLUTION


def kept_pairs(experts: np.ndarray, weights: np.ndarray, num_experts: int,
               capacity_factor: float, drop_policy: str) -> np.ndarray:
    """[T, k] bool: which (token, choice) pairs their expert keeps (section 2).

    experts: int [T, k]; weights: [T, k]. Each expert keeps at most
    C = ceil(k · T / E · capacity_factor) of the pairs routed to it: drop_policy "probs"
    keeps the C of highest weight (among equal weights, the earlier token), "position"
    the first C in token order.
    """
    # BEGIN SOLUTION Exercise 8.2: capacity and dropped pairs — see lesson.py, section 2
    T, k = experts.shape
    C = math.ceil(k * T / num_experts * capacity_factor)  # pairs an expert takes at most
    kept = np.zeros((T, k), dtype=bool)
    for e in range(num_experts):
        t, j = np.nonzero(experts == e)  # expert e's pairs, in token order
        if drop_policy == "probs":
            rank = np.lexsort((t, -weights[t, j]))  # highest weight first, then token
        else:
            rank = np.arange(len(t))  # token order
        keep = rank[:C]
        kept[t[keep], j[keep]] = True
    return kept
    # END SOLUTION


def reduce_expert_grad(grad: np.ndarray, dims: ParallelDims) -> np.ndarray:
    """The gradient one device takes for an expert this rank holds (section 7).

    Call on every rank of the layout `dims` (default order; ep folded into dp). grad is
    this rank's gradient of one of its experts (the same local expert on every rank),
    computed from the rows that every rank of its ep group sent it: the sum of ep
    data-parallel ranks' shares. Return the mean over all dp ranks' shares of that
    expert's gradient, as one device training on the whole batch would see it.
    """
    # BEGIN SOLUTION Exercise 8.3: an expert's gradient under dp × ep — see lesson.py, section 7
    groups = ParallelGroups(dims)
    mean_over_replicas = mp.all_reduce(grad, "avg", group=groups.edp)  # same expert, dp/ep
    return mean_over_replicas / dims.ep  # each replica's gradient summed ep shares
    # END SOLUTION
