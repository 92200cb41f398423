"""DDP: broadcast at construction, buckets in reverse unit order, all-reduce overlapping the
rest of the backward on the simulated clock, no_sync() for gradient accumulation."""

import numpy as np
import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import DistributedDataParallel
from minipar.runtime.device import DeviceSpec

# a slow device, so that the backward's compute takes long next to a tiny all-reduce
SLOW = DeviceSpec("slow", {"float64": 1e9, "bfloat16": 4e9, "float32": 2e9}, 10**12)


def slow(n):
    return mp.Topology.nodes(1, n, device=SLOW)


def overlap(a, b):
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


@pytest.mark.timeout(60)
def test_parameters_are_broadcast_from_rank_0_at_construction(dpkit):
    cfg = dpkit.tiny_config()

    def program(ctx):
        model = GPT(cfg)
        if ctx.rank == 1:  # a rank that somehow differs is brought in line
            model.wte.weight.data[...] += 1.0
        DistributedDataParallel(model, **dpkit.OPT)
        names = [e.name for e in ctx.trace.of("comm")]
        return model.wte.weight.data.copy(), names

    (w0, names), (w1, _) = mp.launch(program, 2)
    np.testing.assert_array_equal(w0, w1)
    assert names == ["broadcast"] * (1 + cfg.num_layers)  # one per unit


@pytest.mark.timeout(60)
def test_buckets_fill_in_reverse_unit_order_up_to_the_cap(dpkit):
    cfg = dpkit.tiny_config(num_layers=2)
    cap_mb = 2e-3  # 2097 bytes: ~262 float64 elements
    with mp.device():
        model = GPT(cfg)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb, **dpkit.OPT)
        names = [p.name for b in ddp.buckets for p in b.flat.params]
        expected = [p.name for _, ps in reversed(model.units()) for p in reversed(ps)]
        assert names == expected  # last block first, its parameters last-first; root last
        assert names[0].startswith("blocks.1.") and names[-1] == "wte.weight"
        sizes = [b.buffer.nbytes for b in ddp.buckets]
        assert all(s >= cap_mb * 2**20 for s in sizes[:-1])  # closed once the cap is reached
        assert sum(sizes) == 8 * model.num_parameters()  # no padding in DDP
        assert ddp.buckets[0].units == {"blocks.1"}
        for p in model.parameters():  # gradients are views of the buckets
            assert p.grad is not None and p.grad.base is not None


def backward_timeline(kit, bucket_cap_mb):
    cfg = kit.tiny_config(num_layers=2, hidden=16, seq_len=8)
    (ids, tgt), = kit.global_batches(cfg, 1, 4, seed=0)

    def program(ctx):
        model = GPT(cfg)
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, **kit.OPT)
        _, cache = model.forward(*split_data_parallel(ids, tgt, ctx.rank, 2))
        t0 = ctx.clock.now
        model.backward(cache)
        computes = [e for e in ctx.trace.of("compute") if e.start >= t0]
        reduces = ctx.trace.of("comm", "all_reduce")
        ddp.step()
        return computes, reduces, ctx.clock.now - t0

    return mp.launch(program, 2, topology=slow(2))


@pytest.mark.timeout(60)
def test_all_reduce_overlaps_the_remaining_backward(dpkit):
    """Small buckets: the first all-reduce starts while earlier units still compute their
    backward, on the group's comm stream. One bucket: it can only start at the end."""
    computes, reduces, small_time = backward_timeline(dpkit, 1e-3)[0]
    assert len(reduces) > 2
    last_compute = max(e.end for e in computes)
    assert reduces[0].start < last_compute  # launched while the backward goes on
    assert sum(overlap(r, c) for r in reduces for c in computes) > 0
    computes1, reduces1, one_time = backward_timeline(dpkit, 25.0)[0]
    assert len(reduces1) == 1
    assert reduces1[0].start >= max(e.end for e in computes1)  # nothing to overlap with
    assert sum(overlap(r, c) for r in reduces1 for c in computes1) == 0


@pytest.mark.timeout(60)
def test_no_sync_accumulates_without_communication(dpkit):
    cfg = dpkit.tiny_config()
    (ids, tgt), = dpkit.global_batches(cfg, 1, 6, seed=1)

    def program(ctx):
        model = GPT(cfg)
        ddp = DistributedDataParallel(model, bucket_cap_mb=1e-3, **dpkit.OPT)
        x, y = split_data_parallel(ids, tgt, ctx.rank, 2)
        before = len(ctx.trace.of("comm"))
        with ddp.no_sync():
            model.loss_and_grad(x[:, :1], y[:, :1], loss_scale=1 / 3)
            model.loss_and_grad(x[:, 1:2], y[:, 1:2], loss_scale=1 / 3)
        quiet = len(ctx.trace.of("comm")) - before
        local = {p.name: p.grad.copy() for p in model.parameters()}  # not averaged yet
        model.loss_and_grad(x[:, 2:], y[:, 2:], loss_scale=1 / 3)
        reduces = len(ctx.trace.of("comm", "all_reduce"))
        return quiet, reduces, len(ddp.buckets), local, ddp.full_grads()

    (q0, r0, nb, local0, g0), (q1, r1, _, local1, g1) = mp.launch(program, 2)
    assert q0 == q1 == 0  # nothing was sent inside no_sync
    assert r0 == r1 == nb  # one all-reduce per bucket for the three micro-batches
    assert any(not np.array_equal(local0[n], local1[n]) for n in local0)
    for n in g0:
        np.testing.assert_array_equal(g0[n], g1[n])  # averaged: equal on both ranks
    with mp.device():  # and equal to one device on the whole batch
        model = GPT(cfg)
        model.loss_and_grad(ids, tgt)
        for p in model.parameters():
            dpkit.assert_close(g0[p.name], p.grad, atol_scale=dpkit.GRAD_ATOL_SCALE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cap_mb", [1e-4, 2e-3, 25.0])
def test_each_bucket_records_the_unit_whose_backward_launched_it(dpkit, cap_mb):
    """A bucket is launched at the backward_post of the last of its units to finish."""
    cfg = dpkit.tiny_config(num_layers=3)

    def program(ctx):
        model = GPT(cfg)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb, **dpkit.OPT)
        order = []
        model.hooks.register("backward_post", order.append)
        ids = np.arange(16).reshape(8, 2) % cfg.vocab_size
        model.loss_and_grad(ids, ids)
        return [(sorted(b.units), b.launched_after) for b in ddp.buckets], order

    buckets, order = mp.launch(program, 2)[0]
    assert len(buckets) > 1 or cap_mb == 25.0
    for units, after in buckets:
        assert after == max(units, key=order.index)
