"""M_r = Ψ_r(w + g + K)/shards + n·(L/(p·v))·A_layer + ends + buffers: one rank's memory.

The busiest rank of a layout — the first pipeline rank, which holds the most micro-batches
in flight — by the ledger's categories, each steady (held through the schedule's steady
state) and at its peak (with the transients on top), and each with its formula as text:

    parameters, gradients,   Ψ_r bytes-per-parameter, sharded by ZeRO (rank_states.py)
    optimizer_states
    activations              Korthikanti et al. 2022 ("Reducing Activation Recomputation
                             in Large Transformer Models", section 4), per layer and
                             micro-batch, 16-bit, s the sequence, b the micro-batch:
                               none            sbh(34 + 5as/h)
                               TP              sbh(10 + 24/t + 5as/(ht))
                               TP + SP         sbh(34/t + 5as/(ht))
                               selective       the 5as/h term dropped
                               full            2sbh (÷ t with SP): the layer's input
                             times the layers of one stage, L/(p·v), times n, the stage
                             passes the first rank holds at once, read from the schedule
                             (minipar.parallel.pp.schedules): 1F1B min(p, m), GPipe m,
                             interleaved 1F1B p·v + p − 1, which is L(1 + (p − 1)/(p·v))
                             layers' worth. Context parallelism divides s by cp, and its
                             ring attention keeps no s² scores (flash-style, as minipar's
                             and Megatron's do): the 5as/h term goes.
    comm_buffers             transient only: one tensor-parallel collective's output
                             [s/cp, b, h]; under a pipeline a received activation and a
                             sent gradient [s/cp, b, h] (÷ t with SP); one data-parallel
                             gradient bucket (bucket_mb, PyTorch DDP's 25 MiB; the
                             gradients themselves are views of the buckets, as in
                             Megatron's contiguous buffer), or under ZeRO-3 the next
                             layer's prefetched weights. MoE all-to-all buffers: not counted.

The per-layer figure generalises Korthikanti et al.'s to the model's shape: q = a·d query,
kv = a_kv·d key and value widths, the MLP's width f, SwiGLU's three inner tensors:

    between the blocks  (4e + 2) sbh   (÷ t with SP)  two norm inputs, the QKV and fc1 inputs,
                                                      two 1-byte dropout masks
    inside the blocks   e sb (2q + 2kv) / t           Q, K, V, the output projection's input
                        2e sbf / t  (SwiGLU: 3e sbf)  the activation's input(s), fc2's input
                        MoE: (k + S) experts' inner tensors of width f_e, + k·e sbh (the
                        dispatched copies); routing buffers not counted
    attention core      (2e + 1) a s² b / t           softmax output, its mask, dropped output

with e bytes an element (2 for bf16). A GPT (q = kv = h, f = 4h, GeLU) gets Korthikanti et
al.'s 10 + 24/t and 5as/(ht), equal to plan.memory.activation_bytes_per_layer. Without
dropout the masks go and the softmax output is kept once (e a s² b / t).

scope="model" (default) adds the ends (Korthikanti et al. list them beside the layers and
leave them out of Figure 1): the first stage's embedding dropout mask sbh (÷ t with SP) per
micro-batch in flight, and where the last stage is on the rank, the final norm's and the
head's inputs 2·e·sbh (÷ t with SP) and the float32 logits 4sbV/t: Korthikanti et al.'s
sbhp/t and 4sbh/t·(1 + V/h) in 16 bits with SP. scope="layers" counts the layers alone,
parameters and activations, as Figure 1 does. Token ids (8 bytes a token) are
not counted. The activations' peak adds one recomputing layer's backward: full, the whole
layer less its kept input; selective, the core's (2e + 1)as²b/t less what that layer's
backward freed before reaching it (never below 0); on one stage the head is freed first.
The peak total is the sum of the categories' peaks: a bound, since the transients do not
all coincide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Optional

from ..parallel.pp.actions import B, F, W, parts
from ..parallel.pp.schedules import V_SHAPED, schedule
from ..runtime.ledger import fmt_bytes
from .layout import Layout
from .presets import ClusterSpec, ModelSpec
from .rank_states import (SCOPES, RankParameters, Term, bytes_per_parameter, chunks_of,
                          model_states, zero_stage)

MIB = 2 ** 20
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "comm_buffers")


def _layer_parts(model: ModelSpec, s: int, b: int, t: int, sp: bool, e: int, dropout: bool
                 ) -> dict[str, float]:
    """A layer's saved bytes by where they sit (module docstring): between the blocks,
    the attention's Q, K, V and projection input, the MLP's inner tensors, the core."""
    h, split, mask = model.hidden, (t if sp else 1), (1 if dropout else 0)
    q, kv = model.heads * model.head_dim, model.kv * model.head_dim
    inner = 3 if model.swiglu else 2  # SwiGLU: gate and up outputs, fc2 input
    if model.experts:
        mlp = ((model.top_k + model.shared_experts) * inner * e * s * b * model.expert_ffn / t
               + model.top_k * e * s * b * h)
    else:
        mlp = inner * e * s * b * model.ffn / t
    return {"between": (4 * e + 2 * mask) * s * b * h / split,
            "attention": e * s * b * (2 * q + 2 * kv) / t, "mlp": mlp,
            "core": ((2 * e + 1) if dropout else e) * model.heads * s * s * b / t,
            # what a layer's backward frees before it reaches the core: the MLP's tensors,
            # the second norm's and fc1's inputs, both residual masks, the projection input
            "before_core": mlp + (2 * e + 2 * mask) * s * b * h / split + e * s * b * q / t}


def layer_activation_bytes(model: ModelSpec, s: int, b: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           act_bytes: int = 2, dropout: bool = True, core: bool = True) -> float:
    """sbh(34 + 5as/h) bytes one layer keeps for a GPT (module docstring: generalised to GQA,
    SwiGLU and MoE); sbh(10 + 24/t + 5as/(ht)) under TP, sbh(34/t + 5as/(ht)) with SP,
    without the s² term when selective (or core=False: flash-style attention), e·sbh
    (÷ t with SP) when full. s, b: this rank's tokens of one micro-batch."""
    if recompute == "full":
        return act_bytes * s * b * model.hidden / (tp if sequence_parallel else 1)
    x = _layer_parts(model, s, b, tp, sequence_parallel, act_bytes, dropout)
    kept_core = core and recompute == "none"
    return x["between"] + x["attention"] + x["mlp"] + (x["core"] if kept_core else 0)


def rerun_bytes(model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool,
                recompute: str, act_bytes: int = 2, dropout: bool = True, core: bool = True
                ) -> float:
    """What a recomputing layer adds in its backward on top of what it kept: full, the
    whole layer less its kept input (A_none - 2sbh); selective, the core's 5as²b/t less
    what the layer's backward freed before it (never below 0)."""
    if recompute == "none":
        return 0.0
    args = (model, s, b, tp, sequence_parallel)
    whole = layer_activation_bytes(*args, "none", act_bytes, dropout, core)
    if recompute == "full":
        return whole - layer_activation_bytes(*args, "full", act_bytes, dropout, core)
    x = _layer_parts(model, s, b, tp, sequence_parallel, act_bytes, dropout)
    return max(0.0, x["core"] - x["before_core"]) if core else 0.0


@lru_cache(maxsize=64)
def _first_rank(name: str, pp: int, m: int, v: int) -> tuple:
    """The first pipeline rank's compute actions as (stage, kind, micro-batch), pairs opened."""
    actions = schedule(name, pp, m, None if name in V_SHAPED else v)
    return tuple((a.stage, a.kind, a.microbatch) for item in actions[0] for a in parts(item))


def in_flight(layout: Layout, weight: Callable[[int], float]) -> tuple[float, int, int]:
    """(max over the first rank's list of the held stage passes' summed weights, the most
    passes held at once, the most micro-batches of stage 0 held at once). A pass is held
    from its F to its B (to its W when the backward is split: an upper bound, I frees part)."""
    held: dict[tuple[int, int], float] = {}
    peak = most = first = total = 0.0
    for stage, kind, mb in _first_rank(layout.schedule, layout.pp, layout.microbatches,
                                       chunks_of(layout)):
        if kind == F:
            held[stage, mb] = weight(stage)
            total += held[stage, mb]
            peak, most = max(peak, total), max(most, len(held))
            first = max(first, sum(1 for (st, _) in held if st == 0))
        elif kind in (B, W):
            total -= held.pop((stage, mb))
    return peak, int(most), int(first)


def _closed_form(layout: Layout) -> str:
    p, m, v = layout.pp, layout.microbatches, chunks_of(layout)
    if layout.schedule == "gpipe":
        return f"GPipe: m·v = {m * v}"
    if layout.schedule == "1f1b":
        return f"1F1B: min(p, m) = {min(p, m)}"
    if layout.schedule == "interleaved_1f1b":
        return (f"interleaved 1F1B: p·v + p − 1 = {p * v + p - 1} when m·v is larger, "
                f"L(1 + (p − 1)/(p·v)) layers' worth")
    return f"{layout.schedule}: read from its actions, held until W"


@dataclass(frozen=True)
class RankMemory:
    """One rank's bytes by category (Term: steady, peak, formula) and what they rest on."""

    model: str
    layout: str
    scope: str
    parameters: Term
    gradients: Term
    optimizer_states: Term
    activations: Term
    comm_buffers: Term
    params: RankParameters = field(repr=False)
    layer_activations: float  # A: bytes one layer keeps for one micro-batch on this rank
    in_flight: int  # stage passes held at once on the first rank
    capacity: Optional[int] = None  # the cluster's device memory, bytes

    def terms(self) -> dict[str, Term]:
        return {c: getattr(self, c) for c in CATEGORIES}

    @property
    def steady(self) -> float:
        return sum(t.steady for t in self.terms().values())

    @property
    def peak(self) -> float:
        """The sum of the categories' peaks: a bound on the rank's peak."""
        return sum(t.peak for t in self.terms().values())

    @property
    def fits(self) -> Optional[bool]:
        return None if self.capacity is None else self.peak <= self.capacity

    def report(self) -> str:
        """A table: category, steady, peak (binary units), then each formula."""
        lines = [f"{self.model}, {self.layout}: the first pipeline rank ({self.scope})",
                 f"  {'category':<18}{'steady':>14}{'peak':>14}"]
        for c, t in self.terms().items():
            lines.append(f"  {c:<18}{fmt_bytes(t.steady):>14}{fmt_bytes(t.peak):>14}")
        lines.append(f"  {'total':<18}{fmt_bytes(self.steady):>14}{fmt_bytes(self.peak):>14}")
        if self.capacity is not None:
            lines.append(f"  capacity {fmt_bytes(self.capacity)}: "
                         + ("fits" if self.fits else "does NOT fit"))
        lines += [f"  {c}: {t.formula}" for c, t in self.terms().items()]
        return "\n".join(lines)


def _activations(model: ModelSpec, layout: Layout, scope: str, dropout: bool
                 ) -> tuple[Term, float, int]:
    """n·(L/(p·v))·A + ends on the first pipeline rank: (the Term, A, n). Bytes."""
    t, p, c, v = layout.tp, layout.pp, layout.cp, chunks_of(layout)
    sp, e = layout.sequence_parallel, (2 if layout.precision == "bf16" else 4)  # e: bytes
    s, b, h = model.seq_len // c, layout.micro_batch, model.hidden  # a micro-batch's [s/cp, b, h]
    split, core = (t if sp else 1), c == 1  # ring attention keeps no s² scores
    A = layer_activation_bytes(model, s, b, t, sp, layout.recompute, e, dropout, core)
    per_stage = model.layers // (p * v)
    embed = s * b * h / split if dropout and scope == "model" else 0  # the 1-byte mask
    head = (2 * e * s * b * h / split + 4 * s * b * -(-model.vocab // t)  # inputs, fp32 logits
            if scope == "model" else 0)
    last = p * v - 1
    steady, n, n0 = in_flight(layout, lambda st: per_stage * A + (embed if st == 0 else 0)
                              + (head if st == last else 0))
    rerun = rerun_bytes(model, s, b, t, sp, layout.recompute, e, dropout, core)
    base = steady - (head if p * v == 1 else 0)  # one stage: the head is freed before a rerun
    peak = max(steady, base + rerun)
    ends = ([f"embedding mask sbh{'/t' if sp else ''} = {embed:,.0f} B a stage-0 pass "
             f"(at most {n0} held)"] if embed else [])
    if head and (p == 1 or layout.schedule in V_SHAPED):
        ends.append(f"head 2e·sbh{'/t' if sp else ''} + 4sb·V/t = {head:,.0f} B a pass")
    kind = ({"none": "no recompute", "selective": "selective recompute",
             "full": "full recompute"}[layout.recompute] + (", TP" if t > 1 else "") + (" + SP" if sp else "")
            + (f", s/cp with cp = {c} (no s² scores)" if c > 1 else ""))
    formula = (f"n × L/(p·v) × A = {n} × {per_stage} × {A:,.0f} B ({kind}; n from the "
               f"schedule, {_closed_form(layout)})" + "".join(f" + {x}" for x in ends)
               + f" = {steady:,.0f} B")
    if peak > steady:
        formula += (f"; peak: + {peak - steady:,.0f} B, one layer rerun in the backward"
                    + (f" (+ {rerun:,.0f} B, the head's {head:,.0f} B freed first)"
                       if p * v == 1 and head else ""))
    return Term(steady, peak, formula), A, n


def _buffers(model: ModelSpec, layout: Layout, P: RankParameters, grads: float,
             bucket_mb: float) -> Term:
    """The transient communication buffers of the module docstring. Bytes."""
    t, p, sp = layout.tp, layout.pp, layout.sequence_parallel
    e = 2 if layout.precision == "bf16" else 4
    act = e * model.seq_len // layout.cp * layout.micro_batch * model.hidden  # [s/cp, b, h]
    comm, pieces = 0.0, []
    if t > 1:
        comm += act
        pieces.append(f"a tp collective's output e·sbh = {act:,}")
    if p > 1:
        comm += 2 * act / (t if sp else 1)
        pieces.append(f"a received activation and a sent gradient 2e·sbh{'/t' if sp else ''}"
                      f" = {2 * act / (t if sp else 1):,.0f}")
    z, N = zero_stage(layout), layout.dp * layout.cp
    if z >= 3 and N > 1:
        pb = bytes_per_parameter(layout)[0]
        comm += pb * P.layer
        pieces.append(f"ZeRO-3's prefetched next layer {pb} B × {P.layer:,}")
    elif N > 1:
        bucket = min(bucket_mb * MIB, grads)
        comm += bucket
        pieces.append(f"one gradient bucket min({bucket_mb:g} MiB, the gradients) = "
                      f"{bucket:,.0f}")
    if not pieces:
        return Term(0.0, 0.0, "none: one rank, no collective")
    return Term(0.0, comm, "transient: " + " + ".join(pieces) + f" = {comm:,.0f} B")


def rank_memory(model: ModelSpec, layout: Layout, cluster: Optional[ClusterSpec] = None, *,
                scope: str = "model", dropout: bool = True, bucket_mb: float = 25.0
                ) -> RankMemory:
    """M_r = model states + n·(L/(p·v))·A + ends + buffers on the first pipeline rank
    (module docstring), bytes. scope "layers": the layers alone (Korthikanti et al.'s
    Figure 1); dropout: the layers' 1-byte masks (Megatron's GPT trains with dropout, Llama
    without); bucket_mb: a data-parallel gradient bucket, MiB; cluster: the capacity."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"rank_memory takes a ModelSpec (plan.presets), got "
                        f"{type(model).__name__}; DeepSeek-V3's latent attention is counted "
                        f"in plan.moe, not here")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    P, states = model_states(model, layout, scope)
    act, A, n = _activations(model, layout, scope, dropout)
    buffers = _buffers(model, layout, P, states["gradients"].steady, bucket_mb)
    capacity = cluster.device.memory_bytes if cluster is not None else None
    return RankMemory(model.name, str(layout), scope, states["parameters"], states["gradients"],
                      states["optimizer_states"], act, buffers, P, A, n, capacity)
