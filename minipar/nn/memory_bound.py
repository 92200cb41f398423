"""Elementwise work on the clock: t = bytes / W, the bytes an op moves through HBM over the
device's memory bandwidth W.

LayerNorm, GeLU, softmax, dropout, residual adds, the embedding lookup and the
cross-entropy do a few FLOPs per byte they read and write: on a GPU they are bound by
memory bandwidth, not by the tensor cores, and are no model FLOPs. Each such op of
minipar.nn calls `charge_bytes(name, nbytes)` once in its forward and once in its backward
("{name}.backward"), with the bytes Megatron-LM's fused kernels move, the counts the planner
times a step with (plan/compute_time.py; docs/planner.md, "Elementwise work"). With e the
activation's itemsize (2 in bf16), c the compute dtype's (4; 8 for float64), r = 1 byte of
dropout mask an element when dropout is on (0 without), on the rank's own (local) shapes:

    op                           name               forward        backward    elements
    LayerNorm                    layernorm          2eN            5eN         N: its input
    GeLU                         gelu               2eF            4eF         F: its input
    attention softmax            softmax            2eS            3eS         S: the scores
    attention dropout (p > 0)    attention_dropout  (2e + r)S      (2e + r)S
    q, k, v, context layouts     attention_layout   2eQ            2eQ         Q: qkv + context
    residual dropout + add       dropout_add        (3e + r)N      (6e + r)N   N: the stream
    embedding, positions, dropout  embedding        (5e + r)N      (5e + r)N   N: the stream
    cross-entropy                cross_entropy      (e + c)TV      (c + e)TV   TV: the logits
    Adam / AdamW step            adam / adamw       per parameter: optim/adam.py

(c = 4, the float32 softmax, is the planner's e + 4.) Under the peak compute model (the
default) the clock has no bandwidth: `charge_bytes` records nothing and costs no time, so
a run's trace holds matmuls only; under the calibrated one each charge is a "compute"
event named as above, with meta {"bytes": nbytes} (runtime/compute_model.py).
"""

from __future__ import annotations

from ..runtime.context import current


def charge_bytes(name: str, nbytes: float, label: str = "") -> None:
    """Charge elementwise work `name` that moves `nbytes` through HBM to this rank's clock."""
    current().memory_bound(nbytes, name, label)


def mask_bytes(p: float) -> int:
    """r: bytes of dropout mask an element, 1 when dropout is on (p > 0), else 0."""
    return 1 if p > 0 else 0
