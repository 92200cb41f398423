"""Matrix multiplication, charged to the clock as the GEMMs it is.

    c = a @ b                 a: [..., m, k], b: [..., k, n]  ->  c: [..., m, n]
    FLOPs = 2 * m * n * k * (number of matrices in the broadcast batch)
          = 2 * k * c.size    (one multiply and one add per term of every output element)
    time  = FLOPs / (eff(m, n, k) * peak(dtype))

Model FLOPs count matrix multiplications only, as in Megatron-LM's and PaLM's MFU
accounting (Narayanan et al. 2021, appendix; Chowdhery et al. 2022, appendix B). Every
layer in `minipar.nn` multiplies through `matmul`, so the clock and the trace see every
matmul FLOP, and only those. The time is the context's compute model's
(runtime/compute_model.py): under the peak model (the default) eff = 1; under the
calibrated one eff is the efficiency of one GEMM of (m, n, k): a batched matmul is that
many GEMMs of one matrix's size, each at one matrix's efficiency. Elementwise work
(normalisation, softmax, activations, dropout, the loss) does no model FLOPs; what it costs
is the bytes it moves (memory_bound.py), charged by each op.

Precision rule (what tensor cores do): for bfloat16 and float16 inputs, the products are
accumulated in float32 and the result is rounded once to the input dtype. float32 stays
float32 and float64 stays float64 (the tests run in float64, so any difference between a
parallel layout and the single device comes from the order of additions alone).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..runtime.context import current
from ..runtime.device import dtype_key

LOW_PRECISION = ("bfloat16", "float16")


def is_low_precision(dtype) -> bool:
    """True for the 16-bit floating types (bfloat16 from ml_dtypes, float16)."""
    return dtype_key(dtype) in LOW_PRECISION


def compute_dtype(dtype) -> np.dtype:
    """The dtype arithmetic runs in: float64 for float64, float32 for everything narrower.

    LayerNorm, softmax, GeLU and cross-entropy compute in it and round their result back to
    the input dtype; matmul accumulates in it.
    """
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def matmul(a: np.ndarray, b: np.ndarray, label: str = "",
           flops: Optional[float] = None) -> np.ndarray:
    """c = a @ b, charging 2·m·n·k FLOPs per matrix (times the batch) to the clock.

    a: [..., m, k], b: [..., k, n] -> c: [..., m, n]; leading batch dims broadcast as in
    `np.matmul` (a 1-D operand is a vector, as there: m or n is 1). The FLOPs are charged
    at the peak rate of the inputs' dtype (bf16 work runs at the bf16 tensor-core rate),
    divided by the compute model's efficiency of one [m, k] x [k, n] GEMM. `flops`, if
    given, is charged instead, at the same GEMM's efficiency: for a product whose masked
    entries a real kernel skips (parallel/cp charges a causal diagonal block half of its
    dense count).
    """
    a, b = np.asarray(a), np.asarray(b)
    out_dtype = np.result_type(a.dtype, b.dtype)
    if is_low_precision(out_dtype):
        # tensor cores: 16-bit inputs, float32 accumulation, one rounding at the end
        c = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(out_dtype)
    else:
        c = np.matmul(a, b)  # c: [..., m, n]
    k = a.shape[-1]
    if flops is None:
        flops = 2 * k * c.size  # = 2 m n k per matrix, times the batch
    dims = (a.shape[-2] if a.ndim > 1 else 1, b.shape[-1] if b.ndim > 1 else 1, k)  # one GEMM
    current().compute(flops, dtype=dtype_key(out_dtype), name="matmul", label=label,
                      dims=dims)
    return c
