"""ZeRO-3 with checkpoint segments: a segment's rerun gathers its blocks at recompute_pre,
so its k blocks are whole together from then until each one's backward_post; the
all-gathers are the same in number and bytes as with full recomputation."""

import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import Zero3Engine


def whole_blocks(engine):
    return sorted(n for n, u in engine.state.items()
                  if n != "root" and u.flat.params[0].data.size > 0)


def zero3_step(kit, cfg, **engine_kw):
    """One step on 2 ranks: (event, unit, whole blocks) at every hook, the all-gathers'
    (count, sent bytes), the ledger's parameters peak, and one whole block's bytes."""
    (ids, tgt), = kit.global_batches(cfg, 1, 2, seed=0)

    def program(ctx):
        model = GPT(cfg)
        engine = Zero3Engine(model, **kit.OPT, **engine_kw)
        seen = []
        for event in ("backward_pre", "recompute_pre", "recompute_post", "backward_post"):
            model.hooks.register(event, lambda unit, e=event: seen.append(
                (e, unit, whole_blocks(engine))))
        ctx.ledger.reset_peak()
        n0 = len(ctx.trace.events)
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, 2))
        engine.step()
        gathers = [e for e in ctx.trace.events[n0:] if e.name == "all_gather"]
        u = engine.state["blocks.0"]
        block = u.flat.padded_numel * u.param_shard.itemsize  # one block, gathered
        return (seen, (len(gathers), sum(e.meta["sent_bytes"] for e in gathers)),
                ctx.ledger.peak("parameters"), block)

    return mp.launch(program, 2)[0]


@pytest.mark.timeout(60)
def test_a_segments_blocks_are_whole_together_from_its_rerun_to_their_backwards(dpkit):
    cfg = dpkit.tiny_config(num_layers=3, recompute="segments", recompute_segment=2)
    seen = zero3_step(dpkit, cfg, backward_prefetch=False)[0]
    b = [f"blocks.{i}" for i in range(3)]
    # only the 'pre' events of the backward of segment 0..1 (blocks.2 is a segment alone)
    seg = [(e, u, w) for e, u, w in seen if u in b[:2] and e.endswith("pre")]
    assert seg == [("backward_pre", b[1], [b[1]]),        # the gradient reaches block 1
                   ("recompute_pre", b[0], [b[0], b[1]]),  # rerun 0: gathered with 1
                   ("recompute_pre", b[1], [b[0], b[1]]),
                   ("backward_pre", b[0], [b[0]])]         # block 1 resharded after its backward


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_segments_move_the_backward_gathers_add_none_and_hold_k_blocks(dpkit, k):
    """The same all-gathers (count and bytes) as full recomputation; the gathered weights'
    peak grows by k - 1 blocks: a segment's k blocks whole at once, where full
    recomputation holds one (and one in flight, counted as a communication buffer)."""
    base = dpkit.tiny_config(num_layers=4, dropout=0.1)
    _, full, full_peak, block = zero3_step(dpkit, base.with_(recompute="full"))
    _, seg, seg_peak, _ = zero3_step(dpkit, base.with_(recompute="segments",
                                                       recompute_segment=k))
    assert seg == full
    assert seg_peak - full_peak == (k - 1) * block
