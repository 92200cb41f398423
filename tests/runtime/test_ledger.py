"""The memory ledger: what is held, by category, now and at peak; OOM with a breakdown."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.runtime.device import DeviceSpec
from minipar.runtime.ledger import CATEGORIES, MemoryLedger, fmt_bytes
from minipar.runtime.topology import Topology


# ---- holding and releasing ------------------------------------------------------------
def test_hold_and_release_by_category():
    L = MemoryLedger()
    assert L.hold("w", 1000, "parameters") == "w"
    L.hold("g", 1000, "gradients")
    L.hold("m", 4000, "optimizer_states")
    L.hold("act1", 300, "activations")
    assert (L.held("parameters"), L.held("gradients"), L.held("optimizer_states"),
            L.held("activations"), L.held("comm_buffers"), L.held("other")) == \
        (1000, 1000, 4000, 300, 0, 0)
    assert L.held() == 6300
    assert L.release("act1") == 300
    assert L.held("activations") == 0 and L.held() == 6000
    assert L.peak("activations") == 300 and L.peak() == 6300
    assert {a.name for a in L.live()} == {"w", "g", "m"}


def test_peak_per_category_and_in_total_are_separate_maxima():
    L = MemoryLedger()
    L.hold("a", 500, "activations")
    L.release("a")
    L.hold("b", 300, "comm_buffers")
    L.hold("c", 100, "activations")
    # activations peaked at 500 (alone); the total peaked at 500 too; comm at 300
    assert (L.peak("activations"), L.peak("comm_buffers"), L.peak()) == (500, 300, 500)
    L.hold("d", 250, "activations")  # total now 650: a new overall peak
    assert (L.peak("activations"), L.peak()) == (500, 650)


def test_reset_peak_starts_from_what_is_held_now():
    L = MemoryLedger()
    L.hold("a", 800, "activations")
    L.hold("p", 200, "parameters")
    L.release("a")
    assert L.peak() == 1000
    L.reset_peak()
    assert L.peak() == 200 and L.peak("activations") == 0 and L.peak("parameters") == 200
    L.hold("b", 50, "activations")
    assert L.peak() == 250 and L.peak("activations") == 50


def test_scoped_holds_for_the_block_and_releases_even_on_error():
    L = MemoryLedger()
    with L.scoped("tmp", 4096, "activations") as name:
        assert name == "tmp" and L.held("activations") == 4096
    assert L.held() == 0 and L.peak() == 4096
    with pytest.raises(RuntimeError):
        with L.scoped("tmp", 10):
            raise RuntimeError("boom")
    assert L.held() == 0 and L.live() == []


def test_holding_an_array_charges_its_nbytes():
    L = MemoryLedger()
    L.hold("x", np.zeros((3, 5), dtype=np.float64), "activations")
    L.hold("y", np.zeros(7, dtype=np.float16))
    L.hold("z", np.zeros((4, 4), dtype=np.float32)[:, :2])  # a view: its own nbytes
    assert L.held("activations") == 3 * 5 * 8
    assert L.held("other") == 7 * 2 + 4 * 2 * 4


def test_a_whole_float_byte_count_is_that_many_bytes():
    L = MemoryLedger()
    L.hold("w", 2e9, "parameters")  # e.g. 1e9 params * 2 bytes computed as a float
    L.hold("n", np.float64(16.0))
    assert L.held("parameters") == 2_000_000_000 and L.held("other") == 16
    with pytest.raises(ValueError, match="whole, non-negative"):
        L.hold("half", 1.5)


def test_duplicate_names_are_refused():
    L = MemoryLedger(rank=2)
    L.hold("w", 10, "parameters")
    with pytest.raises(ValueError, match=r"rank 2: an allocation named 'w' is already held"):
        L.hold("w", 20, "gradients")
    assert L.held() == 10 and L.held("gradients") == 0


def test_negative_sizes_and_unknown_categories_are_refused():
    L = MemoryLedger()
    with pytest.raises(ValueError, match="negative size"):
        L.hold("x", -1)
    with pytest.raises(ValueError, match="negative size"):
        L.hold("x", np.int64(-8))
    with pytest.raises(ValueError):
        L.hold("x", -8.0)
    with pytest.raises(ValueError, match="unknown memory category 'weights'"):
        L.hold("x", 8, "weights")
    assert L.held() == 0 and L.live() == []


def test_releasing_what_is_not_held_says_so():
    L = MemoryLedger(rank=1)
    L.hold("a", 1)
    with pytest.raises(KeyError, match="rank 1: no live allocation named 'b'"):
        L.release("b")


def test_hold_unique_gives_fresh_names():
    L = MemoryLedger()
    a = L.hold_unique("buf", 8, "comm_buffers")
    b = L.hold_unique("buf", 8, "comm_buffers")
    assert a != b and a.startswith("buf#") and L.held("comm_buffers") == 16
    L.release(a)
    L.release(b)
    assert L.held() == 0


def test_fmt_bytes_uses_binary_units():
    assert fmt_bytes(1000) == "1000 B"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(3 * 1024**3) == "3.00 GiB"


def test_summary_lists_every_category():
    L = MemoryLedger(capacity=1 << 20, device_name="toy", rank=0)
    L.hold("w", 2048, "parameters")
    text = L.summary()
    for c in CATEGORIES:
        assert c in text
    assert "2.00 KiB" in text and "capacity 1.00 MiB" in text


# ---- out of memory --------------------------------------------------------------------
def test_going_over_capacity_raises_with_the_breakdown():
    L = MemoryLedger(capacity=10_000, device_name="toy-gpu", rank=3)
    L.hold("weights", 6000, "parameters")
    L.hold("adam", 3000, "optimizer_states")
    with pytest.raises(mp.SimulatedOutOfMemoryError) as info:
        L.hold("acts", 2000, "activations")
    msg = str(info.value)
    assert "rank 3 (toy-gpu)" in msg
    assert "1.95 KiB for 'acts' (activations)" in msg  # requested: 2000 B
    assert "8.79 KiB already held" in msg  # 9000 B
    assert "of 9.77 KiB capacity" in msg  # 10000 B
    assert "(1000 B free)" in msg
    assert "parameters" in msg and "5.86 KiB" in msg  # 6000 B
    assert "optimizer_states" in msg and "2.93 KiB" in msg  # 3000 B
    # the largest live allocations, biggest first
    assert msg.index("weights") < msg.index("adam")
    # the failed hold left nothing behind; exactly filling the device is fine
    assert L.held() == 9000 and "acts" not in {a.name for a in L.live()}
    L.hold("acts", 1000, "activations")
    assert L.held() == 10_000
    assert isinstance(info.value, MemoryError)


@pytest.mark.timeout(20)
def test_oom_inside_launch_surfaces_from_launch():
    topo = Topology.nodes(1, 2, device=DeviceSpec.h100_sxm().with_memory(1000))

    def prog(ctx):
        ctx.ledger.hold("small", 500, "activations")
        if ctx.rank == 1:
            ctx.ledger.hold("big", 2000, "activations")
        mp.barrier()

    with pytest.raises(mp.SimulatedOutOfMemoryError) as info:
        mp.launch(prog, 2, topology=topo)
    assert "rank 1" in str(info.value) and "'big'" in str(info.value)
    assert "(raised on rank 1)" in getattr(info.value, "__notes__", [])


@pytest.mark.timeout(20)
def test_a_collective_output_that_does_not_fit_is_an_oom():
    topo = Topology.nodes(1, 2, device=DeviceSpec.h100_sxm().with_memory(1000))

    def prog(ctx):
        return mp.all_gather(np.ones(100))  # output 2 * 800 B > 1000 B

    with pytest.raises(mp.SimulatedOutOfMemoryError, match=r"comm:all_gather"):
        mp.launch(prog, 2, topology=topo)


# ---- communication buffers ------------------------------------------------------------
@pytest.mark.timeout(20)
def test_async_all_reduce_output_is_a_comm_buffer_until_wait():
    x = np.ones(1000)  # 8000 bytes

    def prog(ctx):
        w = mp.all_reduce(x, async_op=True)
        during = ctx.ledger.held("comm_buffers")
        ctx.compute(1e9, "float32")
        w.wait()
        return during, ctx.ledger.held("comm_buffers"), ctx.ledger.held(), \
            ctx.ledger.peak("comm_buffers")

    for during, after, total, peak in mp.launch(prog, 2):
        assert during == 8000
        assert after == 0 and total == 0
        assert peak == 8000


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind, out_bytes", [
    ("all_reduce", 3200), ("all_gather", 4 * 3200), ("reduce_scatter", 3200 // 4)])
def test_output_buffer_size_per_collective(kind, out_bytes):
    x = np.ones(400)  # 3200 bytes

    def prog(ctx):
        w = getattr(mp, kind)(x, async_op=True)
        during = ctx.ledger.held("comm_buffers")
        out = w.wait()
        assert out.nbytes == out_bytes
        return during, ctx.ledger.held("comm_buffers"), ctx.ledger.peak("comm_buffers")

    assert mp.launch(prog, 4) == [(out_bytes, 0, out_bytes)] * 4


@pytest.mark.timeout(20)
def test_blocking_collective_charges_its_buffer_for_its_duration():
    def prog(ctx):
        mp.all_reduce(np.ones(250))
        return ctx.ledger.held(), ctx.ledger.peak("comm_buffers")

    assert mp.launch(prog, 2) == [(0, 2000)] * 2


@pytest.mark.timeout(20)
def test_two_async_collectives_in_flight_hold_both_outputs():
    """Bucketed DDP issues several all_reduces before waiting on any: all outputs are live."""

    def prog(ctx):
        w1 = mp.all_reduce(np.ones(100), async_op=True)  # 800 B
        w2 = mp.all_reduce(np.ones(200), async_op=True)  # 1600 B
        both = ctx.ledger.held("comm_buffers")
        w1.wait()
        after_first = ctx.ledger.held("comm_buffers")
        w2.wait()
        return both, after_first, ctx.ledger.held("comm_buffers"), \
            ctx.ledger.peak("comm_buffers")

    assert mp.launch(prog, 2) == [(2400, 1600, 0, 2400)] * 2


# ---- properties -------------------------------------------------------------------------
NAMES = [f"t{i}" for i in range(6)]
ops = st.lists(st.one_of(
    st.tuples(st.just("hold"), st.sampled_from(NAMES), st.integers(0, 10_000),
              st.sampled_from(CATEGORIES)),
    st.tuples(st.just("release"), st.sampled_from(NAMES)),
    st.tuples(st.just("reset_peak")),
), max_size=60)


@given(ops, st.one_of(st.none(), st.integers(0, 40_000)))
def test_ledger_agrees_with_a_model_of_live_allocations(seq, capacity):
    L = MemoryLedger(capacity=capacity)
    live: dict[str, tuple[int, str]] = {}
    peak_total = 0
    peak_cat = {c: 0 for c in CATEGORIES}
    for op in seq:
        if op[0] == "hold":
            _, name, size, cat = op
            total = sum(s for s, _ in live.values())
            if name in live:
                with pytest.raises(ValueError):
                    L.hold(name, size, cat)
            elif capacity is not None and total + size > capacity:
                with pytest.raises(mp.SimulatedOutOfMemoryError):
                    L.hold(name, size, cat)
            else:
                L.hold(name, size, cat)
                live[name] = (size, cat)
        elif op[0] == "release":
            name = op[1]
            if name in live:
                assert L.release(name) == live.pop(name)[0]
            else:
                with pytest.raises(KeyError):
                    L.release(name)
        else:
            L.reset_peak()
            peak_total = 0
            peak_cat = {c: 0 for c in CATEGORIES}
        current = {c: sum(s for s, k in live.values() if k == c) for c in CATEGORIES}
        total = sum(current.values())
        peak_total = max(peak_total, total)
        for c in CATEGORIES:
            peak_cat[c] = max(peak_cat[c], current[c])
        # current is the sum of the live allocations; peak the running max of that sum
        assert L.held() == total
        assert L.peak() == peak_total
        for c in CATEGORIES:
            assert L.held(c) == current[c]
            assert L.peak(c) == peak_cat[c]
        assert {a.name: (a.nbytes, a.category) for a in L.live()} == live
        if capacity is not None:
            assert L.peak() <= capacity


@given(st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=3), max_size=8))
def test_holding_arrays_matches_their_nbytes(shapes):
    L = MemoryLedger()
    arrays = [np.zeros(s, dtype=np.float32) for s in shapes]
    for i, a in enumerate(arrays):
        L.hold(f"a{i}", a, "activations")
    assert L.held("activations") == sum(a.nbytes for a in arrays)


@given(st.lists(st.tuples(st.sampled_from(CATEGORIES), st.integers(0, 1000), st.booleans()),
                max_size=20))
def test_the_history_replays_to_what_is_held(ops):
    """record_history: each hold and release adds (now(), category, held in it after); the
    last entry of each category is what the ledger holds, and entries carry the clock's time."""
    L, clock = MemoryLedger(), [0.0]
    L.hold("before", 7, "other")  # not recorded: recording starts below
    L.record_history(lambda: clock[0])
    names = []
    for i, (cat, nb, release) in enumerate(ops):
        clock[0] = float(i)
        if release and names:
            L.release(names.pop())
        else:
            names.append(L.hold(f"x{i}", nb, cat))
    assert len(L.history) == len(ops)
    assert [t for t, _, _ in L.history] == [float(i) for i in range(len(ops))]
    for c in CATEGORIES:
        last = [b for _, k, b in L.history if k == c]
        if last:
            assert last[-1] == L.held(c)
    L.record_history(None)
    L.hold("after", 1, "other")
    assert len(L.history) == len(ops)
    with pytest.raises(TypeError, match="record_history takes a function"):
        L.record_history(3.0)
