"""`minipar demo`'s data and page without a browser: the groups are ParallelGroups', the rule
the page's script uses gives the same, and the page needs nothing outside itself.
(The page in a real browser: tests/viz/test_demo_*.py.)"""

import json
import re

import pytest

from minipar.cli import main
from minipar.programs.demo import PRESETS, demo_data, layout_data, parse_layout
from minipar.viz.demo import render_page

LAYOUTS = [(2, 4, 3), (8, 4, 2), (1, 1, 1), (3, 2, 2), (1, 8, 1), (16, 1, 2), (2, 8, 4)]


def rule(dp: int, tp: int, pp: int, gpn: int = 8) -> list[dict]:
    """The page's rule, written again: rank = i_tp + tp (i_dp + dp i_pp), node = rank // 8."""
    def rank(t, d, p):
        return t + tp * (d + dp * p)
    out = []
    for r in range(dp * tp * pp):
        t, d, p = r % tp, r // tp % dp, r // (tp * dp)
        out.append({"rank": r, "node": r // gpn, "tp_index": t, "pp_stage": p,
                    "dp_replica": d, "tp": [rank(i, d, p) for i in range(tp)],
                    "pp": [rank(t, d, i) for i in range(pp)],
                    "dp": [rank(t, i, p) for i in range(dp)]})
    return out


def test_the_kitchen_rank_5_is_on_node_0_with_its_pan_its_line_and_its_copy():
    k = layout_data(2, 4, 3)
    assert (k["gpus"], k["nodes"], k["gpus_per_node"]) == (24, 3, 8)
    assert k["ranks"][5] == {"rank": 5, "node": 0, "tp_index": 1, "pp_stage": 0,
                             "dp_replica": 1, "tp": [4, 5, 6, 7], "pp": [5, 13, 21],
                             "dp": [1, 5]}


def test_on_the_70b_layout_every_tp_group_sits_inside_a_node_and_pp_crosses_them():
    d = layout_data(8, 4, 2)
    assert (d["gpus"], d["nodes"]) == (64, 8)
    for r in d["ranks"]:
        assert len({d["ranks"][m]["node"] for m in r["tp"]}) == 1
        assert len({d["ranks"][m]["node"] for m in r["pp"]}) == 2
        assert len(r["dp"]) == 8


@pytest.mark.parametrize("dp,tp,pp", LAYOUTS)
def test_parallel_groups_follow_the_rule_the_page_uses(dp, tp, pp):
    assert layout_data(dp, tp, pp)["ranks"] == rule(dp, tp, pp)


def test_the_data_holds_the_seeds_layouts_first_and_each_extra_once():
    data = demo_data([(4, 2, 2), (2, 4, 3), (4, 2, 2)], scenarios=[])
    keys = [layout["key"] for layout in data["layouts"]]
    assert keys == [p[0] for p in PRESETS] + ["4x2x2"]
    assert data["gpus_per_node"] == 8 and set(data["captions"]) == {"dp", "tp", "pp"}


@pytest.mark.parametrize("text,want", [("2x4x3", (2, 4, 3)), (" 8X4x2 ", (8, 4, 2)),
                                       ("1×1×1", (1, 1, 1))])
def test_a_layout_is_written_dp_x_tp_x_pp(text, want):
    assert parse_layout(text) == want


@pytest.mark.parametrize("text,says", [("2x4", "DPxTPxPP"), ("0x4x3", "at least 1"),
                                       ("16x8x8", "at most 512"), ("a", "DPxTPxPP")])
def test_a_bad_layout_says_what_to_write(text, says):
    with pytest.raises(ValueError, match=says):
        parse_layout(text)


def test_the_page_is_self_contained_and_carries_its_data_back(demo_page):
    data = json.loads(json.dumps(demo_page[1]))
    data["captions"]["tp"] = "a pan </script><script>alert(1)</script> & more"
    page = render_page(data)
    assert "{{" not in page
    assert not re.search(r"(src|href)\s*=|https?://|<link|@import|url\(", page)
    assert page.count("</script>") == 2  # the data block's and the script's: nothing inside
    block = re.search(r'<script type="application/json" id="demo-data">(.*?)</script>',
                      page, re.S).group(1)
    assert json.loads(block) == data


def test_minipar_demo_writes_the_page(tmp_path, capsys, monkeypatch):
    """The command end to end, with two scenarios embedded (the whole set: demo_page)."""
    from minipar.programs import demo
    from minipar.programs.demo_scenario import BASE
    monkeypatch.setattr(demo, "embedded", lambda: [BASE["tiny"], BASE["70b"]])
    out = tmp_path / "demo.html"
    assert main(["demo", "--out", str(out), "--layout", "4x2x2"]) == 0
    page = out.read_text(encoding="utf-8")
    assert '"key":"4x2x2"' in page and '"key":"kitchen"' in page
    said = capsys.readouterr().out
    assert "wrote" in said and BASE["tiny"].key in page and BASE["70b"].key in page


@pytest.mark.parametrize("argv", [["--layout", "2x4"], ["--layout", "64x8x8"],
                                  ["--out", "/no/such/dir/demo.html"]])
def test_minipar_demo_refuses_a_bad_flag_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo"] + argv)
    assert e.value.code == 2
    assert "minipar demo: error" in capsys.readouterr().err
