"""Cross-entropy loss = mean over counted tokens of -log softmax(logits)[target].

    forward:   lse[t] = log sum_v exp(logits[t, v])              (log-sum-exp, max-shifted)
               loss   = (1/N) · sum over counted t of (lse[t] - logits[t, target[t]])
    backward:  dlogits[t, v] = dloss · (softmax(logits[t])[v] - [v == target[t]]) / N
               for counted tokens, 0 for ignored ones

A token is counted unless its target equals `ignore_index` (-100, PyTorch's default; used
for padding and for prompt tokens in fine-tuning); N is the number of counted tokens. When
every token is ignored the mean is taken as 0 with zero gradient (PyTorch returns NaN),
so an all-padding micro-batch does not poison a sum of micro-batch losses.

Memory: the forward saves
    logits    as given (logits.nbytes = s·b·V·itemsize, the input dtype),
    lse       the log-sum-exp per token, [s, b] in the compute dtype (4 bytes a token,
              8 for float64),
    targets   as given (targets.nbytes, 8 bytes a token for int64),
so s·b·(V·itemsize + 4 + 8) bytes for bf16 logits and int64 targets. The backward
rebuilds softmax = exp(logits - lse) from these instead of keeping a float32 [s, b, V]
softmax, which is twice the size of bf16 logits. (Megatron's vocab-parallel version saves
the softmax; the saving here is a choice, documented so the ledger can be checked.)

Precision: computed in float32 (float64 when the logits are float64); the loss is a numpy
scalar of that dtype, dlogits has the logits' dtype.
FLOPs: none; no matmul here (see `matmul.py`). Its time is the bytes it moves
(memory_bound.py, `cross_entropy_bytes`): (e + c)·TV forward (read the logits, write the
softmax in the compute dtype, c bytes, as Megatron-LM's kernel does), (c + e)·TV backward
(read it, write dlogits), TV = logits.size.
"""

from __future__ import annotations

import numpy as np

from .matmul import compute_dtype
from .memory_bound import charge_bytes
from .saved import Saved


def cross_entropy_bytes(logits: np.ndarray) -> int:
    """(e + c)·TV, each way: the logits (e bytes an element) and their softmax in the
    compute dtype (c = 4, 8 for float64), TV = logits.size (a vocabulary shard's under
    tensor parallelism)."""
    return (logits.itemsize + compute_dtype(logits.dtype).itemsize) * logits.size


def _log_sum_exp(lf: np.ndarray) -> np.ndarray:
    """log sum_v exp(lf[..., v]) computed as m + log sum exp(lf - m), m = max."""
    m = lf.max(axis=-1, keepdims=True)  # m: [s, b, 1]
    return (m + np.log(np.exp(lf - m).sum(axis=-1, keepdims=True)))[..., 0]  # [s, b]


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100
                          ) -> tuple[np.generic, Saved]:
    """loss = mean over non-ignored tokens of lse(logits) - logits[target]; saves logits,
    lse and targets.

    logits: [s, b, V], targets: int [s, b] -> loss: a scalar (float32, float64 for float64)
    """
    targets = np.asarray(targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} need targets of shape "
                         f"{logits.shape[:-1]} (one per token), got {targets.shape}")
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"cross_entropy targets must be integers, got dtype {targets.dtype}")
    V = logits.shape[-1]
    valid = targets != ignore_index  # valid: bool [s, b]
    bad = targets[valid & ((targets < 0) | (targets >= V))]
    if bad.size:
        raise IndexError(f"cross_entropy targets must lie in [0, {V}) or equal "
                         f"ignore_index={ignore_index}; got {bad[:5].tolist()}")
    ct = compute_dtype(logits.dtype)
    lf = logits.astype(ct, copy=False)
    lse = _log_sum_exp(lf)  # lse: [s, b]
    safe = np.where(valid, targets, 0)
    picked = np.take_along_axis(lf, safe[..., None], axis=-1)[..., 0]  # [s, b]
    count = int(valid.sum())
    total = np.where(valid, lse - picked, 0).sum(dtype=ct)
    loss = ct.type(total / count) if count else ct.type(0.0)
    charge_bytes("cross_entropy", cross_entropy_bytes(logits))
    return loss, Saved("cross_entropy", logits=logits, lse=lse, targets=targets,
                       ignore_index=ignore_index, count=count)


def cross_entropy_backward(dloss, saved: Saved) -> np.ndarray:
    """dlogits = dloss · (softmax(logits) - onehot(target)) / N on counted tokens; releases
    `saved`.

    dloss: scalar -> dlogits: [s, b, V] in the logits' dtype
    """
    logits, targets = saved.logits, saved.targets
    ct = compute_dtype(logits.dtype)
    grad = np.exp(logits.astype(ct, copy=False) - saved.lse[..., None])  # softmax: [s, b, V]
    valid = targets != saved.ignore_index  # valid: bool [s, b]
    safe = np.where(valid, targets, 0)
    np.put_along_axis(grad, safe[..., None],
                      np.take_along_axis(grad, safe[..., None], axis=-1) - 1.0, axis=-1)
    scale = ct.type(float(dloss) / saved.count) if saved.count else ct.type(0.0)
    grad *= valid[..., None] * scale
    saved.release()
    charge_bytes("cross_entropy.backward", cross_entropy_bytes(logits))
    return grad.astype(logits.dtype, copy=False)
