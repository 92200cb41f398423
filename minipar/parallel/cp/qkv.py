"""What a context-parallel attention receives, checked, and its heads taken apart:
qkv [s/cp, b, 3h] (features [a, 3, d], Megatron-LM's order, as nn/attention.py) <->
q, k, v [b, a, s/cp, d].

Errors name the rank, the group and the shapes, say what was expected and what to change.
"""

from __future__ import annotations

import numpy as np

from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .layout import Layout, chunk_size, layout_name


def check_group(group: ProcessGroup, what: str) -> tuple[int, int]:
    """(this rank's place in the cp group, cp), or an error saying what to pass."""
    rank = current().rank
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"rank {rank}: {what} expected the context-parallel group as a "
                        f"ProcessGroup (mp.new_group, a DeviceMesh or ParallelGroups.cp), "
                        f"received {type(group).__name__} {group!r}")
    if rank not in group:
        raise ValueError(f"rank {rank}: {what} was given context-parallel group {group}, "
                         f"which it is not a member of: pass the group this rank belongs to")
    return group.group_rank(rank), group.size


def check_qkv(qkv: np.ndarray, num_heads: int, group: ProcessGroup, layout: Layout,
              what: str) -> int:
    """s, the whole sequence's length, after checking qkv [s/cp, b, 3h] and the heads."""
    rank, cp = current().rank, group.size
    qkv = np.asarray(qkv)
    if qkv.ndim != 3:
        raise ValueError(f"rank {rank}: {what} on cp group {group} expected this rank's "
                         f"qkv [s/cp, b, 3h] (the QKV projection's output on its tokens), "
                         f"received shape {qkv.shape}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) \
            or num_heads < 1 or qkv.shape[2] % (3 * num_heads):
        raise ValueError(f"rank {rank}: {what} on cp group {group}: qkv {qkv.shape} has "
                         f"{qkv.shape[2]} features, expected 3·num_heads·head_dim with "
                         f"num_heads = {num_heads!r}; pass the model's head count")
    s = qkv.shape[0] * cp
    try:
        chunk_size(layout, cp, s)
    except ValueError as e:
        raise ValueError(f"rank {rank}: {what} on cp group {group} received qkv "
                         f"{qkv.shape}, s/cp = {qkv.shape[0]} tokens, s = {s}: {e}") from None
    return s


def check_no_dropout(p: float, group: ProcessGroup, layout: Layout, what: str) -> None:
    """Ring attention refuses attention dropout (its masks would not be one device's)."""
    if p != 0:
        raise ValueError(
            f"rank {current().rank}: {what} on cp group {group} (layout "
            f"{layout_name(layout)}) received attention dropout p = {p}; expected p = 0: "
            f"ring attention here does not draw the single-device dropout mask of each "
            f"[query chunk, key chunk] block, so it could not equal one device. Set the "
            f"attention dropout to 0 (long-context training usually does), or use "
            f"ulysses_attention_forward, whose per-head core takes the one-device mask's "
            f"head slice")


def split_heads(qkv: np.ndarray, num_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qkv [c, b, a·3·d] -> q, k, v each [b, a, c, d] (views)."""
    c, b, three_h = qkv.shape
    d = three_h // (3 * num_heads)
    x = qkv.reshape(c, b, num_heads, 3, d)  # x: [c, b, a, 3, d]
    q, k, v = (x[:, :, :, i, :].transpose(1, 2, 0, 3) for i in range(3))  # [b, a, c, d]
    return q, k, v


def merge_heads(x: np.ndarray) -> np.ndarray:
    """[b, a, c, d] -> [c, b, a·d]."""
    b, a, c, d = x.shape
    return x.transpose(2, 0, 1, 3).reshape(c, b, a * d)  # [c, b, h]


def join_qkv(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, dtype) -> np.ndarray:
    """dq, dk, dv each [b, a, c, d] -> dqkv [c, b, a·3·d] in qkv's feature order."""
    b, a, c, d = dq.shape
    out = np.empty((c, b, a, 3, d), dtype=dtype)  # out: [c, b, a, 3, d]
    for i, g in enumerate((dq, dk, dv)):
        out[:, :, :, i, :] = g.transpose(2, 0, 1, 3)  # [b, a, c, d] -> [c, b, a, d]
    return out.reshape(c, b, a * 3 * d)  # dqkv: [c, b, 3h]
