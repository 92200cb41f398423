"""Where each array a rank holds sits in the full tensors: the layout a checkpoint records.

A rank's file goes back to the single-device tensors through two maps, each recorded in the
checkpoint's index (docs/checkpoints.md):

    "<unit>/<kind>" [S] in the file at dp_shard = k    shard k of the unit's flat buffer
      -> flat = concat over k = 0..N-1, padding dropped              (the ZeRO / FSDP layout,
         tensor = flat[offset : offset + prod(shape)].reshape(shape)   "units", over dp_shard)
      -> full = concat over t = 0..T-1 of the tensors at tp = t       (Megatron's layout,
                along the parameter's partition_dim                     "params", over tp)

The first map comes from the engine (`local_state()`: which shard of which flat buffer this
rank holds); the second from the parameters' tags (`tensor_model_parallel`,
`partition_dim`, `partition_index` of `partition_count`, set by parallel/tp). A parameter
replicated across tp (LayerNorms, row-parallel biases, position embeddings) is held whole
on every tp rank; the copy at tp = 0 is taken, and the others must equal it bit for bit.

A file's coordinate is {"pp": p, "tp": t, "dp_shard": k}, and files are numbered in
that order, the last fastest. Under a pipeline the ranks at pipeline coordinate p hold the
units of their stages only (EMBED, blocks, HEAD; a tied wte on the first and the last
stage's rank both): each unit in the index says at which "pp" it is, and the full tensors
are the union over p (the two copies of a tied wte must agree bit for bit).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ...files import CheckpointError
from ...runtime.context import current
from ...runtime.group import ProcessGroup
from ..dp.engine import LocalState

KIND = "minipar-dp-checkpoint"  # meta["kind"] of both forms
#: a file's coordinate, slowest first; files are numbered in this order
COORDINATE = ("pp", "tp", "dp_shard")
#: GPTConfig fields that make two models compute different functions; the others (seed,
#: init_std, dropout, recompute, recompute_segment) may change between a save and a load,
#: and dtype is checked on its own (the state's precision). The seed also draws the dropout
#: masks: with dropout on, a run resumes exactly only under the seed it was saved with
ARCHITECTURE = ("vocab_size", "seq_len", "hidden", "num_heads", "num_layers", "ffn_hidden",
                "tie_embeddings", "gelu", "layernorm_eps", "moe")
#: the GPTConfig fields a load lets differ from the saved ones (every other field is in
#: ARCHITECTURE or is dtype; a test keeps the three lists covering GPTConfig)
MAY_CHANGE = ("seed", "init_std", "dropout", "recompute", "recompute_segment")
#: fields earlier versions of GPTConfig saved and this one no longer has; a load ignores them
#: (recompute_every: "only every k-th block recomputes", replaced by checkpoint segments)
RETIRED = ("recompute_every",)


@dataclass(frozen=True)
class Placement:
    """Where this rank's array of parameter `name` sits in the full tensor: block `index` of
    `count` equal blocks along `dim` (count 1: the whole tensor)."""

    name: str
    full_shape: tuple[int, ...]
    dim: Optional[int]  # the partition_dim of a tensor-parallel parameter, else None
    index: int
    count: int

    def block(self, full: np.ndarray) -> np.ndarray:
        """This rank's block of the full tensor (a copy)."""
        if self.count == 1:
            return np.array(full, copy=True)
        n = self.full_shape[self.dim] // self.count
        index = [slice(None)] * full.ndim
        index[self.dim] = slice(self.index * n, (self.index + 1) * n)
        return np.ascontiguousarray(full[tuple(index)])


def placement(p, local_shape: tuple[int, ...]) -> Placement:
    """The Placement of parameter `p` (this rank's array has `local_shape`), from its tags."""
    if not getattr(p, "tensor_model_parallel", False):
        return Placement(p.name, tuple(local_shape), None, 0, 1)
    if not hasattr(p, "partition_count") or not hasattr(p, "partition_index"):
        raise CheckpointError(
            f"rank {current().rank}: {p.name} is tagged tensor_model_parallel, but not with "
            "partition_index and partition_count, so its place in the full tensor is unknown; "
            "build tensor-parallel parameters with parallel.tp.layers.tensor_parallel_parameter")
    dim, count = p.partition_dim, p.partition_count
    full = list(local_shape)
    full[dim] *= count
    return Placement(p.name, tuple(full), dim, p.partition_index, count)


@dataclass(frozen=True)
class RankLayout:
    """This rank's place in a checkpoint: what it holds, where, and whether it writes."""

    state: LocalState
    placements: dict[str, Placement]  # every parameter of the model, by name
    coordinate: dict[str, int]  # {"pp", "tp", "dp_shard"}
    sizes: dict[str, int]  # the same keys, plus "dp_replicate" (replicas, not written)
    replica: int  # this rank's index among the ranks holding the same shards

    @property
    def writes(self) -> bool:
        """Only the first of the ranks holding the same shards writes them."""
        return self.replica == 0

    @property
    def file_number(self) -> int:
        """The position of this rank's coordinate in file order (the last dimension fastest)."""
        n = 0
        for d in COORDINATE:
            n = n * self.sizes[d] + self.coordinate[d]
        return n

    @property
    def state_kinds(self) -> list[str]:
        """The optimizer-state kinds every unit holds: "m", "v" (and "master", 16-bit);
        none on a pipeline rank without parameters."""
        if not self.state.units:
            return []
        return [k for k in ("m", "v", "master") if k in self.state.units[0].arrays]

    @property
    def split(self) -> bool:
        """Whether other ranks hold other pieces of the model (tp or pp > 1)."""
        return self.sizes["tp"] * self.sizes["pp"] > 1

    def groups(self) -> list[ProcessGroup]:
        """Groups spanning every rank of this checkpoint: for a split model the world (the
        ranks holding the other pieces are known to parallel/mesh, not to the engine), else
        the engine's shard and replicate groups."""
        if self.split:
            return [current().world]
        return [g for g in (self.state.shard_group, self.state.replica_group)
                if g is not None and g.size > 1]


def unwrap(obj, groups=None):
    """(the data-parallel engine, the ParallelGroups or None) of an engine, a
    FullyShardedDataParallel, or parallelize's run (whose groups are taken)."""
    groups = groups if groups is not None else getattr(obj, "groups", None)
    e = obj
    for _ in range(3):  # run -> FullyShardedDataParallel -> engine
        if callable(getattr(e, "local_state", None)) and hasattr(e, "param_shapes"):
            return e, groups
        e = getattr(e, "engine", None)
    raise TypeError(f"expected a data-parallel engine (DistributedDataParallel, ZeroEngine, "
                    f"Zero3Engine, FullyShardedDataParallel) or parallelize's run, got "
                    f"{type(obj).__name__}")


def check_kind(meta: Any, where: Any, form: str) -> None:
    """Refuse a file that is not a checkpoint of this module's `form`."""
    if not isinstance(meta, dict) or meta.get("kind") != KIND or meta.get("form") != form:
        got = meta.get("kind") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"{where} is a minipar checkpoint but not a data-parallel {form} one (its meta "
            f"has kind {got!r}, expected {KIND!r} with form {form!r}); write it with "
            f"minipar.parallel.checkpoint.save_{form}")


def describe(layout: RankLayout, engine, form: str, save_id: str,
             units: Optional[list] = None, params: Optional[dict] = None) -> dict[str, Any]:
    """The checkpoint's metadata: what wrote it, the layout's sizes, units, parameters and
    the model's config (units, params: every pipeline stage's, when gathered)."""
    return {"kind": KIND, "form": form, "save_id": save_id, "engine": type(engine).__name__,
            "stage": engine.stage, "dtype": engine.dtype.name, "step": layout.state.step,
            "state_kinds": layout.state_kinds, "mesh": dict(layout.sizes),
            "units": describe_units(layout) if units is None else units,
            "params": describe_params(layout) if params is None else params,
            "config": config_of(engine.model),
            "dropout_generator": generator_state(engine.model)}


def generator_state(model) -> Optional[dict]:
    """The state of the model's dropout generator (numpy's PCG64 state, JSON-ready: Python
    ints), the same on every rank, so that a resumed run draws the masks the uninterrupted
    run would (torch checkpoints save torch.get_rng_state() for the same reason)."""
    generator = getattr(model, "dropout_generator", None)
    return None if generator is None else generator.bit_generator.state


def rank_layout(engine, groups=None) -> RankLayout:
    """This rank's RankLayout, from the engine's local_state(), the parameters' tags and,
    when given, the run's ParallelGroups (which name the pipeline stage, and are checked
    against the tags)."""
    if groups is None and getattr(engine.model, "stages", None) is not None:
        raise CheckpointError(
            f"rank {current().rank}: this engine holds one pipeline rank's stages, so the "
            f"checkpoint must know the rank's pipeline coordinate: pass parallelize's run "
            f"(or groups=run.groups)")
    state = engine.local_state()
    placements = {p.name: placement(p, engine.param_shapes[p.name])
                  for _, ps in engine.units for p in ps}
    tp_index, tp = _tensor_parallel_position(placements)
    pp_index, pp = 0, 1
    if groups is not None:
        where = groups.coordinate
        pp_index, pp = where.get("pp", 0), groups.pp.size
        if not placements:  # a pipeline rank without parameters: its place is the mesh's
            tp_index, tp = where.get("tp", 0), groups.tp.size
        if (where.get("tp", 0), groups.tp.size) != (tp_index, tp):
            raise CheckpointError(
                f"rank {current().rank}: the groups put this rank at tp = {where.get('tp', 0)} "
                f"of {groups.tp.size}, but its parameters are tensor-parallel shard "
                f"{tp_index} of {tp}; pass the groups the model was built with (run.groups)")
    shard, n = state.shard()
    replica, replicas = state.replica()
    return RankLayout(state, placements, {"pp": pp_index, "tp": tp_index, "dp_shard": shard},
                      {"pp": pp, "tp": tp, "dp_shard": n, "dp_replicate": replicas}, replica)


def _tensor_parallel_position(placements: dict[str, Placement]) -> tuple[int, int]:
    """(index, count) of this rank's tensor-parallel shards, the same for all of them."""
    seen = {(pl.index, pl.count): name for name, pl in placements.items() if pl.count > 1}
    if len(seen) > 1:
        found = ", ".join(f"{name} is shard {i} of {c}" for (i, c), name in seen.items())
        raise CheckpointError(f"rank {current().rank}: the tensor-parallel shards of this "
                              f"rank disagree on their place ({found}); every shard of a rank "
                              "must come from one tensor-parallel group")
    return next(iter(seen), (0, 1))


def file_coordinates(sizes: dict[str, int]) -> list[dict[str, int]]:
    """Every file's coordinate, in file order."""
    ranges = [range(sizes[d]) for d in COORDINATE]
    return [dict(zip(COORDINATE, c)) for c in itertools.product(*ranges)]


# ---- the JSON description ------------------------------------------------------------
def describe_units(layout: RankLayout) -> list[dict]:
    """Each unit's flat layout (the same on every rank of the model's piece): sizes,
    padding, and where each parameter's (this piece's) tensor sits in it."""
    out = []
    for shard in layout.state.units:
        f = shard.flat
        out.append({"name": f.unit, "pp": layout.coordinate["pp"], "over": "dp_shard",
                    "numel": f.numel,
                    "padded_numel": f.padded_numel, "padding": f.padding,
                    "shard_numel": f.shard_numel,
                    "params": [{"name": p.name, "offset": off, "shape": list(shape)}
                               for p, off, shape in zip(f.params, f.offsets, f.shapes)]})
    return out


def describe_params(layout: RankLayout) -> dict[str, dict]:
    """{name: {"shape": the full shape, "partitioned": {mesh dimension: tensor dim}}}."""
    return {name: {"shape": list(pl.full_shape),
                   "partitioned": {} if pl.dim is None else {"tp": pl.dim}}
            for name, pl in layout.placements.items()}


def config_of(model) -> Optional[dict[str, Any]]:
    """The model's GPTConfig as a JSON dict (None for a model without a dataclass cfg)."""
    cfg = getattr(model, "cfg", None)
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else None


# ---- from pieces back to the full tensors ---------------------------------------------
def assemble(pieces: list[dict[str, np.ndarray]], params: dict[str, dict], kinds: list[str],
             where: Any) -> dict[str, np.ndarray]:
    """pieces[t] = {full_state_dict key: the tensor of tp rank t} -> {key: full tensor}:
    partitioned parameters concatenated along their dim, replicated ones checked equal."""
    out = {}
    for name, spec in params.items():
        dim = spec["partitioned"].get("tp") if len(pieces) > 1 else None
        for kind in ["param"] + kinds:
            key = f"param/{name}" if kind == "param" else f"optim/{name}.{kind}"
            parts = [p[key] for p in pieces]
            if dim is None:
                for t, part in enumerate(parts[1:], start=1):
                    if part.shape != parts[0].shape or part.tobytes() != parts[0].tobytes():
                        raise CheckpointError(
                            f"{where}: {key} is replicated across tensor-parallel ranks, but "
                            f"tp rank {t}'s copy differs from tp rank 0's; the replicas "
                            "drifted apart during training, so there is no one value to load")
                full = parts[0]
            elif any(p.ndim != len(spec["shape"]) or p.shape != parts[0].shape for p in parts):
                raise CheckpointError(
                    f"{where}: {key}'s tensor-parallel pieces have shapes "
                    f"{[list(p.shape) for p in parts]}, which do not join along dimension "
                    f"{dim} into the {spec['shape']} the index records; it is damaged")
            else:
                full = np.concatenate(parts, axis=dim)
            if list(full.shape) != spec["shape"]:
                raise CheckpointError(f"{where}: {key} assembles to shape {list(full.shape)}, "
                                      f"but the index records {spec['shape']}; it is damaged")
            out[key] = full
    return out
