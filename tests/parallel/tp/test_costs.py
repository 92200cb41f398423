"""What tensor and sequence parallelism cost, measured: activation bytes per layer from the
ledger against Korthikanti et al. 2022's Table 2, and communication per layer from the
trace against Megatron's two all-reduces forward and two backward."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPTConfig
from minipar.nn.saved import saved_nbytes
from minipar.parallel.tp.gpt import TensorParallelGPT
from minipar.plan import activation_bytes_per_layer


saved_bytes = saved_nbytes


def layer_bytes(cfg, t, sp, b):
    """Bytes each block saved, per rank, read from the ledger around each block's forward."""
    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"), sequence_parallel=sp)
        held = {}
        model.hooks.register("forward_pre", lambda u: held.__setitem__(
            u, -ctx.ledger.held("activations")))
        model.hooks.register("forward_post", lambda u: held.__setitem__(
            u, held[u] + ctx.ledger.held("activations")))
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (cfg.seq_len, b))
        _, cache = model.forward(ids, ids)
        per_block = [held[blk.name] for blk in model.blocks]
        assert per_block == [saved_bytes(sb) for sb in cache.blocks]  # ledger = Saved objects
        model.backward(cache)
        assert ctx.ledger.held("activations") == 0
        return per_block

    return mp.launch(program, t)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("t, sp", [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_activation_bytes_match_table_2(t, sp, recompute):
    """bf16 activations, 1-byte dropout masks: per layer and rank
        tensor parallel            sbh (10 + 24/t + 5as/(ht))
        tensor + sequence parallel sbh (34/t + 5as/(ht))
    selective recomputation drops the 5as/(ht) term; full keeps the input (2sbh, /t with SP)."""
    s, b, h, a = 8, 2, 16, 4
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=a, num_layers=2,
                    dropout=0.1, dtype="bfloat16", recompute=recompute)
    paper = {"none": (10 + 24 / t if not sp else 34 / t) + 5 * a * s / (h * t),
             "selective": 10 + 24 / t if not sp else 34 / t,
             "full": 2 / t if sp else 2}[recompute] * s * b * h
    assert activation_bytes_per_layer(s, b, h, a, recompute, tp=t, sequence_parallel=sp) == paper
    for per_block in layer_bytes(cfg, t, sp, b):
        assert per_block == [paper, paper]


@pytest.mark.parametrize("dtype, act_bytes", [("float32", 4), ("float64", 8)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_activation_bytes_scale_with_the_element_size(dtype, act_bytes, dropout):
    """Wider activations scale the 2-byte terms; masks stay 1 byte and vanish without dropout."""
    s, b, h, a, t = 8, 1, 16, 4, 2
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=a, num_layers=1,
                    dropout=dropout, dtype=dtype)
    for sp in (False, True):
        want = activation_bytes_per_layer(s, b, h, a, "none", act_bytes, dropout > 0, t, sp)
        for per_block in layer_bytes(cfg, t, sp, b):
            assert per_block == [want]


def comm_per_layer(cfg, t, sp, b):
    """{(phase, collective): [bytes, ...]} issued inside block 0's forward and backward."""
    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"), sequence_parallel=sp)
        marks = {}
        for ev in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
            model.hooks.register(ev, lambda u, ev=ev: marks.__setitem__(
                (ev, u), len(ctx.trace.events)))
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (cfg.seq_len, b))
        model.loss_and_grad(ids, ids)
        out = {}
        for phase in ("forward", "backward"):
            lo, hi = marks[(f"{phase}_pre", "blocks.0")], marks[(f"{phase}_post", "blocks.0")]
            for e in ctx.trace.events[lo:hi]:
                if e.stream == "comm":
                    out.setdefault((phase, e.name), []).append(e.nbytes)
        return out

    return mp.launch(program, t)[0]


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_layer_does_two_all_reduces_each_way(t):
    s, b, h = 8, 2, 16
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=4, num_layers=2)
    sbh = s * b * h * 8  # float64
    assert comm_per_layer(cfg, t, False, b) == {("forward", "all_reduce"): [sbh, sbh],
                                                ("backward", "all_reduce"): [sbh, sbh]}


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_layer_trades_each_all_reduce_for_a_gather_and_a_scatter(t):
    """Forward: all-gather before each column-parallel block, reduce-scatter after each
    row-parallel one, all of s·b·h elements (the all-reduce's volume, split in two halves).
    Backward: the conjugates (reduce-scatter, all-gather), plus one all-gather per
    column-parallel layer that rebuilds its saved input for the weight gradient, plus one
    all-reduce of the LayerNorm and row-bias gradients: 6h elements (two LayerNorms' gamma
    and beta, 4h; the attention projection's and fc2's biases, 2h)."""
    s, b, h = 8, 2, 16
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=4, num_layers=2)
    sbh = s * b * h * 8
    got = comm_per_layer(cfg, t, True, b)
    assert got == {("forward", "all_gather"): [sbh, sbh],
                   ("forward", "reduce_scatter"): [sbh, sbh],
                   ("backward", "all_gather"): [sbh, sbh, sbh, sbh],
                   ("backward", "reduce_scatter"): [sbh, sbh],
                   ("backward", "all_reduce"): [6 * h * 8]}


def test_bytes_sent_per_layer_equal_the_ring_formula():
    """What a rank sends per layer: 4 all-reduces of S = sbh bytes over t ranks on a ring,
    2 (t-1)/t S each; with SP the forward sends the same, (t-1)/t S per gather or scatter,
    and the backward 1.5x as much plus the small gradient all-reduce."""
    s, b, h, t = 8, 2, 16, 4
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=4, num_layers=1)
    S = s * b * h * 8

    def sent(sp, phase):
        def program(ctx):
            model = TensorParallelGPT(cfg, mp.new_group(range(t), "tp"), sequence_parallel=sp)
            marks = {}
            for ev in (f"{phase}_pre", f"{phase}_post"):
                model.hooks.register(ev, lambda u, ev=ev: marks.__setitem__(
                    (ev, u), len(ctx.trace.events)))
            ids = np.zeros((s, b), dtype=np.int64)
            model.loss_and_grad(ids, ids)
            lo, hi = marks[(f"{phase}_pre", "blocks.0")], marks[(f"{phase}_post", "blocks.0")]
            return sum(e.meta["sent_bytes"] for e in ctx.trace.events[lo:hi]
                       if e.stream == "comm")
        return mp.launch(program, t, algorithm="ring")[0]

    assert sent(False, "forward") == pytest.approx(2 * 2 * (t - 1) / t * S)
    assert sent(False, "backward") == pytest.approx(2 * 2 * (t - 1) / t * S)
    assert sent(True, "forward") == pytest.approx(4 * (t - 1) / t * S)
    # backward: RS x 2 + AG x 2 (the conjugates) + AG x 2 (inputs rebuilt for wgrad),
    # and the LayerNorm/bias gradients' all-reduce of 6h float64 elements
    assert sent(True, "backward") == pytest.approx(6 * (t - 1) / t * S
                                                   + 2 * (t - 1) / t * 6 * h * 8)
