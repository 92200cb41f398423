"""What one pipeline stage of a tensor-parallel GPT runs, kernel by kernel: the list of
matmuls, memory-bound kernels and collectives the real program issues for one
micro-batch, in its order, with their sizes, and the parameters the stage holds, in the
order its engine buckets them.

This is the event model of the dry run (timeline.py): `parallel.mesh.parallelize` runs a
TensorParallelGPT (parallel/tp) through a PipelineRunner (parallel/pp); each F, B, I and
W of its schedule issues the ops below, on one rank of the stage, with t = tp, T = s·b
tokens of a micro-batch block (b = B/(m·dp)), X = T·h·e bytes of its residual stream (e:
the dtype's bytes), d = h/a, and collectives only when t > 1:

    embedding (first stage)   F  AR(X)                    the vocabulary-parallel lookup (g)
                              B  SP: AG(X)                the scatter's conjugate
    block l                   F  [SP: AG(X)] qkv [T, 3h/t, h]; q@k^T, p@v: b·a/t GEMMs of
                                 [s, s, d] and [s, d, s]; proj [T, h, h/t]; RS(X) (SP) or
                                 AR(X); [SP: AG(X)] fc1 [T, f/t, h]; fc2 [T, h, f/t]; RS/AR(X)
                              B  (full recompute: the block's F first) per linear, last
                                 first: a row-parallel one [SP: AG(X)] dgrad, wgrad; a
                                 column-parallel one [SP: AG(X), its input again] dgrad,
                                 wgrad, then RS(X) (SP) or AR(X); the core's four GEMMs
                                 (selective recompute: q@k^T first); SP: AR(6h·e), the
                                 LayerNorms' and row biases' partial gradients
                              I  B without the wgrads and the column inputs' re-gathers
                              W  the wgrads in push order (fc2, fc1, proj, qkv), each
                                 column-parallel one after its SP re-gather; SP: AR(6h·e)
    head (last stage)         F  [SP: AG(X)] lm_head [T, V/t, h]; cross-entropy: 3 AR(T·c)
                                 (max, target logit, sum of exponentials; c: the compute
                                 dtype's bytes)
                              B  lm_head as a column-parallel linear; SP: AR(2h·e) (ln_f),
                                 where the head's unit ends (with one stage: after the
                                 embedding's backward, the unsplit root's end)

Between them run the memory-bound kernels nn charges by their bytes (nn/memory_bound.py,
on this rank's shapes; N the local residual stream, S = b·(a/t)·s² scores, r the mask):
a LayerNorm before each column-parallel input (2eN; 5eN back), softmax after q@k^T (2eS;
3eS back) and its dropout when p > 0 ((2e + r)S), the q, k, v and context layouts after
p@v (2e·4Th/t), dropout_add after each row-parallel output ((3e + r)N; (6e + r)N back),
GeLU after fc1 (2e·Tf/t; 4e back), the embedding after its all-reduce ((5e + r)N), the
cross-entropy after the head's three all-reduces ((e + c)·TV/t).

(M, N, K) of a GEMM C[M, N] = A[M, K] B[K, N]: a linear y = x Wᵀ of [T, in] -> [T, out]
is (T, out, in); its dgrad dx = dy W (T, in, out); its wgrad dW = dyᵀ x (out, in, T).
tests/plan/test_timeline.py holds this list to the real trace, op by op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

# the kinds of op: a GEMM or memory-bound work on the compute stream, or a collective on
# a group's comm stream
MATMUL, BYTES, COMM = "matmul", "bytes", "comm"


class Op(NamedTuple):
    """One kernel: a GEMM (name "matmul", label as the trace's, count GEMMs of (M, N, K)),
    memory-bound work (name as nn/memory_bound.py charges it, nbytes moved through HBM), or
    a collective (name its kind, label its group: "tp", of S = nbytes)."""

    kind: str
    name: str
    label: str = ""
    dims: tuple = ()      # (M, N, K) of one GEMM
    count: int = 1        # GEMMs of those dims (a batched matmul)
    nbytes: float = 0.0   # a collective's size S, or the bytes elementwise work moves

    @property
    def flops(self) -> float:
        M, N, K = self.dims
        return 2.0 * M * N * K * self.count


@dataclass(frozen=True)
class StageShape:
    """One stage's part of the model and one micro-batch block on one rank of it."""

    s: int            # sequence length
    b: int            # sequences of a micro-batch on this rank: B / (m · dp)
    h: int
    heads: int
    ffn: int
    vocab: int
    tp: int
    sequence_parallel: bool
    itemsize: int     # bytes of the model's dtype
    compute_itemsize: int  # bytes of the dtype reductions run in (nn.matmul.compute_dtype)
    recompute: str    # "none" | "selective" | "full"
    dropout: float    # p of every dropout (r = 1 byte of mask an element when p > 0)
    lo: int           # blocks lo..hi-1
    hi: int
    first: bool
    last: bool
    root_split: bool  # more than one stage: EMBED and HEAD are units of their own

    @staticmethod
    def of(model, layout, itemsize: int, lo: int, hi: int, stage: int,
           stages: int, dropout: float = 0.0) -> "StageShape":
        """Stage `stage` of `stages` (blocks lo..hi-1) of a GPT ModelSpec under a Layout,
        elements of `itemsize` bytes (8: float64, whose reductions run in float64; else
        they run in float32, nn.matmul.compute_dtype)."""
        return StageShape(model.seq_len, layout.micro_batch, model.hidden, model.heads,
                          model.ffn, model.vocab, layout.tp, layout.sequence_parallel,
                          itemsize, 8 if itemsize == 8 else 4, layout.recompute, dropout,
                          lo, hi, stage == 0, stage == stages - 1, stages > 1)

    @property
    def tokens(self) -> int:
        return self.s * self.b

    @property
    def stream(self) -> float:
        """X: bytes of the micro-batch's whole residual stream [s, b, h]."""
        return float(self.tokens * self.h * self.itemsize)

    @property
    def local(self) -> int:
        """N: elements of the residual stream on this rank, [s, b, h] or [s/t, b, h]."""
        return self.tokens * self.h // (self.tp if self.sequence_parallel else 1)

    @property
    def mask(self) -> int:
        """r: bytes of dropout mask an element."""
        return 1 if self.dropout > 0 else 0

    @property
    def scores(self) -> int:
        """S: elements of this rank's attention scores, b·(a/t)·s²."""
        return self.b * self.heads // self.tp * self.s * self.s

    @property
    def message(self) -> int:
        """Bytes a pipeline send moves: the stream, or its 1/t under SP."""
        return self.tokens * self.h * self.itemsize // (self.tp if self.sequence_parallel
                                                        else 1)


class _Ops:
    """The op list being built, with the collectives a group of one skips."""

    def __init__(self, g: StageShape):
        self.g, self.ops = g, []

    def gemm(self, label: str, M: int, N: int, K: int, count: int = 1) -> None:
        self.ops.append(Op(MATMUL, MATMUL, label, (M, N, K), count))

    def bytes(self, name: str, nbytes: float) -> None:
        self.ops.append(Op(BYTES, name, nbytes=float(nbytes)))

    def comm(self, kind: str, nbytes: float) -> None:
        if self.g.tp > 1:
            self.ops.append(Op(COMM, kind, "tp", nbytes=float(nbytes)))

    def to_tp(self) -> None:
        """A column-parallel linear's input: SP's all-gather (f̄); f is the identity."""
        if self.g.sequence_parallel:
            self.comm("all_gather", self.g.stream)

    def from_tp(self) -> None:
        """A row-parallel output (g / ḡ) or a column-parallel input gradient (f / f̄)."""
        self.comm("reduce_scatter" if self.g.sequence_parallel else "all_reduce",
                  self.g.stream)


def _core_forward(o: _Ops, n: int) -> None:
    """The attention core's q·kᵀ, softmax, dropout (p > 0): what selective recompute reruns."""
    g, d = o.g, o.g.h // o.g.heads
    o.gemm("attn q@k^T", g.s, g.s, d, n)
    o.bytes("softmax", 2 * g.itemsize * g.scores)
    if g.dropout > 0:
        o.bytes("attention_dropout", (2 * g.itemsize + g.mask) * g.scores)


def _block_forward(o: _Ops, l: int) -> None:
    g = o.g
    T, h, t, d, e = g.tokens, g.h, g.tp, g.h // g.heads, g.itemsize
    residual = (3 * e + g.mask) * g.local  # a branch's dropout and residual add
    o.bytes("layernorm", 2 * e * g.local)
    o.to_tp()
    o.gemm(f"blocks.{l}.attn.qkv", T, 3 * h // t, h)
    _core_forward(o, g.b * g.heads // t)
    o.gemm("attn p@v", g.s, d, g.s, g.b * g.heads // t)
    o.bytes("attention_layout", 2 * e * 4 * T * h // t)  # q, k, v and the context: 4Th/t
    o.gemm(f"blocks.{l}.attn.proj", T, h, h // t)
    o.from_tp()
    o.bytes("dropout_add", residual)
    o.bytes("layernorm", 2 * e * g.local)
    o.to_tp()
    o.gemm(f"blocks.{l}.mlp.fc1", T, g.ffn // t, h)
    o.bytes("gelu", 2 * e * T * g.ffn // t)
    o.gemm(f"blocks.{l}.mlp.fc2", T, h, g.ffn // t)
    o.from_tp()
    o.bytes("dropout_add", residual)


def _row_backward(o: _Ops, w: Optional[_Ops], label: str, n_in: int, n_out: int) -> None:
    """A row-parallel linear [T, in/t] -> [T, out]: ḡ's conjugate, dgrad, wgrad."""
    T = o.g.tokens
    if o.g.sequence_parallel:
        o.comm("all_gather", o.g.stream)
    o.gemm(f"{label}.dgrad", T, n_in, n_out)
    (o if w is None else w).gemm(f"{label}.wgrad", n_out, n_in, T)


def _column_backward(o: _Ops, w: Optional[_Ops], label: str, n_in: int, n_out: int) -> None:
    """A column-parallel linear [T, in] -> [T, out/t]: (SP: its input gathered again for
    the wgrad, at W when split) dgrad, wgrad, then f̄ / f's conjugate."""
    T = o.g.tokens
    if w is None:
        o.to_tp()
        o.gemm(f"{label}.dgrad", T, n_in, n_out)
        o.gemm(f"{label}.wgrad", n_out, n_in, T)
    else:
        o.gemm(f"{label}.dgrad", T, n_in, n_out)
        w.to_tp()
        w.gemm(f"{label}.wgrad", n_out, n_in, T)
    o.from_tp()


def _flush(o: _Ops, elements: int) -> None:
    """SP: the partial gradients of replicated parameters, one all-reduce (sequence.py)."""
    if o.g.sequence_parallel:
        o.comm("all_reduce", elements * o.g.itemsize)


def _block_backward(o: _Ops, w: Optional[_Ops], l: int) -> None:
    g = o.g
    T, h, t, d, e = g.tokens, g.h, g.tp, g.h // g.heads, g.itemsize
    residual = (6 * e + g.mask) * g.local
    if g.recompute == "full":
        _block_forward(o, l)
    o.bytes("dropout_add.backward", residual)
    _row_backward(o, w, f"blocks.{l}.mlp.fc2", g.ffn // t, h)
    o.bytes("gelu.backward", 4 * e * T * g.ffn // t)
    _column_backward(o, w, f"blocks.{l}.mlp.fc1", h, g.ffn // t)
    o.bytes("layernorm.backward", 5 * e * g.local)
    o.bytes("dropout_add.backward", residual)
    _row_backward(o, w, f"blocks.{l}.attn.proj", h // t, h)
    n = g.b * g.heads // t
    if g.recompute == "selective":
        _core_forward(o, n)
    o.gemm("attn d(p@v)/dp", g.s, g.s, d, n)
    o.gemm("attn d(p@v)/dv", g.s, d, g.s, n)
    if g.dropout > 0:
        o.bytes("attention_dropout.backward", (2 * e + g.mask) * g.scores)
    o.bytes("softmax.backward", 3 * e * g.scores)
    o.gemm("attn d(q@k^T)/dq", g.s, d, g.s, n)
    o.gemm("attn d(q@k^T)/dk", g.s, d, g.s, n)
    o.bytes("attention_layout.backward", 2 * e * 4 * T * h // t)
    _column_backward(o, w, f"blocks.{l}.attn.qkv", h, 3 * h // t)
    o.bytes("layernorm.backward", 5 * e * g.local)
    _flush(o if w is None else w, 6 * h)  # ln1, ln2 (weight, bias), proj's and fc2's bias


def _head_forward(o: _Ops) -> None:
    g = o.g
    o.bytes("layernorm", 2 * g.itemsize * g.local)  # ln_f
    o.to_tp()
    o.gemm("lm_head", g.tokens, g.vocab // g.tp, g.h)
    for _ in range(3):  # max, the target's logit, the sum of exponentials (vocab.py)
        o.comm("all_reduce", g.tokens * g.compute_itemsize)
    o.bytes("cross_entropy", (g.itemsize + g.compute_itemsize) * g.tokens * g.vocab // g.tp)


def stage_ops(g: StageShape, kind: str) -> list[Op]:
    """The ops of one action of kind "F", "B", "I" or "W" on this stage (module docstring).
    I and W are the two halves of one split backward (B = I + W, op for op)."""
    embedding = (5 * g.itemsize + g.mask) * g.local  # lookup, position add, dropout
    if kind == "F":
        o = _Ops(g)
        if g.first:
            o.comm("all_reduce", g.stream)  # g of the vocabulary-parallel embedding
            o.bytes("embedding", embedding)
        for l in range(g.lo, g.hi):
            _block_forward(o, l)
        if g.last:
            _head_forward(o)
        return o.ops
    if kind not in ("B", "I", "W"):
        raise ValueError(f"an action is 'F', 'B', 'I' or 'W', got {kind!r}")
    o = _Ops(g)
    w = None if kind == "B" else _Ops(g)
    if g.last:
        o.bytes("cross_entropy.backward",
                (g.itemsize + g.compute_itemsize) * g.tokens * g.vocab // g.tp)
        _column_backward(o, w, "lm_head", g.h, g.vocab // g.tp)
        o.bytes("layernorm.backward", 5 * g.itemsize * g.local)  # ln_f
        if g.root_split:
            _flush(o if w is None else w, 2 * g.h)  # ln_f
    for l in reversed(range(g.lo, g.hi)):
        _block_backward(o, w, l)
    if g.first:
        o.bytes("embedding.backward", embedding)
        if g.sequence_parallel:
            o.comm("all_gather", g.stream)  # the embedding's scatter, backward
        if not g.root_split:
            _flush(o if w is None else w, 2 * g.h)  # ln_f, at the unsplit root's end
    return o.ops if kind in ("B", "I") else w.ops


def stage_units(g: StageShape, tied: bool) -> list[tuple[str, list[int]]]:
    """[(unit, [numel of each parameter])] of this stage on one tp rank, in unit order (the
    order of PipelineStage.units: EMBED, blocks, HEAD; ROOT with one stage)."""
    h, t, f, V = g.h, g.tp, g.ffn, g.vocab
    block = [h, h, 3 * h * h // t, 3 * h // t, h * h // t, h,   # ln1, qkv, proj
             h, h, f * h // t, f // t, h * f // t, h]            # ln2, fc1, fc2
    blocks = [(f"blocks.{l}", list(block)) for l in range(g.lo, g.hi)]
    if not g.root_split:
        root = [V * h // t, g.s * h, h, h] + ([] if tied else [V * h // t])
        return [("root", root)] + blocks
    first = [("embed", [V * h // t, g.s * h])] if g.first else []
    last = [("head", [h, h, V * h // t])] if g.last else []
    return first + blocks + last
