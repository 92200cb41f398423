"""The backward split in two: I (the input's gradient) now, W (the weights' gradients) later.

    fused   dx = layer.backward(dy, saved)                   dx and dW in one pass
    split   dx = layer.backward(dy, saved, store=store)      I: what the layer below waits for
            store.run()                                      W: the weight gradients, later

(Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2: B = I + W; DualPipe's
`WeightGradStore` keeps the deferred work the same way.) For y = x W^T + b, I is dx = dy W
and W is dW = dy^T x, db = sum dy: W is off the critical path, since no earlier layer
needs it, so a pipeline can run it wherever a rank would otherwise stand idle.

I pushes one *record* per layer with weights: the tensors W will read, a `Saved` on the
ledger as activations, and the function W runs on it. W runs the records in push order.
What each layer's I frees (everything its forward saved that W does not read) and what its
record holds, with x the layer's input and dy the gradient of its output:

    Linear        holds x (the forward's record, kept) and dy; W: dW = dy^T x, db = sum dy
    LayerNorm     holds dgamma, dbeta ([h] each: I computes xhat for dx anyway and reduces
                  both there, as zero-bubble Megatron does); W accumulates them; x is freed
    embeddings    the embedding step holds the ids, the positions and dx0 once, for both
                  lookups (they read the same dx0); W scatters dx0 into wte and wpe
    attention core, GeLU, dropout, softmax, cross-entropy: no weights, all I, all freed

A transformer block's records thus hold, with f the MLP's width, (8h + 2f)·s·b + 4h
elements (x and dy of qkv, proj, fc1, fc2, and the two LayerNorms' [h] pairs):
16 sbh + 4h for f = 4h, in every recomputation mode (the rerun forward's records are
kept instead of the forward's).

FLOPs: I + W = B exactly. Every matmul of the fused backward runs once, in I (dgrad, the
attention core's four, a recomputed forward) or in W (wgrad); W charges 2·N·in·out per
linear. Bits: W runs the very operations of the fused backward on the very arrays, so the
gradients are the fused ones bit for bit (tests/nn/test_split_backward.py).

Units. The GPT's steps open a unit's records where they fire its backward_pre hook
(`store.open(unit, closes)`): W runs each unit's records, then `unit_done(unit)` — the
model's finish_backward and backward_post hook — if the unit's backward ends there (the
head's part of an unsplit root does not: the embedding's does). A unit's gradients are
complete only after its W, so that is where data-parallel engines may reduce them.
"""

from __future__ import annotations

from typing import Callable, Optional

from .saved import Saved

Record = tuple[Callable[[Saved], None], Saved]


class WeightGradStore:
    """The deferred W work of one backward (one micro-batch): records grouped by unit."""

    def __init__(self) -> None:
        self._groups: list[tuple[Optional[str], bool, list[Record]]] = []

    def open(self, unit: Optional[str], closes: bool = True) -> None:
        """Records pushed from now on belong to `unit`; `closes`: its backward ends with them."""
        self._groups.append((unit, closes, []))

    def put(self, fn: Callable[[Saved], None], record: Saved) -> None:
        """Defer fn(record) to W; `record` stays on the ledger until then."""
        if not self._groups:
            self.open(None)
        self._groups[-1][2].append((fn, record))

    def __len__(self) -> int:
        return sum(len(items) for _, _, items in self._groups)

    def units(self) -> list[Optional[str]]:
        """The units whose records wait here, in the order W will run them."""
        return [unit for unit, _, _ in self._groups]

    def nbytes(self) -> int:
        """Bytes the records hold (what the ledger holds for this backward's W)."""
        return sum(record.nbytes() for _, _, items in self._groups for _, record in items)

    def run(self, unit_done: Optional[Callable[[str], None]] = None) -> None:
        """W: every record in push order, each released after its function ran; after a
        closing unit's records, unit_done(unit). The store is empty afterwards."""
        groups, self._groups = self._groups, []
        for unit, closes, items in groups:
            for fn, record in items:
                fn(record)
                record.release()
            if closes and unit is not None and unit_done is not None:
                unit_done(unit)
