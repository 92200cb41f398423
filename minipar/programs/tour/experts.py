"""Part 13 of `minipar tour`: a mixture of experts over ep = 4, folded into dp = 8.

    ep group   4 consecutive data-parallel ranks, inside a node (the all-to-alls on NVLink)
    edp group  the 2 ranks holding the same experts, one per node

The tiny GPT with 8 experts (top 2, capacity factor 1, the auxiliary loss) in both blocks,
through `parallelize` on the tour's two nodes of 4: each rank routes its own tokens and
holds 2 experts. One step: each expert's load and the pairs dropped, the bytes each rank's
all-to-alls sent, the parameters a rank holds against all and the active ones, and the
weights after the step against one device that routes each rank's tokens as its own forward
(tests/parallel/mesh/test_moe.py proves it at more layouts; docs/moe.md).
"""

from __future__ import annotations

import numpy as np

from ...nn import GPT, GPTConfig
from ...nn.moe import MoEConfig, moe_layers, update_routers
from ...optim import AdamW
from ...parallel import ParallelDims, parallelize
from ...runtime.context import device
from ...runtime.launch import launch
from ..examples.common import batch
from .cluster import TOPOLOGY
from .common import Print, Record, no_recorder

DIMS = ParallelDims(dp_replicate=8, ep=4)
MODEL = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                  ffn_hidden=32, seed=0,
                  moe=MoEConfig(num_experts=8, top_k=2, capacity_factor=1.0,
                                aux_loss_coeff=0.01))
GLOBAL_BATCH, LR = 16, 1e-2


def _program(ids, targets):
    def program(ctx):
        run = parallelize(MODEL, DIMS, lr=LR, placement="any")
        n = len(ctx.trace.events)
        run.train_step(ids, targets)
        sent = sum(e.meta.get("sent_bytes", 0) for e in ctx.trace.events[n:]
                   if e.name.startswith("all_to_all"))
        layers = moe_layers(run.model)
        return dict(
            kept=[layer.last_plan.counts.copy() for layer in layers],  # this rank's
            dropped=[layer.last_plan.dropped for layer in layers],
            sent=sent, held=sum(p.size for _, ps in run.engine.units for p in ps),
            params={p.name: p.data.copy() for _, ps in run.engine.units for p in ps})
    return program


def _one_device(ids, targets) -> dict:
    """One GPT, each rank's block of the batch its own forward (weight 1/8), one step."""
    with device():
        model = GPT(MODEL)
        params = model.parameters()
        opt = AdamW(params, lr=LR)
        dp = DIMS.dp
        for d in range(dp):
            b = GLOBAL_BATCH // dp
            model.loss_and_grad(ids[:, d * b:(d + 1) * b], targets[:, d * b:(d + 1) * b],
                                loss_scale=1.0 / dp)
        for p in params:  # an unchosen expert: a zero gradient, as DDP's buffer holds
            if p.grad is None:
                p.accumulate(np.zeros_like(p.data))
        opt.step()
        update_routers(model, 0.0)
        return {p.name: p.data.copy() for p in params}


def experts_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 13."""
    ids, targets = batch(MODEL, GLOBAL_BATCH)
    res = record("13. mixture of experts, ep 4 in dp 8",
                 launch(_program(ids, targets), DIMS.world_size, topology=TOPOLOGY))
    want = _one_device(ids, targets)
    m = MODEL.moe
    out(f"13. Mixture of experts: {m.num_experts} experts (top {m.top_k}, capacity factor "
        f"{m.capacity_factor:g}, aux loss {m.aux_loss_coeff:g}) in both blocks, over ep = "
        f"{DIMS.ep} folded into dp = {DIMS.dp}: {m.num_experts // DIMS.ep} experts a rank")
    tokens = GLOBAL_BATCH * MODEL.seq_len
    cap = MODEL.seq_len * (GLOBAL_BATCH // DIMS.dp) * m.top_k // m.num_experts
    for i in range(len(res[0]["kept"])):
        kept = sum(r["kept"][i] for r in res).tolist()  # every rank routes its own tokens
        dropped = sum(r["dropped"][i] for r in res)
        out(f"   block {i}: (token, choice) pairs each expert ran {kept}; {dropped} of "
            f"{tokens * m.top_k} dropped (an expert keeps {cap} of each rank's "
            f"{tokens // DIMS.dp} tokens' choices)")
    sent = sorted({int(r["sent"]) for r in res})
    out(f"   bytes one rank's all-to-alls sent in the step (dispatch, combine, both "
        f"directions, on NVLink): {', '.join(f'{s:,}' for s in sent)}")
    out(f"   parameters: {MODEL.num_parameters():,} in all, {MODEL.num_active_parameters():,} "
        f"active per token, {res[0]['held']:,} held by a rank (its {m.num_experts // DIMS.ep} "
        f"experts of each block)")
    worst = max(float(np.max(np.abs(v - want[n]) / (np.abs(want[n]).max() or 1.0)))
                for r in res for n, v in r["params"].items())
    out(f"   weights after the step against one device routing each rank's tokens on its "
        f"own: worst difference {worst:.1e} of the largest weight")
