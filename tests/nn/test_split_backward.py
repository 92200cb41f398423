"""The backward split in two (nn/weight_grads.py): I now, W later, equal to the fused B.

For every layer with weights, every block, the head and the whole GPT (tied or not,
dropout on or off, every recomputation mode), in float64:
- bits: the input gradient and every parameter's gradient after I then W are the fused
  backward's, bit for bit (the same operations on the same arrays);
- FLOPs: I + W = B exactly, and W is the weight gradients' matmuls, 2·N·in·out per linear;
- bytes: after I the ledger holds exactly W's records (x and dy of each linear, dgamma and
  dbeta of each LayerNorm, the embedding step's dx0, ids and positions), nothing of what
  only I read; after W, nothing;
- hooks: no unit's backward_post fires during I (its gradients are not complete: the torch
  trap of pytorch issue 144530 is a reduction at that point); each fires after its W.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, MLP, Block, CausalSelfAttention, GPTConfig, LayerNorm, Linear
from minipar.nn.hooks import EVENTS
from minipar.nn.weight_grads import WeightGradStore

S, Bt, H, HEADS, FFN = 4, 3, 8, 2, 16  # s, b, h, a, f of the layer tests
N = S * Bt  # tokens
CFG = GPTConfig(vocab_size=16, seq_len=S, hidden=H, num_heads=HEADS, num_layers=2,
                ffn_hidden=FFN)


def flops(ctx) -> float:
    return sum(e.flops for e in ctx.trace.of("compute"))


def one_backward(make, forward, x, dy, split):
    """Build a layer, run its forward on x, its backward from dy, fused or as I then W:
    (dx, {name: grad}, FLOPs of (B,) or (I, W), activations held after I)."""
    with mp.device() as ctx:
        layer = make()
        y, saved = forward(layer, x, np.random.default_rng(5))
        start, held = flops(ctx), None
        if split:
            store = WeightGradStore()
            dx = layer.backward(dy(y), saved, store=store)
            mid, held = flops(ctx), ctx.ledger.held("activations")
            assert held == store.nbytes() and len(store) > 0
            store.run()
            spent = (mid - start, flops(ctx) - mid)
        else:
            dx = layer.backward(dy(y), saved)
            spent = (flops(ctx) - start,)
        assert ctx.ledger.held("activations") == 0
        return dx, {p.name: p.grad.copy() for p in layer.parameters()}, spent, held


def check_split(make, forward, x, record_elements, linears):
    """I then W is B: bits, FLOPs (W = 2·N·in·out per linear) and the records' bytes."""
    dy = lambda y: np.random.default_rng(9).standard_normal(y.shape)
    dx_b, g_b, (b,), _ = one_backward(make, forward, x, dy, split=False)
    dx_s, g_s, (i, w), held = one_backward(make, forward, x, dy, split=True)
    np.testing.assert_array_equal(dx_s, dx_b)
    assert list(g_s) == list(g_b)
    for name in g_b:
        np.testing.assert_array_equal(g_s[name], g_b[name], err_msg=name)
    assert i + w == b and w == sum(2 * N * fan_in * fan_out for fan_in, fan_out in linears)
    assert held == 8 * record_elements  # float64


X = np.random.default_rng(1).standard_normal((S, Bt, H))


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check_split(lambda: Linear("fc", H, FFN, bias=bias), lambda m, x, rng: m.forward(x), X,
                N * H + N * FFN, [(H, FFN)])  # x and dy


def test_layernorm():
    check_split(lambda: LayerNorm("ln", H), lambda m, x, rng: m.forward(x), X, 2 * H, [])


@pytest.mark.parametrize("dropout, selective", [(0.0, False), (0.2, False), (0.2, True)])
def test_attention(dropout, selective):
    check_split(lambda: CausalSelfAttention("attn", H, HEADS, dropout),
                lambda m, x, rng: m.forward(x, rng, selective), X,
                (N * H + 3 * N * H) + (N * H + N * H), [(H, 3 * H), (H, H)])


def test_mlp():
    check_split(lambda: MLP("mlp", H, FFN), lambda m, x, rng: m.forward(x, rng), X,
                (N * H + N * FFN) + (N * FFN + N * H), [(H, FFN), (FFN, H)])


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_block_in_every_recompute_mode(recompute, dropout):
    """(8h + 2f)·N + 4h elements whatever the mode: "full" reruns the forward in I and W
    reads the rerun's records."""
    cfg = CFG.with_(dropout=dropout)
    check_split(lambda: Block("blocks.0", cfg, recompute=recompute),
                lambda m, x, rng: m.forward(x, rng), X, (8 * H + 2 * FFN) * N + 4 * H,
                [(H, 3 * H), (H, H), (H, FFN), (FFN, H)])


# ---- the whole model --------------------------------------------------------------------
def gpt_backward(cfg, split, dloss=0.5, seen=None):
    """Forward and backward of one GPT on a fixed batch: grads, FLOPs, bytes after I."""
    rng = np.random.default_rng(2)
    ids, tgt = (rng.integers(0, cfg.vocab_size, (S, Bt)) for _ in range(2))
    with mp.device() as ctx:
        model = GPT(cfg)
        if seen is not None:
            for e in EVENTS:
                model.hooks.register(e, lambda unit, e=e: seen.append((e, unit)))
        loss, cache = model.forward(ids, tgt)
        start, held = flops(ctx), None
        if split:
            store = model.backward_input(cache, dloss)
            mid, held = flops(ctx), ctx.ledger.held("activations")
            if seen is not None:
                seen.append(("W", None))
            model.backward_weight(store)
            spent = (mid - start, flops(ctx) - mid)
        else:
            model.backward(cache, dloss)
            spent = (flops(ctx) - start,)
        assert ctx.ledger.held("activations") == 0
        return {p.name: p.grad.copy() for p in model.parameters()}, spent, held


CONFIGS = [dict(), dict(tie_embeddings=True, dropout=0.1), dict(recompute="selective"),
           dict(recompute="full", dropout=0.2, tie_embeddings=True),
           dict(recompute="segments", recompute_segment=2, num_layers=3, dropout=0.1)]


@pytest.mark.parametrize("kw", CONFIGS)
def test_the_whole_gpt(kw):
    cfg = CFG.with_(**kw)
    fused, (b,), _ = gpt_backward(cfg, split=False)
    split, (i, w), held = gpt_backward(cfg, split=True)
    assert list(split) == list(fused)
    for name in fused:
        np.testing.assert_array_equal(split[name], fused[name], err_msg=name)
    h, f, V, L = H, FFN, cfg.vocab_size, cfg.num_layers
    linears = L * (2 * N * (3 * h * h + h * h + h * f + f * h)) + 2 * N * h * V
    assert i + w == b and w == linears
    blocks = L * ((8 * h + 2 * f) * N + 4 * h)
    head = (N * h + N * V) + 2 * h  # lm_head's x and dlogits, ln_f's dgamma and dbeta
    embed = N * h  # dx0, float64 like the rest ...
    assert held == 8 * (blocks + head + embed) + 8 * 2 * N  # ... and int64 ids, positions


def test_the_whole_gpt_in_bfloat16():
    """16-bit activations and weights (float32 accumulation inside each op): still the same
    operations on the same arrays, so still bit for bit; W's records in bf16 are a quarter
    of float64's (the int64 ids and positions aside)."""
    cfg = CFG.with_(dtype="bfloat16", dropout=0.1, tie_embeddings=True)
    fused, (b,), _ = gpt_backward(cfg, split=False)
    split, (i, w), held = gpt_backward(cfg, split=True)
    for name in fused:
        assert split[name].dtype == fused[name].dtype
        np.testing.assert_array_equal(split[name].astype(np.float32),
                                      fused[name].astype(np.float32), err_msg=name)
    assert i + w == b
    _, _, held64 = gpt_backward(cfg.with_(dtype="float64"), split=True)
    assert (held - 8 * 2 * N) * 4 == held64 - 8 * 2 * N


def test_backward_post_fires_after_w_never_during_i():
    """A data-parallel engine reduces a unit at its backward_post: during I no unit's
    gradients are complete, so none fires there; W fires each one, in the fused order."""
    fused, split = [], []
    gpt_backward(CFG, split=False, seen=fused)
    gpt_backward(CFG, split=True, seen=split)
    at = split.index(("W", None))
    i_part, w_part = split[:at], split[at + 1:]
    assert not any(e == "backward_post" for e, _ in i_part)
    assert [u for e, u in i_part if e == "backward_input_post"] == [
        "blocks.1", "blocks.0", "root"]
    assert w_part == [(e, u) for e, u in fused if e == "backward_post"]
    assert [x for x in i_part if x[0] != "backward_input_post"] == [
        x for x in fused if x[0] != "backward_post"]


class FusedOnlyMLP(MLP):
    """A stand-in MLP whose backward knows nothing of a store."""

    def backward(self, dy, saved):
        return super().backward(dy, saved)


def test_a_part_that_cannot_split_is_refused_by_name():
    with mp.device():
        model = GPT(CFG, mlp_factory=lambda i: FusedOnlyMLP(f"blocks.{i}.mlp", H, FFN))
        ids = np.zeros((S, Bt), dtype=int)
        loss, cache = model.forward(ids, ids)
        with pytest.raises(TypeError, match="FusedOnlyMLP.backward.* cannot split"):
            model.backward_input(cache)
