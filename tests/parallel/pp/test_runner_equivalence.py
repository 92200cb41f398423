"""A pipeline is one device: every schedule, on 1 to 4 ranks, trains like one GPT.

Each example draws a schedule (GPipe, 1F1B, interleaved 1F1B with 1 or 2 chunks), pp in
1..4, m in 1..8 micro-batches, the layers split evenly (the remainder on the first stages)
or by a drawn list (empty stages included), tied or untied embeddings, dropout on or off,
a recomputation mode and a seed; runs 3 AdamW steps both ways and compares the losses, the
first step's gradients and, after the last step, every weight and Adam's m and v, on every
rank that holds them (a tied wte on the first and on the last stage's rank).

The reference is the single-device GPT accumulating the same m micro-batches in order, each
loss scaled by 1/m (what gradient accumulation does): with dropout on, its masks are drawn
in that order from its one generator, and the pipeline's stages draw the same ones at their
places in that stream (stage.py). With dropout off it is also the whole-batch run that
every other form is proven against (the last test).

Tolerances: those of tests/parallel/tp/test_equivalence.py (float64, see conftest.py):
losses rtol 1e-12; gradients rtol 1e-12 + 1e-14 of the largest gradient; weights, m and v
rtol 1e-12 + 1e-11 of the largest of their kind. Only the tied wte's gradient is summed in
another order (each rank's micro-batches, then the two ranks) than one device's.
"""

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import minipar as mp
from minipar.data.batches import split_microbatches
from minipar.nn import GPT
from minipar.optim import AdamW
from minipar.parallel.pp import (PipelineRunner, build_stages, placement, schedule,
                                 split_layers, validate_schedule)


def reference(cfg, batches, m, opt):
    """One device, m micro-batches accumulated in order: losses, first grads, final state."""
    with mp.device():
        model = GPT(cfg)
        params = model.parameters()
        optim = AdamW(params, **opt)
        losses, grads = [], None
        for ids, tgt in batches:
            losses.append(np.mean([model.loss_and_grad(x, y, loss_scale=1.0 / m)
                                   for x, y in split_microbatches(ids, tgt, m)]))
            if grads is None:
                grads = {p.name: p.grad.copy() for p in params}
            optim.step()
            optim.zero_grad()
        return losses, grads, state_of(params, optim)


def state_of(params, optim) -> dict:
    out = {}
    for p in params:
        out[f"param/{p.name}"] = p.data.copy()
        out[f"optim/{p.name}.m"] = optim.state[p.name]["m"].copy()
        out[f"optim/{p.name}.v"] = optim.state[p.name]["v"].copy()
    return out


def pipeline(cfg, batches, actions, opt, layers=None, topology=None):
    """The same steps on len(actions) pipeline ranks: per rank (losses, grads, state)."""
    where = placement(actions)

    def program(ctx):
        model = GPT(cfg)
        runner = PipelineRunner(build_stages(model, where, ctx.rank, layers), actions)
        params = runner.parameters()  # none on a rank of empty stages only
        optim = AdamW(params, **opt) if params else None
        losses, grads = [], None
        for ids, tgt in batches:
            losses.append(runner.step(ids, tgt))
            if grads is None:
                grads = {p.name: p.grad.copy() for p in params}
            if optim is not None:
                optim.step()
            runner.zero_grad()
        return losses, grads, state_of(params, optim) if optim else {}

    return mp.launch(program, len(actions), topology=topology)


def check(kit, ref, res):
    ref_losses, ref_grads, ref_state = ref
    last = [r for r in res if r[0][0] is not None]
    assert len(last) == 1  # one rank holds the last stage and reports the loss
    kit.assert_close(last[0][0], ref_losses, what="losses")
    assert all(r[0] == [None] * len(ref_losses) for r in res if r is not last[0])
    held = set()
    scale = max(float(np.abs(g).max()) for g in ref_grads.values())
    kind = {key: key.rsplit(".", 1)[1] if key.startswith("optim/") else "param"
            for key in ref_state}
    largest: dict = {}  # param, m, v -> the largest magnitude of that kind in the model
    for key, arr in ref_state.items():
        largest[kind[key]] = max(largest.get(kind[key], 0.0), float(np.abs(arr).max()))
    for r, (_, grads, state) in enumerate(res):
        for name, g in grads.items():
            np.testing.assert_allclose(g, ref_grads[name], rtol=kit.RTOL,
                                       atol=kit.GRAD_ATOL_SCALE * scale,
                                       err_msg=f"rank {r} step 0 gradient of {name}")
            held.add(name)
        for key, arr in state.items():
            np.testing.assert_allclose(arr, ref_state[key], rtol=kit.RTOL,
                                       atol=kit.ATOL_SCALE * largest[kind[key]],
                                       err_msg=f"rank {r} {key}")
    assert held == set(ref_grads)  # every parameter lives on some rank


@pytest.mark.timeout(120)
@settings(max_examples=15)
@given(data=st.data())
def test_every_schedule_trains_like_one_device(dpkit, data):
    name = data.draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]), "schedule")
    p = data.draw(st.integers(1, 4), "pp")
    if name == "interleaved_1f1b":  # Megatron's grouping: m a multiple of p
        v = data.draw(st.integers(1, 2), "chunks")
        m = p * data.draw(st.integers(1, max(1, 8 // p)), "micro-batches / pp")
    else:
        v, m = 1, data.draw(st.integers(1, 8), "micro-batches")
    S = p * v
    given_split = data.draw(st.booleans(), "layers given as a list")
    if given_split:  # any counts summing to L, empty stages too
        layers = data.draw(st.lists(st.integers(0, 2), min_size=S, max_size=S)
                           .filter(lambda c: sum(c) > 0), "layers")
        L = sum(layers)
    else:
        layers, L = None, S + data.draw(st.integers(0, S), "layers beyond one per stage")
    event(f"{name} p={p} v={v} {'given' if given_split else 'even' if L % S == 0 else 'uneven'}")
    cfg = dpkit.tiny_config(
        num_layers=L, seq_len=4, tie_embeddings=data.draw(st.booleans(), "tied"),
        dropout=data.draw(st.sampled_from([0.0, 0.1]), "dropout"),
        recompute=data.draw(st.sampled_from(["none", "selective", "full"]), "recompute"),
        seed=data.draw(st.integers(0, 2**16), "seed"))
    b = data.draw(st.integers(1, 2), "sequences per micro-batch")
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m * b, seed=cfg.seed)
    actions = schedule(name, p, m, v)
    ref = reference(cfg, batches, m, dpkit.OPT)
    check(dpkit, ref, pipeline(cfg, batches, actions, dpkit.OPT, layers))


@pytest.mark.timeout(120)
@settings(max_examples=12)
@given(data=st.data())
def test_split_backward_schedules_train_like_one_device(dpkit, data):
    """The backward split into I and W (zero-bubble's actions) by the runner: the
    zero-bubble generators' schedules (once on main), and each drawn schedule with every
    B replaced by I then W at once, or by I with every W deferred to the end of its
    rank's list (the W of all m micro-batches pending at once); pp 1..4, m 1..8, 1 or 2
    chunks, even, uneven and given splits, tied or not, dropout, recomputation: one
    device's losses, gradients, weights and moments. Stages are placed as the schedule
    places them (placement(actions)), V-shapes included."""
    actions, what = dpkit.draw_split_schedule(data)
    info = validate_schedule(actions)
    S, m = info.stages, info.microbatches
    if data.draw(st.booleans(), "layers given as a list"):
        layers = data.draw(st.lists(st.integers(0, 2), min_size=S, max_size=S)
                           .filter(lambda c: sum(c) > 0), "layers")
        L = sum(layers)
    else:
        layers, L = None, S + data.draw(st.integers(0, S), "layers beyond one per stage")
    event(what)
    cfg = dpkit.tiny_config(
        num_layers=L, seq_len=4, tie_embeddings=data.draw(st.booleans(), "tied"),
        dropout=data.draw(st.sampled_from([0.0, 0.1]), "dropout"),
        recompute=data.draw(st.sampled_from(["none", "selective", "full"]), "recompute"),
        seed=data.draw(st.integers(0, 2**16), "seed"))
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m, seed=cfg.seed)
    check(dpkit, reference(cfg, batches, m, dpkit.OPT),
          pipeline(cfg, batches, actions, dpkit.OPT, layers))


ZERO_BUBBLE_CASES = [("zb_h1", 4, 6, None), ("zb_h2", 3, 5, [2, 0, 1]),
                     ("zbv", 3, 6, None), ("dualpipev", 2, 4, [1, 0, 2, 1]),
                     ("dualpipev", 4, 10, None)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, m, layers", ZERO_BUBBLE_CASES)
def test_the_zero_bubble_schedules_train_like_one_device(dpkit, name, p, m, layers):
    """ZB-H1, ZB-H2, ZBV and DualPipeV (its overlapped pairs run forward then backward)
    as the generators write them, V placements read from the schedule, uneven or given
    splits (an empty stage too), tied embeddings, dropout and selective recomputation."""
    actions = schedule(name, p, m)
    S = validate_schedule(actions).stages
    cfg = dpkit.tiny_config(num_layers=sum(layers) if layers else S + 1, seq_len=4,
                            tie_embeddings=True, dropout=0.1, recompute="selective", seed=p)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m, seed=cfg.seed)
    check(dpkit, reference(cfg, batches, m, dpkit.OPT),
          pipeline(cfg, batches, actions, dpkit.OPT, layers))


SWEEP = [(name, p, v) for p in (1, 2, 3, 4) for name, v in
         (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 1), ("interleaved_1f1b", 2))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, v", SWEEP)
def test_every_schedule_and_size_with_the_remainder_on_the_first_stages(dpkit, name, p, v):
    """The sweep the drawn examples may miss: each schedule on 1..4 ranks, L = S + 1 layers
    (uneven whenever S > 1), m from 1 to 8, tied and untied, dropout on."""
    S = p * v
    m = p * (1 + (p + v) % 2) if name == "interleaved_1f1b" else 1 + (3 * p + len(name)) % 8
    cfg = dpkit.tiny_config(num_layers=S + 1, seq_len=4, tie_embeddings=(p + v) % 2 == 1,
                            dropout=0.1, seed=p + 10 * v)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=m, seed=cfg.seed)
    check(dpkit, reference(cfg, batches, m, dpkit.OPT),
          pipeline(cfg, batches, schedule(name, p, m, v), dpkit.OPT))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, p, m, v, layers", [
    ("1f1b", 4, 8, 1, [2, 0, 1, 3]),          # uneven, an empty stage, tied
    ("interleaved_1f1b", 2, 4, 2, None),       # 5 layers on 4 stages: 2, 1, 1, 1
    ("gpipe", 3, 2, 1, None)])
def test_dropout_masks_are_one_devices_in_any_order(dpkit, name, p, m, v, layers):
    """Dropout 0.2 on every mask, checkpoint segments on: the pipeline draws, for every
    (micro-batch, layer), the single device's masks, however its schedule orders them, and
    leaves each rank's generator where one device's stands after the steps."""
    cfg = dpkit.tiny_config(num_layers=sum(layers) if layers else 5, seq_len=4, dropout=0.2,
                            tie_embeddings=layers is not None, recompute="segments",
                            recompute_segment=2, seed=7)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=2 * m, seed=7)
    actions = schedule(name, p, m, v)
    check(dpkit, reference(cfg, batches, m, dpkit.OPT),
          pipeline(cfg, batches, actions, dpkit.OPT, layers))

    def generator_state(ctx):
        model = GPT(cfg)
        runner = PipelineRunner(build_stages(model, placement(actions), ctx.rank, layers),
                                actions)
        for ids, tgt in batches:
            runner.step(ids, tgt)
            runner.zero_grad()
        return model.dropout_generator.bit_generator.state

    with mp.device():
        model = GPT(cfg)
        for ids, tgt in batches:
            for x, y in split_microbatches(ids, tgt, m):
                model.loss_and_grad(x, y, loss_scale=1.0 / m)
        want = model.dropout_generator.bit_generator.state
    assert all(state == want for state in mp.launch(generator_state, p))


def test_without_dropout_it_is_the_whole_batch_run_every_form_is_proven_against(dpkit):
    cfg = dpkit.tiny_config(num_layers=3, tie_embeddings=True, seed=5)
    batches = dpkit.global_batches(cfg, steps=3, global_batch=6, seed=5)
    ref = dpkit.reference_run(cfg, batches)  # one device, the whole batch at once
    res = pipeline(cfg, batches, schedule("1f1b", 3, 3), dpkit.OPT)
    state = {k: v for r in res for k, v in r[2].items()}
    dpkit.assert_close(res[-1][0], ref.losses, what="losses")
    assert set(state) == set(ref.state) - {"meta/step"}
    for key, arr in state.items():
        dpkit.assert_close(arr, ref.state[key], what=key)


def test_split_layers_places_the_remainder_on_the_first_stages():
    assert split_layers(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert split_layers(7, 3) == [(0, 3), (3, 5), (5, 7)]      # 7 = 2·3 + 1: stage 0 has 3
    assert split_layers(6, 3, [0, 4, 2]) == [(0, 0), (0, 4), (4, 6)]
