"""One SPMD program that calls every collective, for the MPI backend's equivalence test.

    mpiexec -n 4 python tests/mpi/program.py mpi OUT_DIR    # one process per rank
    python tests/mpi/program.py sim OUT_DIR                 # four simulated devices

Each rank writes OUT_DIR/rank<r>.npz (allow_pickle=False): its results flattened into
named arrays, plus its simulated clock and trace. Most data are small integers in floating
point, so every summation order gives the same bits; the "ordered_" results sum random
floats, whose bits depend on the order, over four ranks (the MPI backend must reduce them
in group order, as the sim backend does) and over two (where a + b = b + a). MPI's
results must equal the sim backend's exactly. Ranks get different, asymmetric data, so
a wrong order, root or axis shows.
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np

import minipar as mp
from minipar.runtime.algorithms import halving_doubling_all_reduce, ring_all_reduce

WORLD = 4


def data(rank: int, shape: tuple, dtype="float64", salt: int = 0) -> np.ndarray:
    """Rank-dependent, asymmetric integers: (i * (rank + 2) + 3 * rank + salt) % 17."""
    i = np.arange(int(np.prod(shape)))
    return ((i * (rank + 2) + 3 * rank + salt) % 17).reshape(shape).astype(dtype)


def program(ctx) -> dict:
    """Every collective once or more; returns {name: array or list of arrays or None}."""
    r, out = ctx.rank, {}
    ctx.compute(1e9 * (r + 1), name="warmup")  # rank-dependent clocks
    x = data(r, (4, 6))
    out["all_reduce_sum"] = mp.all_reduce(x)
    out["all_reduce_avg_f32"] = mp.all_reduce(data(r, (3, 5), "float32"), op="avg")
    out["all_reduce_max_i32"] = mp.all_reduce(data(r, (7,), "int32", 1), op=mp.ReduceOp.MAX)
    out["all_reduce_min_i64"] = mp.all_reduce(data(r, (2, 3), "int64", 2), op="min")
    out["all_reduce_prod"] = mp.all_reduce(data(r, (5,), salt=3) % 3 + 1, op="prod")
    out["all_reduce_bf16"] = mp.all_reduce(data(r, (2, 8), ml_dtypes.bfloat16))
    out["all_reduce_bf16_avg"] = mp.all_reduce(data(r, (4,), ml_dtypes.bfloat16, 5), op="avg")
    out["all_reduce_f16_max"] = mp.all_reduce(data(r, (3,), "float16"), op="max")
    out["reduce_to_2"] = mp.reduce(x, dst=2)
    out["reduce_bf16_to_1"] = mp.reduce(data(r, (3,), ml_dtypes.bfloat16), dst=1)
    out["broadcast_none"] = mp.broadcast(data(r, (2, 3, 2), "float32") if r == 1 else None, src=1)
    out["broadcast_buffer"] = mp.broadcast(data(r, (5,), "int16"), src=3)
    out["all_gather_0"] = mp.all_gather(data(r, (2, 3)))
    out["all_gather_1"] = mp.all_gather(data(r, (2, 3)), axis=1)
    out["all_gather_bf16_last"] = mp.all_gather(data(r, (2, 2, 1), ml_dtypes.bfloat16), axis=-1)
    out["reduce_scatter_0"] = mp.reduce_scatter(data(r, (8, 3)))
    out["reduce_scatter_1_avg"] = mp.reduce_scatter(data(r, (3, 8), "float32"), op="avg", axis=1)
    out["reduce_scatter_bf16"] = mp.reduce_scatter(data(r, (2, 4), ml_dtypes.bfloat16), axis=1)
    out["gather_to_3"] = mp.gather(data(r, (3, 2)), dst=3)
    pieces = [data(j, (2, 2), "float32", 7) for j in range(WORLD)] if r == 0 else None
    out["scatter_from_0"] = mp.scatter(pieces, src=0)
    uneven = [data(r, (r + j, 2), salt=j) for j in range(WORLD)]  # rank r sends r+j rows to j
    out["all_to_all"] = mp.all_to_all(uneven)
    cubes = [data(r, (j + 1,) * (j % 3 + 1)) for j in range(WORLD)]  # shapes (1,), (2, 2), ...
    out["all_to_all_shapes"] = mp.all_to_all(cubes)
    splits = [(r + j) % 3 for j in range(WORLD)]
    out["all_to_all_single_uneven"] = mp.all_to_all_single(data(r, (sum(splits), 3)), splits)
    out["all_to_all_single_axis1"] = mp.all_to_all_single(data(r, (2, 8), "int32"), axis=1)
    out["all_reduce_0d_avg"] = mp.all_reduce(np.float32(r + 1), op="avg")
    out["broadcast_0d"] = mp.broadcast(np.int64(7) if r == 3 else None, src=3)
    mp.barrier()

    # floats whose sum depends on the order: small ones are reduced in group order
    noise = np.random.default_rng(100 + r).standard_normal((8, 8))
    out["ordered_sum_f64"] = mp.all_reduce(noise)
    out["ordered_avg_f32"] = mp.all_reduce(noise.astype(np.float32), op="avg")
    out["ordered_prod"] = mp.all_reduce(1 + noise[0] / 4, op="prod")
    out["ordered_reduce_to_1"] = mp.reduce(noise, dst=1)
    out["ordered_reduce_scatter"] = mp.reduce_scatter(noise, axis=1)
    out["ordered_max"] = mp.all_reduce(noise, op="max")

    # results of 1 MiB or more come from the MPI backend's buffer cache: results still
    # held, and views of dropped ones, must never be handed out again
    big = data(r, (1 << 18,), "float32")
    kept = [mp.all_reduce(big * k) for k in (1, 2)]
    mp.all_reduce(big)  # dropped at once: its buffer may be reused
    view = mp.all_gather(big[: 1 << 16])[::5]  # a 1 MiB result of which a view survives
    kept += [mp.all_reduce(big * 3), mp.all_gather(big[: 1 << 16] + 1)]
    out["cache_kept"], out["cache_view"] = kept, view

    # point to point: a ring, then two messages with one tag received in reverse order
    sent = mp.isend(data(r, (3, r + 1)), dst=(r + 1) % WORLD)  # rendezvous: not send first
    out["recv_ring"] = mp.recv(src=(r - 1) % WORLD)
    sent.wait()
    peer = r ^ 1
    first, second = mp.irecv(peer, tag=5), mp.irecv(peer, tag=5)
    other = mp.irecv(peer, tag=9)
    mp.isend(data(r, (2,), "float32", 1), dst=peer, tag=5)
    mp.isend(data(r, (4,), ml_dtypes.bfloat16, 2), dst=peer, tag=9)
    mp.isend(data(r, (3,), "float32", 2), dst=peer, tag=5).wait()
    out["irecv_second"], out["irecv_first"] = second.wait(), first.wait()
    out["irecv_other_tag"] = other.wait()

    # all-reduce algorithms built from send/recv
    out["ring_all_reduce"] = ring_all_reduce(data(r, (3, 4), salt=6))
    out["halving_doubling"] = halving_doubling_all_reduce(data(r, (10,), "float32", 8))

    # subgroups made with new_group (not collective), and async with compute overlapped
    pair = mp.new_group([r % 2, r % 2 + 2], name="pairs")
    out["pair_all_reduce"] = mp.all_reduce(data(r, (4,)), group=pair)
    out["pair_all_gather"] = mp.all_gather(data(r, (2,), "int64"), group=pair)
    out["ordered_pair_sum"] = mp.all_reduce(noise, group=pair)  # MPI's own reduction
    evens = mp.new_group([0, 2])
    if r in evens:
        out["evens_bf16"] = mp.all_reduce(data(r, (6,), ml_dtypes.bfloat16), group=evens)
        out["evens_broadcast"] = mp.broadcast(data(r, (2,)) if r == 2 else None, src=2,
                                              group=evens)
    work = mp.all_reduce(data(r, (1024,)), async_op=True)
    ctx.compute(5e8, name="overlapped")
    out["async_all_reduce"] = work.wait()

    # a two-stage collective still in flight while its rank waits in a receive that
    # another rank sends only after that collective has finished there
    pending = mp.broadcast(data(r, (3,)) if r == 0 else None, src=0, async_op=True)
    if r == 0:
        out["recv_while_bcast"] = mp.recv(src=1, tag=3)
    if r == 1:
        pending.wait()
        mp.send(data(r, (1000,), salt=4), dst=0, tag=3)
    out["broadcast_async"] = pending.wait()
    pending = mp.all_to_all([data(r, (j + 1,)) for j in range(WORLD)], async_op=True)
    if r == 2:
        out["recv_while_a2a"] = mp.recv(src=3)
    if r == 3:
        pending.wait()
        mp.send(data(r, (5,)), dst=2)
    out["all_to_all_async"] = pending.wait()

    # collectives of different groups in flight at once: rank 0 blocks in a world
    # all_reduce while rank 2 waits for the second stage of rank 0's pair broadcast
    pending = mp.broadcast(data(r, (2, 2)) if r < 2 else None, src=r % 2, group=pair,
                           async_op=True)
    if r >= 2:
        out["pair_broadcast_first"] = pending.wait()
    out["world_while_pair_pending"] = mp.all_reduce(data(r, (3,), salt=11))
    out["pair_broadcast"] = pending.wait()
    return out


def flatten(result: dict, ctx) -> dict[str, np.ndarray]:
    """Named arrays for np.savez: lists become name/0, name/1, ...; None is left out; dtypes
    NumPy cannot store (bfloat16) become their bits; then the clock and the trace."""
    flat: dict[str, np.ndarray] = {}

    def put(name: str, value) -> None:
        if value is None:
            return
        if isinstance(value, list):
            for i, v in enumerate(value):
                put(f"{name}/{i}", v)
            return
        a = np.asarray(value)
        flat[f"dtype:{name}"] = np.array(str(a.dtype))
        flat[name] = a.view(f"u{a.itemsize}") if a.dtype.kind == "V" else a  # bfloat16: bits

    for name, value in result.items():
        put(name, value)
    c = ctx.clock
    flat["clock"] = np.array([c.compute, c.comm, c.p2p, c.elapsed()])
    ev = ctx.trace.events
    flat["trace_names"] = np.array([f"{e.stream}:{e.name}" for e in ev])
    flat["trace_times"] = np.array([[e.start, e.end] for e in ev]).reshape(-1, 2)
    flat["trace_bytes"] = np.array([[e.nbytes, e.meta.get("sent_bytes", 0)] for e in ev],
                                   dtype=np.float64).reshape(-1, 2)
    flat["ledger_peak"] = np.array(ctx.ledger.peak())
    return flat


def run(backend: str) -> dict[int, dict[str, np.ndarray]]:
    """rank -> flattened results, for the ranks this process runs (all four on sim)."""
    res = mp.launch(program, WORLD, topology=mp.Topology.nodes(2, gpus_per_node=2),
                    backend=backend)
    return {ctx.rank: flatten(out, ctx) for out, ctx in zip(res, res.contexts)}


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ("sim", "mpi"):
        sys.exit(f"usage: {argv[0]} sim|mpi OUT_DIR")
    os.makedirs(argv[2], exist_ok=True)
    for rank, flat in run(argv[1]).items():
        np.savez(os.path.join(argv[2], f"rank{rank}.npz"), **flat)


if __name__ == "__main__":
    main(sys.argv)
