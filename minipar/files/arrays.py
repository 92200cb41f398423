"""One checkpoint file pair: NumPy arrays in .npz, their description and metadata in JSON.

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
"""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path
from typing import IO, Any, Mapping, Optional

import ml_dtypes
import numpy as np

from .atomic import (PathLike, VERSION, checkpoint_paths, json_bytes, read_json, replace_all,
                     sha256, temp_file)
from .errors import CheckpointError, PickledCheckpointError

FORMAT = "minipar-checkpoint"

# The ml_dtypes types this version of ml_dtypes has, by name: stored as their bit patterns.
_ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in (
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",
    "float6_e3m2fn", "float4_e2m1fn", "int2", "int4", "uint2", "uint4",
) if hasattr(ml_dtypes, name)}
_NATIVE_KINDS = "biufc"  # bool, signed int, unsigned int, float, complex



def _pickle_refusal(file: Path, what: str) -> PickledCheckpointError:
    return PickledCheckpointError(
        f"checkpoint {file} holds a pickled object ({what}); minipar checkpoints never "
        "unpickle, because unpickling can run arbitrary code. Re-save it with "
        "minipar.files.save_arrays, from numeric arrays (put strings and other small "
        "values in `meta`).")


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
def write_checkpoint(path: PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
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

    tmp_npz = temp_file(npz, write_npz)
    try:
        doc = {"format": FORMAT, "version": VERSION, "npz": npz.name,
               "npz_sha256": sha256(tmp_npz), "arrays": entries, **(extra or {}),
               "meta": dict(meta)}
        body = json_bytes(doc, str(js))
        tmp_js = temp_file(js, lambda f: f.write(body))
    except BaseException:
        tmp_npz.unlink()
        raise
    replace_all([(tmp_npz, npz), (tmp_js, js)])
    return npz, js


def save_arrays(path: PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                compress: bool = False) -> tuple[Path, Path]:
    """Write arrays to path.npz and their description plus `meta` to path.json, atomically.

    arrays: name -> array of a numeric NumPy dtype or an ml_dtypes type (any shape, 0-d
    included); meta: JSON-serializable dict (NumPy scalars are converted).
    Returns the two paths written.
    """
    return write_checkpoint(path, arrays, meta, compress)


# Reads take turns. In a simulated run the ranks are threads of one process, and NumPy
# parses each .npy header with ast.literal_eval, whose recursion depth CPython 3.11 counts
# per interpreter rather than per thread (gh-106905): concurrent reads can fail with a
# spurious "AST constructor recursion depth mismatch". Reading is file work, not simulated
# time, so serialising it costs the simulation nothing.
_READING = threading.Lock()


def read_checkpoint(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and the whole JSON document of one checkpoint, every check applied."""
    with _READING:
        return _read_checkpoint(path)


def _read_checkpoint(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    npz, js = checkpoint_paths(path)
    _refuse_pickles(npz)
    doc = read_json(js, FORMAT)
    entries = doc.get("arrays")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{js} has no 'arrays' table; it is damaged")
    if doc.get("npz_sha256") != sha256(npz):
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
    arrays, doc = read_checkpoint(path)
    return arrays, doc["meta"]
