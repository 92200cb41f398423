"""The consolidated form: one file of the single-device model's full named tensors.

(FSDP's FULL_STATE_DICT with rank0_only; Megatron's checkpoint conversion to one rank.)

    save_consolidated(engine, path)    path.npz / path.json, written by world rank 0

in full_state_dict's keys, at the single-device shapes:

    "param/<name>"  (float32 for bf16 models), "optim/<name>.m", ".v", ".master",
    "meta/step"

The data-parallel gather is `full_state_dict()` (a collective over the engine's groups).
A model split across tensor-parallel ranks or pipeline stages is then gathered to world
rank 0 (gather.py, bytes for bytes), which takes the union of the stages' tensors (a tied
wte held by the first and the last stage once, both copies checked equal) and joins the
tp pieces along each parameter's partition_dim (layout.assemble): every rank sends its
piece, so world_size x (the state / (tp x pp)) elements arrive at rank 0 — simple, not
frugal.
"""

from __future__ import annotations

import os
import uuid
from typing import Union

import numpy as np

from ... import files
from ...files import CheckpointError
from ...runtime.collectives import barrier
from ...runtime.context import current
from .gather import gather_to_first
from .layout import RankLayout, assemble, describe, describe_params, rank_layout, unwrap
from .metadata import check_meta

PathLike = Union[str, os.PathLike]


def save_consolidated(engine, path: PathLike, groups=None) -> None:
    """Every rank calls this: the full state is gathered and the first rank writes it to
    path.npz/.json (engine, groups: as in save_sharded)."""
    e, groups = unwrap(engine, groups)
    files.check_writable(*files.checkpoint_paths(path))  # every rank, before any collective
    layout = rank_layout(e, groups)
    sd = e.full_state_dict()  # full over dp; this rank's piece under tensor parallelism
    params = None  # every parameter's full shape and split (gathered when the model is)
    if layout.split:  # world rank 0: the full tensors; others: None
        sd, params = _gather_pieces(sd, layout)
    if layout.writes and layout.file_number == 0:
        files.save_arrays(path, sd, describe(layout, e, "consolidated", uuid.uuid4().hex,
                                             params=params))
    for g in layout.groups():  # nobody leaves before the file is written
        barrier(group=g)


def _gather_pieces(sd: dict[str, np.ndarray], layout: RankLayout):
    """Every rank's piece (its full_state_dict) -> (the full tensors, every parameter's
    description) on world rank 0, (None, None) elsewhere."""
    c = layout.coordinate
    mine = {"pp": c["pp"], "tp": c["tp"], "params": describe_params(layout)}
    got = gather_to_first(mine, {k: a for k, a in sd.items() if k != "meta/step"},
                          current().world)
    if got is None:
        return None, None
    pieces: list[dict[str, np.ndarray]] = [{} for _ in range(layout.sizes["tp"])]
    params: dict[str, dict] = {}
    done = set()  # (pp, tp): the first rank of each piece (dp replicas hold the same)
    for meta, arrays in got:
        if (meta["pp"], meta["tp"]) in done:
            continue
        done.add((meta["pp"], meta["tp"]))
        params.update(meta["params"])
        piece = pieces[meta["tp"]]
        for k, a in arrays.items():
            if k in piece and piece[k].tobytes() != a.tobytes():
                raise CheckpointError(f"save_consolidated: {k} is held by two pipeline "
                                      f"stages (a tied embedding) whose copies differ")
            piece[k] = a
    full = assemble(pieces, params, layout.state_kinds, "save_consolidated")
    full["meta/step"] = sd["meta/step"]
    return full, params


def read_consolidated(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(the full state, the checkpoint's metadata) from path.npz/.json."""
    arrays, meta = files.load_arrays(path)
    return arrays, check_meta(meta, files.checkpoint_paths(path)[1], "consolidated")
