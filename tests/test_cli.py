"""The `minipar` command: the tour runs end to end and says true things."""

import json
import re

import pytest

from minipar.cli import build_parser, main
from minipar.programs.tour import ALIGN_BYTES, to_ascii, tour_nbytes
from minipar.programs.tour.cluster import cluster_parts


@pytest.mark.timeout(60)
def test_tour_runs_and_reports(tmp_path, capsys):
    trace = tmp_path / "tour.json"
    assert main(["tour", "--megabytes", "1", "--ascii", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.isascii(), sorted({c for c in out if not c.isascii()})  # --ascii: ASCII only
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
    tp = out[out.index("9. Tensor and sequence parallelism"):out.index("10. Pipeline")]
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
    # every part is in the trace, one after another, and each starts a section
    sections = [e for e in events if e["ph"] == "i"]
    numbers = [int(s["name"].split(".")[0]) for s in sections]
    assert numbers == sorted(numbers)
    assert set(numbers) == {1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
    starts = [s["ts"] for s in sections]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    xs = [e for e in events if e["ph"] == "X"]
    for (a, b) in zip(starts, starts[1:] + [float("inf")]):
        assert any(a <= e["ts"] < b for e in xs)  # no section is empty
    assert max(e["ts"] for e in xs) >= starts[-1]
    # part 9's collectives are on the tp group's own track, named after it
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    part9 = starts[numbers.index(9)]
    assert threads[(0, next(e["tid"] for e in xs if e["pid"] == 0 and e["ts"] >= part9
                            and e["cat"] == "comm"))] == "comm tp [0, 1, 2, 3]"


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "tour" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "minipar" in capsys.readouterr().out


def test_bad_size_is_refused(capsys):
    """A usage error now (exit status 2, before any work), with the same words."""
    with pytest.raises(SystemExit) as e:
        main(["tour", "--megabytes", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--megabytes" in err and "must be a positive" in err


@pytest.mark.parametrize("mb", [1e-9, 0.1, 0.3, 2.7, 4.0, 64.0])
def test_any_positive_size_rounds_to_whole_float32_chunks_over_the_ranks(mb):
    nbytes = tour_nbytes(mb)
    assert nbytes % ALIGN_BYTES == 0 and nbytes >= ALIGN_BYTES
    assert abs(nbytes - mb * (1 << 20)) <= ALIGN_BYTES / 2 or nbytes == ALIGN_BYTES
    if mb == 4.0:
        assert nbytes == 4 << 20  # the default is unchanged


@pytest.mark.parametrize("mb", [0, -1.0, float("nan"), float("inf"), 64.5, "4"])
def test_tour_nbytes_refuses_what_is_not_a_size(mb):
    with pytest.raises(ValueError, match="finite number of MiB"):
        tour_nbytes(mb)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mb", [1e-9, 0.1, 0.3, 2.7])
def test_the_collectives_run_on_a_rounded_size(mb):
    """0.1, 0.3 and 2.7 MiB crashed inside reduce_scatter (26,214 elements over 8 ranks)."""
    lines = []
    events = cluster_parts(lines.append, tour_nbytes(mb), ascii=True, width=20)
    assert events and any("ring of sends" in l and "same result: True" in l for l in lines)


def test_cluster_parts_refuses_a_size_the_collectives_cannot_split():
    with pytest.raises(ValueError, match="multiple of 32 bytes"):
        cluster_parts(print, 104_857, ascii=True, width=20)


@pytest.mark.timeout(60)
def test_a_rounded_size_is_announced(capsys):
    assert main(["tour", "--megabytes", "0.1", "--ascii", "--width", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("(--megabytes 0.1 is rounded to 104,864 bytes")
    assert "2. What it costs: every collective on 102.41 KiB of float32 per rank" in out


def test_to_ascii_maps_the_tours_characters_and_marks_any_other():
    assert to_ascii("Ψ' = 2 µs ─► f̄, ḡ; s·b") == "Psi' = 2 us -> f-bar, g-bar; s*b"
    assert to_ascii("naïve") == "na?ve"


@pytest.mark.parametrize("argv", [["tour", "--width", "1000"], ["tour", "--width", "1"],
                                  ["tour", "--megabytes", "64"], ["train", "--steps",
                                                                  "1000000"]])
def test_the_ends_of_each_range_are_accepted(argv):
    args = build_parser().parse_args(argv)
    assert args.func is not None


def test_an_unexpected_error_keeps_its_traceback(monkeypatch):
    """A bug is not an input error: main does not turn it into a message."""
    import minipar.cli as cli

    def broken(*a, **k):
        raise KeyError("a bug inside the course")

    monkeypatch.setattr(cli, "grade", broken)
    with pytest.raises(KeyError, match="a bug inside the course"):
        main(["grade", "01"])
    monkeypatch.setattr(cli, "run_tour", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["tour"])


def test_a_trace_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys,
                                                                       monkeypatch):
    import minipar.cli as cli

    monkeypatch.setattr(cli, "run_tour", lambda *a, **k: pytest.fail("the tour ran"))
    for path in ("", "   ", str(tmp_path), str(tmp_path / "no" / "t.json")):
        with pytest.raises(SystemExit) as e:
            main(["tour", "--trace", path])
        assert e.value.code == 2 and "argument --trace" in capsys.readouterr().err


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


def test_the_tours_pipeline_part_draws_the_schedule_and_measures_the_bubble():
    """Part 10: the S r lines are 1F1B's lists (the trace's order), the ledger holds
    min(p - r, m) micro-batches, the loss is one device's, and the measured idle share is
    the dry run's of the measured stage times (the equal-stage formula printed beside)."""
    from minipar.parallel.pp import Kind, schedule
    from minipar.programs.tour import PARTS
    from minipar.programs.tour.pipeline_parallel import M, PP, pipeline_parallel_part
    assert PARTS[PARTS.index(pipeline_parallel_part) + 1].__name__ == "zero_bubble_part"
    lines = []
    pipeline_parallel_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("10. Pipeline parallelism")
    drawn = re.findall(r"^\s+S(\d): (.*)$", out, re.M)
    want = [" ".join(f"{a.kind.value}{a.microbatch}" for a in row
                     if a.kind in (Kind.F, Kind.B)) for row in schedule("1f1b", PP, M)]
    assert [int(r) for r, _ in drawn] == list(range(PP)) and [s for _, s in drawn] == want
    held = re.search(r"one F's\): \[([\d., ]+)\]; min\(p - r, m\) = \[([\d, ]+)\]", out)
    assert [float(x) for x in held.group(1).split(",")] == [min(PP - r, M) for r in range(PP)]
    loss, one = re.search(r"loss ([\d.]+) \(one device ([\d.]+)\)", out).groups()
    assert loss == one and float(re.search(r"worst relative difference ([\d.e+-]+)",
                                           out).group(1)) < 1e-12
    measured, formula, dry = re.search(r"measured: ([\d.]+) %; .* = ([\d.]+) % with equal "
                                       r"stages; .*messages: ([\d.]+) %", out).groups()
    assert measured == dry and formula == f"{100 * (PP - 1) / (M + PP - 1):.1f}"


def test_the_tours_zero_bubble_part_runs_the_three_schedules_like_one_device():
    """Part 11: each schedule drawn from its trace (ZB-H1's I and W, DualPipeV's lower-case
    second chunk), every loss one device's to the last printed digit, the gradients too,
    the bubble falling 1F1B > ZB-H1 > DualPipeV in both spellings (idle/ideal =
    b / (1 - b) of idle/total b), 1F1B's busiest rank holding exactly p micro-batches and
    ZB-H1 counted at 1F1B's p, DualPipeV at (2p + 1)/2."""
    from minipar.programs.tour import PARTS
    from minipar.programs.tour.zero_bubble import PP, zero_bubble_part
    assert PARTS[PARTS.index(zero_bubble_part) + 1].__name__ == "three_d_part"
    lines = []
    zero_bubble_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("11. Zero-bubble pipelines")
    drawings = re.split(r"\n   (?:1F1B|ZB-H1|DualPipeV): ", out)[1:]
    rows = [re.findall(r"^\s+rank \d │(.*)│$", d, re.M) for d in drawings]
    assert [len(r) for r in rows] == [PP] * 3
    assert not set("IW") & set("".join(rows[0])) and set("IW") <= set("".join(rows[1]))
    assert set("fbiw") & set("".join(rows[2]))  # the V's second chunk
    table = re.findall(r"^   (1F1B|ZB-H1|DualPipeV)\s+([\d.]+) ms\s+([\d.]+) %\s+([\d.]+) %"
                       r"\s+([\d.]+) \(counted\s+([\d/]+)\)\s+([\d.]+)$", out, re.M)
    assert [t[0] for t in table] == ["1F1B", "ZB-H1", "DualPipeV"]
    one = re.search(r"one device's loss ([\d.]+)", out).group(1)
    assert all(t[6] == one for t in table)
    assert float(re.search(r"worst relative difference ([\d.e+-]+)", out).group(1)) < 1e-12
    bubble = [float(t[2]) / 100 for t in table]
    assert bubble[0] > bubble[1] > bubble[2] > 0
    for t, b in zip(table, bubble):
        assert abs(float(t[3]) / 100 - b / (1 - b)) < 2e-3  # printed to 0.1 %
    assert float(table[0][4]) == PP and [t[5] for t in table] == [str(PP), str(PP),
                                                                  f"{2 * PP + 1}/2"]
    assert float(table[0][1]) > float(table[1][1]) > float(table[2][1])  # the step's time
