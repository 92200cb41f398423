"""Grader for lesson 04: your tensor- and sequence-parallel pieces against minipar's own
ColumnParallelLinear, RowParallelLinear, cross_entropy_forward and layernorm_backward, on
1 to 4 simulated ranks, in float64."""

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import SETTINGS, exercise, expect_close, expect_equal, on_ranks
from minipar.nn.cross_entropy import cross_entropy_forward
from minipar.nn.layernorm import layernorm_backward
from minipar.nn.saved import Saved
from minipar.parallel.mesh import ParallelDims, ParallelGroups
from minipar.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear

WORLD = st.integers(1, 4)
SEED = st.integers(0, 2**16)


def tp_group():
    """This rank's tensor-parallel group on a dp = 2 x tp mesh: two groups of consecutive
    ranks, each running the same check, so that an answer which ignores `group` and
    reduces over the whole world is caught (its sums come out doubled)."""
    dims = ParallelDims(dp_replicate=2, tp=mp.get_world_size() // 2)
    return ParallelGroups(dims).tp


def bias_values(n: int) -> np.ndarray:
    """A bias with a different, non-zero value in every entry."""
    return 0.5 + np.arange(n) / 4.0


@exercise("4.1", "the column-parallel linear layer and its f")
@SETTINGS
@given(tp=WORLD, s=st.integers(1, 3), b=st.integers(1, 2),
       n_in=st.integers(1, 5), out_per_rank=st.integers(1, 3), seed=SEED)
def check_column_parallel_linear(impl, tp, s, b, n_in, out_per_rank, seed):
    t, n_out = tp, out_per_rank * tp
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, b, n_in))  # the same input on every rank
    dy = rng.standard_normal((s, b, n_out))  # dL/dy of the whole layer; rank r gets a slice

    def program(ctx):
        g = tp_group()
        r = g.group_rank(ctx.rank)
        lin = ColumnParallelLinear("lin", n_in, n_out, g, seed=seed, std=1.0)
        lin.bias.set_data(np.split(bias_values(n_out), t)[r])
        w_r, b_r = lin.weight.data.copy(), lin.bias.data.copy()
        (y_want, _), saved = lin.forward(x)  # y_r: [s, b, n_out/t]
        dy_r = np.split(dy, t, axis=-1)[r]
        dx_want = lin.backward(dy_r, saved)

        y = impl.column_parallel_linear_forward(x.copy(), w_r.copy(), b_r.copy(), g)
        expect_close(y, y_want, rank=r, what="column_parallel_linear_forward(x, w_shard, "
                     "b_shard)", hint="y_r = x W_r^T + b_r, this rank's out/t outputs")
        got = impl.column_parallel_linear_backward(dy_r.copy(), x.copy(), w_r.copy(), g)
        expect_equal(isinstance(got, tuple) and len(got), 3, rank=r,
                     what="column_parallel_linear_backward(...) returns (dx, dw_shard, "
                          "db_shard): its length")
        dx, dw, db = got
        expect_close(dw, lin.weight.grad, rank=r, what="dw_shard of column_parallel_"
                     "linear_backward", hint="dW_r = dy_r^T x, summed over the s·b tokens")
        expect_close(db, lin.bias.grad, rank=r, what="db_shard of column_parallel_linear_"
                     "backward", hint="db_r = dy_r summed over the s·b tokens")
        expect_close(dx, dx_want, rank=r, what="dx of column_parallel_linear_backward",
                     hint="every rank used the whole x, so dx is the SUM over ranks of "
                          "dy_r W_r: f's backward is an all-reduce")

    on_ranks(program, 2 * tp)


@exercise("4.2", "the row-parallel linear layer and its g")
@SETTINGS
@given(tp=WORLD, s=st.integers(1, 3), b=st.integers(1, 2),
       in_per_rank=st.integers(1, 3), n_out=st.integers(1, 5), seed=SEED)
def check_row_parallel_linear(impl, tp, s, b, in_per_rank, n_out, seed):
    t, n_in = tp, in_per_rank * tp
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, b, n_in))  # the whole input; rank r gets a slice
    dy = rng.standard_normal((s, b, n_out))  # the same dL/dy on every rank

    def program(ctx):
        g = tp_group()
        r = g.group_rank(ctx.rank)
        lin = RowParallelLinear("lin", n_in, n_out, g, seed=seed, std=1.0)
        lin.bias.set_data(bias_values(n_out))
        w_r, bias = lin.weight.data.copy(), lin.bias.data.copy()
        x_r = np.split(x, t, axis=-1)[r]  # [s, b, n_in/t]
        (y_want, _), saved = lin.forward(x_r)
        dx_want = lin.backward(dy, saved)

        y = impl.row_parallel_linear_forward(x_r.copy(), w_r.copy(), bias.copy(), g)
        expect_close(y, y_want, rank=r, what="row_parallel_linear_forward(x_shard, w_shard, b)",
                     hint="all-reduce the partial products x_r W_r^T (g), then add the bias "
                          "once: adding it before the sum counts it t times")
        got = impl.row_parallel_linear_backward(dy.copy(), x_r.copy(), w_r.copy(), g)
        expect_equal(isinstance(got, tuple) and len(got), 3, rank=r,
                     what="row_parallel_linear_backward(...) returns (dx_shard, dw_shard, "
                          "db): its length")
        dx, dw, db = got
        expect_close(dx, dx_want, rank=r, what="dx_shard of row_parallel_linear_backward",
                     hint="dx_r = dy W_r; g's backward is the identity: no communication")
        expect_close(dw, lin.weight.grad, rank=r, what="dw_shard of row_parallel_linear_"
                     "backward", hint="dW_r = dy^T x_r, summed over the s·b tokens")
        expect_close(db, lin.bias.grad, rank=r, what="db of row_parallel_linear_backward",
                     hint="db = dy summed over the tokens; dy is already whole on every "
                          "rank, so nothing to reduce")

    on_ranks(program, 2 * tp)


@exercise("4.3", "cross-entropy over a vocabulary split across ranks")
@SETTINGS
@given(tp=WORLD, s=st.integers(1, 3), b=st.integers(1, 2),
       vocab_per_rank=st.integers(1, 4), seed=SEED)
def check_vocab_parallel_cross_entropy(impl, tp, s, b, vocab_per_rank, seed):
    t, V = tp, vocab_per_rank * tp
    rng = np.random.default_rng(seed)
    # logits with a wide range, so that a max over one shard only is not the global max
    logits = rng.standard_normal((s, b, V)) * 4 + np.arange(V) / V
    targets = rng.integers(0, V, (s, b))
    targets.flat[0] = V - 1  # a target on the last rank
    targets.flat[-1] = 0  # and one on the first

    def program(ctx):
        g = tp_group()
        r = g.group_rank(ctx.rank)
        want, saved = cross_entropy_forward(logits, targets)  # one device, full logits
        saved.release()
        shard = np.ascontiguousarray(np.split(logits, t, axis=-1)[r])  # [s, b, V/t]
        before = len(ctx.trace.events)
        loss = impl.vocab_parallel_cross_entropy_loss(shard, targets.copy(), g)
        comm = [(e.name, e.nbytes) for e in ctx.trace.events[before:] if e.stream == "comm"]
        expect_close(loss, want, rank=r, what="vocab_parallel_cross_entropy_loss("
                     "logits_shard, targets)",
                     hint="loss = mean of (m + log sum_e) - z_t with m the GLOBAL max "
                          "(all-reduce max), sum_e = all-reduced Σ exp(logits_r - m), z_t "
                          "the target's logit from the rank that holds it (all-reduce sum)")
        small = s * b * 8  # one float64 per token: [s, b]
        wrong = [f"{name} of {n} bytes" for name, n in comm
                 if name != "all_reduce" or n > small]
        expect_equal(wrong, [], rank=r, what="collectives other than all-reduces of [s, b] "
                     f"({small} bytes)", hint="no rank may gather the logits: reduce the "
                     "per-token max, target logit and sum of exponentials instead")
        expect_equal(len(comm) <= 3, True, rank=r, what=f"at most three all-reduces "
                     f"(issued {len(comm)})", hint="max, target logit, sum of exponentials")

    on_ranks(program, 2 * tp)


@exercise("4.4", "sequence-parallel LayerNorm gradients")
@SETTINGS
@given(tp=WORLD, tokens_per_rank=st.integers(1, 3), b=st.integers(1, 2),
       h=st.integers(3, 6), seed=SEED)
def check_sequence_parallel_layernorm(impl, tp, tokens_per_rank, b, h, seed):
    t, s = tp, tokens_per_rank * tp
    rng = np.random.default_rng(seed)
    # every position of the sequence on its own scale, so that each rank's part differs
    x = rng.standard_normal((s, b, h)) * (1 + np.arange(s))[:, None, None] + 0.3
    dy = rng.standard_normal((s, b, h))
    gamma = 1.0 + rng.standard_normal(h) / 2

    def program(ctx):
        g = tp_group()
        r = g.group_rank(ctx.rank)
        dx_full, dgamma, dbeta = layernorm_backward(dy, Saved("ln", x=x), gamma)  # one device
        x_r, dy_r = np.split(x, t, axis=0)[r], np.split(dy, t, axis=0)[r]  # [s/t, b, h]
        got = impl.sequence_parallel_layernorm_grads(dy_r.copy(), x_r.copy(), gamma.copy(), g)
        expect_equal(isinstance(got, tuple) and len(got), 3, rank=r,
                     what="sequence_parallel_layernorm_grads(...) returns (dx_shard, dgamma, "
                          "dbeta): its length")
        dx, dg, db = got
        expect_close(dx, np.split(dx_full, t, axis=0)[r], rank=r,
                     what="dx_shard of sequence_parallel_layernorm_grads",
                     hint="LayerNorm normalises each token over h: dx of this rank's tokens "
                          "needs only this rank's data (do not reduce it)")
        expect_close(dg, dgamma, rank=r, what="dgamma of sequence_parallel_layernorm_grads",
                     hint="each rank saw only s/t of the tokens: all-reduce the partial "
                          "Σ dy·xhat over the group")
        expect_close(db, dbeta, rank=r, what="dbeta of sequence_parallel_layernorm_grads",
                     hint="all-reduce the partial Σ dy over the group")

    on_ranks(program, 2 * tp)
