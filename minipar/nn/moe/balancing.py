"""Load balancing for a mixture of experts: the auxiliary losses and the selection bias.

With T tokens, E experts, k experts per token, probs p [T, E] (each row sums to 1) and the
chosen experts topk [T, k], let c_i = #{(t, slot) : topk[t, slot] = i} (so Σ_i c_i = T·k):

    switch:    f_i = c_i / (T·k),  P_i = (1/T) Σ_t p[t, i],   L = α · E · Σ_i f_i · P_i
    sequence:  f_ij = E / (k·s) · c_ij,  P_ij = (1/s) Σ_t∈j p[t, i]   (sequence j, s tokens)
               L = mean_j α · Σ_i f_ij · P_ij
    z-loss:    L = α · mean_t (log Σ_i exp(logits[t, i]))²
    bias:      b_i ← b_i + γ · sign(mean(c) − c_i)        (no loss, no gradient)

References: the switch loss is GShard's (Lepikhin et al. 2020) and Switch Transformer's
(Fedus et al. 2021); the sequence loss and the bias are DeepSeek-V3's (DeepSeek-AI 2024,
section 2.1.2; the bias from Wang et al. 2024); the z-loss is ST-MoE's (Zoph et al. 2022).

Each loss equals α at perfect balance (f_i = P_i = 1/E for the switch loss) and grows as
the routing concentrates: with every token on one expert and its probability there,
switch and sequence give α·E. f counts choices, a step function of the router's scores,
so it carries no gradient; only P does. Hence dL/dp[t, i] is the same for every token t
(of a sequence): α·E·f_i / T, or α·f_ij / (s·b) with b sequences.

Why the k in f: at balance each expert is chosen T·k/E times, so c_i / T = k/E, and a
loss built on it would sit at α·k rather than α; dividing by T·k keeps the optimum at α
for every top-k, as in Megatron-LM's `switch_load_balancing_loss_func`.

Token order: tokens are [s, b] flattened row-major (token t = i_s·b + i_b), so sequence j
is tokens j, b + j, 2b + j, ...

The gradients are for a loss weight of 1 (scale them by the weight the caller gives the
loss). They are taken with respect to the normalised probs; the router carries them back
through its score function (router.py's `aux_probs_backward`).

Precision: computed in float64 for float64 inputs and float32 otherwise (`compute_dtype`);
the loss is a Python float and each gradient has its input's dtype.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..matmul import compute_dtype, is_low_precision


def expert_counts(topk: np.ndarray, num_experts: int) -> np.ndarray:
    """c_i = #{(t, slot) : topk[t, slot] = i}, the choices of each expert. -> int64 [E]"""
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) \
            or num_experts < 1:
        raise ValueError(f"expert_counts: num_experts must be a positive int, got "
                         f"{num_experts!r}")
    topk = _check_topk(topk, int(num_experts), None, "expert_counts")
    return np.bincount(topk.reshape(-1), minlength=int(num_experts)).astype(np.int64)


def switch_aux_loss(probs: np.ndarray, topk: np.ndarray, coeff: float,
                    counts: Optional[np.ndarray] = None) -> tuple[float, np.ndarray]:
    """L = coeff · E · Σ_i f_i · P_i, f_i = c_i / (T·k), P_i = mean_t probs[t, i]. -> (L, dp)

    GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021, section
    2.2), normalised for top-k as in Megatron-LM. probs: [T, E], topk: int [T, k]
    -> dprobs: [T, E], every row coeff · E · f / T, in probs' dtype.

    counts: the c_i that f is measured on, f_i = c_i / Σ_j c_j (default: this topk's own,
    Σ c = T·k). The global-batch loss passes the counts summed over the data-parallel
    ranks (Megatron-LM's global_aux_loss; Qiu et al. 2025, "Demons in the Detail"): each
    rank's L then uses the global f with its own P, and the mean of the ranks' L and of
    their gradients is the loss of one device routing all their tokens.
    """
    coeff = _check_coeff(coeff, "switch_aux_loss")
    probs = _check_probs(probs, "switch_aux_loss", "probs")
    T, E = probs.shape
    topk = _check_topk(topk, E, T, "switch_aux_loss")
    k = topk.shape[1]
    ct = compute_dtype(probs.dtype)
    if counts is None:
        f = expert_counts(topk, E).astype(ct) / (T * k)  # f: [E], sums to 1
    else:
        f = _check_counts(counts, E).astype(ct)
        f = f / f.sum()  # f: [E], the group's choices, sums to 1
    P = probs.astype(ct, copy=False).sum(axis=0) / T  # P: [E], sums to 1 for normalised rows
    loss = coeff * E * float(np.dot(f, P))
    row = coeff * E * f / T  # row: [E], dL/dprobs[t] for every token t
    dprobs = np.empty((T, E), dtype=probs.dtype)  # dprobs: [T, E]
    dprobs[...] = row
    return loss, dprobs


def z_loss(logits: np.ndarray, coeff: float) -> tuple[float, np.ndarray]:
    """L = coeff · mean_t (logsumexp_i logits[t, i])². -> (L, dlogits)

    ST-MoE's router z-loss (Zoph et al. 2022): it keeps the router's logits small, where
    exp of them rounds less in bf16. logits: [T, E] -> dlogits: [T, E],
    coeff · 2 · lse_t · softmax(logits[t]) / T, in logits' dtype.
    """
    coeff = _check_coeff(coeff, "z_loss")
    logits = _check_probs(logits, "z_loss", "logits")
    T = logits.shape[0]
    z = logits.astype(compute_dtype(logits.dtype), copy=False)
    m = z.max(axis=-1, keepdims=True)  # m: [T, 1], subtracted so exp cannot overflow
    e = np.exp(z - m)  # e: [T, E]
    total = e.sum(axis=-1, keepdims=True)  # total: [T, 1]
    lse = m + np.log(total)  # lse: [T, 1] = log Σ_i exp(z_i)
    loss = coeff * float(np.mean(lse * lse))
    dlogits = (2.0 * coeff / T) * lse * (e / total)  # dlogits: [T, E]; e / total = softmax
    return loss, dlogits.astype(logits.dtype, copy=False)


def sequence_aux_loss(probs: np.ndarray, topk: np.ndarray, seq_len: int, coeff: float
                      ) -> tuple[float, np.ndarray]:
    """L = mean_j coeff · Σ_i f_ij · P_ij over the b = T / seq_len sequences. -> (L, dprobs)

    DeepSeek-V3's complementary sequence-wise balance loss (DeepSeek-AI 2024, section
    2.1.2), averaged over sequences as Megatron-LM's seq_aux_loss does:
    f_ij = E / (k·s) · c_ij, P_ij = (1/s) Σ_{t in j} probs[t, i], with s = seq_len and
    token t = i_s·b + i_b in sequence i_b. probs: [T, E], topk: int [T, k]
    -> dprobs: [T, E], coeff · f_ij / (s·b) for token t of sequence j, in probs' dtype.
    """
    coeff = _check_coeff(coeff, "sequence_aux_loss")
    probs = _check_probs(probs, "sequence_aux_loss", "probs")
    T, E = probs.shape
    topk = _check_topk(topk, E, T, "sequence_aux_loss")
    k = topk.shape[1]
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ValueError(f"sequence_aux_loss: seq_len must be a positive int, got {seq_len!r}")
    s = int(seq_len)
    if T % s:
        raise ValueError(f"sequence_aux_loss: the T = {T} tokens must be whole sequences of "
                         f"seq_len = {s} (tokens are [s, b] flattened), but {T} % {s} = "
                         f"{T % s}: pass the sequence length the tokens were flattened from")
    b = T // s
    ct = compute_dtype(probs.dtype)
    chosen = np.zeros((T, E), dtype=ct)  # chosen: [T, E], 1 where token t picked expert i
    np.put_along_axis(chosen, topk, 1.0, axis=-1)
    c = chosen.reshape(s, b, E).sum(axis=0)  # c: [b, E], choices within each sequence
    f = (E / (k * s)) * c  # f: [b, E], 1 everywhere at balance
    P = probs.astype(ct, copy=False).reshape(s, b, E).sum(axis=0) / s  # P: [b, E]
    per_sequence = coeff * (f * P).sum(axis=-1)  # per_sequence: [b], L_j
    loss = float(per_sequence.mean())
    dprobs = np.empty((s, b, E), dtype=probs.dtype)  # dprobs: [s, b, E]
    dprobs[...] = (coeff / (s * b)) * f  # the same for each token of a sequence
    return loss, dprobs.reshape(T, E)


def update_expert_bias(bias: np.ndarray, counts: np.ndarray, rate: float) -> np.ndarray:
    """b_i + rate · sign(mean(c) − c_i): a new bias; `bias` is left as it is. -> [E]

    DeepSeek-V3's auxiliary-loss-free balancing (Wang et al. 2024, "Auxiliary-Loss-Free
    Load Balancing Strategy for Mixture-of-Experts"; DeepSeek-AI 2024, section 2.1.2, where
    rate = γ = 0.001): an overloaded expert's bias goes down and an underloaded one's up.
    The bias is added to the scores for the selection only, never to the weights. Pass
    the counts of the whole step (summed over micro-batches and data-parallel ranks), so
    every replica computes the same bias. bias: float [E], counts: [E].
    """
    bias, counts = np.asarray(bias), np.asarray(counts)
    if bias.ndim != 1 or not _is_float(bias.dtype):
        raise ValueError(f"update_expert_bias: bias must be a float array [E], got shape "
                         f"{bias.shape} and dtype {bias.dtype}")
    if counts.shape != bias.shape:
        raise ValueError(f"update_expert_bias: counts must have the bias's shape {bias.shape} "
                         f"(one count per expert), got {counts.shape}")
    if not (np.issubdtype(counts.dtype, np.number) and np.all(np.isfinite(counts))):
        raise ValueError(f"update_expert_bias: counts must be finite numbers, got "
                         f"{counts.tolist()}")
    if not _is_real(rate) or not math.isfinite(rate) or rate < 0:
        raise ValueError(f"update_expert_bias: rate must be a finite number >= 0 (DeepSeek-V3 "
                         f"uses 0.001), got {rate!r}")
    ct = compute_dtype(bias.dtype)
    c = counts.astype(np.float64)
    step = np.sign(c.mean() - c)  # step: [E], -1 overloaded, +1 underloaded, 0 at the mean
    new = bias.astype(ct) + (float(rate) * step).astype(ct)  # new: [E], a fresh array
    return new.astype(bias.dtype, copy=False)


def _check_counts(counts, num_experts: int) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.shape != (num_experts,) or not np.issubdtype(counts.dtype, np.number) \
            or not np.all(np.isfinite(counts)) or (counts < 0).any() or counts.sum() <= 0:
        raise ValueError(f"switch_aux_loss: counts must be the E = {num_experts} experts' "
                         f"choices, [{num_experts}] finite, >= 0, not all zero; got shape "
                         f"{counts.shape}: {np.asarray(counts).tolist()}")
    return counts


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or is_low_precision(dtype)


def _check_coeff(coeff, who: str) -> float:
    if not _is_real(coeff) or not math.isfinite(coeff) or coeff < 0:
        raise ValueError(f"{who}: coeff must be a finite number >= 0 (the loss's weight, "
                         f"e.g. 1e-2 for the aux loss, 1e-3 for the z-loss), got {coeff!r}")
    return float(coeff)


def _check_probs(x, who: str, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{who}: {name} must be [T, E] with T >= 1 tokens and E >= 1 "
                         f"experts (flatten [s, b, E] to [s·b, E]), got shape {x.shape}")
    if not _is_float(x.dtype):
        raise ValueError(f"{who}: {name} must be floating point, got dtype {x.dtype}")
    return x


def _check_topk(topk, num_experts: int, tokens, who: str) -> np.ndarray:
    """Refuse a choice that is not [T, k] distinct expert ids in 0..E-1, saying why."""
    topk = np.asarray(topk)
    if topk.ndim != 2:
        raise ValueError(f"{who}: topk must be [T, k] (each token's chosen experts), got "
                         f"shape {topk.shape}")
    if not np.issubdtype(topk.dtype, np.integer):
        raise ValueError(f"{who}: topk must hold integer expert ids, got dtype {topk.dtype}")
    T, k = topk.shape
    if tokens is not None and T != tokens:
        raise ValueError(f"{who}: topk must have one row per token, [{tokens}, k] for probs "
                         f"of {tokens} tokens, got shape {topk.shape}")
    if not 1 <= k <= num_experts:
        raise ValueError(f"{who}: k (topk's second dim) must be in 1..E = 1..{num_experts}, "
                         f"got k = {k}")
    if topk.size and (topk.min() < 0 or topk.max() >= num_experts):
        bad = topk[(topk < 0) | (topk >= num_experts)]
        raise ValueError(f"{who}: expert ids must be in 0..E-1 = 0..{num_experts - 1}, got "
                         f"{bad.size} outside it, e.g. {int(bad[0])}")
    if k > 1:
        ordered = np.sort(topk, axis=1)  # ordered: [T, k]
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)  # repeated: [T]
        if repeated.any():
            t = int(np.argmax(repeated))
            raise ValueError(f"{who}: a token's k experts must be distinct, but token {t} "
                             f"chose {topk[t].tolist()}")
    return topk
