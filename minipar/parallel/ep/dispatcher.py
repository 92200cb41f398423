"""The all-to-all token dispatcher: each expert's rows go to the rank holding it, and back.

    rank p holds experts p·L .. p·L + L − 1  (L = E / ep, contiguous, as Megatron-LM lays
    them out); xs_j[e] is rank j's block of rows for global expert e (nn's permute layout)

    dispatch   rows_local on rank p = [xs_0[pL], xs_1[pL], ..., xs_{ep−1}[pL],
                                       xs_0[pL+1], ..., xs_{ep−1}[pL+L−1]]
               (by local expert, then by source rank: one contiguous block per local expert)
    combine    ys on rank j = [ys_local of owner(e), block (local expert of e, source j)
                               for e = 0..E−1]     (dispatch's inverse: the rows come home)

Megatron-LM's `MoEAlltoAllTokenDispatcher` (core/transformer/moe/token_dispatcher.py), its
steps and names kept, the communication apart from the local steps:

    dispatch                                   its backward (dispatch_backward)
    (a) nn's permute: rows by global expert    nn's permute_backward  (both the caller's)
    (b) all_to_all of the counts:              none (integers); reuses them
        num_global_tokens_per_local_expert [ep, L]
    (c) all_to_all_single(xs, input_splits)    all_to_all_single, the splits swapped
    (d) sort_chunks_by_idxs:                   the inverse sort:
        (source, expert) -> (expert, source)   (expert, source) -> (source, expert)
    combine: (d) inverted, then (c) with the splits swapped; combine_backward: (c), (d)

A permutation's adjoint is its inverse, so dispatch_backward computes what combine does and
combine_backward what dispatch does (without (b)): the backward of an all-to-all is the
all-to-all with input_splits and output_splits swapped. On a group of one rank no
collective is issued (every step is the identity), as with tp's mappings.

Why (b) first: a rank cannot size what it receives, output_splits, until every other rank
has said how many rows it sends; on a GPU this is Megatron's one device-to-host sync per
layer. Expert parallelism is GShard's (Lepikhin et al. 2020): experts sharded over the
devices, tokens exchanged by an all-to-all before the experts and another after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...runtime.collectives import all_to_all, all_to_all_single
from ...runtime.context import current
from ...runtime.group import ProcessGroup


def num_local_experts(num_experts: int, group: ProcessGroup) -> int:
    """L = E / ep, or an error naming what was received and what to change."""
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"rank {current().rank}: expected the expert-parallel group as a "
                        f"ProcessGroup (mp.new_group, a DeviceMesh or ParallelGroups), "
                        f"received {type(group).__name__} {group!r}")
    if current().rank not in group:
        raise ValueError(f"rank {current().rank} is not a member of the expert-parallel "
                         f"group {group} it was given: pass the group this rank belongs to")
    ep = group.size
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) \
            or num_experts < 1 or num_experts % ep:
        raise ValueError(f"num_experts = {num_experts!r} cannot be split over "
                         f"expert-parallel group {group} of size {ep}: expected a positive "
                         f"multiple of {ep} (each rank holds E / ep experts); choose a "
                         f"num_experts divisible by {ep}, or an ep size that divides it")
    return int(num_experts) // ep


def local_expert_indices(num_experts: int, group: ProcessGroup) -> list[int]:
    """The global indices of this rank's experts: p·L .. p·L + L − 1 (Megatron's name)."""
    L = num_local_experts(num_experts, group)
    p = group.group_rank(current().rank)
    return list(range(p * L, (p + 1) * L))


@dataclass(frozen=True)
class DispatchRecord:
    """What the reverse steps need (small integer arrays, not on the ledger, as nn's
    RoutingPlan is not): the group; input_splits [ep], rows this rank sends to each rank;
    output_splits [ep], rows it receives from each; num_global_tokens_per_local_expert
    [ep, L], rows from source rank i for local expert l."""

    group: ProcessGroup
    num_experts: int
    input_splits: np.ndarray
    output_splits: np.ndarray
    num_global_tokens_per_local_expert: np.ndarray

    @property
    def tokens_per_local_expert(self) -> np.ndarray:
        """[L]: the rows each local expert runs on, from all ranks."""
        return self.num_global_tokens_per_local_expert.sum(axis=0)


# ---- the local steps: no communication -------------------------------------------------
def sort_chunks_by_idxs(x: np.ndarray, split_sizes: np.ndarray, sorted_idxs: np.ndarray
                        ) -> np.ndarray:
    """Cut x into chunks of `split_sizes` rows and glue them in the order `sorted_idxs`.
    x: [R, h] -> [R, h]"""
    chunks = np.split(x, np.cumsum(split_sizes)[:-1], axis=0)
    return np.concatenate([chunks[i] for i in sorted_idxs], axis=0)


def _sort_by_local_expert(x: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """(source, local expert) chunks -> (local expert, source): step (d).  [R_local, h]"""
    counts = record.num_global_tokens_per_local_expert  # counts: [ep, L]
    ep, L = counts.shape
    order = np.arange(ep * L).reshape(ep, L).T.ravel()  # sort_input_by_local_experts
    return sort_chunks_by_idxs(x, counts.ravel(), order)


def _unsort_by_local_expert(x: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """(local expert, source) chunks -> (source, local expert): step (d) undone. [R_local, h]"""
    counts = record.num_global_tokens_per_local_expert  # counts: [ep, L]
    ep, L = counts.shape
    order = np.arange(L * ep).reshape(L, ep).T.ravel()  # restore_output_by_local_experts
    return sort_chunks_by_idxs(x, counts.T.ravel(), order)


# ---- the communication --------------------------------------------------------------
def exchange_counts(rows_per_expert: np.ndarray, group: ProcessGroup) -> np.ndarray:
    """Step (b): rank i receives, from each rank j, j's row counts for i's L experts.
    rows_per_expert: [E] -> num_global_tokens_per_local_expert: [ep, L] (row j: from j)"""
    ep = group.size
    pieces = np.split(np.asarray(rows_per_expert, dtype=np.int64), ep)  # ep pieces: [L]
    if ep == 1:
        return pieces[0].reshape(1, -1).copy()
    return np.stack(all_to_all(pieces, group=group))  # [ep, L]


def _exchange_rows(x: np.ndarray, input_splits: np.ndarray, group: ProcessGroup
                   ) -> np.ndarray:
    """Step (c): rows input_splits[j] of x go to rank j, arriving grouped by source rank.
    x: [Σ input_splits, h] -> [Σ rows from every rank, h]"""
    if group.size == 1:
        return x
    return all_to_all_single(x, [int(n) for n in input_splits], group=group)


# ---- the forward steps and their backward ---------------------------------------------
def dispatch(xs: np.ndarray, rows_per_expert: np.ndarray, group: ProcessGroup,
             num_experts: int) -> tuple[np.ndarray, np.ndarray, DispatchRecord]:
    """(rows_local, tokens_per_local_expert, record) from nn's permuted rows.

    xs: [R, h] grouped by global expert (rows_per_expert [E], summing to R). On rank p,
    rows_local [R_local, h] = for each local expert l, for each source rank i in group
    order, rank i's rows for expert p·L + l; tokens_per_local_expert [L] their counts.
    """
    xs, rows_per_expert = _check_rows(xs, rows_per_expert, group, num_experts)
    ep = group.size
    counts = exchange_counts(rows_per_expert, group)  # counts: [ep, L]
    record = DispatchRecord(group, num_experts,
                            rows_per_expert.reshape(ep, -1).sum(axis=1),  # input_splits: [ep]
                            counts.sum(axis=1), counts)  # output_splits: [ep]
    return _to_local_experts(xs, record), record.tokens_per_local_expert, record


def dispatch_backward(d_rows_local: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """dxs [R, h] from d_rows_local [R_local, h]: each row's gradient back to the rank and
    place it came from (the inverse sort, then all-to-all with the splits swapped)."""
    return _from_local_experts(d_rows_local, record)


def combine(ys_local: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """ys [R, h] on rank j: the local experts' outputs of j's rows, in j's dispatch layout
    (by global expert, each expert's rows in j's order), ready for nn's unpermute.
    ys_local: [R_local, h], in dispatch's layout (by local expert, then source rank)"""
    return _from_local_experts(ys_local, record)


def combine_backward(dys: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """dys_local [R_local, h] from dys [R, h]: the rows' gradients to the experts that
    computed them, in dispatch's layout (what dispatch does, without the counts)."""
    return _to_local_experts(dys, record)


def _to_local_experts(x: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """(c) then (d): all-to-all by input_splits, then sort by local expert.
    [R, h] -> [R_local, h]"""
    received = _exchange_rows(x, record.input_splits, record.group)  # [R_local, h] by source
    return _sort_by_local_expert(received, record)  # [R_local, h] by local expert


def _from_local_experts(x: np.ndarray, record: DispatchRecord) -> np.ndarray:
    """(d) undone then (c) reversed: unsort, all-to-all by output_splits.
    [R_local, h] -> [R, h]"""
    by_source = _unsort_by_local_expert(x, record)  # [R_local, h] by source rank
    return _exchange_rows(by_source, record.output_splits, record.group)  # [R, h]


def _check_rows(xs, rows_per_expert, group: ProcessGroup, num_experts: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Refuse rows that do not match their counts, naming rank, group and shapes."""
    num_local_experts(num_experts, group)
    rank = current().rank
    xs = np.asarray(xs)
    counts = np.asarray(rows_per_expert)
    if xs.ndim != 2:
        raise ValueError(f"rank {rank}: dispatch on expert-parallel group {group} expected "
                         f"rows xs [R, h] (nn's permute output), received shape {xs.shape}")
    if counts.shape != (num_experts,) or not np.issubdtype(counts.dtype, np.integer) \
            or (counts < 0).any() or int(counts.sum()) != xs.shape[0]:
        raise ValueError(f"rank {rank}: dispatch on expert-parallel group {group} expected "
                         f"rows_per_expert as {num_experts} non-negative ints (one per "
                         f"global expert) summing to the {xs.shape[0]} rows of xs "
                         f"{xs.shape}, received {counts.tolist()} ({counts.dtype}); pass "
                         f"plan.rows_per_expert of the plan that permuted xs")
    return xs, counts.astype(np.int64)
