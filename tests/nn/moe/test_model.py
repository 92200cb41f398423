"""A GPT whose blocks hold mixtures of experts (GPTConfig.moe): the whole objective's
gradients (cross-entropy + the balancing losses) against finite differences, the balancing
losses averaged over accumulated micro-batches like the main loss (and the known bug that
skips it, caught), recomputation and the split backward bit for bit, the parameter
counts, the aux-loss-free bias between steps (parallelize's layouts: tests/parallel/mesh/
test_moe.py)."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.nn.gradcheck import gradcheck
from minipar.nn.moe import MoE, MoEConfig, aux_loss_of, moe_layers, update_routers
from minipar.runtime.errors import RankFailedError

MOE = MoEConfig(num_experts=4, top_k=2, moe_every=2, capacity_factor=1.0,
                aux_loss_coeff=0.1, seq_aux_loss_coeff=0.05, z_loss_coeff=0.01,
                shared_ffn_hidden=4)


def config(**kw):
    base = dict(vocab_size=11, seq_len=4, hidden=8, num_heads=2, num_layers=2, ffn_hidden=8,
                init_std=0.3, moe=MOE)
    base.update(kw)
    return GPTConfig(**base)


def batch(cfg, b=2, seed=0):
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (cfg.seq_len, b))
    return ids, np.roll(ids, -1, axis=0)


def test_blocks_follow_moe_every_and_first_dense():
    cfg = config(num_layers=5, moe=MoEConfig(num_experts=2, top_k=1, moe_every=2,
                                             first_dense=1))
    with mp.device():
        model = GPT(cfg)
    assert [isinstance(b.mlp, MoE) for b in model.blocks] == [False, True, False, True, False]
    assert sum(p.size for p in model.parameters()) == cfg.num_parameters()


def test_active_parameters_count_k_experts_of_e():
    cfg = config(num_layers=1, moe=MoEConfig(num_experts=4, top_k=1))
    dense = config(num_layers=1, moe=None)
    router = 4 * cfg.hidden
    assert cfg.num_active_parameters() == dense.num_parameters() + router
    expert = 2 * cfg.hidden * cfg.ffn + cfg.ffn + cfg.hidden
    assert cfg.num_parameters() == dense.num_parameters() + router + 3 * expert


@pytest.mark.timeout(120)
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_the_objective_gradients_match_finite_differences(score):
    cfg = config(moe=MoEConfig(**{**MOE.__dict__, "score_function": score}))
    ids, tgt = batch(cfg)
    with mp.device():
        model = GPT(cfg)
        model.loss_and_grad(ids, tgt)
    params = model.parameters()

    def f():
        with mp.device():
            loss, _ = model.forward(ids, tgt)
        return loss + aux_loss_of(model)

    gradcheck(f, {p.name: p.data for p in params},
              {p.name: p.grad if p.grad is not None else np.zeros_like(p.data) for p in params},
              rtol=1e-5, atol=1e-8)


def _accumulated(cfg, batches):
    with mp.device():
        model = GPT(cfg)
        for ids, tgt in batches:
            model.loss_and_grad(ids, tgt, loss_scale=1.0 / len(batches))
    return {p.name: p.grad for p in model.parameters() if p.grad is not None}


def _averaged(cfg, batches):
    """Each micro-batch's gradient of CE + aux at weight 1, averaged afterwards."""
    out = {}
    for ids, tgt in batches:
        with mp.device():
            model = GPT(cfg)
            model.loss_and_grad(ids, tgt)
        for p in model.parameters():
            if p.grad is not None:
                out[p.name] = out.get(p.name, 0) + p.grad / len(batches)
    return out


def test_accumulated_micro_batches_average_the_balancing_losses_too(monkeypatch):
    cfg = config()
    batches = [batch(cfg, seed=s) for s in (1, 2, 3)]
    want, got = _averaged(cfg, batches), _accumulated(cfg, batches)
    router = "blocks.0.mlp.router.weight"
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-14)
    # the known bug: the balancing losses' gradients left at weight 1 under accumulation
    monkeypatch.setattr(MoE, "takes_loss_scale", False)
    wrong = _accumulated(cfg, batches)
    assert not np.allclose(wrong[router], want[router], rtol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("recompute", ["selective", "full", "segments"])
def test_recomputation_gives_the_same_gradients_and_counts_each_choice_once(recompute):
    grads, counts = [], []
    for mode in ("none", recompute):
        cfg = config(recompute=mode, recompute_segment=2 if mode == "segments" else 1,
                     num_layers=3)
        with mp.device():
            model = GPT(cfg)
            model.loss_and_grad(*batch(cfg))
        grads.append({p.name: p.grad for p in model.parameters()})
        counts.append([layer.router.tokens_per_expert.sum() for layer in moe_layers(model)])
    for name, g in grads[0].items():
        np.testing.assert_array_equal(grads[1][name], g)
    assert counts[0] == counts[1] == [4 * 2 * 2] * 2  # s·b tokens, k = 2 each


def test_the_split_backward_gives_the_fused_gradients_bit_for_bit():
    cfg = config()
    ids, tgt = batch(cfg)
    out = []
    for split in (False, True):
        with mp.device():
            model = GPT(cfg)
            loss, cache = model.forward(ids, tgt)
            if split:
                model.backward_weight(model.backward_input(cache, 0.5))
            else:
                model.backward(cache, 0.5)
        out.append({p.name: p.grad for p in model.parameters()})
    for name, g in out[0].items():
        np.testing.assert_array_equal(out[1][name], g)


def test_routers_move_their_bias_once_a_step_and_count_again():
    cfg = config(moe=MoEConfig(num_experts=4, top_k=1, bias_update_rate=0.01))
    with mp.device():
        model = GPT(cfg)
        model.loss_and_grad(*batch(cfg, b=8))
        router = moe_layers(model)[0].router
        load = router.tokens_per_expert.copy()
        update_routers(model, cfg.moe.bias_update_rate)
    assert load.sum() == cfg.seq_len * 8
    want = 0.01 * np.sign(load.mean() - load)
    np.testing.assert_allclose(router.expert_bias, want.astype(np.float32))
    assert router.tokens_per_expert.sum() == 0


def test_a_tensor_parallel_gpt_built_by_hand_refuses_moe_without_the_mesh_factory():
    from minipar.parallel import TensorParallelGPT

    def program(ctx):
        TensorParallelGPT(config(vocab_size=12), mp.new_group([0, 1]))

    with pytest.raises(RankFailedError, match="need the mlp_factory parallelize passes"):
        mp.launch(program, 2)


def test_bad_moe_configs_are_refused():
    with pytest.raises(ValueError, match="GPTConfig.moe must be a MoEConfig"):
        config(moe={"num_experts": 4})
    with pytest.raises(ValueError, match="MoEConfig.moe_every must be a positive int"):
        MoEConfig(moe_every=0)
    with pytest.raises(ValueError, match=r"top_k must be an int in 1..num_experts = 1..4"):
        MoEConfig(num_experts=4, top_k=5)
    with pytest.raises(ValueError, match="MoEConfig.capacity_factor must be a positive"):
        MoEConfig(capacity_factor=0.0)
