"""Paths and atomic writes of checkpoint files, and their JSON documents.

A file is written to a temporary file beside its target and moved into place with
os.replace, so a crash leaves the old file or the new one under the target's name, never a
half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Sequence, Union

import numpy as np

from .errors import CheckpointError

VERSION = 1
PathLike = Union[str, os.PathLike]


def checkpoint_paths(path: PathLike) -> tuple[Path, Path]:
    """path -> (path.npz, path.json); a trailing .npz or .json on `path` is dropped first."""
    p = Path(path)
    if p.suffix in (".npz", ".json"):
        p = p.with_suffix("")
    return p.parent / (p.name + ".npz"), p.parent / (p.name + ".json")


def check_writable(*targets: Path) -> None:
    """Refuse, before anything is written, a target that is a directory, under a parent
    that is a file, or in a directory this process may not write; parents that do not exist
    yet are created by the save."""
    for target in targets:
        if target.is_dir():
            raise CheckpointError(f"cannot save {target}: it is a directory, and a checkpoint "
                                  "file goes there; pass another path or remove the directory")
        parent = target.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise CheckpointError(f"cannot save {target}: {parent} is a file, not a directory; "
                                  "pass a path whose parents are directories (or do not exist)")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CheckpointError(f"cannot save {target}: this process may not write in "
                                  f"{parent}; pass a path in a writable directory")


def check_writable_dir(d: Path) -> None:
    """Refuse, before anything is written, a directory path that is a file (or lies under one)."""
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"cannot save a sharded checkpoint into {d}: it is a file, and "
                              "a sharded checkpoint is a directory; pass another path or "
                              "remove the file")
    check_writable(d / "index.json")


def temp_file(target: Path, write: Callable[[IO[bytes]], None]) -> Path:
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


def replace_all(moves: Sequence[tuple[Path, Path]]) -> None:
    """os.replace each (temporary, target) in order; on failure remove the temporaries left."""
    try:
        for tmp, target in moves:
            os.replace(tmp, target)
    finally:
        for tmp, _ in moves:
            if tmp.exists():
                tmp.unlink()


def sha256(file: Path) -> str:
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


def json_bytes(doc: dict, what: str) -> bytes:
    try:
        return json.dumps(doc, indent=1, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the metadata of {what} cannot be written as JSON: {e}. "
                              "Use dicts, lists, str, int, float, bool and None.") from None


def read_json(file: Path, expected_format: str) -> dict:
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {file} does not exist; expected it beside "
                              "the arrays, written by minipar.files")
    try:
        doc = json.loads(file.read_bytes())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint file {file} is not valid JSON ({e}); it is damaged "
                              "or not a minipar checkpoint") from None
    if not isinstance(doc, dict) or doc.get("format") != expected_format:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(f"{file} has format {got!r}, expected {expected_format!r}")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{file} has format version {doc.get('version')!r}; this "
                              f"minipar reads version {VERSION}")
    return doc


def write_json(path: Path, doc: dict) -> None:
    """doc -> path atomically: JSON in a temporary file beside it, fsynced, then os.replace."""
    body = json_bytes(doc, str(path))
    replace_all([(temp_file(path, lambda f: f.write(body)), path)])
