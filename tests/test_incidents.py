"""The seeds' incident cases reproduce their mechanism, on the numbers they return."""

import pytest

from minipar.cli import main
from minipar.incidents import INCIDENTS, get
from minipar.incidents import zero3_recompute


@pytest.fixture(scope="module")
def case_c():
    lines = []
    return zero3_recompute.run(out=lines.append), lines


@pytest.mark.timeout(120)
def test_zero3_without_a_limit_peaks_above_zero2(case_c):
    s = case_c[0]["scenarios"]
    assert s["zero3"]["total"] > s["zero2"]["total"]
    # what piles up is gathered weights: the run-ahead all-gathers (comm) hold more than
    # the model's weights minus one block, and ZeRO-3's own weights are a quarter of ZeRO-2's
    assert s["zero3"]["peak"]["comm_buffers"] > 0.9 * s["zero2"]["peak"]["parameters"]
    assert s["zero3"]["peak"]["parameters"] < 0.35 * s["zero2"]["peak"]["parameters"]


@pytest.mark.timeout(120)
def test_the_limit_brings_the_peak_below_zero2_and_both_fixes_keep_it_there(case_c):
    s = case_c[0]["scenarios"]
    for fixed in ("zero3_limit", "zero3_both"):
        assert s[fixed]["total"] < s["zero3"]["total"], fixed
        assert s[fixed]["total"] < s["zero2"]["total"], fixed
        assert s[fixed]["vs_zero2"] < 1.0
    # the limit bounds the gathered weights: at most 2 blocks in flight
    assert s["zero3_limit"]["peak"]["comm_buffers"] < 0.1 * s["zero3"]["peak"]["comm_buffers"]


@pytest.mark.timeout(120)
def test_recomputing_every_second_block_saves_flops_not_memory(case_c):
    """The seed's second fix, measured: blocks that do not recompute keep their
    activations, so alone it raises the peak; what it buys is less recomputation."""
    s = case_c[0]["scenarios"]
    assert s["zero3_every2"]["total"] > s["zero3"]["total"]
    assert s["zero3_every2"]["peak"]["activations"] > s["zero3"]["peak"]["activations"]
    assert s["zero3_both"]["flops"] < s["zero3_limit"]["flops"]


@pytest.mark.timeout(120)
def test_the_report_prints_every_scenario_with_its_ratio(case_c):
    result, lines = case_c
    text = "\n".join(lines)
    for r in result["scenarios"].values():
        assert r["label"] in text and f"{100 * r['vs_zero2']:.1f} %" in text
    assert result["model"]["dp"] == 4 and result["model"]["dtype"] == "bfloat16"


def test_incidents_are_listed_by_name():
    assert get("c") is zero3_recompute
    assert "c" in INCIDENTS
    with pytest.raises(KeyError, match="no incident 'z'"):
        get("z")


@pytest.mark.timeout(120)
def test_cli_runs_incident_c(capsys):
    assert main(["incident", "c"]) == 0
    out = capsys.readouterr().out
    assert "Incident C" in out and "limit_all_gathers" in out and "vs ZeRO-2" in out


def test_cli_refuses_an_unknown_incident(capsys):
    with pytest.raises(SystemExit):
        main(["incident", "z"])
    assert "invalid choice" in capsys.readouterr().err
