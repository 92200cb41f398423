"""Damaged, unfinished and mixed layout-aware checkpoints, and saves onto bad paths: each is
refused with a CheckpointError naming the file and what to do, before anything is written or
allocated; whatever bytes a damaged index holds, never another exception."""

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.files import CheckpointError
from minipar.nn import GPT, GPTConfig
from minipar.parallel import ParallelDims, parallelize, zero_engine
from minipar.parallel import checkpoint as ck
from minipar.parallel.checkpoint.layout import ARCHITECTURE, MAY_CHANGE


@pytest.fixture(scope="module")
def saved(dpkit, tmp_path_factory):
    """A dp 2 x tp 2 ZeRO-1 run after one step, saved in both forms."""
    d = tmp_path_factory.mktemp("saved")
    cfg = dpkit.tiny_config(vocab_size=16, seq_len=8, hidden=16, num_heads=4, ffn_hidden=32)
    ids, tgt = dpkit.global_batches(cfg, 1, 4, 0)[0]

    def program(ctx):
        run = parallelize(cfg, ParallelDims(dp_shard=2, tp=2), zero=1, **dpkit.OPT)
        run.train_step(*run.local_batch(ids, tgt))
        ck.save_sharded(run, d / "sharded")
        ck.save_consolidated(run, d / "full")

    mp.launch(program, 4)
    return d, cfg


def copy_of(saved, tmp_path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(saved[0] / "sharded", work)
    return work


def edit_index(d: Path, edit) -> None:
    index = json.loads((d / "index.json").read_text())
    edit(index)
    (d / "index.json").write_text(json.dumps(index))


def test_rank_files_without_an_index_are_an_unfinished_save(saved, tmp_path):
    work = copy_of(saved, tmp_path)
    (work / "index.json").unlink()
    with pytest.raises(CheckpointError, match="holds rank files but no index.json: the save "
                                              "did not finish"):
        ck.read_full_state(work)


def test_a_pipeline_index_whose_stage_files_are_missing_names_the_file(saved, tmp_path):
    """Before pipelines landed a pp = 2 index was refused whole; now it is read, and the
    files of its second pipeline coordinate must exist (and a unit or an array placed at
    a pipeline coordinate the mesh does not have is damage)."""
    work = copy_of(saved, tmp_path)

    def two_stages(index):  # what a pp = 2 save of the same dp x tp would list
        index["meta"]["mesh"]["pp"] = 2
        index["files"] = index["files"] + [
            {"file": f"rank{n:05d}", "coordinate": {"pp": 1, **{k: v for k, v in
                                                               f["coordinate"].items()
                                                               if k != "pp"}}}
            for n, f in enumerate(index["files"], start=len(index["files"]))]
        index["world_size"] = len(index["files"])

    edit_index(work, two_stages)
    n = len(json.loads((work / "index.json").read_text())["files"]) // 2
    with pytest.raises(CheckpointError, match=rf"rank{n:05d}.npz does not exist"):
        ck.read_full_state(work)
    work = copy_of(saved, tmp_path / "again")
    edit_index(work, lambda index: index["meta"]["units"][0].update(pp=1))
    with pytest.raises(CheckpointError, match=r"placed at pipeline coordinates outside the "
                                              r"mesh's pp = 1"):
        ck.read_full_state(work)


def flatten(index, name):
    """Give parameter `name`'s entry in its unit a 1-D shape of the same size."""
    p = next(p for u in index["meta"]["units"] for p in u["params"] if p["name"] == name)
    p["shape"] = [int(np.prod(p["shape"]))]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("edit, match", [
    (lambda i: i["meta"].update(step="1"), "step: an int >= 0"),
    (lambda i: i["meta"].update(state_kinds=["m", "w"]), "state_kinds: some of"),
    (lambda i: i["meta"]["mesh"].update(tp=0), "mesh: sizes >= 1"),
    (lambda i: i["meta"]["mesh"].update(dp_shard=10 ** 9), "one file per coordinate"),
    (lambda i: i["meta"]["units"][0].update(numel=-1), "units: a list of"),
    (lambda i: i["meta"]["params"]["wte.weight"].update(partitioned={"tp": 5}), "params: "),
    (lambda i: i["meta"].update(config=[1]), "config: a GPTConfig"),
    (lambda i: i["arrays"].pop("meta/step"), "'meta/step' the shape"),
    (lambda i: flatten(i, "blocks.0.attn.proj.weight"),  # its tp pieces [16, 8] as [128]
     r"blocks.0.attn.proj.weight's tensor-parallel pieces have shapes \[\[128\], \[128\]\], "
     r"which do not join along dimension 1"),
])
def test_a_damaged_index_is_refused_naming_the_field(saved, tmp_path, edit, match):
    work = copy_of(saved, tmp_path)
    edit_index(work, edit)
    with pytest.raises(CheckpointError, match=match):
        ck.read_full_state(work)


def test_damaged_consolidated_metadata_is_refused_naming_the_field(saved, tmp_path):
    from minipar.files import load_arrays, save_arrays
    arrays, meta = load_arrays(saved[0] / "full")
    save_arrays(tmp_path / "full", arrays, {**meta, "params": {"wte.weight": [16, 16]}})
    with pytest.raises(CheckpointError, match=r"full.json: the checkpoint's metadata is "
                                              r"damaged; expected params:"):
        ck.read_full_state(tmp_path / "full")


@pytest.mark.timeout(60)
def test_saving_onto_a_file_or_a_directory_is_refused_on_every_rank_before_writing(dpkit,
                                                                                 tmp_path):
    cfg = dpkit.tiny_config()
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "dir.json").mkdir()

    def program(ctx):
        engine = zero_engine(GPT(cfg), stage=3, **dpkit.OPT)
        for save, path, words in [
                (ck.save_sharded, tmp_path / "file", "it is a file, and a sharded checkpoint "
                                                     "is a directory"),
                (ck.save_consolidated, tmp_path / "dir", "dir.json: it is a directory"),
                (ck.save_consolidated, tmp_path / "file" / "c", "file is a file, not a dir")]:
            with pytest.raises(CheckpointError, match=words):
                save(engine, path)
        return True

    assert mp.launch(program, 2) == [True, True]  # nobody was left waiting in a collective
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "file"]


def test_every_config_field_is_checked_on_load_or_allowed_to_change():
    """A GPTConfig field added later is either part of the architecture (checked on load)
    or named as allowed to change; dtype has its own check."""
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    assert fields == set(ARCHITECTURE) | set(MAY_CHANGE) | {"dtype"}
    assert not set(ARCHITECTURE) & set(MAY_CHANGE)


# ---- fuzz: a mutated index.json, whatever its bytes --------------------------------------
@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(32, 126)),
                       min_size=1, max_size=4))
def test_fuzz_a_mutated_layout_index_gives_a_checkpoint_error(saved, writes):
    """Printable bytes overwritten anywhere in index.json: the full state as saved, or a
    CheckpointError naming the directory or a file; never another exception, and under
    64 MiB of allocation."""
    import tracemalloc
    with tempfile.TemporaryDirectory() as d:
        work = Path(d) / "w"
        shutil.copytree(saved[0] / "sharded", work)
        raw = bytearray((work / "index.json").read_bytes())
        for at, byte in writes:
            raw[int(at * len(raw))] = byte
        (work / "index.json").write_bytes(bytes(raw))
        tracemalloc.start()
        try:
            got = ck.read_full_state(work)
        except CheckpointError as e:
            assert str(work) in str(e), str(e)
        else:
            want = ck.read_full_state(saved[0] / "sharded")
            assert got.keys() == want.keys()
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    assert peak < 64 << 20, peak
