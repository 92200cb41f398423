"""What a pipeline asks of the other forms, read from the trace and the ledger.

- Each data-parallel engine reduces every gradient once a step, after the rank's last
  micro-batch's backward: DDP one all-reduce per bucket, ZeRO-1/2/3 one reduce-scatter
  per unit, none during the schedule.
- ZeRO-3 gathers each unit around each use: 2m all-gathers per unit and step under a
  one-chunk schedule (forward and backward of every micro-batch), nothing kept gathered.
- With the backward split (I, W), every reduction waits for the rank's last W, when the
  gradients are complete; ZeRO-3 gathers nothing more for W (W reads no weight). Run
  the other way round — the engine reducing before the W's, as DDP's hooks do in torch
  when W runs outside autograd (pytorch issue 144530) — the gradients are wrong.
- The loss is the last stage's, broadcast over the pp group: one broadcast a step.
- A split root (EMBED, HEAD) under sequence parallelism flushes the root's gradients
  (TensorParallelGPT.finish_backward knew only ROOT and raised KeyError).
- A rank of empty stages holds no parameter, no gradient and no optimizer state, and
  still learns the gradient norm.
- A pipeline rank builds only its stages' blocks (the others are RemoteBlocks), under a
  one-stage schedule, an interleaved one and a V.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import RemoteBlock
from minipar.parallel import NoParameters, ParallelDims, TensorParallelGPT, parallelize
from minipar.parallel.pp import PipelineStage, schedule

M = 4  # micro-batches a step


def one_step(cfg, dims, schedule="1f1b", **kw):
    """Per rank: (the comm events of forward_backward, the F and B actions, the units the
    engine holds, the engine, the dp and pp groups' ranks)."""
    ids, tgt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.seq_len,
                                                                     M * dims.dp))

    def program(ctx):
        run = parallelize(cfg, dims, schedule=schedule, microbatches=M, lr=1e-2, **kw)
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_with_the_backward_split_each_gradient_is_reduced_after_the_last_w(dpkit, zero):
    cfg = dpkit.tiny_config(num_layers=4, seq_len=4, tie_embeddings=True)
    dims = (ParallelDims(dp_replicate=2, pp=2) if zero == 0
            else ParallelDims(dp_shard=2, pp=2))
    actions = dpkit.split_backward(schedule("1f1b", 2, M), defer=True)
    for comm, acts, engine, dp, pp in one_step(cfg, dims, actions, zero=zero):
        on_dp = [e for e in comm if e.group == dp]
        last_w = max(e.end for e in acts if e.meta["kind"] == "W")
        last_i = max(e.end for e in acts if e.meta["kind"] == "I")
        assert last_i < last_w  # the W's come last on every rank
        name = "all_reduce" if zero == 0 else "reduce_scatter"
        reduced = [e for e in on_dp if e.name == name]
        assert len(reduced) == (len(engine.buckets) if zero == 0 else len(engine.units))
        assert all(e.start >= last_w for e in reduced)
        gathers = [e for e in on_dp if e.name == "all_gather"]
        assert len(gathers) == (2 * M * len(engine.units) if zero == 3 else 0)
        tied = [e for e in comm if e.group == pp and e.name == "all_reduce"]
        assert len(tied) == 1 and tied[0].start >= last_w  # the embedding group's sum too


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zero", [0, 1])
def test_reducing_before_the_w_s_would_miss_their_contribution(dpkit, zero):
    """The torch trap, built on purpose: each stage's W is held back and run only after
    grads_ready() has reduced (as DDP's autograd hooks fire before a W run outside
    autograd). The gradients then miss the dp average of the W's; run as the runner runs
    them (W first, then the reduction) they are one device's."""
    cfg = dpkit.tiny_config(num_layers=2, seq_len=4)
    dims = (ParallelDims(dp_replicate=2, pp=2) if zero == 0
            else ParallelDims(dp_shard=2, pp=2))
    batches = dpkit.global_batches(cfg, steps=1, global_batch=M * 2, seed=4)
    want = dpkit.reference_run(cfg, batches).grads[0]
    actions = dpkit.split_backward(schedule("1f1b", 2, M), defer=True)

    def program(ctx, trap):
        run = parallelize(cfg, dims, zero=zero, schedule=actions, microbatches=M, lr=1e-2)
        if trap:
            late, ready = [], run.runner.grads_ready
            for st in run.stages.stages:
                st.backward_weight = lambda i, st=st: late.append((st, i))

            def reduce_then_w():
                ready()
                for st, i in late:
                    PipelineStage.backward_weight(st, i)
            run.runner.grads_ready = reduce_then_w
        run.forward_backward(*batches[0])
        return run.engine.full_grads()

    for trap in (False, True):
        worst = max(float(np.abs(g - want[name]).max())
                    for grads in mp.launch(lambda ctx: program(ctx, trap), 4)
                    for name, g in grads.items())
        scale = max(float(np.abs(g).max()) for g in want.values())
        if trap:
            assert worst > 1e-3 * scale
        else:
            assert worst <= dpkit.GRAD_ATOL_SCALE * scale + dpkit.RTOL * scale


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sched, chunks, want", [
    ("1f1b", None, [{0, 1}, {2, 3}, {4, 5}, {6, 7}]),
    ("interleaved_1f1b", 2, [{0, 4}, {1, 5}, {2, 6}, {3, 7}]),
    ("zbv", None, [{0, 7}, {1, 6}, {2, 5}, {3, 4}]),
])
def test_a_pipeline_rank_builds_only_its_stages_blocks(dpkit, sched, chunks, want):
    cfg = dpkit.tiny_config(num_layers=8, seq_len=4, tie_embeddings=False)

    def program(ctx):
        run = parallelize(cfg, ParallelDims(pp=4), schedule=sched, microbatches=M,
                          chunks=chunks, lr=1e-2)
        built = {i for i, b in enumerate(run.model.blocks) if not isinstance(b, RemoteBlock)}
        staged = {i for st in run.stages.stages for i in range(st.lo, st.hi)}
        return built, staged

    res = mp.launch(program, 4)
    assert [built for built, _ in res] == want
    assert all(built == staged for built, staged in res)
