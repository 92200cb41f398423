"""The numbers the demo's page shows are minipar's, computed here independently of the
page's data (the set-up: conftest.py).

The 70B's dry run against plan.timeline; the tiny GPT's step time and every rank's peak
against a launch of parallelize(...).train_step (tests/conftest.py's tiny_launch); ZeRO's
memory on the 70B against the planner's rank_memory; the performance table against each
row's split. Each number's text is its value formatted as the page formats it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from minipar.plan.presets import CLUSTERS, MODELS
from minipar.plan.rank_memory import rank_memory
from minipar.plan.sized import as_gpt
from minipar.plan.timeline import timeline
from minipar.programs import demo_plan
from minipar.programs.demo_scenario import BASE
from minipar.runtime.ledger import fmt_bytes

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("sync_api")]  # conftest.py


def test_the_70b_dry_run_step_time_is_plan_timelines(page, data, shown_numbers, fmt_time):
    page.click("#tab-performance")
    page.select_option("#sc-model", "70b")
    s = BASE["70b"]
    nodes = -(-s.gpus // CLUSTERS["a100"].gpus_per_node)
    tl = timeline(as_gpt(MODELS["llama3-70b"]), demo_plan.layout_of(s),
                  CLUSTERS["a100"].topology(nodes), dtype="bfloat16",
                  compute_model="calibrated", max_grad_norm=1.0)
    shown = shown_numbers(page, data["scenarios"][s.key])
    assert shown["num-step-time"] == pytest.approx(tl.step_time, rel=1e-5)
    assert page.inner_text("#num-step-time") == fmt_time(tl.step_time) == "15.32 s"
    assert "does not fit in 74.51 GiB" in page.inner_text("#num-peak-where")
    assert page.problems == []


def test_the_tiny_runs_step_time_and_every_ranks_peak_are_a_launchs(page, data, shown_numbers,
                                                                     tiny_launch):
    """The step time (from the first rank's start to the last rank's end) and each rank's
    ledger peak over the step: the page's, and a direct launch's."""
    s = BASE["tiny"]
    assert (s.zero, s.chunks, s.gpus) == (0, 1, 8)  # DDP, one chunk: the table's 8 rows
    res = tiny_launch(s)
    T = max(r[1] for r in res) - min(r[0] for r in res)
    peaks = [r[3] for r in res]  # each rank's peak total
    page.click("#tab-state")
    shown = shown_numbers(page, data["scenarios"][s.key])
    assert shown["num-step-time"] == pytest.approx(T, rel=1e-5)
    assert shown["num-peak"] == max(peaks)
    got = page.evaluate("""[...document.querySelectorAll('#state-table tbody tr')].map(tr =>
        [Number(tr.dataset.rank), Number(tr.querySelector('td.total').dataset.value),
         tr.querySelector('td.total').textContent])""")
    assert [g[0] for g in got] == list(range(8))
    assert [g[1] for g in got] == peaks
    assert [g[2] for g in got] == [fmt_bytes(p) for p in peaks]
    assert page.problems == []


@pytest.mark.parametrize("zero", [1, 3])
def test_a_planner_scenarios_peak_is_rank_memorys(page, data, shown_numbers, value, zero):
    page.click("#tab-state")
    page.select_option("#sc-model", "70b")
    page.select_option("#sc-zero", str(zero))
    s = replace(BASE["70b"], zero=zero)
    mem = rank_memory(as_gpt(MODELS["llama3-70b"]), demo_plan.layout_of(s), CLUSTERS["a100"],
                      dropout=False)
    want = sum(int(t.peak) for t in mem.terms().values())
    shown = shown_numbers(page, data["scenarios"][s.key])
    assert shown["num-peak"] == want
    assert value(page, "num-peak") == float(page.get_attribute(
        "#state-table tr[data-rank='0'] td.total", "data-value"))
    assert page.problems == []


def test_the_performance_table_gives_each_rows_split(page, data):
    page.click("#tab-performance")
    sc = data["scenarios"][BASE["tiny"].key]
    got = page.evaluate("""[...document.querySelectorAll('#perf-table tr[data-rank]')].map(
        tr => [...tr.querySelectorAll('td')].map(td => Number(td.dataset.value)))""")
    assert got == [[r["split"]["compute"], r["split"]["comm"], r["split"]["idle"]]
                   for r in sc["rows"]]
    assert "latency-bound" in page.inner_text("#perf-note")
    assert "70B model for realistic proportions" in page.inner_text("#perf-note")
    assert page.problems == []

