"""Chrome trace export: the Trace Event Format, loadable by Perfetto and chrome://tracing."""

import json
import math

import numpy as np
import pytest

import minipar as mp
from minipar.runtime.device import DeviceSpec
from minipar.runtime.topology import Topology
from minipar.runtime.trace import Event
from minipar.viz import STREAM_TIDS, to_chrome_trace
from minipar.viz.chrome import one_after_another

TOY = DeviceSpec("toy", {"float64": 1e12}, 10**12)
TOPO = Topology.nodes(2, 2, device=TOY)


def program(ctx):
    """Compute, a blocking all_reduce, an async all_gather over compute, and a send/recv."""
    ctx.compute((ctx.rank + 1) * 1e9, "float64", name="forward", label="layer 0")
    mp.all_reduce(np.ones(1000))
    w = mp.all_gather(np.ones(10), async_op=True)
    ctx.compute(1e9, "float64", name="backward")
    w.wait()
    if ctx.rank == 0:
        mp.send(np.ones(100), dst=3)
    elif ctx.rank == 3:
        mp.recv(src=0)


@pytest.fixture(scope="module")
def run():
    return mp.launch(program, 4, topology=TOPO)


@pytest.mark.timeout(20)
def test_top_level_is_the_json_object_form(run):
    trace = to_chrome_trace(run.events(), topology=TOPO)
    assert isinstance(trace["traceEvents"], list)
    assert trace["displayTimeUnit"] == "ns"


@pytest.mark.timeout(20)
def test_every_runtime_event_is_a_complete_event_in_microseconds(run):
    events = run.events()
    trace = to_chrome_trace(events, topology=TOPO)
    xs = [t for t in trace["traceEvents"] if t["ph"] == "X"]
    assert len(xs) == len(events)
    for e, t in zip(events, xs):
        assert set(t) >= {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args"}
        assert isinstance(t["name"], str) and isinstance(t["cat"], str)
        assert isinstance(t["pid"], int) and isinstance(t["tid"], int)
        assert isinstance(t["ts"], (int, float)) and isinstance(t["dur"], (int, float))
        assert t["ts"] >= 0 and t["dur"] >= 0
        assert math.isfinite(t["ts"]) and math.isfinite(t["dur"])
        assert t["ts"] == pytest.approx(e.start * 1e6, rel=1e-12, abs=1e-9)
        assert t["dur"] == pytest.approx((e.end - e.start) * 1e6, rel=1e-12, abs=1e-9)
        assert (t["name"], t["cat"], t["pid"]) == (e.name, e.stream, e.rank)
        assert t["tid"] == STREAM_TIDS[e.stream]
        assert isinstance(t["args"], dict)


@pytest.mark.timeout(20)
def test_known_times_in_microseconds(run):
    trace = to_chrome_trace(run)
    fwd = [t for t in trace["traceEvents"] if t["ph"] == "X" and t["name"] == "forward"]
    # rank r computes (r + 1) * 1e9 FLOPs at 1e12 FLOP/s = (r + 1) ms = (r + 1) * 1000 us
    assert sorted((t["pid"], t["ts"], t["dur"]) for t in fwd) == [
        (0, 0.0, pytest.approx(1000.0)), (1, 0.0, pytest.approx(2000.0)),
        (2, 0.0, pytest.approx(3000.0)), (3, 0.0, pytest.approx(4000.0))]
    ar = [t for t in trace["traceEvents"] if t["ph"] == "X" and t["name"] == "all_reduce"]
    assert [t["ts"] for t in ar] == [pytest.approx(4000.0)] * 4  # with the last arrival


@pytest.mark.timeout(20)
def test_args_carry_bytes_flops_group_algorithm_and_bandwidth(run):
    trace = to_chrome_trace(run)
    xs = [t for t in trace["traceEvents"] if t["ph"] == "X"]
    ar = next(t for t in xs if t["name"] == "all_reduce" and t["pid"] == 0)
    assert ar["args"]["bytes"] == 8000
    assert ar["args"]["group"] == [0, 1, 2, 3]
    assert ar["args"]["algorithm"] == "hierarchical"
    assert ar["args"]["busbw"] > 0 and ar["args"]["algbw"] > 0
    assert ar["args"]["label"] == "world"
    assert ar["args"]["issued_us"] == pytest.approx(1000.0)  # rank 0 called it at 1 ms
    fwd = next(t for t in xs if t["name"] == "forward" and t["pid"] == 2)
    assert fwd["args"]["flops"] == 3e9 and fwd["args"]["label"] == "layer 0"
    send = next(t for t in xs if t["name"] == "send")
    assert send["args"]["bytes"] == 800 and send["args"]["link"] == "IB-NDR400"
    recv = next(t for t in xs if t["name"] == "recv")
    assert recv["pid"] == 3 and recv["tid"] == STREAM_TIDS["recv"]


@pytest.mark.timeout(20)
def test_every_pid_and_tid_has_metadata(run):
    trace = to_chrome_trace(run.events(), topology=TOPO)
    ms = [t for t in trace["traceEvents"] if t["ph"] == "M"]
    procs = {t["pid"]: t["args"]["name"] for t in ms if t["name"] == "process_name"}
    threads = {(t["pid"], t["tid"]): t["args"]["name"] for t in ms if t["name"] == "thread_name"}
    for t in trace["traceEvents"]:
        if t["ph"] == "X":
            assert t["pid"] in procs
            assert (t["pid"], t["tid"]) in threads
            assert threads[(t["pid"], t["tid"])] == t["cat"]
    assert procs == {0: "rank 0 (node 0)", 1: "rank 1 (node 0)",
                     2: "rank 2 (node 1)", 3: "rank 3 (node 1)"}
    assert threads[(0, STREAM_TIDS["p2p"])] == "p2p"
    assert threads[(3, STREAM_TIDS["recv"])] == "recv"


@pytest.mark.timeout(20)
def test_tids_are_stable_across_ranks_and_exports(run):
    a = to_chrome_trace(run)
    b = to_chrome_trace([e for e in run.events() if e.rank == 1])
    tid = {(t["pid"], t["cat"]): t["tid"] for t in a["traceEvents"] if t["ph"] == "X"}
    assert {v for (p, s), v in tid.items() if s == "compute"} == {0}
    assert {v for (p, s), v in tid.items() if s == "comm"} == {1}
    assert all(t["tid"] == tid[(1, t["cat"])] for t in b["traceEvents"] if t["ph"] == "X")


@pytest.mark.timeout(20)
def test_json_round_trips_and_the_file_is_written(run, tmp_path):
    path = tmp_path / "trace.json"
    trace = to_chrome_trace(run, path)
    text = json.dumps(trace, allow_nan=False)  # strict JSON: no NaN or Infinity
    assert json.loads(text) == trace
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == trace


@pytest.mark.timeout(20)
def test_a_world_of_one_has_zero_time_collectives_and_stays_strict_json(tmp_path):
    def prog(ctx):
        ctx.compute(1e9, "float64")
        mp.all_reduce(np.ones(4))  # nothing to send: 0 s, so algbw = S / 0

    res = mp.launch(prog, 1, topology=Topology.nodes(1, 1, device=TOY))
    trace = to_chrome_trace(res, tmp_path / "one.json")
    json.dumps(trace, allow_nan=False)
    ar = next(t for t in trace["traceEvents"] if t["name"] == "all_reduce")
    assert ar["dur"] == 0.0 and ar["ts"] == pytest.approx(1000.0)
    assert ar["args"]["algbw"] == 0.0 and ar["args"]["busbw"] == 0.0  # no time, no bandwidth


def test_without_topology_processes_are_named_by_rank_and_world_size_names_idle_ranks():
    events = [Event(0, "compute", "matmul", 0.0, 1e-3, flops=np.float64(5.0)),
              Event(0, "comm", "all_reduce", 1e-3, 2e-3, nbytes=np.int64(64),
                    group=(0, 2), meta={"sizes": np.array([1, 2]), "obj": object()})]
    trace = to_chrome_trace(events, world_size=3)
    procs = {t["pid"]: t["args"]["name"] for t in trace["traceEvents"]
             if t["ph"] == "M" and t["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    ar = next(t for t in trace["traceEvents"] if t["name"] == "all_reduce")
    assert ar["args"]["bytes"] == 64 and type(ar["args"]["bytes"]) is int
    assert ar["args"]["sizes"] == [1, 2] and isinstance(ar["args"]["obj"], str)
    json.dumps(trace, allow_nan=False)


def test_unknown_streams_get_their_own_stable_thread():
    events = [Event(0, "compute", "k", 0.0, 1.0), Event(0, "h2d", "copy", 0.0, 1.0)]
    trace = to_chrome_trace(events)
    tids = {t["cat"]: t["tid"] for t in trace["traceEvents"] if t["ph"] == "X"}
    assert tids["h2d"] not in STREAM_TIDS.values()
    names = {(t["pid"], t["tid"]): t["args"]["name"] for t in trace["traceEvents"]
             if t["ph"] == "M" and t["name"] == "thread_name"}
    assert names[(0, tids["h2d"])] == "h2d"


def test_an_empty_trace_is_still_valid():
    trace = to_chrome_trace([])
    assert trace["traceEvents"] == [] and trace["displayTimeUnit"] == "ns"


# ---- what chrome://tracing and Perfetto read: the Trace Event Format's required fields --
_PHASE_FIELDS = {"X": {"name", "ph", "ts", "dur", "pid", "tid"},
                 "M": {"name", "ph", "pid", "args"},
                 "i": {"name", "ph", "ts", "pid", "tid", "s"}}
_METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def assert_trace_event_format(trace: dict) -> None:
    """Every event has its phase's required fields with the right types; strict JSON."""
    json.dumps(trace, allow_nan=False)
    assert isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in _PHASE_FIELDS, e
        assert _PHASE_FIELDS[e["ph"]] <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] == "M":
            assert e["name"] in _METADATA and isinstance(e["args"], dict)
        else:
            assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")


def two_groups_at_once(ctx):
    """tp {0,1} {2,3} and dp {0,2} {1,3}: a tp all-reduce and a dp all-reduce in flight at
    the same time, as a tensor-parallel layer's and a data-parallel bucket's."""
    r = ctx.rank
    tp = mp.new_group([r - r % 2, r - r % 2 + 1], name="tp")
    dp = mp.new_group([r % 2, r % 2 + 2], name="dp")
    a = mp.all_reduce(np.ones(1 << 16), group=dp, async_op=True)
    b = mp.all_reduce(np.ones(1 << 10), group=tp, async_op=True)
    a.wait()
    b.wait()


@pytest.mark.timeout(20)
def test_each_process_group_has_its_own_track_so_concurrent_collectives_do_not_nest():
    res = mp.launch(two_groups_at_once, 4, topology=TOPO)
    trace = to_chrome_trace(res)
    assert_trace_event_format(trace)
    xs = [t for t in trace["traceEvents"] if t["ph"] == "X" and t["cat"] == "comm"]
    names = {(t["pid"], t["tid"]): t["args"]["name"] for t in trace["traceEvents"]
             if t["ph"] == "M" and t["name"] == "thread_name"}
    for rank in range(4):
        mine = [t for t in xs if t["pid"] == rank]
        assert len(mine) == 2
        a, b = mine
        assert a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]  # concurrent
        assert a["tid"] != b["tid"]  # so on two tracks
        tp = [rank - rank % 2, rank - rank % 2 + 1]
        dp = [rank % 2, rank % 2 + 2]
        assert {names[(rank, t["tid"])] for t in mine} == {f"comm tp {tp}", f"comm dp {dp}"}
    # one group's track has the same tid in every process of the group
    for t in xs:
        same = [u for u in xs if u["args"]["group"] == t["args"]["group"]
                and u["args"]["label"] == t["args"]["label"]]
        assert {u["tid"] for u in same} == {t["tid"]}
    assert not set(STREAM_TIDS.values()) & {t["tid"] for t in xs}


def test_one_after_another_lays_runs_end_to_end_and_marks_each():
    first = [Event(0, "compute", "a", 0.0, 2.0), Event(1, "comm", "all_reduce", 1.0, 3.0,
                                                      group=(0, 1), label="world",
                                                      meta={"issued": 0.5})]
    second = [Event(0, "compute", "b", 0.0, 1.0)]
    events, sections = one_after_another([("first", first), ("second", second)], gap=0.5)
    assert sections == [("first", 0.0), ("second", 3.0 + 1.5)]
    assert [(e.name, e.start, e.end) for e in events] == [
        ("a", 0.0, 2.0), ("all_reduce", 1.0, 3.0), ("b", 4.5, 5.5)]
    assert events[1].meta["issued"] == 0.5 and second[0].start == 0.0  # copies, not edits
    trace = to_chrome_trace(events, sections=sections)
    assert_trace_event_format(trace)
    marks = [(t["name"], t["ts"]) for t in trace["traceEvents"] if t["ph"] == "i"]
    assert marks == [("first", 0.0), ("second", 4.5e6)]


@pytest.mark.timeout(20)
def test_the_exports_above_follow_the_format(run):
    assert_trace_event_format(to_chrome_trace(run))
