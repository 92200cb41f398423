"""What expert parallelism costs, read from the ledger and the trace: each rank holds the
router, the shared experts and its E/ep experts, to the byte; a hot expert makes its rank
the straggler that every other rank waits for in the combine all-to-all."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn.moe import MoE
from minipar.parallel.ep import ExpertParallelMoE

S, B, H, F = 4, 2, 8, 16
E = 4


def kw(**extra):
    return dict(name="moe", hidden=H, ffn_hidden=F, num_experts=E, top_k=1,
                shared_ffn_hidden=8, **extra)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_each_rank_holds_the_router_the_shared_experts_and_its_own_experts(ep):
    with mp.device() as ctx:
        full = MoE(**kw())
        whole = ctx.ledger.held("parameters")
        expert = sum(p.data.nbytes for p in full.experts.local[0].parameters())

    def program(ctx):
        moe = ExpertParallelMoE(**kw(), group=mp.new_group(range(ep)))
        return ctx.ledger.held("parameters"), [p.name for p in moe.parameters()]

    for held, names in mp.launch(program, ep):
        assert held == whole - (E - E // ep) * expert  # every byte: E/ep experts stay
        assert sum(".experts." in n for n in names) == 4 * (E // ep)  # fc1, fc2: w and b


@pytest.mark.timeout(60)
def test_a_hot_expert_makes_its_rank_the_straggler():
    """Every token picks expert 0 (the bias), which rank 0 holds: rank 0 runs every row of
    both ranks, rank 1 none, and rank 1's clock waits for rank 0 in the combine."""
    x = np.random.default_rng(0).standard_normal((2, S, B, H))

    def program(ctx):
        moe = ExpertParallelMoE(**kw(), group=mp.new_group([0, 1]))
        moe.router.expert_bias[0] = 100.0  # the hot expert
        n = len(ctx.trace.events)
        moe.forward(x[ctx.rank])
        events = ctx.trace.events[n:]
        experts = sum(e.end - e.start for e in events
                      if e.stream == "compute" and ".experts." in e.label)
        combine = [e for e in events if e.name == "all_to_all_single"][-1]
        return experts, combine, ctx.clock.now

    (hot, c0, t0), (cold, c1, t1) = mp.launch(program, 2)
    assert cold == 0 and hot > 0  # rank 1's expert has no rows
    assert c0.start == c1.start  # the combine starts on both when rank 0 is ready
    assert t1 >= c1.start > hot  # rank 1 waited through rank 0's expert compute
    assert t0 == pytest.approx(t1)
