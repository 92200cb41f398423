"""The pipeline drawing: I and W (and DualPipe's overlapped pairs) on the dry run's clock or a
trace's, cell by cell."""

from fractions import Fraction

import pytest

from minipar.parallel.pp import dry_run, lower, schedule
from minipar.runtime.trace import Event
from minipar.viz.pipeline import action_letter, boxes, dry_run_events, render_pipeline
from minipar.viz.timeline import measure, render_timeline


def test_zb_h1_at_p_2_m_2_is_drawn_slot_by_slot():
    """By hand, at t_F = t_I = t_W = 1: rank 0 runs 0F0 0F1, waits for 1I0 (t = 3), then
    0I0 0W0 0I1 0W1; rank 1 waits for 0F0, runs 1F0 1I0 1F1 1I1 and the two W's it
    deferred (zb_h1 defers r of them on rank r)."""
    d = dry_run(lower(schedule("zb_h1", 2, 2)), {"F": 1, "I": 1, "W": 1})
    assert render_pipeline(d).splitlines()[:4] == [
        "rank 0 │FF·IWIW│",
        "       │01 0011│",
        "rank 1 │·FIFIWW│",
        "       │ 001101│"]
    assert render_pipeline(d, ascii=True, microbatches=False).splitlines()[:2] == [
        "rank 0 |FF.IWIW|", "rank 1 |.FIFIWW|"]


def test_a_trace_with_the_runners_meta_draws_as_its_dry_run():
    d = dry_run(lower(schedule("zb_h2", 3, 5)), {"F": 1, "I": 1, "W": 1})
    events = [Event(r, "compute", s.action.kind.value, s.start, s.end, label=str(s.action),
                    meta={"kind": s.action.kind.value, "stage": s.action.stage,
                          "microbatch": s.action.microbatch})
              for r, row in enumerate(d.timeline) for s in row if s.action.is_compute]
    events.append(Event(0, "p2p", "send", 0.0, 1.0))        # sends are not drawn
    assert render_pipeline(events) == render_pipeline(d)
    assert len(boxes(events)) == 3 * 5 * 3


def test_pairs_are_ampersands_and_a_ranks_later_stage_is_lower_case():
    """One column a time unit: a pair of t_F&B = 2 fills two."""
    d = dry_run(lower(schedule("dualpipev", 2, 4)), {"F": 1, "B": 2, "I": 1, "W": 1, "F&B": 2})
    rows = render_pipeline(d).splitlines()
    pairs = sum(str(s.action).endswith("OVERLAP_F_B") for s in d.timeline[0])
    assert pairs > 0 and rows[0].count("&") == 2 * pairs
    assert "f" in rows[0] and "F" in rows[0]          # stage 3 (rank 0's later) is lower case
    assert "& overlapped F&B pair" in rows[-1] and "lower case" in rows[-1]


def test_nothing_to_draw_and_a_bad_width_are_refused():
    with pytest.raises(ValueError, match="nothing to draw"):
        render_pipeline([Event(0, "comm", "all_reduce", 0.0, 1.0)])
    d = dry_run(lower(schedule("1f1b", 2, 2)), {"F": 1, "B": 1})
    with pytest.raises(ValueError, match="width must be at least 1 column, got 0"):
        render_pipeline(d, width=0)
    with pytest.raises(TypeError, match="got str in the list"):
        render_pipeline(["0F0"])


def test_a_dry_run_becomes_trace_events_the_other_drawings_read():
    """Sends go on the p2p stream: with messages of half a slot, the runtime's timeline shows
    them beside the letters, and summarize measures the same busy time as the dry run."""
    d = dry_run(lower(schedule("zb_h1", 3, 4)), {"F": 1, "I": 1, "W": 1}, p2p=Fraction(1, 2))
    events = dry_run_events(d)
    compute = [e for e in events if e.stream == "compute"]
    assert len(compute) == 3 * 4 * 3 and {e.name for e in compute} == {"F", "I", "W"}
    assert sum(e.stream == "p2p" for e in events) == 2 * 4 * (3 - 1)
    text = render_timeline(events, 3, width=36, symbols=action_letter)
    assert {"F", "I", "W", "S"} <= set(text.splitlines()[0])
    times = measure(events, 3, start=0, end=float(d.makespan))
    assert [t.compute for t in times] == [float(b) for b in d.busy]
    pair = dry_run_events(dry_run(lower(schedule("dualpipev", 1, 2)),
                                  {"F": 1, "B": 2, "I": 1, "W": 1, "F&B": 2}))
    assert [e.meta["kind"] for e in pair if e.name == "OVERLAP_F_B"] == ["OVERLAP_F_B"]
    assert action_letter(pair[0]) == "F"
