"""GPTConfig.recompute_every = k: only every k-th block recomputes (block i when
(i + 1) % k == 0); the others keep all their activations. Gradients do not change."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.plan import activation_bytes_per_layer


def grads_of(cfg):
    with mp.device():
        model = GPT(cfg)
        rng = np.random.default_rng(3)
        ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, 3))
        loss = model.loss_and_grad(ids, np.roll(ids, -1, axis=0), np.random.default_rng(7))
        return loss, {n: p.grad.copy() for n, p in model.named_parameters().items()}


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_gradients_are_identical_whatever_blocks_recompute(dtype, recompute, every):
    base = GPTConfig(num_layers=4, dropout=0.2, dtype=dtype)
    want_loss, want = grads_of(base)
    loss, got = grads_of(base.with_(recompute=recompute, recompute_every=every))
    assert loss == want_loss
    for name, g in want.items():
        np.testing.assert_array_equal(got[name], g, err_msg=name)


def test_every_kth_block_recomputes_counting_from_one():
    cfg = GPTConfig(num_layers=6, recompute="full", recompute_every=2)
    assert [cfg.block_recompute(i) for i in range(6)] == ["none", "full"] * 3
    with mp.device():
        assert [b.recompute for b in GPT(cfg).blocks] == ["none", "full"] * 3
    assert GPTConfig(num_layers=3, recompute="full").block_recompute(0) == "full"  # k = 1
    assert GPTConfig(num_layers=3, recompute_every=2).block_recompute(1) == "none"


def test_blocks_that_do_not_recompute_keep_everything():
    s, b, h, a = 8, 2, 16, 2
    cfg = GPTConfig(vocab_size=17, seq_len=s, hidden=h, num_heads=a, num_layers=4,
                    dropout=0.1, dtype="bfloat16", recompute="full", recompute_every=2)
    with mp.device():
        model = GPT(cfg)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 17, (s, b))
        _, cache = model.forward(ids, ids, np.random.default_rng(0))
        kept = [_nbytes(sb) for sb in cache.blocks]
    full = activation_bytes_per_layer(s, b, h, a, "none")
    ckpt = activation_bytes_per_layer(s, b, h, a, "full")
    assert kept == [full, ckpt, full, ckpt]


def _nbytes(saved) -> int:
    """Bytes a block's saved structure (a Saved, or a tuple of them) holds."""
    if isinstance(saved, (tuple, list)):
        return sum(_nbytes(s) for s in saved)
    return saved.nbytes()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_recompute_every_is_validated(bad):
    with pytest.raises(ValueError, match="recompute_every must be a positive integer"):
        GPTConfig(recompute_every=bad)
