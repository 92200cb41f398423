"""The placement check: t_dim = Σ its collectives a step, on the links its worst group crosses.

    findings = check_placement(ParallelDims(dp_replicate=2, tp=4, order="dp-tp"),
                               Topology.nodes(2, 4), cfg, micro_batch=4)
    for f in findings:
        print(f.message)        # the figures, in words, and what to change

Ranks are laid out in the order of `dims.order` (tp fastest by default) and rank r sits on
node r // gpus_per_node, so a layout's groups are fixed before anything runs. The check
prices, with the cost model the simulated clock uses (runtime/cost.py, alpha-beta links of
runtime/topology.py), what each dimension's groups send in one training step, on the worst
group of that dimension (the one spanning most nodes), per rank, none of it overlapped:

    tp   4 all-reduces of [s, b, h] a block and micro-batch (g, f of the attention and the
         MLP; under SP an all-gather and a reduce-scatter in place of each), on the
         layers = ceil(L / pp) blocks a rank holds:       m · layers · 4 · t_AR(s·b·h·e)
         (the embedding's and the vocabulary-parallel head's one each a micro-batch, on
         the first and the last stage, are left out)
    dp   the rank's gradients, 1/(tp·pp) of the model, once a step: an all-reduce (DDP;
         ZeRO-1/2 move the same bytes as a reduce-scatter + an all-gather), plus, under
         ZeRO-3, an all-gather of the weights around each forward and backward:
                                         t_AR(G)  or  t_RS(G) + 2m · t_AG(G)   (G = Ψe/(tp·pp))
    pp   one activation forward and one gradient backward per micro-batch and stage
         boundary, to the next pipeline rank:                 2m · v · t_p2p(s·b·h·e)

(b = `micro_batch` sequences per micro-batch on a data-parallel rank, s = cfg.seq_len,
e = the dtype's bytes, v = `chunks` stages a rank.) Incident A generalised: tensor
parallelism talks most (every block, every micro-batch, each result waited for), so a tp
group must not cross nodes while a cheaper dimension stays inside one.

Findings (a `PlacementFinding` each, `kind`):

    "tp_across_nodes"     a tp group spans nodes although tp <= gpus_per_node: its
                          all-reduces a step as laid out, against the same group inside
                          one node (put tp fastest in the order)
    "tp_larger_than_node" tp > gpus_per_node: every order crosses nodes; the cost against
                          tp = gpus_per_node inside a node (move the rest to pp or dp)
    "cheaper_order"       another order of the same sizes costs less communication a step
                          (by CHEAPER at least): e.g. dp inside the nodes and pp across
                          when the gradients outweigh the activations; both totals, the
                          order to give

`parallelize(..., placement="warn")` (the default) runs the check on the launched world's
topology with b = 1 and warns once (rank 0) with the messages; `placement="strict"`
refuses the layout with them; `placement="any"` runs it without a word, for a lesson
that shows what a bad placement costs. No finding on one node: every link is NVLink.
(docs/parallel_dims.md: an example of each message.)
"""

from __future__ import annotations

import itertools
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...nn.config import GPTConfig
from ...runtime.cost import collective_cost, p2p_time
from ...runtime.mesh import DeviceMesh
from ...runtime.topology import Topology
from .dims import DEFAULT_ORDER, ParallelDims

#: another order is reported when its total a step is at most this share of the layout's
CHEAPER = 0.9
PLACEMENTS = ("warn", "strict", "any")
US = 1e-6


@dataclass(frozen=True)
class PlacementFinding:
    """One thing the placement check found, with its figures (seconds a step, per rank).

    kind          "tp_across_nodes" | "tp_larger_than_node" | "cheaper_order"
    dim           the dimension concerned ("tp"; "order" for cheaper_order)
    group         the worst group's global ranks (the tp group; () for cheaper_order)
    nodes         nodes that group spans (for cheaper_order: nodes of the world)
    seconds       its communication a step as laid out (cheaper_order: tp + dp + pp)
    alternative_seconds   the same inside one node / under `alternative`
    alternative   what to change, as an argument: "order='tp-cp-ep-dp-pp'", "tp=4"
    message       the finding in words, with both figures and the fix
    """

    kind: str
    dim: str
    group: tuple[int, ...]
    nodes: int
    seconds: float
    alternative_seconds: float
    alternative: str
    message: str

    @property
    def ratio(self) -> float:
        """seconds / alternative_seconds: how much the placement costs (inf if free)."""
        return self.seconds / self.alternative_seconds if self.alternative_seconds else math.inf


@dataclass(frozen=True)
class StepComm:
    """Communication seconds a step, per rank, of each dimension's worst group."""

    tp: float
    dp: float
    pp: float

    @property
    def total(self) -> float:
        return self.tp + self.dp + self.pp


class PlacementWarning(UserWarning):
    """parallelize(..., placement="warn") found a placement another layout would beat."""


def check_placement(dims: ParallelDims, topology: Topology, cfg: GPTConfig, *,
                    micro_batch: int = 1, microbatches: int = 1, chunks: int = 1,
                    sequence_parallel: bool = False, zero: int = 0
                    ) -> list[PlacementFinding]:
    """What placing `dims` on `topology` costs that another placement would not, as data
    (the module docstring: the formulas and the kinds). `micro_batch`: sequences per
    micro-batch on one data-parallel rank (b); `microbatches`: m a step; `chunks`: stages a
    pipeline rank holds (v); `zero`: the ZeRO stage (3 adds the weights' all-gathers).
    An empty list: nothing to change. Refuses a topology of another world size."""
    _check_args(dims, topology, cfg, micro_batch, microbatches, chunks, zero)
    if topology.num_nodes == 1:
        return []
    ctx = _Pricing(dims, topology, cfg, micro_batch, microbatches, chunks,
                   sequence_parallel, zero)
    findings = [f for f in (ctx.tp_finding(),) if f is not None]
    order = ctx.order_finding()
    if order is not None:
        findings.append(order)
    return findings


def step_comm(dims: ParallelDims, topology: Topology, cfg: GPTConfig, *,
              micro_batch: int = 1, microbatches: int = 1, chunks: int = 1,
              sequence_parallel: bool = False, zero: int = 0) -> StepComm:
    """The check's figures for `dims` as laid out: tp, dp and pp seconds a step, per rank."""
    _check_args(dims, topology, cfg, micro_batch, microbatches, chunks, zero)
    return _Pricing(dims, topology, cfg, micro_batch, microbatches, chunks,
                    sequence_parallel, zero).comm(dims)


def placement_message(findings: list[PlacementFinding], dims: ParallelDims,
                      topology: Topology) -> str:
    """The findings as one text, for a warning or a refusal."""
    head = f"{dims} on {topology.num_nodes} nodes of {topology.gpus_per_node}:"
    return "\n".join([head] + [f"  - {f.message}" for f in findings])


def apply_placement(placement: str, dims: ParallelDims, topology: Topology, cfg: GPTConfig,
                    rank: int, **sizes) -> list[PlacementFinding]:
    """parallelize's use of the check: "warn" (rank 0 warns once with the findings),
    "strict" (refuse them: ValueError on every rank), "any" (no check). Returns them."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: expected one of {PLACEMENTS} ('warn' "
                         f"warns when a tp group crosses nodes or another order is cheaper, "
                         f"'strict' refuses it, 'any' runs any layout without a word)")
    if placement == "any":
        return []
    findings = _shared_check(dims, topology, cfg, sizes)
    if not findings:
        return findings
    text = placement_message(findings, dims, topology)
    if placement == "strict":
        raise ValueError(f"placement='strict' refuses this layout. {text}\nplacement='warn' "
                         f"runs it with this warning, placement='any' without")
    if rank == 0:
        warnings.warn(f"{text}\n(figures for b = 1 sequence a micro-batch; "
                      f"check_placement(...) prices your batch)", PlacementWarning,
                      stacklevel=3)
    return findings


_SHARED: dict = {}  # (dims, cfg, sizes) -> (topology, findings): one check per launch
_SHARED_LOCK = threading.Lock()


def _shared_check(dims: ParallelDims, topology: Topology, cfg: GPTConfig,
                  sizes: dict) -> list[PlacementFinding]:
    """check_placement once for all the ranks of one launch: every rank thread calls
    parallelize with the same arguments, and the check prices every group of the mesh, so
    N ranks each checking would cost O(N^2) (4,096 simulated ranks: minutes). The result
    is kept with the topology object it was computed for and reused only for that object."""
    key = (dims, cfg, tuple(sorted(sizes.items())))
    with _SHARED_LOCK:
        hit = _SHARED.get(key)
        if hit is not None and hit[0] is topology:
            return list(hit[1])
        findings = check_placement(dims, topology, cfg, **sizes)
        if len(_SHARED) >= 8:
            _SHARED.clear()
        _SHARED[key] = (topology, findings)
        return list(findings)


# ---- pricing ------------------------------------------------------------------------------
def _check_args(dims, topology, cfg, micro_batch, microbatches, chunks, zero) -> None:
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"check_placement takes a ParallelDims, got {type(dims).__name__}")
    if not isinstance(topology, Topology):
        raise TypeError(f"check_placement takes a Topology (e.g. Topology.nodes(2, 4)), got "
                        f"{type(topology).__name__}")
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"check_placement prices the model's messages: pass its GPTConfig, "
                        f"not a {type(cfg).__name__}")
    if topology.world_size != dims.world_size:
        raise ValueError(f"{dims} covers {dims.world_size} ranks but the topology has "
                         f"{topology.num_nodes} x {topology.gpus_per_node} = "
                         f"{topology.world_size}; give a topology of {dims.world_size} devices")
    for name, v in (("micro_batch", micro_batch), ("microbatches", microbatches),
                    ("chunks", chunks)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"check_placement({name}={v!r}): a positive integer")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise ValueError(f"check_placement(zero={zero!r}): a ZeRO stage 0, 1, 2 or 3")


def _orders(dims: ParallelDims) -> list[str]:
    """Every order of the dimensions used (size > 1), the unused ones after them; the
    default first, so that a tie keeps it."""
    size = {"tp": dims.tp, "cp": dims.cp, "dp": dims.dp, "pp": dims.pp}
    used = [n for n in ("tp", "cp", "dp", "pp") if size[n] > 1]
    return [DEFAULT_ORDER] + ["-".join(list(p) + [n for n in ("tp", "cp", "ep", "dp", "pp")
                                                  if n not in p])
                              for p in itertools.permutations(used)]


class _Pricing:
    """The sizes of one step's messages, and their seconds on any order of `dims`."""

    def __init__(self, dims, topology, cfg, b, m, v, sp, zero):
        self.dims, self.topo, self.cfg = dims, topology, cfg
        self.m, self.v, self.sp, self.zero = m, v, sp, zero
        e = cfg.np_dtype.itemsize
        self.act = cfg.seq_len * b * cfg.hidden * e  # bytes of [s, b, h]
        self.grad = cfg.num_parameters() * e / (dims.tp * dims.pp)  # a rank's gradients
        self.layers = math.ceil(cfg.num_layers / dims.pp)

    def _groups(self, dims: ParallelDims, *names: str) -> list[tuple[int, ...]]:
        mesh = DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
        axes = [dims.mesh_dim_names.index(n) for n in names]
        rest = [a for a in range(len(dims.mesh_shape)) if a not in axes]
        grid = np.transpose(mesh.grid, rest + axes)
        k = math.prod(dims.mesh_shape[a] for a in axes)
        return [tuple(int(r) for r in row) for row in grid.reshape(-1, k)]

    def _nodes(self, ranks) -> int:
        return len({self.topo.node_of(r) for r in ranks})

    def tp_seconds(self, ranks) -> float:
        t = lambda kind: collective_cost(kind, self.act, ranks, self.topo).seconds
        block = t("all_gather") + t("reduce_scatter") if self.sp else t("all_reduce")
        return self.m * self.layers * 4 * block

    def dp_seconds(self, ranks) -> float:
        t = lambda kind: collective_cost(kind, self.grad, ranks, self.topo).seconds
        if self.zero == 3:
            return t("reduce_scatter") + 2 * self.m * t("all_gather")
        return t("all_reduce")

    def pp_seconds(self, ranks) -> float:
        p = len(ranks)
        worst = max((p2p_time(self.act, self.topo.link(ranks[i], ranks[i + 1]))
                     for i in range(p - 1)), default=0.0)
        return 2 * self.m * self.v * worst

    def comm(self, dims: ParallelDims) -> StepComm:
        worst = lambda f, groups: max((f(g) for g in groups), default=0.0)
        return StepComm(worst(self.tp_seconds, self._groups(dims, "tp")) if dims.tp > 1 else 0.0,
                        worst(self.dp_seconds, self._groups(dims, "dp_replicate", "dp_shard"))
                        if dims.dp > 1 else 0.0,
                        worst(self.pp_seconds, self._groups(dims, "pp")) if dims.pp > 1 else 0.0)

    # ---- the findings -------------------------------------------------------------------
    def tp_finding(self) -> Optional[PlacementFinding]:
        dims, topo, g = self.dims, self.topo, self.topo.gpus_per_node
        if dims.tp == 1:
            return None
        group = max(self._groups(dims, "tp"), key=lambda r: (self._nodes(r), r))
        nodes = self._nodes(group)
        if nodes == 1:
            return None
        here = self.tp_seconds(group)
        what = (f"{'an all-gather + a reduce-scatter' if self.sp else 'an all-reduce'} of "
                f"[s, b, h] = {self.act:,.0f} B, 4 a block, x {self.layers} blocks x "
                f"{self.m} micro-batch(es)")
        if dims.tp <= g:
            inside = self.tp_seconds(tuple(range(dims.tp)))
            alt = f"order={DEFAULT_ORDER!r}"
            msg = (f"tp group {_ranks(group)} spans {nodes} nodes: its collectives ({what}) "
                   f"take {here / US:,.1f} us a step over {topo.inter.name}, against "
                   f"{inside / US:,.1f} us inside one node on {topo.intra.name} "
                   f"({here / inside:.1f}x). Keep tp inside a node: put tp fastest in the "
                   f"order ({alt}); placement='any' runs it as it is")
            return PlacementFinding("tp_across_nodes", "tp", group, nodes, here, inside,
                                    alt, msg)
        inside = self.tp_seconds(tuple(range(g)))
        alt = f"tp={g}"
        msg = (f"tp={dims.tp} is larger than a node of {g} GPUs, so every tp group spans "
               f"{nodes} nodes: its collectives ({what}) take {here / US:,.1f} us a step "
               f"over {topo.inter.name}, against {inside / US:,.1f} us for tp={g} inside a "
               f"node ({here / inside:.1f}x). Use tp <= {g} (each GPU then computes a larger "
               f"share of every block) and give the other factor to pp or dp; "
               f"placement='any' runs it as it is")
        return PlacementFinding("tp_larger_than_node", "tp", group, nodes, here, inside,
                                alt, msg)

    def order_finding(self) -> Optional[PlacementFinding]:
        dims = self.dims
        mine = self.comm(dims)
        best, best_order = mine, dims.order
        for order in _orders(dims):
            other = ParallelDims(**dims.sizes(), order=order)
            c = self.comm(other)
            if c.total < best.total * (1 - 1e-12):
                best, best_order = c, order
        if best_order == dims.order or best.total > CHEAPER * mine.total:
            return None
        alt = f"order={best_order!r}"
        parts = lambda c: (f"tp {c.tp / US:,.1f} + dp {c.dp / US:,.1f} + pp "
                           f"{c.pp / US:,.1f} = {c.total / US:,.1f} us")
        msg = (f"order={dims.order!r} communicates {parts(mine)} a step per rank; "
               f"{alt} places the same sizes for {parts(best)} "
               f"({mine.total / best.total:.1f}x less): give {alt}, or placement='any' "
               f"to run it as it is")
        return PlacementFinding("cheaper_order", "order", (), self.topo.num_nodes,
                                mine.total, best.total, alt, msg)


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{{{ranks[0]}..{ranks[-1]}}}"
    return "{" + ",".join(map(str, ranks)) + "}"
