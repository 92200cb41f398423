"""The optimizer base: p_{t+1} = update(p_t, grad_t, state_t), one parameter at a time.

What every optimizer here shares, in the spirit of `torch.optim.Optimizer`:

- `step()` updates each parameter from its `grad`; a parameter whose `grad is None` is
  skipped (no update, no weight decay, its step count does not advance).
- `zero_grad()` drops the gradients (`Parameter.free_grad`), giving their bytes back.
- Optimizer state (Adam's m and v, SGD's momentum buffer) is created **lazily**, at the
  first `step()` that sees a gradient for the parameter, exactly as torch.optim does. So
  right after construction the ledger shows no optimizer states; from the first step on it
  shows all of them. Each state array is charged to the ledger of the device that built
  the optimizer as "optimizer_states", under the name `optim:{param.name}.{kind}`
  (`optim:blocks.0.w1.m`).
- States are float32, or float64 when the parameter is float64 (so float64 tests are
  exact). A 16-bit parameter gets float32 states and is updated in float32, then rounded
  back: updates smaller than half a 16-bit ulp are lost, which is why mixed precision
  keeps float32 master weights (see `mixed_precision.py`).
- The new value is written with `Parameter.set_data`, the parameter's own way of being
  replaced (same shape and dtype, so the ledger does not move).
- `state_dict()` / `load_state_dict()` use plain dicts of numpy arrays, ints, floats and
  lists, keyed by parameter *name* (not position), so a checkpoint is a .npz of the arrays
  and JSON of the rest, and never needs a pickle.
- Weight decay can be limited to some parameters with `weight_decay_filter(name) -> bool`
  (True: decay this one). `no_decay_for("*.bias", "*ln*")` builds such a predicate.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ..nn.parameter import Parameter
from ..runtime.context import current

WeightDecayFilter = Callable[[str], bool]


def state_dtype(p: Parameter) -> np.dtype:
    """float64 for float64 parameters, float32 for everything else (fp32, bf16, fp16)."""
    return np.dtype(np.float64) if p.data.dtype == np.float64 else np.dtype(np.float32)


def no_decay_for(*patterns: str) -> WeightDecayFilter:
    """A `weight_decay_filter` that decays every parameter except those whose name matches
    one of the shell-style `patterns` (fnmatch), e.g. biases and LayerNorm gains:

        AdamW(params, weight_decay=0.1, weight_decay_filter=no_decay_for("*.bias", "*ln*"))

    Decaying biases and normalisation gains is usually avoided (it pulls a LayerNorm gain
    towards 0, i.e. towards switching the layer off); GPT-2/3 style recipes exclude them.
    """
    if not patterns:
        raise ValueError("no_decay_for needs at least one name pattern, e.g. '*.bias'")

    def decays(name: str) -> bool:
        return not any(fnmatch.fnmatchcase(name, pat) for pat in patterns)

    return decays


class Optimizer:
    """Base class: parameters, learning rate, weight-decay selection, state and the ledger.

    Subclasses set `STATE_KINDS` (names of per-parameter state arrays), implement
    `_update(p, state)` for one parameter with a gradient, and `hyperparameters()`.
    """

    STATE_KINDS: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Parameter], lr: float, weight_decay: float = 0.0,
                 weight_decay_filter: Optional[WeightDecayFilter] = None):
        self.params: list[Parameter] = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list; pass the "
                             "model's parameters (a list of Parameter objects)")
        names = [p.name for p in self.params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{type(self).__name__}: parameter names must be unique (state "
                             f"and checkpoints are keyed by name); repeated: {dup}")
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got lr={lr}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.weight_decay_filter = weight_decay_filter
        self.state: dict[str, dict[str, Any]] = {}
        self._by_name = {p.name: p for p in self.params}
        self._ledger = current().ledger
        self._held: list[str] = []

    # ---- the update -------------------------------------------------------------------
    def step(self) -> None:
        """Update every parameter that has a gradient (those with `grad is None` are skipped)."""
        for p in self.params:
            if p.grad is None:
                continue
            state = self.state.get(p.name, {})
            self._update(p, state)
            if state:  # plain SGD keeps nothing: no empty entries in the state dict
                self.state[p.name] = state

    def _update(self, p: Parameter, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Drop every parameter's gradient (`Parameter.free_grad`), releasing its bytes."""
        for p in self.params:
            p.free_grad()

    def decays(self, p: Parameter) -> bool:
        """Whether weight decay applies to `p`: weight_decay > 0 and the filter agrees."""
        if self.weight_decay == 0.0:
            return False
        return self.weight_decay_filter is None or bool(self.weight_decay_filter(p.name))

    # ---- state on the ledger ----------------------------------------------------------
    def _new_state(self, p: Parameter, kind: str, init: Optional[np.ndarray] = None
                   ) -> np.ndarray:
        """A state array shaped like `p` (zeros, or a copy of `init`), charged to the ledger
        as optimizer_states under `optim:{p.name}.{kind}`."""
        arr = np.zeros(p.shape, dtype=state_dtype(p))
        if init is not None:
            np.copyto(arr, init, casting="same_kind")
        name = f"optim:{p.name}.{kind}"
        self._ledger.hold(name, arr, "optimizer_states")
        self._held.append(name)
        return arr

    def state_nbytes(self) -> int:
        """Bytes of all state arrays held (what the ledger was charged for them)."""
        return sum(v.nbytes for s in self.state.values() for v in s.values()
                   if isinstance(v, np.ndarray))

    def release(self) -> None:
        """Give every state array's bytes back to the ledger and forget the state."""
        for name in self._held:
            self._ledger.release(name)
        self._held.clear()
        self.state.clear()

    # ---- checkpoints ------------------------------------------------------------------
    def hyperparameters(self) -> dict[str, Any]:
        """Numbers and lists only (JSON-ready). The weight-decay filter, a function, is not
        saved: pass it again when building the optimizer that loads the state."""
        return {"lr": self.lr, "weight_decay": self.weight_decay}

    def _set_hyperparameters(self, h: dict[str, Any]) -> None:
        self.lr = float(h["lr"])
        self.weight_decay = float(h["weight_decay"])

    def state_dict(self) -> dict[str, Any]:
        """{"hyperparameters": {...}, "state": {param name: {"step": int, "m": array, ...}}}.

        Arrays are copies: later steps do not change a state dict already taken.
        """
        return {
            "hyperparameters": self.hyperparameters(),
            "state": {name: {k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in s.items()}
                      for name, s in self.state.items()},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned (values are copied in, never aliased)."""
        unknown = sorted(set(sd["state"]) - set(self._by_name))
        if unknown:
            raise KeyError(f"{type(self).__name__}.load_state_dict: the state dict has state "
                           f"for parameters this optimizer does not hold: {unknown[:10]}")
        for name, saved in sd["state"].items():
            p = self._by_name[name]
            for k, v in saved.items():
                if isinstance(v, np.ndarray) and v.shape != p.shape:
                    raise ValueError(f"state {k!r} of {name} has shape {v.shape} in the state "
                                     f"dict but the parameter has shape {p.shape}")
                if k not in self.STATE_KINDS and k != "step":
                    raise KeyError(f"{type(self).__name__} keeps no state {k!r} (it keeps "
                                   f"{('step',) + self.STATE_KINDS}); wrong optimizer class?")
        self._set_hyperparameters(sd["hyperparameters"])
        self.release()
        for name, saved in sd["state"].items():
            p = self._by_name[name]
            state: dict[str, Any] = {}
            for k, v in saved.items():
                state[k] = self._new_state(p, k, v) if isinstance(v, np.ndarray) else int(v)
            self.state[name] = state

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v}" for k, v in self.hyperparameters().items())
        return f"{type(self).__name__}({len(self.params)} parameters, {hp})"
