"""Checkpoint segments (GPTConfig(recompute="segments", recompute_segment=k)): the same
losses and gradients as keeping everything, for every k; k = 1 is full recomputation, bit
for bit and byte for byte; the ledger's activation peak is the formula of plan/memory.py;
the hooks let a sharded engine gather a segment's blocks before its rerun."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.nn.hooks import EVENTS, ROOT, block_unit
from minipar.nn.segments import segment_ranges
from minipar.plan import (activation_bytes_per_layer, best_segment, segment_sizes,
                          segments_activation_bytes, sqrt_rule)
from minipar.plan.training_memory import training_memory


def batch(cfg, b=3, seed=3):
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (cfg.seq_len, b))
    return ids, np.roll(ids, -1, axis=0)


def train_steps(cfg, steps=2, hooks=False):
    """`steps` loss_and_grad calls drawing from the model's own generator: the losses, each
    step's gradients, the activation peak, FLOPs charged, and the hook events seen."""
    with mp.device() as ctx:
        model = GPT(cfg)
        seen = []
        if hooks:
            for e in EVENTS:
                model.hooks.register(e, lambda unit, e=e: seen.append((e, unit)))
        ctx.ledger.reset_peak()
        losses, grads = [], []
        for step in range(steps):
            losses.append(model.loss_and_grad(*batch(cfg, seed=step)))
            grads.append({n: p.grad.copy() for n, p in model.named_parameters().items()})
            model.zero_grad()
        assert ctx.ledger.held("activations") == 0  # every record given back
        flops = sum(e.flops for e in ctx.trace.events)
        return losses, grads, ctx.ledger.peak("activations"), flops, seen


def assert_same(a, b):
    assert a[0] == b[0]  # losses, exactly
    for ga, gb in zip(a[1], b[1]):
        assert list(ga) == list(gb)
        for name in ga:
            np.testing.assert_array_equal(ga[name], gb[name], err_msg=name)


# ---- what is computed -------------------------------------------------------------------
@settings(max_examples=20)
@given(layers=st.integers(1, 4), data=st.data(), dropout=st.sampled_from([0.0, 0.2]),
       tie=st.booleans(), heads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_every_segment_size_trains_like_keeping_everything(layers, data, dropout, tie, heads,
                                                           seed):
    """float64, two steps (fresh masks each): losses and gradients equal recompute="none"'s
    bit for bit, for k = 1 .. L + 1 (k > L: one segment of all the blocks)."""
    k = data.draw(st.integers(1, layers + 1), "k")
    cfg = GPTConfig(vocab_size=11, seq_len=5, hidden=4 * heads, num_heads=heads,
                    num_layers=layers, dropout=dropout, tie_embeddings=tie, seed=seed)
    assert_same(train_steps(cfg.with_(recompute="segments", recompute_segment=k)),
                train_steps(cfg))


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_segments_of_one_block_are_full_recomputation(dtype):
    """k = 1 and recompute="full": the same losses and gradients, the same activation peak
    and FLOPs, and the same hooks once the two rerun events are left out."""
    cfg = GPTConfig(num_layers=3, dropout=0.2, dtype=dtype)
    full = train_steps(cfg.with_(recompute="full"), hooks=True)
    seg = train_steps(cfg.with_(recompute="segments", recompute_segment=1), hooks=True)
    assert_same(seg, full)
    assert seg[2] == full[2] and seg[3] == full[3]
    assert [e for e in seg[4] if not e[0].startswith("recompute")] == full[4]


def test_the_flops_are_full_recomputations_whatever_k():
    cfg = GPTConfig(num_layers=4)
    flops = {k: train_steps(cfg.with_(recompute="segments", recompute_segment=k), 1)[3]
             for k in (1, 2, 3, 5)}
    assert len(set(flops.values())) == 1
    assert flops[1] == train_steps(cfg.with_(recompute="full"), 1)[3]


def test_segments_count_from_the_first_block_of_the_range_the_last_shorter():
    assert segment_ranges(0, 5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert segment_ranges(3, 8, 3) == [(3, 6), (6, 8)]
    assert segment_ranges(0, 3, 7) == [(0, 3)] and segment_ranges(2, 2, 2) == []
    assert segment_sizes(5, 2) == [2, 2, 1] and segment_sizes(3, 7) == [3]
    cfg = GPTConfig(num_layers=5, recompute="segments", recompute_segment=2, dropout=0.1)
    with mp.device():
        model = GPT(cfg)
        x = np.random.default_rng(0).standard_normal((cfg.seq_len, 2, cfg.hidden))
        _, saved = model.blocks_forward(x, np.random.default_rng(1), 1, 5)
        assert [(r.lo, r.hi) for r in saved] == [(1, 3), (3, 5)]
        assert saved[0].x is x  # a segment keeps its input itself, no copy
        model.blocks_backward(np.ones_like(x), saved, 1, 5)


def test_the_hooks_of_a_segment():
    """Forward: around each block. Backward of segment a..b-1: backward_pre of its last
    block, then every block rerun between recompute_pre/post, then the backwards."""
    cfg = GPTConfig(num_layers=3, recompute="segments", recompute_segment=2)
    seen = train_steps(cfg, 1, hooks=True)[4]
    u = block_unit
    back = [("backward_pre", u(2)), ("recompute_pre", u(2)), ("recompute_post", u(2)),
            ("backward_post", u(2)),
            ("backward_pre", u(1)), ("recompute_pre", u(0)), ("recompute_post", u(0)),
            ("recompute_pre", u(1)), ("recompute_post", u(1)), ("backward_post", u(1)),
            ("backward_pre", u(0)), ("backward_post", u(0))]
    assert seen == ([("forward_pre", ROOT)]
                    + [(e, u(i)) for i in range(3) for e in ("forward_pre", "forward_post")]
                    + [("forward_post", ROOT), ("backward_pre", ROOT)] + back
                    + [("backward_post", ROOT)])


# ---- how much is held: the ledger against the formula --------------------------------
def blocks_peak(cfg, s, b):
    """The ledger's activation peak over blocks_forward and blocks_backward alone."""
    with mp.device() as ctx:
        model = GPT(cfg)
        x = np.random.default_rng(0).standard_normal((s, b, cfg.hidden)).astype(cfg.np_dtype)
        ctx.ledger.reset_peak()
        y, saved = model.blocks_forward(x, np.random.default_rng(1))
        model.blocks_backward(np.ones_like(y), saved)
        assert ctx.ledger.held("activations") == 0
        return ctx.ledger.peak("activations")


@pytest.mark.parametrize("layers", [1, 4, 5, 7])
def test_the_activation_peak_is_the_inputs_below_plus_one_segment_rerun(layers):
    """bf16, dropout on (Korthikanti's A = sbh(34 + 5as/h), I = 2sbh): the blocks' peak is
    max over segments m of m I + k_m A, to the byte, for k = 1 .. L + 1."""
    s, b, h, a = 8, 2, 16, 2
    cfg = GPTConfig(vocab_size=17, seq_len=s, hidden=h, num_heads=a, num_layers=layers,
                    dropout=0.1, dtype="bfloat16", recompute="segments")
    A = activation_bytes_per_layer(s, b, h, a, "none")
    I = activation_bytes_per_layer(s, b, h, a, "full")
    assert (A, I) == (s * b * h * (34 + 5 * a * s / h), 2 * s * b * h)
    for k in range(1, layers + 2):
        got = blocks_peak(cfg.with_(recompute_segment=k), s, b)
        n = -(-layers // k)  # segments, the last one shorter when k does not divide L
        last = layers - (n - 1) * k
        want = max((n - 1) * I + last * A, (n - 2) * I + k * A if n > 1 else 0)
        assert got == want == segments_activation_bytes(layers, k, A, I), k
        if layers % k == 0:
            assert got == (layers // k - 1) * I + k * A
    full = blocks_peak(cfg.with_(recompute="full"), s, b)
    assert full == blocks_peak(cfg.with_(recompute_segment=1), s, b) == (layers - 1) * I + A


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("layers, k", [(1, 1), (4, 1), (4, 2), (5, 2), (5, 3), (5, 6)])
def test_the_whole_steps_activation_peak_is_the_plans(dtype, layers, k):
    """The step's peak, embedding and head included (no dropout): training_memory's
    activations, the larger of the forward's end and the worst segment's backward."""
    cfg = GPTConfig(vocab_size=17, seq_len=8, hidden=16, num_heads=2, num_layers=layers,
                    dtype=dtype, recompute="segments", recompute_segment=k)
    peak = train_steps(cfg, 1)[2]
    args = (cfg.num_parameters(), 1, 3, 8, layers, 16, 2, 17, dtype)
    assert peak == training_memory(*args, "segments", k).activations
    if k == 1:
        assert peak == training_memory(*args, "full").activations


def test_the_best_segment_is_near_sqrt_of_l_i_over_a_not_sqrt_l():
    """Measured over k = 1 .. L on the ledger: the smallest peak is at k = 2 for 36 layers
    whose A is 17 I, where sqrt(L I / A) = 1.46 and sqrt(L) = 6; Chen et al.'s sqrt(L) is
    the rule's case A = I."""
    s, b, h, a, L = 4, 1, 8, 2, 36
    cfg = GPTConfig(vocab_size=9, seq_len=s, hidden=h, num_heads=a, num_layers=L,
                    dtype="bfloat16", recompute="segments")
    A = activation_bytes_per_layer(s, b, h, a, "none", dropout=False)
    I = activation_bytes_per_layer(s, b, h, a, "full", dropout=False)
    assert A == 17 * I
    peaks = {k: blocks_peak(cfg.with_(recompute_segment=k), s, b) for k in range(1, L + 1)}
    measured = min(peaks, key=lambda k: (peaks[k], k))
    assert measured == best_segment(L, A, I) == 2
    assert abs(measured - sqrt_rule(L, A, I)) < 1 and peaks[6] > peaks[1]
    # A = I: the smallest peak is at k = sqrt(L) (k = 5 ties: 8 segments, the last of one)
    chain = {k: segments_activation_bytes(L, k, 1.0, 1.0) for k in range(1, L + 1)}
    assert sqrt_rule(L, 1.0, 1.0) == 6 and chain[6] == min(chain.values()) == 11
    assert abs(best_segment(L, 1.0, 1.0) - 6) <= 1


# ---- the configuration ----------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    (dict(recompute="segments", recompute_segment=0), "recompute_segment must be a positive"),
    (dict(recompute="segments", recompute_segment=1.5), "recompute_segment must be a positive"),
    (dict(recompute="segments", recompute_segment=True), "recompute_segment must be a positive"),
    (dict(recompute="full", recompute_segment=2), "recompute_segment=2 sizes checkpoint"),
    (dict(recompute_segment=3), r"recompute='none' makes none; set recompute='segments'"),
])
def test_segment_sizes_are_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**bad)


def test_the_blocks_of_a_segmented_model_keep_everything_themselves():
    cfg = GPTConfig(num_layers=2, recompute="segments", recompute_segment=2)
    assert cfg.layer_recompute == "none" and GPTConfig(recompute="full").layer_recompute == "full"
    with mp.device():
        assert [blk.recompute for blk in GPT(cfg).blocks] == ["none", "none"]
