"""A GPT made of parts: the parameter order is pinned, the steps compose to the forward and
backward (bit for bit, hooks in the same order), and a block takes a substitute MLP."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import (GPT, ROOT, Block, GPTConfig, Module, Parameter, Saved, block_unit,
                        dense_parts)
from minipar.nn.gradcheck import gradcheck
from minipar.nn.hooks import EVENTS
from minipar.nn.module import parameters_of
from minipar.nn.saved import release_all
from minipar.optim import SGD

BLOCK = ["ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
         "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
         "mlp.fc2.weight", "mlp.fc2.bias"]


def gpt_order(num_layers, tied):
    """GPT's parameter names in the order flat buffers, buckets and checkpoints use."""
    blocks = [f"blocks.{i}.{n}" for i in range(num_layers) for n in BLOCK]
    head = [] if tied else ["lm_head.weight"]
    return ["wte.weight", "wpe.weight"] + blocks + ["ln_f.weight", "ln_f.bias"] + head


def batch(cfg, s, b, seed=0):
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (s, b))
    return ids, np.roll(ids, -1, axis=0)


def record_hooks(model):
    seen = []
    for event in EVENTS:
        model.hooks.register(event, lambda unit, e=event: seen.append((e, unit)))
    return seen


# ---- the parameter order -------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_parameter_order_is_pinned(tied):
    with mp.device():
        model = GPT(GPTConfig(num_layers=3, tie_embeddings=tied))
        assert [p.name for p in model.parameters()] == gpt_order(3, tied)
        assert list(model.named_parameters()) == gpt_order(3, tied)
        units = model.units()
        assert [u for u, _ in units] == [ROOT, "blocks.0", "blocks.1", "blocks.2"]
        assert [p.name for p in units[0][1]] == (
            ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
            + ([] if tied else ["lm_head.weight"]))
        for i, (_, ps) in enumerate(units[1:]):
            assert [p.name for p in ps] == [f"blocks.{i}.{n}" for n in BLOCK]
        # a tied head adds no parameter: the head multiplies by wte's weight
        assert model.lm_head is None if tied else model.lm_head.weight in model.parameters()


def test_block_unit_names_the_parameters_prefix():
    with mp.device():
        model = GPT(GPTConfig(num_layers=2))
        for i, blk in enumerate(model.blocks):
            assert blk.name == block_unit(i) == f"blocks.{i}"
            assert all(p.name.startswith(block_unit(i) + ".") for p in blk.parameters())


def test_module_lists_each_parameter_once_in_parameter_order():
    with mp.device():
        a, b, c = (Parameter(n, np.zeros(2)) for n in "abc")

        class Pair(Module):
            parameter_order = ("second", "first", "missing", "many")

            def __init__(self):
                self.first, self.second, self.missing, self.many = a, b, None, [c, a]

        pair = Pair()
        assert pair.parameters() == [b, a, c]  # a, reached again through `many`, once
        assert pair.num_parameters() == 6
        a.accumulate(np.ones(2))
        pair.zero_grad()
        assert a.grad is None
        with pytest.raises(TypeError, match="neither a Parameter nor a part with parameters"):
            parameters_of(object())


# ---- the steps compose ----------------------------------------------------------------
def documented_order(num_layers):
    """root forward_pre first, blocks.i around each block, root backward_post last."""
    blocks = [block_unit(i) for i in range(num_layers)]
    return ([("forward_pre", ROOT)]
            + [(e, u) for u in blocks for e in ("forward_pre", "forward_post")]
            + [("forward_post", ROOT), ("backward_pre", ROOT)]
            + [(e, u) for u in reversed(blocks) for e in ("backward_pre", "backward_post")]
            + [("backward_post", ROOT)])


def whole_and_by_steps(by_steps, model, ids, tgt, seed, k):
    """(loss, grads, hooks) of loss_and_grad, then of the steps, on the same weights."""
    runs = []
    for steps in (False, True):
        seen = record_hooks(model)
        rng = np.random.default_rng(seed)
        loss = (by_steps(model, ids, tgt, rng, k) if steps
                else model.loss_and_grad(ids, tgt, rng))
        runs.append((loss, {p.name: p.grad.copy() for p in model.parameters()}, seen))
        model.zero_grad()
        model.hooks.clear()
    return runs


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_steps_compose_to_forward_and_backward(gpt_steps, k, recompute):
    """Blocks 0..k then k..4 (k = 0, 4: one range empty) equal the whole forward, dropout
    on: the same loss, gradients and hooks, bit for bit; every activation given back."""
    with mp.device() as ctx:
        cfg = GPTConfig(vocab_size=11, seq_len=6, hidden=8, num_heads=2, num_layers=4,
                        tie_embeddings=k % 2 == 1, dropout=0.2, recompute=recompute, seed=k)
        model = GPT(cfg)
        ids, tgt = batch(cfg, 5, 2, k)
        (loss, grads, seen), (s_loss, s_grads, s_seen) = whole_and_by_steps(
            gpt_steps, model, ids, tgt, 3, k)
        assert s_loss == loss
        assert list(s_grads) == list(grads) == gpt_order(4, cfg.tie_embeddings)
        for name, g in grads.items():
            np.testing.assert_array_equal(s_grads[name], g, err_msg=name)
        assert seen == s_seen == documented_order(4)
        assert ctx.ledger.held("activations") == 0


def test_the_forward_cache_is_a_record_of_the_steps():
    with mp.device() as ctx:
        cfg = GPTConfig(num_layers=2, dropout=0.1)
        loss, cache = GPT(cfg).forward(*batch(cfg, 8, 2), np.random.default_rng(0))
        assert len(cache.blocks) == 2 and cache.embed.dropout.mask.shape == (8, 2, cfg.hidden)
        assert cache.head.loss.logits.shape == (8, 2, cfg.vocab_size)
        release_all(cache)
        assert ctx.ledger.held("activations") == 0


def test_blocks_backward_refuses_another_range():
    with mp.device():
        cfg = GPTConfig(num_layers=3)
        model = GPT(cfg)
        ids, _ = batch(cfg, 4, 1)
        x, s_embed = model.embed_forward(ids, np.random.default_rng(0))
        y, saved = model.blocks_forward(x, None, 0, 2)
        with pytest.raises(ValueError, match=r"blocks 1\.\.2 needs the 2 records .* got 1"):
            model.blocks_backward(np.ones_like(y), saved[1:], 1, 3)
        with pytest.raises(ValueError, match=r"blocks 2\.\.5 are not a range .* 3 blocks"):
            model.blocks_forward(x, None, 2, 5)


# ---- a block built around another MLP ---------------------------------------------------
class Gate(Module):
    """y = x * w with a learned [h] gate: a one-parameter stand-in for the MLP."""

    parameter_order = ("w",)

    def __init__(self, name, hidden):
        self.name = name
        self.w = Parameter(f"{name}.w", np.linspace(0.5, 1.5, hidden))

    def forward(self, x, rng=None):
        return x * self.w.data, Saved(self.name, x=x)  # y: [s, b, h]

    def backward(self, dy, saved):
        self.w.accumulate((dy * saved.x).sum(axis=(0, 1)))
        saved.release()
        return dy * self.w.data


def test_a_block_built_with_a_substitute_mlp_has_exact_gradients():
    with mp.device():
        cfg = GPTConfig(vocab_size=7, seq_len=4, hidden=4, num_heads=2, num_layers=1,
                        init_std=0.5)
        block = Block("blk", cfg, dense_parts("blk", cfg, mlp=Gate("blk.mlp", 4)))
        assert [p.name for p in block.parameters()] == [f"blk.{n}" for n in BLOCK[:8]] + [
            "blk.mlp.w"]
        x = np.random.default_rng(0).standard_normal((3, 2, 4))
        r = np.random.default_rng(1).standard_normal((3, 2, 4))

        def f():
            y, saved = block.forward(x, np.random.default_rng(0))
            release_all(saved)
            return np.sum(y * r)

        y, saved = block.forward(x, np.random.default_rng(0))
        dx = block.backward(r, saved)
        params = block.named_parameters()
        gradcheck(f, {"x": x, **{n: p.data for n, p in params.items()}},
                  {"x": dx, **{n: p.grad for n, p in params.items()}}, rtol=1e-5, atol=1e-8)


def test_a_gpt_with_a_substitute_mlp_trains():
    with mp.device():
        cfg = GPTConfig(vocab_size=13, seq_len=8, hidden=8, num_heads=2, num_layers=2)
        model = GPT(cfg, mlp_factory=lambda i: Gate(f"{block_unit(i)}.mlp", cfg.hidden))
        names = [p.name for p in model.parameters()]
        assert names[names.index("blocks.0.ln2.bias") + 1] == "blocks.0.mlp.w"
        assert "blocks.0.mlp.fc1.weight" not in names
        gate = model.blocks[1].mlp.w
        start = gate.data.copy()
        opt = SGD(model.parameters(), lr=0.5)
        ids, tgt = batch(cfg, 8, 4)
        losses = []
        for _ in range(30):
            losses.append(model.loss_and_grad(ids, tgt))
            opt.step()
            model.zero_grad()
        assert losses[-1] < 0.5 * losses[0]
        assert not np.array_equal(gate.data, start)  # the gate learned too
