"""Megatron's layers one at a time against nn: ColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding and vocab_parallel_cross_entropy, with and without sequence
parallelism; the errors for shapes that cannot be split."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward
from minipar.nn.embedding import Embedding
from minipar.nn.linear import Linear
from minipar.nn.saved import Saved
from minipar.parallel.tp.sequence import SequenceParallelGrads
from minipar.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear, gather_parameter
from minipar.parallel.tp.gpt import TensorParallelGPT, check_tensor_parallel
from minipar.parallel.tp.vocab import (VocabParallelEmbedding, padded_vocab_size,
                                    vocab_parallel_cross_entropy,
                                    vocab_parallel_cross_entropy_backward)
from minipar.nn import GPTConfig

TOL = dict(rtol=1e-12, atol=1e-14)


def reference_linear(x, dy, n_in, n_out):
    """y, dx, dW, db of nn.Linear with the same (seed, name) initialisation."""
    with mp.device():
        lin = Linear("lin", n_in, n_out, seed=5)
        lin.bias.set_data(np.linspace(-1, 1, n_out))
        y, saved = lin.forward(x)
        dx = lin.backward(dy, saved)
        return y, dx, lin.weight.grad, lin.bias.grad


def run_tp(program, t):
    return mp.launch(lambda ctx: program(ctx, mp.new_group(range(t), "tp")), t)


def seq_shard(a, r, t):
    return np.split(a, t, axis=0)[r]


@settings(max_examples=20)
@given(t=st.sampled_from([1, 2, 3, 4]), sp=st.booleans(), gather=st.booleans(),
       skip=st.booleans(), seed=st.integers(0, 999))
def test_column_parallel_linear_equals_linear(t, sp, gather, skip, seed):
    s, b, n_in, n_out = 2 * t, 2, 5, 3 * t
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((s, b, n_in)), rng.standard_normal((s, b, n_out))
    y0, dx0, dw0, db0 = reference_linear(x, dy, n_in, n_out)
    gather = gather and not sp  # Megatron refuses gather_output with sequence parallelism

    def program(ctx, g):
        r = ctx.rank
        lin = ColumnParallelLinear("lin", n_in, n_out, g, gather_output=gather,
                                   skip_bias_add=skip, sequence_parallel=sp, seed=5)
        lin.bias.set_data(np.split(np.linspace(-1, 1, n_out), t)[r])
        (y, bias), saved = lin.forward(seq_shard(x, r, t) if sp else x)
        if skip:  # the caller adds the bias (Megatron's fused bias-GeLU / bias-dropout-add)
            assert bias is lin.bias.data
            y = y + (bias if not gather else np.concatenate(np.split(
                np.linspace(-1, 1, n_out), t)))
        else:
            assert bias is None
        dx = lin.backward(dy if gather else np.split(dy, t, axis=-1)[r], saved)
        return y, dx, gather_parameter(lin.weight, g, grad=True), gather_parameter(
            lin.bias, g, grad=True)

    for r, (y, dx, dw, db) in enumerate(run_tp(program, t)):
        np.testing.assert_allclose(y, y0 if gather else np.split(y0, t, axis=-1)[r], **TOL)
        np.testing.assert_allclose(dx, seq_shard(dx0, r, t) if sp else dx0, **TOL)
        np.testing.assert_allclose(dw, dw0, **TOL)
        np.testing.assert_allclose(db, db0, **TOL)


@settings(max_examples=20)
@given(t=st.sampled_from([1, 2, 3, 4]), sp=st.booleans(), parallel_in=st.booleans(),
       seed=st.integers(0, 999))
def test_row_parallel_linear_equals_linear(t, sp, parallel_in, seed):
    s, b, n_in, n_out = 2 * t, 3, 2 * t, 4
    parallel_in = parallel_in or sp
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((s, b, n_in)), rng.standard_normal((s, b, n_out))
    y0, dx0, dw0, db0 = reference_linear(x, dy, n_in, n_out)

    def program(ctx, g):
        r = ctx.rank
        grads = SequenceParallelGrads(g)
        lin = RowParallelLinear("lin", n_in, n_out, g, input_is_parallel=parallel_in,
                                sequence_parallel=sp, seed=5, sp_grads=grads)
        lin.bias.set_data(np.linspace(-1, 1, n_out))
        (y, _), saved = lin.forward(np.split(x, t, axis=-1)[r] if parallel_in else x)
        dx = lin.backward(seq_shard(dy, r, t) if sp else dy, saved)
        grads.flush()  # under SP the bias gradient is a partial sum until this all-reduce
        return y, dx, gather_parameter(lin.weight, g, grad=True), lin.bias.grad

    for r, (y, dx, dw, db) in enumerate(run_tp(program, t)):
        np.testing.assert_allclose(y, seq_shard(y0, r, t) if sp else y0, **TOL)
        np.testing.assert_allclose(dx, np.split(dx0, t, axis=-1)[r] if parallel_in else dx0,
                                   **TOL)
        np.testing.assert_allclose(dw, dw0, **TOL)
        np.testing.assert_allclose(db, db0, **TOL)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_vocab_parallel_embedding_masks_other_ranks_ids_then_reduces(t):
    V, h, s, b = 8, 3, 4, 2
    ids = np.array([[0, 7], [3, 4], [7, 7], [1, 6]])  # every rank's range, repeats
    dy = np.random.default_rng(0).standard_normal((s, b, h))
    with mp.device():
        emb = Embedding("wte", V, h, seed=2)
        y0, saved = emb.forward(ids)
        emb.backward(dy, saved)
        dw0 = emb.weight.grad

    def program(ctx, g):
        emb = VocabParallelEmbedding("wte", V, h, g, seed=2)
        assert (emb.lo, emb.hi) == (ctx.rank * V // t, (ctx.rank + 1) * V // t)
        y, saved = emb.forward(ids)
        emb.backward(dy, saved)
        return y, gather_parameter(emb.weight, g, grad=True), emb.weight.grad

    for r, (y, dw, local) in enumerate(run_tp(program, t)):
        np.testing.assert_allclose(y, y0, **TOL)
        np.testing.assert_allclose(dw, dw0, **TOL)
        np.testing.assert_array_equal(local, dw0[r * V // t:(r + 1) * V // t])


@settings(max_examples=15)
@given(t=st.sampled_from([1, 2, 3, 4]), seed=st.integers(0, 999), ignore=st.booleans())
def test_vocab_parallel_cross_entropy_equals_cross_entropy(t, seed, ignore):
    s, b, V = 3, 2, 6 * t
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((s, b, V)) * 3
    targets = rng.integers(0, V, (s, b))
    if ignore:
        targets[0, 1] = -100
    with mp.device():
        loss0, saved = cross_entropy_forward(logits, targets)
        dl0 = cross_entropy_backward(0.7, saved)

    def program(ctx, g):
        loss, saved = vocab_parallel_cross_entropy(np.split(logits, t, axis=-1)[ctx.rank],
                                                   targets, g)
        return loss, vocab_parallel_cross_entropy_backward(0.7, saved)

    for r, (loss, dl) in enumerate(run_tp(program, t)):
        np.testing.assert_allclose(loss, loss0, rtol=1e-13)
        np.testing.assert_allclose(dl, np.split(dl0, t, axis=-1)[r], **TOL)


def test_the_loss_takes_three_small_all_reduces_and_no_rank_holds_full_logits():
    """Max, target logit, sum of exponentials: three all-reduces of [s, b], and the only
    logits anywhere are each rank's [s, b, V/t] shard — in the forward, the saved tensors,
    the collectives and the backward."""
    t, s, b = 4, 4, 2
    cfg = GPTConfig(vocab_size=256, seq_len=s, hidden=8, num_heads=4, num_layers=1)

    def program(ctx, g):
        model = TensorParallelGPT(cfg, g)
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (s, b))
        loss, cache = model.forward(ids, ids)
        logits_saved = cache.head.loss.logits.shape
        model.backward(cache)
        biggest = max(e.nbytes for e in ctx.trace.of(stream="comm"))
        peak = ctx.ledger.peak("activations")
        before = len(ctx.trace.events)  # the loss alone, on a logits shard
        vocab_parallel_cross_entropy(np.zeros((s, b, cfg.vocab_size // t)), ids, g)
        ce = [(e.name, e.nbytes, e.meta.get("where", "")) for e in ctx.trace.events[before:]
              if e.stream == "comm"]
        return ce, logits_saved, biggest, peak

    full_logits = s * b * cfg.vocab_size * 8
    for ce, logits_saved, biggest, peak in run_tp(program, t):
        assert [(name, n) for name, n, _ in ce] == [("all_reduce", s * b * 8)] * 3
        assert logits_saved == (s, b, cfg.vocab_size // t)
        assert biggest < full_logits / t  # no collective moves even a shard of logits
        assert peak < full_logits  # nor does any rank's saved memory hold them whole


def test_unsplittable_configurations_name_the_fix():
    cfg = GPTConfig(vocab_size=30, seq_len=6, hidden=12, num_heads=3, ffn_hidden=20)
    with pytest.raises(ValueError, match=r"num_heads = 3 cannot be split across tensor-"
                                         r"parallel size 2.*whole attention heads"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match=r"ffn_hidden = 20 .* size 3"):
        check_tensor_parallel(cfg, 3)
    with pytest.raises(ValueError, match=r"vocab_size = 30 .* size 4.*vocab_size=32 "
                                         r"\(padded_vocab_size\)"):
        check_tensor_parallel(cfg.with_(num_heads=4, ffn_hidden=24), 4)
    with pytest.raises(ValueError, match=r"seq_len = 6 .* size 4.*sequence parallelism"):
        check_tensor_parallel(cfg.with_(num_heads=4, ffn_hidden=24, vocab_size=32), 4,
                              sequence_parallel=True)
    assert padded_vocab_size(30, 4) == 32 and padded_vocab_size(50257, 8, 128) == 51200
    with pytest.raises(mp.RankFailedError, match=r"out_features = 10 .* size 4"):
        mp.launch(lambda ctx: ColumnParallelLinear("c", 4, 10, mp.new_group(range(4))), 4)
    with pytest.raises(mp.RankFailedError, match=r"pass sp_grads=SequenceParallelGrads"):
        mp.launch(lambda ctx: RowParallelLinear("r", 4, 4, mp.new_group(range(2)),
                                                sequence_parallel=True), 2)


def test_saved_is_released_by_every_backward():
    """The layers give back every saved byte: activations return to zero after backward."""
    def program(ctx, g):
        col = ColumnParallelLinear("c", 4, 8, g, sequence_parallel=True)
        grads = SequenceParallelGrads(g)
        row = RowParallelLinear("r", 8, 4, g, sequence_parallel=True, sp_grads=grads)
        x = np.ones((2, 1, 4))
        (u, _), s1 = col.forward(x)
        (y, _), s2 = row.forward(u)
        held = ctx.ledger.held("activations")
        col.backward(row.backward(np.ones_like(y), s2), s1)
        grads.flush()
        assert isinstance(s1, Saved) and s1.released and s2.released
        return held, ctx.ledger.held("activations")

    for held, after in run_tp(program, 2):
        # column keeps x_r [s/t=2, 1, 4] (not the gathered [4, 1, 4]); row keeps u [4, 1, 8/t]
        assert held == (2 * 1 * 4 + 4 * 1 * 4) * 8 and after == 0
