"""TensorParallelGPT is GPT's skeleton with parallel parts: its steps compose to its forward
and backward bit for bit (hooks, sequence-parallel flushes and all), and it lists its
shards in GPT's parameter order."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, ROOT, GPTConfig, block_unit
from minipar.nn.hooks import EVENTS
from minipar.parallel.tp.gpt import TensorParallelGPT

CFG = dict(vocab_size=16, seq_len=8, hidden=16, num_heads=4, ffn_hidden=24)


@pytest.mark.parametrize("tp, sp, k, tied, recompute", [
    (2, False, 1, False, "none"), (2, True, 1, True, "selective"), (4, True, 2, False, "full"),
    (4, False, 3, True, "none"), (2, True, 0, False, "none"), (1, False, 2, True, "full")])
def test_tensor_parallel_steps_compose_to_forward_and_backward(gpt_steps, tp, sp, k, tied,
                                                               recompute):
    """Blocks 0..k then k..3 equal the whole forward on every rank, dropout on."""
    layers = 3
    cfg = GPTConfig(**CFG, num_layers=layers, tie_embeddings=tied, dropout=0.2,
                    recompute=recompute, seed=k)
    seed = 5
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (cfg.seq_len, 2))
    tgt = np.roll(ids, -1, axis=0)

    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(tp), "tp"), sequence_parallel=sp)
        runs = []
        for steps in (False, True):
            seen = []
            for event in EVENTS:
                model.hooks.register(event, lambda unit, e=event: seen.append((e, unit)))
            rng = np.random.default_rng(seed)  # a plain generator: the steps wrap it
            loss = (gpt_steps(model, ids, tgt, rng, k) if steps
                    else model.loss_and_grad(ids, tgt, rng))
            runs.append((loss, {p.name: p.grad.copy() for p in model.parameters()}, seen))
            model.zero_grad()
            model.hooks.clear()
        assert ctx.ledger.held("activations") == 0
        return runs

    for (loss, grads, seen), (s_loss, s_grads, s_seen) in mp.launch(program, tp):
        assert s_loss == loss
        assert list(s_grads) == list(grads)
        for name, g in grads.items():
            np.testing.assert_array_equal(s_grads[name], g, err_msg=name)
        assert s_seen == seen
        assert seen[0] == ("forward_pre", ROOT) and seen[-1] == ("backward_post", ROOT)
        assert len(seen) == 4 * (layers + 1)


def test_tensor_parallel_gpt_lists_its_shards_in_gpts_order():
    cfg = GPTConfig(**CFG, num_layers=2)
    with mp.device():
        one = GPT(cfg)
        want = [p.name for p in one.parameters()]
        want_units = [(u, [p.name for p in ps]) for u, ps in one.units()]

    def program(ctx):
        model = TensorParallelGPT(cfg, mp.new_group(range(2), "tp"), sequence_parallel=True)
        return ([p.name for p in model.parameters()],
                [(u, [p.name for p in ps]) for u, ps in model.units()],
                [blk.name for blk in model.blocks])

    for names, units, blocks in mp.launch(program, 2):
        assert names == want
        assert units == want_units
        assert blocks == [block_unit(0), block_unit(1)]
