"""Gradient clipping by the global norm across shards.

    ||g||^2 = sum over ranks of ||g_shard||^2     (all_reduce the squares, then the root)

and every rank scales by min(1, max_norm / (||g|| + 1e-6)). The classic bug clips each
shard by its own norm (or all-reduces the norms instead of their squares): the tests below
show that the equivalence check catches both.
"""

import math

import numpy as np
import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import zero_engine

MAX_NORM = 0.05  # well below this model's gradient norm (~0.3): clipping is active


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_norm_is_the_single_device_global_norm_on_every_rank(dpkit, stage):
    n = 4
    cfg = dpkit.tiny_config(seed=2)
    batches = dpkit.global_batches(cfg, 1, 2 * n, seed=2)
    ref = dpkit.reference_run(cfg, batches, MAX_NORM)
    assert ref.norms[0] > 2 * MAX_NORM  # the test clips for real

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, max_grad_norm=MAX_NORM, **dpkit.OPT)
        model.loss_and_grad(*split_data_parallel(*batches[0], ctx.rank, n))
        engine._wait_reductions()
        local = math.sqrt(engine.optimizer.squared_grad_norm(engine._owned_grads()))
        engine.step()
        return engine.last_grad_norm, local

    results = mp.launch(program, n)
    for norm, local in results:
        dpkit.assert_close(norm, ref.norms[0])
    locals_ = [local for _, local in results]
    if stage == 0:  # DDP: every rank holds the whole averaged gradient
        assert locals_ == pytest.approx([ref.norms[0]] * n, rel=1e-12)
    else:  # a shard's own norm is smaller and differs from rank to rank
        assert max(locals_) < ref.norms[0] and len(set(locals_)) == n
        assert sum(x * x for x in locals_) == pytest.approx(ref.norms[0] ** 2, rel=1e-12)


def per_shard_norm(engine):
    """The classic bug: each rank clips by the norm of its own shard."""
    engine._sum_over_shards = lambda local: local
    return engine


def summed_norms(engine):
    """Its cousin: all-reduce the norms, not their squares."""
    from minipar.runtime.collectives import all_reduce

    engine._sum_over_shards = lambda local: float(
        all_reduce(np.array([math.sqrt(local)]), "sum", group=engine.shard_group)[0]) ** 2
    return engine


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("bug", [per_shard_norm, summed_norms])
def test_the_equivalence_check_catches_clipping_each_shard_by_its_own_norm(dpkit, stage, bug):
    n = 4
    cfg = dpkit.tiny_config(seed=4)
    batches = dpkit.global_batches(cfg, 3, 2 * n, seed=4)
    ref = dpkit.reference_run(cfg, batches, MAX_NORM)
    good = dpkit.parallel_run(lambda m: zero_engine(m, stage=stage, max_grad_norm=MAX_NORM,
                                                    **dpkit.OPT), cfg, batches, n)
    dpkit.assert_state_close(good.state, ref.state)
    bad = dpkit.parallel_run(lambda m: bug(zero_engine(m, stage=stage, max_grad_norm=MAX_NORM,
                                                       **dpkit.OPT)), cfg, batches, n)
    with pytest.raises(AssertionError):
        dpkit.assert_state_close(bad.state, ref.state)
    worst = max(np.abs(bad.state[k] - ref.state[k]).max() for k in ref.state if "param/" in k)
    assert worst > 1e-5  # not a rounding matter: whole steps of the wrong length
