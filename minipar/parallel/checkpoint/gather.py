"""Pieces that differ from rank to rank, brought to one rank: what a pipeline's save needs.

Under pipeline parallelism each stage's ranks hold other units and other parameters, so
the writer of the index (and, for a consolidated save, of the one file) must hear every
stage's description. A collective moves equal shapes, so each rank packs its piece into
bytes — a JSON header (its description, and each array's name, dtype and shape) and the
arrays' raw bytes — and the pieces travel as one gather of uint8 buffers padded to the
longest (whose length one max all-reduce finds first):

    buffer = [header length: 8 bytes][header: UTF-8 JSON][array bytes, in header order]

Bytes in, the same bytes out: no value is converted. The header is parsed by json and the
arrays by np.frombuffer, never unpickled.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from ...runtime.collectives import all_reduce, gather
from ...runtime.context import current
from ...runtime.group import ProcessGroup

_LENGTH = 8  # bytes of the header length, little-endian


def pack(meta: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """(JSON-able meta, named arrays) -> one uint8 buffer [n]."""
    names = list(arrays)
    header = json.dumps({"meta": meta, "arrays": [
        [k, arrays[k].dtype.str, list(arrays[k].shape)] for k in names]}).encode()
    parts = [np.frombuffer(len(header).to_bytes(_LENGTH, "little"), np.uint8),
             np.frombuffer(header, np.uint8)]
    parts += [np.frombuffer(np.ascontiguousarray(arrays[k]).tobytes(), np.uint8) for k in names]
    return np.concatenate(parts)


def unpack(buffer: np.ndarray) -> tuple[Any, dict[str, np.ndarray]]:
    """What `pack` packed (trailing padding ignored)."""
    raw = buffer.tobytes()
    n = int.from_bytes(raw[:_LENGTH], "little")
    header = json.loads(raw[_LENGTH:_LENGTH + n])
    at, arrays = _LENGTH + n, {}
    for name, dtype, shape in header["arrays"]:
        dt = np.dtype(dtype)
        size = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        arrays[name] = np.frombuffer(raw[at:at + size], dt).reshape(shape).copy()
        at += size
    return header["meta"], arrays


def gather_to_first(meta: Any, arrays: dict[str, np.ndarray], group: ProcessGroup
                    ) -> Optional[list[tuple[Any, dict[str, np.ndarray]]]]:
    """Every rank's (meta, arrays), in group rank order, on the group's first rank; None on
    the others. Two collectives: a max all-reduce of the lengths, a gather of the bytes."""
    mine = pack(meta, arrays)  # [n]
    longest = int(all_reduce(np.array([mine.size], np.int64), "max", group=group)[0])
    padded = np.zeros(longest, np.uint8)  # [longest]
    padded[:mine.size] = mine
    got = gather(padded, dst=group.ranks[0], group=group)
    if current().rank != group.ranks[0]:
        return None
    return [unpack(b) for b in got]
