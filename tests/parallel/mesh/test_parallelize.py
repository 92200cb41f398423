"""parallelize picks the engine the table says, over the groups it says, refuses layouts that
mean nothing, and trains like one device on the layouts the tp equivalence draw reaches
least often (every split of dp into dp_shard x dp_replicate, with tp and SP)."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT
from minipar.parallel import (ParallelDims, ParallelGroups, ShardingStrategy, TensorParallelGPT,
                              model_parallel_norm, parallelize, zero_engine)

S = ShardingStrategy


def built(dims, **kw):
    """(engine class name, stage, its group's ranks, replicate ranks or None) on rank 0."""
    cfg = kw.pop("cfg", None)

    def program(ctx):
        run = parallelize(cfg or TINY, dims, lr=1e-2, **kw)
        e = getattr(run.engine, "engine", run.engine)  # FSDP's inner engine
        rep = getattr(e, "replicate_group", None)
        mp_norm = e.model_parallel
        return (type(run.engine).__name__, type(e).__name__, e.stage, e.group.ranks,
                rep.ranks if rep is not None else None,
                mp_norm.group.ranks if mp_norm is not None else None)
    return mp.launch(program, dims.world_size)[0]


TINY = None


@pytest.fixture(autouse=True)
def _tiny(dpkit):
    global TINY
    TINY = dpkit.tiny_config(num_heads=2, hidden=8, vocab_size=16, ffn_hidden=8)


@pytest.mark.parametrize("dims, kw, want", [
    (ParallelDims(dp_replicate=2, tp=2), {}, ("DistributedDataParallel", "DistributedDataParallel",
                                              0, (0, 2), None, (0, 1))),
    (ParallelDims(dp_shard=2, tp=2), dict(zero=1), ("ZeroEngine", "ZeroEngine", 1, (0, 2),
                                                   None, (0, 1))),
    (ParallelDims(dp_replicate=2, dp_shard=2), dict(zero=2),
     ("ZeroEngine", "ZeroEngine", 2, (0, 1), (0, 2), None)),
    (ParallelDims(dp_shard=4), dict(zero=3), ("Zero3Engine", "Zero3Engine", 3, (0, 1, 2, 3),
                                              None, None)),
    (ParallelDims(dp_replicate=2, dp_shard=2, tp=2), dict(sharding_strategy=S.HYBRID_SHARD),
     ("FullyShardedDataParallel", "Zero3Engine", 3, (0, 2), (0, 4), (0, 1))),
    (ParallelDims(dp_shard=2, tp=2), dict(sharding_strategy=S.SHARD_GRAD_OP),
     ("FullyShardedDataParallel", "ZeroEngine", 2, (0, 2), None, (0, 1))),
    (ParallelDims(dp_replicate=4), dict(sharding_strategy=S.NO_SHARD),
     ("FullyShardedDataParallel", "DistributedDataParallel", 0, (0, 1, 2, 3), None, None)),
])
def test_the_engine_and_its_groups(dims, kw, want):
    assert built(dims, **kw) == want


@pytest.mark.parametrize("dims, kw, words", [
    (ParallelDims(dp_shard=2), dict(zero=0), ["zero=0 shards nothing", "dp_replicate=2"]),
    (ParallelDims(dp_shard=2), dict(sharding_strategy=S.NO_SHARD), ["NO_SHARD shards nothing"]),
    (ParallelDims(dp_replicate=2), dict(zero=1), ["dp_shard (x cp), which is 1", "dp_shard=2"]),
    (ParallelDims(dp_replicate=2, dp_shard=2), dict(sharding_strategy=S.FULL_SHARD),
     ["HYBRID_SHARD", "dp_replicate=2"]),
    (ParallelDims(dp_shard=2), dict(zero=1, sharding_strategy=S.FULL_SHARD), ["not both"]),
    (ParallelDims(dp_shard=2), dict(zero=4), ["ZeRO stage", "zero=4"]),
])
def test_layouts_that_mean_nothing_are_refused(dims, kw, words):
    with pytest.raises(mp.RankFailedError) as e:
        built(dims, **kw)
    assert isinstance(e.value.original, ValueError)
    for w in words:
        assert w in str(e.value.original)


def test_parallelize_wants_a_config_and_dims_it_can_build():
    def program(ctx):
        with pytest.raises(TypeError, match="pass the GPTConfig"):
            parallelize(GPT(TINY), ParallelDims())
        with pytest.raises(TypeError, match="ParallelDims"):
            parallelize(TINY, (1, 1))
    mp.launch(program, 1)


def test_an_engine_refuses_to_clip_a_tensor_parallel_model_without_its_norm_group():
    """Without model_parallel the norm would miss the other tp shards: the clip coefficient
    would differ between tp ranks. The engine says so instead of training wrongly."""
    def program(ctx):
        model = TensorParallelGPT(TINY, mp.new_group(range(2), "tp"))
        zero_engine(model, stage=1, process_group=mp.new_group([ctx.rank], "dp"),
                    max_grad_norm=1.0, lr=1e-2)
    with pytest.raises(mp.RankFailedError) as e:
        mp.launch(program, 2)
    msg = str(e.value.original)
    assert isinstance(e.value.original, ValueError) and msg.startswith("rank ")
    assert "model_parallel=ModelParallelNorm" in msg and "parallelize" in msg


@pytest.mark.parametrize("dims, kw", [
    (ParallelDims(dp_replicate=2, dp_shard=2, tp=2), dict(zero=1, sequence_parallel=True)),
    (ParallelDims(dp_replicate=2, dp_shard=2, tp=2), dict(zero=2)),
    (ParallelDims(dp_replicate=2, dp_shard=2, tp=2),
     dict(sharding_strategy=S.HYBRID_SHARD, sequence_parallel=True)),
    (ParallelDims(dp_replicate=2, tp=4, order="dp-tp"), dict(zero=0, sequence_parallel=True)),
])
def test_every_split_of_dp_with_tp_trains_like_one_device(dpkit, dims, kw):
    """3 clipped AdamW steps with dropout: losses and every gathered weight equal one device."""
    cfg = dpkit.tiny_config(num_heads=4, hidden=8, vocab_size=16, ffn_hidden=8, seq_len=8,
                            dropout=0.1, seed=4)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=dims.dp, seed=4)
    ref = dpkit.reference_run(cfg, batches, max_grad_norm=0.05)

    def program(ctx):
        run = parallelize(cfg, dims, max_grad_norm=0.05, **kw, **dpkit.OPT)
        losses = [run.train_step(ids, tgt) for ids, tgt in batches]
        with run.engine.summon_full_params(writeback=False):  # ZeRO-3 keeps shards only
            params = run.model.full_parameters()  # gathered over tp
        return losses, params, run.engine.last_grad_norm, run.groups.coordinate["tp"]

    res = mp.launch(program, dims.world_size)
    losses = np.mean([r[0] for r in res if r[3] == 0], axis=0)  # one rank per dp block
    dpkit.assert_close(losses, ref.losses, what="losses")
    for r, (_, params, norm, _) in enumerate(res):
        dpkit.assert_close(norm, ref.norms[-1], what=f"rank {r} gradient norm")
        for name, w in params.items():
            want = ref.state[f"param/{name}"]
            np.testing.assert_allclose(w, want, rtol=dpkit.RTOL,
                                       atol=dpkit.ATOL_SCALE * np.abs(want).max(),
                                       err_msg=f"rank {r} {name}")


def test_an_engine_refuses_a_dp_group_that_overlaps_the_tp_group():
    """dp over the whole world with tp over the whole world: every rank would average its
    shards with the other shards (DDP's broadcast would overwrite them)."""
    def program(ctx):
        model = TensorParallelGPT(TINY, ctx.world)
        zero_engine(model, stage=0, model_parallel=model_parallel_norm(
            model, ParallelGroups(ParallelDims(tp=2))), lr=1e-2)
    with pytest.raises(mp.RankFailedError) as e:
        mp.launch(program, 2)
    msg = str(e.value.original)
    assert "share ranks [1]" in msg or "share ranks [0]" in msg
    assert "Take both groups from one ParallelGroups" in msg
