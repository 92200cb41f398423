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
    # data parallelism on 4 ranks: the ledger equals ZeRO's formula at every stage
    dp = out[out.index("8. Data parallelism"):]
    num = r"\s+([\d,]+)" * 4
    rows = re.findall(rf"^\s+(\d) (\S+)\s+ledger{num}\s+every rank alike: (\w+)\n"
                      rf"\s+formula{num}", dp, re.M)
    assert [(r[0], r[1]) for r in rows] == [("0", "DDP"), ("1", "ZeRO-1"), ("2", "ZeRO-2"),
                                            ("3", "ZeRO-3")]
    for stage, _, *ledger, alike, p_, g_, o_, t_ in rows:
        assert ledger == [p_, g_, o_, t_] and alike == "True", stage
        p_, g_, o_, t_ = (int(x.replace(",", "")) for x in (p_, g_, o_, t_))
        assert p_ + g_ + o_ == t_
    totals = [int(r[9].replace(",", "")) for r in rows]
    assert totals == sorted(totals, reverse=True)  # each stage holds less than the one before
    # bytes sent per rank, read from the trace, equal the ring theory
    sent = re.findall(r"([\d,]+) B  theory .* = ([\d,]+) B$", dp, re.M)
    assert len(sent) == 4 and all(a == b for a, b in sent)
    # and the weights equal one device's, within the equivalence tests' own tolerance
    equal = re.findall(r"^\s+\d \S+\s+max \|w - w_one_device\| = ([\d.e+-]+); "
                       r"equal within .*: (\w+)$", dp, re.M)
    assert len(equal) == 4 and all(e == "True" and float(d) < 1e-12 for d, e in equal)
    # tensor parallelism: Megatron's collectives per layer, Table 2 to the byte, one device
    tp = out[out.index("9. Tensor and sequence parallelism"):]
    assert re.search(r"^\s+tp\s+forward\s+all_reduce x2$", tp, re.M)
    assert re.search(r"^\s+tp \+ sp\s+forward\s+all_gather x2, reduce_scatter x2$", tp, re.M)
    table = re.findall(r"^\s+(one device|tp|tp \+ sp)\s+([\d,]+) B .* = \s*([\d,]+) B\s+"
                       r"equal: (\w+)$", tp, re.M)
    assert len(table) == 3 and all(g == w and e == "True" for _, g, w, e in table)
    per_rank = [int(g.replace(",", "")) for _, g, _, _ in table]
    assert per_rank == sorted(per_rank, reverse=True)
    losses = re.findall(r"loss ([\d.]+) \(one device ([\d.]+)\); .* difference ([\d.e+-]+)$",
                        tp, re.M)
    assert len(losses) == 2 and all(a == b and float(d) < 1e-12 for a, b, d in losses)
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


def test_the_tour_uses_the_equivalence_tests_tolerance():
    """Part 8 prints "equal" with tests/parallel/conftest.py's RTOL and ATOL_SCALE."""
    import ast
    from pathlib import Path

    from minipar.programs.tour import DP_ATOL_SCALE, DP_RTOL

    tree = ast.parse((Path(__file__).parent / "parallel" / "conftest.py").read_text())
    consts = {t.id: ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
              and t.id in ("RTOL", "ATOL_SCALE")}
    assert (DP_RTOL, DP_ATOL_SCALE) == (consts["RTOL"], consts["ATOL_SCALE"])
