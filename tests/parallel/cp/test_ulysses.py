"""DeepSpeed-Ulysses against one device: forward and backward of both layouts equal nn's
core for cp in {1, 2, 4} (each rank runs that very core on a/cp heads, so they agree to the
last bit here), with attention dropout too when each rank draws its head slice of the
one-device mask; a head count cp does not divide is refused naming the cp that would do;
skipping the zigzag reorder fails."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.parallel.cp import (shard, ulysses, ulysses_attention_backward,
                                 ulysses_attention_forward)
from minipar.parallel.tp.random import SlicedDraw

FWD, BWD = ulysses_attention_forward, ulysses_attention_backward


@pytest.mark.timeout(120)
@settings(max_examples=25)
@given(layout=st.sampled_from(["contiguous", "zigzag"]), cp=st.sampled_from([1, 2, 4]),
       per_chunk=st.integers(1, 3), b=st.integers(1, 2), heads_per_rank=st.integers(1, 2),
       d=st.integers(1, 4), seed=st.integers(0, 999))
def test_ulysses_equals_one_device(cpkit, layout, cp, per_chunk, b, heads_per_rank, d, seed):
    s, heads = (2 if layout == "zigzag" else 1) * cp * per_chunk, cp * heads_per_rank
    qkv, dctx = cpkit.inputs(s, b, heads, d, seed)
    want_ctx, want_dqkv = cpkit.one_device(qkv, dctx, heads)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, heads, cp, layout)
    cpkit.assert_close(run.context, want_ctx, what="context")
    cpkit.assert_close(run.dqkv, want_dqkv, what="dqkv")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ulysses_with_dropout_equals_one_device_given_the_head_slice_of_its_mask(cpkit,
                                                                                  layout):
    """Rank j draws heads j·a/cp.. of the one-device draw over [b, a, s, s] (tp's
    SlicedDraw, cut along axis 1): the same mask as one device, so the same answer."""
    cp, heads, p, seed = 2, 4, 0.3, 7
    qkv, dctx = cpkit.inputs(8, 2, heads, 3, 3)
    want_ctx, want_dqkv = cpkit.one_device(qkv, dctx, heads, p, np.random.default_rng(seed))
    kw = lambda ctx: {"p": p, "rng": SlicedDraw(np.random.default_rng(seed),  # noqa: E731
                                                {1: (ctx.rank, cp)})}
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, heads, cp, layout, forward_kw=kw)
    cpkit.assert_close(run.context, want_ctx)
    cpkit.assert_close(run.dqkv, want_dqkv)


@pytest.mark.timeout(60)
def test_zigzag_without_the_reorder_differs(cpkit, monkeypatch):
    """The planted error: the core run on the tokens in the ranks' order, not the
    sequence's: its causal mask then masks the wrong keys."""
    qkv, dctx = cpkit.inputs(8, 1, 2, 3, 4)
    want_ctx, _ = cpkit.one_device(qkv, dctx, 2)
    monkeypatch.setattr(ulysses, "_order", lambda layout, cp, s: None)
    run = cpkit.run_cp(FWD, BWD, qkv, dctx, 2, 2, "zigzag")
    assert not np.allclose(run.context, want_ctx, atol=1e-6)


@pytest.mark.timeout(60)
def test_a_head_count_cp_does_not_divide_is_refused():
    qkv = np.zeros((2, 1, 3 * 6 * 2))  # 6 heads of 2, s/cp = 2

    def attempt(ctx):
        try:
            FWD(qkv, 6, mp.new_group(range(4), "cp"))
        except ValueError as e:
            return str(e)
        return None

    for rank, message in enumerate(mp.launch(attempt, 4)):
        assert message.startswith(f"rank {rank}: ulysses_attention_forward on cp group")
        assert message.endswith("num_heads = 6 is not divisible by cp = 4: choose cp in "
                                "{1, 2, 3, 6} or use ring attention")


@pytest.mark.timeout(60)
def test_dropout_without_a_generator_is_refused(cpkit):
    qkv, _ = cpkit.inputs(4, 1, 2, 2, 0)

    def attempt(ctx):
        with pytest.raises(ValueError, match=r"rank \d: .* p = 0.1 and no rng"):
            FWD(shard(qkv, "contiguous", ctx.rank, 2), 2, mp.new_group([0, 1]), p=0.1)

    mp.launch(attempt, 2)
