"""The demo's four modes in a real browser, and the page as a whole (the set-up: conftest.py).

Each mode is a tab, switched by click and by keyboard, and the address names the mode the
page opens on; every embedded scenario, reached with the controls, draws in the data, state
and performance modes. One test serves the page (minipar demo --serve's server) and lets it
ask for a scenario it does not hold. The page is readable at 1280x800 and 1920x1080.
Screenshots of the four modes are taken in a temporary directory; with
MINIPAR_UPDATE_SCREENSHOTS=1 they replace docs/images/demo_<mode>.png (docs/demo.md shows
them), so a run of the suite never changes the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minipar.programs.demo_scenario import Scenario

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("sync_api")]  # conftest.py

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


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


def test_the_address_names_the_mode_it_opens_on(context, page_url, open_page):
    pg = open_page(context, page_url + "#state")
    assert mode_state(pg)["shown"] == ["panel-state"] and drawn(pg, "state")
    pg.click("#tab-performance")  # the address follows the tabs
    assert pg.evaluate("location.hash") == "#performance"
    pg.evaluate("location.hash = '#data'")
    pg.wait_for_function("window.minipar.mode() === 'data'")
    assert drawn(pg, "data") and pg.problems == []
    pg.close()


def test_each_mode_is_a_tab_switched_by_click_and_by_keyboard(page, modes):
    for m in modes:
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


def test_served_the_page_asks_the_server_for_what_it_does_not_hold(context, data, open_page,
                                                                   scenario_key, shown_numbers,
                                                                   serve_demo):
    """minipar demo --serve's server (its compute: the demo's own), the page from it: a
    scenario two controls from the base is computed on request; one minipar refuses says
    why, and nothing is drawn for it."""
    root, asked = serve_demo(data)
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


@pytest.mark.parametrize("width,height", [(1280, 800), (1920, 1080)])
def test_readable_at_laptop_and_projector_sizes(context, page_url, open_page, width, height):
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


def test_screenshots_of_the_four_modes(context, page_url, open_page, modes, tmp_path):
    """docs/images/demo_<mode>.png with MINIPAR_UPDATE_SCREENSHOTS=1 (docs/demo.md's): the
    kitchen with rank 5 selected; the tiny run's batch at its second step, a forward of
    stage 0; every rank's memory in the tiny run; the 70B's timelines on the kitchen, its
    four schedules side by side."""
    update = os.environ.get("MINIPAR_UPDATE_SCREENSHOTS") == "1"
    pg = open_page(context, page_url)
    for m in modes:
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
