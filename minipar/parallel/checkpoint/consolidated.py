"""The consolidated form: one file of the single-device model's full named tensors.

(FSDP's FULL_STATE_DICT with rank0_only; Megatron's checkpoint conversion to one rank.)

    save_consolidated(engine, path)    path.npz / path.json, written by world rank 0

in full_state_dict's keys, at the single-device shapes:

    "param/<name>"  (float32 for bf16 models), "optim/<name>.m", ".v", ".master",
    "meta/step"

The data-parallel gather is `full_state_dict()` (a collective over the engine's groups).
A model split across tensor-parallel ranks is then gathered to world rank 0, which joins
the pieces along each parameter's partition_dim (layout.assemble): every rank sends its
piece, so world_size x (the state / tp) elements arrive at rank 0 — simple, not frugal.
"""

from __future__ import annotations

import os
import uuid
from typing import Union

import numpy as np

from ... import files
from ...runtime.collectives import barrier, gather
from ...runtime.context import current
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
    if layout.split:
        sd = _gather_pieces(sd, layout)  # world rank 0: the full tensors; others: None
    if layout.writes and layout.file_number == 0:
        files.save_arrays(path, sd, describe(layout, e, "consolidated", uuid.uuid4().hex))
    for g in layout.groups():  # nobody leaves before the file is written
        barrier(group=g)


def _gather_pieces(sd: dict[str, np.ndarray], layout: RankLayout):
    """Every rank's piece (its full_state_dict) -> the full tensors on world rank 0."""
    world = current().world
    keys = sorted(k for k in sd if k != "meta/step")
    flat = np.concatenate([sd[k].reshape(-1) for k in keys])  # the same size on every rank
    where = gather(np.array([layout.coordinate["tp"]], dtype=np.int64), dst=0, group=world)
    got = gather(flat, dst=0, group=world)
    if current().rank != 0:
        return None
    first_of = {}  # tp rank -> the first world rank holding that piece
    for r, t in enumerate(int(w[0]) for w in where):
        first_of.setdefault(t, r)
    pieces = []
    for t in range(layout.sizes["tp"]):
        piece, at = {}, 0
        for k in keys:
            n = sd[k].size
            piece[k] = got[first_of[t]][at:at + n].reshape(sd[k].shape).astype(sd[k].dtype)
            at += n
        pieces.append(piece)
    full = assemble(pieces, describe_params(layout), layout.state_kinds, "save_consolidated")
    full["meta/step"] = sd["meta/step"]
    return full


def read_consolidated(path: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(the full state, the checkpoint's metadata) from path.npz/.json."""
    arrays, meta = files.load_arrays(path)
    return arrays, check_meta(meta, files.checkpoint_paths(path)[1], "consolidated")
