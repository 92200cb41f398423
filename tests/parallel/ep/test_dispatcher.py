"""The all-to-all token dispatcher against its definition: combine undoes dispatch exactly,
each rank receives the other ranks' rows for its experts grouped by local expert then
source rank, each backward is its forward's adjoint, the all-to-alls are on the clock with
the bytes the cost model charges, and bad groups and counts are refused."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.parallel.ep.dispatcher import (combine, combine_backward, dispatch,
                                            dispatch_backward, local_expert_indices)

H = 3


def rank_rows(rank, E, seed):
    """Rank `rank`'s permuted rows xs [R, H] and rows_per_expert [E] (some experts none)."""
    g = np.random.default_rng([seed, rank])
    counts = g.integers(0, 4, E)
    return g.standard_normal((int(counts.sum()), H)), counts


def ep_group(rank, world, ep):
    """The ep group of `rank`: ranks d, d + dp, d + 2·dp, ... (strided, dp = world / ep), so
    a rank's global rank and its place in the group differ when dp > 1."""
    dp = world // ep
    return mp.new_group(range(rank % dp, world, dp), "ep")


def run(program, ep, dp=1):
    """program(ctx, group) on ep·dp ranks; dp separate ep groups."""
    return mp.launch(lambda ctx: program(ctx, ep_group(ctx.rank, ep * dp, ep)), ep * dp)


configs = dict(ep=st.sampled_from([1, 2, 4]), local=st.integers(1, 2),
               dp=st.sampled_from([1, 2]), seed=st.integers(0, 999))


@pytest.mark.timeout(120)
@settings(max_examples=25)
@given(**configs)
def test_each_rank_receives_its_experts_rows_by_local_expert_then_source(ep, local, dp, seed):
    E = ep * local

    def program(ctx, g):
        xs, counts = rank_rows(ctx.rank, E, seed)
        rows, per_local, record = dispatch(xs, counts, g, E)
        back = combine(rows, record)  # the experts as the identity
        return g.ranks, local_expert_indices(E, g), rows, per_local, back, xs

    for r, (ranks, mine, rows, per_local, back, xs) in enumerate(run(program, ep, dp)):
        p = ranks.index(r)
        assert mine == list(range(p * local, (p + 1) * local))
        sources = [rank_rows(i, E, seed) for i in ranks]  # in group order
        want = [np.split(x, np.cumsum(c)[:-1])[e] for e in mine for x, c in sources]
        np.testing.assert_array_equal(rows, np.concatenate(want).reshape(-1, H))
        assert per_local.tolist() == [sum(int(c[e]) for _, c in sources) for e in mine]
        np.testing.assert_array_equal(back, xs)  # combine(dispatch(xs)) is xs, exactly


@pytest.mark.timeout(120)
@settings(max_examples=25)
@given(**configs)
def test_each_backward_is_its_forwards_adjoint(ep, local, dp, seed):
    """<dispatch(x), y> = <x, dispatch_backward(y)> and <combine(u), z> = <u,
    combine_backward(z)>, each side summed over the group's ranks."""
    E = ep * local

    def program(ctx, g):
        xs, counts = rank_rows(ctx.rank, E, seed)
        rng = np.random.default_rng([seed, ctx.rank, 1])
        rows, _, record = dispatch(xs, counts, g, E)
        y = rng.standard_normal(rows.shape)  # y: [R_local, H]
        u = rng.standard_normal(rows.shape)  # u: [R_local, H]
        z = rng.standard_normal(xs.shape)  # z: [R, H]
        dxs = dispatch_backward(y, record)
        dys_local = combine_backward(z, record)
        assert dxs.shape == xs.shape and dys_local.shape == rows.shape
        return rows * y, xs * dxs, combine(u, record) * z, u * dys_local  # the products

    out = run(program, ep, dp)
    for d in range(dp):  # each ep group on its own: ranks d, d + dp, ...
        mine = out[d::dp]
        for fwd, bwd in ((0, 1), (2, 3)):  # dispatch's pair, then combine's
            a = np.concatenate([o[fwd].ravel() for o in mine])
            b = np.concatenate([o[bwd].ravel() for o in mine])
            # a permutation: the same products, bit for bit, in another order ...
            np.testing.assert_array_equal(np.sort(a), np.sort(b))
            # ... so the inner products agree to the rounding of their sums
            assert abs(a.sum() - b.sum()) <= 1e-12 * np.abs(a).sum()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ep,local", [(2, 1), (2, 2), (4, 2)])
def test_the_all_to_alls_are_on_the_clock_with_the_bytes_sent_to_other_ranks(ep, local):
    """cost.bytes_sent for an all-to-all is what a rank sends to the *other* ranks (its own
    piece stays); the event's nbytes is the collective's size S, all it sends, its own
    piece included (nccl-tests' message size)."""
    E, seed = ep * local, 7

    def program(ctx, g):
        xs, counts = rank_rows(ctx.rank, E, seed)
        rows, _, record = dispatch(xs, counts, g, E)
        ys = combine(rows, record)
        dispatch_backward(combine_backward(ys, record), record)
        return record.input_splits, record.output_splits

    res = mp.launch(lambda ctx: program(ctx, mp.new_group(range(ep), "ep")), ep)
    for p, (sent, received) in enumerate(res):
        events = res.contexts[p].trace.of(stream="comm")
        assert [e.name for e in events] == ["all_to_all"] + ["all_to_all_single"] * 4
        assert all(e.group == tuple(range(ep)) and e.label == "ep" and e.end > e.start
                   for e in events)
        counts, rows_out, rows_back, grads_out, grads_back = events
        assert (counts.nbytes, counts.meta["sent_bytes"]) == (ep * local * 8,
                                                              (ep - 1) * local * 8)
        others = np.arange(ep) != p
        for e, splits in ((rows_out, sent), (rows_back, received), (grads_out, sent),
                          (grads_back, received)):  # float64 rows of H elements
            assert e.nbytes == int(splits.sum()) * H * 8
            assert e.meta["sent_bytes"] == int(splits[others].sum()) * H * 8


@pytest.mark.timeout(60)
def test_a_group_of_one_issues_no_collective():
    def program(ctx):
        xs, counts = rank_rows(0, 3, 1)
        rows, per_local, record = dispatch(xs, counts, mp.new_group([0], "ep"), 3)
        return rows, per_local, xs, counts

    res = mp.launch(program, 1)
    rows, per_local, xs, counts = res[0]
    np.testing.assert_array_equal(rows, xs)
    assert per_local.tolist() == counts.tolist()
    assert res.contexts[0].trace.of(stream="comm") == []


@pytest.mark.timeout(60)
def test_bad_groups_and_counts_are_refused():
    xs, counts = rank_rows(0, 4, 0)

    def call(group, E=4, c=counts, x=xs):
        return lambda ctx: dispatch(x, c, group(ctx) if callable(group) else group, E)

    with pytest.raises(mp.RankFailedError, match=r"num_experts = 3 cannot be split over "
                       r"expert-parallel group ep\[0, 1\] of size 2: expected a positive "
                       r"multiple of 2"):
        mp.launch(call(lambda ctx: mp.new_group([0, 1], "ep"), E=3), 2)
    with pytest.raises(mp.RankFailedError, match=r"expected the expert-parallel group as a "
                       r"ProcessGroup .*received list \[0, 1\]"):
        mp.launch(call([0, 1]), 2)
    with pytest.raises(mp.RankFailedError, match=r"rank 1 is not a member of the "
                       r"expert-parallel group ep\[0\]"):
        mp.launch(call(lambda ctx: mp.new_group([0], "ep")), 2)
    with pytest.raises(mp.RankFailedError, match=r"expected rows_per_expert as 4 "
                       r"non-negative ints .* summing to the \d+ rows of xs"):
        mp.launch(call(lambda ctx: mp.new_group([0, 1], "ep"), c=counts + 1), 2)
    with pytest.raises(mp.RankFailedError, match=r"expected rows xs \[R, h\] .*received "
                       r"shape \(\d+,\)"):
        mp.launch(call(lambda ctx: mp.new_group([0, 1], "ep"), x=xs[:, 0]), 2)
