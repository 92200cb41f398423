"""Bytes each rank sends per step, read from the trace, equal the ring theory exactly.

With Psi elements of e bytes (bf16: e = 2) and N = dp, each rank sends per step:

    DDP             ring all-reduce                     2 (N-1)/N Psi  e
    ZeRO-1, ZeRO-2  reduce-scatter + all-gather         2 (N-1)/N Psi' e
    ZeRO-3          all-gather (forward) + all-gather (backward) + reduce-scatter
                                                        (3 Psi' - Psi'_root) (N-1)/N e

Psi' is the padded count (flat.py); the root stays gathered from forward to backward, so
its backward all-gather is saved (zero3.py). Gradient clipping adds one all-reduce of a
float64 scalar for stages 1-3 (2 (N-1)/N * 8 bytes); DDP clips locally (its gradients are
whole and equal everywhere).

A ring all-reduce's share 2(N-1)/N * S is a whole number of bytes only when N divides
2(N-1)S, so the sums below add the events' float `sent_bytes` (as `Trace.bytes_sent()`
does) and compare with the exact value.
"""

import contextlib
from fractions import Fraction

import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import FullyShardedDataParallel, ShardingStrategy, zero_engine

PSI, PSI_ROOT, PSI_BLOCK = 2080, 336, 872  # the tiny bf16 GPT (test_memory_formulas.py)
E = 2  # bytes of a bf16 element


def up(x, n):
    return -(-x // n) * n


def theory(stage, n, clip=False):
    """Exact bytes one rank sends in one step, as a Fraction."""
    p, p_root = up(PSI_ROOT, n) + 2 * up(PSI_BLOCK, n), up(PSI_ROOT, n)
    f = Fraction(n - 1, n)
    bytes_ = {0: 2 * f * PSI * E, 1: 2 * f * p * E, 2: 2 * f * p * E,
              3: (3 * p - p_root) * f * E}[stage]
    if clip and stage > 0:
        bytes_ += 2 * f * 8
    return bytes_


def step_events(kit, make_engine, n, topology=None, micro_batches=1):
    """Every rank's comm events of one training step (construction excluded)."""
    cfg = kit.tiny_config(dtype="bfloat16")
    (ids, tgt), = kit.global_batches(cfg, steps=1, global_batch=n * micro_batches, seed=0)

    def program(ctx):
        model = GPT(cfg)
        engine = make_engine(model)
        start = len(ctx.trace.events)
        x, y = split_data_parallel(ids, tgt, ctx.rank, n)
        for i in range(micro_batches):
            with engine.no_sync() if i < micro_batches - 1 else contextlib.nullcontext():
                model.loss_and_grad(x[:, i:i + 1], y[:, i:i + 1], loss_scale=1 / micro_batches)
        engine.step()
        engine.zero_grad()
        return [e for e in ctx.trace.events[start:] if e.stream == "comm"]

    return mp.launch(program, n, topology=topology)


def sent(events, name=None):
    return sum(e.meta["sent_bytes"] for e in events if name is None or e.name == name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_per_step_equal_the_ring_theory(dpkit, stage, n):
    kw = dict(bucket_cap_mb=1e-3) if stage == 0 else {}
    ranks = step_events(dpkit, lambda m: zero_engine(m, stage=stage, **dpkit.OPT, **kw), n)
    for events in ranks:
        assert sent(events) == pytest.approx(float(theory(stage, n)), rel=1e-14)
        if all(float(e.meta["sent_bytes"]).is_integer() for e in events):
            # whole bytes in every event (padding to a multiple of N sees to it for ZeRO's
            # reduce-scatters and all-gathers): the trace's integer count is exact too
            assert sum(int(e.meta["sent_bytes"]) for e in events) == theory(stage, n)
        else:  # DDP on 3 ranks: buckets of S bytes send 4S/3 each, not whole bytes
            assert stage == 0 and n == 3


@pytest.mark.timeout(60)
def test_stage3_traffic_by_collective(dpkit):
    n = 4
    f = Fraction(n - 1, n)
    for events in step_events(dpkit, lambda m: zero_engine(m, stage=3, **dpkit.OPT), n):
        # forward: every unit; backward: every unit but the root (it stayed whole)
        assert sent(events, "all_gather") == (2 * PSI - PSI_ROOT) * f * E
        assert sent(events, "reduce_scatter") == PSI * f * E
        assert [e.name for e in events].count("all_gather") == 3 + 2
        # ZeRO's 1.5x: stage 3 against DDP's 2 Psi, minus the root's saved gather
        assert theory(3, n) / theory(0, n) == Fraction(3 * PSI - PSI_ROOT, 2 * PSI)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_clipping_adds_one_scalar_all_reduce(dpkit, stage):
    n = 4
    ranks = step_events(dpkit, lambda m: zero_engine(m, stage=stage, max_grad_norm=0.1,
                                                     **dpkit.OPT), n)
    for events in ranks:
        assert sent(events) == pytest.approx(float(theory(stage, n, clip=True)), rel=1e-14)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_no_sync_accumulation_sends_what_one_micro_batch_sends(dpkit, stage):
    """Three micro-batches, the first two inside no_sync(): one reduction per step (stage 3
    still gathers weights for every micro-batch's forward and backward)."""
    n = 2
    ranks = step_events(dpkit, lambda m: zero_engine(m, stage=stage, **dpkit.OPT), n,
                        micro_batches=3)
    f = Fraction(n - 1, n)
    for events in ranks:
        if stage == 3:
            assert sent(events, "reduce_scatter") == PSI * f * E
            assert sent(events, "all_gather") == 3 * (2 * PSI - PSI_ROOT) * f * E
        else:
            assert sent(events) == theory(stage, n)


@pytest.mark.timeout(60)
def test_hybrid_shard_sends_only_a_shard_across_nodes(dpkit):
    """HYBRID_SHARD on 2 nodes x 2 GPUs: all-gathers and reduce-scatters inside the node
    (NVLink), then an all-reduce of each Psi'/2 gradient shard across the nodes (IB)."""
    topo = mp.Topology.nodes(2, gpus_per_node=2)
    ranks = step_events(dpkit, lambda m: FullyShardedDataParallel(
        m, sharding_strategy=ShardingStrategy.HYBRID_SHARD, **dpkit.OPT), 4, topology=topo)
    half = Fraction(1, 2)
    for events in ranks:
        intra = [e for e in events if e.name in ("all_gather", "reduce_scatter")]
        inter = [e for e in events if e.name == "all_reduce"]
        assert {e.meta["link"] for e in intra} == {topo.intra.name}
        assert {e.meta["link"] for e in inter} == {topo.inter.name}
        assert sent(intra) == (3 * PSI - PSI_ROOT) * half * E
        assert sent(inter) == 2 * half * (PSI // 2) * E  # ring over 2 nodes of Psi/2
