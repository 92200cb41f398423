"""Checkpoints: NumPy arrays in .npz plus JSON, read with allow_pickle=False, never unpickled."""

import json
import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import minipar as mp
from minipar.files import (CheckpointError, PickledCheckpointError, consolidate,
                                load_arrays, load_sharded, save_arrays, save_consolidated,
                                save_sharded)

bf16 = ml_dtypes.bfloat16


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- round trips -------------------------------------------------------------------------
def test_round_trip_of_every_supported_kind(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "w64": rng.standard_normal((3, 4)),
        "w32": rng.standard_normal((2, 5)).astype(np.float32),
        "bf16": np.array([1.0, -2.5, np.inf, np.nan, 3.140625, 0.0], dtype=bf16),
        "ids": np.arange(-3, 9, dtype=np.int64).reshape(3, 4),
        "scalar": np.array(2.5),
        "step": np.int64(7),                           # a NumPy scalar becomes 0-d
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3), np.float32),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "strided": np.arange(20.0)[::3],
        "f8": np.array([0.5, -448.0], dtype=ml_dtypes.float8_e4m3fn),
        "c": np.array([1 + 2j]),
    }
    meta = {"step": 7, "lr": np.float64(0.5), "note": "after warmup", "nested": {"a": [1, 2]}}
    npz, js = save_arrays(tmp_path / "ck", arrays, meta)
    assert (npz.name, js.name) == ("ck.npz", "ck.json")
    got, got_meta = load_arrays(tmp_path / "ck")
    assert list(got) == list(arrays)
    for name, a in arrays.items():
        assert same(got[name], np.asarray(a)), name
    assert got["bf16"].dtype == bf16 and got["scalar"].shape == ()
    assert got_meta == {"step": 7, "lr": 0.5, "note": "after warmup", "nested": {"a": [1, 2]}}


def test_bf16_is_stored_as_bit_patterns_with_the_true_dtype_in_json(tmp_path):
    x = np.array([[1.0, -0.0078125], [65280.0, -3.0]], dtype=bf16)
    save_arrays(tmp_path / "b", {"x": x}, {})
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["arrays"]["x"] == {"shape": [2, 2], "dtype": "bfloat16", "stored_as": "uint16"}
    with np.load(tmp_path / "b.npz", allow_pickle=False) as raw:  # plain NumPy reads it too
        assert raw["x"].dtype == np.uint16
        assert raw["x"].tolist() == [[0x3F80, 0xBC00], [0x477F, 0xC040]]
    got, _ = load_arrays(tmp_path / "b")
    assert same(got["x"], x)


def test_big_endian_input_is_stored_in_native_order(tmp_path):
    x = np.arange(4, dtype=">f4")
    save_arrays(tmp_path / "e", {"x": x}, {})
    got, _ = load_arrays(tmp_path / "e")
    assert got["x"].dtype == np.float32 and got["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_suffix_on_the_path_is_optional(tmp_path):
    save_arrays(tmp_path / "s.npz", {"x": np.ones(2)}, {"k": 1})
    assert sorted(os.listdir(tmp_path)) == ["s.json", "s.npz"]
    assert load_arrays(tmp_path / "s.json")[1] == {"k": 1}


def test_compressed_when_asked(tmp_path):
    x = np.zeros(10_000)
    save_arrays(tmp_path / "plain", {"x": x}, {})
    save_arrays(tmp_path / "small", {"x": x}, {}, compress=True)
    assert (tmp_path / "small.npz").stat().st_size < (tmp_path / "plain.npz").stat().st_size
    with zipfile.ZipFile(tmp_path / "plain.npz") as zf:
        assert zf.getinfo("x.npy").compress_type == zipfile.ZIP_STORED
    assert same(load_arrays(tmp_path / "small")[0]["x"], x)


def test_any_name_works_even_np_savez_keywords(tmp_path):
    arrays = {"file": np.ones(1), "allow_pickle": np.zeros(1), "layers.0/attn.w": np.ones(2)}
    save_arrays(tmp_path / "n", arrays, {})
    assert list(load_arrays(tmp_path / "n")[0]) == list(arrays)


# ---- what is refused when saving ---------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    (np.array([{"a": 1}], dtype=object), "dtype object.*without a pickle"),
    (np.array(["a", "b"]), "dtype <U1"),
    ([1.0, 2.0], "is a list, expected a NumPy array"),
])
def test_save_refuses_what_needs_a_pickle_and_writes_nothing(tmp_path, bad, match):
    with pytest.raises(CheckpointError, match=match):
        save_arrays(tmp_path / "x", {"ok": np.ones(2), "bad": bad}, {})
    assert os.listdir(tmp_path) == []


def test_save_refuses_meta_that_is_not_json(tmp_path):
    with pytest.raises(CheckpointError, match="cannot be written as JSON.*arrays"):
        save_arrays(tmp_path / "x", {"ok": np.ones(2)}, {"w": np.ones(3)})
    with pytest.raises(CheckpointError, match="cannot be written as JSON.*set"):
        save_arrays(tmp_path / "x", {"ok": np.ones(2)}, {"s": {1, 2}})
    assert os.listdir(tmp_path) == []


# ---- pickles are refused, and never run --------------------------------------------------
RAN = []


def _record_that_code_ran():
    RAN.append("unpickled")
    return "payload"


class Payload:
    """Unpickling this would call _record_that_code_ran: the proof that code ran."""

    def __reduce__(self):
        return (_record_that_code_ran, ())


def _object_array():
    a = np.empty(1, dtype=object)
    a[0] = Payload()
    return a


def test_an_npz_member_with_an_object_array_is_refused_unread(tmp_path):
    RAN.clear()
    with zipfile.ZipFile(tmp_path / "evil.npz", "w") as zf:     # written by hand
        with zf.open("w.npy", "w") as f:
            np.save(f, _object_array(), allow_pickle=True)
    with pytest.raises(PickledCheckpointError) as e:
        load_arrays(tmp_path / "evil")
    msg = str(e.value)
    assert "evil.npz holds a pickled object" in msg and "'w.npy'" in msg
    assert "never unpickle" in msg and "minipar.files.save_arrays" in msg
    assert RAN == []


def test_a_pickle_swapped_into_a_valid_checkpoint_is_refused(tmp_path):
    RAN.clear()
    save_arrays(tmp_path / "ck", {"w": np.ones(3)}, {})
    np.savez(tmp_path / "ck.npz", w=_object_array())              # np.savez pickles objects
    with pytest.raises(PickledCheckpointError, match="holds a pickled object"):
        load_arrays(tmp_path / "ck")
    assert RAN == []


def test_a_pickle_file_named_npz_is_refused(tmp_path):
    RAN.clear()
    (tmp_path / "p.npz").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(PickledCheckpointError, match="the whole file is a pickle"):
        load_arrays(tmp_path / "p")
    np.save(tmp_path / "o.npy", _object_array(), allow_pickle=True)
    os.replace(tmp_path / "o.npy", tmp_path / "o.npz")
    with pytest.raises(PickledCheckpointError, match="single .npy array of dtype object"):
        load_arrays(tmp_path / "o")
    assert RAN == []


# ---- files that do not match are refused, naming the file and the key --------------------
@pytest.fixture
def saved(tmp_path):
    save_arrays(tmp_path / "ck", {"w": np.arange(6.0).reshape(2, 3), "b": np.zeros(3)}, {})
    return tmp_path


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def test_tampered_shape_is_refused(saved):
    _edit_json(saved / "ck.json", lambda d: d["arrays"]["w"].update(shape=[3, 2]))
    with pytest.raises(CheckpointError, match=r"ck.json says array 'w' has shape \[3, 2\], "
                                              r"but .*ck.npz holds shape \[2, 3\]"):
        load_arrays(saved / "ck")


def test_tampered_dtype_is_refused(saved):
    _edit_json(saved / "ck.json", lambda d: d["arrays"]["b"].update(dtype="float32"))
    with pytest.raises(CheckpointError, match="array 'b' is stored as float32, but .* float64"):
        load_arrays(saved / "ck")
    _edit_json(saved / "ck.json", lambda d: d["arrays"]["b"].update(dtype="object"))
    with pytest.raises(CheckpointError, match="dtype 'object', which is not a numeric"):
        load_arrays(saved / "ck")


def test_a_name_in_one_file_only_is_refused(saved):
    _edit_json(saved / "ck.json", lambda d: d["arrays"].update(c={"shape": [1],
                                                                  "dtype": "float64"}))
    with pytest.raises(CheckpointError, match="lists array 'c' but .*ck.npz has no member"):
        load_arrays(saved / "ck")
    _edit_json(saved / "ck.json", lambda d: d["arrays"].pop("c") and d["arrays"].pop("b"))
    with pytest.raises(CheckpointError, match=r"holds arrays \['b'\] that .*ck.json does not"):
        load_arrays(saved / "ck")


def test_missing_files_are_named(saved):
    (saved / "ck.json").unlink()
    with pytest.raises(CheckpointError, match="ck.json does not exist"):
        load_arrays(saved / "ck")
    with pytest.raises(CheckpointError, match="nothing.npz does not exist"):
        load_arrays(saved / "nothing")


def test_an_npz_from_another_save_is_refused(saved):
    json_before = (saved / "ck.json").read_text()
    save_arrays(saved / "ck", {"w": np.ones((2, 3)), "b": np.ones(3)}, {})  # same shapes
    (saved / "ck.json").write_text(json_before)
    with pytest.raises(CheckpointError, match="sha256 differs.*different saves"):
        load_arrays(saved / "ck")


def test_not_a_checkpoint_json(saved):
    (saved / "ck.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="ck.json is not valid JSON"):
        load_arrays(saved / "ck")
    (saved / "ck.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="format 'something-else', expected "
                                              "'minipar-checkpoint'"):
        load_arrays(saved / "ck")


# ---- atomic writes -----------------------------------------------------------------------
def test_a_writer_that_fails_midway_leaves_no_partial_file(tmp_path, monkeypatch):
    old = {"w": np.arange(4.0), "b": np.ones(2)}
    save_arrays(tmp_path / "ck", old, {"step": 1})
    real_write_array = np.lib.format.write_array
    calls = []

    def fail_on_second_array(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real_write_array(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", fail_on_second_array)
    with pytest.raises(OSError, match="disk full"):
        save_arrays(tmp_path / "ck", {"w": np.zeros(4), "b": np.zeros(2)}, {"step": 2})
    with pytest.raises(OSError, match="disk full"):
        calls.clear()
        save_arrays(tmp_path / "fresh", {"w": np.zeros(4), "b": np.zeros(2)}, {})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ck.json", "ck.npz"]  # no temporaries, no "fresh"
    got, meta = load_arrays(tmp_path / "ck")                       # the old pair, intact
    assert same(got["w"], old["w"]) and meta == {"step": 1}


def test_a_crash_between_the_two_renames_is_caught_on_load(tmp_path, monkeypatch):
    save_arrays(tmp_path / "ck", {"w": np.arange(4.0)}, {"step": 1})
    real_replace = os.replace

    def fail_on_json(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("power cut (simulated)")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_json)  # what files/atomic.py calls
    with pytest.raises(OSError, match="power cut"):
        save_arrays(tmp_path / "ck", {"w": np.zeros(4)}, {"step": 2})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ck.json", "ck.npz"]  # new .npz, old .json
    with pytest.raises(CheckpointError, match="sha256 differs"):
        load_arrays(tmp_path / "ck")


# ---- sharded checkpoints -----------------------------------------------------------------
def test_three_ranks_save_shards_and_consolidate_drops_the_padding(tmp_path):
    # full arrays: w [5, 7] (35 elements -> 3 shards of 12, 1 padding element),
    # m [4] bf16 (4 -> 3 shards of 2, 2 padding), and replicated step and lr
    w = np.arange(35, dtype=np.float32).reshape(5, 7)
    m = np.array([0.5, -1.0, 2.0, 4.0], dtype=bf16)
    pad_w = np.array([-99.0], np.float32)
    pad_m = np.array([-7.0, -7.0], bf16)
    w_shards = [w.ravel()[0:12], w.ravel()[12:24], np.concatenate([w.ravel()[24:35], pad_w])]
    m_shards = [m[0:2], m[2:4], pad_m]

    def rank_program(ctx):
        save_sharded(tmp_path / "ckpt", ctx.rank, ctx.world_size,
                     {"w": w_shards[ctx.rank], "m": m_shards[ctx.rank],
                      "step": np.array(10), "lr": np.array(3e-4)},
                     {"iteration": 10, "rank": ctx.rank},
                     sharded={"w": [5, 7], "m": [4]})

    mp.launch(rank_program, world_size=3)       # three simulated ranks write concurrently

    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert names == ["index.json"] + [f"rank0000{r}.{ext}" for r in range(3)
                                      for ext in ("json", "npz")]
    index = json.loads((tmp_path / "ckpt" / "index.json").read_text())
    assert index["world_size"] == 3
    assert index["files"] == ["rank00000", "rank00001", "rank00002"]
    assert index["meta"] == {"iteration": 10, "rank": 0}
    assert index["arrays"]["w"] == {"axis": 0, "global_shape": [5, 7], "dtype": "float32",
                                    "global_numel": 35, "shard_numel": 12,
                                    "offsets": [0, 12, 24], "padding": 1}
    assert index["arrays"]["m"] == {"axis": 0, "global_shape": [4], "dtype": "bfloat16",
                                    "global_numel": 4, "shard_numel": 2,
                                    "offsets": [0, 2, 4], "padding": 2}
    assert index["arrays"]["step"] == {"full": True, "global_shape": [], "dtype": "int64"}

    shards, idx = load_sharded(tmp_path / "ckpt")
    assert idx == index and len(shards) == 3
    assert same(shards[2]["w"], w_shards[2])                 # padding is still there
    full = consolidate(tmp_path / "ckpt")
    assert same(full["w"], w) and same(full["m"], m)
    assert same(full["step"], np.array(10)) and same(full["lr"], np.array(3e-4))

    save_consolidated(tmp_path / "full", full, {"iteration": 10})
    again, meta = load_arrays(tmp_path / "full")
    assert all(same(again[k], full[k]) for k in full) and meta == {"iteration": 10}


def _save_three(d, step_per_rank=(5, 5, 5), sizes=(2, 2, 2)):
    for r in range(3):
        save_sharded(d, r, 3, {"x": np.full(sizes[r], float(r)),
                               "step": np.array(step_per_rank[r])}, {}, sharded={"x": [5]})


def test_replicated_arrays_must_agree(tmp_path):
    _save_three(tmp_path, step_per_rank=(5, 5, 6))
    with pytest.raises(CheckpointError, match="replicated array 'step' differs between "
                                              "rank 0 and rank 2"):
        consolidate(tmp_path)


def test_shards_of_unequal_size_are_refused(tmp_path):
    _save_three(tmp_path, sizes=(2, 2, 3))
    with pytest.raises(CheckpointError, match=r"rank00002.json: array 'x' is float64 of shape "
                                              r"\[3\], the index expects float64 of shape \[2\]"):
        load_sharded(tmp_path)


def test_a_missing_rank_file_is_named(tmp_path):
    _save_three(tmp_path)
    (tmp_path / "rank00001.npz").unlink()
    with pytest.raises(CheckpointError, match="rank00001.npz does not exist"):
        load_sharded(tmp_path)
    with pytest.raises(CheckpointError, match="index.json does not exist"):
        load_sharded(tmp_path / "elsewhere")


def test_files_from_another_world_size_are_refused(tmp_path):
    _save_three(tmp_path)
    save_sharded(tmp_path, 1, 4, {"x": np.zeros(2), "step": np.array(5)}, {},
                 sharded={"x": [5]})
    with pytest.raises(CheckpointError, match="written by rank 1 of 4, but the index expects "
                                              "rank 1 of 3"):
        load_sharded(tmp_path)


def test_save_sharded_checks_its_arguments(tmp_path):
    with pytest.raises(CheckpointError, match=r"rank must be an int in \[0, 2\)"):
        save_sharded(tmp_path, 2, 2, {"x": np.zeros(1)}, {})
    with pytest.raises(CheckpointError, match=r"\['y'\] listed in `sharded`"):
        save_sharded(tmp_path, 0, 2, {"x": np.zeros(1)}, {}, sharded={"y": [2]})
    with pytest.raises(CheckpointError, match=r"at least ceil\(5/2\) = 3 elements"):
        save_sharded(tmp_path, 0, 2, {"x": np.zeros(2)}, {}, sharded={"x": [5]})
    assert os.listdir(tmp_path) == []


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
       world=st.integers(1, 5), extra=st.integers(0, 2),
       dtype=st.sampled_from([np.float64, np.float32, np.int64, bf16]))
def test_any_shape_over_any_shard_count_consolidates_to_the_original(shape, world, extra,
                                                                     dtype):
    n = int(np.prod(shape))
    full = np.arange(n).astype(dtype).reshape(shape)
    per_rank = -(-n // world) + extra               # ceil(n / world), plus alignment slack
    padded = np.concatenate([full.ravel(), np.full(world * per_rank - n, 77).astype(dtype)])
    with tempfile.TemporaryDirectory() as d:
        for r in range(world):
            save_sharded(d, r, world, {"x": padded[r * per_rank:(r + 1) * per_rank],
                                       "step": np.array(3)}, {}, sharded={"x": list(shape)})
        got = consolidate(d)
        index = json.loads((Path(d) / "index.json").read_text())
    assert same(got["x"], full) and same(got["step"], np.array(3))
    assert index["arrays"]["x"]["padding"] == world * per_rank - n
    assert index["arrays"]["x"]["offsets"] == [r * per_rank for r in range(world)]


def test_ranks_that_disagree_on_what_is_sharded_are_refused(tmp_path):
    save_sharded(tmp_path, 0, 2, {"x": np.zeros(2), "y": np.zeros(3)}, {}, sharded={"x": [4]})
    save_sharded(tmp_path, 1, 2, {"x": np.zeros(2), "y": np.zeros(3)}, {},
                 sharded={"x": [4], "y": [6]})
    with pytest.raises(CheckpointError, match=r"rank00001.json was saved with sharded=.*'y'.*"
                                              r"every rank must pass the same"):
        load_sharded(tmp_path)


# ---- damage is refused before anything is allocated, and named --------------------------
def _resign(base: Path) -> None:
    """Record the .npz's current sha256 in its .json: damage that a consistent pair carries,
    so the checks past the sha256 are what refuse it."""
    import hashlib
    _edit_json(base.with_suffix(".json"), lambda d: d.update(
        npz_sha256=hashlib.sha256(base.with_suffix(".npz").read_bytes()).hexdigest()))


def _npy_bytes(shape, descr="<f8", data=b"") -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue() + data


def huge_header_checkpoint(d: Path) -> Path:
    """A pair of a few hundred bytes whose header declares 2**34 float64 (128 GiB) and
    whose JSON agrees: today's loader asked NumPy for 128 GiB."""
    save_arrays(d / "h", {"x": np.zeros(2)}, {})
    with zipfile.ZipFile(d / "h.npz", "w") as zf:
        zf.writestr("x.npy", _npy_bytes([2 ** 34]))
    _edit_json(d / "h.json", lambda doc: doc["arrays"]["x"].update(shape=[2 ** 34]))
    _resign(d / "h")
    return d / "h"


def test_a_header_declaring_more_data_than_the_file_holds_is_refused_unallocated(tmp_path):
    import tracemalloc
    base = huge_header_checkpoint(tmp_path)
    assert (tmp_path / "h.npz").stat().st_size < 400
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"h.npz: member 'x.npy' declares float64 of "
                                                  r"shape \[17179869184\], 137438953472 bytes "
                                                  r"of data, but holds 0.*before anything"):
            load_arrays(base)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def _damage(base: Path, how: str) -> None:
    """Rewrite base.npz's member w.npy (arange(6.0), stored) damaged one way."""
    npz = base.with_suffix(".npz")
    raw = bytearray(npz.read_bytes())
    if how == "crc":       # one data byte flipped: the header is intact, the CRC-32 is not
        raw[raw.index(b"\x93NUMPY") + 128 + 3] ^= 0xFF
        npz.write_bytes(bytes(raw))
    elif how == "truncated":  # the middle lost, the zip's directory intact
        npz.write_bytes(bytes(raw[:len(raw) // 2]) + bytes(raw[-120:]))
    elif how == "cut":        # the end lost, the zip's directory with it
        npz.write_bytes(bytes(raw[:len(raw) // 2]))
    else:
        member = {"not-npy": b"hello, not an array",
                  "short": _npy_bytes([2, 3], data=b"\0" * 40),   # 40 of 48 bytes
                  "dtype": _npy_bytes([2, 3], descr="<i8", data=b"\0" * 48),
                  "negative": _npy_bytes([-2, 3])}[how]
        with zipfile.ZipFile(npz, "w") as zf:
            zf.writestr("w.npy", member)
    _resign(base)


@pytest.mark.parametrize("how, match", [
    ("crc", r"w.npz: array 'w' \(member 'w.npy'\) is damaged: Bad CRC-32"),
    ("truncated", r"w.npz: array 'w' \(member 'w.npy'\) is damaged"),
    ("cut", r"w.npz is not an .npz \(zip\) archive"),
    ("not-npy", r"w.npz: member 'w.npy' is not a readable .npy array"),
    ("short", r"w.npz: member 'w.npy' declares float64 of shape \[2, 3\], 48 bytes of data, "
              r"but holds 40"),
    ("dtype", r"w.json says array 'w' is stored as float64, but .*w.npz holds int64"),
    ("negative", r"w.npz: member 'w.npy' declares the shape \[-2, 3\], with a negative size"),
])
def test_a_damaged_member_is_named_with_its_file_and_array(tmp_path, how, match):
    save_arrays(tmp_path / "w", {"w": np.arange(6.0).reshape(2, 3)}, {})
    _damage(tmp_path / "w", how)
    with pytest.raises(CheckpointError, match=match):
        load_arrays(tmp_path / "w")


def _zip_with_entry(npz: Path, edit) -> None:
    """Rewrite npz's central directory entry of its one member with edit(ZipInfo)."""
    import struct
    raw = bytearray(npz.read_bytes())
    at = raw.rindex(b"PK\x01\x02")
    fields = list(struct.unpack_from("<4s6H3L5H2L", raw, at))
    edit(fields)  # [8] compress_size, [9] file_size, [4] method
    struct.pack_into("<4s6H3L5H2L", raw, at, *fields)
    npz.write_bytes(bytes(raw))


@pytest.mark.parametrize("edit, match", [
    (lambda f: f.__setitem__(8, 1 << 30), r"places 1073741824 bytes at offset 0, beyond the "
                                           r"file's"),
    (lambda f: f.__setitem__(9, 1 << 30), r"stored uncompressed but declares 1073741824 "
                                           r"bytes in 176"),
    (lambda f: (f.__setitem__(4, 8), f.__setitem__(9, 1 << 31)),
     r"declares 2147483648 bytes deflated into 176, more than deflate's largest ratio"),
    (lambda f: f.__setitem__(4, 12), r"zip compression method 12; minipar writes stored or "
                                     r"deflated"),
])
def test_zip_sizes_that_the_file_cannot_hold_are_refused(tmp_path, edit, match):
    save_arrays(tmp_path / "z", {"w": np.arange(6.0)}, {})
    with zipfile.ZipFile(tmp_path / "z.npz", "w") as zf:  # a plain zip: no zip64 extra field
        zf.writestr("w.npy", _npy_bytes([6], data=np.arange(6.0).tobytes()))
    _zip_with_entry(tmp_path / "z.npz", edit)
    _resign(tmp_path / "z")
    with pytest.raises(CheckpointError, match=r"z.npz: member 'w.npy' is damaged: .*" + match):
        load_arrays(tmp_path / "z")


def test_a_member_listed_twice_and_a_json_without_tables_are_refused(tmp_path):
    save_arrays(tmp_path / "t", {"w": np.zeros(2)}, {})
    with pytest.warns(UserWarning, match="Duplicate name"):
        with zipfile.ZipFile(tmp_path / "t.npz", "w") as zf:
            zf.writestr("w.npy", _npy_bytes([2], data=bytes(16)))
            zf.writestr("w.npy", _npy_bytes([2], data=bytes(16)))
    _resign(tmp_path / "t")
    with pytest.raises(CheckpointError, match="t.npz lists member 'w.npy' twice"):
        load_arrays(tmp_path / "t")
    save_arrays(tmp_path / "u", {"w": np.zeros(2)}, {})
    _edit_json(tmp_path / "u.json", lambda d: d.pop("meta"))
    with pytest.raises(CheckpointError, match="u.json has no 'arrays' or 'meta' table"):
        load_arrays(tmp_path / "u")
    _edit_json(tmp_path / "u.json", lambda d: d.update(meta={}, arrays={"w": [2]}))
    with pytest.raises(CheckpointError, match=r"the entry of array 'w' is \[2\], expected"):
        load_arrays(tmp_path / "u")
    (tmp_path / "u.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="u.json is not valid JSON"):
        load_arrays(tmp_path / "u")


# ---- a save refuses a bad path before writing anything -----------------------------------
def test_saving_onto_a_directory_or_under_a_file_is_refused_unwritten(tmp_path):
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(CheckpointError, match=r"cannot save .*d.npz: it is a directory"):
        save_arrays(tmp_path / "d", {"x": np.ones(2)}, {})
    (tmp_path / "f").write_text("a file")
    with pytest.raises(CheckpointError, match=r"cannot save .*f/sub/c.npz: .*f is a file, not "
                                              r"a directory"):
        save_arrays(tmp_path / "f" / "sub" / "c", {"x": np.ones(2)}, {})
    with pytest.raises(CheckpointError, match=r"cannot save a sharded checkpoint into .*f: it "
                                              r"is a file"):
        save_sharded(tmp_path / "f", 0, 1, {"x": np.ones(2)}, {})
    assert sorted(os.listdir(tmp_path)) == ["d.npz", "f"] and os.listdir(tmp_path / "d.npz") == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_saving_into_a_directory_without_write_permission_is_refused(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(CheckpointError, match="may not write in"):
        save_arrays(tmp_path / "ro" / "c", {"x": np.ones(2)}, {})


# ---- a sharded directory mixing two saves, a damaged index -------------------------------
def test_files_of_another_save_with_the_same_shapes_are_refused_by_save_id(tmp_path):
    for save in ("a", "b"):
        for r in range(2):
            save_sharded(tmp_path / save, r, 2, {"x": np.full(2, r + (save == "b")),
                                                 "step": np.array(1)}, {},
                         sharded={"x": [4]}, save_id=f"step-1-{save}")
    for suffix in (".npz", ".json"):
        shutil_copy(tmp_path / "b" / f"rank00001{suffix}", tmp_path / "a" / f"rank00001{suffix}")
    with pytest.raises(CheckpointError, match=r"rank00001.json belongs to save 'step-1-b', but "
                                              r".*index.json to save 'step-1-a': the directory "
                                              r"mixes files of two saves"):
        load_sharded(tmp_path / "a")
    with pytest.raises(CheckpointError, match="save_id must be a str"):
        save_sharded(tmp_path / "c", 0, 1, {"x": np.ones(1)}, {}, save_id=7)


def shutil_copy(src: Path, dst: Path) -> None:
    dst.write_bytes(src.read_bytes())


@pytest.mark.timeout(10)
@pytest.mark.parametrize("edit, match", [
    (lambda i: i.update(world_size=10 ** 12), "expected world_size >= 1"),  # never listed
    (lambda i: i.update(world_size="3"), "expected world_size >= 1"),
    (lambda i: i["arrays"]["x"].update(global_numel="35"), "entry of array 'x' is damaged"),
    (lambda i: i["arrays"]["x"].update(padding=-1), "entry of array 'x' is damaged"),
    (lambda i: i["arrays"]["x"].update(global_shape=[2, 2]), "entry of array 'x' is damaged"),
    (lambda i: i["arrays"]["x"].update(offsets=[0, 1, 2]), "entry of array 'x' is damaged"),
    (lambda i: i["arrays"]["step"].update(global_shape="[]"), "entry of array 'step' is"),
    (lambda i: i.update(save_id=[1]), "its save_id [1] is not a string"),
])
def test_a_damaged_sharded_index_is_refused_naming_the_field(tmp_path, edit, match):
    _save_three(tmp_path)
    _edit_json(tmp_path / "index.json", edit)
    with pytest.raises(CheckpointError, match=match.replace("[", r"\[").replace("]", r"\]")):
        consolidate(tmp_path)


# ---- fuzz: whatever the bytes, a CheckpointError naming the file, and no large allocation ---
def _fuzz_pair(d: Path, compress: bool) -> Path:
    save_arrays(d / "f", {"w": np.arange(12.0).reshape(3, 4), "b": np.ones(3, bf16),
                          "step": np.array(4)}, {"step": 4}, compress=compress)
    return d / "f"


_MUTATION = st.tuples(st.sampled_from(["npz", "json"]), st.booleans(),
                      st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                         st.integers(0, 255)), min_size=1, max_size=6),
                      st.none() | st.floats(0, 1))


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None)
@given(compress=st.booleans(), mutation=_MUTATION)
def test_fuzz_mutated_bytes_give_a_checkpoint_error_naming_the_file(compress, mutation):
    """Bytes of a valid pair overwritten (and the file perhaps cut short); with `resign` the
    .json records the damaged .npz's sha256, so the checks past it are what must refuse.
    Every outcome: the arrays saved, or a CheckpointError naming the file; under 16 MiB."""
    import tracemalloc
    which, resign, writes, cut = mutation
    with tempfile.TemporaryDirectory() as d:
        base = _fuzz_pair(Path(d), compress)
        target = base.with_suffix("." + which)
        raw = bytearray(target.read_bytes())
        for at, byte in writes:
            raw[int(at * len(raw))] = byte
        if cut is not None:
            raw = raw[:int(cut * len(raw))]
        target.write_bytes(bytes(raw))
        if resign and which == "npz":
            try:
                _resign(base)
            except ValueError:
                pass  # the .json is intact; a json.loads failure cannot happen here
        tracemalloc.start()
        try:
            got = load_arrays(base)
        except CheckpointError as e:
            assert "f.npz" in str(e) or "f.json" in str(e), str(e)
        else:
            assert same(got[0]["w"], np.arange(12.0).reshape(3, 4))
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    assert peak < 16 << 20, peak


@pytest.mark.timeout(120)
@settings(max_examples=100, deadline=None)
@given(writes=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(32, 126)),
                       min_size=1, max_size=4))
def test_fuzz_a_mutated_sharded_index_gives_a_checkpoint_error(writes):
    with tempfile.TemporaryDirectory() as d:
        _save_three(d)
        index = Path(d) / "index.json"
        raw = bytearray(index.read_bytes())
        for at, byte in writes:
            raw[int(at * len(raw))] = byte
        index.write_bytes(bytes(raw))
        try:
            full = consolidate(d)
        except CheckpointError as e:
            assert "index.json" in str(e) or "rank0000" in str(e), str(e)
        else:
            assert full["x"].shape == (5,)
