"""Misuse of the data-parallel engines is refused with errors that say what to change."""

import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.optim import SGD
from minipar.parallel import DistributedDataParallel, ZeroEngine, zero_engine


def on_two_ranks(fn):
    return mp.launch(fn, 2)


@pytest.mark.timeout(60)
def test_construction_errors(dpkit):
    cfg = dpkit.tiny_config()
    with mp.device():
        with pytest.raises(TypeError, match="Pass minipar.optim.AdamW"):
            zero_engine(GPT(cfg), SGD, stage=2, lr=0.1)
    with mp.device():
        with pytest.raises(TypeError, match="float16 training needs loss scaling"):
            zero_engine(GPT(dpkit.tiny_config(dtype="float16")), stage=1, **dpkit.OPT)
    with mp.device():
        with pytest.raises(ValueError, match=r"ZeRO stages are 0 \(DDP\)"):
            zero_engine(GPT(cfg), stage=4)
    with mp.device():
        with pytest.raises(ValueError, match="use zero_engine"):
            ZeroEngine(GPT(cfg), stage=3)
    with mp.device():
        with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
            zero_engine(GPT(cfg), stage=1, max_grad_norm=0.0)
    with mp.device():
        with pytest.raises(TypeError, match="not params"):
            DistributedDataParallel(GPT(cfg), params=[])


@pytest.mark.timeout(60)
def test_a_rank_outside_the_group_is_told_so(dpkit):
    def program(ctx):
        zero_engine(GPT(dpkit.tiny_config()), stage=2, process_group=mp.new_group([0], "dp0"))

    with pytest.raises(mp.RankFailedError,
                       match=r"rank 1 is not a member of process group dp0\[0\]"):
        on_two_ranks(program)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_step_after_only_unsynchronised_backwards_is_refused(dpkit, stage):
    cfg = dpkit.tiny_config()
    ids, tgt = dpkit.global_batches(cfg, 1, 2, seed=0)[0]

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, **dpkit.OPT)
        with engine.no_sync():
            model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, 2))
        engine.step()

    with pytest.raises(mp.RankFailedError, match="Run the last micro-batch outside no_sync"):
        on_two_ranks(program)


@pytest.mark.timeout(60)
def test_zero1_reduces_once_per_step(dpkit):
    cfg = dpkit.tiny_config()
    ids, tgt = dpkit.global_batches(cfg, 1, 4, seed=0)[0]

    def program(ctx):
        model = GPT(cfg)
        zero_engine(model, stage=1, **dpkit.OPT)
        x, y = split_data_parallel(ids, tgt, ctx.rank, 2)
        model.loss_and_grad(x[:, :1], y[:, :1], loss_scale=0.5)
        model.loss_and_grad(x[:, 1:], y[:, 1:], loss_scale=0.5)  # synchronised again

    with pytest.raises(mp.RankFailedError, match="ZeRO-1 reduces gradients once per step"):
        on_two_ranks(program)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 1])
def test_freeing_the_gradients_behind_the_engines_back_is_caught(dpkit, stage):
    cfg = dpkit.tiny_config()
    ids, tgt = dpkit.global_batches(cfg, 1, 2, seed=0)[0]

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, **dpkit.OPT)
        x, y = split_data_parallel(ids, tgt, ctx.rank, 2)
        model.loss_and_grad(x, y)
        engine.step()
        model.zero_grad()  # drops the views of the engine's buffers
        model.loss_and_grad(x, y)

    with pytest.raises(mp.RankFailedError, match="Call engine.zero_grad"):
        on_two_ranks(program)


@pytest.mark.timeout(60)
def test_a_sharded_parameter_cannot_be_used_by_accident(dpkit):
    cfg = dpkit.tiny_config()
    ids, tgt = dpkit.global_batches(cfg, 1, 1, seed=0)[0]
    with mp.device():
        model = GPT(cfg)
        engine = zero_engine(model, stage=3, **dpkit.OPT)
        engine.remove_hooks()  # nobody gathers the weights now
        assert model.wte.weight.data.shape == (0,)
        with pytest.raises((IndexError, ValueError)):
            model.loss_and_grad(ids, tgt)


def test_hybrid_shard_needs_a_two_dimensional_mesh():
    from minipar.parallel import hybrid_mesh

    with mp.device():
        with pytest.raises(ValueError, match=r"2-D mesh with dimensions \('replicate', 'shard'\)"):
            hybrid_mesh(mp.DeviceMesh((1,), ("dp",)))
