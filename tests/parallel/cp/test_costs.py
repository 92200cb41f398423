"""What context parallelism costs, read from the trace: each rank's share of the causal work
(contiguous 1/16, 3/16, 5/16, 7/16 at cp = 4; zigzag 1/4 each), its FLOPs and the bytes it
sends (ring: K/V forward, K/V and dK/dV backward; Ulysses: its four all-to-alls each way)
equal the formulas of parallel/cp/costs.py; a fully masked block charges nothing."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from minipar.parallel.cp import (attention_work, ring_attention_backward, ring_attention_bytes,
                                 ring_attention_flops, ring_attention_forward,
                                 ulysses_attention_backward, ulysses_attention_bytes,
                                 ulysses_attention_forward)

BF16 = np.dtype(ml_dtypes.bfloat16)


def per_rank(run, stream, field, name=None):
    """[(forward, backward)] per rank: the sum of `field` over the rank's events on
    `stream` (and of `name`), before and after its backward started."""
    out = []
    for ctx, mark in zip(run.result.contexts, run.marks):
        value = lambda e: e.flops if field == "flops" else float(e.meta.get(field, 0))  # noqa
        pick = lambda es: sum(value(e) for e in es  # noqa: E731
                              if e.stream == stream and (name is None or e.name == name))
        out.append((pick(ctx.trace.events[:mark]), pick(ctx.trace.events[mark:])))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout, want", [
    ("contiguous", [Fraction(1, 16), Fraction(3, 16), Fraction(5, 16), Fraction(7, 16)]),
    ("zigzag", [Fraction(1, 4)] * 4)])
def test_the_work_fractions_measured_on_the_clock(cpkit, layout, want):
    qkv, dctx = cpkit.inputs(16, 2, 2, 3, 0)
    run = cpkit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, 2, 4,
                       layout)
    flops = per_rank(run, "compute", "flops")
    busy = [ctx.trace.busy_time("compute") for ctx in run.result.contexts]
    for phase in (0, 1):
        total = sum(f[phase] for f in flops)
        assert [Fraction(f[phase] / total).limit_denominator(64) for f in flops] == want
    assert [t / sum(busy) for t in busy] == pytest.approx([float(w) for w in want], rel=1e-12)
    assert attention_work(layout, 4) == want


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_each_ranks_flops_equal_the_formula(cpkit, layout, cp):
    s, b, heads, d = 2 * cp * 2, 2, 2, 3
    qkv, dctx = cpkit.inputs(s, b, heads, d, 1)
    run = cpkit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, heads, cp,
                       layout)
    for rank, measured in enumerate(per_rank(run, "compute", "flops")):
        assert measured == ring_attention_flops(layout, rank, cp, s, b, heads, d)
    assert sum(attention_work(layout, cp)) == 1


@pytest.mark.timeout(60)
def test_a_fully_masked_block_charges_nothing(cpkit):
    """Contiguous, cp = 4: rank 0 computes only its own (diagonal) block, 2 matmuls; rank
    3 computes all four steps, 8 matmuls."""
    qkv, dctx = cpkit.inputs(8, 1, 1, 2, 0)
    run = cpkit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, 1, 4,
                       "contiguous")
    counts = [sum(e.stream == "compute" for e in ctx.trace.events[:mark])
              for ctx, mark in zip(run.result.contexts, run.marks)]
    assert counts == [2, 4, 6, 8]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype, grad_itemsize", [(np.float64, 8), (BF16, 4)])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ring_bytes_on_the_trace_equal_the_formula(cpkit, dtype, grad_itemsize, layout, cp):
    s, b, heads, d = 4 * cp, 2, 2, 3
    qkv, dctx = cpkit.inputs(s, b, heads, d, 0, dtype)
    run = cpkit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, heads, cp,
                       layout)
    want = ring_attention_bytes(s, b, heads * d, cp, np.dtype(dtype).itemsize)
    assert want.backward == ring_attention_bytes(s, b, heads * d, cp,
                                                 np.dtype(dtype).itemsize,
                                                 grad_itemsize).backward
    for fwd, bwd in per_rank(run, "p2p", "sent_bytes", "send"):
        assert (fwd, bwd) == (want.forward, want.backward)
    if cp > 1:  # K/V: 2(s/cp)bh elements in (cp - 1) sends; dK/dV: cp sends
        shard = 2 * (s // cp) * b * heads * d
        assert want.forward == (cp - 1) * shard * np.dtype(dtype).itemsize
        assert want.backward == want.forward + cp * shard * grad_itemsize


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.float64, BF16])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ulysses_bytes_on_the_trace_equal_the_formula(cpkit, dtype, layout, cp):
    s, b, heads, d = 4 * cp, 2, 4, 3
    qkv, dctx = cpkit.inputs(s, b, heads, d, 0, dtype)
    run = cpkit.run_cp(ulysses_attention_forward, ulysses_attention_backward, qkv, dctx,
                       heads, cp, layout)
    want = ulysses_attention_bytes(s, b, heads * d, cp, np.dtype(dtype).itemsize)
    for fwd, bwd in per_rank(run, "comm", "sent_bytes", "all_to_all"):
        assert (fwd, bwd) == pytest.approx((want.forward, want.backward), rel=1e-15)
    for ctx, mark in zip(run.result.contexts, run.marks):  # two all-to-alls each way
        names = [e.name for e in ctx.trace.events if e.stream == "comm"]
        assert names == ["all_to_all"] * (4 if cp > 1 else 0)
        assert len([e for e in ctx.trace.events[:mark] if e.stream == "comm"]) == \
            (2 if cp > 1 else 0)
