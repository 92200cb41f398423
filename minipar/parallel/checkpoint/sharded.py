"""The sharded form: every rank that holds unique state writes it; nothing is gathered.

(torch.distributed.checkpoint's sharded state dict; DeepSpeed's zero_pp_rank_* files and
Megatron's mp_rank_* directories, in one directory.) A save into `dir` writes

    dir/rank{n:05d}.npz/.json   one pair per writing rank, n = its file number (layout.py);
                                its JSON's meta holds the coordinate and the save's id
    dir/index.json              last, by the writer of file 0, once every file is written

Each file holds, per unit u, this rank's shard of u's flat buffers (flat.py), and the step:

    "<u>/param"       the weights, in the model's dtype (bfloat16 stays bfloat16)   [S]
    "<u>/m", "<u>/v"  Adam's moments; "<u>/master" the float32 masters (16-bit)     [S]
    "meta/step"       optimizer steps taken, 0-d int64

Who writes: one rank per coordinate (pp, tp, dp_shard), the first of the ranks that hold
the same shards. DDP: its group's first rank (per tp rank); ZeRO-1/2/3 and FSDP: every
rank of the first replica (ZeRO-1/2 hold the whole weights but write only their shard);
HYBRID_SHARD: the first replicate group. The only communication: a 16-byte broadcast of
the save's random id, and barriers; over the world when the model is split (tp > 1).
Under a pipeline (pp > 1) each pipeline coordinate's files hold other units, so every
rank's description of its units, parameters and arrays is gathered to the index's writer
(gather.py: a few kilobytes of JSON, no parameter). A rank whose stages hold no parameter
writes a file with the step only.

index.json:

    {"format": "minipar-layout-checkpoint", "version": 1, "world_size": 4,   # files
     "files": [{"file": "rank00000", "coordinate": {"pp": 0, "tp": 0, "dp_shard": 0}}, ...],
     "arrays": {"root/param": {"shape": [S], "dtype": "float64", "over": "dp_shard",
                               "shard_numel": S, "padding": 2, "pp": 0}, ...},
                # in every file at that pipeline coordinate
     "meta": {"kind": ..., "save_id": ..., "mesh": {"pp": 1, "tp": 2, "dp_shard": 2,
              "dp_replicate": 1}, "units": [...], "params": {...}, "config": {...}, ...}}

with meta's "units" and "params" as in layout.py. Every file of one save carries the same
save id; a directory mixing files of two saves (a crash midway) is refused, as is a file
whose coordinate, arrays or step disagree with the index.
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
from ...runtime.faults import fault_point
from ..dp.sharded_optimizer import is_half
from .gather import gather_to_first
from .layout import (KIND, RankLayout, assemble, describe, describe_params, describe_units,
                     file_coordinates, rank_layout, unwrap)
from .metadata import check_meta, check_table

FORMAT = "minipar-layout-checkpoint"
VERSION = 1
PathLike = Union[str, os.PathLike]


def save_sharded(engine, dirpath: PathLike, groups=None) -> None:
    """Every rank calls this (inside `launch`); each rank holding unique state writes it to
    dirpath/rank{n:05d}.npz/.json, and the writer of file 0 writes dirpath/index.json.

    engine: a data-parallel engine, a FullyShardedDataParallel, or parallelize's run;
    groups: the run's ParallelGroups (taken from a run), checked against the parameters.
    """
    e, groups = unwrap(engine, groups)
    d = Path(dirpath)
    files.check_writable_dir(d)  # on every rank, before any collective: all refuse alike
    layout = rank_layout(e, groups)
    save_id = _new_save_id(layout)
    arrays = {f"{s.flat.unit}/{kind}": a for s in layout.state.units
              for kind, a in s.arrays.items()}
    arrays["meta/step"] = np.array(layout.state.step, dtype=np.int64)
    stages = _gather_stages(layout, arrays) if layout.sizes["pp"] > 1 else None
    if layout.writes:
        d.mkdir(parents=True, exist_ok=True)
        files.save_arrays(d / files.shard_file_stem(layout.file_number), arrays,
                          {"kind": KIND, "form": "sharded", "save_id": save_id,
                           "coordinate": layout.coordinate})
    fault_point("save")  # a fault planned here: files written, the index never (faults.py)
    _barrier(layout)  # every file is written: the index may now point at them
    if layout.writes and layout.file_number == 0:
        files.write_json(d / files.INDEX_NAME, _index(layout, e, save_id, arrays, stages))
    _barrier(layout)  # nobody leaves before the index exists (a load may follow)


def _new_save_id(layout: RankLayout) -> str:
    """A random id, the same on every writing rank: the first rank's, broadcast."""
    mine = np.frombuffer(uuid.uuid4().bytes, dtype=np.uint8)  # [16]
    group = current().world if layout.split else layout.state.shard_group
    if group is not None and group.size > 1:
        mine = broadcast(mine, src=group.ranks[0], group=group)
    return bytes(mine).hex()


def _barrier(layout: RankLayout) -> None:
    for g in layout.groups():
        barrier(group=g)


def _table(layout: RankLayout) -> dict[str, dict[str, Any]]:
    """The arrays of this rank's file, by name (the step's entry apart)."""
    table: dict[str, dict[str, Any]] = {}
    for s in layout.state.units:
        for kind, a in s.arrays.items():
            table[f"{s.flat.unit}/{kind}"] = {
                "shape": list(a.shape), "dtype": a.dtype.name, "over": "dp_shard",
                "shard_numel": s.flat.shard_numel, "padding": s.flat.padding,
                "pp": layout.coordinate["pp"]}
    return table


def _gather_stages(layout: RankLayout, arrays: dict) -> Optional[tuple[list, dict, dict]]:
    """(units, params, arrays table) of every pipeline coordinate, on world rank 0 (the
    index's writer; None elsewhere): each writer's description, the first per unit."""
    mine = ({"units": describe_units(layout), "params": describe_params(layout),
             "table": _table(layout)} if layout.writes else None)
    got = gather_to_first(mine, {}, current().world)
    if got is None:
        return None
    units: dict[str, dict] = {}
    params: dict[str, dict] = {}
    table: dict[str, dict] = {}
    for meta, _ in got:
        if meta is not None:
            for u in meta["units"]:
                units.setdefault(u["name"], u)
            params.update(meta["params"])
            table.update(meta["table"])
    return list(units.values()), params, table


def _index(layout: RankLayout, engine, save_id: str, arrays: dict[str, np.ndarray],
           stages: Optional[tuple[list, dict, dict]]) -> dict:
    units, params, table = stages if stages is not None else (None, None, _table(layout))
    table["meta/step"] = {"shape": [], "dtype": "int64"}
    coords = file_coordinates(layout.sizes)
    return {"format": FORMAT, "version": VERSION, "world_size": len(coords),
            "files": [{"file": files.shard_file_stem(n), "coordinate": c}
                      for n, c in enumerate(coords)],
            "arrays": table,
            "meta": describe(layout, engine, "sharded", save_id, units, params)}


# ---- reading ---------------------------------------------------------------------------
def read_sharded(d: Path) -> tuple[dict[str, np.ndarray], dict]:
    """(the full state, in full_state_dict's keys and the single-device shapes, and the
    checkpoint's metadata) from a sharded checkpoint directory; every file checked."""
    index = _read_index(d)
    meta = index["meta"]
    pieces: list[dict[str, np.ndarray]] = []
    for t in range(meta["mesh"]["tp"]):
        piece: dict[str, np.ndarray] = {}
        for k in range(meta["mesh"]["pp"]):  # each pipeline coordinate: its units
            mine = [(f, f["coordinate"]["dp_shard"]) for f in index["files"]
                    if f["coordinate"]["tp"] == t and f["coordinate"]["pp"] == k]
            shards = [_read_file(d, f, index) for f, _ in sorted(mine, key=lambda x: x[1])]
            units = [u for u in meta["units"] if u.get("pp", 0) == k]
            for key, a in _unflatten(shards, units, meta, d).items():
                if key in piece and (a.shape != piece[key].shape
                                     or a.tobytes() != piece[key].tobytes()):
                    raise CheckpointError(
                        f"{d}: {key} is held at two pipeline coordinates (a tied embedding "
                        f"on the first and the last stage), and pp = {k}'s copy differs "
                        "from the earlier one; the copies drifted apart, there is no one "
                        "value to load")
                piece[key] = a
        pieces.append(piece)
    out = assemble(pieces, meta["params"], list(meta["state_kinds"]), d)
    for key, a in out.items():
        out[key] = a.astype(np.float32) if is_half(a.dtype) else a
    out["meta/step"] = np.array(meta["step"], dtype=np.int64)
    return out, meta


def _read_index(d: Path) -> dict:
    """index.json, every field checked before use: the metadata, the mesh, one file per
    coordinate, the arrays table, units (each at a pipeline coordinate of the mesh) that
    hold the listed parameters."""
    where = d / files.INDEX_NAME
    try:
        index = json.loads(where.read_bytes())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where} is not valid JSON ({e}); it is damaged") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise CheckpointError(f"{where} has format {got!r}, expected {FORMAT!r}: write it "
                              "with minipar.parallel.checkpoint.save_sharded")
    if index.get("version") != VERSION:
        raise CheckpointError(f"{where} has version {index.get('version')!r}; this minipar "
                              f"reads version {VERSION}")
    meta = check_meta(index.get("meta"), where, "sharded")
    mesh = meta["mesh"]
    listed = index.get("files")
    count = mesh["pp"] * mesh["tp"] * mesh["dp_shard"]
    if not (isinstance(listed, list) and len(listed) == count == index.get("world_size")
            and listed == [{"file": files.shard_file_stem(n), "coordinate": c}
                           for n, c in enumerate(file_coordinates(mesh))]):
        raise CheckpointError(f"{where} is damaged: expected world_size, an 'arrays' table "
                              f"and one file per coordinate of the mesh {mesh}, numbered in "
                              "(pp, tp, dp_shard) order")
    check_table(index.get("arrays"), where)
    outside = [u["name"] for u in meta["units"] if not 0 <= u.get("pp", 0) < mesh["pp"]]
    outside += [n for n, spec in index["arrays"].items()
                if not 0 <= spec.get("pp", 0) < mesh["pp"]]
    if outside:
        raise CheckpointError(f"{where} is damaged: {outside[:4]} are placed at pipeline "
                              f"coordinates outside the mesh's pp = {mesh['pp']}")
    in_units = {p["name"] for u in meta["units"] for p in u["params"]}
    if in_units != set(meta["params"]):
        raise CheckpointError(f"{where} is damaged: its units hold the parameters "
                              f"{sorted(in_units)[:4]}..., its params table lists "
                              f"{sorted(meta['params'])[:4]}...; they must be the same")
    return index


def _read_file(d: Path, entry: dict, index: dict) -> dict[str, np.ndarray]:
    """One rank's arrays, checked against the index: same save, coordinate, names, shapes."""
    arrays, fmeta = files.load_arrays(d / entry["file"])  # no pickles; .npz matches .json
    js = files.checkpoint_paths(d / entry["file"])[1]
    ours, theirs = index["meta"]["save_id"], fmeta.get("save_id")
    if theirs != ours:
        raise CheckpointError(
            f"{js} belongs to save {theirs!r}, but {d / files.INDEX_NAME} to save {ours!r}: "
            "the directory mixes files of two saves (one was interrupted). Save again, or "
            "restore the directory of one save")
    if fmeta.get("coordinate") != entry["coordinate"]:
        raise CheckpointError(f"{js} was written at coordinate {fmeta.get('coordinate')}, but "
                              f"the index lists {entry['coordinate']} for it; files were "
                              "renamed or moved. Restore the names the save gave them")
    pp = entry["coordinate"]["pp"]
    table = {n: spec for n, spec in index["arrays"].items()
             if n == "meta/step" or spec.get("pp", 0) == pp}
    if arrays.keys() != table.keys():
        raise CheckpointError(f"{js} holds arrays {sorted(arrays)}, the index lists "
                              f"{sorted(table)} at pp = {pp}; every file of a pipeline "
                              "coordinate holds the same names")
    for name, spec in table.items():
        a = arrays[name]
        if list(a.shape) != spec.get("shape") or a.dtype.name != spec.get("dtype"):
            raise CheckpointError(f"{js}: array {name!r} is {a.dtype.name} {list(a.shape)}, "
                                  f"the index expects {spec.get('dtype')} {spec.get('shape')}")
    if int(arrays["meta/step"]) != index["meta"]["step"]:
        raise CheckpointError(f"{js} was saved at step {int(arrays['meta/step'])}, the index at "
                              f"step {index['meta']['step']}; the directory mixes two saves")
    return arrays


def _unflatten(shards: list[dict[str, np.ndarray]], units: list[dict], meta: dict, d: Path
               ) -> dict[str, np.ndarray]:
    """The dp_shard files of one (pp, tp) piece, holding `units` -> {full_state_dict key:
    tensor}."""
    out = {}
    for unit in units:
        for kind in ["param"] + list(meta["state_kinds"]):
            array = f"{unit['name']}/{kind}"
            if array not in shards[0]:
                raise CheckpointError(f"{d}: the layout lists unit {unit['name']!r}, but the "
                                      f"files hold no {array!r}; the index is damaged")
            flat = np.concatenate([s[array] for s in shards])
            if flat.shape[0] < unit["numel"]:
                raise CheckpointError(f"{d}: unit {unit['name']!r} has {unit['numel']} "
                                      f"elements, but its {kind!r} shards hold {flat.shape[0]}")
            for name, view in _split(unit, flat[:unit["numel"]], d):
                key = f"param/{name}" if kind == "param" else f"optim/{name}.{kind}"
                out[key] = view.copy()
    return out


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
