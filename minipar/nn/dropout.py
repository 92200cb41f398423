"""Inverted dropout y = x · mask / (1 - p), mask ~ Bernoulli(1 - p) (Srivastava et al. 2014).

    forward:   mask = rng.random(x.shape) >= p        (each element kept with prob. 1 - p)
               y = x * mask / (1 - p)                 (so E[y] = x: nothing to undo at eval)
    backward:  dx = dy * mask / (1 - p)

Memory: the mask is saved as a bool array, 1 byte per element (x.size bytes): the sbh
and as²b "dropout mask" terms of Korthikanti et al. 2022. Nothing else is saved. With
p == 0 dropout is the identity: the input itself is returned and nothing is saved.

Reproducibility: the mask is a function of the generator's state alone. A generator in
the same state (e.g. `np.random.Generator(PCG64())` with `bit_generator.state` copied
before the forward) draws the same mask again, which is what activation recomputation
relies on to rebuild the forward exactly, and what Megatron's CUDA RNG tracker arranges
for tensor-parallel regions (same seed where activations are replicated, different seeds
where they are split). The forward advances the generator by x.size draws (none when
p == 0).

Precision: computed in float32 for bf16/fp16/float32 inputs, float64 for float64,
rounded to the input dtype. FLOPs: none; dropout is elementwise (see `matmul.py`). Its
bytes are charged by the op it is fused into (memory_bound.py): the block's residual
`dropout_add`, the attention's `attention_dropout`, the `embedding`.
"""

from __future__ import annotations

import numpy as np

from .matmul import compute_dtype
from .saved import Saved


def dropout_forward(x: np.ndarray, p: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, Saved]:
    """y = x * mask / (1 - p) with mask = rng.random(x.shape) >= p; saves the bool mask.

    x: any shape, e.g. [s, b, h] -> y: same shape and dtype; p == 0 returns x itself
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got p={p}")
    if p == 0.0:
        return x, Saved("dropout", p=0.0)  # identity: no draws, nothing saved
    mask = rng.random(x.shape) >= p  # mask: bool, same shape as x, 1 byte per element
    ct = compute_dtype(x.dtype)
    y = (x.astype(ct, copy=False) * mask / (1.0 - p)).astype(x.dtype, copy=False)
    return y, Saved("dropout", mask=mask, p=float(p))


def dropout_backward(dy: np.ndarray, saved: Saved) -> np.ndarray:
    """dx = dy * mask / (1 - p) (dy itself when p == 0); releases `saved`.

    dy: same shape as x -> dx: same shape and dtype as dy
    """
    p = saved.p
    if p == 0.0:
        saved.release()
        return dy
    ct = compute_dtype(dy.dtype)
    dx = (dy.astype(ct, copy=False) * saved.mask / (1.0 - p)).astype(dy.dtype, copy=False)
    saved.release()
    return dx
