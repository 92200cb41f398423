"""The data-parallel engines under a split backward (nn/weight_grads.py), with no pipeline.

A GPT on 2 data-parallel ranks runs its backward as I (model.backward_input) and then W
(model.backward_weight). Each engine reduces a unit at its backward_post, which fires at
the unit's W, once its gradients are complete: the averaged gradients are the fused
backward's bit for bit, with the same collectives. Had the hooks fired at I (DDP's
autograd hooks in torch, with W run outside autograd: pytorch issue 144530), the W's
contributions would be missing. ZeRO-3 frees a unit's gathered weights when its I ends
(backward_input_post): W reads no weight, so nothing is gathered for it.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT
from minipar.parallel.dp import zero_engine

DP = 2


def run(dpkit, cfg, stage, split):
    """Per rank: averaged full gradients, the dp collectives' names, and (split) the
    units whose gathered weights are alive between I and W."""
    ids, tgt = dpkit.global_batches(cfg, steps=1, global_batch=2 * DP, seed=3)[0]

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, **dpkit.OPT)
        x, y = ids[:, 2 * ctx.rank:2 * ctx.rank + 2], tgt[:, 2 * ctx.rank:2 * ctx.rank + 2]
        n = len(ctx.trace.events)
        gathered = []
        loss, cache = model.forward(x, y)
        if split:
            store = model.backward_input(cache)
            gathered.append(sorted(a.name for a in ctx.ledger.live()
                                   if a.name.endswith(".gathered")))
            model.backward_weight(store)
        else:
            model.backward(cache)
        comm = [e.name for e in ctx.trace.events[n:] if e.stream == "comm"]
        return engine.full_grads(), comm, gathered

    return mp.launch(program, DP)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_engine_reduces_at_w_and_gets_the_fused_gradients(dpkit, stage):
    cfg = dpkit.tiny_config(num_layers=3, tie_embeddings=True, dropout=0.1)
    fused, split = run(dpkit, cfg, stage, False), run(dpkit, cfg, stage, True)
    for (g_b, comm_b, _), (g_s, comm_s, gathered) in zip(fused, split):
        assert list(g_s) == list(g_b)
        for name in g_b:
            np.testing.assert_array_equal(g_s[name], g_b[name], err_msg=name)
        assert sorted(comm_s) == sorted(comm_b)  # the same collectives, none more
        if stage == 3:  # after I only the root stays whole; W gathers nothing
            assert gathered == [["zero:root.gathered"]]
