"""`minipar demo`'s page in a real browser: Debian's chromium driven by Playwright for Python.

What is read from the page is compared with what minipar builds. Architecture mode: the
groups each GPU lights up with ParallelGroups' for the same layout, the counts shown with
the layout's. Data, state and performance modes: the numbers shown with minipar's, computed
here independently of the page's data (the 70B's dry run by plan.timeline, the tiny GPT's
step by a launch of parallelize(...).train_step, ZeRO's memory by the planner's
rank_memory); the scenarios one control away with demo_scenario's; the stepper's text and
lit ranks with the journey. The page is opened from file:// with every other request
refused, so it must work offline; one test serves it (minipar demo --serve's server) and
lets the page ask for a scenario it does not hold. Screenshots of the four modes are taken
in a temporary directory; with MINIPAR_UPDATE_SCREENSHOTS=1 they replace
docs/images/demo_<mode>.png (docs/demo.md shows them), so a run of the suite never changes
the checkout.

Playwright's own browser download cannot work on these machines, so the tests launch
/usr/bin/chromium (the `chromium` Debian package; .ci/run installs it) and skip, saying
why, where it or the playwright package is missing. MINIPAR_CHROMIUM names another binary.
The page is the session's (tests/conftest.py's demo_page: written once, about 10 s).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from minipar.nn.gpt import GPTConfig
from minipar.parallel.mesh import ParallelDims, ParallelGroups
from minipar.parallel.mesh.parallelize import parallelize
from minipar.plan.presets import CLUSTERS, MODELS
from minipar.plan.rank_memory import rank_memory
from minipar.plan.sized import as_gpt
from minipar.plan.timeline import timeline
from minipar.programs import demo_plan
from minipar.programs.demo import layout_data, scenario_data
from minipar.programs.demo_scenario import BASE, TINY, TINY_BATCH, Scenario, check, neighbours
from minipar.programs.demo_serve import DemoServer
from minipar.runtime.device import DeviceSpec
from minipar.runtime.launch import launch
from minipar.runtime.ledger import fmt_bytes
from minipar.runtime.topology import Topology

CHROMIUM = os.environ.get("MINIPAR_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
MODES = ("architecture", "data", "state", "performance")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason=f"no browser at {CHROMIUM}: install Debian's chromium "
                                        f"(apt-get install chromium; .ci/run does) or set "
                                        f"MINIPAR_CHROMIUM")]
sync_api = pytest.importorskip("playwright.sync_api", exc_type=ImportError,
                               reason="the playwright package cannot be imported (pip install "
                                      "-e '.[test]' installs it)")


def python_groups(dp: int, tp: int, pp: int) -> dict[int, dict[str, list[int]]]:
    """rank -> its tp, pp and dp groups, as every rank's own ParallelGroups builds them."""
    dims = ParallelDims(dp_replicate=dp, tp=tp, pp=pp)

    def mine(ctx):
        g = ParallelGroups(dims)
        return {"tp": list(g.tp.ranks), "pp": list(g.pp.ranks), "dp": list(g.dp.ranks)}
    return dict(enumerate(launch(mine, world_size=dims.world_size)))


@pytest.fixture(scope="module")
def page_url(demo_page):
    return demo_page[0].as_uri()


@pytest.fixture(scope="module")
def data(demo_page):
    return demo_page[1]


@pytest.fixture(scope="module")
def context():
    """One chromium, and one context of it (a fresh profile) for the module's pages."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = b.new_context(viewport={"width": 1280, "height": 800})
        yield context
        context.close()
        b.close()


def open_page(context, url: str, allowed=None, width: int = 1280, height: int = 800):
    """A new page at width x height with `url` open; `page.problems` collects console
    errors and warnings, uncaught exceptions and any request for something else than the
    page (or than allowed(url)). Close it with page.close()."""
    pg = context.new_page()
    pg.set_viewport_size({"width": width, "height": height})
    pg.problems = []
    pg.on("console", lambda m: m.type in ("error", "warning")
          and pg.problems.append(f"console {m.type}: {m.text}"))
    pg.on("pageerror", lambda e: pg.problems.append(f"uncaught: {e}"))

    def refuse_network(route):
        u = route.request.url
        if u != url.split("#")[0] and not (allowed and allowed(u)):
            pg.problems.append(f"request: {u}")
            return route.abort()
        return route.continue_()
    pg.route("**/*", refuse_network)
    pg.goto(url)
    return pg


@pytest.fixture
def page(context, page_url):
    """The demo from file:// at 1280x800 (open_page)."""
    pg = open_page(context, page_url)
    yield pg
    pg.close()


# ---------------------------------------------------------------- the architecture mode

LIT = """() => {const out = {}; for (const k of ["tp", "pp", "dp"]) out[k] =
  [...document.querySelectorAll(".gpu.in-" + k)].map(b => Number(b.dataset.rank))
  .sort((a, b) => a - b); return out;}"""
LIT_ALL = """() => [...document.querySelectorAll(".gpu")].map(b => { b.focus();
  const out = {rank: Number(b.dataset.rank)};
  for (const k of ["tp", "pp", "dp"]) out[k] = [...document.querySelectorAll(".gpu.in-" + k)]
    .map(x => Number(x.dataset.rank)).sort((a, c) => a - c);
  return out; })"""


def pick(pg, dp: int, tp: int, pp: int) -> None:
    for k, v in (("dp", dp), ("tp", tp), ("pp", pp)):
        pg.select_option(f"#{k}", str(v))


def python_numbers(dp: int, tp: int, pp: int) -> dict[str, int]:
    """What the page should show, from minipar: GPUs and nodes of the layout's data, and
    how many distinct groups of each kind its ranks' ParallelGroups hold."""
    groups, d = python_groups(dp, tp, pp), layout_data(dp, tp, pp)
    count = {k: len({tuple(g[k]) for g in groups.values()}) for k in ("tp", "pp", "dp")}
    return {"gpus": len(groups), "nodes": d["nodes"], "per-node": d["gpus_per_node"],
            "tp-groups": count["tp"], "pp-groups": count["pp"], "dp-groups": count["dp"]}


def numbers(pg) -> dict[str, int]:
    return {k: int(pg.inner_text(f"#n-{k}"))
            for k in ("gpus", "nodes", "per-node", "tp-groups", "pp-groups", "dp-groups")}


def test_the_page_opens_from_file_offline_with_no_console_errors(page):
    assert page.title().startswith("minipar demo")
    assert page.locator(".gpu").count() == 24 and page.locator(".node").count() == 3
    assert "not built" not in page.inner_text("body")
    for m in MODES:  # each mode is named with what it shows
        assert m + ":" in page.inner_text("#modes")
    for term, caption in (("DP replicas", "copies of the kitchen"),
                          ("PP stages", "stations in a line"), ("TP shards", "shared by")):
        assert f"{term} (" in page.inner_text("#modes") and caption in page.inner_text("#modes")
    assert page.evaluate("window.minipar.mode()") == "architecture"
    page.focus('.gpu[data-rank="5"]')
    assert page.problems == []


def test_hover_and_focus_light_up_exactly_the_gpus_groups(page):
    kitchen = python_groups(2, 4, 3)
    page.hover('.gpu[data-rank="5"]')
    assert page.evaluate(LIT) == kitchen[5]
    assert page.inner_text("#info-summary") == \
        "rank 5: node 0, tp group [4..7], pp stage 0, dp replica 1"
    page.focus('.gpu[data-rank="18"]')
    assert page.evaluate(LIT) == kitchen[18]
    page.keyboard.press("ArrowRight")  # the keyboard moves to the next rank, and Tab too
    assert page.evaluate("document.activeElement.dataset.rank") == "19"
    assert page.evaluate(LIT) == kitchen[19]
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.rank") == "20"
    assert page.evaluate(LIT) == kitchen[20]
    assert page.problems == []


@pytest.mark.parametrize("key,sizes", [("kitchen", (2, 4, 3)), ("70b", (8, 4, 2)),
                                       ("4x2x2", (4, 2, 2))])
def test_each_embedded_layout_lights_up_parallel_groups_for_every_gpu(page, key, sizes):
    page.select_option("#preset", key)
    want = python_groups(*sizes)
    got = page.evaluate(LIT_ALL)
    assert len(got) == len(want)
    for g in got:
        assert {k: g[k] for k in ("tp", "pp", "dp")} == want[g["rank"]], g["rank"]
    assert page.evaluate("window.minipar.source()") == "python"
    assert page.problems == []


@pytest.mark.parametrize("sizes", [(1, 8, 1), (3, 2, 2), (16, 1, 2), (2, 8, 4), (1, 1, 1),
                                   (6, 2, 3)])
def test_the_controls_redraw_and_the_pages_rule_gives_parallel_groups(page, sizes):
    dp, tp, pp = sizes
    pick(page, dp, tp, pp)
    want_numbers = python_numbers(dp, tp, pp)
    assert numbers(page) == want_numbers
    assert page.locator(".gpu").count() == want_numbers["gpus"]
    assert page.locator(".node").count() == want_numbers["nodes"]
    assert page.input_value("#preset") == "custom"
    assert page.evaluate("window.minipar.source()") == "page"
    want = python_groups(dp, tp, pp)
    got = page.evaluate(LIT_ALL)
    for g in got:
        assert {k: g[k] for k in ("tp", "pp", "dp")} == want[g["rank"]], g["rank"]
    assert page.problems == []


def test_the_pages_rule_gives_minipars_layout_data(page):
    """window.minipar.computeLayout, the script's rule, against programs/demo.layout_data
    (ParallelGroups on a launched world): every rank's node, coordinate and groups."""
    for sizes in [(2, 4, 3), (8, 4, 2), (3, 2, 2), (1, 8, 1), (16, 1, 2), (6, 4, 1),
                  (2, 2, 8)]:
        got = page.evaluate("s => window.minipar.computeLayout(s[0], s[1], s[2], 8)",
                            list(sizes))
        want = layout_data(*sizes)
        for k in ("dp", "tp", "pp", "gpus", "gpus_per_node", "nodes", "ranks"):
            assert got[k] == want[k], (sizes, k)
    assert page.problems == []


def test_the_problem_log_sees_a_console_error_and_a_request(page):
    """The check the other tests rely on: an error and a network request are caught."""
    page.evaluate("console.error('boom')")
    page.evaluate("""() => new Promise(done => { const i = new Image(); i.onerror = done;
        i.onload = done; i.src = 'https://example.invalid/x.png'; })""")
    assert any("boom" in p for p in page.problems)
    assert any("example.invalid" in p for p in page.problems)


def test_the_numbers_change_with_the_layout_and_back(page):
    before = numbers(page)
    pick(page, 8, 4, 2)  # the 70B layout: embedded, so the preset follows the selects
    assert numbers(page) == python_numbers(8, 4, 2) == {
        "gpus": 64, "nodes": 8, "per-node": 8, "tp-groups": 16, "pp-groups": 32,
        "dp-groups": 8}
    assert page.input_value("#preset") == "70b"
    page.select_option("#preset", "kitchen")
    assert numbers(page) == before == python_numbers(2, 4, 3)
    page.select_option("#colour", "dp")
    assert "dp replica 1" in page.inner_text("#legend")
    assert page.problems == []


# ------------------------------------------------------------- the modes and the controls

def visible(pg, selector: str) -> bool:
    return pg.is_visible(selector)


def mode_state(pg) -> dict:
    return pg.evaluate("""() => ({mode: window.minipar.mode(),
        selected: [...document.querySelectorAll('[role=tab]')].filter(t =>
            t.getAttribute('aria-selected') === 'true').map(t => t.id),
        shown: [...document.querySelectorAll('[role=tabpanel]')].filter(p => !p.hidden)
            .map(p => p.id), focus: document.activeElement.id})""")


def drawn(pg, mode: str) -> bool:
    """The mode's picture is there (a data mode's step text, a state or performance SVG)."""
    return pg.evaluate("""m => ({architecture: () => document.querySelectorAll('.gpu').length,
        data: () => document.querySelector('#step-text').textContent.startsWith('step 1 of'),
        state: () => document.querySelectorAll('#state-bars svg rect').length,
        performance: () => document.querySelectorAll('#perf-timeline svg rect.action')
            .length})[m]()""", mode)


def test_the_address_names_the_mode_it_opens_on(context, page_url):
    pg = open_page(context, page_url + "#state")
    assert mode_state(pg)["shown"] == ["panel-state"] and drawn(pg, "state")
    pg.click("#tab-performance")  # the address follows the tabs
    assert pg.evaluate("location.hash") == "#performance"
    pg.evaluate("location.hash = '#data'")
    pg.wait_for_function("window.minipar.mode() === 'data'")
    assert drawn(pg, "data") and pg.problems == []
    pg.close()


def test_each_mode_is_a_tab_switched_by_click_and_by_keyboard(page):
    for m in MODES:
        page.click(f"#tab-{m}")
        s = mode_state(page)
        assert (s["mode"], s["selected"], s["shown"]) == (m, [f"tab-{m}"], [f"panel-{m}"])
        assert drawn(page, m), m
        if m != "architecture":  # the scenario's controls go with the panel
            assert page.is_visible(f"#panel-{m} #scenario-controls #sc-dp")
            assert page.get_attribute("#num-step-time", "data-value")
    page.focus("#tab-performance")
    for key, want in [("ArrowRight", "architecture"), ("ArrowRight", "data"),
                      ("ArrowRight", "state"), ("ArrowLeft", "data"), ("End", "performance"),
                      ("Home", "architecture"), ("ArrowLeft", "performance")]:
        page.keyboard.press(key)
        s = mode_state(page)
        assert (s["mode"], s["focus"], s["shown"]) == (want, f"tab-{want}", [f"panel-{want}"])
        assert page.get_attribute(f"#tab-{want}", "tabindex") == "0"
        assert drawn(page, want), want
    page.keyboard.press("Tab")  # from the tab into its panel: the first control
    assert page.evaluate("document.activeElement.id") == "sc-model"
    assert page.problems == []


def scenario_key(pg) -> str | None:
    return pg.evaluate("window.minipar.scenario() && window.minipar.scenario().scenario.key")


def value(pg, id_: str) -> float:
    return float(pg.get_attribute(f"#{id_}", "data-value"))


def svg_of(pg, selector: str) -> str:
    return pg.evaluate(f"document.querySelector({selector!r}).innerHTML")


def test_the_schedule_changes_the_performance_picture_and_numbers_and_back(page, data):
    page.click("#tab-performance")
    page.select_option("#sc-model", "70b")
    base = BASE["70b"]
    assert scenario_key(page) == base.key
    before = (svg_of(page, "#perf-timeline"), value(page, "num-step-time"),
              value(page, "num-peak"))
    page.select_option("#sc-schedule", "gpipe")
    gpipe = replace(base, schedule="gpipe")
    assert scenario_key(page) == gpipe.key
    assert svg_of(page, "#perf-timeline") != before[0]
    # GPipe and 1F1B have the same bubble here (the same step time), not the same memory
    assert value(page, "num-step-time") == data["scenarios"][gpipe.key]["numbers"]["step_time"]
    assert value(page, "num-peak") > before[2]
    page.select_option("#sc-schedule", "zb_h1")
    assert value(page, "num-step-time") < before[1]
    assert page.input_value("#sc-chunks") == "1"
    page.select_option("#sc-schedule", "interleaved_1f1b")  # takes two chunks
    assert page.input_value("#sc-chunks") == "2" and not page.is_disabled("#sc-chunks")
    assert scenario_key(page) == replace(base, schedule="interleaved_1f1b", chunks=2).key
    page.select_option("#sc-schedule", "1f1b")
    assert (svg_of(page, "#perf-timeline"), value(page, "num-step-time"),
            value(page, "num-peak")) == before
    assert page.is_disabled("#sc-chunks")
    # the four schedules side by side, each named with its step time
    figs = page.locator("#perf-schedules figure")
    assert figs.count() == 4
    for i, name in enumerate(("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")):
        assert figs.nth(i).get_attribute("data-schedule") == name
        assert figs.nth(i).locator("svg rect.action").count() > 0
    page.click("#perf-schedules figure[data-schedule=zb_h1] button")
    assert scenario_key(page) == replace(base, schedule="zb_h1").key
    assert page.input_value("#sc-schedule") == "zb_h1"
    assert page.problems == []


def test_zero_on_the_70b_comes_from_the_planner_and_recompute_lowers_the_peak(page, data):
    page.click("#tab-state")
    page.select_option("#sc-model", "70b")
    assert "dry run" in page.inner_text("#sc-source .badge")
    peak = value(page, "num-peak")
    assert page.locator("#state-curve svg polygon").count() >= 4
    page.select_option("#sc-zero", "1")
    assert page.inner_text("#sc-source .badge") == "planner"
    assert value(page, "num-peak") < peak
    assert page.locator("#state-bars svg rect").count() >= 4  # the bars, and no curve
    assert page.locator("#state-curve svg").count() == 0
    assert "no curve" in page.inner_text("#state-curve-text")
    assert not page.is_visible("#state-rank")
    page.click("#tab-performance")
    assert page.locator("#perf-timeline svg").count() == 0
    assert "not a timeline" in page.inner_text("#perf-note")
    page.click("#tab-data")
    assert "no journey" in page.inner_text("#step-text")
    page.select_option("#sc-model", "tiny")  # the tiny base: recompute lowers its peak
    page.click("#tab-state")
    none = value(page, "num-peak")
    curve = svg_of(page, "#state-curve")
    page.select_option("#sc-recompute", "full")
    assert value(page, "num-peak") < none
    assert svg_of(page, "#state-curve") != curve
    page.select_option("#state-rank", "5")  # another rank's curve
    assert "rank 5 " in page.inner_text("#state-curve-text")
    assert page.problems == []


def lit(pg) -> list[int]:
    return pg.evaluate("""[...document.querySelectorAll('#data-pipeline .chip.lit')]
        .map(c => Number(c.dataset.rank)).sort((a, b) => a - b)""")


def test_next_advances_the_journey_and_lights_other_ranks(page):
    page.click("#tab-data")
    text, ranks = page.inner_text("#step-text"), lit(page)
    assert text.startswith("step 1 of") and ranks == [0, 1, 2, 3]
    assert page.is_disabled("#step-prev")
    seen = set()
    for _ in range(3):
        page.click("#step-next")
        assert page.inner_text("#step-text") != text
        text = page.inner_text("#step-text")
        seen.add(tuple(lit(page)))
    assert (4, 5, 6, 7) in seen
    page.click("#step-prev")
    assert page.inner_text("#step-text").startswith("step 3 of")
    page.fill("#step-slider", "1")  # the slider too
    assert page.inner_text("#step-text").startswith("step 1 of")
    page.focus("#step-next")  # and the keyboard: Enter on Next, the arrows on the slider
    page.keyboard.press("Enter")
    assert page.inner_text("#step-text").startswith("step 2 of")
    page.focus("#step-slider")
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#step-text").startswith("step 3 of")
    page.click("#step-play")  # Play steps on by itself until Pause
    assert page.inner_text("#step-play") == "Pause"
    page.wait_for_function("document.getElementById('step-text').textContent"
                           ".startsWith('step 4 of')", timeout=5_000)
    page.click("#step-play")
    assert page.inner_text("#step-play") == "Play"
    assert page.problems == []


def stage_ranks(s: dict, stage: int) -> list[int]:
    """Every rank of pipeline stage `stage`: ParallelDims' order, tp fastest, then dp."""
    return [t + s["tp"] * (d + s["dp"] * stage) for d in range(s["dp"])
            for t in range(s["tp"])]


def expected_lit(sc: dict, ranks: list[int]) -> list[int]:
    if sc["every_rank"]:
        return sorted(ranks)
    s = sc["scenario"]
    stages = sorted({r // (s["tp"] * s["dp"]) for r in ranks})
    return sorted(r for p in stages for r in stage_ranks(s, p))


@pytest.mark.parametrize("choose", [{}, {"model": "70b", "schedule": "zb_h1"},
                                    {"model": "70b", "schedule": "interleaved_1f1b"}])
def test_the_stepper_visits_every_step_of_the_journey(page, data, choose):
    page.click("#tab-data")
    for k, v in choose.items():
        page.select_option(f"#sc-{k}", v)
    sc = data["scenarios"][scenario_key(page)]
    journey, s = sc["journey"], sc["scenario"]
    seen = page.evaluate("""n => { const out = [];  // each step's text and lit ranks, by Next
        for (let i = 0; i < n; i++) {
          out.push([document.getElementById('step-text').textContent,
            [...document.querySelectorAll('#data-pipeline .chip.lit')].map(c =>
              Number(c.dataset.rank)).sort((a, b) => a - b)]);
          if (i + 1 < n) document.getElementById('step-next').click();
        }
        return out; }""", len(journey))
    for i, (step, (text, lit_ranks)) in enumerate(zip(journey, seen)):
        assert text.startswith(f"step {i + 1} of {len(journey)}, t = ")
        if step["kind"] == "tail":
            assert step["name"].replace("_", "-") in text, text
            over = {"world": "over all ranks", "other": "over another group"}
            assert over.get(step["group"], f"over {step['group']}") in text, text
        else:
            assert f"stage {step['stage']} " in text and f" runs {step['kind']} (" in text
            assert f"micro-batch {step['microbatch']} " in text, text
            if s["chunks"] > 1:
                assert f"pp stage {step['stage'] % s['pp']}, its chunk " in text, text
        assert lit_ranks == expected_lit(sc, step["ranks"]), (i, text)
    assert page.is_disabled("#step-next") and not page.is_disabled("#step-prev")
    assert page.problems == []


ONE_CHANGE = """model => {
  const pick = (id, v) => { const s = document.getElementById(id); s.value = v;
    s.dispatchEvent(new Event('change', {bubbles: true})); };
  const key = () => window.minipar.scenario() && window.minipar.scenario().scenario.key;
  pick('sc-model', model);
  const out = [], base = key();
  for (const c of ['layout', 'dp', 'tp', 'pp', 'microbatches', 'schedule', 'chunks', 'zero',
                   'recompute']) {
    const sel = document.getElementById('sc-' + c);
    if (sel.disabled) continue;
    for (const o of [...sel.options].filter(o => !o.disabled).map(o => [o.value,
                                                                     o.textContent])) {
      pick('sc-' + c, o[0]);
      out.push({control: c, value: o[0], label: o[1], key: key(),
                message: document.getElementById('sc-message').textContent,
                step: document.getElementById('num-step-time').getAttribute('data-value'),
                view: !document.getElementById('perf-view').hidden});
      document.getElementById('sc-base').click();
      if (key() !== base) throw new Error('back to the base failed after ' + c);
    }
  }
  return out;
}"""


def reachable_in_one_change(pg, model: str) -> tuple[set, set]:
    """Starting from the model's base, each option of each scenario control chosen once
    (the page's own change events, in one call): the keys drawn, and the keys of the
    options the page marks "*" (not in it), after checking nothing is drawn for them."""
    drawn_keys, missing = set(), set()
    for r in pg.evaluate(ONE_CHANGE, model):
        if r["label"].endswith(" *"):
            assert r["key"] is None and r["step"] is None and not r["view"], r
            assert "is not in this file" in r["message"] and "--serve" in r["message"], r
            missing.add(r["message"].split(" ")[0])
        else:
            assert r["key"] is not None and r["view"], r
            drawn_keys.add(r["key"])
    return drawn_keys, missing


@pytest.mark.parametrize("model", ["tiny", "70b"])
def test_one_control_from_the_base_draws_exactly_the_embedded_neighbours(page, model):
    """The page's key and its control rules (pp = 1, the interleaved schedule's chunks)
    against demo_scenario: what one change draws are the base's neighbours; the other
    options say they are not in the file, and computing them needs --serve."""
    page.click("#tab-performance")
    drawn_keys, missing = reachable_in_one_change(page, model)
    assert drawn_keys == {s.key for s in neighbours(BASE[model])}
    assert missing and not missing & drawn_keys
    assert page.problems == []


EVERY_SCENARIO = """keys => keys.map(k => {
  const [model, layout, schedule, m, v, z, recompute] = k.split('/');
  const pick = (id, value) => { const s = document.getElementById(id); s.value = value;
    s.dispatchEvent(new Event('change', {bubbles: true})); };
  const [dp, tp, pp] = layout.split('x');
  document.getElementById('tab-architecture').click();  // nothing drawn while picking
  pick('sc-model', model);
  for (const [id, value] of [['sc-dp', dp], ['sc-tp', tp], ['sc-pp', pp],
                             ['sc-microbatches', m.slice(1)], ['sc-schedule', schedule],
                             ['sc-chunks', v.slice(1)], ['sc-zero', z.slice(1)],
                             ['sc-recompute', recompute]])
    if (!document.getElementById(id).disabled) pick(id, value);
  const sc = window.minipar.scenario(), out = {key: sc && sc.scenario.key};
  for (const mode of ['data', 'state', 'performance']) {
    document.getElementById('tab-' + mode).click();
    out[mode] = document.getElementById('panel-' + mode).innerText.length;
  }
  out.text = document.getElementById('step-text').textContent;
  out.bars = document.querySelectorAll('#state-bars svg rect').length;
  out.curve = document.querySelectorAll('#state-curve svg polygon').length;
  out.timeline = document.querySelectorAll('#perf-timeline svg rect.action').length;
  out.table = document.querySelectorAll('#perf-table tbody tr').length;
  return out;
})"""


def test_every_embedded_scenario_draws_in_every_mode(page, data):
    """Each scenario in the page, reached with the controls, drawn in the data, state and
    performance modes without an error: bars always, a curve and a timeline except from
    the planner, a journey except on one GPU or from the planner."""
    keys = list(data["scenarios"])
    for key, got in zip(keys, page.evaluate(EVERY_SCENARIO, keys)):
        sc = data["scenarios"][key]
        assert got["key"] == key
        planner = sc["source"] == "planner"
        assert got["bars"] >= 1 and (got["curve"] >= 1) != planner, key
        assert got["table"] == (1 if planner else len(sc["rows"]) + 1), key
        assert got["timeline"] == sum(len(r["actions"]) for r in sc["rows"]), key
        assert got["text"].startswith(f"step 1 of {len(sc['journey'])}") == \
            bool(sc["journey"]), key
    assert page.problems == []


OPTIONS = """steps => {
  const pick = (id, value) => { const s = document.getElementById(id); s.value = value;
    s.dispatchEvent(new Event('change', {bubbles: true})); };
  for (const [id, value] of steps) pick(id, value);
  return [...document.querySelectorAll('#scenario-controls option')].map(o => ({
    control: o.parentElement.id, value: o.value, key: o.dataset.key, disabled: o.disabled,
    why: o.title, selected: o.selected}));
}"""


def scenario_of(key: str) -> Scenario:
    model, layout, schedule, m, v, z, recompute = key.split("/")
    dp, tp, pp = (int(x) for x in layout.split("x"))
    return Scenario(model, dp, tp, pp, int(m[1:]), int(v[1:]), schedule, int(z[1:]),
                    recompute)


@pytest.mark.parametrize("steps,refuses", [
    ([], False), ([("sc-model", "70b")], False), ([("sc-pp", "1")], False),
    ([("sc-microbatches", "8")], True), ([("sc-schedule", "interleaved_1f1b")], False),
    ([("sc-dp", "1")], True), ([("sc-zero", "2")], True),
    ([("sc-model", "70b"), ("sc-layout", "2x4x3"), ("sc-microbatches", "6"),
      ("sc-schedule", "interleaved_1f1b")], True),
    ([("sc-model", "70b"), ("sc-zero", "3")], True),
    ([("sc-model", "70b"), ("sc-pp", "1")], False)])
def test_the_controls_grey_out_what_minipar_refuses_saying_why(page, steps, refuses):
    """From a few settings, every option of every control: greyed out exactly when
    demo_scenario.check refuses the scenario it leads to (data-key), with check's reason."""
    options = page.evaluate(OPTIONS, steps)
    assert options and not any(o["selected"] and o["disabled"] for o in options)
    refused = 0
    for o in options:
        s = scenario_of(o["key"])
        if o["disabled"]:
            refused += 1
            with pytest.raises(ValueError) as e:
                check(s)
            assert str(e.value) == o["why"], o
            assert o["why"] in page.inner_text("#sc-marks")
        else:
            check(s)
    assert bool(refused) == refuses
    assert page.problems == []


def test_a_setting_not_in_the_file_draws_nothing_until_the_base(page):
    page.click("#tab-performance")
    page.select_option("#sc-schedule", "gpipe")  # one away: drawn
    page.select_option("#sc-microbatches", "8")  # two away: not in the file
    assert scenario_key(page) is None
    assert page.get_attribute("#num-step-time", "data-value") is None
    assert page.inner_text("#num-step-time") == "–"
    assert page.inner_text("#sc-source") == ""
    assert not page.is_visible("#perf-timeline") and not page.is_visible("#perf-table")
    page.click("#tab-data")
    assert not page.is_visible("#step-text")
    page.click("#sc-base")
    assert scenario_key(page) == BASE["tiny"].key and page.is_visible("#step-text")
    assert page.problems == []


# -------------------------------------------------------- the numbers are minipar's

def to_precision(x: float, digits: int) -> str:
    """x with `digits` significant digits, trailing zeros kept (JavaScript's toPrecision,
    for the numbers shown here)."""
    return f"{x:.{max(0, digits - 1 - math.floor(math.log10(abs(x))))}f}"


def fmt_time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(t) >= scale or unit == "ns":
            return f"{to_precision(t / scale, 4)} {unit}"


FORMATS = {"num-step-time": fmt_time, "num-compute": lambda x: f"{x * 100:.1f}%",
           "num-comm": lambda x: f"{x * 100:.1f}%", "num-idle": lambda x: f"{x * 100:.1f}%",
           "num-mfu": lambda x: to_precision(x * 100, 3) + "%",
           "num-peak": lambda x: fmt_bytes(int(x))}
FIELDS = {"num-step-time": "step_time", "num-compute": "compute_share",
          "num-comm": "comm_share", "num-idle": "idle_share", "num-mfu": "mfu",
          "num-peak": "peak_memory"}


def shown_numbers(pg, sc: dict) -> dict:
    """The numbers panel: each data-value is the scenario's, its text the value formatted."""
    out = {}
    for id_, fmt in FORMATS.items():
        v = value(pg, id_)
        assert v == sc["numbers"][FIELDS[id_]], id_
        assert pg.inner_text(f"#{id_}") == fmt(v), id_
        out[id_] = v
    where = pg.inner_text("#num-peak-where")
    assert f"rank {sc['numbers']['peak_rank']}" in where
    over = sc["numbers"]["peak_memory"] > sc["capacity"]
    assert ("does not fit in " + fmt_bytes(sc["capacity"]) in where) == over
    return out


def test_the_70b_dry_run_step_time_is_plan_timelines(page, data):
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


def tiny_step(s: Scenario) -> tuple[float, list[int]]:
    """One train_step of the tiny GPT under `s` (demo_run.run's arguments), launched here:
    the step time (from the first rank's start to the last rank's end) and each rank's
    ledger peak over the step."""
    cfg = GPTConfig(**TINY, dtype="float32", recompute=s.recompute)
    dims = ParallelDims(dp_replicate=s.dp, tp=s.tp, pp=s.pp)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_BATCH))
    targets = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_BATCH))
    pipe = dict(schedule=s.schedule, microbatches=s.microbatches) if s.pp > 1 else {}

    def step(ctx):
        p = parallelize(cfg, dims, sequence_parallel=s.tp > 1, lr=1e-3, placement="any",
                        max_grad_norm=1.0, **pipe)
        start = ctx.clock.elapsed()
        ctx.ledger.reset_peak()
        p.train_step(ids, targets)
        return start, ctx.clock.elapsed(), ctx.ledger.peak()
    res = launch(step, s.gpus, topology=Topology.nodes(1, s.gpus, DeviceSpec.a100_80gb()))
    return max(r[1] for r in res) - min(r[0] for r in res), [r[2] for r in res]


def test_the_tiny_runs_step_time_and_every_ranks_peak_are_a_launchs(page, data):
    s = BASE["tiny"]
    assert (s.zero, s.chunks, s.gpus) == (0, 1, 8)  # what tiny_step builds
    T, peaks = tiny_step(s)
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
def test_a_planner_scenarios_peak_is_rank_memorys(page, data, zero):
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


# ------------------------------------------------------------------ served: --serve

def test_served_the_page_asks_the_server_for_what_it_does_not_hold(context, data):
    """minipar demo --serve's server (its compute: the demo's own), the page from it: a
    scenario two controls from the base is computed on request; one minipar refuses says
    why, and nothing is drawn for it."""
    asked = []

    def compute(s):
        asked.append(s.key)
        return scenario_data(s)
    server = DemoServer(("127.0.0.1", 0), data, compute)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    root = f"http://127.0.0.1:{server.server_address[1]}/"
    pg = open_page(context, root, allowed=lambda u: u.startswith(root + "api/scenario?"))
    try:
        pg.click("#tab-performance")
        assert "*" not in pg.inner_text("#sc-microbatches")
        pg.select_option("#sc-schedule", "gpipe")
        pg.select_option("#sc-microbatches", "8")
        want = Scenario("tiny", 2, 2, 2, 8, schedule="gpipe")
        pg.wait_for_function("window.minipar.scenario() !== null", timeout=60_000)
        assert asked == [want.key] and scenario_key(pg) == want.key
        shown_numbers(pg, pg.evaluate("window.minipar.scenario()"))
        assert pg.locator("#perf-timeline svg rect.action").count() == 8 * 16
        # the page greys out what minipar refuses, so a refusal comes from the server only
        # for what the page does not know: here one the test makes the server give
        pg.route(root + "api/scenario?*", lambda route: route.fulfill(
            status=400, json={"error": "refused by the test's server"}))
        pg.select_option("#sc-recompute", "full")
        pg.wait_for_function("document.querySelector('#sc-message').textContent"
                             ".includes('cannot build')", timeout=30_000)
        assert "refused by the test's server" in pg.inner_text("#sc-message")
        assert asked == [want.key]
        assert scenario_key(pg) is None and not pg.is_visible("#perf-timeline")
        assert pg.problems == [] or all("400" in p for p in pg.problems), pg.problems
    finally:
        pg.close()
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------ sizes, screenshots

@pytest.mark.parametrize("width,height", [(1280, 800), (1920, 1080)])
def test_readable_at_laptop_and_projector_sizes(context, page_url, width, height):
    pg = open_page(context, page_url, width=width, height=height)
    for key in ("kitchen", "70b"):
        pg.select_option("#preset", key)
        assert pg.evaluate("document.documentElement.scrollWidth <= innerWidth")
        clipped = pg.evaluate("""() => [...document.querySelectorAll('.gpu')].filter(b =>
            b.scrollWidth > b.clientWidth + 1).map(b => b.dataset.rank)""")
        assert clipped == []
        smallest = pg.evaluate("""() => Math.min(...[...document.querySelectorAll(
            '.gpu .c')].map(e => parseFloat(getComputedStyle(e).fontSize)))""")
        assert smallest >= 11
        # the whole cluster fits the screen's height at both sizes, the 70B's 8 nodes too
        bottom = pg.evaluate("document.querySelector('#fabric').getBoundingClientRect()"
                             ".bottom")
        assert bottom <= height, key
        # each node's label sits inside its node's box
        outside = pg.evaluate("""() => [...document.querySelectorAll('.node')].filter(n => {
            const a = n.getBoundingClientRect(), h = n.querySelector('h3')
            .getBoundingClientRect(); return h.top < a.top || h.bottom > a.bottom; })
            .map(n => n.dataset.node)""")
        assert outside == [], key
    for model in ("tiny", "70b"):
        for m in ("data", "state", "performance"):
            pg.click(f"#tab-{m}")
            pg.select_option("#sc-model", model)
            assert pg.evaluate("document.documentElement.scrollWidth <= innerWidth"), (m, model)
            # the drawings are drawn at their width (not scaled down) with text >= 11 px
            sizes = pg.evaluate(f"""[...document.querySelectorAll('#panel-{m} svg')].map(s =>
                [s.getBoundingClientRect().width, s.viewBox.baseVal.width,
                 Math.min(...[...s.querySelectorAll('text')].map(t =>
                 Number(t.getAttribute('font-size'))))])""")
            assert sizes or m == "data", (m, model)  # the data mode draws with HTML
            for shown_w, drawn_w, font in sizes:
                assert abs(shown_w - drawn_w) <= 2 and font >= 11, (m, model, sizes)
            smallest = pg.evaluate(f"""Math.min(...[...document.querySelectorAll(
                '#panel-{m} *')].filter(e => e.offsetParent && e.childNodes.length &&
                [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()))
                .map(e => parseFloat(getComputedStyle(e).fontSize)))""")
            assert smallest >= 11, (m, model)
    assert pg.problems == []
    pg.close()


def test_screenshots_of_the_four_modes(context, page_url, tmp_path):
    """docs/images/demo_<mode>.png with MINIPAR_UPDATE_SCREENSHOTS=1 (docs/demo.md's): the
    kitchen with rank 5 selected; the tiny run's batch at its second step, a forward of
    stage 0; every rank's memory in the tiny run; the 70B's timelines on the kitchen, its
    four schedules side by side."""
    update = os.environ.get("MINIPAR_UPDATE_SCREENSHOTS") == "1"
    pg = open_page(context, page_url)
    for m in MODES:
        pg.click(f"#tab-{m}")
        if m == "architecture":
            pg.focus('.gpu[data-rank="5"]')
        elif m == "data":
            pg.click("#step-next")
            assert "stage 0 runs F (forward) of micro-batch 1" in pg.inner_text("#step-text")
        elif m == "performance":
            for k, v in (("model", "70b"), ("layout", "2x4x3"), ("microbatches", "6")):
                pg.select_option(f"#sc-{k}", v)
            assert pg.locator("#perf-schedules figure").count() == 4
        shot = (IMAGES if update else tmp_path) / f"demo_{m}.png"
        pg.screenshot(path=str(shot), full_page=m != "architecture")
        assert 0 < shot.stat().st_size < 400_000, m
    assert pg.problems == []
    pg.close()
