"""Tensors a forward keeps for its backward, charged to the ledger as activations.

    y, saved = layer.forward(x)      # saved holds what backward needs, on the ledger
    dx = layer.backward(dy, saved)   # backward consumes it: the bytes are given back

Keeping the saved tensors in an explicit object (rather than on the layer) lets several
micro-batches be in flight at once, as pipeline schedules need, and makes activation
memory visible: the ledger's "activations" category is exactly what `Saved` objects hold.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..runtime.context import current


class Saved:
    """Named arrays (and small non-array values) kept between a forward and its backward."""

    def __init__(self, owner: str, **tensors: Any):
        self._owner = owner
        self._ledger = current().ledger
        self._names: list[str] = []
        self._values = dict(tensors)
        for key, value in tensors.items():
            if isinstance(value, np.ndarray):
                self._names.append(self._ledger.hold_unique(f"act:{owner}.{key}", value,
                                                            "activations"))

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_values"][key]
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('_owner', '?')} saved no {key!r}") from None

    def nbytes(self) -> int:
        """Bytes of the arrays held, nested Saved objects included (what the ledger holds)."""
        return sum(v.nbytes if isinstance(v, np.ndarray) else v.nbytes()
                   for v in self._values.values() if isinstance(v, (np.ndarray, Saved)))

    def release(self) -> None:
        """Give the bytes back (backward is done with them), nested Saved objects too.
        Safe to call twice."""
        for name in self._names:
            self._ledger.release(name)
        for v in self._values.values():
            if isinstance(v, Saved):
                v.release()
        self._names = []
        self._values = {}

    @property
    def released(self) -> bool:
        return not self._values


def _contents(record: Any) -> list:
    """The values inside a list, tuple or dataclass record (GPT's ForwardCache); else []."""
    if isinstance(record, (list, tuple)):
        return list(record)
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return [getattr(record, f.name) for f in dataclasses.fields(record)]
    return []


def release_all(*saved: Any) -> None:
    """Release every Saved in `saved` and in the lists, tuples and dataclass records
    (GPT's ForwardCache) nested in it; anything else is skipped. A forward whose backward
    will not run (sampling, full recomputation) gives its activations back this way."""
    for s in saved:
        if isinstance(s, Saved):
            s.release()
        else:
            release_all(*_contents(s))


def saved_nbytes(*saved: Any) -> int:
    """Bytes held by every Saved in `saved` and in the lists, tuples and dataclass records
    nested in it: what a forward's cache keeps for the backward."""
    return sum(s.nbytes() if isinstance(s, Saved) else saved_nbytes(*_contents(s))
               for s in saved)
