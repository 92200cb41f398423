"""Layouts against their definition: which positions each rank holds (contiguous, zigzag),
every position held once, shard then unshard gives the array back, and wrong layouts and
lengths are refused with what to change."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipar.parallel.cp import (check_layout, chunks, positions, sequence_order, shard,
                                 unshard)


def test_the_positions_of_cp_4_over_16_tokens():
    contiguous = [positions("contiguous", r, 4, 16).tolist() for r in range(4)]
    zigzag = [positions("zigzag", r, 4, 16).tolist() for r in range(4)]
    assert contiguous == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert zigzag == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert [chunks("zigzag", r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


@settings(max_examples=25)
@given(layout=st.sampled_from(["contiguous", "zigzag"]), cp=st.integers(1, 8),
       per_chunk=st.integers(1, 3), tail=st.lists(st.integers(1, 3), max_size=2),
       axis_first=st.booleans(), seed=st.integers(0, 99))
def test_shard_then_unshard_gives_the_array_back(layout, cp, per_chunk, tail, axis_first,
                                                 seed):
    k = 2 if layout == "zigzag" else 1
    s = k * cp * per_chunk
    shape = [s] + tail if axis_first else tail + [s]
    axis = 0 if axis_first else len(tail)
    x = np.random.default_rng(seed).standard_normal(shape)
    shards = [shard(x, layout, r, cp, axis) for r in range(cp)]
    held = np.sort(np.concatenate([positions(layout, r, cp, s) for r in range(cp)]))
    assert held.tolist() == list(range(s))  # every position on exactly one rank
    for r, piece in enumerate(shards):
        assert piece.shape[axis] == s // cp
        np.testing.assert_array_equal(piece, np.take(x, positions(layout, r, cp, s), axis))
    np.testing.assert_array_equal(unshard(shards, layout, axis), x)
    assert sequence_order(layout, cp, s).tolist() == \
        np.concatenate([positions(layout, r, cp, s) for r in range(cp)]).tolist()


def test_a_zigzag_pairing_r_with_2cp_minus_r_is_refused():
    """The planted error: chunks r and 2cp − r. Rank 0 would hold chunk 2cp, which does not
    exist, and nobody chunk cp: its positions are not the sequence."""
    wrong = lambda r, cp: (r, 2 * cp - r)  # noqa: E731
    held = sorted(c for r in range(4) for c in wrong(r, 4))
    assert held != list(range(8)) and 8 in held and 4 not in held  # the result differs
    with pytest.raises(ValueError, match=r"missing \[4\].*out of range \[8\]"):
        check_layout(wrong, 4)
    with pytest.raises(ValueError, match="r and 2·cp−1−r"):
        shard(np.zeros(16), wrong, 0, 4)
    assert check_layout("zigzag", 4) == 2 and check_layout("contiguous", 4) == 1


def test_a_length_the_layout_cannot_cut_is_refused():
    with pytest.raises(ValueError, match=r"s = 12 .* 8 equal chunks .* zigzag .*multiple of 8"):
        positions("zigzag", 0, 4, 12)
    assert positions("contiguous", 0, 4, 12).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown context-parallel layout 'striped'"):
        positions("striped", 0, 2, 4)
