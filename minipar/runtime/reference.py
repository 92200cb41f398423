"""The specification of every collective: a function over the list of per-rank blocks.

`blocks[i]` is what the i-th rank *of the group* passes in; each `*_ref` returns the list of
what each of those ranks gets back. This is the whole meaning of a collective, written the
way JAX's shard_map documentation defines `psum` (``psum_ref``): no devices, no threads, no
clocks. The simulated backend computes every collective's result by calling these functions
at the rendezvous, so there is one source of truth.

Order of reduction (documented, so results are reproducible bit for bit):
    reduce(blocks) = (((b0 op b1) op b2) ... op b_{n-1})      -- in group order,
accumulated in the blocks' own dtype (so bfloat16 sums round after every addition, as a
bfloat16 ring does). "avg" is that sum divided by n; it is refused for integer dtypes,
as torch.distributed refuses ReduceOp.AVG for integers.

Roots (`src`, `dst`) here are *positions in the group*, 0..n-1; the SPMD functions in
`collectives.py` take global ranks, as torch.distributed does, and translate.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from .errors import CollectiveUsageError

Block = np.ndarray

REDUCE_OPS: dict[str, Callable] = {
    "sum": np.add,
    "avg": np.add,  # summed, then divided by n
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def check_op(op: str, dtype: np.dtype) -> str:
    """Validate a reduction op name against a dtype; return it lower-cased."""
    name = str(getattr(op, "value", op)).lower()
    if name not in REDUCE_OPS:
        raise CollectiveUsageError(
            f"unknown reduction op {op!r}: expected one of {sorted(REDUCE_OPS)}"
        )
    if name == "avg" and np.issubdtype(np.dtype(dtype), np.integer):
        raise CollectiveUsageError(
            f"op='avg' is not defined for integer dtype {np.dtype(dtype)}: "
            "use op='sum' and divide, or cast to a floating dtype first"
        )
    return name


def reduce_blocks(blocks: Sequence[Block], op: str = "sum") -> Block:
    """reduce(b) = ((b0 op b1) op b2) ... op b_{n-1}, in group order; a new array."""
    name = check_op(op, blocks[0].dtype)
    fn = REDUCE_OPS[name]
    acc = np.array(blocks[0], copy=True)
    for b in blocks[1:]:
        fn(acc, b, out=acc)
    if name == "avg":
        acc = np.asarray(acc / len(blocks)).astype(blocks[0].dtype, copy=False)  # 0-d too
    return acc


def all_reduce_ref(blocks: Sequence[Block], op: str = "sum") -> list[Block]:
    """out[i] = b0 op b1 op ... op b_{n-1}   for every rank i."""
    total = reduce_blocks(blocks, op)
    return [total] + [total.copy() for _ in blocks[1:]]


def reduce_ref(blocks: Sequence[Block], dst: int, op: str = "sum") -> list[Optional[Block]]:
    """out[dst] = b0 op ... op b_{n-1};  out[i] = None for i != dst."""
    total = reduce_blocks(blocks, op)
    return [total if i == dst else None for i in range(len(blocks))]


def broadcast_ref(blocks: Sequence[Optional[Block]], src: int) -> list[Block]:
    """out[i] = b_src   for every rank i (other ranks' blocks are ignored)."""
    return [np.array(blocks[src], copy=True) for _ in blocks]


def all_gather_ref(blocks: Sequence[Block], axis: int = 0) -> list[Block]:
    """out[i] = concat(b0, b1, ..., b_{n-1}) along `axis`   for every rank i."""
    whole = np.concatenate(blocks, axis=axis)
    return [whole] + [whole.copy() for _ in blocks[1:]]


def reduce_scatter_ref(blocks: Sequence[Block], op: str = "sum", axis: int = 0) -> list[Block]:
    """out[i] = i-th of n equal chunks (along `axis`) of  b0 op b1 op ... op b_{n-1}."""
    n = len(blocks)
    if blocks[0].shape[axis] % n:
        raise CollectiveUsageError(
            f"reduce_scatter splits axis {axis} of length {blocks[0].shape[axis]} into "
            f"{n} equal chunks, but {blocks[0].shape[axis]} is not divisible by {n}: "
            "pad the input to a multiple of the group size"
        )
    total = reduce_blocks(blocks, op)
    return [np.array(c, copy=True) for c in np.split(total, n, axis=axis)]


def gather_ref(blocks: Sequence[Block], dst: int) -> list[Optional[list[Block]]]:
    """out[dst] = [b0, b1, ..., b_{n-1}];  out[i] = None for i != dst."""
    return [[np.array(b, copy=True) for b in blocks] if i == dst else None
            for i in range(len(blocks))]


def scatter_ref(blocks: Sequence[Optional[Sequence[Block]]], src: int) -> list[Block]:
    """out[i] = blocks[src][i]: the source's i-th piece goes to rank i."""
    pieces = blocks[src]
    if pieces is None or len(pieces) != len(blocks):
        got = "None" if pieces is None else f"{len(pieces)} pieces"
        raise CollectiveUsageError(
            f"scatter: the source must pass one piece per rank ({len(blocks)}), got {got}"
        )
    return [np.array(p, copy=True) for p in pieces]


def all_to_all_ref(blocks: Sequence[Sequence[Block]]) -> list[list[Block]]:
    """out[i][j] = blocks[j][i]: rank j's i-th piece goes to rank i, arriving in slot j.

    The transpose of the n x n matrix of pieces; pieces may differ in size (uneven splits).
    """
    n = len(blocks)
    return [[np.array(blocks[j][i], copy=True) for j in range(n)] for i in range(n)]


def all_to_all_single_ref(
    blocks: Sequence[Block], input_splits: Sequence[Sequence[int]], axis: int = 0
) -> list[Block]:
    """Rank j cuts b_j along `axis` into pieces of sizes input_splits[j] (one per rank);
    out[i] = concat(piece i of b0, piece i of b1, ..., piece i of b_{n-1})."""
    pieces = []
    for b, splits in zip(blocks, input_splits):
        cuts = np.cumsum(splits)[:-1]
        pieces.append(np.split(b, cuts, axis=axis))
    return [np.concatenate(row, axis=axis) for row in
            ([pieces[j][i] for j in range(len(blocks))] for i in range(len(blocks)))]


def barrier_ref(blocks: Sequence[object]) -> list[None]:
    """Nothing moves; every rank leaves only after every rank has arrived."""
    return [None for _ in blocks]


REFERENCES: dict[str, Callable] = {
    "all_reduce": all_reduce_ref,
    "reduce": reduce_ref,
    "broadcast": broadcast_ref,
    "all_gather": all_gather_ref,
    "reduce_scatter": reduce_scatter_ref,
    "gather": gather_ref,
    "scatter": scatter_ref,
    "all_to_all": all_to_all_ref,
    "all_to_all_single": all_to_all_single_ref,
    "barrier": barrier_ref,
}
