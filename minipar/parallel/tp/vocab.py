"""The vocabulary split across tensor-parallel ranks: embedding lookup and cross-entropy.

Megatron-LM (Shoeybi et al. 2019, section 3, "Input and output embeddings"). Rank r holds
rows [lo, hi) = [r·V/t, (r+1)·V/t) of the embedding table E [V, h], and the output layer
produces only those vocabulary entries' logits, [s, b, V/t]:

    VocabParallelEmbedding
        y_r = E_r[ids - lo] where lo <= ids < hi, else 0        [s, b, h], a partial sum
        y   = g(y_r)        all-reduce in forward, identity in backward
        dE_r[v - lo] = sum of dy over tokens with id v in [lo, hi)

    vocab_parallel_cross_entropy(logits_r [s, b, V/t], targets)
        m     = all_reduce(max_v logits_r)                       1st all-reduce  [s, b]
        z_t   = all_reduce(logits_r[target - lo] if the target is on this rank else 0)
                                                                 2nd all-reduce  [s, b]
        sum_e = all_reduce(sum_v exp(logits_r - m))              3rd all-reduce  [s, b]
        loss  = mean over counted tokens of (m + log sum_e) - z_t
        dlogits_r = (exp(logits_r - lse) - onehot_r(target)) / N    no communication

Only [s, b] numbers cross the network, three times, instead of the [s, b, V] logits: no
rank ever holds the full-vocabulary logits. As in nn.cross_entropy, the forward saves the
logits shard, the log-sum-exp and the targets, and the backward rebuilds the softmax from
them (Megatron saves the softmax itself; both are [s, b, V/t]). Its elementwise bytes are
nn.cross_entropy's on the rank's shard (cross_entropy_bytes of [s, b, V/t]).

The vocabulary must divide by t. Megatron pads it instead, to a multiple of
`make_vocab_size_divisible_by` × t (128 × t by default), which adds never-used rows and
changes the model; here a vocabulary that does not divide is refused, and
`padded_vocab_size(V, t)` gives the size to build both models with instead.
"""

from __future__ import annotations

import numpy as np

from ...nn.cross_entropy import cross_entropy_bytes
from ...nn.embedding import embedding_backward
from ...nn.matmul import compute_dtype
from ...nn.memory_bound import charge_bytes
from ...nn.module import Module
from ...nn.parameter import Parameter, init_normal
from ...nn.saved import Saved
from ...runtime.collectives import all_reduce
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from .mappings import reduce_from_tensor_model_parallel_region
from .layers import divide, tensor_parallel_parameter


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 1) -> int:
    """The smallest size >= vocab_size divisible by divisible_by · tp (Megatron's
    `_vocab_size_with_padding`, whose default divisible_by is 128)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def vocab_range(vocab_size: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi): the vocabulary entries rank `rank` of `size` holds."""
    per = divide(vocab_size, size, "vocab_size",
                 f"build the model with vocab_size={padded_vocab_size(vocab_size, size)} "
                 "(padded_vocab_size), as Megatron pads it")
    return rank * per, (rank + 1) * per


class VocabParallelEmbedding(Module):
    """y = g(E_r[ids - lo] masked to this rank's rows).  ids: int [s, b] -> y: [s, b, h]."""

    parameter_order = ("weight",)

    def __init__(self, name: str, num_embeddings: int, dim: int, group: ProcessGroup,
                 seed: int = 0, dtype=np.float64, std: float = 0.02):
        self.name, self.group, self.dim = name, group, dim
        self.num_embeddings = num_embeddings
        self.lo, self.hi = vocab_range(num_embeddings, group.group_rank(current().rank),
                                       group.size)
        full = init_normal(f"{name}.weight", (num_embeddings, dim), std, seed, dtype)
        self.weight: Parameter = tensor_parallel_parameter(f"{name}.weight", full, 0, group)

    def forward(self, ids: np.ndarray) -> tuple[np.ndarray, Saved]:
        ids = np.asarray(ids)
        outside = (ids < self.lo) | (ids >= self.hi)  # outside: bool [s, b]
        local = np.where(outside, 0, ids - self.lo)  # local: int [s, b], in [0, V/t)
        y = self.weight.data[local]  # y: [s, b, h], this rank's rows only
        y[outside] = 0  # rows of other ranks contribute nothing here
        y = reduce_from_tensor_model_parallel_region.forward(y, self.group)  # [s, b, h]
        return y, Saved(self.name, ids=local, outside=outside)

    def backward(self, dy: np.ndarray, saved: Saved) -> None:
        """dE_r[v - lo] = sum of dy over this rank's tokens with id v (g: identity)."""
        dy = reduce_from_tensor_model_parallel_region.backward(dy, self.group)
        keep = ~saved.outside[..., None]  # keep: bool [s, b, 1]
        ids = saved.ids
        saved.release()
        dy = np.where(keep, dy, np.zeros((), dy.dtype))  # other ranks' tokens: no gradient
        self.weight.accumulate(embedding_backward(dy, Saved(self.name, ids=ids),
                                                  self.hi - self.lo))


def vocab_parallel_cross_entropy(logits: np.ndarray, targets: np.ndarray,
                                 group: ProcessGroup, ignore_index: int = -100):
    """loss = mean over counted tokens of lse(logits) - logits[target], from vocabulary
    shards.  logits: [s, b, V/t] (this rank's vocab range), targets: int [s, b]
    -> (loss scalar, saved).  Three all-reduces of [s, b] over `group`."""
    t, r = group.size, group.group_rank(current().rank)
    per = logits.shape[-1]
    lo, hi = r * per, (r + 1) * per
    targets = np.asarray(targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits {logits.shape} need targets "
                         f"of shape {logits.shape[:-1]}, got {targets.shape}")
    valid = targets != ignore_index  # valid: bool [s, b]
    bad = targets[valid & ((targets < 0) | (targets >= per * t))]
    if bad.size:
        raise IndexError(f"targets must lie in [0, {per * t}) or equal ignore_index="
                         f"{ignore_index}; got {bad[:5].tolist()}")
    ct = compute_dtype(logits.dtype)
    lf = logits.astype(ct, copy=False)  # lf: [s, b, V/t]
    m = _reduce(lf.max(axis=-1), "max", group)  # m: [s, b], the global max
    mine = valid & (targets >= lo) & (targets < hi)
    local = np.where(mine, targets - lo, 0)
    picked = np.take_along_axis(lf, local[..., None], axis=-1)[..., 0]  # [s, b]
    z_t = _reduce(np.where(mine, picked, 0), "sum", group)  # z_t: [s, b], the target logit
    sum_e = _reduce(np.exp(lf - m[..., None]).sum(axis=-1), "sum", group)  # sum_e: [s, b]
    lse = m + np.log(sum_e)  # lse: [s, b]
    count = int(valid.sum())
    total = np.where(valid, lse - z_t, 0).sum(dtype=ct)
    loss = ct.type(total / count) if count else ct.type(0.0)
    charge_bytes("cross_entropy", cross_entropy_bytes(logits))  # this rank's [s, b, V/t]
    return loss, Saved("vocab_parallel_cross_entropy", logits=logits, lse=lse, local=local,
                       mine=mine, valid=valid, count=count)


def vocab_parallel_cross_entropy_backward(dloss, saved: Saved) -> np.ndarray:
    """dlogits_r = dloss · (softmax_r - onehot_r(target)) / N, with no communication.
    dloss: scalar -> dlogits: [s, b, V/t] in the logits' dtype"""
    logits = saved.logits
    ct = compute_dtype(logits.dtype)
    grad = np.exp(logits.astype(ct, copy=False) - saved.lse[..., None])  # [s, b, V/t]
    at = saved.local[..., None]
    hit = np.take_along_axis(grad, at, axis=-1) - saved.mine[..., None]  # minus onehot
    np.put_along_axis(grad, at, hit, axis=-1)
    scale = ct.type(float(dloss) / saved.count) if saved.count else ct.type(0.0)
    grad *= saved.valid[..., None] * scale
    saved.release()
    charge_bytes("cross_entropy.backward", cross_entropy_bytes(logits))
    return grad.astype(logits.dtype, copy=False)


def _reduce(x: np.ndarray, op: str, group: ProcessGroup) -> np.ndarray:
    return x if group.size == 1 else all_reduce(x, op, group=group)
