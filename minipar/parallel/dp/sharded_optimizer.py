"""Adam/AdamW on the parameter elements one rank owns: ZeRO's partitioned optimizer states.

A rank owns some 1-D *pieces* of the parameters: its shard of each unit's flat buffer
(ZeRO-1/2/3, FSDP), or every parameter whole (DDP, where each rank owns everything). For
each piece it keeps

    master   float32 copy of the weights       only for bfloat16 parameters
    m, v     Adam's moments                      float32 (float64 for float64 parameters)

and one step, for every parameter segment inside a piece, is

    g             = float32(grad[seg]) * coef   coef = min(1, max_norm / (||g||_global + 1e-6))
    master[seg]   = AdamW(master[seg], g)        (without a master: the weights themselves)
    weights[seg]  = round16(master[seg])

which is, element for element, the arithmetic of `MixedPrecisionOptimizer` (and in float64
of `clip_grad_norm_` followed by `AdamW.step`). Adam is elementwise, so stepping a segment
gives the same bits as stepping the whole parameter: a sharded step equals the
single-device step on the elements it covers.

Memory per element owned: 4 (master) + 4 (m) + 4 (v) = 12 bytes in mixed precision, the K = 12
of ZeRO (Rajbhandari et al. 2020, section 3.1), charged as "optimizer_states" under
`optim:{piece}.master`, `.m`, `.v`. The arrays are allocated whole, padding included, at
construction (as DeepSpeed does), so a rank holding a shard of Psi'/N elements holds
exactly 12 Psi'/N bytes of optimizer state.

The inner optimizer is the package's own `Adam`/`AdamW`, unchanged: it gets one Parameter per
segment, whose data is a view of the master, and a state dict pre-filled with views of the
flat m and v, which Adam updates in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...nn.parameter import Parameter
from ...optim.adam import Adam, adam_step_bytes
from ...optim.clip import scale_grad_
from ...optim.mixed_precision import HALF_DTYPES
from ...runtime.context import current


@dataclass
class OwnedPiece:
    """A 1-D run of parameter elements this rank updates.

    key:      the name its optimizer states are charged under (a unit or a parameter name)
    data:     a writable 1-D view of the weights, in the parameters' dtype   # [n]
    segments: (parameter name, lo, hi): data[lo:hi] are elements of that parameter; what
              no segment covers is padding and is never updated
    """

    key: str
    data: np.ndarray
    segments: list[tuple[str, int, int]]


def is_half(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in HALF_DTYPES.values()


def grad_dtype(main_grad: bool, dtype: np.dtype) -> np.dtype:
    """The dtype of an engine's gradient buffers: float32 with `main_grad` (Megatron's
    float32 main_grad of a bfloat16 model: micro-batches accumulate, and ranks are reduced,
    in float32), else the weights' own."""
    if not isinstance(main_grad, (bool, np.bool_)):
        raise TypeError(f"main_grad is True (float32 gradient buffers) or False, got "
                        f"{main_grad!r}")
    if main_grad and not is_half(dtype):
        raise ValueError(f"main_grad=True keeps float32 gradients for a bfloat16 model; "
                         f"this one is {np.dtype(dtype)}: leave main_grad off")
    return np.dtype(np.float32) if main_grad else np.dtype(dtype)


def check_optimizer_class(inner_cls: type) -> None:
    if not (isinstance(inner_cls, type) and issubclass(inner_cls, Adam)):
        raise TypeError(
            f"the data-parallel engines step Adam or AdamW on flat shards (their m and v "
            f"are preallocated zeros, sharded like the weights); got {inner_cls!r}. Pass "
            "minipar.optim.AdamW (or Adam)")


class ShardedOptimizer:
    """`ShardedOptimizer(pieces, AdamW, lr=..., weight_decay=...)`: one step on owned pieces."""

    def __init__(self, pieces: Sequence[OwnedPiece], inner_cls: type = Adam, **kwargs: Any):
        check_optimizer_class(inner_cls)
        self.pieces = list(pieces)
        self.steps_taken = 0  # Adam's t, the same for every segment
        self._lr = float(kwargs.get("lr", 1e-3))  # kept for a rank that owns nothing
        self._ledger = current().ledger
        self._held: list[str] = []
        self.masters: list[np.ndarray | None] = []   # per piece: float32 [n] or None
        self.moments: list[dict[str, np.ndarray]] = []  # per piece: {"m": [n], "v": [n]}
        self._wrappers: list[list[Parameter]] = []
        wrappers: list[Parameter] = []
        states: dict[str, dict[str, Any]] = {}
        for piece in self.pieces:
            if piece.data.ndim != 1:
                raise ValueError(f"piece {piece.key!r} must be 1-D, got shape {piece.data.shape}")
            half = is_half(piece.data.dtype)
            master = piece.data.astype(np.float32) if half else None
            if master is not None:
                self._hold(f"optim:{piece.key}.master", master)
            stepped = master if half else piece.data  # what Adam updates
            dt = np.float64 if stepped.dtype == np.float64 else np.float32
            mom = {k: np.zeros(piece.data.shape[0], dtype=dt) for k in inner_cls.STATE_KINDS}
            for k, arr in mom.items():
                self._hold(f"optim:{piece.key}.{k}", arr)
            ws = []
            for name, lo, hi in piece.segments:
                w = Parameter(name, stepped[lo:hi], charge=False)
                states[name] = {"step": 0, **{k: arr[lo:hi] for k, arr in mom.items()}}
                ws.append(w)
            self.masters.append(master)
            self.moments.append(mom)
            self._wrappers.append(ws)
            wrappers += ws
        # a rank whose shards are all padding (more ranks than elements) owns nothing to step
        self.inner = inner_cls(wrappers, **kwargs) if wrappers else None
        if self.inner is not None:
            self.inner.state.update(states)

    def _hold(self, name: str, arr: np.ndarray) -> None:
        self._ledger.hold(name, arr, "optimizer_states")
        self._held.append(name)

    # ---- hyperparameters --------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.inner.lr if self.inner is not None else self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = float(value)
        if self.inner is not None:
            self.inner.lr = float(value)

    # ---- the step -----------------------------------------------------------------------
    def squared_grad_norm(self, grads: Sequence[np.ndarray],
                          counted: Optional[Callable[[str], bool]] = None) -> float:
        """sum of g^2 over the owned gradient pieces, in float64 (padding adds zeros).
        counted(name) False leaves that parameter's elements out (a replica counted on
        another rank: see DataParallelEngine.step under tensor parallelism)."""
        total = 0.0
        for piece, g in zip(self.pieces, grads):
            g64 = g.astype(np.float64)
            if counted is None:
                total += float(np.sum(g64 * g64))
                continue
            for name, lo, hi in piece.segments:
                if counted(name):
                    total += float(np.sum(g64[lo:hi] * g64[lo:hi]))
        return total

    def step(self, grads: Sequence[np.ndarray], coef: float = 1.0) -> None:
        """Update every owned segment from `grads` (aligned with the pieces: one 1-D reduced
        gradient per piece), each gradient multiplied by the clip coefficient `coef`."""
        if len(grads) != len(self.pieces):
            raise ValueError(f"step got {len(grads)} gradient pieces for {len(self.pieces)} "
                             "owned pieces")
        for piece, g_piece, master, ws in zip(self.pieces, grads, self.masters, self._wrappers):
            if g_piece.shape != piece.data.shape:
                raise ValueError(f"piece {piece.key!r}: gradient of shape {g_piece.shape}, "
                                 f"weights of shape {piece.data.shape}")
            stepped = master if master is not None else piece.data
            for (name, lo, hi), w in zip(piece.segments, ws):
                g = g_piece[lo:hi]
                copied = coef != 1.0 or g.dtype != stepped.dtype
                if copied:
                    g = g.astype(stepped.dtype)  # float32 copy (float64 in float64)
                # else: the reduced gradient itself (float32 main_grad buffers too); Adam
                # only reads it (its first act is a copy, p.grad.astype), so the bits are
                # the same and one copy is saved
                charge = master is not None and copied  # the transient float32 copy
                if charge:
                    self._ledger.hold(f"optim:{name}.grad32", g, "gradients")
                try:
                    scale_grad_(g, coef)  # a non-finite norm's 0 or nan too, as torch
                    w.grad = g
                    self.inner._update(w, self.inner.state[name])
                    stepped[lo:hi] = w.data  # Adam wrote a new array; keep the flat storage
                    w.set_data(stepped[lo:hi])
                    w.grad = None
                finally:
                    if charge:
                        self._ledger.release(f"optim:{name}.grad32")
            if master is not None:
                for _, lo, hi in piece.segments:
                    piece.data[lo:hi] = master[lo:hi].astype(piece.data.dtype)  # round16(master)
        if self.inner is not None:  # the step's bytes, as optim/adam.py counts them
            current().memory_bound(self.step_bytes(grads), self.inner.kernel)
        self.steps_taken += 1

    def step_bytes(self, grads: Sequence[np.ndarray]) -> int:
        """adam_step_bytes of the owned elements (padding is never stepped): the weights or
        their float32 masters, the reduced gradient pieces, the moments, the 16-bit weights."""
        total = 0
        for piece, g_piece, master, mom in zip(self.pieces, grads, self.masters, self.moments):
            stepped = master if master is not None else piece.data
            elements = sum(hi - lo for _, lo, hi in piece.segments)
            total += adam_step_bytes(elements, stepped.itemsize, g_piece.itemsize,
                                     mom["m"].itemsize,
                                     piece.data.itemsize if master is not None else 0)
        return total

    # ---- state, for checkpoints -------------------------------------------------------------
    @property
    def has_masters(self) -> bool:
        return any(m is not None for m in self.masters)

    def state_arrays(self, i: int) -> dict[str, np.ndarray]:
        """Piece i's flat optimizer state: {"m": [n], "v": [n]} plus "master" when kept."""
        out = dict(self.moments[i])
        if self.masters[i] is not None:
            out["master"] = self.masters[i]
        return out

    @property
    def step_count(self) -> int:
        """Steps taken (Adam's t): the same for every segment."""
        return self.steps_taken

    def set_step_count(self, t: int) -> None:
        self.steps_taken = int(t)
        if self.inner is not None:
            for s in self.inner.state.values():
                s["step"] = int(t)

    def refresh_masters(self) -> None:
        """After the 16-bit weights were written by hand: master = float32(weights) wherever
        the weights no longer equal round16(master), so the change survives the next step."""
        for piece, master in zip(self.pieces, self.masters):
            if master is None:
                continue
            changed = piece.data != master.astype(piece.data.dtype)
            master[changed] = piece.data[changed].astype(np.float32)

    def release(self) -> None:
        """Give every state array's bytes back to the ledger."""
        for name in self._held:
            self._ledger.release(name)
        self._held.clear()
