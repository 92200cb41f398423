"""Checkpoint files that never run code: NumPy arrays in .npz, metadata in JSON.

The rule: a checkpoint is read with allow_pickle=False, and a file that would need a
pickle (an object array, a pickle renamed .npz) is refused before any array is loaded.
Loading a checkpoint never runs code.

One checkpoint, `save_arrays(path, arrays, meta)`, is a pair of files:

    path.npz   a zip with one .npy member per array, "<name>.npy" (the layout np.savez
               writes; stored uncompressed unless compress=True)
    path.json  {"format": "minipar-checkpoint", "version": 1,
                "npz": "<basename>.npz", "npz_sha256": "<hex digest of the .npz>",
                "arrays": {"<name>": {"shape": [2, 3], "dtype": "bfloat16",
                                      "stored_as": "uint16"}, ...},
                "meta": {...the caller's metadata...}}

  - ml_dtypes types (bfloat16, float8_*, int4, ...) have no portable .npy description, so
    their bit patterns are stored as the unsigned integer of the same width ("stored_as")
    and "dtype" names the true type; loading views the bits back, exactly.
  - Native NumPy types (bool, signed/unsigned int, float, complex) are stored as
    themselves, in native byte order. Anything else (object, str, structured) is refused
    when saving: put strings and other small values in `meta`.
  - Atomic writes: both files are written to temporary files in the target directory and
    moved into place with os.replace, the .npz first and the .json last. A crash leaves
    the old pair, or a new .npz beside the old .json, which the sha256 check refuses; never
    a half-written file under the checkpoint's name.

A sharded checkpoint, `save_sharded(dirpath, rank, world_size, arrays, meta, sharded)`:
every rank writes dirpath/rank{r:05d}.npz/.json with the arrays it holds, and rank 0 also
writes dirpath/index.json:

    {"format": "minipar-sharded-checkpoint", "version": 1, "world_size": 3,
     "files": ["rank00000", "rank00001", "rank00002"],
     "arrays": {
       "step":    {"full": true, "global_shape": [], "dtype": "int64"},
       "exp_avg": {"axis": 0, "global_shape": [5, 7], "dtype": "float32",
                   "global_numel": 35, "shard_numel": 12, "offsets": [0, 12, 24],
                   "padding": 1}},
     "meta": {...rank 0's metadata...}}

  - {"full": true}: every rank holds the whole array (a replicated array: parameters under
    ZeRO-1/2, a step counter). `consolidate` takes rank 0's copy after checking that every
    rank holds the same bits.
  - {"axis": 0, ...}: a flat shard, the ZeRO/FSDP layout. The array is flattened in C order
    to global_numel elements and padded at the end to world_size * shard_numel elements
    (`padding` of them); rank r holds the 1-D slice [offsets[r], offsets[r] + shard_numel),
    with offsets[r] = r * shard_numel. `consolidate` concatenates the shards in rank
    order, drops the trailing padding and reshapes to global_shape.

Every rank's own JSON also records its rank, the world size and the flat-sharded names, so
a file from another save or another rank is caught. In a simulated run the ranks write
concurrently (each its own files); load only after every rank has saved (a barrier).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Optional, Sequence, Union

import ml_dtypes
import numpy as np

from .runtime.errors import MiniparError

FORMAT = "minipar-checkpoint"
SHARDED_FORMAT = "minipar-sharded-checkpoint"
VERSION = 1
INDEX_NAME = "index.json"

PathLike = Union[str, os.PathLike]

# The ml_dtypes types this version of ml_dtypes has, by name: stored as their bit patterns.
_ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in (
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",
    "float6_e3m2fn", "float4_e2m1fn", "int2", "int4", "uint2", "uint4",
) if hasattr(ml_dtypes, name)}
_NATIVE_KINDS = "biufc"  # bool, signed int, unsigned int, float, complex


class CheckpointError(MiniparError, ValueError):
    """A checkpoint cannot be written or read as asked: names the file and the array."""


class PickledCheckpointError(CheckpointError):
    """A checkpoint file would need a pickle to load; minipar never unpickles."""


def _pickle_refusal(file: Path, what: str) -> PickledCheckpointError:
    return PickledCheckpointError(
        f"checkpoint {file} holds a pickled object ({what}); minipar checkpoints never "
        "unpickle, because unpickling can run arbitrary code. Re-save it with "
        "minipar.files.save_arrays, from numeric arrays (put strings and other small "
        "values in `meta`).")


# ---- paths and atomic writes ---------------------------------------------------------
def checkpoint_paths(path: PathLike) -> tuple[Path, Path]:
    """path -> (path.npz, path.json); a trailing .npz or .json on `path` is dropped first."""
    p = Path(path)
    if p.suffix in (".npz", ".json"):
        p = p.with_suffix("")
    return p.parent / (p.name + ".npz"), p.parent / (p.name + ".json")


def _temp_file(target: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a temporary file beside `target` with `write(f)`; remove it if `write` raises."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _replace_all(moves: Sequence[tuple[Path, Path]]) -> None:
    """os.replace each (temporary, target) in order; on failure remove the temporaries left."""
    try:
        for tmp, target in moves:
            os.replace(tmp, target)
    finally:
        for tmp, _ in moves:
            if tmp.exists():
                tmp.unlink()


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        raise TypeError("a NumPy array in `meta`; pass arrays in `arrays`, meta is for small "
                        "JSON values")
    raise TypeError(f"{type(x).__name__} is not JSON-serializable")


def _json_bytes(doc: dict, what: str) -> bytes:
    try:
        return json.dumps(doc, indent=1, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the metadata of {what} cannot be written as JSON: {e}. "
                              "Use dicts, lists, str, int, float, bool and None.") from None


def _read_json(file: Path, expected_format: str) -> dict:
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {file} does not exist; expected it beside "
                              "the arrays, written by minipar.files")
    try:
        doc = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint file {file} is not valid JSON ({e}); it is damaged "
                              "or not a minipar checkpoint") from None
    if not isinstance(doc, dict) or doc.get("format") != expected_format:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(f"{file} has format {got!r}, expected {expected_format!r}")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{file} has format version {doc.get('version')!r}; this "
                              f"minipar reads version {VERSION}")
    return doc


# ---- dtypes: what is stored, and what it means ----------------------------------------
def _encode(name: str, a: np.ndarray) -> tuple[np.ndarray, dict]:
    """The array to store and its JSON entry: ml_dtypes as bits, natives in native order."""
    dt = a.dtype
    if dt.name in _ML_DTYPES and dt == _ML_DTYPES[dt.name]:
        bits = np.dtype(f"u{dt.itemsize}")
        return a.view(bits), {"shape": list(a.shape), "dtype": dt.name, "stored_as": bits.name}
    try:  # the plain NumPy type of this kind and width, in native byte order: '>f4' -> float32
        native = np.dtype(f"{dt.kind}{dt.itemsize}") if dt.kind in _NATIVE_KINDS else None
    except TypeError:
        native = None
    if native is not None and dt.newbyteorder("=") == native:
        return a.astype(native, copy=False), {"shape": list(a.shape), "dtype": native.name}
    raise CheckpointError(
        f"array {name!r} has dtype {dt}, which a checkpoint cannot hold without a pickle; "
        f"expected bool, int, uint, float or complex, or one of the ml_dtypes types "
        f"{sorted(_ML_DTYPES)}. Convert it to a numeric array or put it in `meta`.")


def _dtype_named(name: Any, file: Path, key: str) -> np.dtype:
    """The dtype a JSON entry names; only numeric NumPy types and ml_dtypes are accepted."""
    if isinstance(name, str) and name in _ML_DTYPES:
        return _ML_DTYPES[name]
    try:
        dt = np.dtype(name) if isinstance(name, str) else None
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.isbuiltin != 1 or dt.kind not in _NATIVE_KINDS:
        raise CheckpointError(f"{file} gives array {key!r} the dtype {name!r}, which is not a "
                              "numeric NumPy type nor an ml_dtypes type")
    return dt


# ---- .npy headers, read without loading ----------------------------------------------
def _npy_header(fp: IO[bytes], file: Path, member: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) from a .npy header; the header is a literal, parsed without running code."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f".npy format version {version} (minipar reads 1.0 and 2.0)")
    except ValueError as e:
        raise CheckpointError(f"{file}: member {member!r} is not a readable .npy array: {e}"
                              ) from None
    return shape, dtype


def _refuse_pickles(npz: Path) -> None:
    """Refuse, before loading anything, an .npz whose members need a pickle, or a non-zip."""
    if not npz.is_file():
        raise CheckpointError(f"checkpoint file {npz} does not exist; save_arrays writes "
                              "<path>.npz and <path>.json, pass <path>")
    if not zipfile.is_zipfile(npz):
        with open(npz, "rb") as f:
            head = f.read(6)
        if head[:1] == b"\x80":
            raise _pickle_refusal(npz, "the whole file is a pickle")
        if head == b"\x93NUMPY":
            with open(npz, "rb") as f:
                _, dtype = _npy_header(f, npz, npz.name)
            if dtype.hasobject:
                raise _pickle_refusal(npz, "a single .npy array of dtype object")
            raise CheckpointError(f"{npz} is a single .npy array, expected an .npz archive; "
                                  "save it with minipar.files.save_arrays")
        raise CheckpointError(f"{npz} is not an .npz (zip) archive; it is damaged or not a "
                              "minipar checkpoint")
    with zipfile.ZipFile(npz) as zf:
        for member in zf.namelist():
            with zf.open(member) as fp:
                _, dtype = _npy_header(fp, npz, member)
            if dtype.hasobject:
                raise _pickle_refusal(npz, f"member {member!r} has dtype {dtype}")


# ---- one checkpoint ------------------------------------------------------------------
def _save(path: PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
          compress: bool, extra: Optional[dict] = None) -> tuple[Path, Path]:
    npz, js = checkpoint_paths(path)
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays must be a dict of name -> np.ndarray, got "
                              f"{type(arrays).__name__}")
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"meta must be a dict of JSON values, got {type(meta).__name__}")
    stored, entries = {}, {}
    for name, a in arrays.items():
        if not (isinstance(name, str) and name):
            raise CheckpointError(f"array names must be non-empty strings, got {name!r}")
        if not isinstance(a, (np.ndarray, np.generic)):
            raise CheckpointError(f"array {name!r} is a {type(a).__name__}, expected a NumPy "
                                  "array; wrap it with np.asarray(..., dtype=...)")
        stored[name], entries[name] = _encode(name, np.asarray(a))
    npz.parent.mkdir(parents=True, exist_ok=True)

    def write_npz(f: IO[bytes]) -> None:
        mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        with zipfile.ZipFile(f, mode="w", compression=mode, allowZip64=True) as zf:
            for name, a in stored.items():
                with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                    np.lib.format.write_array(member, a, allow_pickle=False)

    tmp_npz = _temp_file(npz, write_npz)
    try:
        doc = {"format": FORMAT, "version": VERSION, "npz": npz.name,
               "npz_sha256": _sha256(tmp_npz), "arrays": entries, **(extra or {}),
               "meta": dict(meta)}
        body = _json_bytes(doc, str(js))
        tmp_js = _temp_file(js, lambda f: f.write(body))
    except BaseException:
        tmp_npz.unlink()
        raise
    _replace_all([(tmp_npz, npz), (tmp_js, js)])
    return npz, js


def save_arrays(path: PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                compress: bool = False) -> tuple[Path, Path]:
    """Write arrays to path.npz and their description plus `meta` to path.json, atomically.

    arrays: name -> array of a numeric NumPy dtype or an ml_dtypes type (any shape, 0-d
    included); meta: JSON-serializable dict (NumPy scalars are converted).
    Returns the two paths written.
    """
    return _save(path, arrays, meta, compress)


def _load(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and the whole JSON document of one checkpoint, every check applied."""
    npz, js = checkpoint_paths(path)
    _refuse_pickles(npz)
    doc = _read_json(js, FORMAT)
    entries = doc.get("arrays")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{js} has no 'arrays' table; it is damaged")
    if doc.get("npz_sha256") != _sha256(npz):
        raise CheckpointError(
            f"{npz} does not match {js}: its sha256 differs from the one recorded there, so "
            "the two files come from different saves (or one was edited). Re-save the "
            "checkpoint, or restore the pair that belongs together.")
    arrays = {}
    with zipfile.ZipFile(npz) as zf:
        members = {m.removesuffix(".npy"): m for m in zf.namelist()}
        unlisted = sorted(members.keys() - entries.keys())
        if unlisted:
            raise CheckpointError(f"{npz} holds arrays {unlisted} that {js} does not list; "
                                  "the two files do not describe the same checkpoint")
        for name, entry in entries.items():
            if name not in members:
                raise CheckpointError(f"{js} lists array {name!r} but {npz} has no member "
                                      f"{name + '.npy'!r}; the checkpoint is incomplete")
            true_dtype = _dtype_named(entry.get("dtype"), js, name)
            stored_dtype = _dtype_named(entry.get("stored_as", entry.get("dtype")), js, name)
            if stored_dtype.itemsize != true_dtype.itemsize:
                raise CheckpointError(f"{js} says array {name!r} is {true_dtype.name} stored as "
                                      f"{stored_dtype.name}, which differ in width")
            with zf.open(members[name]) as fp:
                a = np.lib.format.read_array(fp, allow_pickle=False)
            if a.dtype != stored_dtype:
                raise CheckpointError(f"{js} says array {name!r} is stored as "
                                      f"{stored_dtype.name}, but {npz} holds {a.dtype}")
            if list(a.shape) != entry.get("shape"):
                raise CheckpointError(f"{js} says array {name!r} has shape "
                                      f"{entry.get('shape')}, but {npz} holds shape "
                                      f"{list(a.shape)}")
            arrays[name] = a.view(true_dtype) if true_dtype != stored_dtype else a
    return arrays, doc


def load_arrays(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Read path.npz and path.json -> (arrays, meta), with allow_pickle=False.

    Refused with a CheckpointError naming the file and the array: a file that needs a
    pickle (PickledCheckpointError), a missing file, a .npz and .json from different
    saves, an array whose shape or dtype differs from the JSON, a name in one file only.
    """
    arrays, doc = _load(path)
    return arrays, doc["meta"]


# ---- sharded checkpoints -------------------------------------------------------------
def shard_file_stem(rank: int) -> str:
    """rank -> 'rank{rank:05d}', the stem of that rank's .npz/.json."""
    return f"rank{rank:05d}"


def save_sharded(dirpath: PathLike, rank: int, world_size: int,
                 arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                 sharded: Optional[Mapping[str, Sequence[int]]] = None,
                 compress: bool = False) -> None:
    """This rank's part of a sharded checkpoint: dirpath/rank{r:05d}.npz/.json; rank 0 also
    writes dirpath/index.json (layout in the module docstring).

    sharded: name -> global shape, for each array that is a flat shard (1-D, the same
    number of elements on every rank, world_size of them covering the flattened global
    array plus end padding); every other array is replicated ("full"). Every rank passes
    the same `sharded`.
    """
    if not (isinstance(world_size, int) and world_size >= 1):
        raise CheckpointError(f"world_size must be an int >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise CheckpointError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    sharded = {k: [int(d) for d in v] for k, v in (sharded or {}).items()}
    unknown = sorted(sharded.keys() - arrays.keys())
    if unknown:
        raise CheckpointError(f"rank {rank}: {unknown} listed in `sharded` but not among the "
                              f"arrays {sorted(arrays)}")
    layout = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if name not in sharded:
            layout[name] = {"full": True, "global_shape": list(a.shape), "dtype": a.dtype.name}
            continue
        g = math.prod(sharded[name])
        if a.ndim != 1 or world_size * a.size < g:
            raise CheckpointError(
                f"rank {rank}: the flat shard of {name!r} has shape {list(a.shape)}; for a "
                f"global shape {sharded[name]} ({g} elements) over {world_size} ranks each "
                f"rank must hold a 1-D array of at least ceil({g}/{world_size}) = "
                f"{-(-g // world_size)} elements (the last ones padding)")
        layout[name] = {"axis": 0, "global_shape": sharded[name], "dtype": a.dtype.name,
                        "global_numel": g, "shard_numel": a.size,
                        "offsets": [r * a.size for r in range(world_size)],
                        "padding": world_size * a.size - g}
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    _save(d / shard_file_stem(rank), arrays, meta, compress,
          extra={"shard": {"rank": rank, "world_size": world_size, "sharded": sharded}})
    if rank == 0:
        index = {"format": SHARDED_FORMAT, "version": VERSION, "world_size": world_size,
                 "files": [shard_file_stem(r) for r in range(world_size)],
                 "arrays": layout, "meta": dict(meta)}
        body = _json_bytes(index, str(d / INDEX_NAME))
        _replace_all([(_temp_file(d / INDEX_NAME, lambda f: f.write(body)), d / INDEX_NAME)])


def load_sharded(dirpath: PathLike) -> tuple[list[dict[str, np.ndarray]], dict]:
    """Every rank's arrays, in rank order, and the index; each file checked against it."""
    d = Path(dirpath)
    index = _read_json(d / INDEX_NAME, SHARDED_FORMAT)
    W, layout = index.get("world_size"), index.get("arrays")
    if not (isinstance(W, int) and W >= 1 and isinstance(layout, dict)
            and index.get("files") == [shard_file_stem(r) for r in range(W)]):
        raise CheckpointError(f"{d / INDEX_NAME} is damaged: expected world_size >= 1, an "
                              "'arrays' table and files rank00000 .. rank{world_size-1}")
    for name, spec in layout.items():
        needs = ["global_shape", "dtype"]
        if not (isinstance(spec, dict) and spec.get("full")):
            needs += ["global_numel", "shard_numel", "offsets", "padding"]
        if not isinstance(spec, dict) or any(k not in spec for k in needs):
            raise CheckpointError(f"{d / INDEX_NAME}: the entry of array {name!r} is damaged; "
                                  f"expected the keys {needs}, got {spec!r}")
    flat_shapes = {name: spec["global_shape"] for name, spec in layout.items()
                   if not spec.get("full")}
    shards = []
    for r in range(W):
        arrays, doc = _load(d / shard_file_stem(r))
        file = checkpoint_paths(d / shard_file_stem(r))[1]
        info = doc.get("shard", {})
        if info.get("rank") != r or info.get("world_size") != W:
            raise CheckpointError(f"{file} was written by rank {info.get('rank')} of "
                                  f"{info.get('world_size')}, but the index expects rank {r} "
                                  f"of {W}; the directory mixes two saves")
        if info.get("sharded") != flat_shapes:
            raise CheckpointError(f"{file} was saved with sharded={info.get('sharded')}, rank 0 "
                                  f"with sharded={flat_shapes}; every rank must pass the same")
        if arrays.keys() != layout.keys():
            raise CheckpointError(f"{file} holds arrays {sorted(arrays)}, the index lists "
                                  f"{sorted(layout)}; every rank must save the same names")
        for name, spec in layout.items():
            a = arrays[name]
            want = spec["global_shape"] if spec.get("full") else [spec["shard_numel"]]
            if list(a.shape) != want or a.dtype.name != spec["dtype"]:
                raise CheckpointError(f"{file}: array {name!r} is {a.dtype.name} of shape "
                                      f"{list(a.shape)}, the index expects {spec['dtype']} of "
                                      f"shape {want}")
        shards.append(arrays)
    return shards, index


def consolidate(dirpath: PathLike) -> dict[str, np.ndarray]:
    """Full arrays from a sharded checkpoint: flat shards concatenated in rank order, their
    padding dropped, reshaped to the global shape; replicated arrays checked equal on every
    rank and taken from rank 0."""
    shards, index = load_sharded(dirpath)
    full = {}
    for name, spec in index["arrays"].items():
        if spec.get("full"):
            for r, s in enumerate(shards[1:], start=1):
                if s[name].tobytes() != shards[0][name].tobytes():
                    raise CheckpointError(
                        f"{Path(dirpath)}: replicated array {name!r} differs between rank 0 "
                        f"and rank {r}; a replicated array must be identical on every rank "
                        "(mark it as a flat shard in `sharded` if it is not replicated)")
            full[name] = shards[0][name]
        else:
            flat = np.concatenate([s[name] for s in shards])
            full[name] = flat[:spec["global_numel"]].reshape(spec["global_shape"])
    return full


def save_consolidated(path: PathLike, full_arrays: Mapping[str, np.ndarray],
                      meta: Mapping[str, Any], compress: bool = False) -> tuple[Path, Path]:
    """Save the full arrays `consolidate` returns as one checkpoint (= save_arrays)."""
    return save_arrays(path, full_arrays, meta, compress)
