"""Pin every reference definition (`minipar/runtime/reference.py`) with hand-computed cases.

Every expected value below is written out literally: a reader can check it with pencil and
paper. The blocks are asymmetric (different on every rank, roots other than 0) so that a
definition that mixes up ranks, roots or axes gives a different answer.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from minipar.runtime import reference as ref
from minipar.runtime.collectives import ReduceOp
from minipar.runtime.errors import CollectiveUsageError

bf16 = ml_dtypes.bfloat16


def a(values, dtype=np.float64):
    return np.array(values, dtype=dtype)


def assert_exact(got, expected):
    """Same dtype, same shape, same bits."""
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.tobytes() == expected.tobytes(), (got, expected)


def assert_fresh(results, blocks):
    """No result array shares memory with an input block or with another result."""
    outs = [r for r in _flat(results)]
    ins = [b for b in _flat(blocks)]
    for i, r in enumerate(outs):
        for b in ins:
            assert not np.shares_memory(r, b)
        for s in outs[i + 1:]:
            assert not np.shares_memory(r, s)


def _flat(x):
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (list, tuple)):
        return [y for e in x for y in _flat(e)]
    return []


THREE = [a([1, 2]), a([10, 20]), a([100, 200])]


# ---- all_reduce -------------------------------------------------------------------------
def test_all_reduce_sum_three_ranks():
    out = ref.all_reduce_ref(THREE, "sum")
    assert len(out) == 3
    for o in out:
        assert_exact(o, a([111, 222]))
    assert_fresh(out, THREE)


@pytest.mark.parametrize("op, expected", [
    ("max", [5, 81, 0]),
    ("min", [3, -7, -4]),
    ("prod", [60, 567, 0]),     # 3*5*4, (-1)*(-7)*81, 0*(-4)*0
    ("sum", [12, 73, -4]),
])
def test_all_reduce_elementwise_ops(op, expected):
    blocks = [a([3, -1, 0], np.int64), a([5, -7, -4], np.int64), a([4, 81, 0], np.int64)]
    out = ref.all_reduce_ref(blocks, op)
    for o in out:
        assert_exact(o, a(expected, np.int64))
    assert_fresh(out, blocks)


def test_all_reduce_avg_float():
    blocks = [a([1.0, 2.0]), a([3.0, 4.0]), a([5.0, 12.0])]
    out = ref.all_reduce_ref(blocks, "avg")
    for o in out:
        assert_exact(o, a([3.0, 6.0]))


def test_all_reduce_avg_keeps_float32():
    blocks = [a([1.0, 2.0], np.float32), a([2.0, 7.0], np.float32)]
    out = ref.all_reduce_ref(blocks, "avg")
    assert_exact(out[0], a([1.5, 4.5], np.float32))


def test_all_reduce_accepts_reduce_op_enum_and_any_case():
    blocks = [a([1, 8]), a([6, 2])]
    assert_exact(ref.all_reduce_ref(blocks, ReduceOp.MAX)[0], a([6, 8]))
    assert_exact(ref.all_reduce_ref(blocks, "MIN")[1], a([1, 2]))
    assert_exact(ref.all_reduce_ref(blocks, ReduceOp.PRODUCT)[0], a([6, 16]))


def test_unknown_op_refused():
    with pytest.raises(CollectiveUsageError, match="unknown reduction op 'median'"):
        ref.all_reduce_ref(THREE, "median")


def test_all_reduce_int_keeps_int_dtype():
    blocks = [a([1, 2], np.int32), a([3, 4], np.int32)]
    assert_exact(ref.all_reduce_ref(blocks)[1], a([4, 6], np.int32))


def test_all_reduce_single_rank_is_a_copy():
    b = [a([[1.5, -2.0]])]
    out = ref.all_reduce_ref(b)
    assert_exact(out[0], a([[1.5, -2.0]]))
    assert_fresh(out, b)


def test_all_reduce_2d_blocks():
    blocks = [a([[1, 2], [3, 4]]), a([[10, 20], [30, 40]])]
    assert_exact(ref.all_reduce_ref(blocks)[0], a([[11, 22], [33, 44]]))


# ---- reduction order and precision ------------------------------------------------------
def test_float32_sum_is_the_left_fold_in_group_order():
    # 2**24 + 1 is not a float32: it rounds (ties to even) back to 2**24.
    big, one = 2.0 ** 24, 1.0
    blocks = [a([big], np.float32), a([one], np.float32), a([one], np.float32)]
    # ((big + 1) + 1) = (16777216 + 1) + 1 = 16777216 + 1 = 16777216 in float32
    left = ref.all_reduce_ref(blocks)[0]
    assert_exact(left, a([16777216.0], np.float32))
    # the right fold (big + (1 + 1)) = 16777218 is exactly representable: a different answer
    assert float(left[0]) != 16777218.0
    # the same three values in another group order: ((1 + 1) + big) = 16777218
    reordered = [blocks[1], blocks[2], blocks[0]]
    assert_exact(ref.all_reduce_ref(reordered)[0], a([16777218.0], np.float32))


def test_float32_sum_is_not_accumulated_in_float64():
    blocks = [a([2.0 ** 24], np.float32)] + [a([1.0], np.float32)] * 4
    # in float64 the sum would be 16777220; the float32 left fold never moves off 2**24
    assert_exact(ref.reduce_ref(blocks, dst=3)[3], a([16777216.0], np.float32))


def test_bfloat16_accumulates_in_bfloat16():
    # bfloat16 has 8 significant bits: between 256 and 512 the spacing is 2, so
    # 256 + 1 = 257 rounds (ties to even) to 256, twice. Accumulating in float32 and
    # rounding once at the end would give 258.
    blocks = [a([256.0, 1.0], bf16), a([1.0, 1.0], bf16), a([1.0, 256.0], bf16)]
    out = ref.all_reduce_ref(blocks)
    for o in out:
        assert o.dtype == bf16
        assert_exact(o, a([256.0, 258.0], bf16))
    # sanity of the claim about the other order of accumulation
    assert float(np.float32(256) + np.float32(1) + np.float32(1)) == 258.0


def test_avg_is_the_sum_divided_by_n_in_the_blocks_dtype():
    # bfloat16: 256 + 1 + 1 -> 256 (see above), / 3 = 85.33 -> 85.5 in bfloat16 (spacing 0.5)
    blocks = [a([256.0], bf16), a([1.0], bf16), a([1.0], bf16)]
    out = ref.all_reduce_ref(blocks, "avg")
    assert_exact(out[2], a([85.5], bf16))


def test_avg_of_0d_blocks_is_a_0d_array():
    out = ref.all_reduce_ref([a(1.0), a(2.0), a(6.0)], "avg")
    for o in out:
        assert_exact(o, a(3.0))
    assert_fresh(out, [])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_avg_refused_for_integers(dtype):
    blocks = [a([1, 2], dtype), a([3, 4], dtype)]
    with pytest.raises(CollectiveUsageError, match="avg"):
        ref.all_reduce_ref(blocks, "avg")
    with pytest.raises(CollectiveUsageError, match="integer dtype"):
        ref.reduce_ref(blocks, dst=1, op=ReduceOp.AVG)
    with pytest.raises(CollectiveUsageError, match="avg"):
        ref.reduce_scatter_ref(blocks, op="avg")


def test_check_op_normalises_and_validates():
    assert ref.check_op("SUM", np.float32) == "sum"
    assert ref.check_op(ReduceOp.AVG, np.float64) == "avg"
    assert ref.check_op("max", np.int32) == "max"
    with pytest.raises(CollectiveUsageError):
        ref.check_op("avg", np.int16)


# ---- reduce -----------------------------------------------------------------------------
def test_reduce_to_a_non_zero_root():
    out = ref.reduce_ref(THREE, dst=2)
    assert out[0] is None and out[1] is None
    assert_exact(out[2], a([111, 222]))
    out = ref.reduce_ref(THREE, dst=1, op="max")
    assert out[0] is None and out[2] is None
    assert_exact(out[1], a([100, 200]))
    assert_fresh(out, THREE)


# ---- broadcast --------------------------------------------------------------------------
def test_broadcast_from_a_non_zero_root():
    out = ref.broadcast_ref(THREE, src=1)
    assert len(out) == 3
    for o in out:
        assert_exact(o, a([10, 20]))
    assert_fresh(out, THREE)


def test_broadcast_ignores_other_ranks_blocks():
    out = ref.broadcast_ref([None, None, a([[7, 8, 9]], np.int32)], src=2)
    for o in out:
        assert_exact(o, a([[7, 8, 9]], np.int32))


# ---- all_gather -------------------------------------------------------------------------
def test_all_gather_axis0():
    blocks = [a([[1, 2]]), a([[3, 4]]), a([[5, 6]])]
    out = ref.all_gather_ref(blocks, axis=0)
    for o in out:
        assert_exact(o, a([[1, 2], [3, 4], [5, 6]]))
    assert_fresh(out, blocks)


def test_all_gather_axis1():
    blocks = [a([[1], [2]]), a([[3], [4]]), a([[5], [6]])]
    out = ref.all_gather_ref(blocks, axis=1)
    for o in out:
        assert_exact(o, a([[1, 3, 5], [2, 4, 6]]))
    assert_fresh(out, blocks)


def test_all_gather_axis1_wider_blocks():
    blocks = [a([[1, 2], [3, 4]], np.int32), a([[10, 20], [30, 40]], np.int32)]
    out = ref.all_gather_ref(blocks, axis=1)
    assert_exact(out[1], a([[1, 2, 10, 20], [3, 4, 30, 40]], np.int32))
    out = ref.all_gather_ref(blocks, axis=-1)
    assert_exact(out[0], a([[1, 2, 10, 20], [3, 4, 30, 40]], np.int32))


# ---- reduce_scatter ---------------------------------------------------------------------
def test_reduce_scatter_axis0_three_ranks():
    blocks = [a([1, 2, 3, 4, 5, 6]), a([10, 20, 30, 40, 50, 60]),
              a([100, 200, 300, 400, 500, 600])]
    out = ref.reduce_scatter_ref(blocks)
    assert_exact(out[0], a([111, 222]))
    assert_exact(out[1], a([333, 444]))
    assert_exact(out[2], a([555, 666]))
    assert_fresh(out, blocks)


def test_reduce_scatter_axis1_max():
    blocks = [a([[1, 9, 2, 8], [0, 0, 0, 0]]), a([[5, 5, 5, 5], [-1, 3, -2, 4]])]
    out = ref.reduce_scatter_ref(blocks, op="max", axis=1)
    assert_exact(out[0], a([[5, 9], [0, 3]]))
    assert_exact(out[1], a([[5, 8], [0, 4]]))


def test_reduce_scatter_non_divisible_refused():
    blocks = [a([1, 2, 3, 4, 5]), a([1, 2, 3, 4, 5])]
    with pytest.raises(CollectiveUsageError, match=r"length 5 .* 2 equal chunks"):
        ref.reduce_scatter_ref(blocks)
    with pytest.raises(CollectiveUsageError, match="not divisible by 3"):
        ref.reduce_scatter_ref([a([[1, 2]])] * 3, axis=1)


# ---- gather / scatter -------------------------------------------------------------------
def test_gather_to_a_non_zero_root():
    out = ref.gather_ref(THREE, dst=1)
    assert out[0] is None and out[2] is None
    assert len(out[1]) == 3
    assert_exact(out[1][0], a([1, 2]))
    assert_exact(out[1][1], a([10, 20]))
    assert_exact(out[1][2], a([100, 200]))
    assert_fresh(out, THREE)


def test_scatter_from_a_non_zero_root():
    pieces = [a([0, 1]), a([2, 3]), a([4, 5])]
    out = ref.scatter_ref([None, None, pieces], src=2)
    assert_exact(out[0], a([0, 1]))
    assert_exact(out[1], a([2, 3]))
    assert_exact(out[2], a([4, 5]))
    assert_fresh(out, pieces)


def test_scatter_needs_one_piece_per_rank():
    with pytest.raises(CollectiveUsageError, match=r"one piece per rank \(3\), got 2 pieces"):
        ref.scatter_ref([None, [a([1]), a([2])], None], src=1)
    with pytest.raises(CollectiveUsageError, match="got None"):
        ref.scatter_ref([None, None], src=0)


# ---- all_to_all -------------------------------------------------------------------------
def test_all_to_all_is_a_transpose_with_uneven_pieces():
    # blocks[j][i]: what rank j sends to rank i. Sizes differ per (j, i).
    blocks = [
        [a([0]), a([1, 1]), a([2, 2, 2])],             # rank 0 sends
        [a([]), a([11]), a([12, 12])],                 # rank 1 sends (nothing to rank 0)
        [a([20, 20, 20, 20]), a([21]), a([22])],       # rank 2 sends
    ]
    out = ref.all_to_all_ref(blocks)
    # rank 0 receives slot j from rank j
    assert_exact(out[0][0], a([0]))
    assert_exact(out[0][1], a([]))
    assert_exact(out[0][2], a([20, 20, 20, 20]))
    assert_exact(out[1][0], a([1, 1]))
    assert_exact(out[1][1], a([11]))
    assert_exact(out[1][2], a([21]))
    assert_exact(out[2][0], a([2, 2, 2]))
    assert_exact(out[2][1], a([12, 12]))
    assert_exact(out[2][2], a([22]))
    assert_fresh(out, blocks)


def test_all_to_all_single_uneven_splits():
    blocks = [a([0, 1, 2, 3]), a([10, 11, 12])]
    out = ref.all_to_all_single_ref(blocks, [[1, 3], [2, 1]])
    assert_exact(out[0], a([0, 10, 11]))
    assert_exact(out[1], a([1, 2, 3, 12]))
    assert_fresh(out, blocks)


def test_all_to_all_single_with_zero_splits_three_ranks():
    blocks = [a([0, 1, 2]), a([10, 11]), a([20, 21, 22, 23])]
    out = ref.all_to_all_single_ref(blocks, [[0, 2, 1], [1, 1, 0], [2, 0, 2]])
    assert_exact(out[0], a([10, 20, 21]))
    assert_exact(out[1], a([0, 1, 11]))
    assert_exact(out[2], a([2, 22, 23]))


def test_all_to_all_single_along_axis1():
    blocks = [a([[1, 2, 3], [4, 5, 6]]), a([[7, 8], [9, 10]])]
    out = ref.all_to_all_single_ref(blocks, [[2, 1], [1, 1]], axis=1)
    assert_exact(out[0], a([[1, 2, 7], [4, 5, 9]]))
    assert_exact(out[1], a([[3, 8], [6, 10]]))


# ---- barrier and the table ---------------------------------------------------------------
def test_barrier_moves_nothing():
    assert ref.barrier_ref([None, None, None]) == [None, None, None]


def test_every_collective_has_a_reference():
    assert set(ref.REFERENCES) == {
        "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "gather",
        "scatter", "all_to_all", "all_to_all_single", "barrier"}
