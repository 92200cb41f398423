"""How long a collective takes: the alpha-beta model of each algorithm.

Notation (as in the NCCL performance notes and nccl-tests' PERFORMANCE.md):
    n   ranks in the group             S   the collective's size in bytes (below)
    a   latency of one step (alpha)    B   bandwidth of the link, bytes/s per direction
The size S is what nccl-tests calls the message size: the buffer of all_reduce, broadcast
and reduce; the *whole* gathered output of all_gather and gather; the *whole* input of
reduce_scatter and scatter; all a rank sends (its own piece included) for all_to_all.

    ring all_reduce        2(n-1) a + 2(n-1)/n * S/B     reduce-scatter, then all-gather
    halving-doubling AR    2 log2(n) a + 2(n-1)/n * S/B  Rabenseifner; n a power of two
    tree all_reduce        2 ceil(log2 n) (a + S/B)      binomial reduce then broadcast
    ring all_gather        (n-1) a + (n-1)/n * S/B
    ring reduce_scatter    (n-1) a + (n-1)/n * S/B
    broadcast, reduce      (n-1) a + S/B                 pipelined chain
    gather, scatter        (n-1) a + (n-1)/n * S/B       the root's link carries it all
    all_to_all             (n-1) a + max_r max(intra_r/B_intra, inter_r/B_inter)
    barrier                ceil(log2 n) a                dissemination
    send/recv              a + V/B                       over the link between the two

A group inside one node uses the intra-node link. A ring over a group that spans nodes
runs at the slowest link it crosses (inter-node). The hierarchical algorithm instead runs
inside each node, then across nodes on 1/m of the data (m ranks per node), then inside
each node again:
    hierarchical AR = ring RS_intra(S) + ring AR_inter(S/m) + ring AG_intra(S)
    hierarchical AG = ring AG_inter(S/m) + ring AG_intra(S);  RS the mirror image.

algbw = S / t and busbw = algbw * factor, as nccl-tests defines them, with factor
2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all, gather and
scatter, and 1 for broadcast, reduce and send/recv: busbw is comparable to the link's
bandwidth whatever the collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from .topology import Link, Topology

ALGORITHMS = ("auto", "ring", "tree", "halving_doubling", "hierarchical")


@dataclass(frozen=True)
class Cost:
    """The simulated duration of one collective and how it was obtained."""

    seconds: float
    algorithm: str
    link: str
    formula: str


def ring_all_reduce_time(S: float, n: int, link: Link) -> float:
    """2(n-1) a + 2(n-1)/n * S/B."""
    return 0.0 if n == 1 else 2 * (n - 1) * link.latency + 2 * (n - 1) / n * S / link.bandwidth


def halving_doubling_all_reduce_time(S: float, n: int, link: Link) -> float:
    """2 log2(n) a + 2(n-1)/n * S/B   (recursive halving reduce-scatter + doubling gather)."""
    if n == 1:
        return 0.0
    return 2 * math.log2(n) * link.latency + 2 * (n - 1) / n * S / link.bandwidth


def tree_all_reduce_time(S: float, n: int, link: Link) -> float:
    """2 ceil(log2 n) (a + S/B): a binomial-tree reduce to the root, then a broadcast."""
    return 0.0 if n == 1 else 2 * math.ceil(math.log2(n)) * link.time(S)


def ring_gather_like_time(S: float, n: int, link: Link) -> float:
    """(n-1) a + (n-1)/n * S/B: all_gather, reduce_scatter, gather, scatter."""
    return 0.0 if n == 1 else (n - 1) * link.latency + (n - 1) / n * S / link.bandwidth


def chain_time(S: float, n: int, link: Link) -> float:
    """(n-1) a + S/B: a pipelined broadcast or reduce along a chain."""
    return 0.0 if n == 1 else (n - 1) * link.latency + S / link.bandwidth


def barrier_time(n: int, link: Link) -> float:
    """ceil(log2 n) a: a dissemination barrier."""
    return 0.0 if n == 1 else math.ceil(math.log2(n)) * link.latency


def p2p_time(nbytes: float, link: Link) -> float:
    """a + V/B."""
    return link.time(nbytes)


def _per_node(ranks: Sequence[int], topo: Topology) -> Optional[tuple[int, int]]:
    """(nodes k, ranks per node m) if the group has the same number of ranks on each node."""
    counts: dict[int, int] = {}
    for r in ranks:
        counts[topo.node_of(r)] = counts.get(topo.node_of(r), 0) + 1
    sizes = set(counts.values())
    return (len(counts), sizes.pop()) if len(sizes) == 1 else None


def _choose(kind: str, algorithm: str, ranks: Sequence[int], topo: Topology) -> str:
    spans = len({topo.node_of(r) for r in ranks}) > 1
    if algorithm == "auto":
        if spans and kind in ("all_reduce", "all_gather", "reduce_scatter"):
            km = _per_node(ranks, topo)
            if km is not None and km[1] > 1:
                return "hierarchical"
        return "ring"
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    if algorithm == "hierarchical" and (_per_node(ranks, topo) is None):
        raise ValueError(
            f"hierarchical {kind} needs the same number of ranks on every node; "
            f"group {list(ranks)} has an uneven spread over nodes of {topo.gpus_per_node}"
        )
    return algorithm


HAS = {  # the algorithms each collective has; the others have only "ring"
    "all_reduce": ("ring", "tree", "halving_doubling", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
}


def preferred(kind: str, algorithm: str, ranks: Sequence[int], topo: Topology) -> str:
    """A run-wide preference (`launch(algorithm=...)`) applied to one collective: the
    preferred algorithm where this collective has it and it fits the group, else "auto"
    (so a preference for "tree" leaves broadcast on its chain, and "hierarchical" leaves a
    group inside one node on its ring)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    n = len(ranks)
    if algorithm not in HAS.get(kind, ("ring",)):
        return "auto"
    if algorithm == "halving_doubling" and n & (n - 1):
        return "auto"
    if algorithm == "hierarchical":
        km = _per_node(ranks, topo)
        if km is None or km[0] == 1 or km[1] == 1:
            return "auto"
    return algorithm


def _hierarchical(kind: str, S: float, ranks: Sequence[int], topo: Topology) -> float:
    k, m = _per_node(ranks, topo)
    if kind == "all_reduce":
        return (ring_gather_like_time(S, m, topo.intra) + ring_all_reduce_time(S / m, k, topo.inter)
                + ring_gather_like_time(S, m, topo.intra))
    # all_gather: inter-node gather of 1/m of the output, then intra-node; RS mirrors it.
    return ring_gather_like_time(S / m, k, topo.inter) + ring_gather_like_time(S, m, topo.intra)


FORMULAS = {
    ("all_reduce", "ring"): "2(n-1)a + 2(n-1)/n*S/B",
    ("all_reduce", "halving_doubling"): "2log2(n)a + 2(n-1)/n*S/B",
    ("all_reduce", "tree"): "2ceil(log2 n)(a + S/B)",
    ("all_reduce", "hierarchical"): "RS_intra(S) + AR_inter(S/m) + AG_intra(S)",
    ("all_gather", "ring"): "(n-1)a + (n-1)/n*S/B",
    ("all_gather", "hierarchical"): "AG_inter(S/m) + AG_intra(S)",
    ("reduce_scatter", "ring"): "(n-1)a + (n-1)/n*S/B",
    ("reduce_scatter", "hierarchical"): "RS_intra(S) + RS_inter(S/m)",
    ("broadcast", "ring"): "(n-1)a + S/B",
    ("reduce", "ring"): "(n-1)a + S/B",
    ("gather", "ring"): "(n-1)a + (n-1)/n*S/B",
    ("scatter", "ring"): "(n-1)a + (n-1)/n*S/B",
    ("barrier", "ring"): "ceil(log2 n)a",
    ("all_to_all", "ring"): "(n-1)a + max_r max(intra_r/B_i, inter_r/B_e)",
}


def collective_cost(kind: str, S: float, ranks: Sequence[int], topo: Topology,
                    algorithm: str = "auto",
                    traffic: Optional[Sequence[Sequence[float]]] = None) -> Cost:
    """The simulated time of collective `kind` of size S bytes over global `ranks`.

    `traffic[i][j]` (all_to_all only) is the bytes group member i sends to member j.
    """
    n = len(ranks)
    kind_key = "all_to_all" if kind == "all_to_all_single" else kind
    algo = _choose(kind_key, algorithm, ranks, topo)
    link = topo.slowest_link(ranks)
    if algo == "hierarchical":
        if kind_key not in ("all_reduce", "all_gather", "reduce_scatter"):
            raise ValueError(f"there is no hierarchical algorithm for {kind}")
        t = _hierarchical(kind_key, S, ranks, topo)
        link_name = f"{topo.intra.name}+{topo.inter.name}"
    elif kind_key == "all_reduce":
        fn = {"ring": ring_all_reduce_time, "tree": tree_all_reduce_time,
              "halving_doubling": halving_doubling_all_reduce_time}[algo]
        if algo == "halving_doubling" and n & (n - 1):
            raise ValueError(f"halving_doubling needs a power-of-two group, got n={n}")
        t, link_name = fn(S, n, link), link.name
    elif algo != "ring":
        raise ValueError(f"{kind} has only the ring (and hierarchical) algorithm, not {algo!r}")
    elif kind_key in ("all_gather", "reduce_scatter", "gather", "scatter"):
        t, link_name = ring_gather_like_time(S, n, link), link.name
    elif kind_key in ("broadcast", "reduce"):
        t, link_name = chain_time(S, n, link), link.name
    elif kind_key == "barrier":
        t, link_name = barrier_time(n, link), link.name
    elif kind_key == "all_to_all":
        t, link_name = all_to_all_time(ranks, topo, traffic), link.name
    else:
        raise ValueError(f"no cost formula for collective {kind!r}")
    return Cost(t, algo, link_name, FORMULAS.get((kind_key, algo), ""))


def all_to_all_time(ranks: Sequence[int], topo: Topology,
                    traffic: Sequence[Sequence[float]]) -> float:
    """(n-1) a + max over ranks of max(bytes to same-node peers / B_intra,
    bytes to other-node peers / B_inter), counting what a rank sends and what it receives:
    NVLink and the NIC work in parallel, each in both directions at once."""
    n = len(ranks)
    if n == 1:
        return 0.0
    worst = 0.0
    for i, ri in enumerate(ranks):
        for direction in ("send", "recv"):
            intra = inter = 0.0
            for j, rj in enumerate(ranks):
                if i == j:
                    continue
                v = traffic[i][j] if direction == "send" else traffic[j][i]
                if topo.node_of(ri) == topo.node_of(rj):
                    intra += v
                else:
                    inter += v
            worst = max(worst, intra / topo.intra.bandwidth, inter / topo.inter.bandwidth)
    return (n - 1) * topo.slowest_link(ranks).latency + worst


BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


def algbw(S: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: S / t (0 when nothing took time, e.g. a group of one)."""
    return S / seconds if seconds > 0 else 0.0


def busbw(kind: str, S: float, seconds: float, n: int) -> float:
    """Bus bandwidth, bytes/s: algbw * factor(kind, n), the nccl-tests definition."""
    return algbw(S, seconds) * BUSBW_FACTOR[kind](n)


def _tree_children(i: int, n: int) -> int:
    """Children of position i (relative to the root) in a binomial tree over n ranks."""
    low = (i & -i) if i else 1 << max(n - 1, 0).bit_length()
    return sum(1 for j in range(n.bit_length()) if (1 << j) < low and i + (1 << j) < n)


def bytes_sent(kind: str, algorithm: str, S: float, n: int, me: int, root: int = 0,
               nodes: int = 1, traffic_row: Optional[Sequence[float]] = None) -> float:
    """Bytes group member `me` puts on the wire in collective `kind` of size S.

        ring all_reduce               2(n-1)/n * S
        ring all_gather / RS          (n-1)/n * S
        hierarchical all_reduce       2(m-1)/m * S + 2(k-1)/k * S/m     (m per node, k nodes)
        hierarchical all_gather / RS  (m-1)/m * S + (k-1)/k * S/m
        halving-doubling all_reduce   2(n-1)/n * S
        tree all_reduce               S (to the parent, unless root) + S per child
        broadcast (chain from root)   S, except the last rank of the chain
        reduce (chain into root)      S, except the root
        gather                        S/n, except the root
        scatter                       (n-1)/n * S at the root, 0 elsewhere
        all_to_all                    the pieces sent to the other ranks
    """
    if n == 1:
        return 0.0
    kind = "all_to_all" if kind == "all_to_all_single" else kind
    rel = (me - root) % n
    if algorithm == "hierarchical":
        k, m = nodes, n // nodes
        inter = (k - 1) / k * S / m
        if kind == "all_reduce":
            return 2 * (m - 1) / m * S + 2 * inter
        return (m - 1) / m * S + inter
    if kind == "all_reduce":
        if algorithm == "tree":
            return S * ((1 if rel else 0) + _tree_children(rel, n))
        return 2 * (n - 1) / n * S
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * S
    if kind == "broadcast":
        return 0.0 if rel == n - 1 else S
    if kind == "reduce":
        return 0.0 if rel == 0 else S
    if kind == "gather":
        return 0.0 if rel == 0 else S / n
    if kind == "scatter":
        return (n - 1) / n * S if rel == 0 else 0.0
    if kind == "all_to_all":
        return float(sum(v for j, v in enumerate(traffic_row) if j != me))
    return 0.0
