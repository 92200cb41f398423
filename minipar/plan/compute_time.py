"""Compute time of one micro-batch on one rank: the GEMMs at their efficiency, the attention's
s² matmuls, and the elementwise work at the device's memory bandwidth.

Per rank, with b sequences a micro-batch, s tokens a sequence (s_c = s/cp of them on this
rank), T = b·s_c tokens, hidden h = a·d, a heads (a_kv key-value heads), MLP width f,
vocabulary V, t = tp, e bytes an activation (2 in bf16), and a GEMM [M, K] x [K, N] written
(M, N, K):

    forward GEMMs of one layer                               FLOPs
      QKV          (T, (a + 2a_kv)d/t, h)                    2T h (a + 2a_kv)d / t
      scores       b·a/t of (s_c, s, d)           [s²]       2 b s_c s h / t
      context      b·a/t of (s_c, d, s)           [s²]       2 b s_c s h / t
      projection   (T, h, a d / t)                           2T h² / t
      MLP          (T, f/t, h) x (1 GeLU, 2 SwiGLU), (T, h, f/t)    2T h f (2 or 3) / t
      MoE MLP      router (T, E, h); E/ep experts of (T k ep/E, f_e/t, h) ...; shared
                   experts (T, S f_e/t, h) ...: the dense MLP with f -> k f_e + S f_e
    head (last stage)   logits (T, V/t, h)                   2T h V / t
A GPT (a_kv = a, f = 4h, GeLU) so does 24 T h²/t + 4 b s_c s h/t a layer, flops.py's count.
Each GEMM takes 2 M N K / (eff(M, N, K) · peak) (gemm.py); the backward's two GEMMs per
forward GEMM take twice that.

Elementwise work moves bytes through HBM at the memory bandwidth W a streaming kernel
reaches (ClusterSpec.elementwise_bandwidth: measured where known, else the data sheet's).
Per layer, with r = 1 byte of dropout mask an element when dropout is on (else 0), N = T·h
elements of the stream between the blocks (N/t under sequence parallelism), F_t = T·f/t
elements of the MLP's activation, Q = T (2a + 2a_kv) d / t elements of q, k, v and the
context, and S_el = b (a/t) s_c s attention scores, the ops of a Megatron-LM layer:

    op                         forward bytes            backward bytes
    2 LayerNorms               2 · 2e N  (read, write)   2 · 5e N  (read dy, x, write dx;
                                                         read dy, x again for gain, bias)
    2 bias-dropout-adds        2 · (3e + r) N            2 · (6e + r) N  (dropout's, the
                                                         bias sum, the residual's sum)
    MLP activation, bias fused GeLU 2e F_t               4e F_t  (read dy, x, write, bias)
                               SwiGLU 3e F_t             5e F_t
    q, k, v, context layouts   2e Q  (the per-head copies the batched matmuls need)
                                                         2e Q
    rotary (no learned table)  2e T (a + a_kv) d / t     the same
    MoE permute, unpermute     2 · 2e T k h              the same
    attention core (not flash) scale-mask-softmax 2e S_el    3e S_el  (read y, dy, write)
                               dropout (2e + r) S_el         (2e + r) S_el
    embedding (first stage)    (5e + r) T h / split  (lookup, positions, dropout)
                                                         (5e + r) T h / split
    head (last stage)          final LayerNorm 2e N, cross-entropy on the T V/t logits:
                               read e, write the float32 softmax (e + 4); backward 5e N
                               and read 4, write e
With flash attention the s² scores never reach HBM: the attention core's bytes are 0 and
its matmuls run at the GEMM efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .gemm import GemmEfficiency


@dataclass(frozen=True)
class Gemm:
    """count GEMMs of [M, K] x [K, N]; `attention` marks the s² ones (scores, context)."""

    name: str
    M: float
    N: float
    K: float
    count: float = 1
    attention: bool = False

    @property
    def flops(self) -> float:
        return 2 * self.M * self.N * self.K * self.count


@dataclass(frozen=True)
class Shape:
    """The sizes one rank works on for one micro-batch (module docstring's symbols)."""

    b: int
    s: int
    s_c: float
    h: int
    a: int
    a_kv: int
    d: float
    f: int
    V: int
    t: int
    e: int          # bytes of an activation
    split: int      # t under sequence parallelism, else 1
    dropout: bool
    swiglu: bool
    rotary: bool
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    ep: int = 1

    @property
    def T(self) -> float:
        return self.b * self.s_c


def shape_of(model, layout, dropout: bool = True) -> Shape:
    """The Shape of `model` (a presets.ModelSpec) under `layout` (a layout.Layout)."""
    t, c = layout.tp, layout.cp
    if model.heads % t or model.hidden % t:
        raise ValueError(f"tp = {t} must divide the heads ({model.heads}) and the hidden size "
                         f"({model.hidden}) of {model.name}")
    if model.seq_len % c:
        raise ValueError(f"cp = {c} must divide the sequence length {model.seq_len}")
    return Shape(b=layout.micro_batch, s=model.seq_len, s_c=model.seq_len / c, h=model.hidden,
                 a=model.heads, a_kv=model.kv, d=model.head_dim, f=model.ffn, V=model.vocab,
                 t=t, e=2 if layout.precision == "bf16" else 4,
                 split=t if layout.sequence_parallel else 1, dropout=dropout,
                 swiglu=model.swiglu, rotary=not model.learned_positions,
                 experts=model.experts, top_k=model.top_k, expert_ffn=model.expert_ffn,
                 shared_experts=model.shared_experts, ep=layout.ep)


def _mlp(sh: Shape, tokens: float, width: float, count: float, name: str) -> list[Gemm]:
    up = 2 if sh.swiglu else 1
    return [Gemm(f"{name} up", tokens, width / sh.t, sh.h, count * up),
            Gemm(f"{name} down", tokens, sh.h, width / sh.t, count)]


def layer_gemms(sh: Shape) -> list[Gemm]:
    """One layer's forward GEMMs for one micro-batch on one rank (module docstring)."""
    T, h, t, d = sh.T, sh.h, sh.t, sh.d
    heads = sh.b * sh.a / t
    out = [Gemm("qkv", T, (sh.a + 2 * sh.a_kv) * d / t, h),
           Gemm("scores", sh.s_c, sh.s, d, heads, attention=True),
           Gemm("context", sh.s_c, d, sh.s, heads, attention=True),
           Gemm("projection", T, h, sh.a * d / t)]
    if not sh.experts:
        return out + _mlp(sh, T, sh.f, 1, "mlp")
    out.append(Gemm("router", T, sh.experts, h))
    per_expert = T * sh.top_k * sh.ep / sh.experts  # tokens an expert receives, balanced
    out += _mlp(sh, per_expert, sh.expert_ffn, sh.experts / sh.ep, "experts")
    if sh.shared_experts:
        out += _mlp(sh, T, sh.shared_experts * sh.expert_ffn, 1, "shared experts")
    return out


def head_gemms(sh: Shape) -> list[Gemm]:
    """The last stage's logits: (T, V/t, h)."""
    return [Gemm("logits", sh.T, sh.V / sh.t, sh.h)]


@dataclass(frozen=True)
class Bytes:
    """Elementwise bytes of a piece of the model: the stream's and the attention core's
    (what selective recomputation reruns), forward and backward."""

    forward: float = 0.0
    backward: float = 0.0
    core_forward: float = 0.0
    core_backward: float = 0.0


def layer_bytes(sh: Shape, flash_attention: bool = False) -> Bytes:
    """One layer's elementwise bytes, one micro-batch, one rank (module docstring)."""
    e, r = sh.e, (1 if sh.dropout else 0)
    N = sh.T * sh.h / sh.split
    width = sh.f if not sh.experts else (sh.top_k + sh.shared_experts) * sh.expert_ffn
    F_t = sh.T * width / sh.t
    Q = sh.T * (2 * sh.a + 2 * sh.a_kv) * sh.d / sh.t
    fwd = 2 * 2 * e * N + 2 * (3 * e + r) * N + (3 if sh.swiglu else 2) * e * F_t + 2 * e * Q
    bwd = 2 * 5 * e * N + 2 * (6 * e + r) * N + (5 if sh.swiglu else 4) * e * F_t + 2 * e * Q
    if sh.rotary:
        rope = 2 * e * sh.T * (sh.a + sh.a_kv) * sh.d / sh.t
        fwd, bwd = fwd + rope, bwd + rope
    if sh.experts:
        perm = 2 * 2 * e * sh.T * sh.top_k * sh.h
        fwd, bwd = fwd + perm, bwd + perm
    if flash_attention:
        return Bytes(fwd, bwd)
    S_el = sh.b * sh.a / sh.t * sh.s_c * sh.s
    drop = (2 * e + r) * S_el if sh.dropout else 0.0
    return Bytes(fwd, bwd, 2 * e * S_el + drop, 3 * e * S_el + drop)


def embedding_bytes(sh: Shape) -> Bytes:
    """The first stage's lookup, position add and dropout: (5e + r) T h / split each way."""
    x = (5 * sh.e + (1 if sh.dropout else 0)) * sh.T * sh.h / sh.split
    return Bytes(x, x)


def head_bytes(sh: Shape) -> Bytes:
    """The final LayerNorm and the cross-entropy over the rank's T V/t logits."""
    N = sh.T * sh.h / sh.split
    logits = sh.T * sh.V / sh.t
    return Bytes(2 * sh.e * N + (sh.e + 4) * logits, 5 * sh.e * N + (4 + sh.e) * logits)


@dataclass(frozen=True)
class Work:
    """Seconds (and forward FLOPs) of a piece of the model, one micro-batch, one rank, by
    kind. The GEMMs' backward is twice their forward (`backward`); the elementwise ops'
    backward has its own bytes."""

    matmul: float = 0.0          # linear layers' GEMMs, forward
    attention: float = 0.0       # the s² GEMMs (scores, context), forward
    elementwise: float = 0.0     # LayerNorm, activations, dropout, residual adds, ..., forward
    core: float = 0.0            # softmax and attention dropout over the scores, forward
    elementwise_backward: float = 0.0
    core_backward: float = 0.0
    flops: float = 0.0           # forward FLOPs of matmul + attention
    attention_flops: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                       for f in fields(self)})

    @property
    def forward(self) -> float:
        return self.matmul + self.attention + self.elementwise + self.core

    @property
    def backward(self) -> float:
        return (2 * (self.matmul + self.attention) + self.elementwise_backward
                + self.core_backward)


def _bytes_work(x: Bytes, bandwidth: float) -> Work:
    return Work(elementwise=x.forward / bandwidth, core=x.core_forward / bandwidth,
                elementwise_backward=x.backward / bandwidth,
                core_backward=x.core_backward / bandwidth)


def gemm_work(gemms: list[Gemm], gemm: GemmEfficiency, peak: float) -> Work:
    lin = [g for g in gemms if not g.attention]
    att = [g for g in gemms if g.attention]
    sec = lambda gs: sum(gemm.seconds(g.M, g.N, g.K, peak, g.count) for g in gs)  # noqa: E731
    return Work(matmul=sec(lin), attention=sec(att),
                flops=sum(g.flops for g in gemms), attention_flops=sum(g.flops for g in att))


def layer_work(sh: Shape, gemm: GemmEfficiency, peak: float, bandwidth: float,
               flash_attention: bool = False) -> Work:
    """One transformer layer, one micro-batch, one rank."""
    return (gemm_work(layer_gemms(sh), gemm, peak)
            + _bytes_work(layer_bytes(sh, flash_attention), bandwidth))


def head_work(sh: Shape, gemm: GemmEfficiency, peak: float, bandwidth: float) -> Work:
    """The last stage's final LayerNorm, logits and cross-entropy."""
    return gemm_work(head_gemms(sh), gemm, peak) + _bytes_work(head_bytes(sh), bandwidth)


def embedding_work(sh: Shape, bandwidth: float) -> Work:
    """The first stage's embedding: elementwise only (a lookup is no matmul)."""
    return _bytes_work(embedding_bytes(sh), bandwidth)


def optimizer_bytes_per_parameter(precision: str, fp32_grads: bool) -> float:
    """Bytes the optimizer step moves per parameter it updates, as Megatron-LM runs it:
    the gradient's norm for clipping (read g), fused Adam (read the float32 master, m, v
    and the gradient, write master, m, v: 24 + g), the 16-bit weights from the masters
    (read 4, write 2; mixed precision only) and the gradient buffer zeroed for the next
    step (write g); g = 4 for float32 gradients, else 2. bf16 with float32 gradients: 42."""
    g = 4 if (fp32_grads or precision == "fp32") else 2
    return g + (24 + g) + (6 if precision == "bf16" else 0) + g
