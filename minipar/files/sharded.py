"""A sharded checkpoint: one file pair per rank, and an index.

A sharded checkpoint, `save_sharded(dirpath, rank, world_size, arrays, meta, sharded)`:
every rank writes dirpath/rank{r:05d}.npz/.json with the arrays it holds, and rank 0 also
writes dirpath/index.json:

    {"format": "minipar-sharded-checkpoint", "version": 1, "world_size": 3,
     "save_id": "step-100",
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

Every rank's own JSON also records its rank, the world size, the flat-sharded names and
the save's id, so a file from another save or another rank is caught. The ranks write
without talking to each other, so the id is the caller's: the same string on every rank
of one save (the step, a run id); with `save_id=None` a directory mixing two saves of the
same world size and shapes cannot be told apart. In a simulated run the ranks write
concurrently (each its own files); load only after every rank has saved (a barrier).
"""


from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .arrays import read_checkpoint, save_arrays, write_checkpoint
from .atomic import (PathLike, VERSION, check_writable_dir, checkpoint_paths, read_json, write_json)
from .errors import CheckpointError

SHARDED_FORMAT = "minipar-sharded-checkpoint"
INDEX_NAME = "index.json"


def shard_file_stem(rank: int) -> str:
    """rank -> 'rank{rank:05d}', the stem of that rank's .npz/.json."""
    return f"rank{rank:05d}"


def save_sharded(dirpath: PathLike, rank: int, world_size: int,
                 arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                 sharded: Optional[Mapping[str, Sequence[int]]] = None,
                 compress: bool = False, save_id: Optional[str] = None) -> None:
    """This rank's part of a sharded checkpoint: dirpath/rank{r:05d}.npz/.json; rank 0 also
    writes dirpath/index.json (layout in the module docstring).

    sharded: name -> global shape, for each array that is a flat shard (1-D, the same
    number of elements on every rank, world_size of them covering the flattened global
    array plus end padding); every other array is replicated ("full"). Every rank passes
    the same `sharded`. save_id: the same string on every rank of this save, recorded in
    every file and the index, so that loading refuses a directory mixing two saves.
    """
    if not (isinstance(world_size, int) and world_size >= 1):
        raise CheckpointError(f"world_size must be an int >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise CheckpointError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    if save_id is not None and not isinstance(save_id, str):
        raise CheckpointError(f"save_id must be a str (the same on every rank) or None, got "
                              f"{save_id!r}")
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays must be a dict of name -> np.ndarray, got "
                              f"{type(arrays).__name__}")
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
    check_writable_dir(d)
    d.mkdir(parents=True, exist_ok=True)
    write_checkpoint(d / shard_file_stem(rank), arrays, meta, compress,
          extra={"shard": {"rank": rank, "world_size": world_size, "sharded": sharded,
                           "save_id": save_id}})
    if rank == 0:
        index = {"format": SHARDED_FORMAT, "version": VERSION, "world_size": world_size,
                 "save_id": save_id, "files": [shard_file_stem(r) for r in range(world_size)],
                 "arrays": layout, "meta": dict(meta)}
        write_json(d / INDEX_NAME, index)


def load_sharded(dirpath: PathLike) -> tuple[list[dict[str, np.ndarray]], dict]:
    """Every rank's arrays, in rank order, and the index; each file checked against it."""
    d = Path(dirpath)
    index = read_json(d / INDEX_NAME, SHARDED_FORMAT)
    W, layout = _checked_index(index, d / INDEX_NAME)
    flat_shapes = {name: spec["global_shape"] for name, spec in layout.items()
                   if not spec.get("full")}
    shards = []
    for r in range(W):
        arrays, doc = read_checkpoint(d / shard_file_stem(r))
        file = checkpoint_paths(d / shard_file_stem(r))[1]
        info = doc.get("shard")
        info = info if isinstance(info, dict) else {}
        if info.get("save_id") != index.get("save_id"):
            raise CheckpointError(f"{file} belongs to save {info.get('save_id')!r}, but "
                                  f"{d / INDEX_NAME} to save {index.get('save_id')!r}: the "
                                  "directory mixes files of two saves. Save again, or restore "
                                  "the directory of one save")
        if info.get("rank") != r or info.get("world_size") != W:
            raise CheckpointError(f"{file} was written by rank {info.get('rank')} of "
                                  f"{info.get('world_size')}, but the index expects rank {r} "
                                  f"of {W}; the directory mixes two saves")
        if info.get("sharded") != flat_shapes:
            raise CheckpointError(f"{file} was saved with sharded={info.get('sharded')}, rank 0 "
                                  f"with sharded={flat_shapes}; every rank must pass the same (or "
                                  "the directory mixes files of two saves)")
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


def _is_shape(x: Any) -> bool:
    return isinstance(x, list) and all(type(d) is int and d >= 0 for d in x)


def _checked_index(index: dict, where: Path) -> tuple[int, dict]:
    """(world_size, the arrays table) of an index, every field used checked first."""
    W, layout, stems = index.get("world_size"), index.get("arrays"), index.get("files")
    if not (type(W) is int and W >= 1 and isinstance(layout, dict) and isinstance(stems, list)
            and len(stems) == W and stems == [shard_file_stem(r) for r in range(W)]):
        raise CheckpointError(f"{where} is damaged: expected world_size >= 1, an 'arrays' "
                              "table and files rank00000 .. rank{world_size-1}")
    if not isinstance(index.get("save_id"), (str, type(None))):
        raise CheckpointError(f"{where} is damaged: its save_id {index.get('save_id')!r} is "
                              "not a string")
    for name, spec in layout.items():
        needs = ["global_shape", "dtype"]
        if not (isinstance(spec, dict) and spec.get("full")):
            needs += ["global_numel", "shard_numel", "offsets", "padding"]
        if not isinstance(spec, dict) or any(k not in spec for k in needs):
            raise CheckpointError(f"{where}: the entry of array {name!r} is damaged; "
                                  f"expected the keys {needs}, got {spec!r}")
        ok = _is_shape(spec["global_shape"]) and isinstance(spec["dtype"], str)
        if ok and not spec.get("full"):
            n, g = spec["shard_numel"], spec["global_numel"]
            ok = (spec.get("axis") == 0 and type(n) is int and n >= 0
                  and g == math.prod(spec["global_shape"])
                  and spec["padding"] == W * n - g and W * n >= g
                  and spec["offsets"] == [r * n for r in range(W)])
        if not ok:
            raise CheckpointError(
                f"{where}: the entry of array {name!r} is damaged: {spec!r}; expected a "
                "global_shape of sizes >= 0 and a dtype name, and for a flat shard axis 0, "
                "global_numel = prod(global_shape), padding = world_size * shard_numel - "
                "global_numel >= 0 and offsets r * shard_numel")
    return W, layout


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
                        "(mark it as a flat shard in `sharded` if it is not replicated), "
                        "or the directory mixes files of two saves (pass save_id= to tell)")
            full[name] = shards[0][name]
        else:
            flat = np.concatenate([s[name] for s in shards])
            full[name] = flat[:spec["global_numel"]].reshape(spec["global_shape"])
    return full


def save_consolidated(path: PathLike, full_arrays: Mapping[str, np.ndarray],
                      meta: Mapping[str, Any], compress: bool = False) -> tuple[Path, Path]:
    """Save the full arrays `consolidate` returns as one checkpoint (= save_arrays)."""
    return save_arrays(path, full_arrays, meta, compress)
