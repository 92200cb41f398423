"""One block of attention: out_b = softmax_b(q k^T / sqrt(d) + mask) v with its log-sum-exp
lse_b; its backward recomputes the probabilities from the final lse: P = exp(S − lse).

    forward (per block: the queries' partial answer over these keys only)
        S     = q k^T / sqrt(d), masked entries −inf            S: [b, a, m, n]
        mx    = max_j S,  P~ = exp(S − mx),  l = Σ_j P~
        out_b = (P~ v) / l,  lse_b = mx + log l                  out_b: [b, a, m, d]
    backward (with the final lse and delta = Σ_d dout ∘ out of the whole attention)
        P  = exp(S − lse)         the block's entries of the full softmax, exactly
        dV = P^T dout             dP = dout V^T
        dS = P ∘ (dP − delta)     (softmax's backward, its row sum given by delta)
        dQ = dS K / sqrt(d)       dK = dS^T Q / sqrt(d)

Blockwise attention as in Liu et al. 2023 ("Ring Attention with Blockwise Transformers")
and FlashAttention (Dao et al. 2022): the backward needs only q, k, v, the final out and
lse, never a block's probabilities, so nothing of size m x n is kept between forward and
backward. Forward: 2 matmuls; backward: 5 (the recomputed S, dV, dP, dQ, dK).

Precision. The matmuls follow nn's rule (16-bit inputs, float32 accumulation, one rounding
to the input dtype); the softmax statistics, out_b, lse_b and every gradient block are
returned in the compute dtype (float32 for 16-bit inputs, float64 for float64), so that
the ring accumulates in it, as FlashAttention's kernels and ring-flash-attention do. P~ and
dS are rounded to the input dtype before their matmuls, as a kernel does.

`flops` is what each matmul charges the clock (blocks.py: a diagonal block half of its
dense count, a masked pair inside the rectangle nothing).
"""

from __future__ import annotations

import numpy as np

from ...nn.matmul import compute_dtype, matmul


def _scores(q: np.ndarray, k: np.ndarray, allowed: np.ndarray, flops: float, label: str
            ) -> np.ndarray:
    """S = q k^T / sqrt(d) in the compute dtype, −inf where not allowed.  [b, a, m, n]"""
    ct = compute_dtype(q.dtype)
    s = matmul(q, k.swapaxes(-1, -2), label=f"{label} q@k^T", flops=flops).astype(ct)
    s *= 1.0 / np.sqrt(q.shape[-1])  # s: [b, a, m, n]
    return np.where(allowed, s, -np.inf)  # allowed [m, n] broadcasts over b, a


def block_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray,
                  flops: float, label: str = "block") -> tuple[np.ndarray, np.ndarray]:
    """(out_b [b, a, m, d], lse_b [b, a, m]) in the compute dtype.
    q: [b, a, m, d]; k, v: [b, a, n, d]; allowed: [m, n], every row with a True"""
    s = _scores(q, k, allowed, flops, label)  # s: [b, a, m, n]
    mx = s.max(axis=-1, keepdims=True)  # mx: [b, a, m, 1]
    p = np.exp(s - mx)  # p: [b, a, m, n], 0 where masked
    denom = p.sum(axis=-1, keepdims=True)  # denom: [b, a, m, 1]
    pv = matmul(p.astype(v.dtype), v, label=f"{label} p@v", flops=flops)  # [b, a, m, d]
    out = pv.astype(s.dtype) / denom  # out: [b, a, m, d]
    return out, (mx + np.log(denom))[..., 0]  # lse: [b, a, m]


def block_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray,
                   dout: np.ndarray, lse: np.ndarray, delta: np.ndarray, flops: float,
                   label: str = "block") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq [b, a, m, d], dk [b, a, n, d], dv [b, a, n, d]) in the compute dtype: this
    block's share of the gradients. dout: [b, a, m, d] (the queries' output gradient);
    lse, delta: [b, a, m] of the whole attention (final lse; Σ_d dout ∘ out)"""
    dt = q.dtype
    s = _scores(q, k, allowed, flops, f"{label} recompute")  # s: [b, a, m, n]
    p = np.exp(s - lse[..., None])  # p: [b, a, m, n], the full softmax's entries
    dv = matmul(p.astype(dt).swapaxes(-1, -2), dout, label=f"{label} dv",
                flops=flops).astype(s.dtype)  # dv: [b, a, n, d]
    dp = matmul(dout, v.swapaxes(-1, -2), label=f"{label} dp",
                flops=flops).astype(s.dtype)  # dp: [b, a, m, n]
    ds = p * (dp - delta[..., None])  # ds: [b, a, m, n]
    ds *= 1.0 / np.sqrt(q.shape[-1])
    ds = ds.astype(dt)
    dq = matmul(ds, k, label=f"{label} dq", flops=flops).astype(s.dtype)  # [b, a, m, d]
    dk = matmul(ds.swapaxes(-1, -2), q, label=f"{label} dk",
                flops=flops).astype(s.dtype)  # dk: [b, a, n, d]
    return dq, dk, dv
