# Your file for lesson 13, generated from solution.py by `minipar lessons build`.
# Replace each `raise NotImplementedError(...)` with your answer, then run
# `minipar grade 13`.
"""Lesson 13 — Checkpoints, faults and hangs: the exercises' answers.

Exercise 13.1 chooses how often to save: the job's mean time between failures from its
unexpected interruptions, Young's interval sqrt(2·δ·M) and Daly's higher-order estimate,
and what failures and saves cost at Young's interval (section 4). Exercise 13.2 reshards
a flat buffer: which pieces of the old ranks' shards a rank of another data-parallel size
reads (section 3). Exercise 13.3 shrinks the data-parallel dimension after a node is lost
and keeps the global batch with more gradient accumulation, and says which sequences each
replica's micro-batches take (section 5). Exercise 13.4 reads the collectives each rank
entered, as a flight recorder dumps them, and names the rank that diverged first
(sections 6 and 7).
"""

from __future__ import annotations

import math
from collections import Counter


def checkpoint_interval(save_seconds: float, days: float, planned: int, unexpected: int,
                        restart_seconds: float) -> dict:
    """How often to save a job that was interrupted `planned + unexpected` times in `days`
    days (section 4).

    save_seconds δ: how long a save stops training; restart_seconds R: what each failure
    costs before training runs again (detection, rescheduling, loading the checkpoint).
    Planned interruptions (maintenance, announced upgrades) are preceded by a save and lose
    no work; only the unexpected ones are failures.

    Returns, all in seconds except the overhead:

        mtbf              M: the job's mean time between failures
        young             Young's interval sqrt(2·δ·M) (Young 1974)
        daly              Daly's estimate (Daly 2006): sqrt(2δM)·(1 + sqrt(δ/(2M))/3 +
                          δ/(18M)) − δ while δ < 2M; M when δ >= 2M
        lost_per_failure  at Young's interval: the restart plus the work since the last
                          save, half a cycle of τ + δ on average: R + (τ + δ)/2
        overhead          at Young's interval, the share of time not training, to first
                          order: δ/τ for the saves + lost_per_failure / M for the failures
    """
    raise NotImplementedError("Exercise 13.1: the checkpoint interval and its overhead — see lesson.py, section 4")


def reshard_reads(numel: int, n: int, m: int, rank: int) -> list:
    """The pieces of the old shards that rank `rank` of m reads, when a flat buffer of `numel`
    elements saved sharded over n ranks is loaded sharded over m (section 3).

    A flat buffer over N ranks is padded with zeros to a multiple of N and cut in N equal
    shards (minipar's FlatParameter, FSDP's FlatParameter, ZeRO's partitions): shard k is
    flat[k·S : (k + 1)·S], S = ceil(numel / N). The new rank needs the elements of its own
    shard that are not padding, flat[rank·S' : min((rank + 1)·S', numel)], S' = ceil(numel
    / m); the padding is zero and is not read.

    Returns a list of (old_rank, start, stop): old rank old_rank's shard elements
    [start, stop) (offsets inside that shard, 0 <= start < stop <= S), non-empty, in flat
    order, which laid end to end are the new shard's elements; [] when the new shard is
    all padding.
    """
    raise NotImplementedError("Exercise 13.2: which old shards a new rank reads — see lesson.py, section 3")


def shrink_dp(global_batch: int, micro_batch: int, dp_old: int, dp_new: int) -> dict:
    """Resume at dp_new data-parallel replicas (fewer than dp_old), keeping the global batch
    and the micro-batch b each GPU can hold (section 5).

    Each replica trains k micro-batches of b sequences a step (gradient accumulation), so a
    step trains dp·k·b sequences. Keep the global batch if dp_new·b divides it; else the
    largest multiple of dp_new·b not above it (dp_new·b <= global_batch). As minipar splits
    a batch [s, B] (minipar.data: split_data_parallel, then split_microbatches), replica d
    takes the contiguous block of rows [d·B/dp, (d + 1)·B/dp) of the step's B sequences,
    and its micro-batch i the rows [i·b, (i + 1)·b) of that block.

    Returns {"accumulation": k, "global_batch": dp_new·k·b, "rows": rows}, rows[d][i] the
    (start, stop) of replica d's micro-batch i in the step's batch.
    """
    raise NotImplementedError("Exercise 13.3: the accumulation that keeps the global batch — see lesson.py, section 5")


def first_divergence(entered: list) -> tuple | None:
    """The rank that diverged first, from what each rank entered (sections 6 and 7).

    entered[r]: the collectives rank r entered, in order, as a flight recorder dumps them:
    each a tuple (kind, shape, where), e.g. ("all_reduce", (4096,), "train.py:88 in step").
    Collectives are matched by their order in the group, so the ranks' lists agree until a
    rank does something else: skips a call, calls two in another order, calls one more, calls
    one with another shape, or stops (its list ends).

    Returns (rank, index): `index` the first position at which the ranks' entries are not
    all the same (a list that has ended has no entry there), and `rank` the lowest rank
    whose entry at `index` (or its absence) differs from the one most ranks have there.
    None if every list is the same.
    """
    raise NotImplementedError("Exercise 13.4: the first rank to diverge — see lesson.py, section 6")
