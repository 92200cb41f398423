"""full_state_dict / load_full_state_dict: one format for every engine, stage and dp size.

A checkpoint written by any engine loads into any other, bit for bit, and training goes on
as if it had never stopped.
"""

import ml_dtypes
import numpy as np
import pytest

import minipar as mp
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.parallel import zero_engine


def train(kit, cfg, batches, stage, n, start=None):
    """Run `batches` on n ranks with `stage`, after loading `start` if given; return rank 0's
    state right after loading and at the end."""

    def program(ctx):
        model = GPT(cfg)
        engine = zero_engine(model, stage=stage, max_grad_norm=0.05, **kit.OPT)
        if start is not None:
            engine.load_full_state_dict(start)
        loaded = engine.full_state_dict()
        for ids, tgt in batches:
            model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, n))
            engine.step()
            engine.zero_grad()
        return loaded, engine.full_state_dict()

    return mp.launch(program, n)[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_keys_dtypes_and_step(dpkit, dtype):
    cfg = dpkit.tiny_config(dtype=dtype)
    _, sd = train(dpkit, cfg, dpkit.global_batches(cfg, 2, 4, seed=0), stage=3, n=2)
    with mp.device():
        params = GPT(cfg).parameters()
    kinds = ["m", "v"] + (["master"] if dtype == "bfloat16" else [])
    expected = {"meta/step"} | {f"param/{p.name}" for p in params} | {
        f"optim/{p.name}.{k}" for p in params for k in kinds}
    assert set(sd) == expected
    assert sd["meta/step"].shape == () and sd["meta/step"].dtype == np.int64
    assert int(sd["meta/step"]) == 2
    for p in params:
        assert sd[f"param/{p.name}"].shape == p.shape
        # float arrays only (bf16 weights are written as float32, exactly)
        want = np.float32 if dtype == "bfloat16" else np.float64
        assert sd[f"param/{p.name}"].dtype == want and sd[f"optim/{p.name}.m"].dtype == want
    if dtype == "bfloat16":  # the weights are the rounding of their masters
        for p in params:
            np.testing.assert_array_equal(
                sd[f"param/{p.name}"],
                sd[f"optim/{p.name}.master"].astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype, saver, loader", [
    ("float64", (0, 2), (3, 4)),
    ("float64", (3, 4), (1, 3)),
    ("float64", (2, 3), (0, 1)),
    ("float64", (1, 2), (2, 4)),
    ("bfloat16", (3, 4), (2, 2)),
    ("bfloat16", (0, 1), (3, 3)),
])
def test_a_checkpoint_moves_between_stages_and_dp_sizes(dpkit, dtype, saver, loader):
    cfg = dpkit.tiny_config(dtype=dtype, seed=7)
    batches = dpkit.global_batches(cfg, 3, 12, seed=7)
    _, sd = train(dpkit, cfg, batches[:2], *saver)
    loaded, after = train(dpkit, cfg, batches[2:], *loader, start=sd)
    dpkit.assert_state_equal(loaded, sd)  # loading is bit-exact, whatever the layout
    _, straight = train(dpkit, cfg, batches, *saver)  # never stopped
    if dtype == "float64":
        dpkit.assert_state_close(after, straight)
        dpkit.assert_state_close(after, dpkit.reference_run(cfg, batches, 0.05).state)
    else:  # bf16: the third step's reductions differ between dp sizes (a few bf16 ulps),
        # within tests/parallel/dp/test_equivalence.py's stated bound for weights: |dw| <= 2 lr
        for k in straight:
            if k.startswith("param/") or k.endswith(".master"):
                np.testing.assert_allclose(after[k], straight[k], atol=2 * dpkit.OPT["lr"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [0, 3])
def test_resuming_on_the_same_layout_is_bit_exact(dpkit, stage):
    cfg = dpkit.tiny_config(seed=8)
    batches = dpkit.global_batches(cfg, 3, 4, seed=8)
    _, sd = train(dpkit, cfg, batches[:2], stage, 2)
    _, resumed = train(dpkit, cfg, batches[2:], stage, 2, start=sd)
    _, straight = train(dpkit, cfg, batches, stage, 2)
    dpkit.assert_state_equal(resumed, straight)


@pytest.mark.timeout(60)
def test_bad_checkpoints_are_refused_clearly(dpkit):
    cfg64 = dpkit.tiny_config()
    _, sd = train(dpkit, cfg64, dpkit.global_batches(cfg64, 1, 2, seed=0), 1, 2)

    def load(cfg, state):
        def program(ctx):
            zero_engine(GPT(cfg), stage=2, **dpkit.OPT).load_full_state_dict(state)
        return mp.launch(program, 2)

    missing = {k: v for k, v in sd.items() if k != "optim/wte.weight.v"}
    with pytest.raises(mp.RankFailedError, match=r"missing keys \['optim/wte.weight.v'\]"):
        load(cfg64, missing)
    wrong = dict(sd, **{"param/wte.weight": np.zeros((3, 3))})
    with pytest.raises(mp.RankFailedError, match=r"param/wte.weight has shape \(3, 3\)"):
        load(cfg64, wrong)
    with pytest.raises(mp.RankFailedError, match="a float64 checkpoint has no masters"):
        load(dpkit.tiny_config(dtype="bfloat16"), sd)
