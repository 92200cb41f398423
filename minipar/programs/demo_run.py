"""The demo's real runs: one training step of the tiny GPT under a scenario, executed on
simulated A100s, read back as the page draws it.

    scenario  ->  launch(parallelize(...).train_step) on dp·tp·pp ranks
              ->  each rank's trace and ledger history over the step  ->  demo_rows

Nothing here is estimated: the events are the runtime's, the memory is each rank's ledger
(recorded with `MemoryLedger.record_history`), the batch's split is the runner's own
functions (split_microbatches, then split_data_parallel) applied to the sample numbers.
The step starts, on the page's clock, when the first rank starts it (after parallelize's
parameter broadcast); the step time is the last rank's end from there.
"""

from __future__ import annotations

import numpy as np

from ..data.batches import split_data_parallel, split_microbatches
from ..nn.gpt import GPTConfig
from ..parallel.mesh import ParallelDims, ParallelGroups
from ..parallel.mesh.parallelize import parallelize
from ..runtime.device import DeviceSpec
from ..runtime.launch import launch
from ..runtime.ledger import CATEGORIES
from ..runtime.topology import Topology
from .demo_rows import journey, memory_series, model_flops, numbers, row
from .demo_scenario import TINY, Scenario, check

GPUS_PER_NODE = 8
DTYPE = "float32"
MAX_GRAD_NORM = 1.0  # Megatron's default clipping: the step's tail has the norm's all-reduce


def config(s: Scenario) -> GPTConfig:
    """The tiny GPT with the scenario's recompute mode."""
    return GPTConfig(**TINY, dtype=DTYPE, recompute=s.recompute)


def dims_of(s: Scenario) -> ParallelDims:
    """ZeRO shards over dp_shard; DDP replicates over dp_replicate (same rank order)."""
    if s.zero:
        return ParallelDims(dp_shard=s.dp, tp=s.tp, pp=s.pp)
    return ParallelDims(dp_replicate=s.dp, tp=s.tp, pp=s.pp)


def topology(gpus: int) -> Topology:
    """DGX-like A100 nodes of 8 (a smaller layout: one node of that many GPUs)."""
    if gpus <= GPUS_PER_NODE:
        return Topology.nodes(1, gpus, DeviceSpec.a100_80gb())
    return Topology.nodes(gpus // GPUS_PER_NODE, GPUS_PER_NODE, DeviceSpec.a100_80gb())


def coordinates(dims: ParallelDims) -> dict:
    """rank -> its coordinate and groups, as ParallelGroups builds them (call inside a
    launch of dims.world_size ranks)."""
    out = {}
    for r in range(dims.world_size):
        g = ParallelGroups(dims, rank=r)
        mine = {"tp": list(g.tp.ranks), "dp": list(g.dp.ranks), "pp": list(g.pp.ranks),
                "mp": sorted(g.model_parallel.ranks), "world": list(range(dims.world_size))}
        out[r] = {"pp_stage": g.coordinate["pp"], "dp_replica": g.dp_rank,
                  "tp_index": g.coordinate["tp"], "groups": mine}
    return out


def pipeline(s: Scenario) -> dict:
    """parallelize's schedule arguments: the scenario's, or none at pp = 1 (the plain
    step: one forward and one backward, DDP's or ZeRO's buckets during the backward)."""
    if s.pp == 1:
        return {}
    return dict(schedule=s.schedule, microbatches=s.microbatches,
                chunks=s.chunks if s.chunks > 1 else None)


def batch_split(s: Scenario) -> dict:
    """Which of the B sequences each dp replica runs in each micro-batch, by the runner's
    own split functions applied to the sequence numbers 0 .. B-1."""
    B = s.global_batch
    ids = np.arange(B)[None, :]  # [1, B]: a "batch" whose tokens are the sequence numbers
    m = s.microbatches
    micro = split_microbatches(ids, ids, m)  # m x [1, B/m]
    return {"global_batch": B, "microbatches": m,
            "seq_len": TINY["seq_len"],
            "blocks": [[split_data_parallel(x, y, d, s.dp)[0][0].tolist()  # [B/(m·dp)]
                        for x, y in micro] for d in range(s.dp)]}


def run(s: Scenario) -> dict:
    """The scenario's page data from one executed step (module docstring)."""
    check(s)
    cfg, dims = config(s), dims_of(s)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, s.global_batch))  # [s, B]
    targets = rng.integers(0, cfg.vocab_size, (cfg.seq_len, s.global_batch))
    pipe = pipeline(s)

    def step(ctx):
        p = parallelize(cfg, dims, zero=s.zero or None, sequence_parallel=s.tp > 1,
                        lr=1e-3, max_grad_norm=MAX_GRAD_NORM, placement="any", **pipe)
        t0 = ctx.clock.elapsed()
        start = {c: ctx.ledger.held(c) for c in CATEGORIES}
        ctx.trace.clear()
        ctx.ledger.record_history(lambda: ctx.clock.now)
        ctx.ledger.reset_peak()
        loss = p.train_step(ids, targets)
        ctx.ledger.record_history(None)
        peak = {c: ctx.ledger.peak(c) for c in CATEGORIES}
        peak["total"] = ctx.ledger.peak()
        return (t0, start, list(ctx.trace.events), list(ctx.ledger.history), peak,
                float(loss), ctx.clock.elapsed(), coordinates(dims) if ctx.rank == 0 else None)

    topo = topology(s.gpus)
    res = launch(step, s.gpus, topology=topo)
    t0 = min(r[0] for r in res)
    T = max(r[6] for r in res) - t0
    coords = res[0][7]
    bandwidth = {topo.intra.name: topo.intra.bandwidth, topo.inter.name: topo.inter.bandwidth}
    rows = []
    for rank, (_, start, events, history, peak, *_) in enumerate(res):
        c = {k: v for k, v in coords[rank].items() if k != "groups"}
        rows.append(row(rank, dict(c, node=rank // GPUS_PER_NODE), events, t0, T, bandwidth,
                        memory_series(start, history, t0, T), peak))
    flops = model_flops(s.global_batch, cfg.seq_len, cfg.num_layers, cfg.hidden, cfg.ffn,
                        cfg.vocab_size)
    device = topo.device
    return {"scenario": s.as_dict(), "source": "run",
            "source_text": f"a real run: one train_step of the tiny GPT executed on "
                           f"{s.gpus} simulated {device.name} GPUs; every rank drawn",
            "model": {"name": "tiny GPT", "layers": cfg.num_layers, "hidden": cfg.hidden,
                      "heads": cfg.num_heads, "ffn": cfg.ffn, "vocab": cfg.vocab_size,
                      "seq_len": cfg.seq_len, "dtype": DTYPE,
                      "parameters": None},
            "device": device.name, "capacity": device.memory_bytes,
            "gpus_per_node": GPUS_PER_NODE, "every_rank": True,
            "sequence_parallel": s.tp > 1,
            "loss": res[-1][5],
            "numbers": numbers(rows, T, flops, s.gpus, device.peak(DTYPE)),
            "rows": rows,
            "journey": journey({r: res[r][2] for r in range(s.gpus)},
                               {r: coords[r]["groups"] for r in coords}, t0),
            "batch": batch_split(s)}
