"""The full state, the pivot of every load: read from either form, cut for any layout.

    read_full_state(dir_or_path)  -> the single-device model's full named tensors (no engine)
    load(engine, dir_or_path)     -> this rank's part of them, into any engine and layout

The full state is the pivot: whatever layout wrote it (dp size, ZeRO stage or FSDP
strategy, tp size, sequence parallelism or not, pipeline stages, one device), a load cuts
from it the block each of this rank's parameters is (their tags) and hands it to the
engine's `load_full_state_dict`, which keeps its own shard. A pipeline rank takes the
tensors of its stages only (the model's other parameters are other ranks'). Loading reads files only: no
communication. Every rank reads the whole checkpoint — simple, not frugal.

A load is refused, naming the field, when the model differs from the one saved in a way
that changes what the weights compute (layout.ARCHITECTURE), even if every shape agrees
(2 heads or 4 over the same hidden size cut the same qkv weights differently).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from ... import files
from ...files import CheckpointError
from ...nn.block import RemoteBlock
from ...nn.config import GPTConfig
from ...nn.moe.config import MoEConfig
from .consolidated import read_consolidated
from .layout import ARCHITECTURE, RETIRED, Placement, placement, unwrap
from .sharded import read_sharded

PathLike = Union[str, os.PathLike]


def read_full_state(path_or_dir: PathLike) -> dict[str, np.ndarray]:
    """Either form -> {"param/<name>", "optim/<name>.<kind>", "meta/step": full arrays}:
    the names and shapes of the single-device GPT, exactly the values saved. No engine."""
    return read(path_or_dir)[0]


def read(path_or_dir: PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(the full state, the checkpoint's metadata), from either form."""
    d = Path(path_or_dir)
    if (d / files.INDEX_NAME).is_file():
        return read_sharded(d)
    npz, js = files.checkpoint_paths(path_or_dir)
    if js.is_file() or npz.is_file():
        return read_consolidated(path_or_dir)
    if d.is_dir() and any(d.glob("rank*.json")):
        raise CheckpointError(
            f"{d} holds rank files but no {files.INDEX_NAME}: the save did not finish (the "
            "index is written last, once every rank's file exists), so these files may mix "
            "two saves. Save again, or restore the directory of one whole save")
    raise CheckpointError(
        f"{path_or_dir} is neither a sharded checkpoint (a directory with "
        f"{files.INDEX_NAME}) nor a consolidated one ({npz.name} and {js.name}); pass what "
        "save_sharded or save_consolidated was given")


def load(engine, path_or_dir: PathLike) -> None:
    """Restore a checkpoint of either form into `engine` (or parallelize's run), on every
    rank: weights, float32 masters, Adam's m and v, the step count and the dropout
    generator's state, bit for bit, whatever layout wrote it. Reads files only (no
    communication)."""
    sd, meta = read(path_or_dir)
    load_state(engine, sd, meta, path_or_dir)


def load_state(engine, sd: dict[str, np.ndarray], meta: Optional[dict] = None,
               where: Any = "the state given") -> None:
    """Restore a full state held in memory (read_full_state's keys and shapes) into
    `engine` on every rank, as `load` does with a file's: this rank's blocks are cut from
    the full tensors. meta (optional): the checkpoint's metadata, whose "dtype" and
    "config" are checked against the model and whose "dropout_generator" is restored."""
    e, _ = unwrap(engine)
    meta = {} if meta is None else meta
    if meta.get("dtype", e.dtype.name) != e.dtype.name:
        raise CheckpointError(
            f"{where} was trained in {meta.get('dtype')} (weights, and float32 masters "
            f"for 16-bit models), but this engine trains in {e.dtype.name}; build the model "
            f"in the checkpoint's dtype: GPTConfig(dtype={meta.get('dtype')!r})")
    placements = {p.name: placement(p, e.param_shapes[p.name]) for _, ps in e.units for p in ps}
    check_config(where, meta, getattr(e.model, "cfg", None), placements)
    other_stage = _other_stages(e, placements)
    local = {}
    for key, full in sd.items():
        if other_stage(parameter_of(key)):
            continue  # another pipeline rank's
        pl = placements.get(parameter_of(key))
        if pl is not None and tuple(full.shape) != pl.full_shape:
            raise CheckpointError(
                f"{where}: {key} has shape {list(full.shape)} in the checkpoint, but "
                f"{pl.name} has shape {pl.full_shape} in this model (this rank holds a "
                f"{list(e.param_shapes[pl.name])} block of it); was it written for this model?")
        local[key] = full if pl is None else pl.block(full)
    e.load_full_state_dict(local)  # missing or unexpected names are refused there
    state = meta.get("dropout_generator")
    generator = getattr(e.model, "dropout_generator", None)
    if state is not None and generator is not None:  # the masks go on where they stopped
        generator.bit_generator.state = state


def _other_stages(engine, placements: dict) -> Callable[[Optional[str]], bool]:
    """Whether a parameter name is one of the model's that this pipeline rank's engine does
    not hold (never off a pipeline): a part it built but another stage runs (a RankStages'
    model holds the embedding and the head on every rank), or a parameter of a block it
    did not build (a RemoteBlock, "blocks.5" -> "blocks.5.*")."""
    stages = engine.model
    if getattr(stages, "stages", None) is None:
        return lambda name: False
    built = {p.name for p in stages.model.parameters()} - set(placements)
    remote = tuple(blk.name + "." for blk in stages.model.blocks
                   if isinstance(blk, RemoteBlock))
    return lambda name: name is not None and (name in built or name.startswith(remote))


def parameter_of(key: str) -> Optional[str]:
    """"param/<name>" or "optim/<name>.<kind>" -> <name>; None for "meta/..." keys."""
    if key.startswith("param/"):
        return key[len("param/"):]
    if key.startswith("optim/"):
        return key[len("optim/"):].rsplit(".", 1)[0]
    return None


def check_config(where: PathLike, meta: dict, cfg, placements: dict[str, Placement]) -> None:
    """Refuse a model whose architecture differs from the saved one, naming the field."""
    saved = meta.get("config")
    if saved is None or not isinstance(cfg, GPTConfig):
        return  # a checkpoint or a model without a GPTConfig: shapes are all there is
    try:
        fields = {k: v for k, v in saved.items() if k not in RETIRED}
        if isinstance(fields.get("moe"), dict):  # saved as a JSON object
            fields["moe"] = MoEConfig(**fields["moe"])
        theirs = GPTConfig(**fields)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{where}: the saved model config {saved} is not a valid "
                              f"GPTConfig ({e}); the checkpoint is damaged") from None
    for field in ARCHITECTURE:
        a, b = _value(theirs, field), _value(cfg, field)
        if a == b:
            continue
        differ = [(name, spec["shape"], placements[name].full_shape)
                  for name, spec in meta.get("params", {}).items()
                  if name in placements and tuple(spec["shape"]) != placements[name].full_shape]
        why = (f": {differ[0][0]} has shape {differ[0][1]} in the checkpoint and "
               f"{list(differ[0][2])} in this model" if differ else
               ": every tensor has the same shape, but the weights would compute something "
               "else")
        raise CheckpointError(
            f"{where} was saved from a model with GPTConfig.{field} = {a!r}, but this model "
            f"has {field} = {b!r}{why}. A checkpoint loads into the model it was trained as: "
            f"build this one with GPTConfig(..., {field}={a!r})")


def _value(cfg: GPTConfig, field: str):
    return cfg.ffn if field == "ffn_hidden" else getattr(cfg, field)
