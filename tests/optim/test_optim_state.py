"""state_dict / load_state_dict: exact round trips, plain data (.npz + JSON), the ledger."""

import io
import json

import ml_dtypes
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, Adam, AdamW, DynamicLossScaler, MixedPrecisionOptimizer


def make_params(dtype=np.float64):
    rng = np.random.default_rng(7)
    return [Parameter("w", rng.standard_normal((3, 2)).astype(dtype)),
            Parameter("b", rng.standard_normal(2).astype(dtype))]


def train(opt, params, steps, seed):
    """`steps` steps on random gradients (times the loss scale, if the optimizer has one)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        scale = getattr(opt, "loss_scale", 1.0)
        for p in params:
            p.accumulate((scale * rng.standard_normal(p.shape)).astype(np.float32))
        opt.step()
        opt.zero_grad()


def to_npz_and_json(tree):
    """Split a state dict into arrays (.npz, no pickle) and the rest (JSON), and back."""
    arrays = {}

    def strip(x, path):
        if isinstance(x, np.ndarray):
            assert x.dtype != object
            arrays[path] = x
            return {"__array__": path}
        if isinstance(x, dict):
            return {k: strip(v, f"{path}/{k}") for k, v in x.items()}
        assert x is None or isinstance(x, (int, float, bool, str, list)), type(x)
        return x

    meta = json.dumps(strip(tree, ""))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as npz:
        loaded = {k: npz[k] for k in npz.files}

    def rebuild(x):
        if isinstance(x, dict):
            if set(x) == {"__array__"}:
                return loaded[x["__array__"]]
            return {k: rebuild(v) for k, v in x.items()}
        return x

    return rebuild(json.loads(meta))


def assert_trees_equal(a, b):
    assert type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float)))
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_trees_equal(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        assert_array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("factory", [
    lambda ps: AdamW(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    lambda ps: Adam(ps, lr=0.01, weight_decay=0.05),
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
], ids=["adamw", "adam", "sgd"])
def test_round_trip_is_exact_and_training_continues_identically(factory):
    with minipar.device() as ctx:
        a_params = make_params()
        a = factory(a_params)
        train(a, a_params, 3, seed=1)
        sd = a.state_dict()
        assert_trees_equal(sd, to_npz_and_json(sd))           # plain data, no pickle

        with minipar.device():                                # another device, same names
            b_params = make_params()
            for p, q in zip(b_params, a_params):
                p.set_data(q.data.copy())
            b = factory(b_params)
            b.load_state_dict(to_npz_and_json(sd))
            assert_trees_equal(b.state_dict(), sd)
            train(b, b_params, 2, seed=2)
        train(a, a_params, 2, seed=2)
        for p, q in zip(a_params, b_params):
            assert_array_equal(p.data, q.data)
        assert_trees_equal(a.state_dict(), b.state_dict())
        assert ctx.ledger.held("optimizer_states") == a.state_nbytes()


def test_state_dict_is_a_copy():
    with minipar.device():
        ps = make_params()
        opt = AdamW(ps, lr=0.1)
        train(opt, ps, 1, seed=0)
        sd = opt.state_dict()
        m = sd["state"]["w"]["m"].copy()
        train(opt, ps, 1, seed=1)
        assert_array_equal(sd["state"]["w"]["m"], m)
        assert sd["state"]["w"]["step"] == 1
        assert sd["hyperparameters"] == {"lr": 0.1, "weight_decay": 0.01,
                                         "betas": [0.9, 0.999], "eps": 1e-8}


def test_loading_recharges_the_ledger_once_and_checks_names_and_shapes():
    with minipar.device() as ctx:
        ps = make_params(np.float32)
        opt = AdamW(ps, lr=0.1)
        train(opt, ps, 2, seed=0)
        sd = opt.state_dict()
        held = ctx.ledger.held("optimizer_states")
        assert held == 8 * (6 + 2)
        opt.load_state_dict(sd)
        opt.load_state_dict(sd)
        assert ctx.ledger.held("optimizer_states") == held
        bad = opt.state_dict()
        bad["state"]["nope"] = bad["state"].pop("w")
        with pytest.raises(KeyError, match="nope"):
            opt.load_state_dict(bad)
        bad = opt.state_dict()
        bad["state"]["w"]["m"] = np.zeros((2, 3), np.float32)
        with pytest.raises(ValueError, match="shape"):
            opt.load_state_dict(bad)
        assert ctx.ledger.held("optimizer_states") == held     # a refused load changes nothing


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_round_trip(dtype):
    half = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)

    def build(params):
        scaler = DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=2) \
            if dtype == "float16" else None
        return MixedPrecisionOptimizer(AdamW, params, dtype=dtype, lr=0.01,
                                       loss_scaler=scaler)

    with minipar.device():
        a_params = make_params(half)
        a = build(a_params)
        train(a, a_params, 3, seed=3)
        sd = a.state_dict()
        assert_trees_equal(sd, to_npz_and_json(sd))
        with minipar.device() as ctx_b:
            b_params = make_params(half)
            for p in b_params:                                 # different starting values
                p.set_data(np.zeros(p.shape, dtype=half))
            b = build(b_params)
            b.load_state_dict(to_npz_and_json(sd))
            for p, q in zip(a_params, b_params):               # rounded masters written back
                assert_array_equal(p.data.view(np.uint16), q.data.view(np.uint16))
            assert_trees_equal(b.state_dict(), sd)
            assert ctx_b.ledger.held("optimizer_states") == 12 * 8
            train(b, b_params, 2, seed=4)
        train(a, a_params, 2, seed=4)
        for p, q in zip(a_params, b_params):
            assert_array_equal(p.data.view(np.uint16), q.data.view(np.uint16))
        assert_trees_equal(a.state_dict(), b.state_dict())
