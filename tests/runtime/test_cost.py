"""The cost model (runtime/cost.py) against numbers worked out by hand.

Every expected value is written as literal arithmetic from the formula in the module
docstring, with the preset links' published figures:
    NVLink 4   B = 450e9 bytes/s per direction, a = 1e-6 s
    IB NDR400  B = 50e9 bytes/s per direction,  a = 5e-6 s
so a reader can check each line on paper. Nothing here computes an expectation by
calling the function under test.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.runtime import cost
from minipar.runtime.cost import (Cost, algbw, barrier_time, busbw, bytes_sent, chain_time,
                                  collective_cost, halving_doubling_all_reduce_time, p2p_time,
                                  ring_all_reduce_time, ring_gather_like_time,
                                  tree_all_reduce_time)
from minipar.runtime.topology import Link, Topology

GB = 1e9
NV = Link.nvlink4()
IB = Link.infiniband_ndr()
ONE_NODE_8 = Topology.nodes(1, 8)
TWO_NODES_OF_4 = Topology.nodes(2, 4)
TWO_NODES_OF_2 = Topology.nodes(2, 2)


def exactly(x):
    """Equal up to floating-point rounding of the same arithmetic in another order."""
    return pytest.approx(x, rel=1e-12, abs=1e-18)


# ---- links --------------------------------------------------------------------------
def test_link_presets_use_published_per_direction_figures():
    def figures(link):
        return pytest.approx((link.bandwidth, link.latency), rel=1e-12)

    assert (450e9, 1e-6) == figures(NV)
    assert (300e9, 1e-6) == figures(Link.nvlink3())
    assert (50e9, 5e-6) == figures(IB)
    assert (25e9, 5e-6) == figures(Link.infiniband_hdr())
    assert (12.5e9, 10e-6) == figures(Link.ethernet_100g())


def test_link_time_and_p2p_are_alpha_plus_v_over_b():
    assert NV.time(1e6) == exactly(1e-6 + 1e6 / 450e9)
    assert p2p_time(1e6, NV) == exactly(1e-6 + 1e6 / 450e9)
    assert p2p_time(1e6, IB) == exactly(5e-6 + 1e6 / 50e9)
    assert p2p_time(0, IB) == exactly(5e-6)


def test_topology_link_between_two_ranks():
    assert TWO_NODES_OF_4.link(0, 3) == NV
    assert TWO_NODES_OF_4.link(3, 4) == IB
    assert TWO_NODES_OF_4.node_of(3) == 0 and TWO_NODES_OF_4.node_of(4) == 1


# ---- all_reduce -----------------------------------------------------------------------
def test_ring_all_reduce_1GB_over_8_ranks_on_nvlink4():
    expected = 2 * 7 * 1e-6 + 2 * 7 / 8 * 1e9 / 450e9  # = 3.902888... ms
    assert ring_all_reduce_time(1 * GB, 8, NV) == exactly(expected)
    c = collective_cost("all_reduce", 1 * GB, range(8), ONE_NODE_8, "ring")
    assert c.seconds == exactly(expected)
    assert (c.algorithm, c.link, c.formula) == ("ring", "NVLink4", "2(n-1)a + 2(n-1)/n*S/B")
    assert c.seconds == exactly(0.0039028888888888889)


def test_auto_inside_one_node_is_the_ring():
    c = collective_cost("all_reduce", 1 * GB, range(8), ONE_NODE_8)
    assert c.algorithm == "ring" and c.link == "NVLink4"
    assert c.seconds == exactly(2 * 7 * 1e-6 + 2 * 7 / 8 * 1e9 / 450e9)


def test_halving_doubling_all_reduce():
    expected = 2 * 3 * 1e-6 + 2 * 7 / 8 * 1e9 / 450e9  # log2(8) = 3
    assert halving_doubling_all_reduce_time(1 * GB, 8, NV) == exactly(expected)
    c = collective_cost("all_reduce", 1 * GB, range(8), ONE_NODE_8, "halving_doubling")
    assert c.seconds == exactly(expected) and c.algorithm == "halving_doubling"
    # two ranks: one halving step, one doubling step
    assert halving_doubling_all_reduce_time(1e6, 2, NV) == exactly(2 * 1 * 1e-6 + 1e6 / 450e9)


def test_tree_all_reduce():
    # 2 ceil(log2 n) (a + S/B): n = 8 -> 3 levels, n = 5 -> also 3 levels
    assert tree_all_reduce_time(1 * GB, 8, NV) == exactly(2 * 3 * (1e-6 + 1e9 / 450e9))
    assert tree_all_reduce_time(1 * GB, 5, NV) == exactly(2 * 3 * (1e-6 + 1e9 / 450e9))
    assert tree_all_reduce_time(1 * GB, 2, NV) == exactly(2 * 1 * (1e-6 + 1e9 / 450e9))
    c = collective_cost("all_reduce", 1 * GB, range(8), ONE_NODE_8, "tree")
    assert c.seconds == exactly(2 * 3 * (1e-6 + 1e9 / 450e9)) and c.algorithm == "tree"


def test_hierarchical_is_chosen_for_a_group_spanning_two_nodes_of_four():
    S = 1 * GB
    c = collective_cost("all_reduce", S, range(8), TWO_NODES_OF_4)
    rs_intra = 3 * 1e-6 + 3 / 4 * 1e9 / 450e9  # ring reduce-scatter inside a node of m = 4
    ar_inter = 2 * 1 * 5e-6 + 2 * 1 / 2 * (1e9 / 4) / 50e9  # ring all_reduce of S/4, k = 2
    ag_intra = 3 * 1e-6 + 3 / 4 * 1e9 / 450e9
    assert c.algorithm == "hierarchical"
    assert c.link == "NVLink4+IB-NDR400"
    assert c.seconds == exactly(rs_intra + ar_inter + ag_intra)
    assert c.seconds == exactly(0.0083493333333333333)
    # ...and it beats a flat ring, which would run every step on InfiniBand
    flat = collective_cost("all_reduce", S, range(8), TWO_NODES_OF_4, "ring")
    assert flat.seconds == exactly(2 * 7 * 5e-6 + 2 * 7 / 8 * 1e9 / 50e9)
    assert c.seconds < flat.seconds / 4


def test_hierarchical_all_gather_and_reduce_scatter():
    S = 1 * GB  # the whole gathered output / the whole reduce-scatter input
    expected = (1 * 5e-6 + 1 / 2 * (1e9 / 4) / 50e9) + (3 * 1e-6 + 3 / 4 * 1e9 / 450e9)
    for kind in ("all_gather", "reduce_scatter"):
        c = collective_cost(kind, S, range(8), TWO_NODES_OF_4)
        assert c.algorithm == "hierarchical"
        assert c.seconds == exactly(expected)


def test_one_rank_per_node_has_nothing_to_do_inside_a_node_so_auto_picks_the_ring():
    c = collective_cost("all_reduce", 1 * GB, [0, 4], TWO_NODES_OF_4)
    assert c.algorithm == "ring" and c.link == "IB-NDR400"
    assert c.seconds == exactly(2 * 1 * 5e-6 + 2 * 1 / 2 * 1e9 / 50e9)


def test_slowest_link_rule():
    # two neighbouring ranks on different nodes: every ring step crosses InfiniBand
    c = collective_cost("all_reduce", 1e6, [3, 4], TWO_NODES_OF_4, "ring")
    assert c.link == "IB-NDR400"
    assert c.seconds == exactly(2 * 1 * 5e-6 + 2 * 1 / 2 * 1e6 / 50e9)
    # the same pair inside one node runs on NVLink
    c = collective_cost("all_reduce", 1e6, [2, 3], TWO_NODES_OF_4, "ring")
    assert c.link == "NVLink4"
    assert c.seconds == exactly(2 * 1 * 1e-6 + 2 * 1 / 2 * 1e6 / 450e9)
    # an uneven spread (3 ranks on node 0, 1 on node 1) cannot go hierarchical: flat ring on IB
    c = collective_cost("all_reduce", 1e6, [0, 1, 2, 4], TWO_NODES_OF_4)
    assert (c.algorithm, c.link) == ("ring", "IB-NDR400")
    assert c.seconds == exactly(2 * 3 * 5e-6 + 2 * 3 / 4 * 1e6 / 50e9)
    assert TWO_NODES_OF_4.slowest_link([0, 1, 2, 3]) == NV
    assert TWO_NODES_OF_4.slowest_link([0, 7]) == IB


# ---- the other collectives ------------------------------------------------------------
def test_ring_all_gather_and_reduce_scatter():
    expected = 7 * 1e-6 + 7 / 8 * 1e9 / 450e9
    assert ring_gather_like_time(1 * GB, 8, NV) == exactly(expected)
    for kind in ("all_gather", "reduce_scatter"):
        c = collective_cost(kind, 1 * GB, range(8), ONE_NODE_8)
        assert (c.algorithm, c.link) == ("ring", "NVLink4")
        assert c.seconds == exactly(expected)
        assert c.formula == "(n-1)a + (n-1)/n*S/B"


def test_broadcast_and_reduce_are_a_pipelined_chain():
    expected = 7 * 1e-6 + 1e9 / 450e9
    assert chain_time(1 * GB, 8, NV) == exactly(expected)
    for kind in ("broadcast", "reduce"):
        c = collective_cost(kind, 1 * GB, range(8), ONE_NODE_8)
        assert c.seconds == exactly(expected) and c.formula == "(n-1)a + S/B"
    # across nodes: no hierarchical variant, the chain runs at InfiniBand speed
    c = collective_cost("broadcast", 1 * GB, range(8), TWO_NODES_OF_4)
    assert (c.algorithm, c.link) == ("ring", "IB-NDR400")
    assert c.seconds == exactly(7 * 5e-6 + 1e9 / 50e9)


def test_gather_and_scatter_are_limited_by_the_roots_link():
    for kind in ("gather", "scatter"):
        c = collective_cost(kind, 1 * GB, range(8), ONE_NODE_8)
        assert c.seconds == exactly(7 * 1e-6 + 7 / 8 * 1e9 / 450e9)


def test_barrier_is_a_dissemination_of_ceil_log2_n_steps():
    assert barrier_time(8, NV) == exactly(3 * 1e-6)
    assert barrier_time(5, NV) == exactly(3 * 1e-6)
    assert barrier_time(2, NV) == exactly(1 * 1e-6)
    assert collective_cost("barrier", 0.0, range(8), ONE_NODE_8).seconds == exactly(3 * 1e-6)
    assert collective_cost("barrier", 0.0, range(8), TWO_NODES_OF_4).seconds == exactly(3 * 5e-6)


def test_a_group_of_one_costs_nothing():
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                 "gather", "scatter", "barrier"):
        assert collective_cost(kind, 1 * GB, [3], ONE_NODE_8).seconds == 0.0
    assert collective_cost("all_to_all", 1 * GB, [3], ONE_NODE_8, traffic=[[1e9]]).seconds == 0.0
    assert ring_all_reduce_time(1e9, 1, NV) == 0.0
    assert tree_all_reduce_time(1e9, 1, NV) == 0.0


# ---- all_to_all -------------------------------------------------------------------------
MB = 1e6


def test_all_to_all_uniform_inside_a_node():
    topo = Topology.nodes(1, 4)
    traffic = [[0 if i == j else 1 * MB for j in range(4)] for i in range(4)]
    c = collective_cost("all_to_all", 4 * MB, range(4), topo, traffic=traffic)
    # every rank sends 3 MB and receives 3 MB over NVLink
    assert c.seconds == exactly(3 * 1e-6 + 3e6 / 450e9)
    assert c.formula == "(n-1)a + max_r max(intra_r/B_i, inter_r/B_e)"


def test_all_to_all_uneven_traffic_across_nodes_is_bound_by_the_busiest_nic():
    # ranks 0, 1 on node 0; ranks 2, 3 on node 1.  traffic[i][j] = bytes i sends to j
    T = [[0 * MB, 10 * MB, 1 * MB, 1 * MB],
         [10 * MB, 0 * MB, 1 * MB, 1 * MB],
         [20 * MB, 1 * MB, 0 * MB, 10 * MB],
         [20 * MB, 1 * MB, 10 * MB, 0 * MB]]
    # inter-node bytes per rank, sent / received:
    #   rank 0: 1+1 / 20+20 = 40 MB received   <- the busiest NIC
    #   rank 1: 1+1 / 1+1;  rank 2: 20+1 / 1+1;  rank 3: 20+1 / 1+1
    # intra-node bytes are at most 10 MB, 10e6/450e9 = 22 us, far below 40e6/50e9 = 800 us
    c = collective_cost("all_to_all", 0.0, range(4), TWO_NODES_OF_2, traffic=T)
    assert c.seconds == exactly(3 * 5e-6 + 40e6 / 50e9)
    # the self-piece on the diagonal never crosses a link
    T_diag = [row[:] for row in T]
    for i in range(4):
        T_diag[i][i] = 1 * GB
    assert collective_cost("all_to_all", 0.0, range(4), TWO_NODES_OF_2,
                           traffic=T_diag).seconds == exactly(3 * 5e-6 + 40e6 / 50e9)
    # all_to_all_single is the same collective
    assert collective_cost("all_to_all_single", 0.0, range(4), TWO_NODES_OF_2,
                           traffic=T).seconds == exactly(3 * 5e-6 + 40e6 / 50e9)


def test_all_to_all_where_nvlink_is_the_bottleneck():
    T = [[0, 1 * GB, 1 * MB, 1 * MB],
         [1 * MB, 0, 1 * MB, 1 * MB],
         [1 * MB, 1 * MB, 0, 1 * MB],
         [1 * MB, 1 * MB, 1 * MB, 0]]
    # rank 0 pushes 1 GB to rank 1 over NVLink: 1e9/450e9 = 2.2 ms > 2e6/50e9 = 40 us
    c = collective_cost("all_to_all", 0.0, range(4), TWO_NODES_OF_2, traffic=T)
    assert c.seconds == exactly(3 * 5e-6 + 1e9 / 450e9)


# ---- bandwidths ---------------------------------------------------------------------
def test_algbw_and_busbw_follow_nccl_tests():
    S, t = 1 * GB, 0.01
    assert algbw(S, t) == exactly(1e11)
    assert algbw(S, 0.0) == 0.0  # nothing took time (a group of one): no bandwidth to speak of
    assert busbw("all_reduce", S, t, 8) == exactly(1e11 * 2 * 7 / 8)
    for kind in ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_single",
                 "gather", "scatter"):
        assert busbw(kind, S, t, 8) == exactly(1e11 * 7 / 8), kind
    for kind in ("broadcast", "reduce", "send", "recv"):
        assert busbw(kind, S, t, 8) == exactly(1e11), kind


def test_busbw_of_a_latency_free_ring_is_the_link_bandwidth():
    """The reason busbw exists: with a = 0 it equals B whatever the collective and n."""
    free = Link("ideal", 100e9, 0.0)
    topo = Topology.nodes(1, 8, intra=free)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        for n in (2, 3, 8):
            t = collective_cost(kind, 1 * GB, range(n), topo).seconds
            assert busbw(kind, 1 * GB, t, n) == exactly(100e9), (kind, n)


# ---- bytes on the wire --------------------------------------------------------------
S = 1 * GB


def test_bytes_sent_ring_all_reduce_sums_to_2_n_minus_1_S():
    per_rank = [bytes_sent("all_reduce", "ring", S, 8, me) for me in range(8)]
    assert per_rank == [exactly(2 * 7 / 8 * 1e9)] * 8
    assert sum(per_rank) == exactly(2 * 7 * 1e9)
    hd = [bytes_sent("all_reduce", "halving_doubling", S, 8, me) for me in range(8)]
    assert hd == [exactly(2 * 7 / 8 * 1e9)] * 8


def test_bytes_sent_tree_all_reduce():
    # binomial tree over 8 (root 0): children 0->{1,2,4}, 2->{3}, 4->{5,6}, 6->{7};
    # each rank sends S up to its parent (reduce) and S down to each child (broadcast)
    per_rank = [bytes_sent("all_reduce", "tree", S, 8, me) for me in range(8)]
    assert per_rank == [3e9, 1e9, 2e9, 1e9, 3e9, 1e9, 2e9, 1e9]
    assert sum(per_rank) == 2 * 7 * 1e9
    # five ranks: 0->{1,2,4}, 2->{3}
    assert [bytes_sent("all_reduce", "tree", S, 5, me) for me in range(5)] == \
        [3e9, 1e9, 2e9, 1e9, 1e9]


def test_bytes_sent_gather_like_and_hierarchical():
    for kind in ("all_gather", "reduce_scatter"):
        per_rank = [bytes_sent(kind, "ring", S, 8, me) for me in range(8)]
        assert per_rank == [exactly(7 / 8 * 1e9)] * 8
        assert sum(per_rank) == exactly(7 * 1e9)
    # 2 nodes of m = 4: inside the node (m-1)/m*S per pass, across nodes (k-1)/k*S/m
    assert bytes_sent("all_reduce", "hierarchical", S, 8, 0, nodes=2) == \
        exactly(2 * 3 / 4 * 1e9 + 2 * 1 / 2 * 1e9 / 4)
    assert bytes_sent("all_gather", "hierarchical", S, 8, 5, nodes=2) == \
        exactly(3 / 4 * 1e9 + 1 / 2 * 1e9 / 4)
    assert bytes_sent("reduce_scatter", "hierarchical", S, 8, 5, nodes=2) == \
        exactly(3 / 4 * 1e9 + 1 / 2 * 1e9 / 4)
    # 4 nodes of m = 2
    assert bytes_sent("all_reduce", "hierarchical", S, 8, 3, nodes=4) == \
        exactly(2 * 1 / 2 * 1e9 + 2 * 3 / 4 * 1e9 / 2)


def test_bytes_sent_rooted_collectives():
    n, root = 4, 2
    # broadcast: a chain 2 -> 3 -> 0 -> 1; the last rank of the chain sends nothing
    assert [bytes_sent("broadcast", "ring", S, n, me, root) for me in range(n)] == \
        [1e9, 0.0, 1e9, 1e9]
    # reduce: a chain into the root; every rank but the root sends S
    assert [bytes_sent("reduce", "ring", S, n, me, root) for me in range(n)] == \
        [1e9, 1e9, 0.0, 1e9]
    # gather: every rank but the root sends its piece, S/n
    assert [bytes_sent("gather", "ring", S, n, me, root) for me in range(n)] == \
        [1e9 / 4, 1e9 / 4, 0.0, 1e9 / 4]
    # scatter: the root sends everyone else's piece
    assert [bytes_sent("scatter", "ring", S, n, me, root) for me in range(n)] == \
        [0.0, 0.0, 3 / 4 * 1e9, 0.0]


def test_bytes_sent_all_to_all_barrier_and_one_rank():
    assert bytes_sent("all_to_all", "ring", 36.0, 4, 1, traffic_row=[5, 7, 11, 13]) == 5 + 11 + 13
    assert bytes_sent("all_to_all_single", "ring", 36.0, 4, 0,
                      traffic_row=[5, 7, 11, 13]) == 7 + 11 + 13
    assert bytes_sent("barrier", "ring", 0.0, 8, 3) == 0.0
    assert bytes_sent("all_reduce", "ring", S, 1, 0) == 0.0


@pytest.mark.timeout(20)
def test_trace_bytes_sent_of_a_ring_all_reduce_sum_to_2_n_minus_1_S():
    x_bytes = 8 * 1000

    def prog(ctx):
        mp.all_reduce(np.ones(1000))

    res = mp.launch(prog, 4)
    sent = [c.trace.bytes_sent() for c in res.contexts]
    assert sent == [exactly(2 * 3 / 4 * 8000)] * 4
    assert sum(sent) == exactly(2 * 3 * x_bytes)


# ---- refused algorithms -------------------------------------------------------------
def test_halving_doubling_needs_a_power_of_two():
    with pytest.raises(ValueError, match=r"halving_doubling needs a power-of-two group, got n=3"):
        collective_cost("all_reduce", 1e6, range(3), ONE_NODE_8, "halving_doubling")


def test_hierarchical_needs_an_even_spread_over_nodes():
    with pytest.raises(ValueError) as info:
        collective_cost("all_reduce", 1e6, [0, 1, 2, 4], TWO_NODES_OF_4, "hierarchical")
    msg = str(info.value)
    assert "hierarchical all_reduce needs the same number of ranks on every node" in msg
    assert "[0, 1, 2, 4]" in msg and "nodes of 4" in msg


def test_other_impossible_choices_are_named():
    with pytest.raises(ValueError, match=r"unknown algorithm 'butterfly'"):
        collective_cost("all_reduce", 1e6, range(4), ONE_NODE_8, "butterfly")
    with pytest.raises(ValueError, match=r"all_gather has only the ring .* not 'tree'"):
        collective_cost("all_gather", 1e6, range(4), ONE_NODE_8, "tree")
    with pytest.raises(ValueError, match=r"no hierarchical algorithm for broadcast"):
        collective_cost("broadcast", 1e6, range(8), TWO_NODES_OF_4, "hierarchical")
    with pytest.raises(ValueError, match=r"no cost formula for collective 'allreduce'"):
        collective_cost("allreduce", 1e6, range(4), ONE_NODE_8)


@pytest.mark.timeout(20)
def test_a_launch_wide_preference_applies_where_it_fits():
    def prog(ctx):
        mp.all_reduce(np.ones(4))
        mp.broadcast(np.ones(4), src=0)
        return [e.meta["algorithm"] for e in ctx.trace.of("comm")]

    # n = 4: all_reduce runs halving-doubling; broadcast has only its chain
    assert mp.launch(prog, 4, algorithm="halving_doubling")[0] == ["halving_doubling", "ring"]
    # n = 3 is no power of two: all_reduce falls back to what "auto" chooses
    assert mp.launch(prog, 3, algorithm="halving_doubling")[0] == ["ring", "ring"]
    with pytest.raises(ValueError, match=r"unknown algorithm 'butterfly'"):
        mp.launch(prog, 2, algorithm="butterfly")


def test_cost_is_a_plain_record():
    c = collective_cost("all_reduce", 1e6, range(2), ONE_NODE_8)
    assert isinstance(c, Cost)
    assert cost.ALGORITHMS == ("auto", "ring", "tree", "halving_doubling", "hierarchical")
