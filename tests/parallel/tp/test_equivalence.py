"""Tensor (and sequence) parallelism is one device: a run built by `parallelize` — tp ranks
alone, or a dp x tp mesh under DDP, ZeRO-1, 2 or 3 or any FSDP strategy (HYBRID_SHARD on
dp_shard 2 x dp_replicate 2 x tp 2) — trains exactly like one GPT on the whole global
batch, dropout included; with checkpoint segments of any size too, against the one GPT
that keeps everything.

Each example draws tp in {1, 2, 3, 4}, heads, head size, ffn and vocabulary sizes that
divide by it, a sequence length (divisible by tp under sequence parallelism), sequence
parallelism, dropout, tied embeddings, recomputation, a dp size and engine (ZeRO stage or
FSDP strategy), clipping and seeds; runs 3 AdamW steps both ways; and compares losses, the first step's
gradients gathered over tp, the weights and Adam's moments after the last step.

Tolerances (float64, as the data-parallel tests; see conftest.py): losses rtol 1e-12;
first-step gradients rtol 1e-12 + 1e-14 of the model's largest gradient; weights, m and v
rtol 1e-12 + 1e-11 of the model's largest weight, m or v (Adam's lr/eps slope near
|g| = eps; see check()).
"""

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import minipar as mp
from minipar.nn import GPT
from minipar.parallel import ParallelDims, ShardingStrategy, parallelize
from minipar.parallel.tp.layers import gather_parameter
from minipar.parallel.tp.gpt import TensorParallelGPT
from minipar.runtime.collectives import all_gather


def tp_config(kit, tp, **kw):
    """Heads, ffn, vocabulary and sequence all divisible by tp (and by 2 and 4 when tp is)."""
    unit = 3 if tp == 3 else 4
    base = dict(vocab_size=4 * unit, seq_len=2 * unit, hidden=4 * unit, num_heads=unit,
                ffn_hidden=6 * unit)
    base.update(kw)
    return kit.tiny_config(**base)


def gathered_state(engine, model, tp_group):
    """engine.full_state_dict() with every tensor-parallel shard all-gathered over tp."""
    sd = engine.full_state_dict()
    params = model.named_parameters()
    out = {}
    for key, arr in sd.items():
        name = key.split("/", 1)[1]
        for suffix in (".master", ".m", ".v"):
            if key.startswith("optim/") and name.endswith(suffix):
                name = name[: -len(suffix)]
        p = params.get(name)
        if p is not None and getattr(p, "tensor_model_parallel", False) and tp_group.size > 1:
            arr = all_gather(arr, axis=p.partition_dim, group=tp_group)
        out[key] = arr
    return out


def tp_run(cfg, batches, dp, tp, *, stage=0, sequence_parallel=False, micro_batches=1,
           max_grad_norm=None, opt, strategy=None, replicate=1):
    """3 steps through `parallelize` on a dp x tp mesh (tp fastest): losses, first-step
    gathered grads, states. stage: a ZeRO stage, or strategy: an FSDP ShardingStrategy;
    replicate: how many of the dp ranks are dp_replicate (the rest dp_shard)."""
    stage = None if strategy is not None else stage
    if stage == 0 or strategy is ShardingStrategy.NO_SHARD:  # replicas, nothing sharded
        dims = ParallelDims(dp_replicate=dp, tp=tp)
    else:
        dims = ParallelDims(dp_replicate=replicate, dp_shard=dp // replicate, tp=tp)

    def program(ctx):
        run = parallelize(cfg, dims, zero=stage, sharding_strategy=strategy,
                          sequence_parallel=sequence_parallel, max_grad_norm=max_grad_norm,
                          **opt)
        model, engine, tp_group = run.model, run.engine, run.groups.tp
        losses, grads = [], []
        for ids, tgt in batches:
            losses.append(run.forward_backward(ids, tgt, micro_batches))
            if not grads:
                full = engine.full_grads()  # averaged over dp, this rank's tp shards
                grads = {p.name: (all_gather(full[p.name], axis=p.partition_dim,
                                             group=tp_group)
                                  if getattr(p, "tensor_model_parallel", False) and tp > 1
                                  else full[p.name]) for p in model.parameters()}
            run.step()
        return losses, grads, gathered_state(engine, model, tp_group), engine.last_grad_norm

    res = mp.launch(program, dp * tp)
    losses = np.mean([r[0] for r in res[::tp]], axis=0)  # one rank per dp replica
    return losses, res


def _kind(key: str) -> str:
    """param, m, v, master or meta: what a full_state_dict key holds."""
    if key.startswith("optim/"):
        return key.rsplit(".", 1)[1]
    return key.split("/", 1)[0]


def check(kit, cfg, batches, res_losses, res, ref):
    kit.assert_close(res_losses, ref.losses, what="losses")
    # gradients: rtol 1e-12, atol 1e-14 of the model's largest gradient. Tensor parallelism
    # sums partial products in another order, and a small gradient that is a difference of
    # large terms (a query weight's, through the softmax) keeps that order's rounding:
    # measured up to 7e-12 of the element, 4e-16 of the model's largest gradient.
    scale = max(float(np.abs(g).max()) for g in ref.grads[0].values())
    # weights, m and v after the steps: rtol 1e-12, atol 1e-11 of the largest weight (m, v)
    # in the model. Adam's update lr * g / (sqrt(v) + eps) has slope lr/eps = 1e6 near
    # |g| = eps, so rounding noise in a near-zero gradient (a query weight's, in a model
    # this small) moves that weight by ~1e-13 whatever the weight's own size.
    kinds: dict = {}
    for key, arr in ref.state.items():
        kinds[_kind(key)] = max(kinds.get(_kind(key), 0.0), float(np.abs(arr).max()))
    for r, (losses, grads, state, norm) in enumerate(res):
        for name, want in ref.grads[0].items():
            np.testing.assert_allclose(grads[name], want, rtol=kit.RTOL,
                                       atol=kit.GRAD_ATOL_SCALE * scale,
                                       err_msg=f"rank {r} step 0 gradient of {name}")
        assert sorted(state) == sorted(ref.state)
        for key, want in ref.state.items():  # atol: 1e-11 of the largest of its kind
            np.testing.assert_allclose(state[key], want, rtol=kit.RTOL,
                                       atol=kit.ATOL_SCALE * kinds[_kind(key)],
                                       err_msg=f"rank {r} {key}")
        if ref.norms[-1] is not None:
            kit.assert_close(norm, ref.norms[-1], what=f"rank {r} gradient norm")


ENGINES = [0, 1, 2, 3] + list(ShardingStrategy)  # ZeRO stages, then FSDP's strategies


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: getattr(e, "name", f"zero{e}"))
@settings(max_examples=6)
@given(data=st.data())
def test_tensor_parallel_trains_like_one_device(dpkit, engine, data):
    tp = data.draw(st.sampled_from([2, 1, 3, 4]), "tp")
    dp = data.draw(st.sampled_from([2, 1]) if tp <= 2 else st.just(1), "dp")
    sp = data.draw(st.booleans(), "sequence_parallel")
    dropout = data.draw(st.sampled_from([0.0, 0.2]), "dropout")
    recompute = data.draw(st.sampled_from(["none", "selective", "full"]), "recompute")
    tie = data.draw(st.booleans(), "tie embeddings")
    stage, strategy = (engine, None) if isinstance(engine, int) else (None, engine)
    # HYBRID_SHARD needs dp_shard x dp_replicate: 2 x 2 on a dp = 4, tp = 2 world of 8
    replicate = 2 if strategy is ShardingStrategy.HYBRID_SHARD else 1
    if replicate > 1:
        dp, tp = 4, min(tp, 2)
    event(f"{engine if strategy is None else strategy.name} dp={dp} tp={tp}")
    max_norm = data.draw(st.sampled_from([None, 0.05]), "max_grad_norm")  # 0.05 clips
    layers = data.draw(st.integers(1, 2), "layers")
    seed = data.draw(st.integers(0, 2**16), "seed")
    # masks are drawn for the whole batch at once: micro-batches only without dropout
    k = 1 if dropout else data.draw(st.integers(1, 2), "micro-batches")
    heads = tp * data.draw(st.integers(1, 2), "heads per rank")  # tp as drawn or capped
    head_dim = data.draw(st.integers(2, 4), "head dim")  # h = 1: LayerNorm of one feature is constant
    ffn = tp * data.draw(st.integers(1, 6), "ffn per rank")
    vocab = tp * data.draw(st.integers(2, 7), "vocabulary per rank")
    seq = tp * data.draw(st.integers(1, 3), "tokens per rank (SP)") if sp else data.draw(
        st.integers(1, 8), "sequence length")
    cfg = dpkit.tiny_config(vocab_size=vocab, seq_len=seq, hidden=heads * head_dim,
                            num_heads=heads, ffn_hidden=ffn, num_layers=layers, seed=seed,
                            tie_embeddings=tie, dropout=dropout, recompute=recompute)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=dp * k, seed=seed)
    ref = dpkit.reference_run(cfg, batches, max_grad_norm=max_norm)
    losses, res = tp_run(cfg, batches, dp, tp, stage=stage, strategy=strategy,
                         replicate=replicate, sequence_parallel=sp, micro_batches=k,
                         max_grad_norm=max_norm, opt=dpkit.OPT)
    check(dpkit, cfg, batches, losses, res, ref)


SEGMENT_ENGINES = [0, 1, 3, ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", SEGMENT_ENGINES, ids=lambda e: getattr(e, "name", f"zero{e}"))
@settings(max_examples=8)
@given(data=st.data())
def test_checkpoint_segments_train_like_one_device_keeping_everything(dpkit, engine, data):
    """recompute="segments" of k = 1 .. L + 1 blocks through `parallelize` (DDP, ZeRO-1,
    ZeRO-3, FSDP FULL_SHARD and HYBRID_SHARD, tp with or without SP, dropout on or off)
    against one GPT with recompute="none": a segment's rerun gathers its k blocks under
    ZeRO-3 and redraws the global batch's masks in every layout."""
    tp = data.draw(st.sampled_from([2, 1]), "tp")
    stage, strategy = (engine, None) if isinstance(engine, int) else (None, engine)
    replicate = 2 if strategy is ShardingStrategy.HYBRID_SHARD else 1
    dp = 4 if replicate > 1 else data.draw(st.sampled_from([2, 1]), "dp")
    sp = data.draw(st.booleans(), "sequence_parallel")
    dropout = data.draw(st.sampled_from([0.0, 0.2]), "dropout")
    layers = data.draw(st.integers(2, 4), "layers")
    k = data.draw(st.integers(1, layers + 1), "blocks per segment")
    seed = data.draw(st.integers(0, 2**16), "seed")
    event(f"layers={layers} k={k} dp={dp} tp={tp}")
    cfg = tp_config(dpkit, tp, num_layers=layers, dropout=dropout, seed=seed)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=dp, seed=seed)
    ref = dpkit.reference_run(cfg, batches, max_grad_norm=0.05)
    losses, res = tp_run(cfg.with_(recompute="segments", recompute_segment=k), batches, dp,
                         tp, stage=stage, strategy=strategy, replicate=replicate,
                         sequence_parallel=sp, max_grad_norm=0.05, opt=dpkit.OPT)
    check(dpkit, cfg, batches, losses, res, ref)


@pytest.mark.parametrize("engine", [3, ShardingStrategy.FULL_SHARD], ids=["zero3", "FULL_SHARD"])
@pytest.mark.parametrize("k", [2, 3])
def test_segments_of_several_blocks_on_a_2x2_mesh_under_zero3(dpkit, engine, k):
    """5 blocks in segments of 2 (2, 2, 1) or 3 (3, 2) on dp 2 x tp 2 with SP and dropout:
    each rerun needs blocks whose weights ZeRO-3 freed after their forward."""
    cfg = tp_config(dpkit, 2, num_layers=5, dropout=0.1, seed=k)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=2, seed=k)
    ref = dpkit.reference_run(cfg, batches)
    stage, strategy = (engine, None) if isinstance(engine, int) else (None, engine)
    losses, res = tp_run(cfg.with_(recompute="segments", recompute_segment=k), batches, 2, 2,
                         stage=stage, strategy=strategy, sequence_parallel=True, opt=dpkit.OPT)
    check(dpkit, cfg, batches, losses, res, ref)


@pytest.mark.parametrize("hidden, heads, ffn, vocab", [(24, 6, 36, 24), (48, 12, 48, 36)])
@pytest.mark.parametrize("sp", [False, True])
def test_wider_shapes_with_tp_3_and_4(dpkit, hidden, heads, ffn, vocab, sp):
    """Shapes other than the drawn ones: tp = 3 and 4 where they divide, dropout on."""
    for tp in (3, 4):
        if heads % tp or ffn % tp or vocab % tp:
            continue
        cfg = dpkit.tiny_config(vocab_size=vocab, seq_len=12, hidden=hidden, num_heads=heads,
                                ffn_hidden=ffn, dropout=0.1, num_layers=1, seed=tp)
        batches = dpkit.global_batches(cfg, steps=3, global_batch=2, seed=tp)
        ref = dpkit.reference_run(cfg, batches)
        losses, res = tp_run(cfg, batches, 1, tp, sequence_parallel=sp, opt=dpkit.OPT)
        check(dpkit, cfg, batches, losses, res, ref)


def test_zero1_on_a_2x2_mesh_with_clipping_and_dropout(dpkit):
    """The composition the course names: ZeRO-1 over dp, Megatron tp + sp, clipping on, and
    the gradient norm over dp and tp equal to one device's."""
    cfg = tp_config(dpkit, 2, dropout=0.1, seed=3)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=4, seed=3)
    ref = dpkit.reference_run(cfg, batches, max_grad_norm=0.05)
    assert all(n > 0.05 for n in ref.norms)  # the clip is active on every step
    losses, res = tp_run(cfg, batches, 2, 2, stage=1, sequence_parallel=True,
                         max_grad_norm=0.05, opt=dpkit.OPT)
    check(dpkit, cfg, batches, losses, res, ref)


def test_shards_are_slices_of_the_full_initialisation(dpkit):
    """As Megatron's _initialize_affine_weight_cpu: rank r holds the matching slice of the
    single-device weight, for every parameter, at tp = 2 and 4."""
    cfg = tp_config(dpkit, 4, num_layers=2)
    with mp.device():
        full = {p.name: p.data.copy() for p in GPT(cfg).parameters()}
    for tp in (2, 4):
        def program(ctx):
            model = TensorParallelGPT(cfg, mp.new_group(range(tp), "tp"))
            out = {}
            for p in model.parameters():
                if getattr(p, "tensor_model_parallel", False):
                    n = full[p.name].shape[p.partition_dim] // tp
                    want = np.take(full[p.name], range(ctx.rank * n, (ctx.rank + 1) * n),
                                   axis=p.partition_dim)
                else:
                    want = full[p.name]
                np.testing.assert_array_equal(p.data, want, err_msg=p.name)
                out[p.name] = gather_parameter(p, model.group)
            return out

        for gathered in mp.launch(program, tp):
            assert sorted(gathered) == sorted(full)
            for name, arr in gathered.items():
                np.testing.assert_array_equal(arr, full[name], err_msg=name)
