"""Sharded and consolidated checkpoints of the data-parallel engines (parallel/checkpoint.py).

A checkpoint written by any engine, stage or dp size loads into any other bit for bit, and
training interrupted, saved, reloaded into a fresh engine (built from another seed, so
nothing survives but what the files hold) and continued ends exactly where training
straight through ends: weights, float32 masters, Adam's m and v, and the step count that
drives Adam's bias correction and the learning-rate schedule.

"Exactly" has one limit, stated where it applies: a different dp size averages the
gradients of different batch shards (means of different means), so after a *change* of dp
size the steps differ in the last bits from any run at the old dp size (tests/parallel/dp/test_state_dict.py
measures by how much). There the resumed run is compared with the same continuation from
the state handed over in memory (`load_full_state_dict`): the files lose nothing.
"""

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.files import CheckpointError, PickledCheckpointError, load_arrays, save_arrays
from minipar.data.batches import split_data_parallel
from minipar.nn import GPT
from minipar.optim import WarmupCosine
from minipar.parallel import FullyShardedDataParallel, ShardingStrategy, zero_engine
from minipar.parallel import checkpoint as dpck

# h = 10: blocks of 10 * (12 * 10 + 13) = 1330 elements, padded at dp = 3 and dp = 4
HIDDEN_PADDED = 10


def make_engine(kit, name, model):
    """An engine by name; max_grad_norm=1e3 computes the global norm but never clips, so
    every stage takes the same steps bit for bit at one dp size (tests/parallel/dp/test_equivalence.py)."""
    kw = dict(max_grad_norm=1e3, **kit.OPT)
    if name.startswith("ZeRO-") or name == "DDP":
        return zero_engine(model, stage=0 if name == "DDP" else int(name[-1]), **kw)
    return FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy[name], **kw)


LAYOUTS = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]


def run(kit, cfg, name, dp, batches, *, load_from=None, state=None, save_to=None,
        form="sharded", total_steps=4, topology=None):
    """Train `batches` on dp ranks with engine `name` and a warmup-cosine schedule, after
    loading a checkpoint (load_from) or a state in memory (state); save at the end if asked.
    Returns per rank: (state before loading, state after loading, state at the end)."""

    def program(ctx):
        model = GPT(cfg)
        engine = make_engine(kit, name, model)
        before = engine.full_state_dict()
        if load_from is not None:
            dpck.load(engine, load_from)
        if state is not None:
            engine.load_full_state_dict(state)
        loaded = engine.full_state_dict()
        schedule = WarmupCosine(engine, kit.OPT["lr"], warmup_steps=1, total_steps=total_steps)
        schedule.load_state_dict({"last_step": engine.steps})  # resumes at the restored step
        for ids, tgt in batches:
            model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, dp))
            engine.step()
            schedule.step()
            engine.zero_grad()
        if save_to is not None:
            save = dpck.save_sharded if form == "sharded" else dpck.save_consolidated
            save(engine, save_to)
        return before, loaded, engine.full_state_dict()

    return mp.launch(program, dp, topology=topology)


# ---- resharding: one checkpoint, any layout ---------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", ["sharded", "consolidated"])
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_a_zero3_dp4_checkpoint_loads_into_other_stages_and_dp_sizes(dpkit, tmp_path, dtype,
                                                                      form):
    cfg = dpkit.tiny_config(dtype=dtype, hidden=HIDDEN_PADDED, seed=1)
    batches = dpkit.global_batches(cfg, 2, 12, seed=1)
    path = tmp_path / "ckpt"
    saved = run(dpkit, cfg, "ZeRO-3", 4, batches, save_to=path, form=form)[0][2]
    if form == "sharded":  # dp = 4 pads each block's 1330 elements to 1332
        units = json.loads((path / "index.json").read_text())["meta"]["units"]
        assert [u["padding"] for u in units] == [0, 2, 2]
    fresh = cfg.with_(seed=99)
    for name, dp in [("ZeRO-1", 2), ("DDP", 1), ("SHARD_GRAD_OP", 3)]:
        for before, loaded, _ in run(dpkit, fresh, name, dp, [], load_from=path):
            assert int(before["meta/step"]) == 0
            assert not np.array_equal(before["param/wte.weight"], saved["param/wte.weight"])
            dpkit.assert_state_equal(loaded, saved)


@pytest.mark.timeout(60)
def test_padding_stays_zero_after_loading_at_another_dp_size(dpkit, tmp_path):
    """dp = 3 pads each block by 2 elements on the last rank; loading fills the parameters'
    elements and leaves the padding of weights, master, m and v at zero."""
    cfg = dpkit.tiny_config(dtype="bfloat16", hidden=HIDDEN_PADDED, seed=2)
    run(dpkit, cfg, "ZeRO-1", 2, dpkit.global_batches(cfg, 1, 12, seed=2), save_to=tmp_path)

    def program(ctx):
        fsdp = FullyShardedDataParallel(GPT(cfg.with_(seed=5)),
                                        sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                                        **dpkit.OPT)
        dpck.load(fsdp, tmp_path)
        e = fsdp.engine
        tails = []
        for i, u in enumerate(e.state.values()):
            if u.flat.padding and e.me == e.n - 1:  # the padding sits at the last shard's end
                for arr in [u.param[u.lo:u.hi], *e.optimizer.state_arrays(i).values()]:
                    tails.append(np.asarray(arr[-u.flat.padding:], dtype=np.float64))
        return [u.flat.padding for u in e.state.values()], tails

    got = mp.launch(program, 3)
    assert got[2][0] == [0, 2, 2]
    assert len(got[2][1]) == 8 and all((t == 0).all() for t in got[2][1])


# ---- interrupted, saved, reloaded, continued = straight through --------------------------
@pytest.mark.timeout(600)
@settings(max_examples=25)
@given(data=st.data())
def test_training_resumed_from_a_checkpoint_continues_exactly(dpkit, data):
    dtype = data.draw(st.sampled_from(["float64", "bfloat16"]), "dtype")
    form = data.draw(st.sampled_from(["sharded", "consolidated"]), "form")
    save_as = data.draw(st.sampled_from(LAYOUTS), "saved by")
    load_as = data.draw(st.sampled_from(LAYOUTS), "loaded by")
    dp_save = data.draw(st.integers(1, 4), "dp at save")
    dp_load = data.draw(st.sampled_from([dp_save, 1, 2, 3, 4]), "dp at load")
    k = data.draw(st.integers(1, 2), "steps before the interruption")
    hidden = data.draw(st.sampled_from([8, HIDDEN_PADDED]), "hidden")
    seed = data.draw(st.integers(0, 2**16), "seed")
    cfg = dpkit.tiny_config(dtype=dtype, hidden=hidden, num_layers=2, seed=seed)
    batches = dpkit.global_batches(cfg, 3, 12, seed=seed)
    other_seed = cfg.with_(seed=seed + 1)  # the fresh model: every weight different
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        saved = run(dpkit, cfg, save_as, dp_save, batches[:k], save_to=path, form=form)[0][2]
        resumed = run(dpkit, other_seed, load_as, dp_load, batches[k:], load_from=path)
    if dp_load == dp_save:  # straight through, never stopped, on the saving layout
        expected = run(dpkit, cfg, save_as, dp_save, batches)[0][2]
    else:  # the same continuation from the state handed over in memory (see the docstring)
        expected = run(dpkit, other_seed, load_as, dp_load, batches[k:], state=saved)[0][2]
    for before, loaded, end in resumed:
        assert int(before["meta/step"]) == 0 and int(loaded["meta/step"]) == k
        assert not np.array_equal(before["param/wte.weight"], loaded["param/wte.weight"])
        dpkit.assert_state_equal(loaded, saved)
        dpkit.assert_state_equal(end, expected)
    assert int(expected["meta/step"]) == len(batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_learning_rate_schedule_needs_the_restored_step(dpkit, tmp_path, dtype):
    """The control: a schedule restarted at step 0 after loading (lr(0) = 0 in warmup)
    does not end where training straight through ends; restarted at engine.steps it does."""
    cfg = dpkit.tiny_config(dtype=dtype, seed=4)
    batches = dpkit.global_batches(cfg, 3, 4, seed=4)
    run(dpkit, cfg, "ZeRO-3", 2, batches[:2], save_to=tmp_path)
    straight = run(dpkit, cfg, "ZeRO-3", 2, batches)[0][2]

    def program(ctx, restart_schedule_at_zero):
        model = GPT(cfg.with_(seed=9))
        engine = make_engine(dpkit, "ZeRO-2", model)
        dpck.load(engine, tmp_path)
        schedule = WarmupCosine(engine, dpkit.OPT["lr"], warmup_steps=1, total_steps=4)
        if not restart_schedule_at_zero:
            schedule.load_state_dict({"last_step": engine.steps})
        model.loss_and_grad(*split_data_parallel(*batches[2], ctx.rank, 2))
        engine.step()
        return engine.full_state_dict()

    dpkit.assert_state_equal(mp.launch(lambda c: program(c, False), 2)[0], straight)
    wrong = mp.launch(lambda c: program(c, True), 2)[0]  # the third step taken at lr = 0
    np.testing.assert_array_equal(wrong["optim/wte.weight.m"], straight["optim/wte.weight.m"])
    assert not np.array_equal(wrong["param/wte.weight"], straight["param/wte.weight"])


# ---- what is written, by whom -----------------------------------------------------------
def save_once(kit, cfg, name, dp, path, topology=None):
    """One step, then save_sharded; returns rank 0's full state and each rank's collective
    names issued during the save."""

    def program(ctx):
        model = GPT(cfg)
        engine = make_engine(kit, name, model)
        model.loss_and_grad(*split_data_parallel(*kit.global_batches(cfg, 1, 12, 0)[0],
                                                 ctx.rank, dp))
        engine.step()
        engine.zero_grad()
        sd = engine.full_state_dict()
        n = len(ctx.trace.events)
        dpck.save_sharded(engine, path)
        return sd, [e.name for e in ctx.trace.events[n:] if e.stream == "comm"]

    return mp.launch(program, dp, topology=topology)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, dp, files, shard", [
    ("ZeRO-3", 4, 4, True), ("ZeRO-1", 2, 2, True), ("DDP", 2, 1, False),
    ("NO_SHARD", 3, 1, False)])
def test_each_rank_writes_what_it_owns_without_gathering(dpkit, tmp_path, name, dp, files,
                                                         shard):
    cfg = dpkit.tiny_config(hidden=HIDDEN_PADDED)
    got = save_once(dpkit, cfg, name, dp, tmp_path)
    for _, comms in got:
        assert set(comms) <= {"broadcast", "barrier"}  # the save's id, and the end
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["world_size"] == files
    assert sorted(p.name for p in tmp_path.glob("rank*.npz")) == \
        [f"rank{r:05d}.npz" for r in range(files)]
    for unit in index["meta"]["units"]:
        spec = index["arrays"][f"{unit['name']}/param"]
        assert spec["shard_numel"] == (-(-unit["numel"] // dp) if shard else unit["numel"])
        assert spec["padding"] == unit["padding"] == files * spec["shard_numel"] - unit["numel"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_layout_in_the_index_reassembles_the_tensors_with_numpy_alone(dpkit, tmp_path,
                                                                          dtype):
    """What the module docstring promises: the index's units, offsets and shapes, and the
    rank files, give back every named tensor with no engine and no minipar model."""
    cfg = dpkit.tiny_config(dtype=dtype, hidden=HIDDEN_PADDED)
    sd = save_once(dpkit, cfg, "ZeRO-3", 3, tmp_path)[0][0]
    meta = json.loads((tmp_path / "index.json").read_text())["meta"]
    ranks = [load_arrays(tmp_path / f"rank{r:05d}")[0] for r in range(3)]
    for unit in meta["units"]:
        for kind in ["param"] + meta["state_kinds"]:
            flat = np.concatenate([a[f"{unit['name']}/{kind}"] for a in ranks])
            for p in unit["params"]:
                n = int(np.prod(p["shape"]))
                t = flat[p["offset"]:p["offset"] + n].reshape(p["shape"]).astype(np.float64)
                key = f"param/{p['name']}" if kind == "param" else f"optim/{p['name']}.{kind}"
                np.testing.assert_array_equal(t, sd[key].astype(np.float64), err_msg=key)
    dpkit.assert_state_equal(dpck.read_full_state(tmp_path), sd)


@pytest.mark.timeout(60)
def test_hybrid_shard_writes_one_replica_and_loads_anywhere(dpkit, tmp_path):
    cfg = dpkit.tiny_config(dtype="bfloat16", hidden=HIDDEN_PADDED)
    got = save_once(dpkit, cfg, "HYBRID_SHARD", 4, tmp_path,
                    topology=mp.Topology.nodes(2, gpus_per_node=2))
    assert json.loads((tmp_path / "index.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in tmp_path.glob("rank*.npz")) == ["rank00000.npz",
                                                                   "rank00001.npz"]
    for before, loaded, _ in run(dpkit, cfg.with_(seed=3), "ZeRO-2", 3, [], load_from=tmp_path):
        dpkit.assert_state_equal(loaded, got[0][0])


# ---- refusals ----------------------------------------------------------------------------
class _WouldRunCode:
    """Unpickling this creates a file: proof that a loader ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("form", ["sharded", "consolidated"])
def test_a_checkpoint_file_holding_a_pickle_is_refused_unread(dpkit, tmp_path, form):
    cfg = dpkit.tiny_config()
    path = tmp_path / "ckpt"
    run(dpkit, cfg, "ZeRO-2", 2, dpkit.global_batches(cfg, 1, 4, 0), save_to=path, form=form)
    marker = tmp_path / "code-ran"
    if form == "sharded":  # a whole file replaced by a pickle
        (path / "rank00001.npz").write_bytes(pickle.dumps(_WouldRunCode(marker)))
    else:  # an .npz member that needs a pickle (an object array)
        np.savez(tmp_path / "evil.npz", x=np.array([_WouldRunCode(marker)], dtype=object))
        shutil.move(tmp_path / "evil.npz", tmp_path / "ckpt.npz")
    with mp.device():
        engine = make_engine(dpkit, "DDP", GPT(cfg))
        with pytest.raises(PickledCheckpointError, match="never unpickle"):
            dpck.load(engine, path)
        with pytest.raises(PickledCheckpointError):
            dpck.read_full_state(path)
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_bad_checkpoints_are_refused_with_what_to_do(dpkit, tmp_path):
    cfg = dpkit.tiny_config(dtype="bfloat16")
    a, b = tmp_path / "a", tmp_path / "b"
    for path in (a, b):
        run(dpkit, cfg, "ZeRO-3", 2, dpkit.global_batches(cfg, 1, 4, 0), save_to=path)

    def load(path, config=cfg):
        with mp.device():
            dpck.load(make_engine(dpkit, "DDP", GPT(config)), path)

    with pytest.raises(CheckpointError, match=r"trained in bfloat16.*GPTConfig\(dtype='bfloat16'\)"):
        load(a, cfg.with_(dtype="float64"))
    with pytest.raises(ValueError, match=r"has shape .* in this model"):
        load(a, cfg.with_(hidden=12))
    with pytest.raises(CheckpointError, match="neither a sharded checkpoint"):
        load(tmp_path / "nothing")
    for suffix in (".npz", ".json"):  # rank 1 of another save slipped in
        shutil.copy(b / f"rank00001{suffix}", a / f"rank00001{suffix}")
    with pytest.raises(CheckpointError, match="mixes files of two saves"):
        load(a)
    save_arrays(tmp_path / "plain", {"x": np.zeros(3)}, {})
    with pytest.raises(CheckpointError, match="not a data-parallel consolidated one"):
        load(tmp_path / "plain")
    with pytest.raises(TypeError, match="expected a data-parallel engine"):
        dpck.save_sharded(object(), tmp_path / "c")


def test_paths_are_taken_as_str_or_path(dpkit, tmp_path):
    cfg = dpkit.tiny_config()
    with mp.device():
        engine = make_engine(dpkit, "ZeRO-3", GPT(cfg))
        dpck.save_consolidated(engine, str(tmp_path / "c"))
        dpck.save_sharded(engine, Path(tmp_path) / "s")
        for p in (tmp_path / "c", str(tmp_path / "c.npz"), str(tmp_path / "s")):
            dpkit.assert_state_equal(dpck.read_full_state(p), engine.full_state_dict())
