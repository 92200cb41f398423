"""sent(rank) = intra + inter bytes by link class: read from a trace, or predicted at any width.

    sent(rank) = sum over its events of the bytes it put on the wire, split by link class:
                 "intra" (NVLink, inside a node) and "inter" (InfiniBand, across nodes)

Each collective is split the way its algorithm moves data (runtime/cost.py):

    ring (all_reduce, all_gather, reduce_scatter, and the broadcast/reduce chains)
        every byte a member sends goes to its successor in the group (rank order), so it
        is on the link to that successor
    hierarchical (a group with m members on each of k nodes)
        all_reduce  2(m-1)/m * S inside the node + 2(k-1)/k * S/m across nodes
        all_gather, reduce_scatter  (m-1)/m * S inside + (k-1)/k * S/m across
    point-to-point send  the link between the two ranks

`predict` enumerates, for one rank of a dp x pp x tp layout running one training step, the
collectives and sends that minipar's parallelize issues (tensor parallelism without SP, a
pipeline schedule with one stage a rank, DDP or ZeRO-1/2 over dp_shard), and sizes them from
the model's shape alone: the same function gives a tiny run's bytes, which the tests hold
equal to its trace, and a 70B model's, which no machine here could run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

import numpy as np

from ...nn import GPTConfig
from ...parallel import ParallelDims
from ...runtime import cost
from ...runtime.mesh import DeviceMesh
from ...runtime.topology import Topology
from ...runtime.trace import Event

LINKS = ("intra", "inter")
_RING_LIKE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def group_kind(e: Event) -> str:
    """Which parallel dimension an event's group belongs to: tp, pp, dp (any data-parallel
    group), or the group's own name (model_parallel, ...). A send is a pipeline's."""
    if e.stream == "p2p":
        return "pp"
    if e.label in ("dp", "dp_shard", "dp_replicate", "dp_cp"):
        return "dp"
    return e.label


def split_sent(kind: str, algorithm: str, S: float, group: tuple, me: int, topo: Topology,
               sent: float) -> tuple[float, float]:
    """(intra, inter): the `sent` bytes global rank `me` put on the wire in collective
    `kind` of size S over `group` (global ranks, in order), by link class."""
    if sent == 0 or len(group) == 1:
        return 0.0, 0.0
    if algorithm == "hierarchical":
        nodes = {topo.node_of(r) for r in group}
        k, m = len(nodes), len(group) // len(nodes)
        factor = 2 if kind == "all_reduce" else 1
        intra, inter = factor * (m - 1) / m * S, factor * (k - 1) / k * S / m
        if not np.isclose(intra + inter, sent, rtol=1e-12):
            raise ValueError(f"a hierarchical {kind} of {S:g} B on {k} nodes x {m} sent "
                             f"{sent:g} B, expected {intra + inter:g} B")
        return intra, inter
    if algorithm != "ring" or kind not in _RING_LIKE:
        raise ValueError(f"split_sent knows ring {_RING_LIKE} and hierarchical collectives, "
                         f"not {algorithm} {kind} (on group {list(group)}); run the layout "
                         f"with algorithm='auto'")
    successor = group[(group.index(me) + 1) % len(group)]
    same = topo.node_of(successor) == topo.node_of(me)
    return (float(sent), 0.0) if same else (0.0, float(sent))


def event_split(e: Event, topo: Topology) -> tuple[float, float]:
    """(intra, inter) bytes rank e.rank sent in event `e` (0, 0 for compute and receives)."""
    sent = float(e.meta.get("sent_bytes", 0.0))
    if e.stream == "p2p":
        src, dst = e.group
        return (sent, 0.0) if topo.node_of(src) == topo.node_of(dst) else (0.0, sent)
    if e.stream != "comm":
        return 0.0, 0.0
    return split_sent(e.name, e.meta.get("algorithm", "ring"), e.nbytes, e.group, e.rank, topo,
                      sent)


def measured(events: Iterable[Event], topo: Topology) -> dict[str, dict[str, float]]:
    """{group kind: {"intra": bytes, "inter": bytes, "count": events}} one rank sent."""
    out: dict = defaultdict(lambda: {"intra": 0.0, "inter": 0.0, "count": 0})
    for e in events:
        if e.stream not in ("comm", "p2p"):
            continue
        intra, inter = event_split(e, topo)
        row = out[group_kind(e)]
        row["intra"] += intra
        row["inter"] += inter
        row["count"] += 1
    return dict(out)


# ---- the prediction ---------------------------------------------------------------------
def group_of(dims: ParallelDims, rank: int, *names: str) -> tuple[int, ...]:
    """The global ranks sharing `rank`'s coordinate on every mesh dimension not in `names`
    (what ParallelGroups builds inside a launch, computed here without one)."""
    mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
    where = mesh.coordinate(rank)
    index = tuple(slice(None) if n in names else where[n] for n in mesh.mesh_dim_names)
    return tuple(sorted(int(r) for r in np.asarray(mesh.grid[index]).reshape(-1)))


def stage_blocks(num_layers: int, pp: int) -> list[int]:
    """Blocks per stage: even, the remainder on the first stages (parallelize's default)."""
    return [num_layers // pp + (1 if s < num_layers % pp else 0) for s in range(pp)]


def unit_elements(cfg: GPTConfig, tp: int, stage: int, pp: int) -> list[int]:
    """Elements of each unit (embedding, blocks, head) one tp rank of `stage` holds:

        embedding  V h / t + s h          (vocabulary-parallel wte, replicated wpe)
        block      6h + (4h^2 + 3h + 2hF + F) / t   (2 LayerNorms and the 2 row-parallel
                   biases replicated; QKV, projection, fc1, fc2 split)
        head       2h + V h / t           (ln_f, vocabulary-parallel lm_head; untied)"""
    h, F, V, s = cfg.hidden, cfg.ffn_hidden or 4 * cfg.hidden, cfg.vocab_size, cfg.seq_len
    units = [V * h // tp + s * h] if stage == 0 else []
    units += [6 * h + (4 * h * h + 3 * h + 2 * h * F + F) // tp] * stage_blocks(
        cfg.num_layers, pp)[stage]
    return units + ([2 * h + V * h // tp] if stage == pp - 1 else [])


def _add(out: dict, what: str, kind: str, S: float, group: tuple, me: int, topo: Topology,
         count: int = 1, root: int = 0) -> None:
    if len(group) == 1 or count == 0:
        return
    c = cost.collective_cost(kind, S, group, topo)
    algo = c.algorithm
    nodes = len({topo.node_of(r) for r in group})
    sent = cost.bytes_sent(kind, algo, S, len(group), group.index(me), root, nodes)
    intra, inter = split_sent(kind, algo, S, group, me, topo, sent)
    row = out.setdefault(what, {"intra": 0.0, "inter": 0.0, "count": 0, "seconds": 0.0})
    row["intra"] += count * intra
    row["inter"] += count * inter
    row["count"] += count
    row["seconds"] += count * c.seconds


def predict(cfg: GPTConfig, dims: ParallelDims, topo: Topology, rank: int, global_batch: int,
            microbatches: int, zero: int = 0, grad_bytes: Optional[int] = None,
            loss_bytes: Optional[int] = None) -> dict[str, dict[str, float]]:
    """What `measured` reads from rank `rank`'s trace over one step (forward, backward,
    optimizer step) of parallelize(cfg, dims, zero=zero, schedule=<one stage a rank>,
    microbatches=m), untied embeddings, no SP, no clipping. Each row also has "seconds":
    the cost model's durations summed (serially: no overlap, no bubble). grad_bytes: bytes
    of a gradient element on the wire (default the model dtype's); loss_bytes: of the
    cross-entropy's per-token reductions (default float32 for 16-bit models)."""
    if cfg.tie_embeddings or zero not in (0, 1, 2) or (zero and dims.dp_replicate > 1):
        raise ValueError(f"predict covers untied embeddings under DDP or ZeRO-1/2 over "
                         f"dp_shard alone; got tie_embeddings={cfg.tie_embeddings}, "
                         f"zero={zero}, {dims}: untie the embeddings, use zero 0, 1 or 2 with "
                         f"dp_replicate=1, or read the bytes from a run's trace (measured)")
    item = np.dtype(cfg.np_dtype).itemsize
    grad_bytes = grad_bytes or item
    loss_bytes = loss_bytes or (4 if item == 2 else item)
    p, m = dims.pp, microbatches
    b = global_batch // (dims.dp * m)  # sequences of one micro-batch on one dp rank
    act = cfg.seq_len * b * cfg.hidden * item  # [s, b, h]
    stage = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names).coordinate(rank)["pp"]
    blocks = stage_blocks(cfg.num_layers, p)[stage]
    first, last = stage == 0, stage == p - 1
    out: dict = {}
    tp = group_of(dims, rank, "tp")
    # f and g: 2 all-reduces a block forward, 2 backward; the embedding's forward one, the
    # head's f in backward; the vocabulary-parallel loss: max, sum of exp, target logit
    _add(out, "tp", "all_reduce", act, tp, rank, topo, m * (4 * blocks + first + last))
    _add(out, "tp", "all_reduce", cfg.seq_len * b * loss_bytes, tp, rank, topo, 3 * m * last)
    pp = group_of(dims, rank, "pp")
    if p > 1:
        row = out.setdefault("pp", {"intra": 0.0, "inter": 0.0, "count": 0, "seconds": 0.0})
        for peer, sends in ((pp[stage + 1] if not last else None, m),   # activations
                            (pp[stage - 1] if not first else None, m)):  # their gradients
            if peer is not None:
                link = "intra" if topo.node_of(peer) == topo.node_of(rank) else "inter"
                row[link] += sends * act
                row["count"] += sends
                row["seconds"] += sends * cost.p2p_time(act, topo.link(rank, peer))
        _add(out, "pp", "broadcast", 8, pp, rank, topo, root=p - 1)  # the loss, float64
    units = unit_elements(cfg, dims.tp, stage, p)
    if zero == 0:
        _add(out, "dp", "all_reduce", sum(units) * grad_bytes, group_of(
            dims, rank, "dp_replicate", "dp_shard"), rank, topo)
    else:
        shard = group_of(dims, rank, "dp_shard")
        n = len(shard)
        for u in units:  # reduce-scatter the gradients, all-gather the updated weights
            padded = -(-u // n) * n
            _add(out, "dp", "reduce_scatter", padded * grad_bytes, shard, rank, topo)
            _add(out, "dp", "all_gather", padded * item, shard, rank, topo)
    return out
