"""Causal multi-head self-attention, with its backward written out.

    Attention(x) = softmax(Q K^T / sqrt(d) + causal mask) V,   Q, K, V = split(x W_qkv^T + b)
(Vaswani et al. 2017; GPT-2's causal, pre-LayerNorm form.)

Layout. x: [s, b, h]. The QKV projection's output features are ordered [a, 3, d] (for
each head: its q, k and v), as Megatron-LM orders them, so that splitting the output
features into tp equal parts gives each tensor-parallel rank whole heads.

Saved for backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.1), with s, b, h, a and 2-byte activations:
    QKV linear input           2 sbh      (saved by the Linear)
    Q, K and V                 6 sbh      (one [s, b, 3h] array)
    softmax output             2 a s^2 b
    attention-dropout mask       a s^2 b  (1 byte per element)
    attention-dropout output   2 a s^2 b  (the input of the second batched matmul)
    output-projection input    2 sbh      (saved by the Linear)
    = 12 sbh + 5 a s^2 b; the paper's 11 sbh counts Q and K (4 sbh) and V (2 sbh) the
    same way, and puts the output dropout's sbh mask here too: see docs/model.md.
With dropout off, the dropout output *is* the softmax output: it is saved once, and the
mask not at all. Selective recomputation saves only Q, K, V and recomputes the softmax
and dropout (from a copy of the generator taken before) during backward, at the cost of one more
Q K^T matmul: 2 b s^2 h FLOPs.

Elementwise bytes (memory_bound.py), S = b·a·s² scores, Q = the elements of qkv and the
context (4sbh): softmax 2eS forward, 3eS backward (softmax.py); with dropout, the attention
dropout (2e + 1)S each way; the per-head layouts of q, k, v and the context, 2eQ each way
(the copies the batched matmuls need). Selective recomputation charges the softmax and
dropout forward again in backward, with the Q K^T matmul.
"""

from __future__ import annotations

import copy
import functools

import numpy as np

from .dropout import dropout_backward, dropout_forward
from .linear import Linear
from .matmul import matmul
from .memory_bound import charge_bytes, mask_bytes
from .module import Module
from .saved import Saved
from .softmax import softmax_backward, softmax_forward


def _heads(qkv: np.ndarray, a: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[s, b, a*3*d] -> q, k, v each [b, a, s, d] (views)."""
    s, b, three_h = qkv.shape
    d = three_h // (3 * a)
    x = qkv.reshape(s, b, a, 3, d)  # [s, b, a, 3, d]
    q, k, v = (x[:, :, :, i, :].transpose(1, 2, 0, 3) for i in range(3))  # [b, a, s, d]
    return q, k, v


def _merge_heads(ctx: np.ndarray) -> np.ndarray:
    """[b, a, s, d] -> [s, b, a*d]."""
    b, a, s, d = ctx.shape
    return ctx.transpose(2, 0, 1, 3).reshape(s, b, a * d)


def causal_mask(s: int) -> np.ndarray:
    """mask[i, j] = True where query i may attend to key j (j <= i)."""
    return np.tril(np.ones((s, s), dtype=bool))


@functools.lru_cache(maxsize=64)
def _future(s: int) -> np.ndarray:
    """~causal_mask(s): True where key j lies after query i (j > i), the entries masked.
    Made once per length and shared (read-only): every forward of every rank uses it."""
    mask = np.triu(np.ones((s, s), dtype=bool), k=1)
    mask.flags.writeable = False
    return mask


def _probs(q: np.ndarray, k: np.ndarray, p: float, rng: np.random.Generator):
    """softmax(q k^T / sqrt(d) + mask) and its dropout: (probs, s_soft, dropped, s_drop)."""
    d = q.shape[-1]
    scores = matmul(q, k.swapaxes(-1, -2), label="attn q@k^T")  # scores: [b, a, s, s]
    scores *= np.asarray(1.0 / np.sqrt(d), dtype=scores.dtype)  # in place: scores is new
    np.copyto(scores, np.asarray(-np.inf, scores.dtype), where=_future(q.shape[2]))
    probs, s_soft = softmax_forward(scores, axis=-1)  # probs: [b, a, s, s]
    dropped, s_drop = dropout_forward(probs, p, rng)  # dropped: [b, a, s, s]
    if p > 0:
        charge_bytes("attention_dropout", attention_dropout_bytes(probs, p))
    return probs, s_soft, dropped, s_drop


def attention_dropout_bytes(probs: np.ndarray, p: float) -> int:
    """(2e + r)·S: read the probabilities, write the dropped ones and the 1-byte mask."""
    return (2 * probs.itemsize + mask_bytes(p)) * probs.size


def layout_bytes(qkv: np.ndarray, context: np.ndarray) -> int:
    """2eQ: q, k, v and the context copied once each between [s, b, ...] and [b, a, s, d]
    (read and write), Q = qkv.size + context.size."""
    return 2 * (qkv.nbytes + context.nbytes)


def core_attention_forward(qkv: np.ndarray, num_heads: int, p: float,
                           rng: np.random.Generator, selective: bool = False):
    """context = dropout(softmax(Q K^T / sqrt(d) + mask)) V.  qkv: [s, b, 3h] -> [s, b, h]."""
    replay = copy.deepcopy(rng) if selective else None  # a generator in today's state
    q, k, v = _heads(qkv, num_heads)
    probs, s_soft, dropped, s_drop = _probs(q, k, p, rng)
    context = _merge_heads(matmul(dropped, v, label="attn p@v"))  # context: [s, b, h]
    charge_bytes("attention_layout", layout_bytes(qkv, context))
    if selective:  # keep only Q, K, V; softmax and dropout are recomputed in backward
        s_soft.release(), s_drop.release()
        return context, Saved("attn.core", qkv=qkv, replay=replay, p=p, heads=num_heads)
    keep = {"dropped": dropped} if p > 0 else {}
    return context, Saved("attn.core", qkv=qkv, p=p, heads=num_heads, s_soft=s_soft,
                          s_drop=s_drop, **keep)


def core_attention_backward(dcontext: np.ndarray, saved: Saved) -> np.ndarray:
    """Backward of the core: dcontext [s, b, h] -> dqkv [s, b, 3h]. 4 matmuls."""
    q, k, v = _heads(saved.qkv, saved.heads)
    if getattr(saved, "replay", None) is not None:  # selective recomputation
        probs, s_soft, dropped, s_drop = _probs(q, k, saved.p, saved.replay)
    else:
        s_soft, s_drop = saved.s_soft, saved.s_drop
        dropped = saved.dropped if saved.p > 0 else s_soft.y
    b, a, s, d = q.shape
    dctx = dcontext.reshape(s, b, a, d).transpose(1, 2, 0, 3)  # dctx: [b, a, s, d]
    ddropped = matmul(dctx, v.swapaxes(-1, -2), label="attn d(p@v)/dp")  # [b, a, s, s]
    dv = matmul(dropped.swapaxes(-1, -2), dctx, label="attn d(p@v)/dv")  # [b, a, s, d]
    if saved.p > 0:
        charge_bytes("attention_dropout.backward", attention_dropout_bytes(ddropped, saved.p))
    dprobs = dropout_backward(ddropped, s_drop)
    dscores = softmax_backward(dprobs, s_soft)  # masked entries have probs 0: dscores 0
    dscores *= np.asarray(1.0 / np.sqrt(d), dtype=dscores.dtype)  # in place: a new array
    dq = matmul(dscores, k, label="attn d(q@k^T)/dq")  # dq: [b, a, s, d]
    dk = matmul(dscores.swapaxes(-1, -2), q, label="attn d(q@k^T)/dk")  # dk: [b, a, s, d]
    saved.release()
    dqkv = np.empty((s, b, a, 3, d), dtype=np.result_type(dq, dk, dv))  # one copy each
    for i, g in enumerate((dq, dk, dv)):
        dqkv[:, :, :, i, :] = g.transpose(2, 0, 1, 3)  # [b, a, s, d] -> [s, b, a, d]
    charge_bytes("attention_layout.backward", layout_bytes(dqkv, dcontext))
    return dqkv.reshape(s, b, a * 3 * d)  # dqkv: [s, b, 3h]


class CausalSelfAttention(Module):
    """x [s, b, h] -> proj(core(qkv(x))) [s, b, h]."""

    parameter_order = ("qkv", "proj")

    def __init__(self, name: str, hidden: int, num_heads: int, dropout: float = 0.0,
                 seed: int = 0, dtype=np.float64, std: float = 0.02, out_std: float = 0.02):
        self.name, self.num_heads, self.dropout = name, num_heads, dropout
        self.qkv = Linear(f"{name}.qkv", hidden, 3 * hidden, seed=seed, dtype=dtype, std=std)
        self.proj = Linear(f"{name}.proj", hidden, hidden, seed=seed, dtype=dtype, std=out_std)

    def forward(self, x: np.ndarray, rng: np.random.Generator, selective: bool = False):
        qkv, s_qkv = self.qkv.forward(x)  # qkv: [s, b, 3h]
        context, s_core = core_attention_forward(qkv, self.num_heads, self.dropout, rng,
                                                 selective)  # context: [s, b, h]
        y, s_proj = self.proj.forward(context)  # y: [s, b, h]
        return y, (s_qkv, s_core, s_proj)

    def backward(self, dy: np.ndarray, saved, store=None) -> np.ndarray:
        """dx from dy [s, b, h]; with a WeightGradStore, the two linears' weight gradients
        wait for its W (the core has no weights: its backward is all I)."""
        s_qkv, s_core, s_proj = saved
        dcontext = self.proj.backward(dy, s_proj, store)  # dcontext: [s, b, h]
        dqkv = core_attention_backward(dcontext, s_core)  # dqkv: [s, b, 3h]
        return self.qkv.backward(dqkv, s_qkv, store)
