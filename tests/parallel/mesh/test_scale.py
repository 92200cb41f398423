"""One training step at 4,096 simulated ranks equals one device (CI only: `-m scale`).

The issue's layout at the size it names: tp 8 x pp 8 x dp 64 on 512 nodes of 8 (1F1B,
m = 8 micro-batches of one sequence a dp rank), a tiny GPT in float64, two AdamW steps:
the first step's loss checks the forward through every rank; the second's, the backward,
the gradient reductions over each dp group of 64 and the update, on all 4,096 ranks.
About a minute and a half of wall time a step on a 2-core machine
(benchmarks/bench_scale.py times it), too slow for the suite's five minutes: `.ci/run`
runs it with `pytest -m scale`; `pytest` alone deselects it (setup.cfg).
"""

from __future__ import annotations

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize

pytestmark = pytest.mark.scale


@pytest.mark.timeout(900)
def test_a_step_at_tp8_pp8_dp64_equals_one_device(dpkit):
    dims, m = ParallelDims(dp_replicate=64, pp=8, tp=8), 8
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=16, num_heads=8, num_layers=8,
                    dtype="float64", seed=3)
    batches = dpkit.global_batches(cfg, steps=2, global_batch=dims.dp * m, seed=5)
    ref = dpkit.reference_run(cfg, batches, microbatches=m, **dpkit.OPT)

    def program(ctx):
        run = parallelize(cfg, dims, placement="any", schedule="1f1b", microbatches=m,
                          **dpkit.OPT)
        losses = []
        for ids, tgt in batches:
            losses.append(run.forward_backward(ids, tgt))
            run.step()
        return losses

    out = mp.launch(program, dims.world_size, topology=mp.Topology.nodes(512, 8))
    losses = np.array(out)  # [4096, 2]: each rank's loss of its dp replica's share
    assert losses.shape == (4096, 2)
    # rank = tp + 8 dp + 512 pp (order tp-cp-ep-dp-pp, tp fastest): [pp, dp, tp, step]
    grid = losses.reshape(8, 64, 8, 2)
    by_replica = grid.transpose(1, 0, 2, 3).reshape(64, 64, 2)  # [dp, pp x tp, step]
    assert np.all(by_replica == by_replica[:, :1])  # broadcast from the last stage
    np.testing.assert_allclose(by_replica[:, 0].mean(axis=0), ref.losses, rtol=dpkit.RTOL)
    assert ref.losses[1] != ref.losses[0]  # the first step changed the weights
