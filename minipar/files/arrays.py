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
  - Reading trusts nothing (npz.py): each member's header is checked against its size in
    the zip and the zip's sizes against the file's before any data is read, then the .npz
    against the sha256 and each header against its JSON entry; a damaged member is named
    with its file and array. Saving refuses a target that is a directory, or lies under a
    file or an unwritable directory, before writing anything.
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

from .atomic import (PathLike, VERSION, check_writable, checkpoint_paths, json_bytes,
                     read_json, replace_all, sha256, temp_file)
from .errors import CheckpointError
from .npz import members, open_npz, read_member, refuse_non_zip

FORMAT = "minipar-checkpoint"

# The ml_dtypes types this version of ml_dtypes has, by name: stored as their bit patterns.
_ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in (
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",
    "float6_e3m2fn", "float4_e2m1fn", "int2", "int4", "uint2", "uint4",
) if hasattr(ml_dtypes, name)}
_NATIVE_KINDS = "biufc"  # bool, signed int, unsigned int, float, complex



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
    check_writable(npz, js)
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
    refuse_non_zip(npz)
    with open_npz(npz) as zf:
        found = members(zf, npz)  # headers only: pickles refused, sizes checked
        doc = read_json(js, FORMAT)
        entries = doc.get("arrays")
        if not isinstance(entries, dict) or not isinstance(doc.get("meta"), dict):
            raise CheckpointError(f"{js} has no 'arrays' or 'meta' table; it is damaged")
        if doc.get("npz_sha256") != sha256(npz):
            raise CheckpointError(
                f"{npz} does not match {js}: its sha256 differs from the one recorded there, "
                "so the two files come from different saves (or one was edited). Re-save the "
                "checkpoint, or restore the pair that belongs together.")
        unlisted = sorted(found.keys() - entries.keys())
        if unlisted:
            raise CheckpointError(f"{npz} holds arrays {unlisted} that {js} does not list; "
                                  "the two files do not describe the same checkpoint")
        views = {name: _checked_entry(name, entry, found, npz, js)
                 for name, entry in entries.items()}
        # every header agrees with the JSON: only now is any array data read
        arrays = {}
        for name, true_dtype in views.items():
            a = read_member(zf, found[name], npz)
            arrays[name] = a.view(true_dtype) if true_dtype != a.dtype else a
        return arrays, doc


def _checked_entry(name: str, entry: Any, found: dict, npz: Path, js: Path) -> np.dtype:
    """The true dtype of array `name`, once its JSON entry agrees with the member's header."""
    if name not in found:
        raise CheckpointError(f"{js} lists array {name!r} but {npz} has no member "
                              f"{name + '.npy'!r}; the checkpoint is incomplete")
    if not isinstance(entry, dict):
        raise CheckpointError(f"{js}: the entry of array {name!r} is {entry!r}, expected "
                              "{'shape': [...], 'dtype': ...}; it is damaged")
    true_dtype = _dtype_named(entry.get("dtype"), js, name)
    stored_dtype = _dtype_named(entry.get("stored_as", entry.get("dtype")), js, name)
    if stored_dtype.itemsize != true_dtype.itemsize:
        raise CheckpointError(f"{js} says array {name!r} is {true_dtype.name} stored as "
                              f"{stored_dtype.name}, which differ in width")
    m = found[name]
    if m.dtype != stored_dtype:
        raise CheckpointError(f"{js} says array {name!r} is stored as {stored_dtype.name}, "
                              f"but {npz} holds {m.dtype}")
    if list(m.shape) != entry.get("shape"):
        raise CheckpointError(f"{js} says array {name!r} has shape {entry.get('shape')}, "
                              f"but {npz} holds shape {list(m.shape)}")
    return true_dtype


def load_arrays(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Read path.npz and path.json -> (arrays, meta), with allow_pickle=False.

    Refused with a CheckpointError naming the file and the array: a file that needs a
    pickle (PickledCheckpointError), a missing file, a .npz and .json from different
    saves, an array whose shape or dtype differs from the JSON, a name in one file only.
    """
    arrays, doc = read_checkpoint(path)
    return arrays, doc["meta"]
