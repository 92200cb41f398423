"""The demo's scenario controls in a real browser (the set-up: conftest.py).

The schedule changes the performance picture and the numbers, and back; ZeRO on the 70B
comes from the planner and recompute lowers the tiny run's peak; one control from a base
draws exactly demo_scenario's neighbours, the other options say they are not in the file;
every option is greyed out exactly when demo_scenario.check refuses its scenario, with
check's reason; a setting not in the file draws nothing until the base button.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from minipar.programs.demo_scenario import BASE, Scenario, check, neighbours

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("sync_api")]  # conftest.py


def svg_of(pg, selector: str) -> str:
    return pg.evaluate(f"document.querySelector({selector!r}).innerHTML")


def test_the_schedule_changes_the_performance_picture_and_numbers_and_back(page, data,
                                                                           scenario_key, value):
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


def test_zero_on_the_70b_comes_from_the_planner_and_recompute_lowers_the_peak(page, value):
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


def test_a_setting_not_in_the_file_draws_nothing_until_the_base(page, scenario_key):
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

