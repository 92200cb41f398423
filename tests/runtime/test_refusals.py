"""The runtime refuses what it cannot do right, and still does everything it could.

- communication from a thread a rank started is refused, and the launch fails even when the
  worker's exception is lost; threads outside any launch, and `with mp.device()`, still work;
- reductions of non-numbers are refused up front on the rank that passed them; every numeric
  dtype (bool, ints, floats, complex, bfloat16, float8) still reduces, and strings, dates and
  records still move through all_gather and broadcast;
- a group whose ranks this world lacks is refused on its first call, on every rank, instead
  of a deadlock; a group made in another launch whose ranks exist here works;
- sizes, rates and counts are whole / positive / finite (runtime/checks.py), by property.
"""

from __future__ import annotations

import math
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.parallel.mesh import ParallelDims
from minipar.runtime.checks import MAX_RANKS, divisors, is_numeric, positive, whole
from minipar.runtime.errors import CollectiveUsageError, RankThreadError


# ---- a thread a rank started ---------------------------------------------------------------
CALLS = {
    "all_reduce": lambda: mp.all_reduce(np.ones(2)),
    "all_gather": lambda: mp.all_gather(np.ones(2)),
    "reduce_scatter": lambda: mp.reduce_scatter(np.ones(2)),
    "broadcast": lambda: mp.broadcast(np.ones(2), src=0),
    "reduce": lambda: mp.reduce(np.ones(2), dst=0),
    "gather": lambda: mp.gather(np.ones(2), dst=0),
    "scatter": lambda: mp.scatter([np.ones(1)] * 2, src=0),
    "all_to_all": lambda: mp.all_to_all([np.ones(1)] * 2),
    "all_to_all_single": lambda: mp.all_to_all_single(np.ones(2)),
    "barrier": lambda: mp.barrier(),
    "send": lambda: mp.send(np.ones(2), 1),
    "recv": lambda: mp.recv(1),
    "new_group": lambda: mp.new_group([0, 1]),
    "get_rank": lambda: mp.get_rank(),
    "get_world_size": lambda: mp.get_world_size(),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", sorted(CALLS))
def test_every_communication_call_refuses_a_thread_the_rank_started(kind, monkeypatch):
    lost = []  # what threading's excepthook would print: the worker's error is lost there
    monkeypatch.setattr(threading, "excepthook", lambda args: lost.append(args.exc_value))
    got = []

    def program(ctx):
        t = threading.Thread(target=lambda: got.append(CALLS[kind]()), name=f"worker-{ctx.rank}")
        t.start()
        t.join()
        return ctx.rank

    with pytest.raises(RankThreadError) as e:
        mp.launch(program, 2)
    msg = str(e.value)
    assert f"{kind} was called from thread 'worker-" in msg
    assert "a launch of 2 ranks is running" in msg and "join it" in msg
    assert got == []  # no worker got an answer, right or wrong
    assert lost and all(isinstance(x, RankThreadError) for x in lost)


@pytest.mark.timeout(20)
def test_a_worker_that_only_computes_and_the_rank_that_communicates_still_work():
    def program(ctx):
        box = []
        t = threading.Thread(target=lambda: box.append(np.full(3, ctx.rank + 1.0) ** 2))
        t.start()
        t.join()
        return mp.all_reduce(box[0])

    results = mp.launch(program, 3)
    for r in results:
        np.testing.assert_array_equal(r, np.full(3, 1.0 + 4.0 + 9.0))


@pytest.mark.timeout(20)
def test_a_worker_with_its_own_device_context_may_use_it():
    def program(ctx):
        out = []

        def work():
            with mp.device() as own:  # a fresh single device, explicitly
                out.append((own.world_size, mp.all_reduce(np.ones(2)).tolist()))
        t = threading.Thread(target=work)
        t.start()
        t.join()
        return out[0]

    assert list(mp.launch(program, 2)) == [(1, [1.0, 1.0])] * 2


@pytest.mark.timeout(20)
def test_outside_any_launch_threads_still_get_a_single_device():
    out = []

    def work():
        out.append((mp.get_world_size(), mp.all_reduce(np.arange(3.0)).tolist()))
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == [(1, [0.0, 1.0, 2.0])]
    assert mp.get_world_size() == 1 and mp.all_reduce(np.ones(1)).tolist() == [1.0]


# ---- what a collective moves and reduces -------------------------------------------------
NUMERIC = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32,
           np.float64, np.complex128, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn]
NOT_NUMBERS = [np.array(["ab", "c"]), np.array([b"x", b"y"]),
               np.array(["2024-01-01", "2024-01-02"], dtype="M8[D]"),
               np.array([1, 2], dtype="m8[s]"), np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]),
               np.zeros(2, dtype="V4")]
REDUCTIONS = {"all_reduce": lambda x: mp.all_reduce(x),
              "reduce": lambda x: mp.reduce(x, dst=0),
              "reduce_scatter": lambda x: mp.reduce_scatter(x)}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", sorted(REDUCTIONS))
@pytest.mark.parametrize("x", NOT_NUMBERS, ids=lambda x: str(x.dtype))
def test_reductions_of_non_numbers_are_refused_on_the_rank_that_passed_them(kind, x):
    def program(ctx):
        return REDUCTIONS[kind](x if ctx.rank == 1 else np.zeros(2))

    with pytest.raises(CollectiveUsageError) as e:  # before the rendezvous: no mismatch
        mp.launch(program, 2)
    msg = str(e.value)
    assert f"rank 1: {kind} on group world[0, 1]" in msg
    assert f"dtype {x.dtype}" in msg and "cannot be reduced" in msg
    assert not is_numeric(x.dtype)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_every_numeric_dtype_still_reduces(dtype):
    assert is_numeric(np.dtype(dtype))

    def program(ctx):
        return mp.all_reduce(np.ones(4, dtype=dtype), op="max")

    for r in mp.launch(program, 2):
        assert r.dtype == np.dtype(dtype)
        assert r.tobytes() == np.ones(4, dtype=dtype).tobytes()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("x", NOT_NUMBERS, ids=lambda x: str(x.dtype))
def test_strings_dates_and_records_still_move_unreduced(x):
    def program(ctx):
        return mp.all_gather(x), mp.broadcast(x if ctx.rank == 0 else None, src=0)

    for gathered, sent in mp.launch(program, 2):
        assert gathered.dtype == x.dtype and sent.dtype == x.dtype
        assert gathered.tobytes() == np.concatenate([x, x]).tobytes()
        assert sent.tobytes() == x.tobytes()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["all_gather", "broadcast", "gather", "all_to_all", "send"])
def test_arrays_of_python_objects_are_refused_by_every_call_that_moves_data(kind):
    objs = np.array([[1], [2]], dtype=object)
    calls = {"all_gather": lambda: mp.all_gather(objs),
             "broadcast": lambda: mp.broadcast(objs, src=0),
             "gather": lambda: mp.gather(objs, dst=0),
             "all_to_all": lambda: mp.all_to_all([objs, objs]),
             "send": lambda: mp.send(objs, 1)}

    def program(ctx):
        return calls[kind]() if ctx.rank == 0 else mp.recv(0) if kind == "send" else calls[kind]()

    with pytest.raises(CollectiveUsageError, match=r"rank \d: .*Python objects"):
        mp.launch(program, 2)


# ---- groups from another world -----------------------------------------------------------
@pytest.mark.timeout(20)
def test_a_group_whose_ranks_this_world_lacks_is_refused_on_every_rank_not_deadlocked():
    big = mp.launch(lambda ctx: mp.new_group([0, 2], name="pair"), 4)[0]
    assert big.world_size == 4
    with pytest.raises(CollectiveUsageError) as e:
        mp.launch(lambda ctx: mp.all_reduce(np.ones(1), group=big), 2)
    msg = str(e.value)
    assert "pair[0, 2], whose ranks [2] do not exist in this world of 2 ranks" in msg
    assert "made in a world of 4 ranks" in msg


@pytest.mark.timeout(20)
def test_a_mesh_group_without_a_world_is_refused_by_its_ranks_alone():
    tp = mp.DeviceMesh((2, 4), ("dp", "tp")).get_group("tp", 0)  # ranks 0..3, no world known
    with pytest.raises(CollectiveUsageError) as e:
        mp.launch(lambda ctx: mp.barrier(group=tp), 2)
    assert "ranks [2, 3] do not exist in this world of 2 ranks" in str(e.value)
    assert "made in a world" not in str(e.value)


@pytest.mark.timeout(20)
def test_a_group_from_another_launch_whose_ranks_exist_here_works():
    pair = mp.launch(lambda ctx: mp.new_group([0, 1], name="pair"), 4)[0]

    def program(ctx):
        return mp.all_reduce(np.full(2, ctx.rank + 1.0), group=pair) if ctx.rank in pair else None

    results = mp.launch(program, 3)
    np.testing.assert_array_equal(results[0], [3.0, 3.0])
    np.testing.assert_array_equal(results[1], [3.0, 3.0])
    assert results[2] is None


def test_the_world_a_group_was_made_for_does_not_change_its_identity():
    a = mp.launch(lambda ctx: mp.new_group([0, 1], name="g"), 2)[0]
    b = mp.launch(lambda ctx: mp.new_group([0, 1], name="g"), 4)[0]
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert (a.world_size, b.world_size) == (2, 4)
    assert repr(a) == "ProcessGroup(ranks=(0, 1), name='g')"


# ---- whole numbers, positive rates ---------------------------------------------------------
@given(st.integers(1, 10**6))
def test_whole_keeps_every_whole_number_whatever_its_type(n):
    for v in (n, np.int64(n), np.uint32(n), float(n), np.float64(n)):
        got = whole(v, "x")
        assert got == n and type(got) is int


@given(st.one_of(st.floats().filter(lambda f: not (math.isfinite(f) and f.is_integer())),
                 st.integers(max_value=0), st.booleans(), st.text(), st.none(),
                 st.lists(st.integers(1, 3), max_size=2)))
def test_whole_refuses_everything_else_and_names_it(v):
    with pytest.raises((TypeError, ValueError), match="the size x"):
        whole(v, "the size x")


@given(st.one_of(st.floats(max_value=0.0), st.just(math.inf), st.just(math.nan),
                 st.booleans(), st.text()))
def test_positive_refuses_zero_negative_infinite_nan_and_non_numbers(v):
    with pytest.raises((TypeError, ValueError), match="bandwidth"):
        positive(v, "bandwidth")


@settings(max_examples=30)
@given(n=st.integers(1, 64), g=st.integers(1, 64))
def test_topology_of_whole_sizes_is_unchanged_and_of_fractions_refused(n, g):
    t = mp.Topology.nodes(float(n), g)
    assert (t.num_nodes, t.gpus_per_node, t.world_size) == (n, g, n * g)
    assert type(t.world_size) is int
    with pytest.raises(ValueError, match=r"Topology\(gpus_per_node="):
        mp.Topology.nodes(n, g + 0.5)


def test_a_topology_or_mesh_larger_than_any_cluster_is_refused_before_allocating():
    with pytest.raises(ValueError, match="more than minipar lays out"):
        mp.Topology.nodes(MAX_RANKS, 2)
    with pytest.raises(ValueError, match="more than minipar lays out"):
        mp.DeviceMesh((2**30, 2**30, 2**30), ("pp", "dp", "tp"))
    assert mp.DeviceMesh((1024, 1024), ("dp", "tp")).size == MAX_RANKS  # the largest


def test_a_zero_latency_link_is_still_the_ideal_link_it_was():
    ideal = mp.Link("ideal", 100e9, 0.0)
    assert ideal.time(100e9) == 1.0 and ideal.latency == 0.0


# ---- ParallelDims ----------------------------------------------------------------------------
def test_parallel_dims_take_numpy_integers_as_the_ints_they_are():
    a = ParallelDims(dp_shard=np.int64(2), tp=np.int32(4))
    assert a == ParallelDims(dp_shard=2, tp=4) and type(a.tp) is int
    assert a.mesh_shape == (1, 1, 2, 1, 4)


@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_in_order(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.timeout(5)
def test_an_ep_that_does_not_divide_a_large_dp_is_refused_at_once():
    with pytest.raises(ValueError, match=r"choose ep in \[1, 2, 4"):
        ParallelDims(dp_shard=2**19, ep=3)
