"""Lesson 01 — collectives: ring reduce-scatter, all-gather and all-reduce from send/recv,
and the bus bandwidth of a measurement.

Every function here is an SPMD function: each rank of `group` calls it with its own input,
as it would call `torch.distributed.all_reduce`. `group=None` means the whole world.

Chunks. A rank's x is flattened and cut into n chunks with np.array_split(x.reshape(-1), n):
when n divides x.size they are the n equal chunks of minipar's (and torch's)
reduce_scatter; when it does not, the first x.size % n chunks are one element longer (and
chunks may be empty when x.size < n). NCCL's ring does the same: an all-reduce works on any
number of elements, only reduce_scatter's contract asks for equal pieces. So
ring_reduce_scatter equals mp.reduce_scatter whenever n divides x.size, and
ring_all_reduce works for every size.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import minipar as mp


def ring_neighbours(group: Optional[mp.ProcessGroup] = None) -> tuple[int, int, int, int]:
    """(me, n, right, left): this rank's position in the group, the group's size, and the
    GLOBAL ranks of the next (me + 1) and previous (me - 1) members around the ring.

    send/recv take global ranks, as in torch.distributed; a group's ranks are sorted, and
    a member's position is its index there (mp.get_rank(group))."""
    n, me = mp.get_world_size(group), mp.get_rank(group)
    ranks = list(range(n)) if group is None else list(group.ranks)
    return me, n, ranks[(me + 1) % n], ranks[(me - 1) % n]


def ring_reduce_scatter(x, group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """out_r = chunk r of (x_0 + x_1 + ... + x_{n-1}).reshape(-1), from send/recv only.

    x: this rank's array, any shape; it is flattened and cut into n chunks as
    np.array_split(x.reshape(-1), n) (equal chunks when n divides x.size). n - 1 steps:
    at each, send one chunk to the right neighbour, receive one from the left and add it.
    Each rank sends (n-1)/n * x.nbytes bytes. Returns a new 1-D array.
    """
    # BEGIN SOLUTION Exercise 1.1: ring reduce-scatter from send/recv — see lesson.py, section 3
    me, n, right, left = ring_neighbours(group)
    chunks = [c.copy() for c in np.array_split(np.asarray(x).reshape(-1), n)]  # n x [~size/n]
    for s in range(n - 1):
        # chunk c starts at rank c + 1 and travels right; it is complete when it reaches c
        send_c, recv_c = (me - s - 1) % n, (me - s - 2) % n
        work = mp.isend(chunks[send_c], right, group=group)
        got = mp.recv(left, group=group)  # the partial sum of chunk recv_c so far
        work.wait()
        chunks[recv_c] = got + chunks[recv_c]
    return chunks[me]
    # END SOLUTION


def ring_all_gather(chunk, group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """out = concat(chunk_0, chunk_1, ..., chunk_{n-1}) along axis 0, from send/recv only.

    chunk: this rank's array (chunks may differ in length along axis 0, as the chunks of
    np.array_split do). n - 1 steps: send the chunk you received last to the right
    neighbour, receive the next from the left. Each rank sends (n-1)/n of the output's
    bytes (when the chunks are equal). Returns a new array.
    """
    # BEGIN SOLUTION Exercise 1.2: ring all-gather from send/recv — see lesson.py, section 3
    me, n, right, left = ring_neighbours(group)
    chunks: list[Optional[np.ndarray]] = [None] * n  # chunks[c]: group rank c's chunk
    chunks[me] = np.array(chunk, copy=True)
    for s in range(n - 1):
        send_c, recv_c = (me - s) % n, (me - s - 1) % n
        work = mp.isend(chunks[send_c], right, group=group)
        chunks[recv_c] = mp.recv(left, group=group)
        work.wait()
    return np.concatenate(chunks, axis=0)
    # END SOLUTION


def ring_all_reduce(x, group: Optional[mp.ProcessGroup] = None) -> np.ndarray:
    """out = x_0 + x_1 + ... + x_{n-1} on every rank: ring reduce-scatter, then ring
    all-gather (Exercises 1.1 and 1.2).

    x: this rank's array, any shape; the result has x's shape and dtype. 2(n-1) steps of
    about x.nbytes / n bytes: each rank sends 2(n-1)/n * x.nbytes bytes.
    """
    # BEGIN SOLUTION Exercise 1.3: ring all-reduce as reduce-scatter + all-gather — see lesson.py, section 3
    x = np.asarray(x)
    mine = ring_reduce_scatter(x, group)  # [~x.size / n]: my chunk of the sum
    return ring_all_gather(mine, group).reshape(x.shape)  # every chunk, in group order
    # END SOLUTION


def bus_bandwidth(kind: str, nbytes: float, seconds: float, n: int) -> float:
    """busbw of a collective that moved `nbytes` in `seconds` over n ranks, as nccl-tests
    defines it from algbw (lesson.py, section 5).

    kind: "all_reduce", "all_gather" or "reduce_scatter". nbytes: the collective's size S
    as nccl-tests counts it (the all-reduce buffer, the whole all-gather output, the whole
    reduce-scatter input). n: ranks. Returns bytes per second.
    """
    # BEGIN SOLUTION Exercise 1.4: bus bandwidth from algorithm bandwidth — see lesson.py, section 5
    algbw = nbytes / seconds
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
              "reduce_scatter": (n - 1) / n}[kind]
    return algbw * factor
    # END SOLUTION


def all_reduce_across_nodes(grad, topology: mp.Topology) -> np.ndarray:
    """out = grad_0 + grad_1 + ... + grad_{N-1} on every rank of the world (N =
    topology.world_size ranks, rank r on node r // topology.gpus_per_node), within the
    budget of lesson.py, section 6: 55 us on 2 nodes of 4 GPUs for a 4 MiB bucket, with
    every collective run as one flat ring (`launch(..., algorithm="ring")`).

    grad: this rank's bucket, 1-D, of any length; leave it as it is. Any collectives on
    any groups you make (mp.new_group), your rings of Exercises 1.1-1.3, or several in
    flight at once (async_op=True). Returns a new array of grad's shape and dtype.
    """
    # BEGIN SOLUTION Exercise 1.5: an all-reduce across nodes within the budget — see lesson.py, section 6
    m = topology.gpus_per_node
    node, local = divmod(mp.get_rank(), m)
    in_node = mp.new_group(range(node * m, (node + 1) * m), name="node")  # NVLink
    across = mp.new_group(range(local, topology.world_size, m), name="across")  # one per node
    flat = np.asarray(grad).reshape(-1)
    padded = np.concatenate([flat, np.zeros((-flat.size) % m, flat.dtype)])  # [m * ceil(len/m)]
    shard = mp.reduce_scatter(padded, group=in_node)  # [len/m]: my shard, summed in my node
    shard = mp.all_reduce(shard, group=across)  # [len/m]: summed over the nodes, 1/m over IB
    out = mp.all_gather(shard, group=in_node)  # [m * ceil(len/m)]: every shard, in my node
    return out[: flat.size].reshape(np.shape(grad))
    # END SOLUTION
