"""The demo's data mode in a real browser: the stepper over the batch's journey (the set-up:
conftest.py).

Next, Prev, the slider, the keyboard and Play move through the step; at each step the text
names what runs (a stage's forward or backward of a micro-batch, or the tail's collectives
and their group) and the lit ranks are the journey's: every rank of a real run, every rank
of the stage in a dry run, which runs one rank a stage.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("sync_api")]  # conftest.py


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
def test_the_stepper_visits_every_step_of_the_journey(page, data, scenario_key, choose):
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
