"""The placement check: its figures are the cost model's (and the simulated run's), its
findings name incident A's layouts and a cheaper order, and parallelize warns, refuses or
runs as `placement` says."""

import warnings

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import (ParallelDims, PlacementWarning, check_placement, parallelize,
                              step_comm)
from minipar.runtime import Topology
from minipar.runtime.cost import collective_cost, p2p_time

TWO_NODES = Topology.nodes(2, 4)
CFG = GPTConfig(vocab_size=64, seq_len=32, hidden=64, num_heads=8, num_layers=2,
                dtype="bfloat16")


def kinds(findings):
    return [f.kind for f in findings]


def test_incident_a_layouts_each_get_their_finding():
    """tp = 8 over two nodes of 4: larger than a node; tp = 4 with dp fastest: across nodes,
    and the default order is cheaper; tp = 4 in a node: nothing to say."""
    big = check_placement(ParallelDims(tp=8), TWO_NODES, CFG)
    assert kinds(big) == ["tp_larger_than_node"]
    assert big[0].alternative == "tp=4" and big[0].nodes == 2
    across = check_placement(ParallelDims(dp_replicate=2, tp=4, order="dp-tp"), TWO_NODES, CFG)
    assert kinds(across) == ["tp_across_nodes", "cheaper_order"]
    assert across[0].group == (1, 3, 5, 7) and across[0].alternative == "order='tp-cp-ep-dp-pp'"
    assert across[1].alternative == "order='tp-cp-ep-dp-pp'"
    assert check_placement(ParallelDims(dp_replicate=2, tp=4), TWO_NODES, CFG) == []
    assert check_placement(ParallelDims(tp=8), Topology.single_node(8), CFG) == []


def test_the_tp_figures_are_the_cost_models_all_reduces():
    """m · layers · 4 · t_AR([s, b, h]) on the group as laid out, and on ranks 0..tp-1."""
    b, m = 2, 3
    f = check_placement(ParallelDims(dp_replicate=2, tp=4, order="dp-tp"), TWO_NODES, CFG,
                        micro_batch=b, microbatches=m)[0]
    S = CFG.seq_len * b * CFG.hidden * 2  # bf16
    here = collective_cost("all_reduce", S, (1, 3, 5, 7), TWO_NODES)
    inside = collective_cost("all_reduce", S, (0, 1, 2, 3), TWO_NODES)
    assert here.algorithm == "hierarchical" and inside.link == "NVLink4"
    assert f.seconds == m * CFG.num_layers * 4 * here.seconds
    assert f.alternative_seconds == m * CFG.num_layers * 4 * inside.seconds
    assert f.ratio == pytest.approx(here.seconds / inside.seconds, rel=1e-12)
    assert f"{f.seconds * 1e6:,.1f} us" in f.message and "IB-NDR400" in f.message
    sp = check_placement(ParallelDims(dp_replicate=2, tp=4, order="dp-tp"), TWO_NODES, CFG,
                         sequence_parallel=True)[0]
    ag_rs = sum(collective_cost(k, S / b, (1, 3, 5, 7), TWO_NODES).seconds
                for k in ("all_gather", "reduce_scatter"))
    assert sp.seconds == CFG.num_layers * 4 * ag_rs
    assert "an all-gather + a reduce-scatter" in sp.message


def test_the_tp_figure_is_what_the_simulated_run_charges():
    """One forward and backward at tp = 8 over two nodes: the all-reduces of [s, b, h] on
    the tp group are 4 a block plus the embedding's (forward) and the vocabulary-parallel
    head's (backward), each lasting the cost model's time; the check counts the blocks'
    4 L."""
    cfg = CFG.with_(dtype="float64", num_layers=1)
    dims = ParallelDims(tp=8)
    S = cfg.seq_len * 1 * cfg.hidden * 8

    def program(ctx):
        run = parallelize(cfg, dims, placement="any", lr=1e-2)
        ids = np.zeros((cfg.seq_len, 1), dtype=np.int64)
        n = len(ctx.trace.events)
        run.forward_backward(ids, ids)
        ctx.resolve_pending()
        return [e.duration for e in ctx.trace.events[n:] if e.stream == "comm"
                and e.name == "all_reduce" and e.nbytes == S and e.label == "tp"]

    durations = mp.launch(program, 8, topology=TWO_NODES)[0]
    assert len(durations) == 4 * cfg.num_layers + 2
    f = check_placement(dims, TWO_NODES, cfg)[0]
    assert f.seconds == pytest.approx(4 * cfg.num_layers * durations[0], rel=1e-12)
    assert durations == pytest.approx([durations[0]] * len(durations), rel=1e-12)


def test_a_cheaper_order_follows_the_bytes():
    """dp_replicate = 4, pp = 2 on two nodes of 4. The default order puts dp inside the
    nodes and pp across: right when the gradients outweigh the activations (b = 1), and
    the check is silent; with 64 sequences a micro-batch the activations sent to the next
    stage outweigh them, and the check gives the order that puts pp inside, with the
    totals of step_comm."""
    dims = ParallelDims(dp_replicate=4, pp=2)
    cfg = CFG.with_(hidden=256, num_layers=8)
    assert check_placement(dims, TWO_NODES, cfg, microbatches=4) == []
    (f,) = check_placement(dims, TWO_NODES, cfg, micro_batch=64, microbatches=4)
    assert f.kind == "cheaper_order" and f.alternative == "order='pp-dp-tp-cp-ep'"
    mine = step_comm(dims, TWO_NODES, cfg, micro_batch=64, microbatches=4)
    best = step_comm(ParallelDims(dp_replicate=4, pp=2, order="pp-dp-tp-cp-ep"), TWO_NODES,
                     cfg, micro_batch=64, microbatches=4)
    assert (f.seconds, f.alternative_seconds) == (mine.total, best.total)
    assert best.total <= 0.9 * mine.total
    S = cfg.seq_len * 64 * cfg.hidden * 2
    assert mine.pp == 2 * 4 * p2p_time(S, TWO_NODES.inter)  # ranks 0..3 stage 0: across
    assert best.pp == 2 * 4 * p2p_time(S, TWO_NODES.intra)


def test_check_placement_refuses_what_it_cannot_price():
    with pytest.raises(ValueError, match="covers 4 ranks but the topology has 2 x 4 = 8"):
        check_placement(ParallelDims(tp=4), TWO_NODES, CFG)
    with pytest.raises(TypeError, match="pass its GPTConfig"):
        check_placement(ParallelDims(tp=8), TWO_NODES, object())
    with pytest.raises(ValueError, match="micro_batch=0"):
        check_placement(ParallelDims(tp=8), TWO_NODES, CFG, micro_batch=0)


def run_with(placement):
    """parallelize on incident A's 'placement alone' layout; (warnings, rank 0's error)."""
    cfg = CFG.with_(dtype="float64")

    def program(ctx):
        parallelize(cfg, ParallelDims(dp_replicate=2, tp=4, order="dp-tp"),
                    placement=placement, lr=1e-2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            mp.launch(program, 8, topology=TWO_NODES)
            error = None
        except mp.RankFailedError as e:
            error = e.original
    return [w for w in caught if issubclass(w.category, PlacementWarning)], error


def test_parallelize_warns_once_by_default_refuses_when_strict_and_runs_any():
    warned, error = run_with("warn")
    assert error is None and len(warned) == 1  # rank 0 only
    text = str(warned[0].message)
    assert "tp group {1,3,5,7} spans 2 nodes" in text and "order='tp-cp-ep-dp-pp'" in text
    assert "b = 1" in text
    warned, error = run_with("strict")
    assert not warned and isinstance(error, ValueError)
    assert "placement='strict' refuses this layout" in str(error)
    assert "placement='any' without" in str(error)
    assert run_with("any") == ([], None)
    warned, error = run_with("loose")
    assert isinstance(error, ValueError) and "expected one of ('warn', 'strict', 'any')" \
        in str(error)
