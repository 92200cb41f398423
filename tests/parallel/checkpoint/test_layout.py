"""Checkpoints that know their layout (parallel/checkpoint): a dp x tp run saves every
tensor-parallel shard once, the files read back as the single-device model's full tensors,
and any layout (dp size, ZeRO stage or FSDP strategy, tp size, sequence parallelism, one
device) loads them bit for bit and trains on exactly as the run that never stopped.

"Exactly" on another layout has the limit stated in test_dp.py and in
tests/parallel/tp/test_equivalence.py: the reductions add in another order, so losses
agree to rtol 1e-12 and weights, m and v to 1e-11 of the largest of their kind (float64).
Loading itself is bit-exact everywhere: a state loaded and saved again reads back
identical, and equals what the saving run held in memory.
"""

import json
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.files import CheckpointError, load_arrays, save_arrays
from minipar.nn import GPT
from minipar.nn.saved import release_all
from minipar.parallel import (ParallelDims, ParallelGroups, ShardingStrategy, TensorParallelGPT,
                              parallelize, zero_engine)
from minipar.parallel import checkpoint as ck
from minipar.parallel.checkpoint.full_state import parameter_of
from minipar.runtime.collectives import all_gather

HYBRID = ShardingStrategy.HYBRID_SHARD
CLIP = 0.05  # clips on every step of these runs (the norm over dp and tp matters)


def config(kit, **kw):
    """Heads, ffn, vocabulary and sequence divisible by tp = 1, 2 and 4."""
    base = dict(vocab_size=16, seq_len=8, hidden=16, num_heads=4, ffn_hidden=32)
    return kit.tiny_config(**{**base, **kw})


def gathered_state(engine, model, tp_group):
    """engine.full_state_dict() (full over dp) with the tensor-parallel shards all-gathered
    over tp: what the saving run holds, at the single-device shapes (a collective)."""
    sd = engine.full_state_dict()
    params = model.named_parameters()
    for key in list(sd):
        p = params.get(parameter_of(key))
        if p is not None and getattr(p, "partition_count", 1) > 1:
            sd[key] = all_gather(sd[key], axis=p.partition_dim, group=tp_group)
    return sd


def layout_world(layout) -> int:
    dims, _ = layout
    return 1 if dims is None else dims.world_size


def build(kit, cfg, layout, sp=False, max_grad_norm=CLIP):
    """(the object a checkpoint is saved from / loaded into, a train_step(ids, tgt)) on
    this rank. layout: (ParallelDims, zero stage or ShardingStrategy), or (None, None) for
    one device (a GPT and a DDP engine on a world of one)."""
    dims, engine = layout
    if dims is None:
        model = GPT(cfg)
        e = zero_engine(model, stage=0, max_grad_norm=max_grad_norm, **kit.OPT)

        def step(ids, tgt):
            loss = model.loss_and_grad(ids, tgt)
            e.step()
            e.zero_grad()
            return loss
        return e, step, lambda: e.full_state_dict()
    kw = {"sharding_strategy": engine} if isinstance(engine, ShardingStrategy) else {"zero": engine}
    run = parallelize(cfg, dims, sequence_parallel=sp, max_grad_norm=max_grad_norm, **kw,
                      **kit.OPT)
    return run, run.train_step, lambda: gathered_state(run.engine, run.model, run.groups.tp)


def session(kit, cfg, layout, batches, *, sp=False, load_from=None, resave_to=None,
            save_to=None, form="sharded"):
    """On every rank of `layout`: load (then save again right away, if asked), train
    `batches`, save. Returns (global losses per step, the gathered state at the end)."""

    def program(ctx):
        obj, step, state = build(kit, cfg, layout, sp)
        if load_from is not None:
            ck.load(obj, load_from)
        if resave_to is not None:
            ck.save_sharded(obj, resave_to)
        losses = [step(ids, tgt) for ids, tgt in batches]
        if save_to is not None:
            (ck.save_sharded if form == "sharded" else ck.save_consolidated)(obj, save_to)
        tp = obj.groups.tp.group_rank(ctx.rank) if hasattr(obj, "groups") else 0
        return losses, state(), tp

    res = mp.launch(program, layout_world(layout))
    losses = np.mean([r[0] for r in res if r[2] == 0], axis=0)  # one rank per dp block
    return losses, res[0][1]


def dropout_state_after(cfg, batches):
    """The dropout generator's state after training on `batches`: each forward advances it
    by the same full-batch draws on every layout (parallel/tp/random.py)."""
    with mp.device():
        model = GPT(cfg)
        for ids, tgt in batches:
            _, cache = model.forward(ids, tgt)
            release_all(cache)
        return model.dropout_generator.bit_generator.state


# ---- the regression: tp ranks used to overwrite each other's files ------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_a_dp1_tp2_save_reads_back_as_the_whole_model(dpkit, tmp_path, stage):
    """As a new user writes it: save_sharded(zero_engine(TensorParallelGPT(cfg, tp_group),
    ...)) then read_full_state. Before the layout was recorded, both tp ranks wrote
    rank00000 and the checkpoint read back as one rank's half of every split tensor."""
    cfg = config(dpkit, seed=11)
    batches = dpkit.global_batches(cfg, 2, 4, seed=11)

    def program(ctx):
        model = TensorParallelGPT(cfg, ctx.world)  # tp = the world; dp = this rank alone
        engine = zero_engine(model, stage=stage, process_group=mp.new_group([ctx.rank], "dp"),
                             **dpkit.OPT)
        for ids, tgt in batches:
            model.loss_and_grad(ids, tgt)
            engine.step()
            engine.zero_grad()
        ck.save_sharded(engine, tmp_path / "sharded")
        ck.save_consolidated(engine, tmp_path / "full")
        return gathered_state(engine, model, ctx.world)

    held = mp.launch(program, 2)[0]
    with mp.device():
        single = {p.name: p.shape for p in GPT(cfg).parameters()}
    for form in ("sharded", "full"):
        got = ck.read_full_state(tmp_path / form)
        assert {k[len("param/"):]: v.shape for k, v in got.items() if k.startswith("param/")} \
            == single
        dpkit.assert_state_equal(got, held)  # the full tensors, bit for bit
    index = json.loads((tmp_path / "sharded" / "index.json").read_text())
    assert [f["coordinate"] for f in index["files"]] == [
        {"pp": 0, "tp": 0, "dp_shard": 0}, {"pp": 0, "tp": 1, "dp_shard": 0}]
    assert index["meta"]["params"]["wte.weight"] == {"shape": [16, 16], "partitioned": {"tp": 0}}
    assert index["meta"]["params"]["blocks.0.attn.proj.weight"]["partitioned"] == {"tp": 1}
    assert index["meta"]["params"]["blocks.0.attn.proj.bias"]["partitioned"] == {}  # added once
    assert index["meta"]["params"]["ln_f.weight"]["partitioned"] == {}
    assert index["meta"]["config"]["num_heads"] == 4


# ---- resharding across dp x tp, continuing exactly ---------------------------------------
@pytest.mark.timeout(300)
def test_a_dp2_tp2_zero1_checkpoint_continues_on_every_layout(dpkit, tmp_path):
    """Saved by ZeRO-1 on dp = 2 x tp = 2 with sequence parallelism and dropout after 2 of
    4 steps; resumed on dp = 1 x tp = 4 (ZeRO-3), dp = 4 x tp = 1 (ZeRO-2) and one device:
    the last 2 losses equal the uninterrupted run's (rtol 1e-12), the loaded state is the
    saved one bit for bit, and the end state is the uninterrupted one's."""
    cfg = config(dpkit, dropout=0.1, seed=3)
    batches = dpkit.global_batches(cfg, 4, 8, seed=3)
    saver = (ParallelDims(dp_shard=2, tp=2), 1)
    straight, end = session(dpkit, cfg, saver, batches, sp=True)
    ref = dpkit.reference_run(cfg, batches, max_grad_norm=CLIP)
    assert all(n > CLIP for n in ref.norms)  # the clip is active on every step
    dpkit.assert_close(straight, ref.losses, what="the uninterrupted run is one device's")
    first, _ = session(dpkit, cfg, saver, batches[:2], sp=True, save_to=tmp_path / "ckpt")
    saved = ck.read_full_state(tmp_path / "ckpt")
    assert int(saved["meta/step"]) == 2
    index = json.loads((tmp_path / "ckpt" / "index.json").read_text())
    assert index["meta"]["dropout_generator"] == dropout_state_after(cfg, batches[:2])
    for i, (layout, sp) in enumerate([((ParallelDims(tp=4), 3), False),
                                      ((ParallelDims(tp=4), 3), True),
                                      ((ParallelDims(dp_shard=4), 2), False),
                                      ((None, None), False)]):
        again = tmp_path / f"again{i}"
        # every step draws fresh masks: the checkpoint holds the dropout generator as the
        # first 2 steps left it. What was loaded is the file's state, not the
        # initialisation: saved again right away, it reads back identical
        losses, state = session(dpkit, cfg, layout, batches[2:], sp=sp,
                                load_from=tmp_path / "ckpt", resave_to=again)
        dpkit.assert_state_equal(ck.read_full_state(again), saved)
        dpkit.assert_close(losses, straight[2:], what=f"losses resumed on {layout}")
        dpkit.assert_state_close_by_kind(state, end)


# ---- a model that is not the one saved ------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_model_with_another_architecture_is_refused_naming_the_field(dpkit, tmp_path):
    cfg = config(dpkit, num_heads=4)
    session(dpkit, cfg, (ParallelDims(tp=2), 0), [], save_to=tmp_path)

    def load(other):
        with mp.device():
            ck.load(zero_engine(GPT(other), stage=0, **dpkit.OPT), tmp_path)

    # 2 heads of 8 or 4 of 4: the same tensors, cut into heads differently
    with pytest.raises(CheckpointError, match=r"GPTConfig.num_heads = 4, but this model has "
                       r"num_heads = 2: every tensor has the same shape.*num_heads=4\)"):
        load(cfg.with_(num_heads=2))
    for field, value in [("gelu", "none"), ("layernorm_eps", 1e-6), ("tie_embeddings", True),
                         ("ffn_hidden", 48), ("num_layers", 3)]:
        with pytest.raises(CheckpointError, match=rf"GPTConfig.{field} = .* this model has "
                                                  rf"{field} = {value!r}"):
            load(cfg.with_(**{field: value}))
    with pytest.raises(CheckpointError, match=r"ffn_hidden = 32.*blocks.0.mlp.fc1.weight has "
                                              r"shape \[32, 16\] in the checkpoint and \[48, 16\]"):
        load(cfg.with_(ffn_hidden=48))
    # what may change between a save and a load: the seed, dropout, recomputation
    load(cfg.with_(seed=7, dropout=0.2, recompute="full"))


@pytest.mark.timeout(120)
def test_checkpoint_segments_round_trip_in_the_config_and_resume_anywhere(dpkit, tmp_path):
    """A ZeRO-3 dp 2 x tp 2 run with segments of 2 of 3 blocks saves its config whole
    (GPTConfig(**index config) is the run's); any recomputation loads it and trains on like
    the run that kept everything; an index of an earlier version, with recompute_every,
    still loads."""
    base = config(dpkit, num_layers=3, dropout=0.1, seed=5)
    cfg = base.with_(recompute="segments", recompute_segment=2)
    batches = dpkit.global_batches(base, steps=4, global_batch=2, seed=5)
    want, want_state = session(dpkit, base, (None, None), batches)
    layout = (ParallelDims(dp_shard=2, tp=2), 3)
    first, _ = session(dpkit, cfg, layout, batches[:2], sp=True, save_to=tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    assert type(cfg)(**index["meta"]["config"]) == cfg
    for other, where in [(base, (None, None)), (base.with_(recompute="full"), layout),
                         (cfg.with_(recompute_segment=3), (ParallelDims(dp_shard=2), 1))]:
        rest, state = session(dpkit, other, where, batches[2:], load_from=tmp_path)
        dpkit.assert_close(np.concatenate([first, rest]), want, what=f"losses {other}")
        dpkit.assert_state_close_by_kind(state, want_state)
    index["meta"]["config"]["recompute_every"] = 2
    (tmp_path / "index.json").write_text(json.dumps(index))
    session(dpkit, base, (None, None), [], load_from=tmp_path)


# ---- who writes what ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dims, engine, coordinates", [
    (ParallelDims(dp_replicate=2, tp=2), 0, [(0, 0), (1, 0)]),  # DDP: one replica per tp rank
    (ParallelDims(dp_shard=2, tp=2), 1, [(0, 0), (0, 1), (1, 0), (1, 1)]),
    (ParallelDims(dp_shard=2, dp_replicate=2), 2, [(0, 0), (0, 1)]),  # one replicate group
    (ParallelDims(dp_shard=2, dp_replicate=2, tp=2), HYBRID,
     [(0, 0), (0, 1), (1, 0), (1, 1)]),
    (ParallelDims(tp=4), 3, [(0, 0), (1, 0), (2, 0), (3, 0)]),
])
def test_each_unique_shard_is_written_once_without_gathering(dpkit, tmp_path, dims, engine,
                                                             coordinates):
    cfg = config(dpkit, hidden=20, num_heads=4, ffn_hidden=36, vocab_size=20)  # padded
    batch = dpkit.global_batches(cfg, 1, 4, seed=0)

    def program(ctx):
        run, step, _ = build(dpkit, cfg, (dims, engine))
        step(*batch[0])
        n = len(ctx.trace.events)
        ck.save_sharded(run, tmp_path)
        return [e.name for e in ctx.trace.events[n:] if e.stream == "comm"]

    for comms in mp.launch(program, dims.world_size):
        assert set(comms) <= {"broadcast", "barrier"}  # the save's id, and the ends
    index = json.loads((tmp_path / "index.json").read_text())
    assert [(f["coordinate"]["tp"], f["coordinate"]["dp_shard"]) for f in index["files"]] == \
        coordinates
    assert sorted(p.name for p in tmp_path.glob("rank*.npz")) == \
        [f"rank{n:05d}.npz" for n in range(len(coordinates))]
    # exact element counts: each unit's flat buffer once per tp rank, padding included —
    # every full tensor once, plus tp - 1 more copies of the parameters replicated over tp
    tp, shards = index["meta"]["mesh"]["tp"], index["meta"]["mesh"]["dp_shard"]
    written = sum(load_arrays(tmp_path / f["file"])[0][f"{u['name']}/param"].size
                  for f in index["files"] for u in index["meta"]["units"])
    params = index["meta"]["params"]
    full = sum(int(np.prod(p["shape"])) for p in params.values())
    replicated = sum(int(np.prod(p["shape"])) for p in params.values() if not p["partitioned"])
    padding = sum(-(-u["numel"] // shards) * shards - u["numel"] for u in index["meta"]["units"])
    with mp.device():
        assert full == GPT(cfg).num_parameters()
    assert written == full + (tp - 1) * replicated + tp * padding


# ---- any layout to any layout, bit for bit -------------------------------------------------------
LAYOUTS = [(None, None), (ParallelDims(), 0), (ParallelDims(dp_replicate=2), 0),
           (ParallelDims(dp_replicate=2, tp=2), 0), (ParallelDims(dp_replicate=4, tp=2), 0),
           (ParallelDims(dp_shard=3), 3), (ParallelDims(dp_shard=2, tp=2), 1),
           (ParallelDims(dp_shard=4, tp=2), 2), (ParallelDims(dp_shard=2, tp=4), 3),
           (ParallelDims(tp=4), 1), (ParallelDims(dp_shard=3, tp=2), ShardingStrategy.FULL_SHARD),
           (ParallelDims(dp_shard=2, dp_replicate=2, tp=2), HYBRID),
           (ParallelDims(dp_shard=2, dp_replicate=2), 1)]


@pytest.mark.timeout(600)
@settings(max_examples=25)
@given(data=st.data())
def test_any_layout_loads_any_other_bit_for_bit(dpkit, data):
    save_as = data.draw(st.sampled_from(LAYOUTS), "saved by")
    load_as = data.draw(st.sampled_from(LAYOUTS), "loaded by")
    sp_save = data.draw(st.booleans(), "sequence parallel at save")
    sp_load = data.draw(st.booleans(), "sequence parallel at load")
    form = data.draw(st.sampled_from(["sharded", "consolidated"]), "form")
    dtype = data.draw(st.sampled_from(["float64", "bfloat16"]), "dtype")
    ffn = data.draw(st.sampled_from([20, 32]), "ffn")
    seed = data.draw(st.integers(0, 2**16), "seed")
    cfg = config(dpkit, ffn_hidden=ffn, dtype=dtype, seed=seed)
    batches = dpkit.global_batches(cfg, 1, 12, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path, again = f"{tmp}/ckpt", f"{tmp}/again"
        _, held = session(dpkit, cfg, save_as, batches, sp=sp_save and save_as[0] is not None,
                          save_to=path, form=form)
        dpkit.assert_state_equal(ck.read_full_state(path), held)
        session(dpkit, cfg.with_(seed=seed + 1), load_as, [], load_from=path, resave_to=again,
                sp=sp_load and load_as[0] is not None)
        dpkit.assert_state_equal(ck.read_full_state(again), held)


# ---- damaged and mixed directories ----------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_dp_x_tp_directory_that_was_tampered_with_is_refused(dpkit, tmp_path):
    cfg = config(dpkit)
    layout = (ParallelDims(dp_replicate=2, tp=2), 0)  # DDP x tp: two files, whole units
    for name in ("a", "b"):
        session(dpkit, cfg, layout, dpkit.global_batches(cfg, 1, 4, 0), save_to=tmp_path / name)
    a, b = tmp_path / "a", tmp_path / "b"
    work = tmp_path / "work"

    def fresh():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(a, work)

    fresh()  # tp rank 1's file of another save
    for suffix in (".npz", ".json"):
        shutil.copy(b / f"rank00001{suffix}", work / f"rank00001{suffix}")
    with pytest.raises(CheckpointError, match="mixes files of two saves"):
        ck.read_full_state(work)
    fresh()  # the two files swapped
    for suffix in (".npz", ".json"):
        (work / f"rank00000{suffix}").rename(work / f"x{suffix}")
        (work / f"rank00001{suffix}").rename(work / f"rank00000{suffix}")
        (work / f"x{suffix}").rename(work / f"rank00001{suffix}")
    with pytest.raises(CheckpointError, match=r"coordinate \{'pp': 0, 'tp': 1, 'dp_shard': 0\}"
                                              r", but the index lists .*'tp': 0"):
        ck.read_full_state(work)
    fresh()  # tp rank 1's copy of a replicated LayerNorm changed
    arrays, meta = load_arrays(work / "rank00001")
    root = next(u for u in json.loads((work / "index.json").read_text())["meta"]["units"]
                if u["name"] == "root")
    at = next(p["offset"] for p in root["params"] if p["name"] == "ln_f.weight")
    arrays["root/param"][at] += 1.0
    save_arrays(work / "rank00001", arrays, meta)
    with pytest.raises(CheckpointError, match=r"param/ln_f.weight is replicated across "
                                              r"tensor-parallel ranks, but tp rank 1's copy"):
        ck.read_full_state(work)
    fresh()  # an index that lists fewer files than its mesh has coordinates
    index = json.loads((work / "index.json").read_text())
    index["files"] = index["files"][:1]
    (work / "index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="index.json is damaged"):
        ck.read_full_state(work)


@pytest.mark.timeout(60)
def test_groups_that_disagree_with_the_model_are_refused(dpkit, tmp_path):
    cfg = config(dpkit)

    def program(ctx):
        run = parallelize(cfg, ParallelDims(tp=2), **dpkit.OPT)
        ck.save_sharded(run.engine, tmp_path, groups=ParallelGroups(ParallelDims(dp_shard=2)))

    with pytest.raises(CheckpointError, match=r"the groups put this rank at tp = 0 of 1, "
                                                r"but its parameters are tensor-parallel shard"):
        mp.launch(program, 2)
