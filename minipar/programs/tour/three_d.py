"""Part 12 of `minipar tour`: 3-D parallelism, dp = 2 x pp = 2 x tp = 2 on the tour's 8 GPUs.

    rank = tp + 2 dp + 4 pp        (Megatron's order: tp fastest, pp slowest)

The tiny GPT through `parallelize` on the tour's two nodes of 4: a tensor-parallel pair
inside a node (NVLink), the two data-parallel copies of a stage in the same node, the two
pipeline stages on the two nodes (InfiniBand). One step (1F1B over 2 micro-batches, DDP):
each rank's coordinate and groups, what each group carried by link class (read from the
trace, and equal to traffic.predict's from the model's shape), and the loss and gradients
against one device's. `minipar example kitchen` and `minipar example 70b` take it to the
seed's 24 and 64 GPUs.
"""

from __future__ import annotations

from ...nn import GPTConfig
from ...parallel import ParallelDims
from ..examples.common import batch, compare, one_device, step_3d
from ..examples.kitchen import matches_prediction, rank_lines, traffic_lines
from .cluster import TOPOLOGY
from .common import Print, Record, no_recorder

DIMS = ParallelDims(dp_replicate=2, pp=2, tp=2)
MODEL = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                  ffn_hidden=32, seed=0)
GLOBAL_BATCH, MICROBATCHES = 4, 2


def three_d_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 12."""
    cfg, dims = MODEL, DIMS
    ids, targets = batch(cfg, GLOBAL_BATCH)
    res = step_3d(cfg, dims, TOPOLOGY, ids, targets, MICROBATCHES, record=record,
                  label="12. 3-D, dp 2 x pp 2 x tp 2")
    equal = compare(res, one_device(cfg, ids, targets, MICROBATCHES))
    out(f"12. 3-D parallelism: dp = {dims.dp} x pp = {dims.pp} x tp = {dims.tp} on the 8 "
        f"GPUs, one step of the GPT ({cfg.num_layers} blocks, h={cfg.hidden}, float64), "
        f"1F1B over {MICROBATCHES} micro-batches, DDP")
    out(f"   {dims}: rank = tp + {dims.tp} dp + {dims.tp * dims.dp} pp; tp pairs in a node, "
        f"the stages on the two nodes")
    for line in rank_lines(res):
        out(line)
    out("   bytes one rank sent in the step, by group and link class (from the trace):")
    for line in traffic_lines(res, TOPOLOGY):
        out(line)
    same = matches_prediction(res, cfg, dims, TOPOLOGY, GLOBAL_BATCH, MICROBATCHES)
    crossing = sorted({k for r in res for k, row in r["traffic"].items() if row["inter"]})
    out(f"   the same bytes from the model's shape alone (traffic.predict): {same}; groups "
        f"whose bytes cross nodes: {', '.join(crossing) or 'none'}")
    out(f"   loss {equal['loss']:.12f} (one device {equal['loss_one_device']:.12f}); every "
        f"gradient against one device's, worst relative difference {equal['grad_rel']:.1e}")
    out("   (`minipar example kitchen`: DP 2 x TP 4 x PP 3 on 24 GPUs; `minipar example "
        "70b`: the seed's 64-GPU layout, and its bytes at 70B)")
