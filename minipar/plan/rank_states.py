"""Ψ_r = L_r · P_layer/t + ends: the parameters one rank holds, and their model-state bytes.

One rank of a layout holds, of a ModelSpec (presets.py), counted exactly:

    per layer    split by tp (Megatron's column- and row-parallel linears): the QKV, output,
                 fc1 (gate, up) and fc2 matrices and the column-parallel biases ÷ t; the
                 row-parallel biases (output, fc2) and the norms whole on every tp rank
    MoE layer    the router E·h whole; the shared experts ÷ t; E/ep routed experts, each
                 ÷ t (Megatron's expert tensor parallelism defaults to tp; minipar's own MoE
                 keeps the experts whole on every tp rank)
    layers       L/(p·v) on each of its v stages: L_r = L/p
    ends         the first stage: the word embedding ceil(V/t)·h (vocabulary-parallel,
                 padded to a multiple of t; Megatron pads further, to 128·t) and learned
                 positions s·h (whole); the last stage: the final norm and an untied head
                 ceil(V/t)·h (tied: the last stage keeps a copy of the embedding when it is
                 another rank, as Megatron does). The first pipeline rank holds the last
                 stage too when pp = 1 or in a V schedule.

scope="layers" counts what Korthikanti et al. 2022's Figure 1 counts: the layers' weight
matrices alone (12·h² a layer for a GPT: 12·l·h²/(t·p) a rank), no biases, norms,
embeddings or head.

Bytes per parameter (Layout.precision, Layout.fp32_grads):

    bf16, fp32_grads (Megatron's main_grad)   2 weights + 4 gradients + 12 (fp32 master, m, v) = 18
    bf16, 16-bit gradients (ZeRO's count)     2 + 2 + 12 = 16
    fp32                                      4 + 4 + 8 (m, v; no master copy) = 16

Sharding (plan/zero.py's model_state_bytes, applied twice): ZeRO stage z over N = dp·cp for
the dense parameters and over N_e = dp·cp/ep for the experts (expert data parallelism);
Megatron's distributed optimizer is ZeRO-1 (the 12 sharded, 6 + 12/N bytes with fp32
gradients). No padding of the flat buffers is counted (minipar pads each unit to a multiple
of N: a few elements).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..parallel.pp.schedules import V_SHAPED  # two stages a rank: r and 2p - 1 - r
from ..runtime.checks import divisors
from .layout import Layout
from .presets import ModelSpec
from .zero import STAGE_NAMES, model_state_bytes

SCOPES = ("model", "layers")


@dataclass(frozen=True)
class Term:
    """One category's bytes on a rank: steady (held through the schedule's steady state),
    peak (with the transients on top) and the formula that gave them, as text."""

    steady: float
    peak: float
    formula: str


@dataclass(frozen=True)
class RankParameters:
    """Parameters one rank holds (counts, not bytes); the first pipeline rank."""

    dense: int  # sharded over dp·cp by ZeRO
    expert: int  # routed experts: sharded over dp·cp/ep
    layers: int  # L_r = layers on the rank (all its stages)
    layer: int  # one layer's parameters on the rank (dense + its E/ep experts)
    ends: int  # embedding (and head) on the rank
    largest: int  # the largest single tensor on the rank (elements)
    formula: str

    @property
    def total(self) -> int:
        return self.dense + self.expert


def bytes_per_parameter(layout: Layout) -> tuple[int, int, int]:
    """(w, g, K) bytes a parameter: (2, 4, 12), (2, 2, 12) or (4, 4, 8) (module docstring)."""
    if layout.precision == "fp32":
        return 4, 4, 8
    return 2, (4 if layout.fp32_grads else 2), 12


def zero_stage(layout: Layout) -> int:
    """The ZeRO stage the layout shards at: Layout.zero, at least 1 with Megatron's
    distributed optimizer (ZeRO-1 by another name)."""
    return max(layout.zero, 1 if layout.distributed_optimizer else 0)


def check_split(model: ModelSpec, layout: Layout) -> None:
    """Refuse a layout the model cannot split: heads and kv heads by tp, the MLP's width by
    tp, layers by pp x chunks, experts by ep, the sequence by cp (and by tp under SP)."""
    t, v = layout.tp, chunks_of(layout)
    for what, n, rule in (("heads", model.heads, "num_attention_heads"),
                          ("key-value heads", model.kv, "num_query_groups")):
        if n % t:
            raise ValueError(f"{model.name} has {n} {what}, which tp = {t} cannot split: each "
                             f"tensor-parallel rank needs whole heads (Megatron: {rule} % tp "
                             f"== 0); use tp in {divisors(n)}")
    for what, f in (("ffn", model.ffn), ("expert_ffn", model.expert_ffn)):
        if f and f % t:
            raise ValueError(f"{model.name}'s {what} = {f} does not split over tp = {t}: "
                             f"expected a width divisible by tp; use tp in {divisors(f)}")
    stages = layout.pp * v
    if model.layers % stages:
        raise ValueError(f"{model.name}'s {model.layers} layers do not split into pp x chunks "
                         f"= {layout.pp} x {v} = {stages} equal stages (Megatron refuses an "
                         f"uneven split); expected pp x chunks in {divisors(model.layers)}")
    if layout.ep > 1 and not model.experts:
        raise ValueError(f"ep = {layout.ep} splits experts, but {model.name} is dense: use ep = 1")
    if model.experts and model.experts % layout.ep:
        raise ValueError(f"{model.name}'s {model.experts} experts do not split over ep = "
                         f"{layout.ep}: each rank holds E/ep whole experts; use ep in "
                         f"{divisors(model.experts)} (dividing dp x cp = "
                         f"{layout.dp * layout.cp})")
    s, c = model.seq_len, layout.cp
    if s % c or (layout.sequence_parallel and (s // c) % t):
        raise ValueError(f"{model.name}'s sequence s = {s} must split over cp = {c}"
                         + (f" and then over tp = {t} (sequence parallelism)"
                            if layout.sequence_parallel else "")
                         + f": expected s divisible by "
                           f"{c * (t if layout.sequence_parallel else 1)}")


def chunks_of(layout: Layout) -> int:
    """v: stages a pipeline rank holds (2 in the V schedules, Layout.chunks otherwise)."""
    return 2 if layout.schedule in V_SHAPED else layout.chunks


def _mlp(model: ModelSpec, f: int, t: int, matrices: bool) -> tuple[int, list[int]]:
    """One MLP of width f on a tp rank: (parameters, its tensors' sizes)."""
    h, n = model.hidden, 3 if model.swiglu else 2
    tensors = [(n - 1) * h * f // t, f * h // t]  # fc1 (gate and up fused), fc2
    if matrices or not model.biases:
        return n * h * f // t, tensors
    return n * h * f // t + (n - 1) * f // t + h, tensors


def layer_on_rank(model: ModelSpec, t: int, ep: int, matrices: bool = False
                  ) -> tuple[int, int, list[int]]:
    """(dense, expert, tensor sizes) of one layer on a tp rank of an ep group; the whole
    layer (ModelSpec.layer_parameters) at t = ep = 1 unless `matrices`."""
    h, d = model.hidden, model.head_dim
    q, kv = model.heads * d, model.kv * d
    attention = (h * q + 2 * h * kv + q * h) // t
    tensors = [h * (q + 2 * kv) // t, q * h // t]
    if not matrices:
        attention += ((q + 2 * kv) // t + h if model.biases else 0)
        attention += 2 * h * (2 if model.layernorm else 1)
    if not model.experts:
        mlp, more = _mlp(model, model.ffn, t, matrices)
        return attention + mlp, 0, tensors + more
    one, more = _mlp(model, model.expert_ffn, t, matrices)
    router = model.experts * h
    dense = attention + router + model.shared_experts * one
    return dense, model.experts // ep * one, tensors + more + [router]


def rank_parameters(model: ModelSpec, layout: Layout, scope: str = "model") -> RankParameters:
    """Ψ_r = L/p · P_layer/t + ends: the parameters of the first pipeline rank (module
    docstring); scope "layers": the layers' weight matrices only (12·l·h²/(t·p) for a GPT)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    check_split(model, layout)
    t, p, matrices = layout.tp, layout.pp, scope == "layers"
    dense, expert, tensors = layer_on_rank(model, t, layout.ep, matrices)
    L_r = model.layers // p
    h, V_t = model.hidden, -(-model.vocab // t)
    head_here = p == 1 or layout.schedule in V_SHAPED  # the last stage on rank 0 too
    ends, parts = 0, []
    if not matrices:
        ends += V_t * h + (model.seq_len * h if model.learned_positions else 0)
        parts.append(f"embedding ceil(V/t)·h = {V_t * h:,}"
                     + (f" + positions s·h = {model.seq_len * h:,}"
                        if model.learned_positions else ""))
        tensors += [V_t * h, model.seq_len * h if model.learned_positions else 0]
        if head_here:
            final = h * (2 if model.layernorm else 1)
            head = 0 if model.tied else V_t * h
            ends += final + head
            parts.append(f"final norm {final:,}" + (f" + head ceil(V/t)·h = {head:,}"
                                                     if head else " (head tied)"))
    what = "weight matrices (12h²/t a GPT layer)" if matrices else "parameters"
    formula = (f"Ψ_r = L/p · layer + ends = {L_r} × {dense + expert:,} (one layer's {what} "
               f"on the rank" + (f", {model.experts // layout.ep} of {model.experts} experts"
                                 if model.experts else "") + ")"
               + (" + " + " + ".join(parts) if parts else "")
               + f" = {L_r * (dense + expert) + ends:,}")
    return RankParameters(L_r * dense + ends, L_r * expert, L_r, dense + expert, ends,
                          max(tensors), formula)


def model_states(model: ModelSpec, layout: Layout, scope: str = "model"
                 ) -> tuple[RankParameters, dict[str, Term]]:
    """Bytes of parameters, gradients and optimizer states on the first pipeline rank:
    ZeRO stage z over N = dp·cp (experts over dp·cp/ep), steady and peak (the transients:
    ZeRO-3's gathered units, ZeRO-2/3's unreduced gradients of the units in the backward,
    the float32 copy of one 16-bit gradient in the optimizer step)."""
    P = rank_parameters(model, layout, scope)
    pb, gb, k = bytes_per_parameter(layout)
    z, N = zero_stage(layout), layout.dp * layout.cp
    N_e = N // layout.ep
    dense = model_state_bytes(P.dense, z, N, k=k, param_bytes=pb, grad_bytes=gb)
    expert = model_state_bytes(P.expert, z, N_e, k=k, param_bytes=pb, grad_bytes=gb)
    steady = {c: dense[c] + expert[c] for c in ("parameters", "gradients", "optimizer_states")}
    shard = (f"{STAGE_NAMES[z]} over N = dp·cp = {N}" + (f", experts over N_e = {N_e}"
                                                         if P.expert else "")
             if N > 1 else "one data-parallel rank")
    gathered = pb * (P.ends + P.layer) if z >= 3 and N > 1 else 0
    unreduced = gb * (P.ends + 2 * P.layer) if z >= 2 and N > 1 else 0
    upcast = 4 * P.largest if gb == 2 and layout.precision == "bf16" else 0
    sharded = {"parameters": z >= 3, "gradients": z >= 2, "optimizer_states": z >= 1}
    per = {"parameters": pb, "gradients": gb, "optimizer_states": k}
    names = {"parameters": "weights", "gradients": "gradients",
             "optimizer_states": "fp32 master, m, v" if k == 12 else "Adam m, v"}
    terms = {}
    for c, extra, why in (
            ("parameters", gathered, f"ZeRO-3 gathers the rank's ends and one layer: "
                                     f"+ {pb} B × ({P.ends:,} + {P.layer:,})"),
            ("gradients", max(unreduced, upcast),
             (f"ZeRO-2/3 hold the unreduced gradients of the ends and two layers (one in "
              f"the backward, one reducing): + {gb} B × ({P.ends:,} + 2 × {P.layer:,})"
              if unreduced >= upcast else
              f"the optimizer step's float32 copy of one 16-bit gradient: + 4 B × "
              f"{P.largest:,} (the largest tensor)")),
            ("optimizer_states", 0, "")):
        formula = (f"{per[c]} B ({names[c]}) × Ψ_r" + (" / N" if sharded[c] and N > 1 else "")
                   + f" ({shard}) = {steady[c]:,.0f} B")
        if c == "parameters":
            formula += f"; {P.formula}"
        if extra:
            formula += f"; peak: {why}"
        terms[c] = Term(steady[c], steady[c] + extra, formula)
    return P, terms

