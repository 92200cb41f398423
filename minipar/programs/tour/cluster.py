"""Parts 1-6 of `minipar tour`: the simulated cluster.

Eight simulated H100s on two nodes of four; every collective runs once on tiny,
rank-dependent data so you can see what moved where, then once more on megabytes so the
simulated clock has something to say; a ring all-reduce built from send/recv shows its
steps; the same all-reduce inside a node and across nodes shows why tensor parallelism
stays on NVLink; two timelines show the collectives and then compute and communication
overlapping on their streams.
"""

from __future__ import annotations

import math

import numpy as np

from ... import runtime as mp
from ...runtime import cost
from ...runtime.algorithms import ring_all_reduce, ring_schedule
from ...runtime.ledger import fmt_bytes
from ...viz.timeline import COLLECTIVE_LETTERS, render_timeline, summarize
from .common import Print, Record, fmt_array, fmt_t, no_recorder

TOPOLOGY = mp.Topology.nodes(2, gpus_per_node=4)

#: the costed buffer is float32 elements split into equal chunks over the 8 ranks
#: (reduce_scatter, all_to_all_single, the 4-rank ring): a multiple of 4 x 8 bytes
ALIGN_BYTES = 4 * TOPOLOGY.world_size
#: the largest --megabytes: the tour holds about 80 copies of the buffer over its 8 ranks
#: (measured: 1.5 GB of host memory at 16 MiB, 5.2 GB at 64 MiB)
MAX_MEGABYTES = 64.0


def tour_nbytes(megabytes: float) -> int:
    """The per-rank buffer of parts 2-6 for `megabytes` MiB: the nearest multiple of
    ALIGN_BYTES, at least one. Refuses what is not a number in (0, MAX_MEGABYTES]."""
    if not (isinstance(megabytes, (int, float)) and math.isfinite(megabytes)
            and 0 < megabytes <= MAX_MEGABYTES):
        raise ValueError(f"the tour's buffer must be a finite number of MiB in "
                         f"(0, {MAX_MEGABYTES:g}], got {megabytes!r}")
    return max(1, round(megabytes * (1 << 20) / ALIGN_BYTES)) * ALIGN_BYTES


def _semantics(ctx: mp.Context) -> dict:
    """Every collective on tiny data: x_r = [10 r, 10 r + 1]."""
    r, n = ctx.rank, ctx.world_size
    x = np.array([10.0 * r, 10.0 * r + 1])
    out = {"input": x}
    out["all_reduce"] = mp.all_reduce(x)
    out["all_gather"] = mp.all_gather(x)
    out["reduce_scatter"] = mp.reduce_scatter(np.arange(2.0 * n) + 100 * r)
    out["broadcast"] = mp.broadcast(x if r == 3 else None, src=3)
    out["reduce"] = mp.reduce(x, dst=0)
    out["gather"] = mp.gather(x, dst=0)
    out["scatter"] = mp.scatter([np.array([i, i]) * 1.0 for i in range(n)] if r == 0 else None,
                                src=0)
    out["all_to_all"] = mp.all_to_all([np.array([10.0 * r + j]) for j in range(n)])
    left, right = (r - 1) % n, (r + 1) % n
    sent = mp.isend(x, dst=right)  # a blocking send first would deadlock, as on NCCL
    out["recv"] = mp.recv(src=left)
    sent.wait()
    mp.barrier()
    return out


def _costs(ctx: mp.Context, nbytes: int) -> None:
    """Every collective on `nbytes` of float32 per rank, for the clock."""
    n = ctx.world_size
    x = np.ones(nbytes // 4, np.float32)
    mp.all_reduce(x)
    mp.all_gather(x[: x.size // n])
    mp.reduce_scatter(x)
    mp.broadcast(x, src=0)
    mp.all_to_all_single(x)
    mp.barrier()


def cluster_parts(out: Print, nbytes: int, ascii: bool, width: int,
                  record: Record = no_recorder) -> list:
    """Print parts 1-6, passing each launch to `record`; returns the events of part 6
    (compute overlapping communication)."""
    if nbytes <= 0 or nbytes % ALIGN_BYTES:
        raise ValueError(f"the tour's buffer must be a positive multiple of {ALIGN_BYTES} "
                         f"bytes (float32 chunks over {TOPOLOGY.world_size} ranks), got "
                         f"{nbytes}; tour_nbytes(megabytes) rounds a size")
    topo = TOPOLOGY
    n = topo.world_size
    out("minipar tour: one program, run once per simulated device")
    out(f"cluster: {topo.describe()}")
    out("ranks 0-3 sit on node 0, ranks 4-7 on node 1\n")

    out("1. What moves where (x_r = [10r, 10r+1] on rank r; results as rank 0 sees them"
        " unless noted)")
    res = record("1. what moves where", mp.launch(_semantics, n, topology=topo))
    r0, r5 = res[0], res[5]
    rows = [
        ("all_reduce(x)", "sum over ranks", r0["all_reduce"]),
        ("all_gather(x)", "concat over ranks", r0["all_gather"]),
        ("reduce_scatter(y_r)", "rank 5's chunk of the sum", r5["reduce_scatter"]),
        ("broadcast(x, src=3)", "rank 3's x everywhere", r0["broadcast"]),
        ("reduce(x, dst=0)", "sum, on rank 0 only", r0["reduce"]),
        ("gather(x, dst=0)", "all x, on rank 0 only", np.stack(r0["gather"])[:, 0]),
        ("scatter(p, src=0)", "rank 5 gets piece 5", r5["scatter"]),
        ("all_to_all(p_r)", "rank 5 gets p_j[5] from each j", np.concatenate(r5["all_to_all"])),
        ("send right / recv left", "rank 5 gets rank 4's x", r5["recv"]),
    ]
    for call, meaning, value in rows:
        out(f"   {call:<24}{meaning:<32}{fmt_array(value)}")
    out("   (y_r = [0, 1, ..., 15] + 100 r; gather shows the first element of each x)\n")

    out(f"2. What it costs: every collective on {fmt_bytes(nbytes)} of float32 per rank")
    res = record("2. what it costs", mp.launch(lambda ctx: _costs(ctx, nbytes), n,
                                               topology=topo))
    events = res.contexts[0].trace.of("comm")
    out(f"   {'collective':<16}{'algorithm':<14}{'time':>13}{'algbw':>12}{'busbw':>12}"
        f"{'sent by r0':>13}  formula")
    for e in events:
        out(f"   {e.name:<16}{e.meta['algorithm']:<14}{fmt_t(e.duration):>13}"
            f"{e.meta['algbw'] / 1e9:>9.1f} GB/s{e.meta['busbw'] / 1e9:>7.1f} GB/s"
            f"{fmt_bytes(e.meta['sent_bytes']):>13}  {e.meta['formula']}")
    out("   algbw = S / t;  busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for gathers,\n"
        "   scatters and all_to_all: busbw compares with the link bandwidth (nccl-tests).\n")

    out("3. A ring all-reduce built from send/recv (4 ranks of node 0), step by step")
    for s in ring_schedule(4):
        if s.rank == 0:
            out(f"   rank 0, {s.phase:<15} step {s.step}: send chunk {s.send_chunk} to rank "
                f"{s.send_to}, receive chunk {s.recv_chunk} from rank {s.recv_from}")
    ring = record("3. ring all-reduce of sends", mp.launch(
        lambda ctx: _timed(ctx, lambda x: ring_all_reduce(x), nbytes), 4))
    direct = record("3. direct all_reduce", mp.launch(
        lambda ctx: _timed(ctx, lambda x: mp.all_reduce(x), nbytes), 4))
    formula = cost.ring_all_reduce_time(nbytes, 4, topo.intra)
    out(f"   {fmt_bytes(nbytes)}: ring of sends took {fmt_t(ring[0][0]).strip()}, the direct "
        f"all_reduce {fmt_t(direct[0][0]).strip()}, formula 2(n-1)a + 2(n-1)/n*S/B = "
        f"{fmt_t(formula).strip()}; same result: {bool(np.array_equal(ring[0][1], direct[0][1]))}\n")

    out("4. Why tensor parallelism stays inside a node: all_reduce over 4 ranks")
    same = record("4. tp groups inside nodes", mp.launch(
        lambda ctx: _group_allreduce(ctx, (0, 1, 2, 3), (4, 5, 6, 7), nbytes), n, topology=topo))
    split = record("4. tp groups across nodes", mp.launch(
        lambda ctx: _group_allreduce(ctx, (0, 1, 4, 5), (2, 3, 6, 7), nbytes), n, topology=topo))
    t_same, t_split = same[0], split[0]
    out(f"   group {{0,1,2,3}} (one node, NVLink):     {fmt_t(t_same)}")
    out(f"   group {{0,1,4,5}} (two nodes, InfiniBand): {fmt_t(t_split)}   "
        f"{t_split / t_same:.1f}x slower\n")

    out("5. The collectives of part 2 on the timeline (one row per rank, a letter each)")
    out(render_timeline(res.events(), n, width=width, ascii=ascii, symbols=COLLECTIVE_LETTERS))
    out("")
    out("6. Overlap: compute on one stream, communication on another")
    out("   each rank computes 4 layers' gradients (backward, last layer first) and starts an")
    out("   asynchronous all_reduce of each as soon as it is ready; it waits once, at the end")
    res = record("6. overlap", mp.launch(lambda ctx: _overlap(ctx, nbytes), n, topology=topo))
    all_events = res.events()
    out(render_timeline(all_events, n, width=width, ascii=ascii))
    out(summarize(all_events, n, ascii=ascii))
    return all_events


def _overlap(ctx: mp.Context, nbytes: int) -> None:
    """Backward of 4 layers with each layer's gradient all-reduced asynchronously."""
    flops = 2 * 2 * 4096 * 4096 * 2048  # two matmuls of a 4096 x 4096 layer, 2048 tokens
    works = []
    for layer in reversed(range(4)):
        ctx.compute(flops, "bfloat16", name="backward", label=f"layer {layer}")
        grad = np.full(nbytes // 4, float(ctx.rank), np.float32)
        works.append(mp.all_reduce(grad, async_op=True))
    for w in works:
        w.wait()


def _timed(ctx: mp.Context, fn, nbytes: int):
    x = np.arange(nbytes // 4, dtype=np.float32) % 7 + ctx.rank
    t0 = ctx.clock.now
    y = fn(x)
    return ctx.clock.now - t0, y


def _group_allreduce(ctx: mp.Context, a: tuple, b: tuple, nbytes: int) -> float:
    g = mp.new_group(a if ctx.rank in a else b, name="tp")
    t0 = ctx.clock.now
    mp.all_reduce(np.ones(nbytes // 4, np.float32), group=g)
    return ctx.clock.now - t0
