"""The dry run of a step (plan.timeline) is the real simulated run, event by event.

Each example draws a small layout dp x pp x tp <= 8 ranks, a schedule (GPipe, 1F1B,
interleaved 1F1B, ZB-H1, ZB-H2, ZBV, DualPipeV), micro-batches, layers, sequence
parallelism, tied embeddings, the recompute mode, dropout, clipping, the dtype, the node
size (so groups cross NVLink or InfiniBand) and the clock's compute model (peak: matmuls
only; calibrated: each GEMM at its shape's efficiency and every memory-bound op, the
optimizer's step included, by its bytes), runs one `parallelize(...).train_step` on the
simulated runtime after a barrier, and holds every rank's trace to the dry run's events of
its pipeline rank, and its ledger's model states to the dry run's: the same kernels (GEMMs and memory-bound ops), collectives, sends and
receives, with the same FLOPs and bytes, each starting and ending within a nanosecond (the dry run runs one rank per
pipeline coordinate: the others must match it too). A planted bug in the op list fails.
"""

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.pp import ScheduleError, schedule as make_schedule
from minipar.plan import stage_ops
from minipar.plan.layout import Layout
from minipar.plan.presets import ModelSpec
from minipar.plan.timeline import timeline
from minipar.runtime.collectives import barrier
from minipar.runtime.topology import Topology

NS = 1e-9
V_SCHEDULES = ("zbv", "dualpipev")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2") + V_SCHEDULES


def real_step(cfg, dims, B, topology, compute_model=None, **kw):
    """Per global rank: (its clock after the barrier, its events of one train_step, its
    coordinate on the mesh, with its ledger's model states after the step)."""
    def program(ctx):
        run = parallelize(cfg, dims, placement="any", lr=1e-3, **kw)
        rng = np.random.default_rng(0)
        ids, tgt = (rng.integers(0, cfg.vocab_size, (cfg.seq_len, B)) for _ in range(2))
        barrier()  # every rank starts the step at one time, as the dry run's do
        t0 = ctx.clock.compute
        ctx.trace.clear()
        run.train_step(ids, tgt)
        ctx.resolve_pending()
        held = {c: ctx.ledger.held(c) for c in ("parameters", "gradients",
                                                 "optimizer_states")}
        return t0, list(ctx.trace.events), {**run.groups.coordinate, "held": held}

    return mp.launch(program, dims.world_size, topology=topology, compute_model=compute_model)


def fields(e, t0):
    """What must agree: stream, kind, label (a p2p peer aside), FLOPs, bytes; the times."""
    label = "" if e.stream in ("p2p", "recv") else e.label
    nbytes = e.nbytes if e.stream != "compute" else 0
    return (e.stream, e.name, label, e.flops, nbytes, float(e.meta.get("sent_bytes", 0)),
            float(e.meta.get("bytes", 0))), (e.start - t0, e.end - t0)


def assert_same(real_events, t0, dry_events, where):
    a = sorted((fields(e, t0) for e in real_events), key=lambda f: (f[0][:3], f[1]))
    b = sorted((fields(e, 0.0) for e in dry_events), key=lambda f: (f[0][:3], f[1]))
    assert len(a) == len(b), f"{where}: {len(a)} real events, {len(b)} in the dry run"
    for (fa, ta), (fb, tb) in zip(a, b):
        assert fa == fb, f"{where}: real {fa} at {ta}, dry run {fb} at {tb}"
        assert abs(ta[0] - tb[0]) <= NS and abs(ta[1] - tb[1]) <= NS, \
            f"{where}: {fa} real {ta}, dry run {tb}"


def planned(cfg, dims, B, schedule, microbatches, chunks=1, sequence_parallel=False):
    """The planner's ModelSpec and Layout of what parallelize(cfg, dims, ...) runs."""
    model = ModelSpec("test GPT", cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.ffn,
                      cfg.vocab_size, cfg.seq_len, tied=cfg.tie_embeddings)
    layout = Layout(tp=dims.tp, pp=dims.pp, dp=dims.dp, schedule=schedule, chunks=chunks,
                    micro_batch=B // (microbatches * dims.dp), global_batch=B,
                    sequence_parallel=sequence_parallel, recompute=cfg.recompute)
    return model, layout


def check(cfg, dims, B, gpus_per_node=8, max_grad_norm=None, compute_model=None, **kw):
    """Run both and compare every rank; returns the timeline and the real run."""
    nodes = -(-dims.world_size // gpus_per_node)
    topo = Topology.nodes(nodes, min(gpus_per_node, dims.world_size))
    res = real_step(cfg, dims, B, topo, compute_model, max_grad_norm=max_grad_norm, **kw)
    tl = timeline(*planned(cfg, dims, B, **kw), topo, dtype=cfg.dtype, dropout=cfg.dropout,
                  max_grad_norm=max_grad_norm, compute_model=compute_model)
    for rank, (t0, events, where) in enumerate(res):
        pp = where["pp"]
        if where["tp"] == where["dp_replicate"] == 0:
            assert tl.ranks[pp].rank == rank  # the representative is the real rank
        assert_same(events, t0, tl.ranks[pp].events, f"rank {rank} (pipeline rank {pp})")
        assert tl.ranks[pp].states == where["held"], f"rank {rank}: model states"
    return tl, res


@st.composite
def layouts(draw):
    name = draw(st.sampled_from(SCHEDULES))
    pp = draw(st.sampled_from((1, 2, 4)))
    tp = draw(st.sampled_from((1, 2)))
    dp = draw(st.sampled_from((1, 2)) if pp * tp <= 4 else st.just(1))
    chunks = 2 if name in V_SCHEDULES else (draw(st.sampled_from((1, 2)))
                                            if name == "interleaved_1f1b" else 1)
    m = draw(st.integers(1, 8))
    try:
        make_schedule(name, pp, m, chunks)
    except (ScheduleError, ValueError):
        m = 2 * pp  # a size every schedule takes
    stages = pp * chunks
    layers = draw(st.integers(stages, stages + 2))
    sp = tp > 1 and draw(st.booleans())
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=layers,
                    tie_embeddings=draw(st.booleans()),
                    recompute=draw(st.sampled_from(("none", "selective", "full"))),
                    dtype=draw(st.sampled_from(("float64", "bfloat16"))),
                    dropout=draw(st.sampled_from((0.0, 0.1))))
    dims = ParallelDims(dp_replicate=dp, pp=pp, tp=tp)
    B = m * dp * draw(st.sampled_from((1, 2)))
    kw = dict(schedule=name, microbatches=m, chunks=chunks, sequence_parallel=sp,
              max_grad_norm=draw(st.sampled_from((None, 1.0))),
              compute_model=draw(st.sampled_from(("peak", "calibrated"))))
    return cfg, dims, B, draw(st.sampled_from((2, 4, 8))), kw


@pytest.mark.timeout(300)
@settings(max_examples=40)
@given(layouts())
def test_the_dry_run_is_the_real_run_event_by_event(layout):
    cfg, dims, B, gpus_per_node, kw = layout
    event(f"{kw['schedule']}"), event(f"dp {dims.dp} pp {dims.pp} tp {dims.tp}")
    event(f"compute model {kw['compute_model']}")
    check(cfg, dims, B, gpus_per_node, **kw)


@pytest.mark.parametrize("compute_model", ["peak", "calibrated"])
def test_every_schedule_at_dp_pp_tp_2_with_sp_clipping_and_tied_embeddings(compute_model):
    """The fixed corner of the space: 8 ranks, two nodes of 4, each schedule, dropout."""
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=4,
                    tie_embeddings=True, dropout=0.1)
    dims = ParallelDims(dp_replicate=2, pp=2, tp=2)
    for name in SCHEDULES:
        chunks = 2 if name in V_SCHEDULES or name == "interleaved_1f1b" else 1
        tl, _ = check(cfg, dims, 8, 4, schedule=name, microbatches=4, chunks=chunks,
                      sequence_parallel=True, max_grad_norm=1.0,
                      compute_model=compute_model)
        kinds = {e.name for r in tl.ranks for e in r.events}
        assert {"matmul", "all_gather", "reduce_scatter", "all_reduce", "send", "recv",
                "broadcast"} <= kinds, (name, kinds)


def test_a_planted_bug_in_the_op_list_fails(monkeypatch):
    """Forget SP's all-reduce of the LayerNorms' and row biases' partial gradients (the
    real program runs one a layer and one for ln_f): the comparison fails."""
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=2)
    dims = ParallelDims(pp=2, tp=2)
    kw = dict(schedule="1f1b", microbatches=2, sequence_parallel=True)
    check(cfg, dims, 4, **kw)
    monkeypatch.setattr(stage_ops, "_flush", lambda o, elements: None)
    with pytest.raises(AssertionError, match="real events"):
        check(cfg, dims, 4, **kw)


def test_activations_held_are_the_runners(monkeypatch):
    """When a micro-batch's activations are held is exact: after every action of a
    one-stage-a-rank schedule, the ledger's activations are the dry run's in-flight count
    times one micro-batch's (the real runner records them on its F and B events)."""
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=4)
    dims = ParallelDims(pp=4)
    for name in ("gpipe", "1f1b"):
        tl, res = check(cfg, dims, 8, schedule=name, microbatches=8)
        for r in tl.ranks:
            real = [e.meta["activations"] for e in res[r.rank][1] if "action" in e.meta]
            one = real[0]  # after the first F: one micro-batch
            assert one > 0
            assert real == [n * one for _, n in r.in_flight]
            assert max(n for _, n in r.in_flight) == tl.schedule.peak_in_flight[r.pipeline_rank]


def test_refusals_name_what_is_not_modelled():
    from minipar.plan.presets import MODELS
    gpt = ModelSpec("g", 2, 8, 2, 32, 16, 4)
    topo = Topology.nodes(1, 8)
    for layout, words in ((Layout(dp=2, zero=1, global_batch=2), "ZeRO-1"),
                          (Layout(cp=2), "cp = 2"),
                          (Layout(dp=2, distributed_optimizer=True, global_batch=2),
                           "distributed optimizer")):
        with pytest.raises(ValueError, match=words):
            timeline(gpt, layout, topo)
    with pytest.raises(ValueError, match="as_gpt"):
        timeline(MODELS["llama3-8b"], Layout(tp=8), topo)
    with pytest.raises(ValueError, match="heads = 2 does not divide by tp = 4"):
        timeline(gpt, Layout(tp=4), topo)
    with pytest.raises(ValueError, match="the topology has 8 devices"):
        timeline(gpt, Layout(dp=16, global_batch=16), topo)


def test_a_llama_3_405b_sized_step_on_16384_gpus():
    """The full-scale dry run: one rank per pipeline coordinate of dp 128 x pp 16 x tp 8,
    interleaved 1F1B (2 chunks, m = 16), SP. Every pipeline rank runs m·v forwards and
    backwards, and the matmul FLOPs of all ranks are the step's exactly:
    3·B·s·(l·(8h² + 4hf + 4sh) + 2hV) (a layer's four linears, its two s² products, the
    head; forward once, backward twice)."""
    from minipar.plan.presets import CLUSTERS, MODELS
    from minipar.plan.sized import as_gpt
    gpt = as_gpt(MODELS["llama3-405b"])
    B, m = 2048, 16
    layout = Layout(dp=128, pp=16, tp=8, schedule="interleaved_1f1b", chunks=2,
                    global_batch=B, sequence_parallel=True)
    assert layout.microbatches == m
    tl = timeline(gpt, layout, CLUSTERS["h100"].topology(2048), max_grad_norm=1.0)
    assert len(tl.ranks) == 16 and tl.world_size == 16384
    for r in tl.ranks:
        kinds = [e.name for e in r.events if e.name in ("F", "B")]
        assert kinds.count("F") == kinds.count("B") == m * 2
        assert r.end <= tl.step_time
    s, l, h, f, V = gpt.seq_len, gpt.layers, gpt.hidden, gpt.ffn, gpt.vocab
    want = 3 * B * s * (l * (8 * h * h + 4 * h * f + 4 * s * h) + 2 * h * V)
    got = sum(e.flops for r in tl.ranks for e in r.events) * layout.dp * layout.tp
    assert got == pytest.approx(want, rel=1e-12)
    assert tl.step_time > max(r.busy("compute", "matmul") for r in tl.ranks)


def test_the_dry_run_command(tmp_path, capsys):
    """`minipar dry-run`: the step, a line per pipeline rank, the Chrome trace; a layout the
    model cannot split is argparse's usage error, saying why."""
    import json
    from minipar.cli import main
    trace = tmp_path / "step.json"
    assert main(["dry-run", "--model", "175b", "--gpu", "a100", "--tp", "8", "--pp", "4",
                 "--dp", "2", "--microbatches", "8", "--sp", "--recompute", "selective",
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "175B" in out and "pp rank" in out and "wrote" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 4
    events = json.loads(trace.read_text())
    assert any(e.get("name") == "all_gather" for e in events["traceEvents"])
    with pytest.raises(SystemExit) as exit_:
        main(["dry-run", "--model", "175b", "--tp", "5"])
    assert exit_.value.code == 2
    assert "heads = 96 does not divide by tp = 5" in capsys.readouterr().err
