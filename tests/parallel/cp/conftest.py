"""Helpers for the context-parallel tests, handed out by the `cpkit` fixture.

    qkv, dctx = kit.inputs(s, b, heads, d, seed)          # one device's [s, b, 3h], [s, b, h]
    ctx, dqkv = kit.one_device(qkv, dctx, heads)           # nn's core, forward and backward
    run = kit.run_cp(ring_attention_forward, ring_attention_backward, qkv, dctx, heads,
                     cp, "zigzag")                         # each rank its layout.shard
    run.context, run.dqkv                                  # unsharded: [s, b, h], [s, b, 3h]
    run.result.contexts[r].trace                           # rank r's events
    kit.assert_close(run.context, ctx)                     # rtol 1e-12 + 1e-12 * max|ref|
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import pytest

import minipar as mp
from minipar.nn.attention import core_attention_backward, core_attention_forward
from minipar.parallel.cp import shard, unshard

RTOL = 1e-12  # float64: the ring adds the blocks in another order than the one softmax


def inputs(s, b, heads, d, seed, dtype=np.float64):
    g = np.random.default_rng(seed)
    qkv = g.standard_normal((s, b, 3 * heads * d))  # qkv: [s, b, 3h]
    dctx = g.standard_normal((s, b, heads * d))  # dctx: [s, b, h]
    return qkv.astype(dtype), dctx.astype(dtype)


def one_device(qkv, dctx, heads, p=0.0, rng=None):
    """nn's core on one device: (context [s, b, h], dqkv [s, b, 3h])."""
    with mp.device():
        ctx, saved = core_attention_forward(qkv, heads, p, rng)
        return ctx, core_attention_backward(dctx, saved)


@dataclass
class CPRun:
    context: np.ndarray  # [s, b, h], every rank's shard glued in sequence order
    dqkv: np.ndarray  # [s, b, 3h]
    marks: list  # per rank: the number of trace events before its backward
    result: mp.LaunchResult


def run_cp(forward, backward, qkv, dctx, heads, cp, layout, topology=None, sends="rendezvous",
           forward_kw=None, before=None):
    """forward and backward on cp ranks (group = ranks 0..cp-1), each on its shard."""
    def program(ctx):
        group = mp.new_group(range(cp), "cp")
        if before is not None:
            before(ctx)
        out, saved = forward(shard(qkv, layout, ctx.rank, cp), heads, group, layout,
                             **(forward_kw(ctx) if forward_kw else {}))
        mark = len(ctx.trace.events)
        dqkv = backward(shard(dctx, layout, ctx.rank, cp), saved)
        assert ctx.ledger.held("activations") == 0  # backward gave the saved tensors back
        return out, dqkv, mark

    res = mp.launch(program, cp, topology=topology, sends=sends)
    return CPRun(unshard([r[0] for r in res], layout), unshard([r[1] for r in res], layout),
                 [r[2] for r in res], res)


def assert_close(actual, expected, rtol=RTOL, what=""):
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                               atol=rtol * float(np.abs(expected).max()), err_msg=what)


def rel_err(actual, expected) -> float:
    """||actual − expected|| / ||expected|| (Frobenius), in float64."""
    expected = np.asarray(expected, dtype=np.float64)
    diff = np.asarray(actual, dtype=np.float64) - expected
    return float(np.linalg.norm(diff) / np.linalg.norm(expected))


@pytest.fixture(scope="session")
def cpkit():
    return types.SimpleNamespace(inputs=inputs, one_device=one_device, run_cp=run_cp,
                                 assert_close=assert_close, rel_err=rel_err, RTOL=RTOL)
