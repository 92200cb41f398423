"""Pipeline stages: the layer split, what each stage holds, its hooks, its dropout draws.

- split_layers: q = L // S blocks a stage, the first L % S stages one more; a given list
  must have S counts summing to L; more stages than layers is refused by default.
- A stage holds its own parameters only (the others are given back to the ledger), and its
  units are meaningful: EMBED on the first stage, HEAD on the last, each opened and closed
  there, with the tied head's copy of wte in HEAD.
- GPT.split_root() changes the hooks' unit names and nothing else: one device still trains
  bit for bit as before.
- dropout_draws counts the values GPT's forward draws, in every recomputation mode.
"""

import copy

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, ROOT, GPTConfig
from minipar.nn.hooks import EMBED, EVENTS, HEAD
from minipar.parallel.pp import (PipelineRunner, PipelineStage, ScheduleError, build_stages,
                                 dropout_draws, placement, schedule, split_layers)

CFG = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=4, seed=1)


def batch(cfg, b=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)),
            rng.integers(0, cfg.vocab_size, (cfg.seq_len, b)))


@pytest.mark.parametrize("L, S, want", [(4, 4, [1, 1, 1, 1]), (10, 4, [3, 3, 2, 2]),
                                        (5, 2, [3, 2]), (3, 1, [3])])
def test_the_default_split_puts_the_remainder_on_the_first_stages(L, S, want):
    bounds = split_layers(L, S)
    assert [hi - lo for lo, hi in bounds] == want
    assert bounds[0][0] == 0 and bounds[-1][1] == L
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, in order


def test_a_split_that_cannot_hold_the_model_is_refused():
    with pytest.raises(ScheduleError, match="5 stages need at least 5 layers .* the model "
                                            "has 4: use at most 4 stages"):
        split_layers(4, 5)
    with pytest.raises(ScheduleError, match=r"layers \[2, 1\] sum to 3, but the model has 4"):
        split_layers(4, 2, [2, 1])
    with pytest.raises(ScheduleError, match="the block count of each of the 3 stages"):
        split_layers(4, 3, [2, 2])
    with pytest.raises(ScheduleError, match="integers >= 0"):
        split_layers(4, 2, [5, -1])
    with pytest.raises(ScheduleError, match="integers >= 0"):
        split_layers(4, 2, [2.0, 2])
    assert split_layers(2, 3, [0, 2, 0]) == [(0, 0), (0, 2), (2, 2)]  # given: empty is allowed


def record_hooks(model):
    seen = []
    for event in EVENTS:
        model.hooks.register(event, lambda unit, e=event: seen.append((e, unit)))
    return seen


def test_split_root_renames_the_units_and_changes_nothing_else():
    ids, tgt = batch(CFG)
    runs = []
    for split in (False, True):
        with mp.device():
            model = GPT(CFG.with_(tie_embeddings=True, dropout=0.1))
            if split:
                model.split_root()
            seen = record_hooks(model)
            loss = model.loss_and_grad(ids, tgt)
            runs.append((loss, {p.name: p.grad for p in model.parameters()}, seen,
                         [(u, [p.name for p in ps]) for u, ps in model.units()]))
    (loss0, grads0, seen0, units0), (loss1, grads1, seen1, units1) = runs
    assert loss0 == loss1 and all(np.array_equal(grads0[k], grads1[k]) for k in grads0)
    blocks = [f"blocks.{i}" for i in range(4)]
    assert seen1 == ([("forward_pre", EMBED), ("forward_post", EMBED)]
                     + [(e, b) for b in blocks for e in ("forward_pre", "forward_post")]
                     + [("forward_pre", HEAD), ("forward_post", HEAD),
                        ("backward_pre", HEAD), ("backward_post", HEAD)]
                     + [(e, b) for b in reversed(blocks) for e in ("backward_pre",
                                                                   "backward_post")]
                     + [("backward_pre", EMBED), ("backward_post", EMBED)])
    assert [(e, ROOT if u in (EMBED, HEAD) else u) for e, u in seen1 if
            (e, u) not in {("forward_post", EMBED), ("forward_pre", HEAD),
                           ("backward_post", HEAD), ("backward_pre", EMBED)}] == seen0
    assert units0[0] == (ROOT, ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"])
    assert units1[0] == (EMBED, ["wte.weight", "wpe.weight"])  # tied: wte listed once,
    assert units1[-1] == (HEAD, ["ln_f.weight", "ln_f.bias"])  # in EMBED
    assert units1[1:-1] == units0[1:]


@pytest.mark.parametrize("tied", [False, True])
def test_each_rank_holds_its_stages_parameters_and_fires_its_own_units(tied):
    cfg = CFG.with_(tie_embeddings=tied)
    actions = schedule("1f1b", 3, 2)  # blocks 0-1 | 2 | 3

    def program(ctx):
        model = GPT(cfg)
        stages = build_stages(model, placement(actions), ctx.rank)
        seen = record_hooks(model)
        runner = PipelineRunner(stages, actions)
        runner.step(*batch(cfg, 2))
        units = [u for st in stages for u, _ in st.units()]
        params = [p.name for p in runner.parameters()]
        held = ctx.ledger.held("parameters")
        return units, params, held, sum(p.data.nbytes for p in runner.parameters()), seen

    res = mp.launch(program, 3)
    head = ["ln_f.weight", "ln_f.bias"] + (["wte.weight"] if tied else ["lm_head.weight"])
    assert [r[0] for r in res] == [[EMBED, "blocks.0", "blocks.1"], ["blocks.2"],
                                   ["blocks.3", HEAD]]
    assert res[0][1][:2] == ["wte.weight", "wpe.weight"] and res[2][1][-3:] == head
    assert all(name.startswith("blocks.2.") for name in res[1][1])
    for units, params, held, nbytes, seen in res:
        assert held == nbytes  # the other stages' parameters are given back
        for unit in units:  # every unit opens and closes on its own rank, once per micro-batch
            for event in EVENTS[:4]:
                assert seen.count((event, unit)) == 2, (unit, event)
        assert {u for _, u in seen} == set(units)


def test_one_stage_is_the_whole_model_with_its_root_unit():
    with mp.device():
        model = GPT(CFG)
        (stage,) = build_stages(model, {0: 0}, 0)
        assert not model.root_is_split and stage.units() == model.units()
        ids, tgt = batch(CFG)
        loss = stage.forward(0, ids, tgt)
        assert stage.in_flight == [0]
        assert stage.backward(0, loss_scale=1.0) is None and stage.in_flight == []
        with pytest.raises(ScheduleError, match="whose forward it has not run"):
            stage.backward(0)
        stage.forward(1, ids, tgt)
        with pytest.raises(ScheduleError, match="forward of micro-batch 1 twice"):
            stage.forward(1, ids, tgt)
    with mp.device():
        model = GPT(CFG)
        last = PipelineStage(model, 1, 2, 2, 4)
        with pytest.raises(ScheduleError, match="computes the loss: give the micro-batch's "
                                                "targets"):
            last.forward(0, np.zeros((4, 2, 8)))
        with pytest.raises(ScheduleError, match="blocks 3..4 are not a range"):
            PipelineStage(model, 0, 2, 3, 5)


class CountingDraws:
    """A generator that counts the values drawn from it (and from its deep copies)."""

    def __init__(self, seed: int, counter=None):
        self.g, self.counter = np.random.default_rng(seed), counter or [0]

    def random(self, shape):
        self.counter[0] += int(np.prod(shape))
        return self.g.random(shape)

    def __deepcopy__(self, memo):  # a replay draws from a copy, which moves no generator
        return CountingDraws.__new__(CountingDraws)._set(copy.deepcopy(self.g), [0])

    def _set(self, g, counter):
        self.g, self.counter = g, counter
        return self


@pytest.mark.parametrize("recompute", ["none", "selective", "full", "segments"])
def test_dropout_draws_counts_what_the_forward_draws(recompute):
    """E + L·D per micro-batch, however the blocks recompute (replays draw from copies)."""
    cfg = CFG.with_(dropout=0.1, seq_len=5, num_heads=4, recompute=recompute,
                    **({"recompute_segment": 3} if recompute == "segments" else {}))
    for s, b in ((5, 2), (3, 1)):
        ids, tgt = batch(cfg, b)
        with mp.device():
            rng = CountingDraws(0)
            GPT(cfg).loss_and_grad(ids[:s], tgt[:s], rng=rng)
        E, D = dropout_draws(cfg, s, b)
        assert (E, D) == (s * b * 8, 2 * s * b * 8 + b * 4 * s * s)
        assert rng.counter[0] == E + cfg.num_layers * D
    assert dropout_draws(CFG, 5, 2) == (0, 0)  # no dropout, no draws


def test_a_stage_runs_its_backward_split_and_refuses_w_before_i():
    """backward_input then backward_weight is backward, bit for bit, on a middle stage; the
    micro-batch stays in flight until its W; W without I, or twice, is refused."""
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=3, seed=2)
    x = np.random.default_rng(0).standard_normal((4, 2, 8))
    dy = np.random.default_rng(1).standard_normal((4, 2, 8))
    got = []
    for split in (False, True):
        with mp.device() as ctx:
            stage = PipelineStage(GPT(cfg), 1, 3, 1, 2)  # block 1 of 3 stages
            stage.forward(0, x, rng=np.random.default_rng(3))
            if split:
                dx = stage.backward_input(0, dy)
                assert stage.in_flight == [0] and ctx.ledger.held("activations") > 0
                stage.backward_weight(0)
                with pytest.raises(ScheduleError, match="W of micro-batch 0, whose I"):
                    stage.backward_weight(0)
            else:
                dx = stage.backward(0, dy)
            assert stage.in_flight == [] and ctx.ledger.held("activations") == 0
            got.append((dx, [p.grad.copy() for p in stage.parameters()]))
    np.testing.assert_array_equal(got[1][0], got[0][0])
    for a, b in zip(got[1][1], got[0][1]):
        np.testing.assert_array_equal(a, b)
