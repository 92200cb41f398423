"""Batches of token ids, and how a global batch is cut into micro-batches and DP shards.

Layout. Every batch here is Megatron's [s, b]: sequence first, then batch
(Megatron-LM, Shoeybi et al. 2019, keeps activations as [s, b, h]). Column j of a
batch is one training sequence; row t holds position t of every sequence:

    inputs[t, j]  = tokens[start_j + t]          t = 0 .. s-1
    targets[t, j] = tokens[start_j + t + 1]      (the next token: inputs shifted by one)

so `inputs[1:] == targets[:-1]`. Code that wants [b, s] takes `inputs.T`.

Cutting a global batch. The batch axis is axis 1. With data parallelism of size dp and
gradient accumulation over k micro-batches, the sizes multiply the way Megatron's do:

    global_batch = dp * k * micro_batch

`split_data_parallel` gives each data-parallel rank its contiguous block of
global_batch / dp columns, and `split_microbatches` cuts a rank's block into k
micro-batches of micro_batch columns each. Both cut along axis 1 only and keep
column order, so concatenating the pieces in order gives back the batch exactly.
How to scale the loss of each micro-batch is in `loss_scale_for_accumulation`.

Everything is deterministic: a batch depends only on (tokens, seq_len, seed, step),
never on what was drawn before, so a run restarted at step n sees the same data.
"""

from __future__ import annotations

import numpy as np

from ..runtime.checks import divisors


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def synthetic_tokens(num_tokens: int, vocab_size: int, seed: int) -> np.ndarray:
    """`num_tokens` ids drawn uniformly from [0, vocab_size): [num_tokens] int64.

    Deterministic in (num_tokens, vocab_size, seed). Uniform tokens carry no structure,
    so a model cannot push its loss below log(vocab_size) on them: use them to compare a
    parallel run against a single-device run, and the bundled corpus to watch a model learn.
    """
    num_tokens = _check_int("num_tokens", num_tokens, 0)
    vocab_size = _check_int("vocab_size", vocab_size, 1)
    seed = _check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=num_tokens, dtype=np.int64)


class TokenStream:
    """Random windows of a token sequence as [s, b] (inputs, targets) batches.

        stream = TokenStream(tokens, seq_len=32, seed=0)
        inputs, targets = stream.batch(step=0, global_batch=8)   # both [32, 8] int64

    Batch `step` draws `global_batch` start offsets with
        rng = np.random.default_rng([seed, step])
        start_j = rng.integers(0, len(tokens) - seq_len)      # start_j + seq_len < len(tokens)
    and returns, for each j, the window tokens[start_j : start_j + seq_len + 1] split into
    inputs (all but the last token) and targets (all but the first). The same
    (seed, step) always gives the same batch, whatever other steps were drawn before.
    Windows are sampled with replacement, so two columns may overlap or repeat.
    """

    def __init__(self, tokens, seq_len: int, seed: int):
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(
                f"tokens must be 1-D (one long sequence of ids), got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"tokens must be integer ids, got dtype {arr.dtype}")
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        if arr.size < self.seq_len + 1:
            raise ValueError(
                f"a window of seq_len={self.seq_len} needs {self.seq_len + 1} tokens "
                f"(inputs plus one target), but the stream has {arr.size}; "
                f"use a shorter seq_len or more text")
        self.tokens = arr.astype(np.int64)          # our own copy
        self.tokens.flags.writeable = False

    @property
    def num_starts(self) -> int:
        """How many distinct windows there are: len(tokens) - seq_len."""
        return int(self.tokens.size - self.seq_len)

    def starts(self, step: int, global_batch: int) -> np.ndarray:
        """The start offsets of batch `step`: [global_batch] int64."""
        step = _check_int("step", step, 0)
        global_batch = _check_int("global_batch", global_batch, 1)
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self.num_starts, size=global_batch, dtype=np.int64)

    def batch(self, step: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of batch `step`: both [seq_len, global_batch] int64.

        inputs[t, j] = tokens[start_j + t], targets[t, j] = tokens[start_j + t + 1].
        """
        starts = self.starts(step, global_batch)
        # positions: [s + 1, b], column j = start_j, start_j + 1, ..., start_j + s
        positions = starts[None, :] + np.arange(self.seq_len + 1, dtype=np.int64)[:, None]
        windows = self.tokens[positions]
        return windows[:-1].copy(), windows[1:].copy()

    def __repr__(self) -> str:
        return (f"TokenStream(num_tokens={self.tokens.size}, seq_len={self.seq_len}, "
                f"seed={self.seed})")


def _check_pair(inputs: np.ndarray, targets: np.ndarray, what: str) -> int:
    """Both at least 2-D with the same [s, b] leading dims; return b."""
    for name, a in (("inputs", inputs), ("targets", targets)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{what}: {name} must be a numpy array, got {type(a).__name__}")
        if a.ndim < 2:
            raise ValueError(f"{what}: {name} must be [s, b, ...] (batch on axis 1), "
                             f"got shape {a.shape}")
    if inputs.shape[:2] != targets.shape[:2]:
        raise ValueError(
            f"{what}: inputs {inputs.shape} and targets {targets.shape} must agree on "
            f"[s, b] (the first two axes); are both in [s, b] layout, not one of them [b, s]?")
    return int(inputs.shape[1])


def split_microbatches(inputs: np.ndarray, targets: np.ndarray,
                       num_microbatches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Cut a batch into `num_microbatches` equal parts along the batch axis (axis 1).

    inputs: [s, b, ...], targets: [s, b, ...]  ->  k pairs of [s, b/k, ...]
    Micro-batch i holds columns i*b/k .. (i+1)*b/k - 1, so
        np.concatenate([m[0] for m in parts], axis=1) == inputs.
    The parts are contiguous copies: changing one never changes the batch.
    """
    k = _check_int("num_microbatches", num_microbatches, 1)
    b = _check_pair(inputs, targets, "split_microbatches")
    if b % k:
        raise ValueError(
            f"a batch of {b} sequences cannot be cut into {k} equal micro-batches "
            f"({b} % {k} = {b % k}); use num_microbatches in {divisors(b)}, or a batch "
            f"size that is a multiple of {k}")
    m = b // k
    return [(inputs[:, i * m:(i + 1) * m].copy(), targets[:, i * m:(i + 1) * m].copy())
            for i in range(k)]


def split_data_parallel(inputs: np.ndarray, targets: np.ndarray,
                        dp_rank: int, dp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The contiguous block of the global batch that data-parallel rank `dp_rank` trains on.

    inputs: [s, B, ...], targets: [s, B, ...]  ->  [s, B/dp, ...] each, the columns
        dp_rank * B/dp .. (dp_rank + 1) * B/dp - 1,
    so concatenating every rank's block in rank order along axis 1 gives back the global
    batch. Returns contiguous copies.
    """
    dp_size = _check_int("dp_size", dp_size, 1)
    dp_rank = _check_int("dp_rank", dp_rank, 0)
    if dp_rank >= dp_size:
        raise ValueError(f"dp_rank {dp_rank} is out of range for dp_size {dp_size} "
                         f"(ranks are 0 .. {dp_size - 1})")
    b = _check_pair(inputs, targets, "split_data_parallel")
    if b % dp_size:
        raise ValueError(
            f"a global batch of {b} sequences cannot be shared equally by {dp_size} "
            f"data-parallel ranks ({b} % {dp_size} = {b % dp_size}); use a global batch "
            f"that is a multiple of {dp_size} (global_batch = dp * num_microbatches * "
            f"micro_batch), or dp_size in {divisors(b)}")
    m = b // dp_size
    sl = slice(dp_rank * m, (dp_rank + 1) * m)
    return inputs[:, sl].copy(), targets[:, sl].copy()


def loss_scale_for_accumulation(num_microbatches: int) -> float:
    """The factor 1/k to multiply each micro-batch's loss by when accumulating k of them.

    The trap. Let L = mean over the B samples of the batch of l_n, and cut the batch into k
    equal micro-batches of B/k samples, each with its own mean loss L_i. Then
        L = (1/k) * sum_i L_i,   so   grad L = (1/k) * sum_i grad L_i.
    Gradient accumulation adds up the gradients of k backward passes. If each backward
    starts from L_i itself, the sum is sum_i grad L_i = k * grad L: the step is k times
    too large, exactly as if the learning rate of plain SGD had been multiplied by k.
    (Adam hides it, since the factor cancels in m / sqrt(v) up to epsilon, but gradient
    clipping then sees a norm k times too large and clips when it should not.) Scaling each
    micro-batch loss by 1/k before its backward makes the accumulated gradient equal the
    full-batch gradient.

    With data parallelism, each of the dp ranks accumulates the gradient of its own
    B/dp samples; the gradient all-reduce must then *average* (sum, then divide by dp),
    so the overall factor on each micro-batch gradient is 1/(k * dp).

    Equal sizes are assumed. If micro-batch i holds n_i of the N samples (or, for
    language models, n_i of the N tokens that count towards the loss, e.g. after padding
    or masking), then L = sum_i (n_i / N) * L_i, and 1/k is right only when every
    n_i = N/k: a smaller micro-batch is over-weighted, a larger one under-weighted, and
    the accumulated gradient is no longer the full-batch gradient. The fix is token-count
    weighting: scale micro-batch i by n_i / N (equivalently, sum the per-token losses of
    each micro-batch and divide by the total N counted over all micro-batches and ranks).
    """
    k = _check_int("num_microbatches", num_microbatches, 1)
    return 1.0 / k
