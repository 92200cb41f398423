"""Sequence parallelism: the replicated parameters' gradient all-reduce is what keeps it
correct, and the dropout masks are the single-device masks, sliced."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel.tp.random import SlicedDraw, TensorParallelRNG
from minipar.parallel.tp.sequence import SequenceParallelGrads
from minipar.parallel.tp.gpt import TensorParallelGPT

CFG = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2, dropout=0.1,
                seed=4)


def batch(cfg, b=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)),
            rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)))


def single_device_grads(cfg, ids, tgt):
    with mp.device():
        model = GPT(cfg)
        loss = model.loss_and_grad(ids, tgt)
        return loss, {p.name: p.grad.copy() for p in model.parameters()}


def tp_grads(cfg, ids, tgt, t, sp):
    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"), sequence_parallel=sp)
        loss = model.loss_and_grad(ids, tgt)
        tagged = sorted(p.name for p in model.parameters()
                        if getattr(p, "sequence_parallel", False))
        return loss, model.full_parameters(grad=True), tagged

    return mp.launch(program, t)


def test_replicated_parameters_are_tagged_and_their_gradients_complete():
    ids, tgt = batch(CFG)
    loss0, g0 = single_device_grads(CFG, ids, tgt)
    for loss, grads, tagged in tp_grads(CFG, ids, tgt, 2, sp=True):
        assert tagged == sorted(
            [f"blocks.{i}.{ln}.{w}" for i in range(2) for ln in ("ln1", "ln2")
             for w in ("weight", "bias")]
            + [f"blocks.{i}.{lin}.bias" for i in range(2) for lin in ("attn.proj", "mlp.fc2")]
            + ["ln_f.weight", "ln_f.bias"])
        assert loss == pytest.approx(loss0, rel=1e-13)
        for name in tagged:
            np.testing.assert_allclose(grads[name], g0[name], rtol=1e-12, atol=1e-15)
    for _, _, tagged in tp_grads(CFG, ids, tgt, 2, sp=False):
        assert tagged == []  # without SP these gradients are complete on every rank


def test_without_the_layernorm_gradient_all_reduce_sequence_parallelism_is_wrong(monkeypatch):
    """The bug the course warns about: each rank keeps its own partial LayerNorm (and bias)
    gradient. The loss is still right, the gradients are not, and the replicas of one
    parameter differ between ranks: they would drift apart at the first step."""
    ids, tgt = batch(CFG)
    loss0, g0 = single_device_grads(CFG, ids, tgt)

    def flush_without_all_reduce(self):
        for param, g in self.pending:
            param.accumulate(g)
        self.pending.clear()

    monkeypatch.setattr(SequenceParallelGrads, "flush", flush_without_all_reduce)
    res = tp_grads(CFG, ids, tgt, 2, sp=True)
    for loss, grads, tagged in res:
        assert loss == pytest.approx(loss0, rel=1e-13)
        for name in tagged:
            assert not np.allclose(grads[name], g0[name], rtol=1e-6), name
        untouched = [n for n in g0 if n not in tagged]
        for name in untouched:  # the weights' gradients are still right
            np.testing.assert_allclose(grads[name], g0[name], rtol=1e-12, atol=1e-15)
    assert not np.allclose(res[0][1]["blocks.0.ln1.weight"], res[1][1]["blocks.0.ln1.weight"])
    # partial sums over each rank's half of the sequence add up to the true gradient
    np.testing.assert_allclose(res[0][1]["ln_f.weight"] + res[1][1]["ln_f.weight"],
                               g0["ln_f.weight"], rtol=1e-12)


def test_dropout_masks_replicated_identical_sharded_different_both_single_device():
    """Megatron's RNG rule, checked on the masks the model saved: residual-dropout masks
    without SP are identical on every tp rank; attention-dropout masks (split by head) and,
    with SP, residual masks (split by sequence) differ between ranks; and every mask is the
    slice of the single-device model's mask."""
    t = 2
    ids, tgt = batch(CFG)
    with mp.device():
        _, cache = GPT(CFG).forward(ids, tgt)
        ref = [(sb[1][1].s_drop.mask, sb[2].mask)  # (attn, residual 1)
               for sb in cache.blocks]
        ref_embed = cache.embed.dropout.mask

    def program(ctx, sp):
        model = TensorParallelGPT(CFG, mp.new_group(range(t), "tp"), sequence_parallel=sp)
        _, cache = model.forward(ids, tgt)
        return cache.embed.dropout.mask, [(sb[1][1].s_drop.mask, sb[2].mask)
                                          for sb in cache.blocks]

    for sp in (False, True):
        ranks = mp.launch(lambda ctx: program(ctx, sp), t)
        for r, (embed, blocks) in enumerate(ranks):
            heads = CFG.num_heads // t
            np.testing.assert_array_equal(
                embed, np.split(ref_embed, t, axis=0)[r] if sp else ref_embed)
            for (attn, resid), (attn0, resid0) in zip(blocks, ref):
                np.testing.assert_array_equal(attn, attn0[:, r * heads:(r + 1) * heads])
                np.testing.assert_array_equal(resid, np.split(resid0, t)[r] if sp else resid0)
        (e0, b0), (e1, b1) = ranks
        assert not np.array_equal(b0[0][0], b1[0][0])  # sharded: heads differ
        if sp:
            assert not np.array_equal(b0[0][1], b1[0][1])  # sharded: sequence halves differ
        else:
            np.testing.assert_array_equal(b0[0][1], b1[0][1])  # replicated: identical


def test_sliced_draws_skip_ahead_exactly():
    """SlicedDraw.random(local) == full draw [slice], and the generator ends where the full
    draw would have left it, for cuts on one or two axes."""
    full_shape = (4, 6, 3, 5)
    want = np.random.default_rng(9).random(full_shape)
    after = np.random.default_rng(9)
    after.random(full_shape)
    nxt = after.random(3)
    for tp in range(3):
        for dp in range(2):
            g = np.random.default_rng(9)
            got = TensorParallelRNG(g, tp, 3, (dp, 2)).sharded(axis=1, batch_axis=0).random(
                (2, 2, 3, 5))
            np.testing.assert_array_equal(got, want[2 * dp:2 * dp + 2, 2 * tp:2 * tp + 2])
            np.testing.assert_array_equal(g.random(3), nxt)
    g = np.random.default_rng(9)
    assert TensorParallelRNG(g, 1, 2).replicated(batch_axis=1) is g  # dp = 1: the generator
    with pytest.raises(TypeError, match="PCG64"):
        SlicedDraw(np.random.Generator(np.random.MT19937(0)), {0: (0, 2)})
