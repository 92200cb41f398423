"""The GPT: gradients, activation memory to the byte, FLOPs to the formula, recomputation."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.nn.config import GPTConfig
from minipar.nn.gpt import GPT
from minipar.nn.gradcheck import gradcheck
from minipar.nn.saved import release_all, saved_nbytes
from minipar.plan import (activation_bytes_per_layer, model_flops, model_flops_full_recompute,
                          selective_recompute_extra_flops)


def batch(cfg, s, b, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (s, b))
    return ids, np.roll(ids, -1, axis=0)


def loss_fn(model, ids, tgt, seed):
    def f():
        loss, cache = model.forward(ids, tgt, np.random.default_rng(seed))
        _release(cache)
        return loss
    return f


_release = release_all
saved_bytes = saved_nbytes


# ---- configuration --------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    (dict(hidden=30, num_heads=4), "num_heads=4 must divide hidden=30"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (dict(recompute="some"), "recompute must be one of"),
    (dict(dtype="float8"), "unknown dtype"),
])
def test_bad_configs_are_refused_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**bad)


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_matches_the_config(tie):
    with mp.device():
        cfg = GPTConfig(vocab_size=23, seq_len=7, hidden=12, num_heads=3, num_layers=2,
                        tie_embeddings=tie)
        model = GPT(cfg)
        assert model.num_parameters() == cfg.num_parameters()
        assert mp.current().ledger.held("parameters") == cfg.num_parameters() * 8


def test_initialisation_depends_on_seed_and_name_only():
    cfg = GPTConfig(num_layers=2)
    models = []
    for c in (cfg, cfg, cfg.with_(seed=1)):
        with mp.device():  # each model on its own device: names are unique per ledger
            models.append(GPT(c))
    a, b, c = models
    if True:
        for p, q, r in zip(a.parameters(), b.parameters(), c.parameters()):
            np.testing.assert_array_equal(p.data, q.data)
            if p.data.std() > 0:
                assert not np.array_equal(p.data, r.data)


def test_blocks_held_builds_those_blocks_with_the_full_models_weights():
    cfg = GPTConfig(num_layers=4)
    with mp.device():
        full = GPT(cfg)
    with mp.device():
        part = GPT(cfg, blocks_held={1, 2})
    assert [type(b).__name__ for b in part.blocks] == ["RemoteBlock", "Block", "Block",
                                                       "RemoteBlock"]
    assert part.blocks[3].name == "blocks.3" and part.blocks[3].parameters() == []
    want = {p.name: p.data for p in full.parameters()}
    names = [p.name for p in part.parameters()]
    assert not any(n.startswith(("blocks.0.", "blocks.3.")) for n in names)
    assert sum(n.startswith("blocks.1.") for n in names) > 0
    for p in part.parameters():
        np.testing.assert_array_equal(p.data, want[p.name])
    with pytest.raises(RuntimeError, match="blocks.0 is held by another pipeline rank"):
        part.blocks_forward(np.zeros((cfg.seq_len, 1, cfg.hidden)), None, 0, 1)
    with pytest.raises(ValueError, match=r"blocks_held=\[3, 4\] names blocks outside"):
        GPT(cfg, blocks_held={3, 4})


# ---- gradients ------------------------------------------------------------------------
@pytest.mark.timeout(120)
@settings(max_examples=6)
@given(tie=st.booleans(), dropout=st.sampled_from([0.0, 0.3]), gelu=st.sampled_from(["tanh", "none"]),
       recompute=st.sampled_from(["none", "selective", "full"]), seed=st.integers(0, 100))
def test_gpt_gradients_match_finite_differences(tie, dropout, gelu, recompute, seed):
    with mp.device():
        cfg = GPTConfig(vocab_size=7, seq_len=4, hidden=4, num_heads=2, num_layers=2,
                        dropout=dropout, gelu=gelu, tie_embeddings=tie, recompute=recompute,
                        init_std=0.5, seed=seed)
        model = GPT(cfg)
        ids, tgt = batch(cfg, 3, 2, seed)
        model.loss_and_grad(ids, tgt, np.random.default_rng(seed))
        params = model.named_parameters()
        analytic = {n: p.grad for n, p in params.items()}
        f = loss_fn(model, ids, tgt, seed)
        gradcheck(lambda: f(), {n: p.data for n, p in params.items()}, analytic,
                  rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_gives_identical_gradients(recompute):
    grads = {}
    for mode in ("none", recompute):
        with mp.device():
            cfg = GPTConfig(num_layers=2, dropout=0.2, recompute=mode)
            model = GPT(cfg)
            ids, tgt = batch(cfg, 8, 3)
            loss = model.loss_and_grad(ids, tgt, np.random.default_rng(7))
            grads[mode] = (loss, {n: p.grad.copy() for n, p in model.named_parameters().items()})
    assert grads["none"][0] == grads[recompute][0]
    for n, g in grads["none"][1].items():
        np.testing.assert_array_equal(g, grads[recompute][1][n], err_msg=n)


# ---- activation memory to the byte ---------------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("s, b, h, a", [(8, 2, 16, 2), (16, 3, 32, 4), (5, 1, 12, 3)])
def test_activation_bytes_per_layer_equal_korthikanti(recompute, s, b, h, a):
    """bf16 activations, dropout on: each block saves sbh(34 + 5as/h) bytes (no
    recomputation), 34 sbh (selective), 2 sbh (full) - measured on the ledger."""
    with mp.device() as ctx:
        cfg = GPTConfig(vocab_size=17, seq_len=s, hidden=h, num_heads=a, num_layers=3,
                        dropout=0.1, dtype="bfloat16", recompute=recompute)
        model = GPT(cfg)
        ids, tgt = batch(cfg, s, b)
        loss, cache = model.forward(ids, tgt, np.random.default_rng(0))
        s_blocks = cache.blocks
        expected = activation_bytes_per_layer(s, b, h, a, recompute)
        if recompute == "none":
            assert expected == s * b * h * (34 + 5 * a * s / h)
        for sb in s_blocks:
            assert saved_bytes(sb) == expected
        assert ctx.ledger.held("activations") == saved_bytes(cache)  # ledger = what is held
        model.backward(cache)
        assert ctx.ledger.held("activations") == 0


@pytest.mark.parametrize("dtype, act_bytes", [("bfloat16", 2), ("float32", 4), ("float64", 8)])
def test_activation_bytes_without_dropout_and_in_wider_dtypes(dtype, act_bytes):
    """No dropout: no masks, the softmax output saved once (32 sbh + 2 a s^2 b in 16-bit);
    wider dtypes scale the 2-byte terms."""
    s, b, h, a = 8, 2, 16, 4
    for p in (0.0, 0.1):
        with mp.device():
            cfg = GPTConfig(vocab_size=11, seq_len=s, hidden=h, num_heads=a, num_layers=1,
                            dropout=p, dtype=dtype)
            loss, cache = GPT(cfg).forward(*batch(cfg, s, b), np.random.default_rng(0))
            expected = activation_bytes_per_layer(s, b, h, a, "none", act_bytes, p > 0)
            assert saved_bytes(cache.blocks[0]) == expected
    assert activation_bytes_per_layer(s, b, h, a, dropout=False) == 32 * s * b * h + 2 * a * s * s * b


def test_recomputation_lowers_the_activation_peak():
    peaks = {}
    for mode in ("none", "selective", "full"):
        with mp.device() as ctx:
            cfg = GPTConfig(vocab_size=17, seq_len=16, hidden=16, num_heads=4, num_layers=4,
                            dropout=0.1, dtype="bfloat16", recompute=mode)
            model = GPT(cfg)
            ids, tgt = batch(cfg, 16, 2)
            model.loss_and_grad(ids, tgt, np.random.default_rng(0))
            peaks[mode] = ctx.ledger.peak("activations")
    assert peaks["full"] < peaks["selective"] < peaks["none"]


# ---- FLOPs to the formula --------------------------------------------------------------
def step_flops(cfg, s, b) -> float:
    with mp.device() as ctx:
        model = GPT(cfg)
        ids, tgt = batch(cfg, s, b)
        model.loss_and_grad(ids, tgt, np.random.default_rng(0))
        return sum(e.flops for e in ctx.trace.of("compute"))


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("s, b, h, a, l, V", [(8, 2, 16, 2, 2, 29), (6, 3, 24, 4, 1, 50)])
def test_clock_flops_equal_narayanan(tie, s, b, h, a, l, V):
    cfg = GPTConfig(vocab_size=V, seq_len=s, hidden=h, num_heads=a, num_layers=l,
                    tie_embeddings=tie)
    assert step_flops(cfg, s, b) == pytest.approx(model_flops(b, s, l, h, V), rel=1e-12)
    full = cfg.with_(recompute="full")
    assert step_flops(full, s, b) == pytest.approx(model_flops_full_recompute(b, s, l, h, V),
                                                   rel=1e-12)
    sel = cfg.with_(recompute="selective")
    assert step_flops(sel, s, b) == pytest.approx(
        model_flops(b, s, l, h, V) + selective_recompute_extra_flops(b, s, l, h), rel=1e-12)


def test_clock_time_is_flops_over_peak():
    with mp.device() as ctx:
        cfg = GPTConfig(vocab_size=29, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                        dtype="bfloat16")
        model = GPT(cfg)
        ids, tgt = batch(cfg, 8, 2)
        model.loss_and_grad(ids, tgt)
        assert ctx.clock.now == pytest.approx(model_flops(2, 8, 2, 16, 29) / 989e12, rel=1e-9)


# ---- input validation ------------------------------------------------------------------
def test_bad_inputs_say_what_to_change():
    with mp.device():
        model = GPT(GPTConfig(vocab_size=10, seq_len=4))
        with pytest.raises(ValueError, match=r"sequence first"):
            model.forward(np.zeros(4, int), np.zeros(4, int))
        with pytest.raises(ValueError, match="exceeds the model's seq_len 4"):
            model.forward(np.zeros((5, 1), int), np.zeros((5, 1), int))
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 10\)"):
            model.forward(np.full((2, 1), 10), np.zeros((2, 1), int))


def test_hooks_fire_around_every_unit_in_order():
    with mp.device():
        cfg = GPTConfig(num_layers=2, tie_embeddings=True)
        model = GPT(cfg)
        seen = []
        for event in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
            model.hooks.register(event, lambda unit, e=event: seen.append((e, unit)))
        names = [u for u, _ in model.units()]
        assert names == ["root", "blocks.0", "blocks.1"]
        assert sum(len(ps) for _, ps in model.units()) == len(model.parameters())
        ids, tgt = batch(cfg, 4, 2)
        model.loss_and_grad(ids, tgt)
        assert seen == [
            ("forward_pre", "root"),
            ("forward_pre", "blocks.0"), ("forward_post", "blocks.0"),
            ("forward_pre", "blocks.1"), ("forward_post", "blocks.1"),
            ("forward_post", "root"),
            ("backward_pre", "root"),
            ("backward_pre", "blocks.1"), ("backward_post", "blocks.1"),
            ("backward_pre", "blocks.0"), ("backward_post", "blocks.0"),
            ("backward_post", "root"),
        ]


# ---- dropout across steps ------------------------------------------------------------------
def test_dropout_draws_fresh_masks_every_step_and_the_same_sequence_per_seed():
    """forward without a generator draws from the model's own, seeded once from cfg.seed:
    step 2's masks differ from step 1's (before, a fresh default_rng(seed) each call
    repeated them), and a second model of the same config draws the same sequence."""
    from minipar.optim import AdamW
    from minipar.parallel import DistributedDataParallel, accumulate_gradients
    cfg = GPTConfig(vocab_size=11, seq_len=6, hidden=8, num_heads=2, num_layers=1,
                    dropout=0.5)
    ids, tgt = batch(cfg, 6, 2)

    def masks(rng=None):
        with mp.device():
            model = GPT(cfg)
            out = []
            for _ in range(2):
                _, cache = model.forward(ids, tgt, rng)
                out.append(cache.embed.dropout.mask.copy())
                release_all(cache)
            return out

    first, again = masks(), masks()
    assert not np.array_equal(first[0], first[1])
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)
    # the draws are default_rng(seed)'s: one explicit generator gives the same masks
    for x, y in zip(first, masks(np.random.default_rng(cfg.seed))):
        np.testing.assert_array_equal(x, y)

    def program(ctx):  # through accumulate_gradients and an engine: losses differ by step
        model = GPT(cfg)
        engine = DistributedDataParallel(model, AdamW, lr=0.0)
        losses = [accumulate_gradients(model, engine, [(ids, tgt)]) for _ in range(2)]
        engine.zero_grad()
        return losses

    l1, l2 = mp.launch(program, 1)[0]
    assert l1 != l2  # lr 0: only the masks changed
