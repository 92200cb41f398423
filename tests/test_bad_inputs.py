"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import pytest

import minipar as mp  # noqa: F401  (the cases below use it)

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
RUNTIME_CASES: list[tuple[str, object, type, list[str]]] = [
    # (id, fn() that misuses the runtime, exception type, words in its message)
]


# ---- the model, the optimizers and `minipar train` -----------------------------------------
MODEL_CASES: list[tuple[str, object, type, list[str]]] = [
]


# ---- checkpoints and files ----------------------------------------------------------------
import minipar.files  # noqa: E402  (mp.files, for the cases below; helpers after the table)

CHECKPOINT_CASES: list[tuple[str, object, type, list[str]]] = [
    ("files: a 236-byte .npz whose header declares 128 GiB", lambda: _load("huge"),
     mp.files.CheckpointError, ["declares float64 of shape [17179869184]", "holds 0",
                                "before anything is allocated"]),
    ("files: a member whose CRC-32 fails", lambda: _load("crc"),
     mp.files.CheckpointError, ["array 'w' (member 'w.npy') is damaged", "Bad CRC-32"]),
    ("files: a member whose middle is lost", lambda: _load("middle"),
     mp.files.CheckpointError, ["array 'w' (member 'w.npy') is damaged"]),
    ("files: a member holding 40 of the 48 bytes its header declares", lambda: _load("short"),
     mp.files.CheckpointError, ["48 bytes of data, but holds 40"]),
    ("files: a member header with a negative shape", lambda: _load("negative"),
     mp.files.CheckpointError, ["declares the shape [-2, 3], with a negative size"]),
    ("files: a zip directory placing a member beyond the file's end",
     lambda: _load("zip", 8, 1 << 30), mp.files.CheckpointError, ["beyond the file's"]),
    ("files: a stored member declaring 1 GiB in 176 bytes", lambda: _load("zip", 9, 1 << 30),
     mp.files.CheckpointError, ["stored uncompressed but declares 1073741824 bytes"]),
    ("files: a deflated member declaring more than deflate's ratio",
     lambda: _load("zip", 9, 1 << 31, method=8), mp.files.CheckpointError,
     ["more than deflate's largest ratio (1032:1)"]),
    ("files: a member in an unknown zip compression method",
     lambda: _load("zip", 4, 12), mp.files.CheckpointError, ["compression method 12"]),
    ("files: an .npz listing one member twice", lambda: _load("twice"),
     mp.files.CheckpointError, ["lists member 'w.npy' twice"]),
    ("files: a .json without its meta table", lambda: _load("no meta"),
     mp.files.CheckpointError, ["has no 'arrays' or 'meta' table"]),
    ("files: a .json array entry that is not a table", lambda: _load("entry"),
     mp.files.CheckpointError, ["the entry of array 'w' is [2, 3]"]),
    ("files: a .json nested 100 000 deep", lambda: _load("deep"),
     mp.files.CheckpointError, ["is not valid JSON"]),
    ("files: save_arrays onto a directory named x.npz", lambda: _save("onto dir"),
     mp.files.CheckpointError, ["x.npz: it is a directory"]),
    ("files: save_arrays under a path that is a file", lambda: _save("under file"),
     mp.files.CheckpointError, ["is a file, not a directory"]),
    ("files: save_sharded into a path that is a file", lambda: _save("sharded onto file"),
     mp.files.CheckpointError, ["it is a file, and a sharded checkpoint is a directory"]),
    ("files: save_sharded with a save_id that is not a string", lambda: _save("save_id"),
     mp.files.CheckpointError, ["save_id must be a str"]),
    ("files: a sharded directory mixing two saves of the same shapes", lambda: _sharded("mix"),
     mp.files.CheckpointError, ["belongs to save 'b'", "mixes files of two saves"]),
    ("files: a sharded index declaring 10**12 ranks", lambda: _sharded("world"),
     mp.files.CheckpointError, ["index.json is damaged: expected world_size >= 1"]),
    ("files: a sharded index whose global_numel is a string", lambda: _sharded("numel"),
     mp.files.CheckpointError, ["the entry of array 'x' is damaged"]),
    ("files: a sharded index whose offsets disagree with shard_numel",
     lambda: _sharded("offsets"), mp.files.CheckpointError,
     ["the entry of array 'x' is damaged", "offsets r * shard_numel"]),
    ("checkpoint: rank files without index.json (an unfinished save)",
     lambda: _layout("no index"), mp.files.CheckpointError,
     ["holds rank files but no index.json: the save did not finish"]),
    ("checkpoint: an index whose step is a string", lambda: _layout("step"),
     mp.files.CheckpointError, ["metadata is damaged", "step: an int >= 0"]),
    ("checkpoint: an index whose mesh declares 10**9 dp_shard ranks", lambda: _layout("mesh"),
     mp.files.CheckpointError, ["one file per coordinate of the mesh"]),
    ("checkpoint: tensor-parallel pieces that cannot join", lambda: _layout("pieces"),
     mp.files.CheckpointError, ["tensor-parallel pieces have shapes [[128], [128]]",
                                "do not join along dimension 1"]),
    ("checkpoint: consolidated metadata whose params are not tables",
     lambda: _layout("consolidated params"), mp.files.CheckpointError,
     ["full.json: the checkpoint's metadata is damaged; expected params:"]),
    ("checkpoint: save_sharded into a path that is a file", lambda: _layout("save onto file"),
     mp.files.CheckpointError, ["it is a file, and a sharded checkpoint is a directory"]),
    ("checkpoint: save_consolidated onto a directory", lambda: _layout("save onto dir"),
     mp.files.CheckpointError, ["c.npz: it is a directory"]),
]


def _npy(shape, descr="<f8", data=b""):
    import io
    import numpy as np
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue() + data


def _edit_json(path, edit):
    import json
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _load(how, field=None, value=None, method=None):
    """A checkpoint pair w.npz/w.json of arange(6.0) damaged `how`, its .json recording the
    damaged .npz's sha256 (so the checks past it must refuse), then loaded."""
    import hashlib
    import struct
    import tempfile
    import zipfile
    from pathlib import Path
    import numpy as np
    base = Path(tempfile.mkdtemp()) / "w"
    mp.files.save_arrays(base, {"w": np.arange(6.0).reshape(2, 3)}, {})
    npz, js = mp.files.checkpoint_paths(base)
    raw = bytearray(npz.read_bytes())
    members = {"huge": [("w.npy", _npy([2 ** 34]))],
               "short": [("w.npy", _npy([2, 3], data=bytes(40)))],
               "negative": [("w.npy", _npy([-2, 3]))],
               "zip": [("w.npy", _npy([2, 3], data=bytes(48)))],
               "twice": [("w.npy", _npy([2, 3], data=bytes(48)))] * 2}
    if how in members:
        import warnings
        with warnings.catch_warnings(), zipfile.ZipFile(npz, "w") as zf:
            warnings.simplefilter("ignore")  # "Duplicate name"
            for name, data in members[how]:
                zf.writestr(name, data)
        raw = bytearray(npz.read_bytes())
    if how == "huge":
        _edit_json(js, lambda d: d["arrays"]["w"].update(shape=[2 ** 34]))
    elif how == "crc":
        raw[raw.index(b"\x93NUMPY") + 131] ^= 0xFF
    elif how == "middle":
        raw = raw[:len(raw) // 2] + raw[-120:]
    elif how == "zip":
        at = raw.rindex(b"PK\x01\x02")  # the central directory entry of the one member
        fields = list(struct.unpack_from("<4s6H3L5H2L", raw, at))
        fields[field] = value
        if method is not None:
            fields[4] = method
        struct.pack_into("<4s6H3L5H2L", raw, at, *fields)
    elif how == "no meta":
        _edit_json(js, lambda d: d.pop("meta"))
    elif how == "entry":
        _edit_json(js, lambda d: d["arrays"].update(w=[2, 3]))
    npz.write_bytes(bytes(raw))
    _edit_json(js, lambda d: d.update(npz_sha256=hashlib.sha256(bytes(raw)).hexdigest()))
    if how == "deep":
        js.write_text("[" * 100_000 + "]" * 100_000)
    mp.files.load_arrays(base)


def _save(how):
    import tempfile
    from pathlib import Path
    import numpy as np
    d = Path(tempfile.mkdtemp())
    (d / "x.npz").mkdir()
    (d / "file").write_text("a file")
    x = {"x": np.ones(2)}
    if how == "onto dir":
        mp.files.save_arrays(d / "x", x, {})
    elif how == "under file":
        mp.files.save_arrays(d / "file" / "c", x, {})
    elif how == "sharded onto file":
        mp.files.save_sharded(d / "file", 0, 1, x, {})
    else:
        mp.files.save_sharded(d / "s", 0, 1, x, {}, save_id=3)


def _sharded(how):
    """Two files.save_sharded saves "a" and "b" of the same shapes, "a" damaged `how`."""
    import tempfile
    from pathlib import Path
    import numpy as np
    d = Path(tempfile.mkdtemp())
    for save in ("a", "b"):
        for r in range(2):
            mp.files.save_sharded(d / save, r, 2, {"x": np.full(2, r), "step": np.array(1)},
                                  {}, sharded={"x": [4]}, save_id=save)
    if how == "mix":
        for suffix in (".npz", ".json"):
            (d / "a" / f"rank00001{suffix}").write_bytes(
                (d / "b" / f"rank00001{suffix}").read_bytes())
    edit = {"mix": lambda i: None, "world": lambda i: i.update(world_size=10 ** 12),
            "numel": lambda i: i["arrays"]["x"].update(global_numel="4"),
            "offsets": lambda i: i["arrays"]["x"].update(offsets=[0, 1])}[how]
    _edit_json(d / "a" / "index.json", edit)
    mp.files.consolidate(d / "a")


_LAYOUT_SAVE = []


def _layout(how):
    """A dp 2 x tp 2 ZeRO-1 save (made once), copied, damaged `how` and read back; or a
    save onto a bad path."""
    import shutil
    import tempfile
    from pathlib import Path
    import numpy as np
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel import ParallelDims, checkpoint, parallelize, zero_engine
    cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2,
                    ffn_hidden=32)
    d = Path(tempfile.mkdtemp())
    if how.startswith("save"):
        (d / "file").write_text("a file")
        (d / "c.npz").mkdir()
        with mp.device():
            engine = zero_engine(GPT(cfg), stage=0, lr=1e-2)
            if how == "save onto file":
                checkpoint.save_sharded(engine, d / "file")
            checkpoint.save_consolidated(engine, d / "c")
    if not _LAYOUT_SAVE:
        saved = Path(tempfile.mkdtemp())

        def program(ctx):
            run = parallelize(cfg, ParallelDims(dp_shard=2, tp=2), zero=1, lr=1e-2)
            checkpoint.save_sharded(run, saved / "sharded")
            checkpoint.save_consolidated(run, saved / "full")

        mp.launch(program, 4)
        _LAYOUT_SAVE.append(saved)
    shutil.copytree(_LAYOUT_SAVE[0], d, dirs_exist_ok=True)
    work = d / "sharded"

    def flatten(index, name):  # a parameter's pieces given a 1-D shape of the same size
        p = next(p for u in index["meta"]["units"] for p in u["params"] if p["name"] == name)
        p["shape"] = [int(np.prod(p["shape"]))]

    if how == "no index":
        (work / "index.json").unlink()
    elif how == "consolidated params":
        arrays, meta = mp.files.load_arrays(d / "full")
        mp.files.save_arrays(d / "full", arrays, {**meta, "params": {"wte.weight": [16, 16]}})
        work = d / "full"
    else:
        _edit_json(work / "index.json", {
            "step": lambda i: i["meta"].update(step="0"),
            "mesh": lambda i: i["meta"]["mesh"].update(dp_shard=10 ** 9),
            "pieces": lambda i: flatten(i, "blocks.0.attn.proj.weight")}[how])
    checkpoint.read_full_state(work)


def _cases(table):
    return [pytest.param(fn, exc, words, id=name) for name, fn, exc, words in table]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, words", [pytest.param(a, w, id=" ".join(a)) for a, w in CLI_CASES])
def test_the_cli_refuses(argv, words, capsys):
    from minipar.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn, exc, words",
                         _cases(RUNTIME_CASES + MODEL_CASES + CHECKPOINT_CASES))
def test_the_library_refuses(fn, exc, words):
    with pytest.raises(exc) as e:
        fn()
    msg = str(getattr(e.value, "original", e.value))
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
