"""A checkpoint's metadata (what layout.describe wrote), every field a reader uses checked
before it is used, so a damaged index or JSON is refused by name, never crashes a reader.

    check_meta(meta, where, form)   kind and form, save_id, dtype, step, state_kinds, the
                                    mesh's sizes, the units' flat layouts, the params' full
                                    shapes and partitioned dimensions, the config, the
                                    dropout generator's state
    check_table(table, where)       the index's "arrays" table: a shape and dtype per array

Both forms write the same metadata (consolidated files ignore the units, but a reader
cannot trust one field of a document whose others are damaged).
"""

from __future__ import annotations

from typing import Any

from ...files import CheckpointError
from .layout import check_kind

STATE_KINDS = ("m", "v", "master")
MESH = ("pp", "tp", "dp_shard", "dp_replicate")


def _count(x: Any, least: int = 0) -> bool:
    return type(x) is int and x >= least


def _shape(x: Any) -> bool:
    return isinstance(x, list) and all(_count(d) for d in x)


def _param(spec: Any) -> bool:
    """{"shape": [...], "partitioned": {} or {"tp": a dimension of shape}}."""
    if not (isinstance(spec, dict) and _shape(spec.get("shape"))):
        return False
    part = spec.get("partitioned")
    return isinstance(part, dict) and set(part) <= {"tp"} and all(
        _count(d) and d < len(spec["shape"]) for d in part.values())


def _unit(u: Any) -> bool:
    """{"name": str, "numel": n, "params": [{"name", "offset", "shape"}, ...]}, and "pp":
    the pipeline coordinate holding it (absent before pipelines: 0)."""
    return (isinstance(u, dict) and isinstance(u.get("name"), str) and _count(u.get("numel"))
            and _count(u.get("pp", 0))
            and isinstance(u.get("params"), list)
            and all(isinstance(p, dict) and isinstance(p.get("name"), str)
                    and _count(p.get("offset")) and _shape(p.get("shape"))
                    for p in u["params"]))


def _generator(g: Any) -> bool:
    """None (a model without one), or numpy's PCG64 state as bit_generator.state gives it."""
    if g is None:
        return True
    inner = g.get("state") if isinstance(g, dict) else None
    return (g.get("bit_generator") == "PCG64" and isinstance(inner, dict)
            and all(_count(inner.get(k)) for k in ("state", "inc"))
            and _count(g.get("has_uint32")) and _count(g.get("uinteger")))


def check_meta(meta: Any, where: Any, form: str) -> dict:
    """`meta`, once every field a reader of `form` ("sharded", "consolidated") uses is there
    with the right type; refused naming the fields that are not."""
    check_kind(meta, where, form)
    kinds, mesh = meta.get("state_kinds"), meta.get("mesh")
    units, params = meta.get("units"), meta.get("params")
    wrong = [what for ok, what in [
        (isinstance(meta.get("save_id"), str), "save_id: a string"),
        (isinstance(meta.get("dtype"), str), "dtype: a dtype name"),
        (_count(meta.get("step")), "step: an int >= 0"),
        (isinstance(kinds, list) and len(set(map(str, kinds))) == len(kinds)
         and all(k in STATE_KINDS for k in kinds), f"state_kinds: some of {list(STATE_KINDS)}"),
        (isinstance(mesh, dict) and all(_count(mesh.get(d), 1) for d in MESH),
         f"mesh: sizes >= 1 of {list(MESH)}"),
        (isinstance(units, list) and all(_unit(u) for u in units),
         "units: a list of {name, pp, numel, params: [{name, offset, shape}]}"),
        (isinstance(params, dict) and all(_param(s) for s in params.values()),
         "params: {name: {shape, partitioned: {} or {'tp': a dimension}}}"),
        (meta.get("config") is None or isinstance(meta.get("config"), dict),
         "config: a GPTConfig's fields or null"),
        (_generator(meta.get("dropout_generator")),
         "dropout_generator: a PCG64 state {bit_generator, state: {state, inc}, ...} or null"),
    ] if not ok]
    if wrong:
        raise CheckpointError(f"{where}: the checkpoint's metadata is damaged; expected "
                              f"{'; '.join(wrong)}. Restore the checkpoint from its save")
    return meta


def check_table(table: Any, where: Any) -> dict:
    """The index's "arrays" table, once each entry has a shape, a dtype name (and, if any,
    an int pipeline coordinate "pp") and the step is the 0-d int64 every save writes."""
    if not (isinstance(table, dict) and all(
            isinstance(s, dict) and _shape(s.get("shape")) and isinstance(s.get("dtype"), str)
            and _count(s.get("pp", 0)) for s in table.values())
            and table.get("meta/step") == {"shape": [], "dtype": "int64"}):
        raise CheckpointError(f"{where} is damaged: its 'arrays' table must give every array "
                              "a shape, a dtype and (if any) a pipeline coordinate pp, and "
                              "'meta/step' the shape [] and dtype int64")
    return table
