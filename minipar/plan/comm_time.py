"""Communication time of one step: every collective priced by the runtime's alpha-beta cost
model (runtime/cost.py) on the links its group crosses, and what of it a rank waits for.
The links are the ClusterSpec's: at the bus bandwidth NCCL is measured to reach where one
is published (the DGX A100's: presets.py), else the wire's nominal rate.

Ranks are laid out as Megatron-LM and ParallelDims lay them out by default (order
tp-cp-dp-pp, tp fastest; ep folded into dp x cp): rank = i_tp + t (i_cp + cp (i_dp + dp
i_pp)), rank r on node r // gpus_per_node. So the groups of rank 0 are

    tp      0, 1, ..., t-1                    inside a node while t <= gpus_per_node
    cp      0, t, 2t, ..., (cp-1)t
    dp x cp 0, t, 2t, ..., (dp·cp-1)t         where the gradients are reduced
    ep      0, t, ..., (ep-1)t                (the first ep ranks of dp x cp)
    pp      stage rank i at i·t·cp·dp

and each collective costs collective_cost(kind, S, group, topology) (the runtime's choice of
algorithm: a ring inside a node, hierarchical across nodes when a node holds several of
the group; S in bytes as nccl-tests count it). With S_act = T·h·e, the [s_c, b, h] stream
of one micro-batch (T = b·s/cp tokens, e bytes an element):

    tp, a layer        forward  2 AR(S_act)   (after the row-parallel projection, MLP down)
                       backward 2 AR(S_act)   (the column-parallel QKV's, MLP up's input
                                              gradients)
    tp + SP, a layer   forward  2 AG(S_act) + 2 RS(S_act)
                       backward 2 AG(S_act) + 2 RS(S_act) + 2 AG(S_act) (the column-parallel
                       linears' inputs gathered again for their weight gradients)
    tp, embedding      forward AR (SP: RS); backward - (SP: AG)
    tp, head           forward 3 AR(4T) (the cross-entropy's max, sum, target logit)
                       (+ SP: AG); backward AR (SP: RS)
    pp, a message      a + (T·h·e/t)/B: each tp rank sends its 1/t (with SP the stream is
                       already split; without, Megatron's scatter-gather then all-gathers
                       it inside the node: + AG(S_act))
    dp, a step         DDP: AR(G) of the rank's gradients (G = Ψ_r g bytes, g = 4 with
                       float32 gradients, else e); ZeRO-1/2 and the distributed optimizer:
                       RS(G), and AG(Ψ_r e) of the updated weights after the optimizer;
                       experts' gradients over the expert-data-parallel group (dp·cp/ep)
    zero-3, a stage    forward AG(Ψ_s e); backward AG(Ψ_s e) + RS(Ψ_s g), each micro-batch
                       (Ψ_s: the stage's parameters on the rank, gathered unit by unit)
    cp, a layer        ring attention (p2p to the next rank of the ring): forward cp - 1
                       sends of K and V, 2 T a_kv d e / t bytes; backward cp - 1 sends of
                       K, V and dK, dV (float32, 2 T a_kv d 4 / t), and the last dK, dV home
    ep, a MoE layer    4 all-to-alls (dispatch, combine; their gradients), each rank
                       sending T k h e / split, 1/ep of it to each member

What overlaps (stage_time.Overlap): the gradient reduction with the rank's last backward;
ZeRO-3's gathers of the next layer with this layer's compute (prefetch); each ring step's
K/V send with that step's attention block; in the backward of a column-parallel linear
(Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication), SP's re-gather of its
input with its input-gradient GEMM and its input gradient's all-reduce (reduce-scatter
under SP) with its weight-gradient GEMM.
What overlaps is hidden up to the compute it hides behind: exposed = max(0, comm - compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..runtime.cost import all_to_all_time, collective_cost, p2p_time
from ..runtime.topology import Topology
from .compute_time import Shape


@dataclass(frozen=True)
class Groups:
    """Rank 0's group along each dimension, and where each pipeline rank sits."""

    tp: tuple
    cp: tuple
    dp_cp: tuple
    edp: tuple  # expert data parallel: the dp x cp ranks holding the same experts
    ep: tuple
    stage_stride: int

    def pipeline_rank(self, i: int) -> int:
        """Global rank of pipeline rank i (its tp, cp, dp coordinates 0)."""
        return i * self.stage_stride


def groups_of(layout) -> Groups:
    t, c, dp, ep = layout.tp, layout.cp, layout.dp, layout.ep
    dpc = tuple(t * j for j in range(dp * c))
    return Groups(tp=tuple(range(t)), cp=tuple(t * j for j in range(c)), dp_cp=dpc,
                  edp=dpc[::ep], ep=dpc[:ep], stage_stride=t * c * dp)


def topology_of(cluster, layout) -> Topology:
    """Enough whole nodes of `cluster` for the layout's GPUs."""
    return cluster.topology(nodes=math.ceil(layout.gpus / cluster.gpus_per_node))


def _cost(kind: str, S: float, ranks: tuple, topo: Topology) -> float:
    """A collective's seconds; none on a group of one or with nothing to move (a dense
    model's expert gradients: no collective is issued, so no latency is paid)."""
    return collective_cost(kind, S, ranks, topo).seconds if len(ranks) > 1 and S > 0 else 0.0


@dataclass(frozen=True)
class TPComm:
    """Seconds of tensor-parallel collectives for one micro-batch on one rank."""

    forward: float
    backward: float         # waited for whatever overlaps
    behind_dgrad: float = 0.0  # per column-parallel linear (QKV, MLP up): SP's re-gather
    behind_wgrad: float = 0.0  # per column-parallel linear: its input gradient's AR or RS


def tp_layer(sh: Shape, g: Groups, topo: Topology) -> TPComm:
    """A layer's (module docstring). Without SP: 2 AR forward (after the row-parallel
    projection and MLP down); in the backward the two column-parallel linears (QKV, MLP
    up) all-reduce their input gradient, which Megatron-LM overlaps with their weight-
    gradient GEMM. With SP: 2 AG + 2 RS forward; backward 2 AG (the row-parallel linears'
    output gradients) waited for, and per column-parallel linear an AG of its input (again:
    Megatron keeps the sharded input) behind its input-gradient GEMM and an RS of its input
    gradient behind its weight-gradient GEMM."""
    S = sh.T * sh.h * sh.e
    if sh.split == 1:
        ar = _cost("all_reduce", S, g.tp, topo)
        return TPComm(2 * ar, 0.0, 0.0, ar)
    ag, rs = _cost("all_gather", S, g.tp, topo), _cost("reduce_scatter", S, g.tp, topo)
    return TPComm(2 * (ag + rs), 2 * ag, ag, rs)


def tp_embedding(sh: Shape, g: Groups, topo: Topology) -> TPComm:
    """The vocabulary-parallel embedding: AR of its output forward (SP: RS); nothing
    backward (SP: AG of the output gradient)."""
    S = sh.T * sh.h * sh.e
    if sh.split == 1:
        return TPComm(_cost("all_reduce", S, g.tp, topo), 0.0, 0.0)
    return TPComm(_cost("reduce_scatter", S, g.tp, topo), _cost("all_gather", S, g.tp, topo),
                  0.0)


def tp_head(sh: Shape, g: Groups, topo: Topology) -> TPComm:
    """The vocabulary-parallel logits and cross-entropy: 3 AR of T floats forward (the
    max, the sum of exponentials, the target's logit; SP: + AG of the final LayerNorm's
    output); backward AR of the input gradient (SP: RS)."""
    S = sh.T * sh.h * sh.e
    loss = 3 * _cost("all_reduce", 4 * sh.T, g.tp, topo)
    if sh.split == 1:
        return TPComm(loss, _cost("all_reduce", S, g.tp, topo), 0.0)
    return TPComm(loss + _cost("all_gather", S, g.tp, topo),
                  _cost("reduce_scatter", S, g.tp, topo), 0.0)


def p2p_message(sh: Shape, g: Groups, topo: Topology, src: int, dst: int) -> float:
    """One pipeline message between pipeline ranks src and dst: a + (T h e / t)/B, plus the
    scatter-gather's all-gather inside the node when the stream is not split by SP."""
    S = sh.T * sh.h * sh.e
    link = topo.link(g.pipeline_rank(src), g.pipeline_rank(dst))
    gather = _cost("all_gather", S, g.tp, topo) if sh.split == 1 and sh.t > 1 else 0.0
    return p2p_time(S / sh.t, link) + gather


def dp_reduce(grad_bytes: float, expert_grad_bytes: float, sharded: bool, g: Groups,
              topo: Topology) -> float:
    """The step's gradient reduction: AR (DDP) or RS (sharded optimizer states) over dp x cp,
    and the experts' over their expert-data-parallel group."""
    kind = "reduce_scatter" if sharded else "all_reduce"
    return _cost(kind, grad_bytes, g.dp_cp, topo) + _cost(kind, expert_grad_bytes, g.edp, topo)


def dp_param_gather(weight_bytes: float, expert_weight_bytes: float, g: Groups,
                    topo: Topology) -> float:
    """ZeRO-1/2 and the distributed optimizer: AG of the updated weights after the step."""
    return (_cost("all_gather", weight_bytes, g.dp_cp, topo)
            + _cost("all_gather", expert_weight_bytes, g.edp, topo))


def zero3_stage(weight_bytes: float, grad_bytes: float, g: Groups,
                topo: Topology) -> tuple[float, float]:
    """(forward, backward) seconds of ZeRO-3's collectives for a stage's weights in one
    micro-batch: AG of the weights; AG again and RS of the gradients (DeepSpeed reduces
    every micro-batch; stage_time.py hides them behind compute with prefetch)."""
    ag = _cost("all_gather", weight_bytes, g.dp_cp, topo)
    return ag, ag + _cost("reduce_scatter", grad_bytes, g.dp_cp, topo)


def cp_ring(sh: Shape, g: Groups, topo: Topology, attention_forward: float,
            attention_backward: float, overlap: bool) -> tuple[float, float]:
    """(forward, backward) seconds a rank waits for ring attention's sends in one layer.
    Each of the cp - 1 steps sends K, V (dK, dV too in the backward) while it computes one
    block, 1/cp of the rank's attention; the backward's last dK, dV send is never hidden."""
    c = len(g.cp)
    if c == 1:
        return 0.0, 0.0
    link = topo.slowest_link(g.cp)
    kv = 2 * sh.T * sh.a_kv * sh.d / sh.t
    send_f = p2p_time(kv * sh.e, link)
    send_b = p2p_time(kv * sh.e + kv * 4, link)
    last = p2p_time(kv * 4, link)
    if not overlap:
        return (c - 1) * send_f, (c - 1) * send_b + last
    block_f, block_b = attention_forward / c, attention_backward / c
    return ((c - 1) * max(0.0, send_f - block_f),
            (c - 1) * max(0.0, send_b - block_b) + last)


def ep_all_to_all(sh: Shape, g: Groups, topo: Topology) -> float:
    """One all-to-all of a MoE layer: each rank sends T k h e / split bytes, 1/ep to each
    member of its ep group (balanced routing)."""
    n = len(g.ep)
    if n == 1 or not sh.experts:
        return 0.0
    piece = sh.T * sh.top_k * sh.h * sh.e / sh.split / n
    traffic = [[piece] * n for _ in range(n)]
    return all_to_all_time(g.ep, topo, traffic)
