"""One pipeline stage's forward and backward time for one micro-batch, term by term.

Per layer, one rank, one micro-batch (compute_time.py's Work: GEMMs at their efficiency,
elementwise bytes / W; comm_time.py's collectives on their links):

    F_layer = GEMMs + s² GEMMs + elementwise + core     + TP_f + CP_f + A2A
    B_layer = 2 (GEMMs + s² GEMMs) + elementwise_b + core_b + R + TP_b + CP_b + A2A
      R   recomputation: 0 ("none"); the s² GEMMs and the core's softmax and dropout
          forward again ("selective": Korthikanti et al. 2022, section 5, the attention
          core); the layer's whole forward again, with its TP_f, CP_f and A2A ("full")
      TP_b the backward's collectives waited for, plus each column-parallel linear's
          (QKV, MLP up) own: max(0, re-gather - its dgrad GEMM) + max(0, AR or RS of its
          input gradient - its wgrad GEMM) with Overlap.tp_backward, else all of them
      CP  ring attention's exposed sends; A2A two all-to-alls a MoE layer each way

    F_i = n_i F_layer + [i = 0] (F_emb + TP_emb) + [i = last] (F_head + TP_head) + Z3_f
    B_i = n_i B_layer + [i = 0] B_emb + [i = last] (B_head + TP_head) + Z3_b
      Z3  ZeRO-3's gathers (and reduce-scatter) of the stage's weights each micro-batch;
          with Overlap.zero3_prefetch only max(0, comm - compute) plus one unit's share
          (units: the stage's layers, its embedding, its head), which nothing hides,
          and never more than all of it
    W_i = the weight-gradient GEMMs, as long as their forward: n_i GEMMs (+ the head's),
          inside B_i: a zero-bubble schedule runs I_i = B_i - W_i and W_i apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.topology import Topology
from . import comm_time as comm
from .compute_time import (Shape, Work, embedding_work, head_work, layer_gemms, layer_work,
                           shape_of)
from .gemm import GemmEfficiency

TERMS = ("matmul", "attention", "elementwise", "recompute", "tp", "cp", "ep", "zero3",
         "pipeline", "dp", "param_gather", "optimizer")
COMPUTE = ("matmul", "attention", "elementwise", "recompute")
COLUMN_PARALLEL = ("qkv", "mlp up", "experts up")


@dataclass(frozen=True)
class Overlap:
    """What runs while something else computes (comm_time.py says how much hides)."""

    dp_grad: bool = True         # gradient reduction behind the last backward (DDP buckets)
    param_gather: bool = False   # ZeRO-1/2 weights' all-gather behind the next forward
    zero3_prefetch: bool = True  # the next unit's gather behind this one's compute
    cp_kv: bool = True           # each ring step's K/V send behind its block
    tp_backward: bool = True     # a column-parallel linear's backward collectives behind
    #                              its GEMMs (Megatron-LM from 2022; not in SC'21's code)

    @staticmethod
    def none() -> "Overlap":
        return Overlap(False, False, False, False, False)


@dataclass(frozen=True)
class Setup:
    """What every stage of one (model, layout, cluster) shares."""

    sh: Shape
    groups: comm.Groups
    topo: Topology
    gemm: GemmEfficiency
    peak: float
    layer: Work
    embedding: Work
    head: Work


def setup(model, layout, cluster, gemm: GemmEfficiency, dropout: bool,
          flash_attention: bool) -> Setup:
    peak = cluster.device.peak("bfloat16" if layout.precision == "bf16" else "float32")
    W = cluster.elementwise_bandwidth
    sh = shape_of(model, layout, dropout)
    return Setup(sh, comm.groups_of(layout), comm.topology_of(cluster, layout), gemm, peak,
                 layer_work(sh, gemm, peak, W, flash_attention), embedding_work(sh, W),
                 head_work(sh, gemm, peak, W))


def empty() -> dict:
    return dict.fromkeys(TERMS, 0.0)


@dataclass(frozen=True)
class StageTime:
    """One stage, one micro-batch: seconds by term, forward and backward."""

    forward: dict
    backward: dict
    weight: float        # W: the weight-gradient GEMMs inside the backward
    communication: dict  # its collectives' seconds before any overlap, F + B

    @property
    def F(self) -> float:
        return sum(self.forward.values())

    @property
    def B(self) -> float:
        return sum(self.backward.values())


def layer_parts(su: Setup, recompute: str, overlap: Overlap) -> tuple[dict, dict, dict]:
    """(forward, backward, communication before overlap) of one layer, by term."""
    sh, g, topo, lw = su.sh, su.groups, su.topo, su.layer
    F, B, raw = empty(), empty(), empty()
    tp = comm.tp_layer(sh, g, topo)
    columns = [su.gemm.seconds(x.M, x.N, x.K, su.peak, x.count) for x in layer_gemms(sh)
               if x.name in COLUMN_PARALLEL]
    behind = len(columns) * (tp.behind_dgrad + tp.behind_wgrad)
    if overlap.tp_backward:
        behind = sum(max(0.0, tp.behind_dgrad - c) + max(0.0, tp.behind_wgrad - c)
                     for c in columns)
    cp_f, cp_b = comm.cp_ring(sh, g, topo, lw.attention, 2 * lw.attention, overlap.cp_kv)
    cp_raw = comm.cp_ring(sh, g, topo, lw.attention, 2 * lw.attention, False)
    a2a = 2 * comm.ep_all_to_all(sh, g, topo)
    F.update(matmul=lw.matmul, attention=lw.attention, elementwise=lw.elementwise + lw.core,
             tp=tp.forward, cp=cp_f, ep=a2a)
    B.update(matmul=2 * lw.matmul, attention=2 * lw.attention,
             elementwise=lw.elementwise_backward + lw.core_backward,
             tp=tp.backward + behind, cp=cp_b, ep=a2a)
    raw.update(tp=tp.forward + tp.backward + len(columns) * (tp.behind_dgrad + tp.behind_wgrad),
               cp=sum(cp_raw), ep=2 * a2a)
    if recompute == "selective":
        B["recompute"] = lw.attention + lw.core
    elif recompute == "full":
        B["recompute"] = lw.forward
        for k, extra in (("tp", tp.forward), ("cp", cp_f), ("ep", a2a)):
            B[k] += extra
        for k, extra in (("tp", tp.forward), ("cp", cp_raw[0]), ("ep", a2a)):
            raw[k] += extra
    return F, B, raw


def stage_time(su: Setup, parts: tuple, n: int, first: bool, last: bool,
               overlap: Overlap, zero3: tuple[float, float] = (0.0, 0.0)) -> StageTime:
    """Stage of n layers (module docstring); parts = layer_parts(...); zero3 = (forward,
    backward) seconds of ZeRO-3's collectives for the stage's weights, one micro-batch."""
    lf, lb, lraw = parts
    F = {k: n * v for k, v in lf.items()}
    B = {k: n * v for k, v in lb.items()}
    raw = {k: n * v for k, v in lraw.items()}
    weight = n * su.layer.matmul
    ends = ((first, su.embedding, comm.tp_embedding(su.sh, su.groups, su.topo)),
            (last, su.head, comm.tp_head(su.sh, su.groups, su.topo)))
    for on, work, c in ends:
        if on:
            F["matmul"] += work.matmul
            B["matmul"] += 2 * work.matmul
            F["elementwise"] += work.elementwise
            B["elementwise"] += work.elementwise_backward
            F["tp"] += c.forward
            B["tp"] += c.backward
            raw["tp"] += c.forward + c.backward
            weight += work.matmul
    z_f, z_b = zero3
    if z_f or z_b:
        units = n + first + last
        fc = sum(F[k] for k in COMPUTE)
        bc = sum(B[k] for k in COMPUTE)
        if overlap.zero3_prefetch:
            F["zero3"] = min(z_f, max(0.0, z_f - fc) + z_f / units)
            B["zero3"] = min(z_b, max(0.0, z_b - bc) + z_b / units)
        else:
            F["zero3"], B["zero3"] = z_f, z_b
        raw["zero3"] = z_f + z_b
    return StageTime(F, B, weight, raw)
