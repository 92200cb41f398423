"""The three incidents at the seed's scale, predicted by the planner (incidents/planned.py):
which of the seed's numbers hold."""

import pytest

from minipar.programs.incidents import planned


def test_a_tp_over_nodes_is_slower_and_its_collectives_dominate():
    r = planned.plan_a()
    a, b = r["tp16"], r["tp8"]
    assert a["step_seconds"] > b["step_seconds"] and r["speedup"] > 1.2
    assert a["tp_seconds"] > 3 * b["tp_seconds"]  # every layer's collectives on IB
    assert a["mfu"] < b["mfu"]  # the seed's direction, 35 % -> 48 %
    assert a["fits"] and b["fits"]
    assert any("the direction holds" in line for line in planned.report_a(r))


def test_b_the_bubble_figures_hold_and_the_mfu_figures_do_not():
    r = planned.plan_b()
    lo, hi = r["m4"], r["m32"]
    for m, row in ((4, lo), (32, hi)):
        # the dry run's bubble over ideal: (p - 1)/m, a little more (the head's stage)
        assert 63 / m <= row["bubble_fraction"] <= 1.1 * 63 / m
    assert hi["mfu"] > 4 * lo["mfu"]
    assert lo["mfu"] < r["seed"]["before"] and hi["mfu"] < r["seed"]["after"]
    # the upper bound m/(m + p - 1) alone rules the seed's pair out (incident b)
    assert r["seed"]["after"] > 0.6 * 32 / (32 + 63)


def test_c_zero3_with_recomputation_does_not_peak_above_zero2_at_13b():
    r = planned.plan_c()
    assert r["ratio"] < 1.0 < r["seed"]["peak_ratio"]
    assert r["zero3_buffers"] > 0
    assert any("not at this scale" in line for line in planned.report_c(r))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_each_incident_prints_and_returns_its_planned_figures(name, capsys):
    from minipar.programs.incidents import get
    result = get(name).run()
    assert "planned" in result
    assert "at the seed's scale (the planner" in capsys.readouterr().out
