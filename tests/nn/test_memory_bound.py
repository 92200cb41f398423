"""Elementwise work on the calibrated clock: each op charges the bytes of the planner's table
(plan/compute_time.py), forward and backward, on its own (local) shapes.

Per op, the recorded bytes are the formula of nn/memory_bound.py; per model, a GPT's
elementwise bytes on one device and on each rank of a tensor-parallel (and sequence-
parallel) group are the planner's layer_bytes x layers + embedding_bytes + head_bytes
exactly; AdamW's are its bytes per parameter. Under the peak model nothing is charged.
"""

import dataclasses
from collections import Counter, defaultdict

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.nn.attention import core_attention_backward, core_attention_forward
from minipar.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward
from minipar.nn.gelu import gelu_backward, gelu_forward
from minipar.nn.layernorm import layernorm_backward, layernorm_forward
from minipar.nn.softmax import softmax_backward, softmax_forward
from minipar.optim import AdamW, MixedPrecisionOptimizer, SGD
from minipar.plan.compute_time import (Shape, embedding_bytes, head_bytes, layer_bytes,
                                       optimizer_bytes_per_parameter)

BF16 = np.dtype(ml_dtypes.bfloat16)
W = 3350e9  # the H100's HBM


def charged(ctx) -> dict:
    """{event name: bytes} of the elementwise events recorded so far."""
    out = defaultdict(float)
    for e in ctx.trace.events:
        if "bytes" in e.meta:
            out[e.name] += e.meta["bytes"]
    return dict(out)


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64])
def test_each_op_charges_its_formula_each_way(dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 2, 8)).astype(dtype)          # [s, b, h]: N = 96 elements
    e, N = np.dtype(dtype).itemsize, x.size
    c = 8 if dtype == np.float64 else 4                   # the compute dtype's itemsize
    with mp.device(compute_model="calibrated") as ctx:
        y, s = layernorm_forward(x, np.ones(8, dtype), np.zeros(8, dtype))
        layernorm_backward(y, s, np.ones(8, dtype))
        y, s = gelu_forward(x)
        gelu_backward(y, s)
        y, s = softmax_forward(x)
        softmax_backward(y, s)
        loss, s = cross_entropy_forward(x, rng.integers(0, 8, (6, 2)))
        cross_entropy_backward(1.0, s)
        got = charged(ctx)
        assert all(ev.duration == pytest.approx(ev.meta["bytes"] / W, rel=1e-15)
                   for ev in ctx.trace.events)
    assert got == {"layernorm": 2 * e * N, "layernorm.backward": 5 * e * N,
                   "gelu": 2 * e * N, "gelu.backward": 4 * e * N,
                   "softmax": 2 * e * N, "softmax.backward": 3 * e * N,
                   "cross_entropy": (e + c) * N, "cross_entropy.backward": (c + e) * N}


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_the_attention_core_charges_softmax_dropout_and_layouts(p):
    s, b, a, d = 8, 2, 2, 4
    qkv = np.random.default_rng(1).normal(size=(s, b, 3 * a * d))
    e, S, Q = 8, b * a * s * s, s * b * 4 * a * d  # scores; qkv + context elements
    with mp.device(compute_model="calibrated") as ctx:
        context, saved = core_attention_forward(qkv, a, p, np.random.default_rng(2))
        core_attention_backward(context, saved)
        got = charged(ctx)
    drop = {"attention_dropout": (2 * e + 1) * S,
            "attention_dropout.backward": (2 * e + 1) * S} if p else {}
    assert got == {"softmax": 2 * e * S, "softmax.backward": 3 * e * S,
                   "attention_layout": 2 * e * Q, "attention_layout.backward": 2 * e * Q,
                   **drop}


def gpt_bytes(cfg: GPTConfig, ids, model_factory=GPT) -> dict:
    """Elementwise bytes by op of one forward and backward (no optimizer step)."""
    with mp.device(compute_model="calibrated") as ctx:
        model_factory(cfg).loss_and_grad(ids, ids)
        return charged(ctx)


def planner_bytes(cfg: GPTConfig, b: int, s: int, t: int = 1, split: int = 1) -> float:
    """The planner's elementwise bytes of one micro-batch, forward and backward, one rank."""
    sh = Shape(b=b, s=s, s_c=s, h=cfg.hidden, a=cfg.num_heads, a_kv=cfg.num_heads,
               d=cfg.hidden / cfg.num_heads, f=cfg.ffn, V=cfg.vocab_size, t=t,
               e=np.dtype(cfg.np_dtype).itemsize, split=split, dropout=cfg.dropout > 0,
               swiglu=False, rotary=False)
    total = 0.0
    for x in [layer_bytes(sh)] * cfg.num_layers + [embedding_bytes(sh), head_bytes(sh)]:
        total += x.forward + x.backward + x.core_forward + x.core_backward
    return total


@settings(max_examples=10)
@given(s=st.sampled_from([4, 8]), b=st.integers(1, 3), heads=st.sampled_from([1, 2]),
       d=st.sampled_from([2, 4]), layers=st.integers(1, 2), dropout=st.sampled_from([0.0, 0.1]),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_a_gpt_step_moves_the_planners_bytes(s, b, heads, d, layers, dropout, dtype):
    cfg = GPTConfig(vocab_size=12, seq_len=s, hidden=heads * d, num_heads=heads,
                    num_layers=layers, dropout=dropout, dtype=dtype)
    ids = np.random.default_rng(3).integers(0, 12, (s, b))
    got = gpt_bytes(cfg, ids)
    assert sum(got.values()) == pytest.approx(planner_bytes(cfg, b, s), rel=1e-12)
    e, N = np.dtype(cfg.np_dtype).itemsize, s * b * cfg.hidden
    r = 1 if dropout else 0
    assert got["dropout_add"] == 2 * layers * (3 * e + r) * N          # once per branch
    assert got["dropout_add.backward"] == 2 * layers * (6 * e + r) * N
    assert got["embedding"] == got["embedding.backward"] == (5 * e + r) * N
    assert got["layernorm"] == (2 * layers + 1) * 2 * e * N          # ln1, ln2 and ln_f


@pytest.mark.parametrize("sp", [False, True])
def test_each_tensor_parallel_rank_moves_the_planners_bytes_of_its_shapes(sp):
    """tp = 2 (with SP: the stream, its LayerNorms and dropout-adds split by 2 too): every
    rank charges the planner's bytes for t = 2, through the same nn functions."""
    from minipar.parallel import ParallelDims, parallelize
    cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=8, num_heads=2, num_layers=2,
                    dropout=0.1, dtype="float32")
    ids = np.random.default_rng(4).integers(0, 16, (8, 3))

    def program(ctx):
        run = parallelize(cfg, ParallelDims(tp=2), sequence_parallel=sp)
        ctx.trace.clear()
        run.forward_backward(ids, ids)
        return charged(ctx)

    res = mp.launch(program, 2, compute_model="calibrated")
    one = planner_bytes(cfg, 3, 8, t=2, split=2 if sp else 1)
    for got in res:
        assert sum(got.values()) == pytest.approx(one, rel=1e-12)
    assert res[0] == res[1]


def test_adamw_charges_the_planners_bytes_per_parameter():
    cfg = GPTConfig(vocab_size=12, seq_len=4, hidden=8, num_heads=2, num_layers=1)
    ids = np.random.default_rng(5).integers(0, 12, (4, 2))
    for dtype, per_param in (("float32", optimizer_bytes_per_parameter("fp32", True)),
                             ("bfloat16", optimizer_bytes_per_parameter("bf16", False))):
        with mp.device(compute_model="calibrated") as ctx:
            model = GPT(dataclasses.replace(cfg, dtype=dtype))
            ps = model.parameters()
            opt = (AdamW(ps) if dtype == "float32" else
                   MixedPrecisionOptimizer(AdamW, ps, dtype="bfloat16"))
            model.loss_and_grad(ids, ids)
            ctx.trace.clear()
            opt.step()
            (ev,) = [e for e in ctx.trace.events if e.name == "adamw"]
        assert ev.meta["bytes"] == per_param * model.num_parameters()  # 36 bytes each
        assert ev.duration == pytest.approx(ev.meta["bytes"] / W, rel=1e-15)
    with mp.device(compute_model="calibrated") as ctx:  # SGD is not charged
        model = GPT(cfg)
        model.loss_and_grad(ids, ids)
        ctx.trace.clear()
        SGD(model.parameters(), lr=0.1).step()
        assert ctx.trace.events == []


@pytest.mark.parametrize("zero", [0, 1])
def test_a_data_parallel_step_charges_the_owned_elements(zero):
    """DDP: every rank steps every parameter; ZeRO-1 over 2: the ranks' shards add up to the
    model (padding is never stepped, never charged)."""
    from minipar.parallel import ParallelDims, parallelize
    cfg = GPTConfig(vocab_size=12, seq_len=4, hidden=8, num_heads=2, num_layers=1,
                    dtype="float32")
    ids = np.random.default_rng(6).integers(0, 12, (4, 4))

    def program(ctx):
        dims = ParallelDims(dp_replicate=2) if zero == 0 else ParallelDims(dp_shard=2)
        run = parallelize(cfg, dims, zero=zero or None)
        run.forward_backward(ids, ids)
        ctx.trace.clear()
        run.step()
        return sum(e.meta["bytes"] for e in ctx.trace.events if e.name == "adamw")

    got = list(mp.launch(program, 2, compute_model="calibrated"))
    with mp.device():
        psi = GPT(cfg).num_parameters()
    per = optimizer_bytes_per_parameter("fp32", True)
    assert got == [per * psi] * 2 if zero == 0 else sum(got) == per * psi


def test_under_the_peak_model_no_op_charges_anything():
    cfg = GPTConfig(vocab_size=12, seq_len=4, hidden=8, num_heads=2, num_layers=1,
                    dropout=0.1)
    ids = np.random.default_rng(7).integers(0, 12, (4, 2))
    with mp.device() as ctx:
        model = GPT(cfg)
        opt = AdamW(model.parameters())
        model.loss_and_grad(ids, ids)
        opt.step()
        assert Counter(e.name for e in ctx.trace.events) == {"matmul": 21}
