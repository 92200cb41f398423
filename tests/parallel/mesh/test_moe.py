"""A mixture of experts through parallelize: dp x ep (DDP), with tp on the dense layers and
pp across blocks, trains like one device that routes each rank's token group on its own.

The reference. Capacity, drops and the balancing losses are functions of the tokens one
forward routes, so "one device" here is one GPT that runs each (data-parallel rank,
micro-batch) token group as its own forward, each loss weighted 1/(dp·m), and takes one
AdamW step (clipped) on the sum, then moves the routers' biases by the step's counts: the
objective every layout optimises. An expert that no token chose in a step has a zero
gradient, not none: a data-parallel engine's gradient buffer is zero there (as Megatron's
is), so AdamW still decays its weights, where torch's AdamW would skip a .grad of None. Compared after 3 steps: losses, gradient norms, weights
(float64, the data-parallel tests' tolerances).

The known bugs, planted, must fail: an expert's gradient averaged over its replicas
without the 1/ep, the balancing losses left at weight 1 under gradient accumulation, and
the routers' counts not summed over data-parallel ranks (the replicas' biases then drift).

The global-batch aux loss (MoEConfig.global_aux_loss) has its own reference, one device
routing each micro-batch whole (every rank's block of it in one forward), dropless since a
capacity is per forward; the same layout with the counts left local ("the aux loss not
reduced across dp") must miss it.
"""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minipar as mp
from minipar.data.batches import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.nn.moe import MoE, MoEConfig, update_routers
from minipar.optim import AdamW, clip_grad_norm_
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel.mesh import experts as mesh_experts

STEPS, CLIP, LR = 3, 0.5, 1e-2
# float64; per array |a - b| <= RTOL |b| + ATOL_SCALE max|b|. The key bias's gradient is
# zero up to rounding (softmax ignores a shift of all the scores), and Adam turns rounding
# noise of 1e-17 there into steps of lr · g / eps ~ 1e-11: measured up to 3e-11 of the
# array's largest value at dp x ep, 1.2e-10 with tp (the token groups' sums, and tp's,
# run in another order than one device's); everything else agrees to ~1e-15
RTOL, ATOL_SCALE = 1e-12, 1e-9


def config(**moe):
    base = dict(num_experts=4, top_k=2, capacity_factor=1.0, aux_loss_coeff=0.05,
                seq_aux_loss_coeff=0.02, z_loss_coeff=0.01, bias_update_rate=0.01,
                shared_ffn_hidden=4)
    base.update(moe)
    return GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=2,
                     ffn_hidden=8, init_std=0.3, moe=MoEConfig(**base))


def batches(cfg, global_batch, seed=0, steps=STEPS):
    g = np.random.default_rng(seed)
    return [(g.integers(0, cfg.vocab_size, (cfg.seq_len, global_batch)),
             g.integers(0, cfg.vocab_size, (cfg.seq_len, global_batch)))
            for _ in range(steps)]


def token_groups(ids, tgt, dp, m, pipeline):
    """The (ids, targets) each forward of the layout routes: rank d's block cut into m
    micro-batches, or under a pipeline block d of each of the m global micro-batches."""
    if pipeline:
        return [split_data_parallel(x, y, d, dp)
                for x, y in split_microbatches(ids, tgt, m) for d in range(dp)]
    return [mb for d in range(dp)
            for mb in split_microbatches(*split_data_parallel(ids, tgt, d, dp), m)]


def reference(cfg, data, dp, m, pipeline):
    with mp.device():
        model = GPT(cfg)
        params = model.parameters()
        opt = AdamW(params, lr=LR)
        losses, norms = [], []
        for ids, tgt in data:
            groups = token_groups(ids, tgt, dp, m, pipeline)
            losses.append(np.mean([model.loss_and_grad(x, y, loss_scale=1.0 / len(groups))
                                   for x, y in groups]))
            for p in params:  # an expert no token chose: a zero gradient, as DDP's bucket
                if p.grad is None:
                    p.accumulate(np.zeros_like(p.data))
            norms.append(clip_grad_norm_(params, CLIP))
            opt.step()
            opt.zero_grad()
            update_routers(model, cfg.moe.bias_update_rate)
        biases = {b.name: b.mlp.router.expert_bias.copy() for b in model.blocks
                  if isinstance(b.mlp, MoE)}
        return losses, norms, {p.name: p.data.copy() for p in params}, biases


def parallel(cfg, dims, data, m, **kw):
    def program(ctx):
        pipe = dict(schedule="1f1b", microbatches=m) if dims.pp > 1 else {}
        run = parallelize(cfg, dims, lr=LR, max_grad_norm=CLIP, placement="any", **pipe, **kw)
        losses, norms = [], []
        for ids, tgt in data:
            losses.append(run.train_step(ids, tgt) if dims.pp > 1
                          else run.train_step(ids, tgt, micro_batches=m))
            norms.append(run.engine.last_grad_norm)
        owned = {p.name for _, ps in run.engine.units for p in ps}
        full = run.model.full_parameters()  # gathered over tp
        biases = {b.name: b.mlp.router.expert_bias.copy() for b in run.model.blocks
                  if isinstance(getattr(b, "mlp", None), MoE)}  # this rank's blocks
        return losses, norms, {n: full[n] for n in owned}, biases, run.groups.dp_rank

    return mp.launch(program, dims.world_size)


def close(actual, expected, what):
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL_SCALE * scale,
                               err_msg=what)


LAYOUTS = [  # (dims, micro-batches, why)
    (ParallelDims(dp_replicate=2, ep=2), 2, "ep = dp: each expert on one rank"),
    (ParallelDims(dp_replicate=4, ep=2), 1, "expert replicas: averaged over edp, times 1/ep"),
    (ParallelDims(dp_replicate=2), 2, "ep = 1: every rank holds every expert"),
    (ParallelDims(dp_replicate=2, ep=2, tp=2), 1, "tp on the dense layers"),
    (ParallelDims(dp_replicate=2, ep=2, pp=2), 2, "pp across blocks"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dims, m, why", LAYOUTS, ids=[w for _, _, w in LAYOUTS])
def test_a_moe_layout_trains_like_one_device_routing_each_token_group(dims, m, why):
    cfg = config()
    data = batches(cfg, global_batch=2 * dims.dp * m)
    want_losses, want_norms, want, want_biases = reference(cfg, data, dims.dp, m, dims.pp > 1)
    res = parallel(cfg, dims, data, m)
    close(np.mean([r[0] for r in res], axis=0), want_losses, "losses")  # over dp blocks
    close(res[0][1], want_norms, "gradient norms")
    seen = set()
    for losses, norms, params, biases, _ in res:
        for name, value in params.items():
            close(value, want[name], name)
            seen.add(name)
        for block, b in biases.items():
            np.testing.assert_array_equal(b, want_biases[block])
    assert seen == set(want)  # every parameter is held by some rank
    assert any(np.abs(b).max() > 0 for b in want_biases.values())  # the biases did move


@pytest.mark.timeout(300)
@settings(max_examples=10)
@given(ep=st.sampled_from([1, 2, 4]), replicas=st.sampled_from([1, 2]),
       E=st.sampled_from([4, 8]), k=st.integers(1, 2), factor=st.sampled_from([None, 1.0]),
       score=st.sampled_from(["softmax", "sigmoid"]), shared=st.sampled_from([0, 4]),
       pad=st.booleans(), m=st.integers(1, 2), seed=st.integers(0, 20))
def test_any_dp_x_ep_layout_trains_like_one_device(ep, replicas, E, k, factor, score, shared,
                                                    pad, m, seed):
    """Dropless or with capacity (padded or not), any routing: one step, dp = ep x
    replicas (<= 8)."""
    cfg = config(num_experts=E, top_k=k, capacity_factor=factor, score_function=score,
                 shared_ffn_hidden=shared, pad_to_capacity=pad and factor is not None)
    dims = ParallelDims(dp_replicate=ep * replicas, ep=ep)
    data = batches(cfg, global_batch=dims.dp * m, seed=seed, steps=1)
    want_losses, _, want, _ = reference(cfg, data, dims.dp, m, False)
    res = parallel(cfg, dims, data, m)
    close(np.mean([r[0] for r in res], axis=0), want_losses, "losses")
    seen = set()
    for r in res:
        for name, value in r[2].items():
            close(value, want[name], name)  # assert_allclose, per array
            seen.add(name)
    assert seen == set(want)  # every parameter is held by some rank and compared


def test_the_known_bugs_fail(monkeypatch):
    cfg = config()
    dims, m = ParallelDims(dp_replicate=4, ep=2), 2
    data = batches(cfg, global_batch=2 * dims.dp * m)
    _, _, want, want_biases = reference(cfg, data, dims.dp, m, False)
    expert = "blocks.0.mlp.experts.0.fc1.weight"
    router = "blocks.0.mlp.router.weight"

    def params_of(res):
        return {n: v for r in res for n, v in r[2].items()}

    with monkeypatch.context() as mpatch:  # averaged over edp, the 1/ep forgotten
        mpatch.setattr(mesh_experts.ExpertDataParallel, "__init__", _without_scale)
        got = params_of(parallel(cfg, dims, data, m))
        assert not np.allclose(got[expert], want[expert], rtol=1e-6)
    with monkeypatch.context() as mpatch:  # balancing losses not averaged over micro-batches
        mpatch.setattr(MoE, "takes_loss_scale", False)
        got = params_of(parallel(cfg, dims, data, m))
        assert not np.allclose(got[router], want[router], rtol=1e-6)
    with monkeypatch.context() as mpatch:  # counts not summed over dp: biases drift apart
        mpatch.setattr(mesh_experts, "all_reduce", lambda x, op, group: x)
        res = parallel(cfg, dims, data, m)
        block = "blocks.0"
        assert any(not np.array_equal(r[3][block], res[0][3][block]) for r in res)
        assert not all(np.array_equal(r[3][block], want_biases[block]) for r in res)


_init = mesh_experts.ExpertDataParallel.__init__


def _without_scale(self, group, expert_group, scale, is_expert):
    _init(self, group, expert_group, 1.0, is_expert)


@pytest.mark.parametrize("kw, match", [
    (dict(zero=1), "trains with DDP \\(zero=0\\) only"),
    (dict(sequence_parallel=True), "use sequence_parallel=False"),
])
def test_what_is_not_composed_yet_is_refused(kw, match):
    cfg = config()
    dims = ParallelDims(dp_shard=2, tp=2) if "sequence_parallel" in kw else ParallelDims(
        dp_shard=2)

    def program(ctx):
        parallelize(cfg, dims, lr=LR, placement="any", **kw)

    with pytest.raises(Exception, match=match):
        mp.launch(program, dims.world_size)


def test_experts_must_split_evenly_over_ep():
    cfg = config(num_experts=6)

    def program(ctx):
        parallelize(cfg, ParallelDims(dp_replicate=4, ep=4), lr=LR)

    with pytest.raises(Exception, match="num_experts = 6 cannot be split over ep = 4"):
        mp.launch(program, 4)


GLOBAL_LAYOUTS = [  # (dims, micro-batches)
    (ParallelDims(dp_replicate=2, ep=2), 2),
    (ParallelDims(dp_replicate=4, ep=2), 1),
    (ParallelDims(dp_replicate=2, ep=2, tp=2), 1),
    (ParallelDims(dp_replicate=2, ep=2, pp=2), 2),
]


def global_reference(cfg, data, dp, m, pipeline):
    """One device routing each micro-batch whole: the union over the dp ranks of their
    blocks of micro-batch j, one forward, weight 1/m (dropless: capacity is per forward)."""
    whole = []
    for ids, tgt in data:
        groups = token_groups(ids, tgt, dp, m, pipeline)
        order = (lambda j, d: j * dp + d) if pipeline else (lambda j, d: d * m + j)
        for j in range(m):
            parts = [groups[order(j, d)] for d in range(dp)]
            whole.append((np.concatenate([x for x, _ in parts], axis=1),
                          np.concatenate([y for _, y in parts], axis=1)))
    steps = [whole[i * m:(i + 1) * m] for i in range(len(data))]
    with mp.device():
        model = GPT(cfg)
        params = model.parameters()
        opt = AdamW(params, lr=LR)
        losses = []
        for micro in steps:
            losses.append(np.mean([model.loss_and_grad(x, y, loss_scale=1.0 / m)
                                   for x, y in micro]))
            for p in params:
                if p.grad is None:
                    p.accumulate(np.zeros_like(p.data))
            clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad()
            update_routers(model, cfg.moe.bias_update_rate)
        return losses, {p.name: p.data.copy() for p in params}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dims, m", GLOBAL_LAYOUTS, ids=[str(d) for d, _ in GLOBAL_LAYOUTS])
def test_the_global_batch_aux_loss_trains_like_one_device_routing_the_whole_micro_batch(
        dims, m):
    """MoEConfig(global_aux_loss=True): the aux loss's counts summed over dp, so the
    gradients are those of one device that routes every rank's block of micro-batch j in
    one forward. Without the sum (the counts left local: "aux loss not reduced across
    dp"), the router's weights leave that objective."""
    cfg = config(capacity_factor=None, global_aux_loss=True, aux_loss_coeff=0.5)
    data = batches(cfg, global_batch=2 * dims.dp * m)
    want_losses, want = global_reference(cfg, data, dims.dp, m, dims.pp > 1)
    res = parallel(cfg, dims, data, m)
    close(np.mean([r[0] for r in res], axis=0), want_losses, "losses")
    seen = set()
    for r in res:
        for name, value in r[2].items():
            close(value, want[name], name)
            seen.add(name)
    assert seen == set(want)
    plain = replace(cfg, moe=replace(cfg.moe, global_aux_loss=False))
    local = {n: v for r in parallel(plain, dims, data, m) for n, v in r[2].items()}
    router = "blocks.0.mlp.router.weight"
    assert not np.allclose(local[router], want[router], rtol=1e-6)
