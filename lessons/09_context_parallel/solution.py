"""Lesson 09 — Context parallelism: the exercises' answers.

Exercise 9.1 merges two partial attentions over disjoint keys, each given by its output
and its log-sum-exp, into the attention over all their keys, without overflowing where
the answer is finite. Exercise 9.2 says which global positions a rank of the zigzag layout
holds, and the kind of every (query chunk, key chunk) pair a rank meets at a ring step.
Exercise 9.3 prices context parallelism for one rank and one layer: the bytes ring
attention and DeepSpeed-Ulysses send, one zigzag ring step's compute and send time, and
whether the send hides behind the compute.
"""

from __future__ import annotations

import numpy as np


def merge_partials(out1: np.ndarray, lse1: np.ndarray, out2: np.ndarray, lse2: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of attention over the union of two disjoint key blocks (section 2).

    out1, out2: [..., m, d], each block's softmax-weighted values for m queries;
    lse1, lse2: [..., m], each block's log Σ_j exp(score_j) over its keys. Returns out
    [..., m, d] = (e^lse1 · out1 + e^lse2 · out2) / (e^lse1 + e^lse2) and lse [..., m] =
    log(e^lse1 + e^lse2), finite for any finite inputs (scores of 1000, or lse1 and lse2
    hundreds apart). New arrays; the inputs are left as they are.
    """
    # BEGIN SOLUTION Exercise 9.1: the log-sum-exp merge — see lesson.py, section 2
    x = lse2 - lse1  # x: [..., m]
    small = np.exp(-np.abs(x))  # <= 1: never overflows
    w2 = np.where(x >= 0, 1.0 / (1.0 + small), small / (1.0 + small))  # block 2: sigmoid(x)
    out = out1 - w2[..., None] * (out1 - out2)  # out: [..., m, d]
    lse = np.maximum(lse1, lse2) + np.log1p(small)  # log(e^lse1 + e^lse2)
    return out, lse
    # END SOLUTION


def zigzag_positions(rank: int, cp: int, s: int) -> np.ndarray:
    """The global token positions rank `rank` holds under the zigzag layout (section 4).

    The sequence of s tokens (a multiple of 2·cp) is cut into 2·cp chunks of c = s/(2·cp)
    tokens; rank r holds chunk r and chunk 2·cp − 1 − r, in that order. Returns an int
    array [s/cp]: chunk r's positions, then the other chunk's.
    """
    # BEGIN SOLUTION Exercise 9.2: the zigzag layout and a ring step's chunk pairs — see lesson.py, section 4
    c = s // (2 * cp)  # tokens a chunk
    first, second = rank, 2 * cp - 1 - rank  # an early chunk and its mirror image
    return np.concatenate([np.arange(first * c, (first + 1) * c),
                           np.arange(second * c, (second + 1) * c)])  # [s/cp]
    # END SOLUTION


def step_pairs(layout: str, rank: int, step: int, cp: int) -> dict:
    """The kind of every (query chunk, key chunk) pair rank `rank` meets at ring step
    `step` (sections 3 and 4).

    layout: "contiguous" (rank r holds chunk r of cp) or "zigzag" (chunks r and 2·cp−1−r
    of 2·cp). At step t the K/V blocks have moved t places around the ring (rank i sends
    to i + 1), so the rank holds the keys of rank (rank − t) mod cp. Returns a dict over
    every pair (i, j) of one of this rank's chunks i and one of the source's chunks j
    (global chunk indices): "full" if j < i, "diagonal" if j == i, "masked" if j > i.
    """
    # BEGIN SOLUTION Exercise 9.2: the zigzag layout and a ring step's chunk pairs — see lesson.py, section 4
    src = (rank - step) % cp  # whose K/V arrived here after `step` moves

    def held(r: int) -> tuple:
        return (r,) if layout == "contiguous" else (r, 2 * cp - 1 - r)

    return {(i, j): "full" if j < i else "diagonal" if j == i else "masked"
            for i in held(rank) for j in held(src)}
    # END SOLUTION


def cp_costs(s: int, b: int, num_heads: int, head_dim: int, cp: int, itemsize: int,
             peak_flops: float, link) -> dict:
    """What context parallelism costs one rank in one attention layer (sections 5 and 6).

    s tokens (a multiple of 2·cp), b sequences, h = num_heads · head_dim, cp >= 2 ranks,
    q, k, v of `itemsize` bytes an element (2 for bf16); gradient accumulators of 4 bytes
    (float32) when itemsize is 2, else `itemsize`. peak_flops: the device's FLOP/s;
    link: the link between ring neighbours (link.latency in seconds, link.bandwidth in
    bytes/s). Returns a dict:

        ring_forward, ring_backward      bytes one rank sends (ring attention)
        ulysses_forward, ulysses_backward  bytes one rank sends (DeepSpeed-Ulysses), or
                                         None when cp does not divide num_heads
        step_compute   seconds of one zigzag ring step's forward block: 2 chunk-pair units
                       (the causal half of its 2 x 2 chunks), 2 matmuls a unit of
                       2·b·num_heads·c²·head_dim FLOPs, c = s/(2·cp), at peak_flops
        step_send      seconds of one K/V send to the next rank: latency + bytes/bandwidth
        ring_hidden    True when step_compute >= step_send (s is then at least
                       parallel/cp's ring_hidden_length)
    """
    # BEGIN SOLUTION Exercise 9.3: a rank's bytes and the send that hides — see lesson.py, section 5
    h = num_heads * head_dim
    grad_itemsize = 4 if itemsize == 2 else itemsize
    shard = 2 * (s // cp) * b * h  # K and V of one rank: 2(s/cp)bh elements
    ring_forward = (cp - 1) * shard * itemsize  # cp - 1 K/V sends
    ring_backward = ring_forward + cp * shard * grad_itemsize  # K/V again, and dK/dV cp times
    if num_heads % cp:
        ulysses = None  # the heads are what Ulysses splits
    else:
        ulysses = 4 * (s // cp) * b * h * itemsize * (cp - 1) / cp  # 4 tensors, 1/cp kept
    c = s // (2 * cp)
    step_compute = 2 * 2 * (2 * b * num_heads * c * c * head_dim) / peak_flops
    step_send = link.latency + shard * itemsize / link.bandwidth
    return {"ring_forward": ring_forward, "ring_backward": ring_backward,
            "ulysses_forward": ulysses, "ulysses_backward": ulysses,
            "step_compute": step_compute, "step_send": step_send,
            "ring_hidden": step_compute >= step_send}
    # END SOLUTION
