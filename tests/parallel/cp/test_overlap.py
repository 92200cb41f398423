"""When the ring's K/V send hides behind the block compute: the clock agrees with
costs.ring_hidden_length, over NVLink (one node) and over InfiniBand (one rank a node).

The crossover on an H100 sits at thousands of tokens a chunk, too long to multiply here, so
the clock is checked on a slowed device (a peak of 2 GFLOP/s in float64) with the real
links: from the formula's s on, every zigzag rank's compute stream runs without a gap in
the forward; one chunk row shorter, each step waits for its send, and the forward takes
(cp − 1)·T_send + T_block. The H100 figures are then the same formula at the H100's peak.
"""

import pytest

from minipar.parallel.cp import (ring_attention_backward, ring_attention_forward,
                                 ring_hidden_length)
from minipar.runtime.device import DeviceSpec
from minipar.runtime.topology import Link, Topology

SLOW = DeviceSpec("slow", {"float64": 2e9}, 10**12)
B, HEADS, D = 1, 2, 4  # h = 8


def forward_gaps(cpkit, s, cp, topology):
    """Per rank: (the forward's compute-stream idle time, its span, one block's time)."""
    qkv, dctx = cpkit.inputs(s, B, HEADS, D, 0)
    run = cpkit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, HEADS, cp,
                       "zigzag", topology=topology)
    out = []
    for ctx, mark in zip(run.result.contexts, run.marks):
        compute = [e for e in ctx.trace.events[:mark] if e.stream == "compute"]
        span = max(e.end for e in compute) - min(e.start for e in compute)
        busy = sum(e.duration for e in compute)
        out.append((span - busy, span, busy / cp))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("where", ["NVLink", "InfiniBand"])
def test_the_send_hides_from_the_formulas_length_on(cpkit, cp, where):
    topo = (Topology.nodes(1, cp, device=SLOW) if where == "NVLink"
            else Topology.nodes(cp, 1, device=SLOW))
    link = Link.nvlink4() if where == "NVLink" else Link.infiniband_ndr()
    s = ring_hidden_length(B, HEADS * D, cp, 8, SLOW.peak("float64"), link)
    assert s % (2 * cp) == 0 and s > 2 * cp
    for idle, span, block in forward_gaps(cpkit, s, cp, topo):
        assert idle == pytest.approx(0.0, abs=1e-12 * span)  # hidden: no gap
    shorter = s - 2 * cp  # one token less in every chunk
    c = shorter // (2 * cp)
    send = link.time(4 * c * B * HEADS * D * 8)  # this rank's K and V, float64
    for idle, span, block in forward_gaps(cpkit, shorter, cp, topo):
        assert idle > 0  # every step waits for its block
        assert span == pytest.approx((cp - 1) * send + block, rel=1e-9)


def test_the_h100_lengths_and_what_they_depend_on():
    """At 989 TFLOP/s bf16 the root is ~F·e/2B tokens a chunk: 2.2k on NVLink 4, 19.8k on
    InfiniBand NDR, s = 2·cp times that; latency matters only for small b·h."""
    h100 = DeviceSpec.h100_sxm().peak("bfloat16")
    nv = ring_hidden_length(1, 8192, 8, 2, h100, Link.nvlink4())
    ib = ring_hidden_length(1, 8192, 8, 2, h100, Link.infiniband_ndr())
    assert nv == 16 * 2205 and ib == 16 * 19784
    for link in (Link.nvlink4(), Link.infiniband_ndr()):
        c = h100 * 2 / (2 * link.bandwidth)  # alpha -> 0
        assert ring_hidden_length(64, 16384, 4, 2, h100, link) / 8 == pytest.approx(c, rel=1e-3)
    assert ring_hidden_length(1, 8192, 4, 2, h100, Link.nvlink4()) == 8 * 2205  # linear in cp
    with pytest.raises(ValueError, match="must be >= 1"):
        ring_hidden_length(0, 8192, 4, 2, h100, Link.nvlink4())
