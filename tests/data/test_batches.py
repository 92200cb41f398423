"""Batches: determinism, [s, b] layout, exact splits, and the gradient-accumulation trap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minipar.data import (
    TokenStream,
    loss_scale_for_accumulation,
    split_data_parallel,
    split_microbatches,
    synthetic_tokens,
)


# --- synthetic tokens ---------------------------------------------------------------

def test_synthetic_tokens_deterministic_and_in_range():
    a = synthetic_tokens(1000, 17, seed=3)
    assert a.dtype == np.int64 and a.shape == (1000,)
    assert a.min() >= 0 and a.max() < 17
    assert np.array_equal(a, synthetic_tokens(1000, 17, seed=3))
    assert not np.array_equal(a, synthetic_tokens(1000, 17, seed=4))
    assert set(np.unique(a).tolist()) == set(range(17))     # all ids appear in 1000 draws
    assert synthetic_tokens(0, 5, seed=0).shape == (0,)


def test_synthetic_tokens_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        synthetic_tokens(10, 0, seed=0)
    with pytest.raises(ValueError, match="num_tokens"):
        synthetic_tokens(-1, 5, seed=0)
    with pytest.raises(TypeError, match="seed"):
        synthetic_tokens(10, 5, seed=1.5)


# --- TokenStream ----------------------------------------------------------------------

@given(seq_len=st.integers(1, 12), global_batch=st.integers(1, 9),
       extra=st.integers(0, 40), seed=st.integers(0, 2**32), step=st.integers(0, 10**6))
def test_batch_layout_and_shift(seq_len, global_batch, extra, seed, step):
    # tokens = 100, 101, ...: a token's value tells where it came from
    tokens = np.arange(100, 100 + seq_len + 1 + extra)
    stream = TokenStream(tokens, seq_len, seed)
    inputs, targets = stream.batch(step, global_batch)
    assert inputs.shape == targets.shape == (seq_len, global_batch)   # [s, b]
    assert inputs.dtype == targets.dtype == np.int64
    assert np.array_equal(targets, inputs + 1)             # next token, since tokens count up
    assert np.array_equal(inputs[1:], targets[:-1])        # shifted by one along s
    starts = stream.starts(step, global_batch)
    assert np.array_equal(inputs[0], 100 + starts)         # row 0 = start of each column
    assert np.array_equal(inputs, 100 + starts[None, :] + np.arange(seq_len)[:, None])
    assert targets.max() <= tokens[-1]                     # windows stay inside the stream


def test_batch_on_random_tokens_reads_the_windows():
    tokens = synthetic_tokens(500, 11, seed=1)
    stream = TokenStream(tokens, 16, seed=5)
    inputs, targets = stream.batch(7, 6)
    for j, s0 in enumerate(stream.starts(7, 6)):
        assert np.array_equal(inputs[:, j], tokens[s0:s0 + 16])
        assert np.array_equal(targets[:, j], tokens[s0 + 1:s0 + 17])


def test_batch_deterministic_in_seed_and_step_and_order_independent():
    tokens = synthetic_tokens(2000, 50, seed=0)
    a = TokenStream(tokens, 32, seed=1)
    b = TokenStream(tokens.copy(), 32, seed=1)
    forward = [a.batch(s, 8) for s in range(5)]
    backward = [b.batch(s, 8) for s in reversed(range(5))][::-1]
    for (i1, t1), (i2, t2) in zip(forward, backward):
        assert np.array_equal(i1, i2) and np.array_equal(t1, t2)
    assert not np.array_equal(a.batch(0, 8)[0], a.batch(1, 8)[0])          # step matters
    assert not np.array_equal(a.batch(0, 8)[0], TokenStream(tokens, 32, seed=2).batch(0, 8)[0])


def test_batch_is_a_copy_and_stream_is_frozen():
    tokens = np.arange(50)
    stream = TokenStream(tokens, 4, seed=0)
    tokens[:] = -1                                   # the stream kept its own copy
    inputs, _ = stream.batch(0, 3)
    assert (inputs >= 0).all()
    inputs[:] = 0                                    # batches are fresh arrays
    assert stream.tokens.min() == 0 and stream.tokens.max() == 49
    with pytest.raises(ValueError):
        stream.tokens[0] = 5


def test_every_window_can_be_drawn():
    stream = TokenStream(np.arange(6), seq_len=3, seed=0)   # starts 0, 1, 2
    assert stream.num_starts == 3
    seen = set(stream.starts(0, 200).tolist())
    assert seen == {0, 1, 2}


def test_token_stream_errors():
    with pytest.raises(ValueError, match="needs 9 tokens .* has 8"):
        TokenStream(np.arange(8), seq_len=8, seed=0)
    with pytest.raises(ValueError, match="1-D"):
        TokenStream(np.zeros((2, 10), dtype=np.int64), seq_len=2, seed=0)
    with pytest.raises(TypeError, match="integer ids"):
        TokenStream(np.zeros(10), seq_len=2, seed=0)
    stream = TokenStream(np.arange(10), seq_len=2, seed=0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        stream.batch(-1, 2)
    with pytest.raises(ValueError, match="global_batch must be >= 1"):
        stream.batch(0, 0)


# --- splits -----------------------------------------------------------------------------

def _global_batch(s, b, seed=0, hidden=None):
    rng = np.random.default_rng(seed)
    shape = (s, b) if hidden is None else (s, b, hidden)
    return rng.integers(0, 1000, size=shape), rng.integers(0, 1000, size=(s, b))


@given(s=st.integers(1, 6), micro=st.integers(1, 4), k=st.integers(1, 6),
       hidden=st.none() | st.integers(1, 3))
def test_microbatches_reassemble_exactly(s, micro, k, hidden):
    inputs, targets = _global_batch(s, micro * k, hidden=hidden)
    parts = split_microbatches(inputs, targets, k)
    assert len(parts) == k
    for inp, tgt in parts:
        assert inp.shape == (s, micro) + inputs.shape[2:]
        assert tgt.shape == (s, micro)
        assert inp.flags.c_contiguous and not np.shares_memory(inp, inputs)
    assert np.array_equal(np.concatenate([p[0] for p in parts], axis=1), inputs)
    assert np.array_equal(np.concatenate([p[1] for p in parts], axis=1), targets)


@given(s=st.integers(1, 6), per_rank=st.integers(1, 6), dp=st.integers(1, 6))
def test_data_parallel_slices_reassemble_exactly(s, per_rank, dp):
    inputs, targets = _global_batch(s, per_rank * dp)
    slices = [split_data_parallel(inputs, targets, r, dp) for r in range(dp)]
    for r, (inp, tgt) in enumerate(slices):
        assert inp.shape == tgt.shape == (s, per_rank)
        assert np.array_equal(inp, inputs[:, r * per_rank:(r + 1) * per_rank])
        assert inp.flags.c_contiguous and not np.shares_memory(inp, inputs)
    assert np.array_equal(np.concatenate([x[0] for x in slices], axis=1), inputs)
    assert np.array_equal(np.concatenate([x[1] for x in slices], axis=1), targets)


@given(dp=st.integers(1, 4), k=st.integers(1, 4), micro=st.integers(1, 3))
def test_dp_then_microbatches_covers_the_global_batch_in_order(dp, k, micro):
    """global_batch = dp * k * micro; rank r's micro-batch i is global block r*k + i."""
    inputs, targets = _global_batch(3, dp * k * micro)
    pieces = []
    for r in range(dp):
        pieces += split_microbatches(*split_data_parallel(inputs, targets, r, dp), k)
    assert np.array_equal(np.concatenate([p[0] for p in pieces], axis=1), inputs)
    assert np.array_equal(np.concatenate([p[1] for p in pieces], axis=1), targets)


def test_indivisible_sizes_raise_helpful_errors():
    inputs, targets = _global_batch(4, 6)
    with pytest.raises(ValueError) as err:
        split_microbatches(inputs, targets, 4)
    msg = str(err.value)
    assert "6 sequences" in msg and "4 equal micro-batches" in msg
    assert "[1, 2, 3, 6]" in msg and "multiple of 4" in msg

    with pytest.raises(ValueError) as err:
        split_data_parallel(inputs, targets, 0, 4)
    msg = str(err.value)
    assert "6 sequences" in msg and "4 data-parallel ranks" in msg
    assert "multiple of 4" in msg and "[1, 2, 3, 6]" in msg


def test_split_argument_errors():
    inputs, targets = _global_batch(4, 6)
    with pytest.raises(ValueError, match="dp_rank 3 is out of range for dp_size 3"):
        split_data_parallel(inputs, targets, 3, 3)
    with pytest.raises(ValueError, match="num_microbatches must be >= 1"):
        split_microbatches(inputs, targets, 0)
    with pytest.raises(ValueError, match=r"must agree on\s+\[s, b\]"):
        split_microbatches(inputs, targets.T, 2)       # targets in [b, s] by mistake
    with pytest.raises(ValueError, match="batch on axis 1"):
        split_microbatches(inputs[0], targets[0], 2)


# --- the gradient-accumulation trap ----------------------------------------------------
#
# A linear least-squares model on [s, b, d] features: pred[t, j] = X[t, j] . w, and the
# loss of a (micro-)batch is the mean squared error over its s*b entries:
#     L(w) = mean((X w - y)^2),      dL/dw = 2 / (s*b) * sum_{t,j} X[t, j] * (X[t, j] . w - y[t, j])

def mse_loss_and_grad(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    r = x @ w - y                                   # [s, b]
    return float(np.mean(r * r)), 2.0 / r.size * np.einsum("sbd,sb->d", x, r)


def _problem(s, b, d, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s, b, d)), rng.standard_normal((s, b)),
            rng.standard_normal(d))


def test_loss_scale_values():
    assert loss_scale_for_accumulation(1) == 1.0
    assert loss_scale_for_accumulation(4) == 0.25
    with pytest.raises(ValueError, match="num_microbatches must be >= 1"):
        loss_scale_for_accumulation(0)


@given(k=st.integers(2, 6), micro=st.integers(1, 4), s=st.integers(1, 5),
       d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_gradient_accumulation_needs_the_1_over_k_scale(k, micro, s, d, seed):
    x, y, w = _problem(s, k * micro, d, seed)
    full_loss, full_grad = mse_loss_and_grad(x, y, w)
    scale = loss_scale_for_accumulation(k)

    scaled = np.zeros(d)
    unscaled = np.zeros(d)
    accumulated_loss = 0.0
    for xi, yi in split_microbatches(x, y, k):
        loss_i, grad_i = mse_loss_and_grad(xi, yi, w)
        scaled += scale * grad_i          # gradient of (loss_i / k): scaling is linear
        unscaled += grad_i                # the trap: gradient of loss_i itself
        accumulated_loss += scale * loss_i

    np.testing.assert_allclose(accumulated_loss, full_loss, rtol=1e-12)
    np.testing.assert_allclose(scaled, full_grad, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(unscaled, k * full_grad, rtol=1e-12, atol=1e-13)
    assert not np.allclose(unscaled, full_grad)     # k times too large, not just off by noise


@given(dp=st.integers(2, 4), k=st.integers(1, 4), micro=st.integers(1, 3),
       d=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_data_parallel_average_divides_by_dp_as_well(dp, k, micro, d, seed):
    x, y, w = _problem(3, dp * k * micro, d, seed)
    _, full_grad = mse_loss_and_grad(x, y, w)
    per_rank = []
    for r in range(dp):
        xr, yr = split_data_parallel(x, y, r, dp)
        g = np.zeros(d)
        for xi, yi in split_microbatches(xr, yr, k):
            g += loss_scale_for_accumulation(k) * mse_loss_and_grad(xi, yi, w)[1]
        per_rank.append(g)
    summed = np.sum(per_rank, axis=0)               # an all-reduce with op=sum
    np.testing.assert_allclose(summed / dp, full_grad, rtol=1e-12, atol=1e-13)   # average
    np.testing.assert_allclose(summed, dp * full_grad, rtol=1e-12, atol=1e-13)


def test_unequal_microbatches_need_token_count_weights():
    """With sizes 1 and 5, 1/k weights are wrong; n_i / N weights are right."""
    x, y, w = _problem(4, 6, 3, seed=11)
    _, full_grad = mse_loss_and_grad(x, y, w)
    parts = [(x[:, :1], y[:, :1]), (x[:, 1:], y[:, 1:])]
    grads = [mse_loss_and_grad(xi, yi, w)[1] for xi, yi in parts]
    counts = [yi.size for _, yi in parts]          # tokens in each micro-batch: 4 and 20
    by_count = sum(n / sum(counts) * g for n, g in zip(counts, grads))
    by_k = sum(loss_scale_for_accumulation(2) * g for g in grads)
    np.testing.assert_allclose(by_count, full_grad, rtol=1e-12, atol=1e-13)
    assert not np.allclose(by_k, full_grad, rtol=1e-3)
