"""Helpers for the data-parallel tests, handed out by the `dpkit` fixture.

    cfg = kit.tiny_config(num_layers=2)                       # h = 8, V = 16, s = 8
    batches = kit.global_batches(cfg, steps=3, global_batch=8, seed=0)
    ref = kit.reference_run(cfg, batches, max_grad_norm=0.05)  # one device, whole batch
    run = kit.parallel_run(lambda m: zero_engine(m, stage=2, **kit.OPT), cfg, batches, 4)
    kit.assert_state_close(run.state, ref.state)
    split = kit.split_backward(schedule("1f1b", 4, 8), defer=True)  # every W at the end

`reference_run` trains one GPT on the whole global batch (AdamW + clip_grad_norm_ in
float64; MixedPrecisionOptimizer(AdamW) in bfloat16) and returns its losses, gradients
(before clipping), gradient norms and final state in `full_state_dict`'s format.
`parallel_run` runs the same steps SPMD: rank r takes block r of each global batch
(split_data_parallel), cuts it into micro-batches and calls the engine's step.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, strategies as st

import minipar as mp
from minipar.data.batches import split_data_parallel, split_microbatches
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW, MixedPrecisionOptimizer, clip_grad_norm_
from minipar.parallel import accumulate_gradients, parallelize
from minipar.parallel.checkpoint.full_state import parameter_of
from minipar.runtime.collectives import all_gather
from minipar.parallel.pp import (SCHEDULES, Action, Kind, ScheduleError, schedule,
                                 validate_schedule)

OPT = dict(lr=1e-2, weight_decay=0.1)  # AdamW hyperparameters every test uses

# float64: differences come only from the order of reductions. Tolerance per array:
#   |a - b| <= RTOL * |b| + ATOL_SCALE * max|b|
# Losses and first-step gradients agree to ~1e-15 (RTOL 1e-12, GRAD_ATOL_SCALE 1e-14).
# After Adam steps, ATOL_SCALE 1e-11: Adam's update lr * g / (|g| + eps) has slope lr / eps
# = 1e6 for a gradient element near eps = 1e-8, so a 1e-18 reduction-order difference in
# such an element moves the weight by 1e-12 (measured worst case over a sweep of stages,
# dp sizes and seeds: 6.8e-13 of the array's largest value).
RTOL = 1e-12
ATOL_SCALE = 1e-11
GRAD_ATOL_SCALE = 1e-14


def tiny_config(**kw) -> GPTConfig:
    base = dict(vocab_size=16, seq_len=8, hidden=8, num_heads=2, num_layers=2)
    base.update(kw)
    return GPTConfig(**base)


def global_batches(cfg: GPTConfig, steps: int, global_batch: int, seed: int,
                   seq: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` global batches of (ids, targets), each [s, global_batch]."""
    rng = np.random.default_rng(seed)
    s = seq or cfg.seq_len
    return [(rng.integers(0, cfg.vocab_size, (s, global_batch)),
             rng.integers(0, cfg.vocab_size, (s, global_batch))) for _ in range(steps)]


@dataclass
class Reference:
    losses: list
    grads: list  # per step: {name: gradient before clipping}
    norms: list  # per step: global gradient norm (None without clipping)
    state: dict  # full_state_dict format


def reference_run(cfg: GPTConfig, batches, max_grad_norm=None, microbatches: int = 1,
                  **opt) -> Reference:
    """One device; with microbatches = m > 1, each step accumulates the m global
    micro-batches [s, B/m] in order, each loss scaled by 1/m (what a pipeline computes)."""
    opt = {**OPT, **opt}
    m = microbatches
    with mp.device():
        model = GPT(cfg)
        params = model.parameters()
        half = cfg.dtype != "float64"
        if half:
            optim = MixedPrecisionOptimizer(AdamW, params, dtype=cfg.dtype,
                                            max_grad_norm=max_grad_norm, **opt)
        else:
            optim = AdamW(params, **opt)
        losses, grads, norms = [], [], []
        for ids, tgt in batches:
            losses.append(model.loss_and_grad(ids, tgt) if m == 1 else np.mean(
                [model.loss_and_grad(x, y, loss_scale=1.0 / m)
                 for x, y in split_microbatches(ids, tgt, m)]))
            grads.append({p.name: p.grad.copy() for p in params})
            if half:
                optim.step()
                norms.append(optim.last_grad_norm)
            else:
                norms.append(clip_grad_norm_(params, max_grad_norm)
                             if max_grad_norm is not None else None)
                optim.step()
            optim.zero_grad()
        inner = optim.inner if half else optim
        state = {}
        for p in params:
            state[f"param/{p.name}"] = p.data.astype(np.float32) if half else p.data.copy()
            state[f"optim/{p.name}.m"] = inner.state[p.name]["m"].copy()
            state[f"optim/{p.name}.v"] = inner.state[p.name]["v"].copy()
            if half:
                state[f"optim/{p.name}.master"] = optim.masters[p.name].data.copy()
        state["meta/step"] = np.array(len(batches), dtype=np.int64)
    return Reference(losses, grads, norms, state)


@dataclass
class ParallelRun:
    losses: np.ndarray  # per step: mean over ranks of each rank's mean micro-batch loss
    grads: list  # per step: rank 0's full_grads() before the step
    norms: list  # per step: rank 0's last_grad_norm
    state: dict  # rank 0's full_state_dict() after the last step
    states: list  # every rank's
    result: mp.LaunchResult


def parallel_run(make_engine, cfg: GPTConfig, batches, world_size: int, *,
                 micro_batches: int = 1, no_sync: bool = True, topology=None,
                 collect_grads: bool = True) -> ParallelRun:
    def program(ctx):
        model = GPT(cfg)
        engine = make_engine(model)
        losses, grads, norms = [], [], []
        for ids, tgt in batches:
            x, y = split_data_parallel(ids, tgt, ctx.rank, world_size)
            micro = split_microbatches(x, y, micro_batches)
            losses.append(accumulate_gradients(model, engine, micro, no_sync))
            if collect_grads:
                grads.append(engine.full_grads())
            engine.step()
            norms.append(engine.last_grad_norm)
            engine.zero_grad()
        return losses, grads, norms, engine.full_state_dict()

    res = mp.launch(program, world_size, topology=topology)
    return ParallelRun(np.mean([r[0] for r in res], axis=0), res[0][1], res[0][2], res[0][3],
                       [r[3] for r in res], res)


def assert_close(actual, expected, rtol=RTOL, atol_scale=ATOL_SCALE, what=""):
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol_scale * scale,
                               err_msg=what)


def assert_state_close(actual: dict, expected: dict, **tol) -> None:
    assert sorted(actual) == sorted(expected)
    for key in expected:
        assert_close(actual[key], expected[key], what=key, **tol)


def assert_state_equal(actual: dict, expected: dict) -> None:
    """Bit for bit: same keys, dtypes, shapes and values."""
    assert sorted(actual) == sorted(expected)
    for key in expected:
        assert actual[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def assert_state_close_by_kind(actual: dict, expected: dict) -> None:
    """Same keys; weights, m and v within RTOL + ATOL_SCALE of the largest array of their
    kind (weights by name, optimizer states by m / v)."""
    assert sorted(actual) == sorted(expected)
    kind = lambda k: k.rsplit(".", 1)[1] if k.startswith("optim/") else k.split("/")[0]
    scale: dict = {}
    for k, a in expected.items():
        scale[kind(k)] = max(scale.get(kind(k), 0.0), float(np.abs(a).max()))
    for k, a in expected.items():
        np.testing.assert_allclose(actual[k], a, rtol=RTOL, atol=ATOL_SCALE * scale[kind(k)],
                                   err_msg=k)


def reference_tuple(cfg: GPTConfig, batches, microbatches: int, max_grad_norm=None,
                    **opt) -> tuple:
    """reference_run as composed_run's comparisons read it: (losses, the first step's
    gradients in float64, norms, the state without meta/step)."""
    ref = reference_run(cfg, batches, max_grad_norm, microbatches, **opt)
    state = {k: a for k, a in ref.state.items() if k != "meta/step"}
    first = {k: np.asarray(g, np.float64) for k, g in ref.grads[0].items()}
    return ref.losses, first, ref.norms, state


def gathered(d: dict, run) -> dict:
    """A dict keyed by parameter (name or full_state_dict key), tp shards all-gathered."""
    params, out = run.model.named_parameters(), {}
    for key, a in d.items():
        p = params.get(parameter_of(key) if "/" in key else key)
        if p is not None and getattr(p, "partition_count", 1) > 1:
            a = all_gather(a, axis=p.partition_dim, group=run.groups.tp)
        out[key] = a
    return out


def composed_run(cfg: GPTConfig, batches, dims, opt: dict, **kw) -> list:
    """The steps through `parallelize(cfg, dims, **kw, **opt)`: per rank (losses, the first
    step's gradients, the last gradient norm, the state after the steps, coordinate)."""
    def program(ctx):
        run = parallelize(cfg, dims, **kw, **opt)
        losses, grads = [], None
        for ids, tgt in batches:
            losses.append(run.forward_backward(ids, tgt))
            grads = grads if grads is not None else gathered(run.engine.full_grads(), run)
            run.step()
        state = gathered(run.engine.full_state_dict(), run)
        state.pop("meta/step")
        return losses, grads, run.engine.last_grad_norm, state, run.groups.coordinate

    return mp.launch(program, dims.world_size)


def split_backward(actions, defer: bool = False):
    """A schedule with the backward split: each B becomes I then W at once, or (defer) I
    in B's place and every W at the end of its rank's list, in the I's order. Both are
    valid (validate_schedule); the zero-bubble generators place W in between."""
    out = []
    for row in actions:
        head, tail = [], []
        for a in row:
            if a.kind is Kind.B:
                head.append(Action(a.stage, Kind.I, a.microbatch))
                (tail if defer else head).append(Action(a.stage, Kind.W, a.microbatch))
            else:
                head.append(a)
        out.append(head + tail)
    assert validate_schedule(out).split_backward
    return out


def v_shape(p: int, m: int, defer: bool):
    """A V-shaped split schedule written here (GPipe's order on 2p stages): stage s on rank
    s for s < p, else on rank 2p - 1 - s, so rank 0 holds the first and the last stage
    (ZBV's and DualPipeV's placement, not s mod p). Each rank runs its first leg's
    forwards, its second leg's, then the second leg's I (and W), the first leg's."""
    out = []
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        row = [Action(first, Kind.F, i) for i in range(m)]
        row += [Action(second, Kind.F, i) for i in range(m)]
        for s in (second, first):
            row += [Action(s, Kind.B, i) for i in range(m)]
        out.append(row)
    return split_backward(out, defer)


# the zero-bubble generators, once main has them (written beside this work): the split
# tests draw them too, and until then the schedules split_backward derives
ZERO_BUBBLE = tuple(n for n in ("zb_h1", "zb_h2", "zbv", "dualpipev") if n in SCHEDULES)


def draw_split_schedule(data, max_pp: int = 4):
    """A drawn schedule whose backward is split: a zero-bubble generator's, v_shape's, or
    GPipe, 1F1B or interleaved 1F1B (1 or 2 chunks) with split_backward (W at once or all
    deferred).
    Returns (actions, a description for hypothesis' events)."""
    name = data.draw(st.sampled_from(("1f1b", "gpipe", "interleaved_1f1b", "v")
                                     + ZERO_BUBBLE), "schedule")
    p = data.draw(st.integers(1, max_pp), "pp")
    if name == "v":
        m, defer = data.draw(st.integers(1, 8), "micro-batches"), data.draw(st.booleans())
        return v_shape(p, m, defer), f"v p={p} {'W at the end' if defer else 'I W at once'}"
    if name in ZERO_BUBBLE:  # their own chunks and constraints: what they refuse is skipped
        least = 2 * p if name == "dualpipev" else 1  # DualPipeV needs m >= 2p
        m = data.draw(st.integers(least, max(8, least)), "micro-batches")
        try:
            return schedule(name, p, m), f"{name} p={p} m={m}"
        except ScheduleError:
            assume(False)
    if name == "interleaved_1f1b":  # Megatron's grouping: m a multiple of p
        v = data.draw(st.integers(1, 2), "chunks")
        m = p * data.draw(st.integers(1, max(1, 8 // p)), "micro-batches / pp")
    else:
        v, m = 1, data.draw(st.integers(1, 8), "micro-batches")
    defer = data.draw(st.booleans(), "every W deferred to the end")
    return (split_backward(schedule(name, p, m, v), defer),
            f"{name} p={p} v={v} {'W at the end' if defer else 'I W at once'}")


@pytest.fixture(scope="session")
def dpkit():
    return types.SimpleNamespace(
        OPT=OPT, RTOL=RTOL, ATOL_SCALE=ATOL_SCALE, GRAD_ATOL_SCALE=GRAD_ATOL_SCALE,
        tiny_config=tiny_config,
        global_batches=global_batches, reference_run=reference_run,
        parallel_run=parallel_run, assert_close=assert_close,
        assert_state_close=assert_state_close, assert_state_equal=assert_state_equal,
        assert_state_close_by_kind=assert_state_close_by_kind, split_backward=split_backward,
        v_shape=v_shape, draw_split_schedule=draw_split_schedule,
        composed_run=composed_run, reference_tuple=reference_tuple)
