"""expect_close's summaries and named ratios, expect_within's budgets: what a learner reads."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from minipar.course.expect import (GradeFailure, constant_ratio, describe_ratio, expect_close,
                                   expect_equal, expect_within)


def failure(fn, *args, **kw) -> str:
    with pytest.raises(GradeFailure) as e:
        fn(*args, **kw)
    return str(e.value)


@pytest.mark.parametrize("factor, n, words", [
    (2.0, None, "received = 2× expected everywhere"),
    (0.5, None, "received = ½ expected everywhere"),
    (-1.0, None, "received = −1× expected everywhere"),
    (4.0, 4, "received = n× (n = 4) expected everywhere"),
    (0.25, 4, "received = 1/n (n = 4) expected everywhere"),
    (3.0, 4, "received = (n−1)× (n = 4) expected everywhere"),
    (0.75, None, "received = 0.75× expected everywhere"),
])
def test_a_constant_ratio_is_named(factor, n, words):
    e = np.arange(1.0, 13.0).reshape(3, 4)
    assert describe_ratio(factor * e, e, n)[1] == words
    assert words in failure(expect_close, factor * e, e, what="grad", n=n)


def test_a_ratio_meaning_comes_first():
    e = np.arange(1.0, 5.0)
    text = failure(expect_close, 2 * e, e, what="the gradient", n=2,
                   ratios={"n": "summed where the mean was wanted: divide by n"})
    assert text.startswith("the gradient: received = n× (n = 2) expected everywhere: summed "
                           "where the mean was wanted: divide by n.")


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=20))
def test_no_ratio_when_the_answer_is_not_a_multiple(values):
    e = np.asarray(values)
    r = e + np.arange(e.size)  # a different offset on every element
    c = constant_ratio(r, e)
    if c is not None:  # only when offsets happen to be proportional
        assert np.allclose(r[e != 0], c * e[e != 0])


def test_zeros_where_expected_is_zero_are_required_for_a_ratio():
    assert constant_ratio([2.0, 1.0], [1.0, 0.0]) is None
    assert constant_ratio([2.0, 0.0], [1.0, 0.0]) == 2.0
    assert constant_ratio([1.0, 2.0], [1.0, 2.0]) is None  # equal: no ratio to name


def test_big_arrays_are_summarised_not_dumped():
    e = np.arange(128.0).reshape(16, 8)
    r = e.copy()
    r[3, 5] += 7.0
    r[9, 1] -= 2.0
    text = failure(expect_close, r, e, what="y", rank="tp rank 1 of 2 = global rank 3 of 4")
    assert text.startswith("tp rank 1 of 2 = global rank 3 of 4: y:")
    assert "an array of shape (16, 8), float64" in text
    assert "2 of 128 elements differ; the largest difference is 7 at index (3, 5)" in text
    assert "first differing: (3, 5): expected 29, received 36; (9, 1): expected 73, received 71" in text
    assert "[[" not in text  # no matrix printed


def test_small_arrays_are_shown_whole():
    text = failure(expect_close, np.array([1.0, 5.0]), np.array([1.0, 2.0]), what="y", rank=0)
    assert "rank 0: y: expected [1., 2.] (shape (2,), float64)" in text
    assert "but received [1., 5.]" in text


def test_shape_none_and_non_numbers():
    assert "has shape (3,), expected shape (2,)" in failure(expect_close, np.ones(3), np.ones(2),
                                                             what="y")
    assert "did you forget a `return`?" in failure(expect_close, None, np.ones(2), what="y")
    assert "is str 'abc', expected numbers" in failure(expect_close, "abc", np.ones(2), what="y")


def test_nan_is_a_difference():
    text = failure(expect_close, np.array([np.nan, 1.0]), np.array([1.0, 1.0]), what="y")
    assert "1 of 2 elements differ" in text


def test_expect_equal_and_within():
    assert "expected 2 but received 3" in failure(expect_equal, 3, 2, what="calls")
    expect_within(40.0, 40.0, what="peak", unit="GiB")
    text = failure(expect_within, 41.2, 40.0, what="peak memory", unit="GiB", hint="shard more")
    assert text == ("peak memory is 41.2 GiB, over its budget of 40 GiB by 1.2 GiB (3 %). "
                    "shard more")
    assert "over its budget" in failure(expect_within, float("nan"), 1.0, what="time")


def test_one_or_two_elements_get_only_named_ratios_a_single_quantity_any():
    assert describe_ratio([0.401], [1.0]) is None
    assert describe_ratio([0.8, 1.6], [2.0, 4.0]) is None
    assert describe_ratio([2.0], [1.0])[1] == "received = 2× expected everywhere"
    assert describe_ratio(48.0, 32.0)[1] == "received = 1.5× expected everywhere"
    assert describe_ratio(0.999734, 1.0) is None  # a near miss of one number is no ratio


def test_where_two_names_fit_the_checks_order_wins():
    e = np.arange(1.0, 5.0)
    assert describe_ratio(e / 2, e, 3, prefer=["1/(n-1)", "1/2"])[0] == "1/(n-1)"
    assert describe_ratio(e / 2, e, 3, prefer=["1/2", "1/(n-1)"])[0] == "1/2"
    assert describe_ratio(e / 2, e, 3)[0] == "1/2"
