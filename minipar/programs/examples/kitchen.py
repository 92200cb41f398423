"""The kitchen: DP = 2 x TP = 4 x PP = 3 on 24 simulated GPUs, one step equal to one device.

    N = DP x TP x PP = 2 x 4 x 3 = 24      rank = tp + 4 dp + 8 pp  (Megatron's order, tp fastest)

The seed's picture: two copies of the kitchen (data parallelism: each trains on half of the
batch, and they average their gradients), four cooks sharing one huge pan in each
(tensor parallelism: every weight matrix split in 4), three stations in a line (a pipeline
of 3 stages). Its NumPy demo runs a forward pass of a two-layer perceptron with the
output dimension split and the batch split; here a tiny GPT runs forward and backward
through `parallelize` (DDP over dp, Megatron's tensor parallelism over tp, a 1F1B pipeline
over pp), and its loss and every gradient are proven equal to one device's in float64.

On 3 nodes of 8 H100s, the default order puts each pipeline stage on one node: the 4 cooks
of a pan (tp) share NVLink, the two kitchens' copies of a stage (dp) share the node too,
and only the pipeline's activations and gradients cross InfiniBand. Each rank's bytes come
from its trace, split by link class (traffic.py), and equal traffic.predict's to the byte.
"""

from __future__ import annotations

from typing import Any, Callable

from ...nn import GPTConfig
from ...parallel import ParallelDims
from ...runtime.topology import Topology
from .common import batch, bytes_text, compare, one_device, ranks_text, step_3d
from .traffic import predict

DIMS = ParallelDims(dp_replicate=2, pp=3, tp=4)
TOPOLOGY = Topology.nodes(3, 8)
#: a tiny GPT: 3 blocks (one a station), 4 heads (one a cook), float64
MODEL = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=3,
                  ffn_hidden=32, seed=0)
GLOBAL_BATCH, MICROBATCHES = 8, 4  # 4 sequences a kitchen, in 4 micro-batches of 1


def rank_lines(res: list[dict]) -> list[str]:
    """One line a rank: node, coordinate, its three groups."""
    lines = [f"   {'rank':>4} {'node':>4}   (pp, dp, tp)   {'tp group':<10} {'pp group':<10} "
             f"dp group"]
    for r in res:
        c, g = r["coordinate"], r["groups"]
        lines.append(f"   {r['rank']:>4} {r['node']:>4}   ({c['pp']}, {c['dp']}, {c['tp']})"
                     f"      {ranks_text(g['tp']):<10} {ranks_text(g['pp']):<10} "
                     f"{ranks_text(g['dp'])}")
    return lines


def traffic_lines(res: list[dict], topology: Topology, kinds=("tp", "pp", "dp")) -> list[str]:
    """What each group carried, a rank of each pipeline stage (the stage's ranks alike or
    the range shown), by link class."""
    intra, inter = topology.intra.name, topology.inter.name
    lines = [f"   {'stage':<6} {'group':<6} {'events':>7} {intra:>14} {inter:>14}"]
    for stage in sorted({r["coordinate"]["pp"] for r in res}):
        ranks = [r for r in res if r["coordinate"]["pp"] == stage]
        for kind in kinds:
            rows = [r["traffic"].get(kind, {"intra": 0.0, "inter": 0.0, "count": 0})
                    for r in ranks]
            cells = []
            for link in ("intra", "inter"):
                lo, hi = min(x[link] for x in rows), max(x[link] for x in rows)
                cells.append(bytes_text(lo) if lo == hi else
                             f"{bytes_text(lo)[:-2]}-{bytes_text(hi)}")
            counts = sorted({x["count"] for x in rows})
            count = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            lines.append(f"   {stage:<6} {kind:<6} {count:>7} {cells[0]:>14} {cells[1]:>14}")
    return lines


def matches_prediction(res: list[dict], cfg: GPTConfig, dims: ParallelDims,
                       topology: Topology, global_batch: int, microbatches: int,
                       zero: int = 0) -> bool:
    """Every rank's measured bytes, by group and link class, equal traffic.predict's."""
    for r in res:
        want = predict(cfg, dims, topology, r["rank"], global_batch, microbatches, zero)
        got = r["traffic"]
        for kind in set(got) | set(want):
            g, w = got.get(kind, {}), want.get(kind, {})
            if any(g.get(k, 0.0) != w.get(k, 0.0) for k in ("intra", "inter")):
                return False
    return True


def run(out: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run the kitchen, print it through `out`; returns {"ranks", "equal", "predicted"}."""
    cfg, dims, topo = MODEL, DIMS, TOPOLOGY
    ids, targets = batch(cfg, GLOBAL_BATCH)
    res = step_3d(cfg, dims, topo, ids, targets, MICROBATCHES, zero=0)
    equal = compare(res, one_device(cfg, ids, targets, MICROBATCHES))
    predicted = matches_prediction(res, cfg, dims, topo, GLOBAL_BATCH, MICROBATCHES)
    out(f"The kitchen: DP = {dims.dp} x TP = {dims.tp} x PP = {dims.pp} = "
        f"{dims.world_size} simulated GPUs ({topo.describe()})")
    out(f"   a GPT of {cfg.num_layers} blocks (one a station), h={cfg.hidden}, "
        f"{cfg.num_heads} heads (one a cook), {cfg.num_parameters():,} parameters, "
        f"float64; {GLOBAL_BATCH} sequences of {cfg.seq_len} a step, 1F1B over "
        f"{MICROBATCHES} micro-batches, DDP")
    out(f"   {dims}: rank = tp + {dims.tp} dp + {dims.tp * dims.dp} pp (Megatron's order "
        f"{dims.order!r}; init_device_mesh{dims.mesh_shape} over {dims.mesh_dim_names})")
    for line in rank_lines(res):
        out(line)
    out("   what each group carried in the step, bytes one rank sent, by link class (from "
        "the trace):")
    for line in traffic_lines(res, topo):
        out(line)
    out(f"   tp: 4 all-reduces of [s, b, h] a block (2 forward, 2 backward), the "
        f"embedding's and the head's, the loss's 3 small ones; pp: each micro-batch's "
        f"activations forward and gradients backward, and the loss (8 B); dp: one "
        f"all-reduce of the stage's gradients")
    out(f"   the same bytes from the model's shape alone (traffic.predict), every rank and "
        f"link: {predicted}")
    out(f"   loss {equal['loss']:.12f} (one device {equal['loss_one_device']:.12f}); every "
        f"gradient against one device's, worst relative difference {equal['grad_rel']:.1e}")
    return {"ranks": res, "equal": equal, "predicted": predicted}
