"""The split backward (nn/weight_grads.py) under tensor parallelism, on a mesh of tp ranks.

ColumnParallelLinear and RowParallelLinear, with and without sequence parallelism, and the
whole TensorParallelGPT (tied or untied, dropout, SP): on every rank, I then W gives the
fused backward's input gradient and shard gradients bit for bit, I + W = B in FLOPs, and
the collectives sit where the layers' docstring says: under SP the column-parallel
layer's all-gather of its input runs in W (its record holds x_r, not the gathered x), the
row-parallel layer's all-gather of dy in I.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPTConfig
from minipar.nn.weight_grads import WeightGradStore
from minipar.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear
from minipar.parallel.tp.gpt import TensorParallelGPT
from minipar.parallel.tp.sequence import SequenceParallelGrads

T, S, B, N_IN, N_OUT = 2, 4, 3, 6, 8


def flops(ctx) -> float:
    return sum(e.flops for e in ctx.trace.of("compute"))


def gathers(ctx) -> int:
    return sum(e.name == "all_gather" for e in ctx.trace.events)


def layer_run(kind, sp, split):
    """Per rank: dx, grads, FLOPs (B,) or (I, W), all-gathers (B,) or (I, W), bytes held
    after I."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((S, B, N_IN))
    dy = rng.standard_normal((S, B, N_OUT))

    def program(ctx):
        g, r = mp.new_group(range(T), "tp"), ctx.rank
        if kind == "column":
            lin = ColumnParallelLinear("lin", N_IN, N_OUT, g, sequence_parallel=sp, seed=5)
            x_in = np.split(x, T)[r] if sp else x
            dy_in = np.split(dy, T, axis=-1)[r]  # [s, b, out/t]
        else:
            grads = SequenceParallelGrads(g) if sp else None
            lin = RowParallelLinear("lin", N_IN, N_OUT, g, sequence_parallel=sp,
                                    sp_grads=grads, seed=5)
            x_in = np.split(x, T, axis=-1)[r]  # [s, b, in/t]
            dy_in = np.split(dy, T)[r] if sp else dy
        (y, _), saved = lin.forward(x_in)
        count = lambda: (flops(ctx), gathers(ctx))
        start, held = count(), None
        if split:
            store = WeightGradStore()
            dx = lin.backward(dy_in, saved, store=store)
            mid, held = count(), ctx.ledger.held("activations")
            store.run()
            end = count()  # (FLOPs of I, of W), (all-gathers in I, in W)
            spent = tuple((mid[k] - start[k], end[k] - mid[k]) for k in (0, 1))
        else:
            dx = lin.backward(dy_in, saved)
            spent = ((count()[0] - start[0],), (count()[1] - start[1],))
        if kind == "row" and sp:
            grads.flush()
        return dx, {p.name: p.grad.copy() for p in lin.parameters()}, spent, held

    return mp.launch(program, T)


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_layers_split_bit_for_bit(kind, sp):
    fused, split = layer_run(kind, sp, False), layer_run(kind, sp, True)
    tokens = S * B // T if sp else S * B  # this rank's tokens, where the layer keeps them
    for (dx_b, g_b, (fl_b, ag_b), _), (dx_s, g_s, (fl_s, ag_s), held) in zip(fused, split):
        np.testing.assert_array_equal(dx_s, dx_b)
        for name in g_b:
            np.testing.assert_array_equal(g_s[name], g_b[name], err_msg=name)
        assert sum(fl_s) == fl_b[0] and sum(ag_s) == ag_b[0]
        if kind == "column":  # W: dW_r [out/t, in] from the whole sequence
            assert fl_s[1] == 2 * S * B * N_IN * N_OUT // T
            assert ag_s == ((0, 1) if sp else (0, 0))  # x_r gathered in W
            assert held == 8 * (tokens * N_IN + S * B * N_OUT // T)  # x (x_r), dy_r
        else:  # W: dW_r [out, in/t]; dy gathered in I; the record keeps db too
            assert fl_s[1] == 2 * S * B * N_IN * N_OUT // T
            assert ag_s == ((1, 0) if sp else (0, 0))
            assert held == 8 * (S * B * N_IN // T + S * B * N_OUT + N_OUT)


@pytest.mark.parametrize("sp, tie, dropout", [(False, False, 0.0), (True, True, 0.1),
                                              (True, False, 0.1), (False, True, 0.1)])
def test_the_tensor_parallel_gpt_splits_bit_for_bit(sp, tie, dropout):
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=2,
                    ffn_hidden=16, tie_embeddings=tie, dropout=dropout)
    rng = np.random.default_rng(8)
    ids, tgt = (rng.integers(0, 16, (4, 3)) for _ in range(2))

    def program(ctx, split):
        model = TensorParallelGPT(cfg, mp.new_group(range(T), "tp"), sp)
        loss, cache = model.forward(ids, tgt)
        start = flops(ctx)
        if split:
            model.backward_weight(model.backward_input(cache, 0.5))
        else:
            model.backward(cache, 0.5)
        assert ctx.ledger.held("activations") == 0
        return {p.name: p.grad.copy() for p in model.parameters()}, flops(ctx) - start

    fused = mp.launch(lambda ctx: program(ctx, False), T)
    split = mp.launch(lambda ctx: program(ctx, True), T)
    for (g_b, fl_b), (g_s, fl_s) in zip(fused, split):
        assert list(g_s) == list(g_b) and fl_s == fl_b
        for name in g_b:
            np.testing.assert_array_equal(g_s[name], g_b[name], err_msg=name)
