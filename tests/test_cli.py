"""The `minipar` command: the tour runs end to end and says true things."""

import json
import re

import pytest

from minipar.cli import main


@pytest.mark.timeout(60)
def test_tour_runs_and_reports(tmp_path, capsys):
    trace = tmp_path / "tour.json"
    assert main(["tour", "--megabytes", "1", "--ascii", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    # what moved where: sum over ranks of [10r, 10r+1] for r = 0..7
    assert "[280.,288.]" in out
    # the ring built from send/recv matches the direct all_reduce and the formula
    m = re.search(r"ring of sends took ([\d.]+) us, the direct all_reduce ([\d.]+) us, "
                  r"formula .* = ([\d.]+) us; same result: True", out)
    assert m and m.group(1) == m.group(2) == m.group(3)
    # crossing nodes is slower than staying on NVLink
    slower = float(re.search(r"([\d.]+)x slower", out).group(1))
    assert slower > 1.5
    assert "overlap" in out and "#" in out  # ASCII timeline with compute cells
    # the single-device step: 16 bytes per parameter, FLOPs equal to the formula
    for cat, per in (("parameters", 2), ("gradients", 2), ("optimizer_states", 12)):
        assert re.search(rf"{cat}\s+[\d.]+ \w+\s+=\s+{per} bytes x psi", out), cat
    clock, formula = re.search(r"FLOPs on the clock ([\d,]+) = .* = ([\d,]+);", out).groups()
    assert clock == formula
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "all_reduce" and e["ph"] == "X" for e in events)


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "tour" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "minipar" in capsys.readouterr().out


def test_bad_size_is_refused():
    with pytest.raises(SystemExit, match="--megabytes must be positive"):
        main(["tour", "--megabytes", "0"])
