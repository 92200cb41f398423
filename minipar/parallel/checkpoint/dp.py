"""Checkpoints of a data-parallel engine: each rank writes what it holds, and any engine
loads the result, whatever its ZeRO stage, sharding strategy or dp size.

The rule: a checkpoint holds the training state as NumPy arrays plus JSON, never a pickle
and loading it restores `full_state_dict()`
bit for bit, so training goes on exactly as if it had never stopped. Two forms:

    save_sharded(engine, dir)       every rank writes its own slices, no gather
                                    (torch.distributed.checkpoint's sharded state dict,
                                    DeepSpeed's per-rank zero_pp_rank_* files)
    save_consolidated(engine, path) one file of full named tensors, gathered and written
                                    by rank 0 (FSDP's FULL_STATE_DICT with rank0_only)
    load(engine, dir_or_path)       either form, into any engine (resharding)
    read_full_state(dir_or_path)    either form -> full named tensors, without an engine

The sharded form, per unit u (one FlatParameter: the unit's parameters end to end, padded
to a multiple of the dp size N; see flat.py), rank r writes flat[r*S:(r+1)*S], S = padded/N:

    "<u>/param"   the 16-bit (or float64) weights        [S]
    "<u>/master"  the float32 master (bf16 models only)  [S]
    "<u>/m", "<u>/v"  Adam's moments                      [S]
    "meta/step"   optimizer steps taken, 0-d int64, on every rank

through `minipar.files.save_sharded` (dir/rank{r:05d}.npz/.json, and dir/index.json
from rank 0, which records the padding). The index's metadata holds the layout, so the full
tensors come back with NumPy alone:

    "units": [{"name": "blocks.0", "numel": 510, "padded_numel": 512, "padding": 2,
               "shard_numel": 128, "params": [{"name": "blocks.0.ln1.weight",
                                               "offset": 0, "shape": [6]}, ...]}, ...]

    full flat of u  = concat over ranks of "<u>/<kind>", first `numel` elements
    tensor p        = flat[offset : offset + prod(shape)].reshape(shape)

What each engine writes, exactly what it holds, with no collective but a 16-byte
broadcast of the save's id and a closing barrier:

    DDP (NO_SHARD)       rank 0 alone, everything (one file, N = 1: no padding)
    ZeRO-1/2, ZeRO-3     every rank its shard r (ZeRO-1/2 hold the whole weights but write
                         only their shard: the other ranks write the rest)
    HYBRID_SHARD         the first replica group only (the others hold the same shards)

Every file of one save carries the same random `save_id`; a directory that mixes files of
two saves (a crash midway) is refused. Each save ends with a barrier, so a `load` right
after a save in the same program reads complete files.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ... import files
from ...files import CheckpointError
from ...runtime.collectives import barrier, broadcast
from ...runtime.context import current
from ..dp.ddp import DistributedDataParallel
from ..dp.engine import DataParallelEngine
from ..dp.flat import FlatParameter
from ..dp.sharded_optimizer import is_half
from ..dp.zero import ZeroEngine

KIND = "minipar-dp-checkpoint"  # meta["kind"] of both forms
PathLike = Union[str, os.PathLike]


# ---- which engine, and who writes ------------------------------------------------------
def _engine_of(engine) -> DataParallelEngine:
    """The engine itself, or the one a FullyShardedDataParallel wraps."""
    inner = getattr(engine, "engine", engine)
    if not isinstance(inner, DataParallelEngine):
        raise TypeError(f"expected a data-parallel engine (DistributedDataParallel, ZeroEngine, "
                        f"Zero3Engine, FullyShardedDataParallel), got {type(engine).__name__}")
    return inner


def _groups(e: DataParallelEngine) -> list:
    """Every group the engine's ranks span: the (shard) group, and the replicate group."""
    replicate = getattr(e, "replicate_group", None)
    return [e.group] + ([replicate] if replicate is not None and replicate.size > 1 else [])


def _writer(e: DataParallelEngine) -> Optional[tuple[int, int]]:
    """(this rank's file number, number of files), or None if this rank writes nothing."""
    me = current().rank
    if isinstance(e, DistributedDataParallel):
        return (0, 1) if e.group.group_rank(me) == 0 else None
    replicate = getattr(e, "replicate_group", None)
    if replicate is not None and replicate.group_rank(me) != 0:
        return None  # HYBRID_SHARD: the first replica's files already hold these shards
    return e.me, e.n


def _finish(e: DataParallelEngine) -> None:
    """Nobody leaves a save before every file of it is written."""
    for g in _groups(e):
        barrier(group=g)


def _meta(e: DataParallelEngine, form: str, units: list[dict], save_id: str) -> dict:
    kinds = ["m", "v"] + (["master"] if e.mixed_precision else [])
    replicas = [g.size for g in _groups(e)[1:]]
    return {"kind": KIND, "form": form, "save_id": save_id, "engine": type(e).__name__,
            "stage": e.stage, "dp": e.group.size, "replicas": replicas[0] if replicas else 1,
            "dtype": e.dtype.name, "step": e.steps, "state_kinds": kinds, "units": units}


# ---- the flat layout of each unit ------------------------------------------------------
def _layout(flat: FlatParameter, shapes: dict[str, tuple]) -> dict:
    """The JSON description of one unit's flat buffer (shapes: the full parameter shapes)."""
    return {"name": flat.unit, "numel": flat.numel, "padded_numel": flat.padded_numel,
            "padding": flat.padding, "shard_numel": flat.shard_numel,
            "params": [{"name": p.name, "offset": off, "shape": list(shapes[p.name])}
                       for p, off in zip(flat.params, flat.offsets)]}


def _own_slices(e: DataParallelEngine) -> tuple[list[FlatParameter], dict[str, np.ndarray]]:
    """The unit layouts, and the arrays this rank writes: {"<unit>/<kind>": [S]}."""
    arrays: dict[str, np.ndarray] = {}
    if isinstance(e, DistributedDataParallel):  # every parameter whole, one piece each
        state = {piece.key: e.optimizer.state_arrays(i)
                 for i, piece in enumerate(e.optimizer.pieces)}
        flats = [FlatParameter(unit, ps, 1) for unit, ps in e.units]
        for flat in flats:
            arrays[f"{flat.unit}/param"] = flat.flatten()
            for kind in state[flat.params[0].name]:
                arrays[f"{flat.unit}/{kind}"] = np.concatenate(
                    [state[p.name][kind] for p in flat.params])
        return flats, arrays
    assert isinstance(e, ZeroEngine)
    flats = []
    for i, u in enumerate(e.state.values()):  # the optimizer's pieces follow the units
        flats.append(u.flat)
        weights = u.param_shard if e.stage == 3 else u.param[u.lo:u.hi]
        arrays[f"{u.name}/param"] = weights
        for kind, arr in e.optimizer.state_arrays(i).items():
            arrays[f"{u.name}/{kind}"] = arr
    return flats, arrays


def _new_save_id(e: DataParallelEngine) -> str:
    """A random id, the same on every rank of the (shard) group: rank 0's, broadcast."""
    mine = np.frombuffer(uuid.uuid4().bytes, dtype=np.uint8)  # [16]
    if e.group.size > 1 and not isinstance(e, DistributedDataParallel):
        mine = broadcast(mine, src=e.group.ranks[0], group=e.group)
    return bytes(mine).hex()


# ---- saving ------------------------------------------------------------------------------
def save_sharded(engine, dirpath: PathLike) -> None:
    """Every rank of the engine calls this (inside `launch`): each writes the slices of the
    flat weights, master, m and v it owns to dirpath/rank{r:05d}.npz/.json, rank 0 also
    dirpath/index.json with the layout (see the module docstring). DDP: rank 0 writes all.
    """
    e = _engine_of(engine)
    save_id = _new_save_id(e)
    who = _writer(e)
    if who is not None:
        r, world = who
        flats, arrays = _own_slices(e)
        units = [_layout(f, e.param_shapes) for f in flats]
        arrays["meta/step"] = np.array(e.steps, dtype=np.int64)
        sharded = {name: [f.numel] for f in flats for name in arrays
                   if name.startswith(f"{f.unit}/")}
        files.save_sharded(dirpath, r, world, arrays, _meta(e, "sharded", units, save_id),
                           sharded)
    _finish(e)


def save_consolidated(engine, path: PathLike) -> None:
    """Every rank calls this: the full state is gathered (`full_state_dict`, a collective)
    and rank 0 writes it to path.npz/.json, in full_state_dict's layout:

        "param/<name>"  (float32 for bf16 models), "optim/<name>.m", ".v", ".master",
        "meta/step"
    """
    e = _engine_of(engine)
    sd = e.full_state_dict()
    if current().rank == e.group.ranks[0] and _writer(e) is not None:
        files.save_arrays(path, sd, _meta(e, "consolidated", [], uuid.uuid4().hex))
    _finish(e)


# ---- reading -----------------------------------------------------------------------------
def read_full_state(path_or_dir: PathLike) -> dict[str, np.ndarray]:
    """Either form -> {"param/<name>", "optim/<name>.<kind>", "meta/step": full arrays},
    exactly what `full_state_dict()` returned when it was saved. Needs no engine."""
    return _read(path_or_dir)[0]


def _read(path_or_dir: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(the full state, the checkpoint's metadata), from either form."""
    d = Path(path_or_dir)
    if (d / files.INDEX_NAME).is_file():
        return _read_sharded(d)
    npz, js = files.checkpoint_paths(path_or_dir)
    if js.is_file() or npz.is_file():
        arrays, meta = files.load_arrays(path_or_dir)
        _check_kind(meta, js, "consolidated")
        return arrays, meta
    raise CheckpointError(
        f"{path_or_dir} is neither a sharded checkpoint (a directory with "
        f"{files.INDEX_NAME}) nor a consolidated one ({npz.name} and {js.name}); pass what "
        "save_sharded or save_consolidated was given")


def _check_kind(meta: Any, where: Path, form: str) -> None:
    if not isinstance(meta, dict) or meta.get("kind") != KIND or meta.get("form") != form:
        got = meta.get("kind") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"{where} is a minipar checkpoint but not a data-parallel {form} one (its meta "
            f"has kind {got!r}, expected {KIND!r} with form {form!r}); write it with "
            f"minipar.parallel.checkpoint.save_{form}")


def _read_sharded(d: Path) -> tuple[dict[str, np.ndarray], dict]:
    full = files.consolidate(d)  # every file checked; flat shards joined, padding dropped
    index = json.loads((d / files.INDEX_NAME).read_text())
    meta = index.get("meta")
    _check_kind(meta, d / files.INDEX_NAME, "sharded")
    for r in range(index["world_size"]):  # one save, not the files of two
        js = files.checkpoint_paths(d / files.shard_file_stem(r))[1]
        theirs = json.loads(js.read_text()).get("meta", {}).get("save_id")
        if theirs != meta["save_id"]:
            raise CheckpointError(
                f"{js} belongs to save {theirs!r}, but {d / files.INDEX_NAME} to save "
                f"{meta['save_id']!r}: the directory mixes files of two saves (one was "
                "interrupted). Save again, or restore the directory of one save")
    out: dict[str, np.ndarray] = {}
    for unit in meta["units"]:
        for kind in ["param"] + list(meta["state_kinds"]):
            flat = full.get(f"{unit['name']}/{kind}")
            if flat is None or flat.shape != (unit["numel"],):
                raise CheckpointError(f"{d}: the layout lists unit {unit['name']!r}, but its "
                                      f"{kind!r} buffer is missing or not [{unit['numel']}]")
            for p, view in _split(unit, flat, d):
                key = f"param/{p}" if kind == "param" else f"optim/{p}.{kind}"
                out[key] = view.astype(np.float32) if is_half(view.dtype) else view.copy()
    out["meta/step"] = full["meta/step"]
    return out, meta


def _split(unit: dict, flat: np.ndarray, d: Path):
    """(parameter name, its tensor) for each parameter the layout puts in `flat`, checking
    that the parameters tile [0, numel) end to end, in order."""
    at = 0
    for p in unit["params"]:
        n = math.prod(p["shape"])
        if p["offset"] != at or at + n > unit["numel"]:
            raise CheckpointError(
                f"{d}: in unit {unit['name']!r}, {p['name']} is placed at offset "
                f"{p['offset']} with {n} elements; expected offset {at} and an end within "
                f"{unit['numel']}. The index's layout is damaged")
        yield p["name"], flat[at:at + n].reshape(p["shape"])
        at += n
    if at != unit["numel"]:
        raise CheckpointError(f"{d}: the parameters of unit {unit['name']!r} cover {at} of "
                              f"its {unit['numel']} elements; the index's layout is damaged")


# ---- loading -----------------------------------------------------------------------------
def load(engine, path_or_dir: PathLike) -> None:
    """Restore a checkpoint of either form into `engine`, on every rank: weights, float32
    masters, Adam's m and v and the step count, bit for bit, whatever engine, stage,
    sharding strategy or dp size wrote it. Reads files only (no communication)."""
    e = _engine_of(engine)
    sd, meta = _read(path_or_dir)
    if meta.get("dtype") != e.dtype.name:
        raise CheckpointError(
            f"{path_or_dir} was trained in {meta.get('dtype')} (weights, and float32 masters "
            f"for 16-bit models), but this engine trains in {e.dtype.name}; build the model "
            f"in the checkpoint's dtype: GPTConfig(dtype={meta.get('dtype')!r})")
    e.load_full_state_dict(sd)
