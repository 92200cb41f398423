"""Named points in a model's forward and backward where a wrapper may act.

    forward_pre(unit)    before `unit` runs its forward (its parameters must be present)
    forward_post(unit)   after it
    backward_pre(unit)   before `unit` runs its backward
    backward_post(unit)  after it: the unit's parameter gradients are final for this pass
    backward_input_post(unit)  a split backward (weight_grads.py) has run the unit's I: its
                         input gradient is out and its weights are no longer read (W
                         reads activations and gradients only); backward_post follows at
                         the unit's W, once its gradients are complete
    recompute_pre(unit)  before a checkpoint segment reruns `unit`'s forward in the backward
                         (its parameters must be present again)
    recompute_post(unit) after that rerun (its backward comes later in the same segment)

The model fires these and never knows who listens, as with PyTorch's module hooks
(`register_forward_pre_hook`, `register_full_backward_hook`). Data-parallel wrappers use
them to launch gradient all-reduces as buckets fill, and ZeRO-3/FSDP to gather a unit's
parameters just before it needs them and free them after.

With checkpoint segments (GPTConfig(recompute="segments"), nn/segments.py) the backward of
a segment of blocks lo..hi-1 fires backward_pre(blocks.hi-1), reruns the forwards of
blocks lo..hi-1 between recompute_pre/recompute_post, then backpropagates through them:
each block's backward_pre (hi-1's fired already), backward, backward_post.

Units, as FSDP wraps modules: one per transformer block, `block_unit(i)` = "blocks.i", and
the root, `ROOT` = "root", holding everything outside the blocks (embeddings, final
LayerNorm, head). The root's forward_pre fires first (the embedding step opens it) and its
backward_post last (the embedding's backward closes it); `GPT.units()` lists the root first.
A pipeline puts the embedding and the head on different stages, so `GPT.split_root()` gives
them a unit each, `EMBED` ("embed": wte, wpe) and `HEAD` ("head": ln_f, lm_head), each
opened and closed by its own step: the embedding step fires forward_pre and forward_post
of EMBED, the head step HEAD's, and the backwards backward_pre and backward_post of each.
"""

from __future__ import annotations

from typing import Callable

EVENTS = ("forward_pre", "forward_post", "backward_pre", "backward_post", "recompute_pre",
          "recompute_post", "backward_input_post")
ROOT = "root"  # the unit outside the blocks: forward_pre first, backward_post last
EMBED, HEAD = "embed", "head"  # ROOT split in two (GPT.split_root), for pipeline stages


def block_unit(index: int) -> str:
    """The unit name of block `index` ("blocks.3"), also its parameters' name prefix."""
    return f"blocks.{index}"


class Hooks:
    """Callbacks per event, called in registration order with the unit's name."""

    def __init__(self) -> None:
        self._fns: dict[str, list[Callable[[str], None]]] = {e: [] for e in EVENTS}

    def register(self, event: str, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call fn(unit_name) at `event`; returns a function that removes it."""
        if event not in self._fns:
            raise ValueError(f"unknown hook event {event!r}: expected one of {EVENTS}")
        self._fns[event].append(fn)
        return lambda: self._fns[event].remove(fn)

    def fire(self, event: str, unit: str) -> None:
        for fn in self._fns[event]:
            fn(unit)

    def clear(self) -> None:
        for fns in self._fns.values():
            fns.clear()
