"""The runner on the clock, on the ledger and in the trace.

- Clock: each rank's simulated time for the schedule equals what `dry_run` predicts for
  the same lowered lists, given the F and B durations the trace measured on each stage and
  the runtime's p2p cost of each message, to the nanosecond (on a slow device, so that
  a step lasts milliseconds and a nanosecond is a real test).
- Ledger: the activations held peak at m micro-batches' worth under GPipe and at
  min(p - r, m) on rank r under 1F1B, read as the ledger's peak over one micro-batch's
  activations; every schedule's peak is the dry run's peak in flight, and nothing is left
  held after the step.
- Trace: every F and B with its stage and micro-batch, in the schedule's order, so that a
  timeline reads as one draws it by hand (`S1: F1 F2 F3 F4 B1 B2 B3 B4`); the kernels
  inside add up to one device's FLOPs.
- Tied embeddings: one all-reduce over the first and last stages' ranks, none elsewhere.
- The dry run's deadlock check runs before anything is sent.
"""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, MLP, GPTConfig
from minipar.parallel.pp import (RECV_B, Action, Kind, PipelineRunner, ScheduleDeadlockError,
                                 ScheduleError, build_stages, dry_run, lower,
                                 placement, schedule, validate_schedule)
from minipar.parallel.pp.actions import OverlapFB, parts
from minipar.runtime import cost

CFG = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=4, seed=3)
SLOW = mp.DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s: steps of milliseconds


def batch(cfg, m, b=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (cfg.seq_len, m * b)),
            rng.integers(0, cfg.vocab_size, (cfg.seq_len, m * b)))


def run_step(cfg, actions, topology=None, steps=1, layers=None, before=None):
    """One step (or more) on len(actions) ranks: per rank (runner, trace events, ledger
    peak of activations, activations held after, the rank's model)."""
    ids, tgt = batch(cfg, len({a.microbatch for row in actions for item in row
                               for a in parts(item)}))

    def program(ctx):
        model = GPT(cfg)
        runner = PipelineRunner(build_stages(model, placement(actions), ctx.rank, layers),
                                actions)
        if before is not None:
            before(ctx)
        ctx.ledger.reset_peak()
        for _ in range(steps):
            runner.step(ids, tgt)
        return (runner, list(ctx.trace.events), ctx.ledger.peak("activations"),
                ctx.ledger.held("activations"), model)

    return mp.launch(program, len(actions), topology=topology)


def actions_of(events):
    return [e for e in events if "action" in e.meta]


CLOCKED = [("gpipe", 4, 4, 1), ("1f1b", 4, 6, 1), ("1f1b", 3, 2, 1),
           ("interleaved_1f1b", 2, 4, 2), ("interleaved_1f1b", 4, 4, 2)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, m, v", CLOCKED)
def test_the_clock_is_the_dry_runs_to_the_nanosecond(name, p, m, v):
    topology = (mp.Topology.nodes(2, gpus_per_node=2, device=SLOW) if p == 4 else
                mp.Topology.single_node(p, device=SLOW))  # p = 4: ranks 1 -> 2 cross nodes
    cfg = CFG.with_(num_layers=p * v + 1)  # uneven: the first stage has one more block
    actions = schedule(name, p, m, v)
    res = run_step(cfg, actions, topology)
    durations: dict = {"F": [None] * p * v, "B": [None] * p * v}
    for _, events, *_ in res:
        for e in actions_of(events):
            seen = durations[e.meta["kind"]][e.meta["stage"]]
            durations[e.meta["kind"]][e.meta["stage"]] = e.duration if seen is None else seen
            assert abs(e.duration - durations[e.meta["kind"]][e.meta["stage"]]) < 1e-15
    nbytes = cfg.seq_len * 2 * cfg.hidden * 8  # [s, b, h] float64, either way
    link = {(a, b): cost.p2p_time(nbytes, topology.link(a, b))
            for a in range(p) for b in range(p) if a != b}
    predicted = dry_run(lower(actions), durations, lambda msg: link[msg.src, msg.dst])
    assert predicted.makespan > 1e-4  # a nanosecond is less than 1e-5 of it
    if p > 1:  # and the messages count: microseconds of it
        assert predicted.makespan - dry_run(lower(actions), durations).makespan > 1e-6
    for r, (runner, *_) in enumerate(res):
        t = runner.last_step
        assert t.start == 0.0
        assert abs(t.schedule_end - predicted.finish[r]) < 1e-9, (r, t, predicted.finish[r])
    assert abs(max(r[0].last_step.schedule_end for r in res) - predicted.makespan) < 1e-9


@pytest.mark.timeout(60)
@pytest.mark.parametrize("p, m", [(4, 6), (4, 2), (3, 3), (2, 1)])
def test_the_ledger_holds_m_micro_batches_under_gpipe_and_p_minus_r_under_1f1b(p, m):
    cfg = CFG.with_(num_layers=p, dropout=0.1)  # masks are activations too
    for name, want in (("gpipe", lambda r: m), ("1f1b", lambda r: min(p - r, m))):
        for r, (_, events, peak, after, _) in enumerate(run_step(cfg, schedule(name, p, m))):
            one = actions_of(events)[0].meta["activations"]  # after the first F
            assert one > 0 and after == 0  # every micro-batch's activations given back
            assert peak == want(r) * one, (name, r, peak / one)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, m, v", CLOCKED + [("interleaved_1f1b", 1, 3, 2)])
def test_every_schedules_peak_is_the_dry_runs_in_flight(name, p, m, v):
    """Charged at F, released at B: the ledger after each action is the replay of the
    rank's list with each stage's bytes per micro-batch, and its peak the replay's."""
    actions = schedule(name, p, m, v)
    predicted = dry_run(lower(actions), {"F": 1, "B": 1})
    for r, (_, events, peak, after, _) in enumerate(run_step(CFG.with_(num_layers=p * v),
                                                             actions)):
        held, per_stage, replay = 0, {}, []
        for e in actions_of(events):
            if e.meta["kind"] == "F" and e.meta["stage"] not in per_stage:
                per_stage[e.meta["stage"]] = e.meta["activations"] - held
            held += per_stage[e.meta["stage"]] * (1 if e.meta["kind"] == "F" else -1)
            replay.append(held)
            assert e.meta["activations"] == held, e.label
        assert peak == max(replay) and after == 0
        if len(set(per_stage.values())) == 1:  # equal stages: the dry run's count
            assert peak == predicted.peak_in_flight[r] * per_stage[r]


def test_the_trace_shows_the_schedule_as_one_draws_it():
    res = run_step(CFG.with_(num_layers=2), schedule("gpipe", 2, 4))
    rows = []
    for _, events, *_ in res:
        acts = actions_of(events)
        stage = acts[0].meta["stage"]
        rows.append(f"S{stage + 1}: " + " ".join(f"{e.meta['kind']}{e.meta['microbatch'] + 1}"
                                                 for e in acts))
        assert [e.label for e in acts] == [str(a) for a in schedule("gpipe", 2, 4)[stage]]
        assert all(a.end <= b.start for a, b in zip(acts, acts[1:]))  # serial on the rank
    assert rows == ["S1: F1 F2 F3 F4 B1 B2 B3 B4", "S2: F1 F2 F3 F4 B1 B2 B3 B4"]
    s1, s2 = (actions_of(r[1]) for r in res)
    assert s2[0].start >= s1[0].end  # 1F0 waits for 0F0's activations


def test_the_kernels_inside_add_up_to_one_devices_flops():
    cfg, m = CFG.with_(num_layers=3), 3
    ids, tgt = batch(cfg, m)
    with mp.device() as ctx:
        model = GPT(cfg)
        for k in range(m):
            model.loss_and_grad(ids[:, 2 * k:2 * k + 2], tgt[:, 2 * k:2 * k + 2])
        want = sum(e.flops for e in ctx.trace.of("compute"))
    res = run_step(cfg, schedule("1f1b", 3, m))
    assert sum(e.flops for r in res for e in r[1] if e.stream == "compute") == pytest.approx(
        want, rel=1e-12)
    assert all(e.flops == 0 for r in res for e in actions_of(r[1]))


@pytest.mark.parametrize("name, p, v, group", [("1f1b", 3, 1, (0, 2)),
                                               ("interleaved_1f1b", 2, 2, (0, 1)),
                                               ("interleaved_1f1b", 1, 2, None)])
def test_tied_embeddings_are_summed_over_the_first_and_last_stages_ranks(name, p, v, group):
    cfg = CFG.with_(num_layers=p * v, tie_embeddings=True)
    res = run_step(cfg, schedule(name, p, p * 2, v))
    reduces = [[e.group for e in r[1] if e.name == "all_reduce"] for r in res]
    assert reduces == [[group] if group and r in group else [] for r in range(p)]
    if group:
        first, last = (res[r][4].wte.weight.grad for r in group)
        np.testing.assert_array_equal(first, last)  # both copies take the same step
    untied = run_step(CFG.with_(num_layers=p * v), schedule(name, p, p * 2, v))
    assert not any(e.name == "all_reduce" for r in untied for e in r[1])


def test_two_pipelines_side_by_side_in_pp_groups_and_grads_ready_after_the_sum():
    """World 4, pp groups [0, 2] and [1, 3] (as a dp x pp mesh will make them): each trains
    like one device, its tied copies summed over its own embedding group, before
    grads_ready() sees the gradients."""
    cfg = CFG.with_(num_layers=2, tie_embeddings=True)
    actions = schedule("1f1b", 2, 2)
    batches = [batch(cfg, 2, seed=s) for s in (1, 2)]  # one per pipeline

    def program(ctx):
        pipe, pp_rank = ctx.rank % 2, ctx.rank // 2
        group = mp.new_group([pipe, pipe + 2], "pp")
        model = GPT(cfg)
        seen = []
        runner = PipelineRunner(build_stages(model, placement(actions), pp_rank), actions,
                                group, grads_ready=lambda: seen.append(
                                    model.wte.weight.grad.copy()))
        loss = runner.step(*batches[pipe])
        return loss, seen, model.wte.weight.grad, runner.embedding_group

    res = mp.launch(program, 4)
    for pipe in (0, 1):
        first, last = res[pipe], res[pipe + 2]
        assert first[3].ranks == (pipe, pipe + 2)
        with mp.device():
            ref = GPT(cfg)
            ids, tgt = batches[pipe]
            want = np.mean([ref.loss_and_grad(ids[:, k:k + 2], tgt[:, k:k + 2],
                                              loss_scale=0.5) for k in (0, 2)])
        assert first[0] is None and abs(last[0] - want) <= 1e-12 * want
        for r in (first, last):
            assert len(r[1]) == 1 and np.array_equal(r[1][0], r[2])  # after the sum
            np.testing.assert_allclose(r[2], ref.wte.weight.grad, rtol=1e-12, atol=1e-15)


def test_a_deadlock_is_found_before_anything_is_sent():
    lowered = lower(schedule("gpipe", 2, 1))  # rank 0: 0F0 0SEND_F0 0RECV_B0 0B0
    lowered[0] = [Action(0, RECV_B, 0)] + [a for a in lowered[0] if a.kind != RECV_B]

    def program(ctx):
        with pytest.raises(ScheduleDeadlockError, match="deadlock") as err:
            PipelineRunner(build_stages(GPT(CFG), placement(lowered), ctx.rank), lowered)
        return str(err.value), [e for e in ctx.trace.events if e.stream in ("p2p", "recv")]

    for text, sent in mp.launch(program, 2):
        assert "rank 0 waits at 0RECV_B0" in text and sent == []


def test_the_runner_refuses_what_it_cannot_run():
    actions = schedule("1f1b", 2, 2)

    def wrong_stages(ctx):
        stages = build_stages(GPT(CFG), placement(actions), 1 - ctx.rank)
        with pytest.raises(ScheduleError, match=f"pipeline rank {ctx.rank} runs stages"):
            PipelineRunner(stages, actions)
        with pytest.raises(ScheduleError, match="has 2 ranks' lists but the pipeline group"):
            PipelineRunner(stages, actions, mp.new_group([ctx.rank], f"alone{ctx.rank}"))

    mp.launch(wrong_stages, 2)


class DrawingMLP(MLP):
    """An MLP that draws one value from the dropout generator: uncounted by dropout_draws."""

    def forward(self, x, rng=None):
        rng.random(1)
        return super().forward(x, rng)


def test_a_layer_drawing_uncounted_dropout_values_is_caught():
    cfg = CFG.with_(num_layers=2, dropout=0.1)
    actions = schedule("interleaved_1f1b", 1, 1, chunks=2)  # two stages on one rank
    with mp.device():
        model = GPT(cfg, mlp_factory=lambda i: DrawingMLP(f"blocks.{i}.mlp", cfg.hidden,
                                                          cfg.ffn, seed=cfg.seed))
        runner = PipelineRunner(build_stages(model, placement(actions), 0), actions)
        with pytest.raises(RuntimeError, match="stage 0's forward of micro-batch 0 drew "
                                               "another number of dropout values"):
            runner.step(*batch(cfg, 1))


def fused_backward(actions):
    """The inverse: each I as a B, each W dropped (same order otherwise)."""
    return [[Action(a.stage, Kind.B, a.microbatch) if a.kind is Kind.I else a
             for a in row if a.kind is not Kind.W] for row in actions]


SPLIT = [("1f1b", 4, 6, 1, False), ("1f1b", 4, 6, 1, True), ("gpipe", 3, 2, 1, True),
         ("interleaved_1f1b", 2, 4, 2, True), ("interleaved_1f1b", 1, 2, 2, False),
         ("zb_h1", 4, 6, None, False), ("zb_h2", 3, 5, None, False),
         ("zbv", 2, 4, None, False)]  # the zero-bubble generators' own I and W


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, m, v, defer", SPLIT)
def test_split_schedules_on_the_clock_the_ledger_and_the_trace(dpkit, name, p, m, v, defer):
    """I and W run as their own actions: the trace has each, labelled (2I0, 2W0), in the
    list's order; the clock is dry_run's with the measured F, I and W durations, to the
    nanosecond; I + W of a stage lasts its B. The ledger replays the list: F charges the
    stage's activations, I gives back all but W's records, W the rest; those are, per
    micro-batch of b = 2 sequences, (8h + 2f)·s·b + 4h elements a block, the head's
    (s·b·(h + V) + 2h) on the last stage and the embedding step's s·b·h (+ two int64 [s, b])
    on the first, in float64. Inside an I the ledger may pass the replay (a record's dy
    is charged before the forward's records it replaces are freed), by less than the
    stage's W records."""
    topology = mp.Topology.single_node(p, device=SLOW)
    base = schedule(name, p, m, v)
    S = validate_schedule(base).stages
    cfg = CFG.with_(num_layers=S + 1, dropout=0.1)
    actions = dpkit.split_backward(base, defer)  # conftest.py
    res = run_step(cfg, actions, topology)
    fused = run_step(cfg, fused_backward(actions), topology)  # each I W pair as one B
    d = {"F": {}, "I": {}, "W": {}}
    for (_, events, *_), (_, fused_events, *_) in zip(res, fused):
        acts = actions_of(events)
        row = actions[acts[0].meta["pipeline_rank"]]
        assert [e.label for e in acts] == [str(a) for a in row]
        for e in acts:
            d[e.meta["kind"]].setdefault(e.meta["stage"], e.duration)
            assert abs(e.duration - d[e.meta["kind"]][e.meta["stage"]]) < 1e-15
        for e in actions_of(fused_events):
            if e.meta["kind"] == "B":  # t_B = t_I + t_W
                s = e.meta["stage"]
                assert abs(e.duration - d["I"][s] - d["W"][s]) < 1e-12
    nbytes = cfg.seq_len * 2 * cfg.hidden * 8
    link = cost.p2p_time(nbytes, topology.link(0, 1)) if p > 1 else 0
    predicted = dry_run(lower(actions), {k: [d[k][s] for s in range(S)] for k in d}, link)
    for r, (runner, events, peak, after, _) in enumerate(res):
        assert abs(runner.last_step.schedule_end - predicted.finish[r]) < 1e-9
        assert after == 0
        held, f_bytes, w_bytes, replay = 0, {}, {}, []
        for e in actions_of(events):
            kind, s, now = e.meta["kind"], e.meta["stage"], e.meta["activations"]
            if kind == "F":
                f_bytes.setdefault(s, now - held)
            if kind == "I":
                w_bytes.setdefault(s, now - held + f_bytes[s])
            held += {"F": f_bytes[s], "I": w_bytes.get(s, 0) - f_bytes[s],
                     "W": -w_bytes.get(s, 0)}[kind]
            replay.append(held)
            assert now == held, e.label
        # inside an I, a record's dy is held before the forward records it replaces are
        # freed: the peak passes the replay's by at most one stage's W records
        assert max(replay) <= peak <= max(replay) + max(w_bytes.values())
        h, f, V, sb = cfg.hidden, cfg.ffn, cfg.vocab_size, cfg.seq_len * 2
        for s, got in w_bytes.items():
            blocks = (cfg.num_layers // S + (s < cfg.num_layers % S))
            want = blocks * ((8 * h + 2 * f) * sb + 4 * h) * 8
            want += ((sb * (h + V) + 2 * h) * 8) if s == S - 1 else 0
            want += (sb * h * 8 + 2 * sb * 8) if s == 0 else 0
            assert got == want, (s, got, want)


def test_an_overlapped_pair_runs_its_forward_then_its_backward():
    """DualPipeV's (sF i; tB j) items: each half is its own event, in that order, tagged
    with the pair; the rank's events are the schedule's actions read through its pairs."""
    actions = schedule("dualpipev", 2, 4)
    for _, events, *_ in run_step(CFG.with_(num_layers=4), actions):
        acts = actions_of(events)
        row = actions[acts[0].meta["pipeline_rank"]]
        assert [e.label for e in acts] == [str(a) for item in row for a in parts(item)]
        paired = [e for e in acts if "pair" in e.meta]
        assert paired and len(paired) == 2 * sum(isinstance(i, OverlapFB) for i in row)
        for first, second in zip(paired[::2], paired[1::2]):
            assert first.meta["pair"] == second.meta["pair"] == f"({first.label};" \
                f"{second.label})OVERLAP_F_B" and first.end <= second.start

