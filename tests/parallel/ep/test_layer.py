"""ExpertParallelMoE against nn's MoE: on ep ranks each holding its own tokens x_r, the
output, the input gradient, the drops, the balancing losses and the router's and shared
experts' gradients are those of the single-device layer on x_r; an expert's gradient on its
owner is the sum over the ranks of the single-device gradients; the trace shows the
all-to-alls with the bytes of the rows that left the rank; bad layouts are refused."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.nn import WeightGradStore
from minipar.nn.moe import MoE
from minipar.parallel.ep import ExpertParallelMoE

S, B, H, F, SHARED = 3, 2, 4, 6, 5
SCALE = 0.5  # the loss's weight in the backward: the balancing losses' gradients take it
# float64: an expert's matmuls over its rows from every rank round (BLAS's blocking of a
# taller matrix) a little differently from the same rows on one device, and that reaches
# y, dx and the router's gradient (through dw = <dy, ys>). Per array, as the data-
# parallel tests: |a - b| <= RTOL·|b| + ATOL_SCALE·max|b|. Measured over 400 layouts:
# at most 7e-16 (y), 5e-16 (dx), 3.4e-15 (router and shared gradients), 3.6e-15 (an
# expert's summed gradient) of the array's largest value; the aux losses bit for bit.
RTOL, ATOL_SCALE = 1e-12, 1e-14


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL_SCALE * np.abs(want).max())


def config(E, k=2, factor=None, policy="probs", score="softmax", shared=False, **kw):
    return dict(name="moe", hidden=H, ffn_hidden=F, num_experts=E, top_k=min(k, E),
                score_function=score, capacity_factor=factor, drop_policy=policy,
                shared_ffn_hidden=SHARED if shared else 0, aux_loss_coeff=0.01,
                seq_aux_loss_coeff=0.02, z_loss_coeff=0.001, std=0.5, out_std=0.5, **kw)


def data(rank, seed):
    """Rank `rank`'s tokens x_r [S, B, H] and output gradient dy_r."""
    return np.random.default_rng([seed, rank]).standard_normal((2, S, B, H))


def grads_of(moe):
    return {p.name: None if p.grad is None else p.grad.copy() for p in moe.parameters()}


def single(cfg, rank, seed):
    """The single-device MoE on x_r, on a scratch device: what rank r must reproduce."""
    x, dy = data(rank, seed)
    with mp.device():
        moe = MoE(**cfg)
        y, saved = moe.forward(x)
        dx = moe.backward(dy, saved, loss_scale=SCALE)
        return dict(y=y, dx=dx, grads=grads_of(moe), aux=dict(moe.aux_losses),
                    plan=moe.last_plan, init={p.name: p.data for p in moe.parameters()},
                    counts=moe.router.tokens_per_expert.copy())


def run_ep(cfg, ep, seed, dp=1, store=False):
    """ExpertParallelMoE on ep·dp ranks (dp strided ep groups: ranks d, d + dp, ...)."""

    def program(ctx):
        g = mp.new_group(range(ctx.rank % dp, ep * dp, dp), "ep")
        x, dy = data(ctx.rank, seed)
        moe = ExpertParallelMoE(**cfg, group=g)
        init = {p.name: p.data.copy() for p in moe.parameters()}
        y, saved = moe.forward(x)
        w = WeightGradStore() if store else None
        dx = moe.backward(dy, saved, store=w, loss_scale=SCALE)
        if store:
            w.run()
        return dict(y=y, dx=dx, grads=grads_of(moe), aux=dict(moe.aux_losses), init=init,
                    plan=moe.last_plan, group=g.ranks, mine=moe.experts.expert_ids,
                    counts=moe.router.tokens_per_expert.copy())

    return mp.launch(program, ep * dp)


def expert_names(names, e):
    return {n for n in names if n.startswith(f"moe.experts.{e}.")}


@pytest.mark.timeout(300)
@settings(max_examples=25)
@given(layout=st.sampled_from([(ep, E) for ep in (1, 2, 4) for E in range(ep, 9, ep)]),
       k=st.integers(1, 2),
       factor=st.sampled_from([None, 0.5, 1.0, 1.5]),
       policy=st.sampled_from(["probs", "position"]),
       score=st.sampled_from(["softmax", "sigmoid"]), shared=st.booleans(),
       pad=st.booleans(), dp=st.sampled_from([1, 2]), seed=st.integers(0, 999))
def test_each_rank_computes_the_single_device_layer_on_its_own_tokens(
        layout, k, factor, policy, score, shared, pad, dp, seed):
    """Expert e's gradient on its owner is the SUM over the ep group's ranks r of the
    single-device expert-e gradient on x_r: the owner runs expert e on every rank's rows,
    so its dW sums over all of them. How that sum is averaged over the expert's
    data-parallel replicas is the mesh's job, not this layer's. The replicated router and
    shared experts see only this rank's tokens: their gradients are the single-device ones
    on x_r."""
    ep, E = layout  # E: a multiple of ep up to 8
    cfg = config(E, k, factor, policy, score, shared,
                 pad_to_capacity=pad and factor is not None)
    refs = [single(cfg, r, seed) for r in range(ep * dp)]
    for r, got in enumerate(run_ep(cfg, ep, seed, dp)):
        ref = refs[r]
        assert_close(got["y"], ref["y"])
        assert_close(got["dx"], ref["dx"])
        np.testing.assert_array_equal(got["plan"].row, ref["plan"].row)  # the same drops
        assert got["aux"].keys() == ref["aux"].keys() == {"load_balancing",
                                                          "seq_load_balancing", "z_loss"}
        for name, value in got["aux"].items():
            np.testing.assert_allclose(value, ref["aux"][name], rtol=RTOL)
        np.testing.assert_array_equal(got["counts"], ref["counts"])
        p = got["group"].index(r)
        assert got["mine"] == list(range(p * E // ep, (p + 1) * E // ep))
        mine = set().union(*(expert_names(ref["init"], e) for e in got["mine"]))
        replicated = {n for n in ref["init"] if not n.startswith("moe.experts.")}
        assert set(got["init"]) == replicated | mine
        for name, value in got["init"].items():  # the single-device initial weights
            np.testing.assert_array_equal(value, ref["init"][name])
        for name in replicated:
            assert_close(got["grads"][name], ref["grads"][name])
        for name in mine:
            shares = [refs[i]["grads"][name] for i in got["group"]]
            if all(s is None for s in shares):  # no rank routed a row to this expert
                assert got["grads"][name] is None
                continue
            want = sum(np.zeros_like(got["init"][name]) if s is None else s for s in shares)
            assert_close(got["grads"][name], want)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ep", [2, 4])
def test_the_trace_shows_the_all_to_alls_with_the_rows_sent_to_other_ranks(ep):
    """Forward: the counts (all_to_all, int64) and the rows out and back (all_to_all_single);
    backward: the gradients of both, the splits swapped. cost.bytes_sent of an all-to-all is
    what goes to the *other* ranks: rows sent elsewhere · H · 8 bytes (float64)."""
    E, seed = 2 * ep, 3
    cfg = config(E, 2, factor=1.0)
    per = [single(cfg, r, seed)["plan"].rows_per_expert.reshape(ep, E // ep) for r in range(ep)]
    res = run_ep(cfg, ep, seed)
    for p in range(ep):
        sent = per[p].sum(axis=1)  # rows p sends to each rank: [ep]
        received = np.array([per[i][p].sum() for i in range(ep)])  # rows p gets from each
        others = np.arange(ep) != p
        events = res.contexts[p].trace.of(stream="comm")
        assert [e.name for e in events] == ["all_to_all"] + ["all_to_all_single"] * 4
        assert all(e.group == tuple(range(ep)) and e.end > e.start for e in events)
        assert events[0].meta["sent_bytes"] == (ep - 1) * (E // ep) * 8
        for e, rows in zip(events[1:], (sent, received, sent, received)):
            assert e.meta["sent_bytes"] == int(rows[others].sum()) * H * 8
        assert res.contexts[p].trace.bytes_sent() == ((ep - 1) * (E // ep) * 8 + 2 * H * 8 * (
            int(sent[others].sum()) + int(received[others].sum())))


@pytest.mark.timeout(60)
def test_a_split_backward_gives_the_fused_gradients_bit_for_bit():
    cfg = config(4, 2, factor=1.5, shared=True)
    fused, split = run_ep(cfg, 2, 5), run_ep(cfg, 2, 5, store=True)
    for a, b in zip(fused, split):
        np.testing.assert_array_equal(a["dx"], b["dx"])
        assert a["grads"].keys() == b["grads"].keys()
        for name, g in a["grads"].items():
            other = b["grads"][name]
            assert (g is None and other is None) or np.array_equal(g, other)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_padding_to_capacity_sends_every_expert_its_full_capacity(ep):
    """Each rank sends C rows an expert, real or padding, so the all-to-all's splits are
    static: (E/ep)·C rows to each other rank, whatever the router chose."""
    E, k, factor = 4, 2, 1.0
    cfg = config(E, k, factor=factor, pad_to_capacity=True)
    C = int(np.ceil(k * S * B / E * factor))
    res = run_ep(cfg, ep, 2)
    for r in range(ep):
        got, ref = res[r], single(cfg, r, 2)
        assert_close(got["y"], ref["y"])
        assert_close(got["dx"], ref["dx"])
        np.testing.assert_array_equal(got["plan"].rows_per_expert, np.full(E, C))
        rows = [e.meta["sent_bytes"] for e in res.contexts[r].trace.of(stream="comm")
                if e.name == "all_to_all_single"]
        assert rows == ([(ep - 1) * (E // ep) * C * H * 8] * 4 if ep > 1 else [])


@pytest.mark.timeout(60)
def test_bad_layouts_are_refused():
    with pytest.raises(mp.RankFailedError, match=r"num_experts = 6 cannot be split over "
                       r"expert-parallel group ep\[0, 1, 2, 3\] of size 4: expected a "
                       r"positive multiple of 4"):
        run_ep(config(6), 4, 0)
    with pytest.raises(mp.RankFailedError, match=r"expected the expert-parallel group as a "
                       r"ProcessGroup .*received tuple \(0, 1\)"):
        mp.launch(lambda ctx: ExpertParallelMoE(**config(4), group=(0, 1)), 2)
    with pytest.raises(mp.RankFailedError, match="drop_policy must be one of"):
        run_ep(config(4, policy="random"), 2, 0)
    with mp.device():
        moe = ExpertParallelMoE(**config(4), group=mp.new_group([0], "ep"))
    assert repr(moe) == ("ExpertParallelMoE(moe, top 2 of 4, dropless, experts 0..3 here, "
                         "on ep[0])")
