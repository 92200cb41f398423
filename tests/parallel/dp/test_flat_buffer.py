"""FlatParameter: layout, padding to a multiple of N, shards, segments and views."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.nn.parameter import Parameter
from minipar.parallel import FlatParameter


def make_params(shapes, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    with mp.device():
        return [Parameter(f"p{i}", rng.standard_normal(s).astype(dtype), charge=False)
                for i, s in enumerate(shapes)]


def test_layout_by_hand():
    ps = make_params([(2, 3), (4,), (1,)])  # 6 + 4 + 1 = 11 elements
    flat = FlatParameter("u", ps, 4)
    assert flat.offsets == [0, 6, 10]
    assert (flat.numel, flat.padded_numel, flat.padding, flat.shard_numel) == (11, 12, 1, 3)
    assert [flat.shard_range(r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    # rank 3's shard [9, 12) holds p1[3], p2[0] and one element of padding
    assert [(s.name, s.start, s.stop, s.offset) for s in flat.segments(3)] == [
        ("p1", 9, 10, 6), ("p2", 10, 11, 10)]
    buf = flat.flatten()
    np.testing.assert_array_equal(buf[:6], ps[0].data.ravel())
    assert buf[11] == 0.0  # the padding is zero


@given(sizes=st.lists(st.integers(1, 13), min_size=1, max_size=5), world=st.integers(1, 5))
def test_shards_tile_the_buffer_and_segments_tile_the_parameters(sizes, world):
    ps = make_params([(n,) for n in sizes])
    flat = FlatParameter("u", ps, world)
    assert flat.padded_numel % world == 0 and 0 <= flat.padding < world
    assert flat.shard_numel * world == flat.padded_numel
    covered = {p.name: 0 for p in ps}
    for r in range(world):
        lo, hi = flat.shard_range(r)
        for s in flat.segments(r):
            assert lo <= s.start < s.stop <= hi
            covered[s.name] += s.stop - s.start
    assert covered == {p.name: p.size for p in ps}  # every element in exactly one shard


def test_views_alias_the_buffer_and_unflatten_copies():
    ps = make_params([(2, 2), (3,)])
    flat = FlatParameter("u", ps, 2)
    buf = flat.flatten()
    flat.use_data(buf)
    buf[0] = 42.0
    assert ps[0].data[0, 0] == 42.0  # the parameter reads the buffer
    out = flat.unflatten(buf)
    out["p0"][0, 0] = -1.0
    assert buf[0] == 42.0  # unflatten copies
    g = np.zeros(flat.padded_numel)
    flat.use_grads(g)
    ps[1].accumulate(np.ones(3))  # Parameter.accumulate adds into the view in place
    np.testing.assert_array_equal(g[4:7], 1.0)
    assert flat.detached_grads() == []
    ps[1].grad = None
    assert flat.detached_grads() == ["p1"]


def test_freed_parameters_hold_nothing_and_fail_loudly():
    ps = make_params([(2, 3)])
    flat = FlatParameter("u", ps, 2)
    buf = flat.flatten()
    flat.free_data()
    assert ps[0].data.size == 0
    with pytest.raises(ValueError, match="sharded away"):
        flat.flatten()
    flat.use_data(buf)
    assert ps[0].data.shape == (2, 3)


def test_mixed_dtypes_and_wrong_buffers_are_refused():
    with mp.device():
        a = Parameter("a", np.zeros(2), charge=False)
        b = Parameter("b", np.zeros(2, np.float32), charge=False)
    with pytest.raises(TypeError, match="mixes parameter dtypes"):
        FlatParameter("u", [a, b], 2)
    flat = FlatParameter("u", [a], 3)
    with pytest.raises(ValueError, match=r"shape \[3\] \(numel 2 \+ padding 1\)"):
        flat.views(np.zeros(2))
    with pytest.raises(ValueError, match="world must be a positive integer"):
        FlatParameter("u", [a], 0)
