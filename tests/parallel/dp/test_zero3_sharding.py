"""ZeRO-3 / FSDP FULL_SHARD: weights exist whole only while used; prefetch hides the
all-gathers on the clock; limit_all_gathers bounds how many units are whole at once;
summon_full_params; HYBRID_SHARD's groups."""

import numpy as np
import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import (FullyShardedDataParallel, ShardingStrategy, Zero3Engine,
                              hybrid_mesh)
from minipar.runtime.device import DeviceSpec

SLOW = DeviceSpec("slow", {"float64": 1e9, "bfloat16": 4e9, "float32": 2e9}, 10**12)


@pytest.mark.timeout(60)
def test_weights_are_whole_only_inside_their_units_forward_and_backward(dpkit):
    cfg = dpkit.tiny_config(num_layers=2)
    (ids, tgt), = dpkit.global_batches(cfg, 1, 2, seed=0)

    def program(ctx):
        model = GPT(cfg)
        engine = Zero3Engine(model, **dpkit.OPT)
        seen = []  # at each block's forward_pre/backward_pre: which blocks are whole?
        for event in ("forward_pre", "backward_pre"):
            model.hooks.register(event, lambda unit, e=event: seen.append(
                (e, unit, sorted(n for n, u in engine.state.items()
                                 if u.flat.params[0].data.size > 0))))
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, 2))
        engine.step()
        sizes = {p.name: p.data.size for p in model.parameters()}
        return seen, sizes

    seen, sizes = mp.launch(program, 2)[0]
    assert set(sizes.values()) == {0}  # after the step: every parameter sharded away
    # the root stays whole from forward to backward; a block only around its own use (the
    # block prefetched by backward_prefetch is still in flight, not whole, at these points)
    assert seen == [("forward_pre", "root", ["root"]),
                    ("forward_pre", "blocks.0", ["blocks.0", "root"]),
                    ("forward_pre", "blocks.1", ["blocks.1", "root"]),
                    ("backward_pre", "root", ["root"]),
                    ("backward_pre", "blocks.1", ["blocks.1", "root"]),
                    ("backward_pre", "blocks.0", ["blocks.0", "root"])]


def run_step(kit, n, **kw):
    cfg = kit.tiny_config(num_layers=2, hidden=16)
    (ids, tgt), = kit.global_batches(cfg, 1, n, seed=0)

    def program(ctx):
        model = GPT(cfg)
        engine = Zero3Engine(model, **kit.OPT, **kw)
        live = []
        for event in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
            model.hooks.register(event, lambda unit: live.append(engine._live()))
        t0 = ctx.clock.now
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, n))
        engine.step()
        return ctx.clock.now - t0, max(live), engine.full_state_dict()

    return mp.launch(program, n, topology=mp.Topology.nodes(1, n, device=SLOW))[0]


@pytest.mark.timeout(60)
def test_prefetch_hides_all_gathers_behind_compute(dpkit):
    t_none, _, sd_none = run_step(dpkit, 2, forward_prefetch=False, backward_prefetch=False)
    t_fwd, _, sd_fwd = run_step(dpkit, 2, forward_prefetch=True, backward_prefetch=False)
    t_both, _, sd_both = run_step(dpkit, 2, forward_prefetch=True, backward_prefetch=True)
    assert t_both < t_fwd < t_none  # each prefetch takes all-gathers off the critical path
    dpkit.assert_state_equal(sd_fwd, sd_none)  # same arithmetic, only the timing moves
    dpkit.assert_state_equal(sd_both, sd_none)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit, bound", [(1, 1), (2, 2), (True, 2)])
def test_limit_all_gathers_bounds_the_units_whole_at_once(dpkit, limit, bound):
    _, most, _ = run_step(dpkit, 2, forward_prefetch=True, backward_prefetch=True,
                          limit_all_gathers=limit)
    assert most == bound  # non-root units whole or in flight, at any hook


@pytest.mark.timeout(60)
def test_limit_all_gathers_is_validated(dpkit):
    with mp.device():
        with pytest.raises(ValueError, match="limit_all_gathers must be True"):
            Zero3Engine(GPT(dpkit.tiny_config()), limit_all_gathers=0, **dpkit.OPT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD])
def test_summon_full_params_gathers_and_writes_back(dpkit, dtype, strategy):
    cfg = dpkit.tiny_config(dtype=dtype)
    (ids, tgt), = dpkit.global_batches(cfg, 1, 2, seed=0)

    def program(ctx):
        model = GPT(cfg)
        fsdp = FullyShardedDataParallel(model, sharding_strategy=strategy, **dpkit.OPT)
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, 2))
        fsdp.step()
        fsdp.zero_grad()
        sd = fsdp.full_state_dict()
        with fsdp.summon_full_params(writeback=False):
            whole = {p.name: p.data.astype(np.float64) for p in model.parameters()}
            model.ln_f.weight.data[...] = 5.0  # discarded
        with fsdp.summon_full_params():
            model.ln_f.weight.data[...] = 2.0  # kept
        after = fsdp.full_state_dict()
        sizes = {p.data.size for p in model.parameters()}
        return sd, whole, after, sizes

    for sd, whole, after, sizes in mp.launch(program, 2):
        for name, w in whole.items():
            np.testing.assert_array_equal(w, sd[f"param/{name}"].astype(np.float64))
        np.testing.assert_array_equal(after["param/ln_f.weight"], 2.0)
        if dtype == "bfloat16":  # the master follows, so the next step starts from 2.0
            np.testing.assert_array_equal(after["optim/ln_f.weight.master"], 2.0)
        if strategy is ShardingStrategy.FULL_SHARD:
            assert sizes == {0}  # resharded on exit


@pytest.mark.timeout(60)
def test_hybrid_shard_groups_follow_the_nodes(dpkit):
    def program(ctx):
        shard, replicate = hybrid_mesh()
        return shard.ranks, replicate.ranks

    got = mp.launch(program, 6, topology=mp.Topology.nodes(2, gpus_per_node=3))
    assert got[4] == ((3, 4, 5), (1, 4))  # shard inside node 1, replicate across nodes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy, engine_type", [
    (ShardingStrategy.FULL_SHARD, "Zero3Engine"), (ShardingStrategy.SHARD_GRAD_OP, "ZeroEngine"),
    (ShardingStrategy.NO_SHARD, "DistributedDataParallel"),
    (ShardingStrategy.HYBRID_SHARD, "Zero3Engine")])
def test_fsdp_strategies_pick_their_engines(dpkit, strategy, engine_type):
    def program(ctx):
        fsdp = FullyShardedDataParallel(GPT(dpkit.tiny_config()), sharding_strategy=strategy,
                                        **dpkit.OPT)
        e = fsdp.engine
        return type(e).__name__, e.stage, e.group.ranks, getattr(e, "replicate_group", None)

    got = mp.launch(program, 4, topology=mp.Topology.nodes(2, gpus_per_node=2))
    name, stage, group, replicate = got[1]
    assert name == engine_type
    assert stage == {"Zero3Engine": 3, "ZeroEngine": 2, "DistributedDataParallel": 0}[name]
    if strategy is ShardingStrategy.HYBRID_SHARD:
        assert group == (0, 1) and replicate.ranks == (1, 3)
    else:
        assert group == (0, 1, 2, 3) and replicate is None


@pytest.mark.timeout(60)
def test_an_evaluation_forward_between_steps_leaves_nothing_stale(dpkit):
    """A forward without backward leaves the root gathered (it waits for a backward that
    does not come); the next step drops that copy before updating the shards."""
    cfg = dpkit.tiny_config(seed=9)
    batches = dpkit.global_batches(cfg, 2, 4, seed=9)
    ref = dpkit.reference_run(cfg, batches)

    def program(ctx):
        model = GPT(cfg)
        engine = Zero3Engine(model, forward_prefetch=True, **dpkit.OPT)
        losses = []
        for ids, tgt in batches:
            x, y = split_data_parallel(ids, tgt, ctx.rank, 2)
            model.loss_and_grad(x, y)
            engine.step()
            engine.zero_grad()
            losses.append(model.forward(x, y)[0])  # evaluation: forward only
            assert "root" in engine._gathered
        return losses, engine.full_state_dict()

    (losses, sd), _ = mp.launch(program, 2)
    dpkit.assert_state_close(sd, ref.state)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth, limit, most", [(1, False, 2), (2, False, 3), (4, False, 4),
                                                (4, True, 2), (3, 3, 3)])
def test_prefetch_depth_runs_ahead_until_limit_all_gathers_stops_it(dpkit, depth, limit, most):
    """prefetch_depth d: each prefetch reaches the d units that come next, so up to d + 1
    blocks are whole or in flight (4 blocks here); limit_all_gathers caps that count.
    Only memory and timing move: the arithmetic is the same bit for bit."""
    cfg = dpkit.tiny_config(num_layers=4)
    (ids, tgt), = dpkit.global_batches(cfg, 1, 2, seed=0)

    def program(ctx, **kw):
        model = GPT(cfg)
        engine = Zero3Engine(model, forward_prefetch=True, **dpkit.OPT, **kw)
        live = []
        for event in ("forward_pre", "backward_pre"):
            model.hooks.register(event, lambda unit: live.append(engine._live()))
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, 2))
        engine.step()
        return max(live), engine.full_state_dict()

    got, sd = mp.launch(lambda c: program(c, prefetch_depth=depth, limit_all_gathers=limit),
                        2)[0]
    assert got == most
    dpkit.assert_state_equal(sd, mp.launch(lambda c: program(c), 2)[0][1])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_prefetch_depth_is_validated(dpkit, bad):
    with mp.device():
        with pytest.raises(ValueError, match="prefetch_depth is how many units ahead"):
            Zero3Engine(GPT(dpkit.tiny_config()), prefetch_depth=bad, **dpkit.OPT)
