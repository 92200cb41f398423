"""ZeRO's memory formulas, to the byte, on the ledger (Rajbhandari et al. 2020, section 5).

bf16 weights and gradients, float32 master, m and v (2 + 2 + 12 = 16 bytes a parameter),
Psi parameters, N = dp. Model-state bytes per rank (parameters + gradients +
optimizer_states), measured right after the optimizer step, when stage 3 has resharded
everything and no communication buffer is alive:

    DDP      16 Psi                 (2 + 2 + 12)            no padding: an all-reduce needs none
    ZeRO-1   4 Psi' + 12 Psi'/N     (2 + 2 + 12/N)
    ZeRO-2   2 Psi' + 14 Psi'/N     (2 + 2/N + 12/N)
    ZeRO-3   16 Psi'/N              (2/N + 2/N + 12/N)

Psi' = sum over units of ceil(Psi_u / N) * N: each unit's flat buffer is padded to a multiple
of N (flat.py), and the padding is held wherever the buffer or its shards are.

The tiny GPT (V = 16, s = 8, h = 8, 2 layers, untied head): root 16*8 + 8*8 + 2*8 + 16*8 =
336, each block 12h^2 + 13h = 872, Psi = 2080. N = 2 and 4 divide every unit (Psi' = Psi);
N = 3 does not divide 872: each block is padded by 1, Psi' = 336 + 2 * 873 = 2082.
"""

import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import DistributedDataParallel, zero_engine

PSI, PSI_ROOT, PSI_BLOCK = 2080, 336, 872


def padded(n):
    up = lambda x: -(-x // n) * n  # noqa: E731
    return up(PSI_ROOT) + 2 * up(PSI_BLOCK)


def expected(stage, n):
    """(parameters, gradients, optimizer_states) bytes per rank."""
    p = padded(n)
    return {0: (2 * PSI, 2 * PSI, 12 * PSI),
            1: (2 * p, 2 * p, 12 * p // n),
            2: (2 * p, 2 * p // n, 12 * p // n),
            3: (2 * p // n, 2 * p // n, 12 * p // n)}[stage]


def engine_arrays_nbytes(engine) -> int:
    """What the engine actually holds (weights, gradients, optimizer states), from the arrays."""
    opt = sum(a.nbytes for i in range(len(engine.optimizer.pieces))
              for a in engine.optimizer.state_arrays(i).values())
    if isinstance(engine, DistributedDataParallel):
        return (sum(p.data.nbytes for _, ps in engine.units for p in ps)
                + sum(b.buffer.nbytes for b in engine.buckets) + opt)
    held = 0
    for u in engine.state.values():
        for a in (u.param, u.param_shard, u.grad, u.grad_shard):
            held += 0 if a is None else a.nbytes
    return held + opt


def one_step(kit, stage, n, **kw):
    cfg = kit.tiny_config(dtype="bfloat16")
    (ids, tgt), = kit.global_batches(cfg, steps=1, global_batch=2 * n, seed=0)

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, max_grad_norm=1.0, **kit.OPT, **kw)
        ctx.ledger.reset_peak()  # forget the whole model every rank built before sharding
        x, y = split_data_parallel(ids, tgt, ctx.rank, n)
        model.loss_and_grad(x, y)
        engine.step()  # measured here: after the step, everything resharded
        led = ctx.ledger
        return ({c: led.held(c) for c in mp.CATEGORIES}, engine_arrays_nbytes(engine),
                led.peak("parameters"))

    return mp.launch(program, n)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_state_bytes_follow_the_zero_formulas(dpkit, stage, n):
    params, grads, optim = expected(stage, n)
    total = {0: 16 * PSI, 1: 4 * padded(n) + 12 * padded(n) // n,
             2: 2 * padded(n) + 14 * padded(n) // n, 3: 16 * padded(n) // n}[stage]
    assert params + grads + optim == total
    for held, from_arrays, _ in one_step(dpkit, stage, n):  # every rank alike
        assert (held["parameters"], held["gradients"], held["optimizer_states"]) == \
            (params, grads, optim)
        assert held["comm_buffers"] == 0 and held["activations"] == 0
        assert from_arrays == total  # the ledger agrees with the arrays actually held


def test_the_numbers_by_hand():
    """Psi = 2080 with N = 4 (no padding), and the padded N = 3 case."""
    assert expected(0, 4) == (4160, 4160, 24960)  # 16 Psi = 33280
    assert sum(expected(1, 4)) == 4 * 2080 + 12 * 2080 // 4 == 14560
    assert sum(expected(2, 4)) == 2 * 2080 + 14 * 2080 // 4 == 11440
    assert sum(expected(3, 4)) == 16 * 2080 // 4 == 8320
    assert padded(3) == 2082  # each block 872 -> 873: one element of padding per block
    assert sum(expected(3, 3)) == 16 * 2082 // 3 == 11104  # vs 16 * 2080 / 3 = 11093.3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reshard_after_forward, live_blocks", [(True, 1), (False, 2)])
def test_stage3_peak_holds_the_root_and_the_live_gathered_blocks(dpkit, reshard_after_forward,
                                                                   live_blocks):
    """During the step the gathered buffers come on top of the shards: the root stays whole
    from forward to backward; with reshard_after_forward one block at a time is whole
    (a prefetched one is still in flight, on comm_buffers, until it is waited on), without
    it every block stays whole from its forward to its backward."""
    n = 4
    shards = 2 * padded(n) // n
    for _, _, peak in one_step(dpkit, 3, n, reshard_after_forward=reshard_after_forward):
        assert peak == shards + 2 * PSI_ROOT + live_blocks * 2 * PSI_BLOCK


@pytest.mark.timeout(60)
def test_float64_model_states_count_8_8_16(dpkit):
    """Without mixed precision there are no masters: 8 (weights) + 8 (grads) + 16 (m, v)."""
    cfg = dpkit.tiny_config()

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=3, **dpkit.OPT)
        model.loss_and_grad(*dpkit.global_batches(cfg, 1, 1, 0)[0])
        engine.step()
        return [ctx.ledger.held(c) for c in ("parameters", "gradients", "optimizer_states")]

    for held in mp.launch(program, 4):
        assert held == [8 * PSI // 4, 8 * PSI // 4, 16 * PSI // 4]
