"""Terminal timelines and per-rank time accounting, on programs whose times are known.

The toy device computes 1e9 float64 FLOPs in exactly 1 ms, and the toy link has no
latency and 1e9 B/s, so a ring all_reduce of 1e6 bytes between two ranks takes
2(n-1)/n * S/B = 1 ms and a 1e6-byte send takes 1 ms. With 30 columns over 3 ms each
column is 0.1 ms, and every boundary below falls on a column edge.
"""

import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.runtime.device import DeviceSpec
from minipar.runtime.topology import Link, Topology
from minipar.runtime.trace import Event
from minipar.viz import COLLECTIVE_LETTERS, measure, render_timeline, summarize

TOY = DeviceSpec("toy", {"float64": 1e12}, 10**12)
TOY_LINK = Link("toy-link", 1e9, 0.0)
TOPO = Topology(1, 2, TOY, TOY_LINK, TOY_LINK)
MS = 1e9  # FLOPs per millisecond
ONE_MB = 125_000  # float64 elements in 1e6 bytes


def rows(text):
    """{rank: the cells between the borders} of a rendered timeline."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"rank (\d+)\s*[│|](.*)[│|]$", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def cells(text):
    """The summary table's rows, split into cells."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[1:]
            if line.strip()[:1].isdigit()]


@pytest.fixture(scope="module")
def straggler():
    """Both ranks compute, then all_reduce; rank 1 computes twice as long."""

    def prog(ctx):
        ctx.compute((ctx.rank + 1) * MS, "float64")  # rank 0: 0-1 ms, rank 1: 0-2 ms
        mp.all_reduce(np.ones(ONE_MB))  # 2-3 ms on both ranks

    return mp.launch(prog, 2, topology=TOPO)


@pytest.fixture(scope="module")
def overlapped():
    """An async all_reduce runs (1-2 ms) while compute continues (1-3 ms)."""

    def prog(ctx):
        ctx.compute(1 * MS, "float64", name="forward")
        w = mp.all_reduce(np.ones(ONE_MB), async_op=True)
        ctx.compute(2 * MS, "float64", name="backward")
        w.wait()

    return mp.launch(prog, 2, topology=TOPO)


@pytest.fixture(scope="module")
def send_recv():
    def prog(ctx):
        if ctx.rank == 0:
            ctx.compute(1 * MS, "float64")  # 0-1 ms
            mp.send(np.ones(ONE_MB), dst=1)  # 1-2 ms
        else:
            mp.recv(src=0)  # posted at 0, the message is in flight 1-2 ms

    return mp.launch(prog, 2, topology=TOPO)


# ---- the timeline -------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_straggler_timeline_has_the_expected_cells(straggler):
    text = render_timeline(straggler.events(), 2, width=30)
    r = rows(text)
    assert r[0] == "█" * 10 + "·" * 10 + "▒" * 10  # computes, waits for rank 1, reduces
    assert r[1] == "█" * 20 + "▒" * 10
    lines = text.splitlines()
    assert lines[0] == "rank 0 │" + r[0] + "│"
    axis = lines[2]
    assert axis.strip().startswith("0.000 ms") and axis.endswith("3.000 ms")
    assert len(axis) == len(lines[0])  # the end label sits under the right border
    assert "1 column = 100.000 µs" in text
    legend = lines[-1]
    assert legend.startswith("legend:")
    for part in ("█ compute", "▒ communication", "▓ both", "· idle"):
        assert part in legend


@pytest.mark.timeout(20)
def test_overlap_is_drawn(overlapped):
    r = rows(render_timeline(overlapped.events(), 2, width=30))
    assert r[0] == r[1] == "█" * 10 + "▓" * 10 + "█" * 10


@pytest.mark.timeout(20)
def test_ascii_timeline(overlapped, straggler):
    text = render_timeline(overlapped, 2, width=30, ascii=True)
    assert text.isascii()
    assert rows(text)[0] == "#" * 10 + "@" * 10 + "#" * 10
    assert rows(render_timeline(straggler, 2, width=30, ascii=True))[0] == \
        "#" * 10 + "." * 10 + "=" * 10
    assert "# compute" in text and "= communication" in text and "@ both" in text
    # microsecond labels are spelled "us" in ASCII
    zoom = render_timeline(overlapped, 2, width=10, end=0.5e-3, ascii=True)
    assert zoom.isascii() and "500.000 us" in zoom
    assert "500.000 µs" in render_timeline(overlapped, 2, width=10, end=0.5e-3)


@pytest.mark.timeout(20)
def test_letters_name_the_collectives(straggler, send_recv):
    r = rows(render_timeline(straggler, 2, width=30, symbols=COLLECTIVE_LETTERS))
    assert r[0] == "█" * 10 + "·" * 10 + "A" * 10
    assert r[1] == "█" * 20 + "A" * 10
    text = render_timeline(send_recv, 2, width=20, symbols=COLLECTIVE_LETTERS)
    r = rows(text)
    assert r[0] == "█" * 10 + "S" * 10
    assert r[1] == "·" * 10 + "r" * 10
    assert "S send" in text and "r recv" in text


@pytest.mark.timeout(20)
def test_per_event_symbols_from_a_function(overlapped):
    def sym(e):
        return {"forward": "F", "backward": "B"}.get(e.name)

    r = rows(render_timeline(overlapped, 2, width=30, symbols=sym))
    # communication has no symbol here, so the overlapped cells keep the overlap block
    assert r[0] == "F" * 10 + "▓" * 10 + "B" * 10


@pytest.mark.timeout(20)
def test_start_and_end_zoom_into_a_window(straggler):
    text = render_timeline(straggler, 2, width=10, start=1e-3, end=2e-3)
    r = rows(text)
    assert r[0] == "·" * 10  # rank 0 waits for rank 1 between 1 and 2 ms
    assert r[1] == "█" * 10
    assert "1.000 ms" in text and "2.000 ms" in text


def test_cell_rule_idle_below_half_busy_else_the_largest_share():
    # width 4 over [0, 4): each column is one second
    events = [
        Event(0, "compute", "c", 0.0, 0.625),  # col 0: 5/8 busy, all compute
        Event(0, "compute", "c", 1.0, 1.375),  # col 1: 3/8 busy -> idle
        Event(0, "compute", "c", 2.0, 2.25),  # col 2: 1/4 compute, 1/2 comm -> comm
        Event(0, "comm", "all_reduce", 2.25, 2.75),
        Event(0, "compute", "c", 3.0, 4.0),  # col 3: 1/2 compute only, 1/2 both -> overlap
        Event(0, "comm", "all_reduce", 3.5, 4.0),
    ]
    assert rows(render_timeline(events, 1, width=4, start=0.0, end=4.0))[0] == "█·▒▓"


def test_timeline_refuses_bad_arguments():
    ev = [Event(3, "compute", "c", 0.0, 1.0)]
    with pytest.raises(ValueError, match="rank 3"):
        render_timeline(ev, 2)
    with pytest.raises(ValueError, match="width"):
        render_timeline(ev, 4, width=0)
    with pytest.raises(ValueError, match="before it starts"):
        render_timeline(ev, 4, start=2.0, end=1.0)


def test_an_empty_trace_draws_idle_rows():
    r = rows(render_timeline([], 3, width=8))
    assert r == {0: "·" * 8, 1: "·" * 8, 2: "·" * 8}


# ---- measured times -------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_summarize_the_straggler(straggler):
    m = measure(straggler, 2)
    ms = pytest.approx
    assert (m[0].compute, m[0].comm, m[0].overlap, m[0].idle) == \
        (ms(1e-3), ms(1e-3), 0.0, ms(1e-3))
    assert (m[1].compute, m[1].comm, m[1].overlap, m[1].idle) == (ms(2e-3), ms(1e-3), 0.0, 0.0)
    assert m[0].comm_share == ms(1 / 3) and m[1].comm_share == ms(1 / 3)
    table = cells(summarize(straggler.events(), 2))
    assert table[0] == ["0", "1.000 ms", "1.000 ms", "0.000 ms", "1.000 ms", "1.000 ms",
                        "33.3 %"]
    assert table[1] == ["1", "2.000 ms", "1.000 ms", "0.000 ms", "1.000 ms", "0.000 ms",
                        "33.3 %"]


@pytest.mark.timeout(20)
def test_overlap_is_measured(overlapped):
    for t in measure(overlapped, 2):
        assert t.compute == pytest.approx(3e-3)
        assert t.comm == pytest.approx(1e-3)
        assert t.overlap == pytest.approx(1e-3)
        assert t.exposed_comm == pytest.approx(0.0, abs=1e-15)
        assert t.idle == pytest.approx(0.0, abs=1e-15)
    text = summarize(overlapped, 2)
    assert cells(text)[0] == ["0", "3.000 ms", "1.000 ms", "1.000 ms", "0.000 ms", "0.000 ms",
                              "33.3 %"]


def test_summarize_takes_the_union_across_streams():
    # rank 0: compute [0,4] [6,8]; comm [3,5]; p2p [4.5,7]; recv [7.5,9].  rank 1: [0,10].
    events = [
        Event(0, "compute", "c", 0.0, 4.0), Event(0, "compute", "c", 6.0, 8.0),
        Event(0, "comm", "all_reduce", 3.0, 5.0), Event(0, "p2p", "send", 4.5, 7.0),
        Event(0, "recv", "recv", 7.5, 9.0), Event(1, "compute", "c", 0.0, 10.0),
    ]
    # compute = 4 + 2 = 6; comm = |[3,7]| + |[7.5,9]| = 4 + 1.5 = 5.5;
    # overlap = |[3,4]| + |[6,7]| + |[7.5,8]| = 2.5; busy = 6 + 5.5 - 2.5 = 9; idle = 1
    r0, r1 = measure(events, 2)
    assert (r0.compute, r0.comm, r0.overlap, r0.idle, r0.window) == (6.0, 5.5, 2.5, 1.0, 10.0)
    assert r0.exposed_comm == 3.0 and r0.comm_share == 0.55
    assert (r1.compute, r1.comm, r1.overlap, r1.idle) == (10.0, 0.0, 0.0, 0.0)
    table = cells(summarize(events, 2))
    assert table[0] == ["0", "6.000 s", "5.500 s", "2.500 s", "3.000 s", "1.000 s", "55.0 %"]
    assert table[1] == ["1", "10.000 s", "0.000 s", "0.000 s", "0.000 s", "0.000 s", "0.0 %"]
    # a window clips the intervals: [2, 6] -> compute [2,4]; comm [3,6]; overlap [3,4]
    w0 = measure(events, 2, start=2.0, end=6.0)[0]
    assert (w0.compute, w0.comm, w0.overlap, w0.idle) == (2.0, 3.0, 1.0, 0.0)


def test_summarize_ascii():
    events = [Event(0, "compute", "c", 0.0, 1e-4), Event(0, "comm", "all_reduce", 1e-4, 2e-4)]
    text = summarize(events, 1, ascii=True)
    assert text.isascii() and "100.000 us" in text
    assert "100.000 µs" in summarize(events, 1)


# ---- properties: brute force on an integer grid ------------------------------------------
STREAMS = ["compute", "comm", "p2p", "recv"]
interval = st.tuples(st.sampled_from(STREAMS), st.integers(0, 30), st.integers(0, 8))
traces = st.lists(st.tuples(st.integers(0, 2), interval), max_size=25)


def _brute(events, world_size, T):
    """Per rank and unit cell k = [k, k+1): (computing?, communicating?)."""
    grid = [[[False, False] for _ in range(T)] for _ in range(world_size)]
    for e in events:
        for k in range(int(e.start), int(e.end)):
            grid[e.rank][k][0 if e.stream == "compute" else 1] = True
    return grid


@given(traces)
def test_measure_and_timeline_agree_with_a_unit_grid(spec):
    events = [Event(rank, stream, stream, float(s), float(s + d))
              for rank, (stream, s, d) in spec]
    T = 40
    grid = _brute(events, 3, T)
    m = measure(events, 3, start=0.0, end=float(T))
    for r in range(3):
        comp = sum(c for c, _ in grid[r])
        comm = sum(x for _, x in grid[r])
        both = sum(c and x for c, x in grid[r])
        assert (m[r].compute, m[r].comm, m[r].overlap) == (comp, comm, both)
        assert m[r].idle == T - (comp + comm - both)
    # one column per time unit: every cell is exactly one state
    drawn = rows(render_timeline(events, 3, width=T, start=0.0, end=float(T)))
    for r in range(3):
        expect = "".join({(False, False): "·", (True, False): "█", (False, True): "▒",
                          (True, True): "▓"}[tuple(c)] for c in grid[r])
        assert drawn[r] == expect
