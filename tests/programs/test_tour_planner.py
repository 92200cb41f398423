"""Tour part 15: the planner's parameters, gradients and optimizer states equal the small
run's ledger to the byte; the 70B layout's categories and terms add up; the search lists
three fitting layouts fastest first."""

import re

import pytest

from minipar.programs.tour import PARTS
from minipar.programs.tour.planner import planner_part


@pytest.mark.timeout(120)
def test_part_15_matches_the_ledger_and_lists_the_search():
    assert PARTS[-1] is planner_part
    lines = []
    planner_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("15. The planner")
    states = re.findall(r"^   (parameters|gradients|optimizer_states)\s+planner .* "
                        r"(equal to the byte|DIFFERENT)$", out, re.M)
    assert states == [(c, "equal to the byte") for c in
                      ("parameters", "gradients", "optimizer_states")]
    m = re.search(r"time: ([\d.]+) s a step \((.*) s\), MFU ([\d.]+)%", out)
    total, terms = float(m.group(1)), dict(t.rsplit(" ", 1) for t in m.group(2).split(", "))
    # every nonzero term shown, to the millisecond: they add up to the step
    assert sum(map(float, terms.values())) == pytest.approx(total, abs=0.0005 * len(terms) + 0.005)
    assert 0 < float(m.group(3)) < 100
    found = re.findall(r"^   (\d)\. .*: ([\d.]+) s, MFU", out, re.M)
    assert [n for n, _ in found] == ["1", "2", "3"]
    times = [float(t) for _, t in found]
    assert times == sorted(times)
    dry = re.search(r"the dry run .* on 16,384 H100s, .*: 16 ranks stand for all .*, "
                    r"([\d,]+) kernels, collectives and messages, a ([\d.]+) s step", out)
    assert int(dry.group(1).replace(",", "")) > 16 * 2 * 16  # F and B of each micro-batch
    assert 1 < float(dry.group(2)) < 60
