"""DualPipeV's overlapped pairs on the runner's clock: each half's p2p message overlaps the
other half's compute (lowering.py's pair_overlap), and the dry run, given the halves'
durations (no "F&B"), predicts every rank's end of schedule to the nanosecond, on a
topology where messages cost something; the pair taken as one block (t_F&B = t_F + t_B,
its messages around it: what a pair was before its messages were timed per half) ends
later, by what the overlap hides."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel.pp import OverlapFB, PipelineRunner, build_stages, dry_run, lower, \
    placement, schedule
from minipar.runtime import cost
from minipar.runtime.topology import Link

CFG = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=8, seed=3)
SLOW = mp.DeviceSpec("slow", {"float64": 1e9}, 10**12)  # 1 GFLOP/s: steps of milliseconds
US = 1e-6


def run_step(actions, topology, m: int, b: int = 2):
    """One step on len(actions) ranks: per rank (runner, its trace's F, B, I and W)."""
    rng = np.random.default_rng(0)
    ids, tgt = (rng.integers(0, CFG.vocab_size, (CFG.seq_len, m * b)) for _ in range(2))

    def program(ctx):
        runner = PipelineRunner(build_stages(GPT(CFG), placement(actions), ctx.rank),
                                actions)
        runner.step(ids, tgt)
        return runner, [e for e in ctx.trace.events if "action" in e.meta]

    return mp.launch(program, len(actions), topology=topology)


def measured(res, stages: int) -> dict:
    """kind -> one duration per stage, read from the trace (a pair's halves by their own
    kind); every action of a kind and stage lasts the same, pairs' halves included."""
    d: dict = {k: {} for k in ("F", "B", "I", "W")}
    halves = 0
    for _, events in res:
        for e in events:
            halves += "pair" in e.meta
            d[e.meta["kind"]].setdefault(e.meta["stage"], e.duration)
            assert abs(e.duration - d[e.meta["kind"]][e.meta["stage"]]) < 1e-15
    assert halves  # the schedule has pairs
    return {k: [v.get(s, 0.0) for s in range(stages)] for k, v in d.items()}


def fused(table: dict, actions) -> dict:
    """The same durations with each pair as one block: t_F&B = t_F + t_B (or t_I) of its
    halves, per stage of its forward (in DualPipeV each forward stage has one partner)."""
    fb = [0.0] * len(table["F"])
    for row in actions:
        for item in row:
            if isinstance(item, OverlapFB):
                f, b = item
                fb[f.stage] = table["F"][f.stage] + table[b.kind.value][b.stage]
    return {**table, "F&B": fb}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("latency", [1 * US, 20 * US])
def test_dualpipev_on_the_runners_clock_is_the_dry_runs_and_its_pairs_hide_their_messages(
        latency):
    """p = 4, m = 10, every pipeline rank on its own node joined by a link of `latency`
    (1 us, and 20 us: about a half's compute on this slow device). The runner's end of
    schedule on every rank is the dry run's with per-half message timing, to 1 ns; the
    makespan is shorter than the dry run's with each pair one block, and the gain grows
    with the link's cost."""
    p, m = 4, 10
    actions = schedule("dualpipev", p, m)
    link = Link("slow", 50e9, latency)
    topology = mp.Topology.nodes(p, gpus_per_node=1, device=SLOW, inter=link)
    res = run_step(actions, topology, m)
    table = measured(res, 2 * p)
    message = cost.p2p_time(CFG.seq_len * 2 * CFG.hidden * 8, link)  # [s, b, h] float64
    assert message >= latency > 0
    overlapped = dry_run(lower(actions), table, message)
    blocks = dry_run(lower(actions), fused(table, actions), message)
    assert overlapped.makespan > 1e-4  # a nanosecond is less than 1e-5 of it
    for r, (runner, _) in enumerate(res):
        assert abs(runner.last_step.schedule_end - overlapped.finish[r]) < 1e-9
    assert overlapped.busy == pytest.approx(blocks.busy, rel=1e-12)  # the same compute
    hidden = blocks.makespan - overlapped.makespan
    assert hidden > 2 * message  # at least one message each way overlapped on a path
    assert overlapped.bubble_over_ideal < blocks.bubble_over_ideal
