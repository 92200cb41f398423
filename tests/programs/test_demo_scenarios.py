"""The demo's data, state and performance modes: each scenario's numbers are minipar's.

Real runs (the tiny GPT) against a direct launch of the same train_step and its ledgers;
the 70B's dry run against plan.timeline and the planner against rank_memory / step_time;
the batch's journey against the schedule; the scenario checks' refusals; the server's API.
"""

import json
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from minipar.cli import main
from minipar.parallel.pp.schedules import schedule as pipeline_schedule
from minipar.plan.flops import model_flops as narayanan_flops
from minipar.plan.presets import CLUSTERS, MODELS
from minipar.plan.rank_memory import rank_memory
from minipar.plan.sized import as_gpt
from minipar.plan.step_time import step_time
from minipar.plan.timeline import timeline
from minipar.programs import demo_plan, demo_run
from minipar.programs.demo import demo_data, scenario_data
from minipar.programs.demo_rows import WIDTH, model_flops
from minipar.programs.demo_scenario import (BASE, KITCHEN_SCHEDULES, TINY, TINY_BATCH,
                                            WHAT_FITS, ZERO_WITHOUT_PIPELINE, Scenario, check,
                                            embedded)
from minipar.programs.demo_serve import parse_query
from minipar.runtime.ledger import CATEGORIES

TINY_CASES = [BASE["tiny"], replace(BASE["tiny"], schedule="zb_h1"),
              replace(BASE["tiny"], zero=3, recompute="full"),
              Scenario("tiny", 1, 1, 4, 4, 2, "interleaved_1f1b"),
              Scenario("tiny", 2, 2, 1, 1)]


@pytest.mark.parametrize("s", TINY_CASES, ids=lambda s: s.key)
def test_a_real_runs_numbers_are_the_launched_steps(s, tiny_launch):
    """Step time, every rank's peak by category, the memory curve's maximum and final bytes,
    the time split and the MFU: the same as a direct launch's clocks and ledgers."""
    d = demo_run.run(s)
    res = tiny_launch(s)  # tests/conftest.py
    t0 = min(r[0] for r in res)
    T = max(r[1] for r in res) - t0
    assert d["numbers"]["step_time"] == pytest.approx(T, rel=1e-12)
    assert len(d["rows"]) == s.gpus and d["every_rank"]
    for row, (_, _, peak, total, held) in zip(d["rows"], res):
        assert {c: row["peak"][c] for c in CATEGORIES} == peak
        assert row["peak"]["total"] == total
        mem = row["memory"]
        totals = [sum(mem[c][i] for c in CATEGORIES) for i in range(len(mem["t"]))]
        assert max(totals) == total  # the resampling keeps the peak
        assert {c: mem[c][-1] for c in CATEGORIES} == held
        assert mem["t"] == sorted(mem["t"]) and mem["t"][-1] == pytest.approx(T)
        assert sum(row["split"].values()) == pytest.approx(T, rel=1e-9)
        assert len(row["cells"]) == WIDTH and set(row["cells"]) <= set("cmo.")
    n = d["numbers"]
    assert n["compute_share"] + n["comm_share"] + n["idle_share"] == pytest.approx(1)
    flops = narayanan_flops(TINY_BATCH, TINY["seq_len"], TINY["num_layers"], TINY["hidden"],
                            TINY["vocab_size"])  # f = 4h: the GPT's own formula
    assert n["model_flops"] == pytest.approx(flops, rel=1e-12)
    peak = demo_run.topology(s.gpus).device.peak("float32")
    assert n["mfu"] == pytest.approx(flops / (T * s.gpus * peak), rel=1e-12)


@pytest.mark.parametrize("s", TINY_CASES, ids=lambda s: s.key)
def test_the_journey_is_the_schedule_with_its_sends(s):
    """Every compute action of the schedule appears once, run by every rank of its stage's
    pipeline rank; each forward but the last stage's sends once, each backward but the first
    stage's; the tail synchronises the gradients over dp (or shards them: ZeRO)."""
    d = demo_run.run(s)
    actions = pipeline_schedule(s.schedule, s.pp, s.microbatches, s.chunks)
    want = sorted((a.kind.value, a.stage, a.microbatch) for row in actions for a in row)
    steps = [st for st in d["journey"] if st["kind"] != "tail"]
    assert sorted((st["kind"], st["stage"], st["microbatch"]) for st in steps) == want
    stages = s.pp * s.chunks
    for st in steps:
        rank_pp = st["stage"] % s.pp
        assert st["ranks"] == [r["rank"] for r in d["rows"] if r["pp_stage"] == rank_pp]
        sends = sum(c["count"] for c in st["collectives"] if c["name"] == "send")
        crosses = (st["kind"] == "F" and st["stage"] < stages - 1
                   and (st["stage"] + 1) % s.pp != rank_pp) or \
                  (st["kind"] in ("B", "I") and st["stage"] > 0
                   and (st["stage"] - 1) % s.pp != rank_pp)
        assert sends == int(crosses), st
    assert [st["start"] for st in d["journey"]] == sorted(st["start"] for st in d["journey"])
    tail = {(st["name"], st["group"]) for st in d["journey"] if st["kind"] == "tail"}
    if s.dp > 1:
        assert tail & {("all_reduce", "dp"), ("reduce_scatter", "dp"), ("all_gather", "dp")}
    if s.tp * s.pp > 1:  # the gradient norm's all-reduce over the model-parallel ranks
        assert {("all_reduce", k) for k in ("tp", "pp", "mp")} & tail


def test_the_batch_is_cut_into_micro_batches_then_dp_blocks():
    """Replica d's micro-batch j holds sequences j·B/m + d·B/(m·dp) onwards: every sequence
    once (the runner cuts micro-batches first, then takes block d of each)."""
    for s in (BASE["tiny"], Scenario("tiny", 2, 1, 1, 1), Scenario("tiny", 1, 1, 4, 8)):
        b = demo_run.batch_split(s)
        m, B = b["microbatches"], b["global_batch"]
        per = B // (m * s.dp)
        for d in range(s.dp):
            for j in range(m):
                lo = j * B // m + d * per
                assert b["blocks"][d][j] == list(range(lo, lo + per))
        assert sorted(x for r in b["blocks"] for blk in r for x in blk) == list(range(B))


def test_the_70b_dry_run_is_plan_timeline():
    """Step time, rows and peaks of the 70B's dry run scenario are timeline's."""
    for s in (BASE["70b"], Scenario("70b", 2, 4, 3, 6, 2, "interleaved_1f1b")):
        d = demo_plan.plan(s)
        gpt, cluster = as_gpt(MODELS["llama3-70b"]), CLUSTERS["a100"]
        tl = timeline(gpt, demo_plan.layout_of(s), cluster.topology(-(-s.gpus // 8)),
                      dtype="bfloat16", compute_model="calibrated", max_grad_norm=1.0)
        assert d["source"] == "dry-run" and not d["every_rank"]
        assert d["numbers"]["step_time"] == tl.step_time
        assert [r["rank"] for r in d["rows"]] == [r.rank for r in tl.ranks]
        for row, r in zip(d["rows"], tl.ranks):
            acts = max(b for _, b in r.activations)
            assert row["peak"]["total"] == sum(r.states.values()) + acts
            assert row["pp_stage"] == r.pipeline_rank
            assert sum(row["split"].values()) == pytest.approx(tl.step_time, rel=1e-9)
        n = d["numbers"]
        f = model_flops(s.global_batch, gpt.seq_len, gpt.layers, gpt.hidden, gpt.ffn, gpt.vocab)
        assert n["mfu"] == pytest.approx(f / (tl.step_time * s.gpus * 312e12), rel=1e-12)


def test_zero_on_the_70b_comes_from_the_planner():
    s = replace(BASE["70b"], zero=1)
    d = demo_plan.plan(s)
    gpt, cluster = as_gpt(MODELS["llama3-70b"]), CLUSTERS["a100"]
    mem = rank_memory(gpt, demo_plan.layout_of(s), cluster, dropout=False)
    assert d["source"] == "planner" and d["journey"] == []
    assert d["numbers"]["peak_memory"] == sum(int(t.peak) for t in mem.terms().values())
    assert d["numbers"]["step_time"] == step_time(gpt, demo_plan.layout_of(s), cluster,
                                                  dropout=False).seconds
    ddp = demo_plan.plan(BASE["70b"])["rows"][0]["peak"]["optimizer_states"]
    assert d["rows"][0]["peak"]["optimizer_states"] == pytest.approx(ddp / s.dp, rel=1e-3)


def test_embedded_scenarios_are_one_control_from_the_base():
    """So the page can promise: change one control from the base and the picture is there."""
    E = embedded()
    assert len({s.key for s in E}) == len(E) and BASE["tiny"] in E and BASE["70b"] in E
    extra = set(KITCHEN_SCHEDULES + ZERO_WITHOUT_PIPELINE + WHAT_FITS)
    for s in E:
        if s in extra:
            continue
        b = BASE[s.model]
        differ = {k for k in ("microbatches", "zero", "recompute") if
                  getattr(s, k) != getattr(b, k)}
        if (s.dp, s.tp, s.pp) != (b.dp, b.tp, b.pp):
            differ.add("layout")
        if s.schedule != b.schedule:
            differ.add("schedule")
        if s.pp == 1:
            differ -= {"microbatches", "schedule"}
        assert len(differ) <= 1, s.key
    assert extra <= set(E)
    kitchen_schedules = {s.schedule for s in E if (s.model, s.dp, s.tp, s.pp) == ("70b", 2, 4, 3)}
    assert kitchen_schedules == {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}


@pytest.mark.parametrize("s,says", [
    (Scenario("tiny", 4, 4, 2, 4), "at most 16"),
    (Scenario("tiny", 2, 3, 1, 1), "does not divide the 4 attention heads"),
    (Scenario("tiny", 4, 1, 2, 8), "do not split into dp = 4 x 8"),
    (Scenario("tiny", 1, 1, 2, 4, zero=1), "dp > 1"),
    (Scenario("tiny", 2, 1, 2, 4, chunks=2), "interleaved 1F1B takes chunks >= 2"),
    (Scenario("tiny", 2, 1, 1, 4), "pp = 1 runs no pipeline"),
    (Scenario("70b", 2, 4, 3, 6, zero=1), "pick pp 2 or 4"),
    (Scenario("gpt", 2, 1, 1, 1), "model 'gpt'"),
    (Scenario("tiny", 2, 1, 2, 4, schedule="zbv"), "schedule 'zbv'"),
    (Scenario("tiny", 2, 1, 2, 4, recompute="half"), "recompute 'half'"),
])
def test_a_scenario_minipar_cannot_build_says_which_control_to_change(s, says):
    with pytest.raises(ValueError, match=says):
        check(s)


def test_the_query_names_a_scenario_or_says_what_is_wrong():
    q = "model=tiny&dp=2&tp=2&pp=2&microbatches=4&chunks=1&schedule=1f1b&zero=0&recompute=none"
    assert parse_query(q) == BASE["tiny"]
    for bad, says in ((q.replace("&zero=0", ""), "lacks zero"),
                      (q.replace("dp=2", "dp=two"), "dp must be a whole number"),
                      (q + "&cp=2", "unknown parameter"),
                      (q.replace("tp=2", "tp=3"), "attention heads")):
        with pytest.raises(ValueError, match=says):
            parse_query(bad)


def test_the_server_serves_the_page_and_computes_a_scenario(serve_demo):
    """The page with served: true; a scenario not embedded is computed (once) and equals
    scenario_data's; a bad one is a 400 with check's message; any other path a 404."""
    base, calls = serve_demo(demo_data(scenarios=[]))
    base = base.rstrip("/")
    page = urllib.request.urlopen(base + "/", timeout=30).read().decode()
    assert '"served":true' in page
    q = "model=tiny&dp=1&tp=1&pp=1&microbatches=1&chunks=1&schedule=1f1b&zero=0&recompute=none"
    for _ in range(2):
        got = json.loads(urllib.request.urlopen(f"{base}/api/scenario?{q}", timeout=60).read())
    s = parse_query(q)
    assert calls == [s.key]
    assert got["numbers"] == scenario_data(s)["numbers"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}/api/scenario?{q.replace('tp=1', 'tp=3')}", timeout=30)
    assert e.value.code == 400 and "attention heads" in json.loads(e.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/etc/passwd", timeout=30)
    assert e.value.code == 404


@pytest.mark.parametrize("argv,says", [(["--serve", "--out", "x.html"], "give one of them"),
                                       (["--serve", "--port", "70000"], "0 .. 65535")])
def test_serve_flags_are_checked_before_any_work(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo"] + argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_what_the_state_mode_says_about_zero_is_what_the_ledgers_hold():
    """docs/demo.md's claims, from the embedded real runs: without a pipeline each ZeRO stage
    shrinks one more category (optimizer states exactly by dp); on the pipelined base
    ZeRO-2's gradient peak does not shrink below DDP's; full recompute lowers activations."""
    peaks = [demo_run.run(s)["rows"][0]["peak"] for s in ZERO_WITHOUT_PIPELINE]
    dp = ZERO_WITHOUT_PIPELINE[0].dp
    assert all(p["optimizer_states"] * dp == peaks[0]["optimizer_states"] for p in peaks[1:])
    assert peaks[2]["gradients"] < peaks[1]["gradients"] == peaks[0]["gradients"]
    assert peaks[3]["parameters"] < peaks[2]["parameters"] == peaks[0]["parameters"]
    base = demo_run.run(BASE["tiny"])["rows"][0]["peak"]
    z2 = demo_run.run(replace(BASE["tiny"], zero=2))["rows"][0]["peak"]
    assert z2["gradients"] >= base["gradients"]
    full = demo_run.run(replace(BASE["tiny"], recompute="full"))["rows"][0]["peak"]
    assert full["activations"] < base["activations"]
    big = demo_plan.plan(BASE["70b"])
    states = sum(big["rows"][0]["peak"][c] for c in ("parameters", "gradients",
                                                     "optimizer_states"))
    assert states > big["capacity"]


def test_on_the_70b_base_only_zero_and_recompute_together_fit():
    """The state mode's story (docs/demo.md): on dp 8 x tp 4 x pp 2 with 8,192-token
    sequences no ZeRO stage alone and no recompute mode alone fits 80 GB; WHAT_FITS does."""
    cap = demo_plan.plan(BASE["70b"])["capacity"]
    for s in [replace(BASE["70b"], zero=z) for z in (0, 1, 2, 3)] + \
             [replace(BASE["70b"], recompute=r) for r in ("selective", "full")]:
        assert demo_plan.plan(s)["numbers"]["peak_memory"] > cap, s.key
    for s in WHAT_FITS:
        assert demo_plan.plan(s)["numbers"]["peak_memory"] <= cap, s.key


def test_the_state_modes_figures_in_the_docs_are_the_planners():
    """docs/demo.md quotes the 70B's peaks; they are recomputed here, so the page's guide
    cannot drift from what the page shows."""
    from pathlib import Path
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "demo.md")
                    .read_text(encoding="utf-8").split())
    gib = 2**30
    peak = {(z, r): demo_plan.plan(replace(BASE["70b"], zero=z, recompute=r))["numbers"]
            ["peak_memory"] / gib for z, r in ((0, "none"), (0, "full"), (3, "none"),
                                               (1, "full"), (3, "selective"), (3, "full"))}
    for (z, r), quoted in (((0, "none"), "334 GiB at the peak without recompute"),
                           ((0, "full"), "135 GiB with full recompute"),
                           ((3, "none"), "221 GiB with ZeRO-3 alone")):
        assert quoted in text and quoted.startswith(f"{peak[(z, r)]:.0f} GiB")
    for (z, r), quoted in (((1, "full"), "ZeRO-1 with full recompute {:.1f} GiB"),
                           ((3, "selective"), "ZeRO-3 with selective recompute {:.1f} GiB"),
                           ((3, "full"), "ZeRO-3 with full {:.1f} GiB")):
        assert quoted.format(peak[(z, r)]) in text


def test_worker_processes_compute_the_same_page_data():
    """demo_data's jobs: the scenarios computed over two processes are the ones computed
    here, key by key and in the embedded order (the runs are deterministic)."""
    todo = [Scenario("tiny", 1, 1, 1, 1), Scenario("tiny", 2, 1, 1, 1), BASE["70b"]]
    one = demo_data(scenarios=todo, jobs=1)["scenarios"]
    two = demo_data(scenarios=todo, jobs=2)["scenarios"]
    assert list(two) == [s.key for s in todo] and two == one
