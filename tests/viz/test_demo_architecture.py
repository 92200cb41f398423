"""The demo's architecture mode in a real browser (the set-up: conftest.py).

What is read from the page is compared with what minipar builds: the groups each GPU lights
up with ParallelGroups' for the same layout (every rank's, launched here), the counts shown
with the layout's (programs/demo.layout_data), and the page's own rule for a layout the
reader picks with layout_data's. The page opens from file:// with no console error and no
request to anything else; one test checks that the problem log catches both.
"""

from __future__ import annotations

import pytest

from minipar.parallel.mesh import ParallelDims, ParallelGroups
from minipar.programs.demo import layout_data
from minipar.runtime.launch import launch

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("sync_api")]  # conftest.py


def python_groups(dp: int, tp: int, pp: int) -> dict[int, dict[str, list[int]]]:
    """rank -> its tp, pp and dp groups, as every rank's own ParallelGroups builds them."""
    dims = ParallelDims(dp_replicate=dp, tp=tp, pp=pp)

    def mine(ctx):
        g = ParallelGroups(dims)
        return {"tp": list(g.tp.ranks), "pp": list(g.pp.ranks), "dp": list(g.dp.ranks)}
    return dict(enumerate(launch(mine, world_size=dims.world_size)))


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


def test_the_page_opens_from_file_offline_with_no_console_errors(page, modes):
    assert page.title().startswith("minipar demo")
    assert page.locator(".gpu").count() == 24 and page.locator(".node").count() == 3
    assert "not built" not in page.inner_text("body")
    for m in modes:  # each mode is named with what it shows
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

