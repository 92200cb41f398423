"""loss_3d = loss_one_device, grad_3d = grad_one_device: one dp x pp x tp step beside one device.

    loss_layout = mean over dp blocks of the last stage's loss = loss_one_device
    grad_layout = the dp-averaged gradient, tp shards gathered  = grad_one_device

`step_3d` runs parallelize on every simulated rank (one step: forward, backward, optimizer
step), and returns per rank its coordinate, its groups, what each group carried by link
class (read from the step's trace), its loss and its gradients; `one_device` is the same
step on one device (the m micro-batches accumulated in order, each loss scaled by 1/m);
`compare` gives the worst differences.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ... import runtime as mp
from ...nn import GPT, GPTConfig
from ...data.batches import split_microbatches
from ...parallel import ParallelDims, parallelize
from ...runtime.collectives import all_gather
from ...runtime.topology import Topology
from .traffic import measured


def batch(cfg: GPTConfig, global_batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A global batch of (ids, targets), each [s, B], the same on every rank."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, global_batch))  # [s, B]
    return ids, np.roll(ids, -1, axis=0)  # targets: the next token


def _gathered(grads: dict, run) -> dict:
    """Gradients by name, every tensor-parallel shard all-gathered to the full shape."""
    params, out = run.model.named_parameters(), {}
    for name, g in grads.items():
        p = params[name]
        if getattr(p, "partition_count", 1) > 1:
            g = all_gather(g, axis=p.partition_dim, group=run.groups.tp)  # [..., full]
        out[name] = g
    return out


def step_3d(cfg: GPTConfig, dims: ParallelDims, topology: Topology, ids: np.ndarray,
            targets: np.ndarray, microbatches: int, zero: int = 0,
            schedule: str = "1f1b", record: Optional[Callable] = None,
            label: str = "3-D step") -> list[dict[str, Any]]:
    """One step of `cfg` on `dims` placed on `topology`; per rank {"rank", "node",
    "coordinate", "groups" (tp, pp, dp ranks), "traffic" (traffic.measured of the step's
    events), "loss", "grads", "step_seconds"}. `record(label, launch result)` keeps the
    launch (the tour's Chrome trace)."""
    world = dims.world_size
    if topology.world_size != world:
        raise ValueError(f"{dims} covers {world} ranks but the topology has "
                         f"{topology.world_size} ({topology.describe()}): give a topology of "
                         f"{world} devices")

    def program(ctx: mp.Context) -> dict[str, Any]:
        run = parallelize(cfg, dims, zero=zero, schedule=schedule, microbatches=microbatches,
                          lr=1e-3, placement="any")  # the example prices the order
        g = run.groups
        mp.barrier()
        first, start = len(ctx.trace.events), ctx.clock.now
        loss = run.forward_backward(ids, targets)
        ctx.resolve_pending()
        mid = len(ctx.trace.events)
        grads = run.engine.full_grads()  # dp-averaged; the gathers below are not the step's
        resumed = len(ctx.trace.events)
        run.step()
        ctx.resolve_pending()
        end = ctx.clock.elapsed()
        events = ctx.trace.events[first:mid] + ctx.trace.events[resumed:]
        full = _gathered(grads, run)
        return {"rank": ctx.rank, "node": topology.node_of(ctx.rank),
                "coordinate": {"pp": g.coordinate["pp"], "dp": g.dp_rank,
                               "tp": g.coordinate["tp"]},
                "groups": {"tp": g.tp.ranks, "pp": g.pp.ranks, "dp": g.dp.ranks},
                "traffic": measured(events, topology), "loss": loss, "grads": full,
                "start": start, "end": end}

    res = mp.launch(program, world, topology=topology)
    if record is not None:
        record(label, res)
    start = min(r["start"] for r in res)
    for r in res:
        r["step_seconds"] = max(x["end"] for x in res) - start
    return res


def one_device(cfg: GPTConfig, ids: np.ndarray, targets: np.ndarray, microbatches: int
               ) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, gradients) of one device accumulating the m micro-batches [s, B/m] in order."""
    with mp.device():
        model = GPT(cfg)
        losses = [model.loss_and_grad(x, y, loss_scale=1.0 / microbatches)
                  for x, y in split_microbatches(ids, targets, microbatches)]
        return float(np.mean(losses)), {p.name: p.grad.copy() for p in model.parameters()}


def compare(res: list[dict], ref: tuple[float, dict]) -> dict[str, Any]:
    """{"loss" (mean over dp blocks), "loss_one_device", "loss_diff", "grad_rel" (worst
    |g - g_one| / max |g_one| over every parameter held by any rank), "covered" (every
    parameter of the model is held somewhere)}."""
    loss0, grads0 = ref
    blocks = {r["coordinate"]["dp"]: r["loss"] for r in res}
    loss = float(np.mean(list(blocks.values())))
    worst, seen = 0.0, set()
    for r in res:
        for name, g in r["grads"].items():
            ref_g = grads0[name]
            worst = max(worst, float(np.abs(g - ref_g).max() / np.abs(ref_g).max()))
            seen.add(name)
    return {"loss": loss, "loss_one_device": loss0, "loss_diff": abs(loss - loss0),
            "grad_rel": worst, "covered": seen == set(grads0)}


def ranks_text(ranks) -> str:
    """{0..3} for consecutive ranks, else {0,4,8}."""
    ranks = tuple(ranks)
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{{{ranks[0]}..{ranks[-1]}}}"
    return "{" + ",".join(map(str, ranks)) + "}"


def bytes_text(n: float) -> str:
    """Bytes with a thousands separator, or in KB/MB/GB/TB (decimal) above 10 MB."""
    if n < 1e7:
        return f"{n:,.0f} B"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:,.0f} B"
