"""What a pipeline asks of the other forms, read from the trace and the ledger.

- Each data-parallel engine reduces every gradient once a step, after the rank's last
  micro-batch's backward: DDP one all-reduce per bucket, ZeRO-1/2/3 one reduce-scatter
  per unit, none during the schedule.
- ZeRO-3 gathers each unit around each use: 2m all-gathers per unit and step under a
  one-chunk schedule (forward and backward of every micro-batch), nothing kept gathered.
- The loss is the last stage's, broadcast over the pp group: one broadcast a step.
- A split root (EMBED, HEAD) under sequence parallelism flushes the root's gradients
  (TensorParallelGPT.finish_backward knew only ROOT and raised KeyError).
- A rank of empty stages holds no parameter, no gradient and no optimizer state, and
  still learns the gradient norm.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.parallel import NoParameters, ParallelDims, TensorParallelGPT, parallelize

M = 4  # micro-batches a step


def one_step(cfg, dims, **kw):
    """Per rank: (the comm events of forward_backward, the F and B actions, the units the
    engine holds, the engine, the dp and pp groups' ranks)."""
    ids, tgt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.seq_len,
                                                                     M * dims.dp))

    def program(ctx):
        run = parallelize(cfg, dims, schedule="1f1b", microbatches=M, lr=1e-2, **kw)
        n = len(ctx.trace.events)
        run.forward_backward(ids, tgt)
        events = ctx.trace.events[n:]
        run.step()
        comm = [e for e in events if e.stream == "comm"]
        actions = [e for e in events if "action" in e.meta]
        engine = getattr(run.engine, "engine", run.engine)
        return comm, actions, engine, run.groups.dp.ranks, run.groups.pp.ranks

    return mp.launch(program, dims.world_size)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_each_gradient_is_reduced_once_after_the_last_backward(dpkit, zero):
    cfg = dpkit.tiny_config(num_layers=4, seq_len=4, tie_embeddings=False)
    dims = (ParallelDims(dp_replicate=2, pp=2) if zero == 0
            else ParallelDims(dp_shard=2, pp=2))
    for comm, actions, engine, dp, pp in one_step(cfg, dims, zero=zero):
        on_dp = [e for e in comm if e.group == dp]
        last_backward = max(e.end for e in actions if e.meta["kind"] == "B")
        if zero == 0:
            reduced = [e for e in on_dp if e.name == "all_reduce"]
            assert len(reduced) == len(engine.buckets)
        else:
            reduced = [e for e in on_dp if e.name == "reduce_scatter"]
            assert len(reduced) == len(engine.units) == 3  # embed or head, and 2 blocks
        assert all(e.start >= last_backward for e in reduced)
        if zero == 3:  # 2m per unit: each micro-batch's forward and backward
            gathers = [e for e in on_dp if e.name == "all_gather"]
            assert len(gathers) == 2 * M * len(engine.units)
        else:
            assert not any(e.name == "all_gather" for e in on_dp)
        assert [e.name for e in comm if e.group == pp] == ["broadcast"]  # the loss


def test_a_split_root_under_sequence_parallelism_flushes_the_roots_gradients(dpkit,
                                                                            gpt_steps):
    """EMBED and HEAD share the root's collector: the split model's gradients are the
    whole root's, gathered or not (before, finish_backward('head') raised KeyError)."""
    cfg = dpkit.tiny_config(num_layers=2, seq_len=4, vocab_size=16, hidden=8, num_heads=2,
                            ffn_hidden=8)
    ids, tgt = np.random.default_rng(1).integers(0, 16, (2, 4, 2))

    def program(split):
        def on_rank(ctx):
            model = TensorParallelGPT(cfg, ctx.world, sequence_parallel=True)
            if split:
                model.split_root()
            gpt_steps(model, ids, tgt, None, 1)
            return {p.name: p.grad.copy() for p in model.parameters()}
        return mp.launch(on_rank, 2)

    for whole, split in zip(program(False), program(True)):
        assert whole.keys() == split.keys()
        for name in whole:
            np.testing.assert_array_equal(split[name], whole[name], err_msg=name)


def test_a_rank_of_empty_stages_holds_nothing_and_still_learns_the_norm(dpkit):
    cfg = dpkit.tiny_config(num_layers=3, seq_len=4)
    batches = dpkit.global_batches(cfg, steps=2, global_batch=M, seed=2)

    def program(ctx):
        run = parallelize(cfg, ParallelDims(pp=4), schedule="gpipe", microbatches=M,
                          layers=[2, 0, 0, 1], max_grad_norm=0.05, lr=1e-2)
        for ids, tgt in batches:
            run.train_step(ids, tgt)
        held = {c: ctx.ledger.held(c) for c in ("parameters", "gradients",
                                                "optimizer_states")}
        return type(run.engine), held, run.engine.last_grad_norm, run.engine.steps

    res = mp.launch(program, 4)
    assert [r[0] is NoParameters for r in res] == [False, True, True, False]
    for _, held, norm, steps in res[1:3]:
        assert held == {"parameters": 0, "gradients": 0, "optimizer_states": 0}
        assert steps == 2
    assert len({r[2] for r in res}) == 1  # every rank clips by the same norm
    assert all(r[1]["parameters"] > 0 for r in (res[0], res[3]))
