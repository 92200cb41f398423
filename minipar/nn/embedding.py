"""The embedding lookup y[s, b] = table[ids[s, b]], with its backward written out.

    forward:   y = table[ids]                   ids: int [s, b], table: [V, h] -> y: [s, b, h]
    backward:  dtable[v] = sum of dy[s, b] over the positions where ids[s, b] == v

A lookup is a gather, not a matmul (it equals one_hot(ids) @ table, but no one computes
it that way), so it charges no FLOPs: model FLOPs count matmuls only (see `matmul.py`).
Its time is the bytes it moves (memory_bound.py), charged by the model's embedding step
for the lookup, the position embedding's add and the dropout together, as Megatron-LM
fuses them: `embedding_bytes`, (5e + r)N each way, N the elements of the stream.

Memory: the forward saves the ids only (ids.nbytes: 8 bytes a token for int64); the
table is a parameter and the backward needs only the vocabulary size from it.
The backward scatters with `np.add.at`, which adds repeated ids correctly (plain fancy
assignment would keep only the last one), accumulating in float32 (float64 for float64)
and rounding once to dy's dtype, so a bf16 gradient of a frequent token is not the sum of
hundreds of bf16 roundings.
"""

from __future__ import annotations

import numpy as np

from .matmul import compute_dtype
from .memory_bound import charge_bytes, mask_bytes
from .module import Module
from .parameter import Parameter, init_normal
from .saved import Saved


def embedding_forward(ids: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, Saved]:
    """y = table[ids]; saves ids.

    ids: int [s, b] (any shape), table: [V, h] -> y: [s, b, h]
    """
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"embedding ids must be integers, got dtype {ids.dtype}")
    V = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        bad = ids[(ids < 0) | (ids >= V)]
        raise IndexError(f"embedding ids must lie in [0, {V}) for a table of {V} rows; "
                         f"got {bad[:5].tolist()}{' ...' if bad.size > 5 else ''}")
    y = table[ids]  # y: [s, b, h]
    return y, Saved("embedding", ids=ids)


def embedding_bytes(x: np.ndarray, p: float) -> int:
    """(5e + r)·N: the token and position lookups, their sum and the dropout of the stream
    x (N = x.size elements of e bytes; r = 1 byte of mask when p > 0), one way."""
    return (5 * x.itemsize + mask_bytes(p)) * x.size


def charge_embedding(x: np.ndarray, p: float, backward: bool = False) -> None:
    """Charge the model's embedding step ("embedding", "embedding.backward") its bytes,
    embedding_bytes of the stream x [s, b, h] (a rank's shard of it under SP)."""
    charge_bytes("embedding.backward" if backward else "embedding", embedding_bytes(x, p))


def embedding_backward(dy: np.ndarray, saved: Saved, vocab_size: int) -> np.ndarray:
    """dtable[v] = sum of dy over the tokens with id v; releases `saved`.

    dy: [s, b, h] -> dtable: [V, h] in dy's dtype
    """
    ids = saved.ids
    h = dy.shape[-1]
    dtable = np.zeros((vocab_size, h), dtype=compute_dtype(dy.dtype))  # dtable: [V, h]
    np.add.at(dtable, ids.reshape(-1), dy.reshape(-1, h).astype(dtable.dtype, copy=False))
    saved.release()
    return dtable.astype(dy.dtype, copy=False)


class Embedding(Module):
    """A [num_embeddings, dim] table ~ N(0, std^2), named `{name}.weight`."""

    parameter_order = ("weight",)

    def __init__(self, name: str, num_embeddings: int, dim: int, seed: int = 0,
                 dtype=np.float64, std: float = 0.02):
        self.name = name
        self.num_embeddings = num_embeddings
        self.dim = dim
        self.weight = Parameter(f"{name}.weight",
                                init_normal(f"{name}.weight", (num_embeddings, dim), std,
                                            seed, dtype))

    def forward(self, ids: np.ndarray) -> tuple[np.ndarray, Saved]:
        """y = table[ids].  ids: int [s, b] -> y: [s, b, dim], and what backward needs."""
        return embedding_forward(ids, self.weight.data)

    def backward(self, dy: np.ndarray, saved: Saved) -> None:
        """dtable[v] = sum of dy where ids == v, accumulated into the weight.

        dy: [s, b, dim]; returns nothing (ids have no gradient)
        """
        self.weight.accumulate(embedding_backward(dy, saved, self.num_embeddings))

    def __repr__(self) -> str:
        return (f"Embedding({self.name}, {self.num_embeddings} x {self.dim}, "
                f"dtype={self.weight.data.dtype})")
