"""A pipeline stage: blocks lo..hi-1 of a GPT; the first stage embeds, the last computes the loss.

    stage s of S, blocks lo..hi-1:
        forward    x_hi = blocks(x_lo)            stage 0:     x_lo = embed(ids)
                                                  stage S - 1: loss = head(x_hi, targets)
        backward   dx_lo = blocks^T(dx_hi)        stage S - 1: dx_hi = head^T(loss scale)
                                                  stage 0:     embed^T(dx_lo), no output
        split      backward_input(i) = I, the backward with the weights' gradients
                   deferred to a WeightGradStore kept per micro-batch; backward_weight(i)
                   = W, which runs them (zero-bubble schedules, nn/weight_grads.py)

A stage is a view of the GPT its rank built (nn/gpt.py's three steps, run with lo..hi): the
weights come from the same seeds as the single-device model's. `parallelize` builds only
the rank's own blocks (GPT's blocks_held; the others are RemoteBlocks without parameters),
and whatever else the model holds that other stages run (the embedding, the head) is given
back to the rank's ledger (`build_stages`). It keeps each
in-flight micro-batch's records (the `Saved` objects the steps return, on the ledger as
activations) from its forward until its backward — with the backward split, what only I
needs until I and the W records until W — so several micro-batches can be in flight at
once (torch.distributed.pipelining's PipelineStage; Megatron-LM's model chunk).

Layers. `split_layers(L, S)` gives each stage q = L // S blocks and the first r = L % S
stages one more, as torchtitan's split does (without its option to count the embedding and
the head as layers); Megatron-LM refuses a remainder unless the first and last stages'
sizes are given. A list of S counts (summing to L; a count may be 0) sets them by hand.

Units. With S > 1 the model's root unit is split (GPT.split_root): stage 0 holds EMBED (wte,
wpe) and stage S - 1 holds HEAD (ln_f and lm_head), so every unit's hooks open and close on
one stage. Tied embeddings: the last stage's head multiplies by its rank's own copy of wte,
listed in HEAD, as Megatron keeps a copy of the word embeddings on the last stage; the two
copies' gradients are summed over the embedding group after the backward (runner.py).

Dropout. The single-device model draws every mask from one generator, micro-batch after
micro-batch, in layer order: embedding, block 0, ..., block L-1. A draw of n values moves
the generator n steps (PCG64), so the masks of (micro-batch i, block l) start at a known
position of that stream, with E values drawn per embedding and D per block:

    position(i, embedding) = i·T,   position(i, block l) = i·T + E + l·D,   T = E + L·D
    E = s·b·h,   D = s·b·h (attention output) + a·s²·b (attention probabilities)
                   + s·b·h (MLP output)                                    (0 when p = 0)

`DropoutStream` hands each (micro-batch, stage) a generator moved to its position
(PCG64.advance, as parallel/tp/random.py slices masks), so a pipeline draws exactly the
masks of one device running the same micro-batches in order, in whatever order its
schedule runs them; after the step each rank's model generator moves past all m·T draws,
as the single device's has. A layer that draws more (or less) is caught at once: after a
forward the generator must stand where the formula says, or the stage raises.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ...nn.hooks import EMBED, HEAD, ROOT, block_unit
from ...nn.parameter import Parameter
from ...nn.weight_grads import WeightGradStore
from .actions import ScheduleError

#: what seeds the generators `DropoutStream.at` makes before it sets their state: a fixed
#: SeedSequence (an unseeded PCG64 would read the OS's entropy each time, twice as slow)
_ANY_SEED = np.random.SeedSequence(0)


def split_layers(num_layers: int, num_stages: int,
                 layers: Optional[Sequence[int]] = None) -> list[tuple[int, int]]:
    """[(lo, hi)] per stage: blocks lo..hi-1. Default: q = L // S each, the first L % S
    stages one more; `layers`: one count per stage, summing to L."""
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ScheduleError(f"a pipeline has num_stages >= 1 stages, got {num_stages!r}")
    if layers is None:
        if num_stages > num_layers:
            raise ScheduleError(
                f"{num_stages} stages need at least {num_stages} layers (one block each, by "
                f"default), but the model has {num_layers}: use at most {num_layers} stages "
                f"(pp·chunks), more layers, or give each stage's count by hand (0 allowed)")
        q, r = divmod(num_layers, num_stages)
        layers = [q + (s < r) for s in range(num_stages)]
    else:
        layers = list(layers)
        if len(layers) != num_stages or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in layers):
            raise ScheduleError(f"layers gives the block count of each of the {num_stages} "
                                f"stages (integers >= 0), got {layers!r}")
        if sum(layers) != num_layers:
            raise ScheduleError(f"layers {layers} sum to {sum(layers)}, but the model has "
                                f"{num_layers} blocks: the stages must hold each block once")
    bounds = np.concatenate([[0], np.cumsum(layers)]).astype(int).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def dropout_draws(cfg, seq: int, batch: int) -> tuple[int, int]:
    """(E, D): the values one micro-batch [seq, batch] draws for the embedding's dropout and
    for one block's (attention probabilities [b, a, s, s], two residual [s, b, h])."""
    if cfg.dropout == 0:
        return 0, 0
    sbh = seq * batch * cfg.hidden
    return sbh, 2 * sbh + batch * cfg.num_heads * seq * seq


class DropoutStream:
    """Generators at each (micro-batch, stage)'s place in the single-device mask stream.

    generator: the model's dropout generator (left untouched until `finish`); seq, batch:
    the shape the single device draws over per micro-batch; microbatches: m."""

    def __init__(self, generator: np.random.Generator, cfg, seq: int, batch: int,
                 microbatches: int):
        if not isinstance(generator.bit_generator, np.random.PCG64):
            raise TypeError(f"pipeline dropout moves the generator with PCG64.advance; got a "
                            f"{type(generator.bit_generator).__name__}: build it with "
                            "np.random.default_rng(seed)")
        self.generator, self.m = generator, microbatches
        self.embed, self.block = dropout_draws(cfg, seq, batch)
        self.per_microbatch = self.embed + cfg.num_layers * self.block  # T

    def position(self, microbatch: int, lo: int, first: bool) -> int:
        """Draws before micro-batch i's embedding (first) or its block lo."""
        return microbatch * self.per_microbatch + (0 if first else self.embed + lo * self.block)

    def at(self, position: int) -> np.random.Generator:
        """A new generator standing `position` draws past the model generator's state."""
        g = np.random.Generator(np.random.PCG64(_ANY_SEED))  # its state is replaced below
        g.bit_generator.state = self.generator.bit_generator.state
        g.bit_generator.advance(position)
        return g

    def finish(self) -> None:
        """Move the model's generator past the step's m·T draws, as one device's moved."""
        self.generator.bit_generator.advance(self.m * self.per_microbatch)


class PipelineStage:
    """Stage `index` of `num_stages`: blocks lo..hi-1 of `model` (a GPT or a layout of it)."""

    def __init__(self, model, index: int, num_stages: int, lo: int, hi: int):
        if not 0 <= index < num_stages:
            raise ScheduleError(f"stage index {index} is outside 0..{num_stages - 1}")
        L = len(model.blocks)
        if not 0 <= lo <= hi <= L:
            raise ScheduleError(f"stage {index}: blocks {lo}..{hi - 1} are not a range of the "
                                f"model's {L} blocks")
        self.model, self.index, self.num_stages, self.lo, self.hi = model, index, num_stages, lo, hi
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        if num_stages > 1 and not model.root_is_split:
            model.split_root()  # EMBED on the first stage, HEAD on the last
        self._saved: dict[int, tuple] = {}  # micro-batch -> (embed, blocks, head) records
        self._weights: dict[int, WeightGradStore] = {}  # micro-batch -> W's records (after I)

    def __repr__(self) -> str:
        return (f"PipelineStage({self.index} of {self.num_stages}, blocks {self.lo}.."
                f"{self.hi - 1}{', embeds' if self.is_first else ''}"
                f"{', loss' if self.is_last else ''})")

    # ---- what it holds ------------------------------------------------------------------
    def units(self) -> list[tuple[str, list[Parameter]]]:
        """[(unit, parameters)] this stage runs: EMBED, its blocks, HEAD (ROOT when S = 1)."""
        m = self.model
        blocks = [(block_unit(i), m.blocks[i].parameters()) for i in range(self.lo, self.hi)]
        if self.num_stages == 1:
            return [(ROOT, m.parameters_from(*m.root_parts))] + blocks
        first = [(EMBED, m.parameters_from("wte", "wpe"))] if self.is_first else []
        head = "wte" if m.cfg.tie_embeddings else "lm_head"  # tied: this rank's copy of wte
        last = [(HEAD, m.parameters_from("ln_f", head))] if self.is_last else []
        return first + blocks + last

    def parameters(self) -> list[Parameter]:
        """The stage's parameters, in unit order."""
        return [p for _, ps in self.units() for p in ps]

    @property
    def in_flight(self) -> list[int]:
        """The micro-batches whose forward ran and whose backward (or W) has not."""
        return sorted({*self._saved, *self._weights})

    # ---- forward and backward -----------------------------------------------------------
    def forward(self, microbatch: int, x: np.ndarray, targets: Optional[np.ndarray] = None,
                rng=None):
        """The stage's output for micro-batch i: x_hi, or on the last stage its loss.
        x: ids int [s, b] on the first stage, else [s, b, h]; targets: int [s, b] (last)."""
        if microbatch in self._saved or microbatch in self._weights:
            raise ScheduleError(f"stage {self.index} runs the forward of micro-batch "
                                f"{microbatch} twice without its backward")
        m = self.model
        s_embed = s_head = None
        if self.is_first:
            x, s_embed = m.embed_forward(x, rng)  # x: [s, b, h]
        x, s_blocks = m.blocks_forward(x, rng, self.lo, self.hi)  # x: [s, b, h]
        if self.is_last:
            if targets is None:
                raise ScheduleError(f"stage {self.index} computes the loss: give the "
                                    f"micro-batch's targets")
            x, s_head = m.head_forward(x, targets)  # x: the loss, a float
        self._saved[microbatch] = (s_embed, s_blocks, s_head)
        return x

    def backward(self, microbatch: int, dy: Optional[np.ndarray] = None,
                 loss_scale: float = 1.0) -> Optional[np.ndarray]:
        """dx_lo of micro-batch i from dy = dx_hi ([s, b, h]); the last stage starts from
        d(loss_scale · loss). Accumulates the parameters' gradients; the first stage
        returns None (the ids have no gradient). Releases the micro-batch's records."""
        return self._backward(microbatch, dy, loss_scale, None)

    def backward_input(self, microbatch: int, dy: Optional[np.ndarray] = None,
                       loss_scale: float = 1.0) -> Optional[np.ndarray]:
        """I: dx_lo as `backward` returns it, the weights' gradients deferred to
        backward_weight(i). Frees what only I read; the W records stay on the ledger."""
        store = WeightGradStore()
        dx = self._backward(microbatch, dy, loss_scale, store)
        self._weights[microbatch] = store
        return dx

    def backward_weight(self, microbatch: int) -> None:
        """W: micro-batch i's weight gradients, accumulated; each unit's backward_post fires
        after them (a data-parallel engine's gradients are complete only from here)."""
        store = self._weights.pop(microbatch, None)
        if store is None:
            raise ScheduleError(f"stage {self.index} runs W of micro-batch {microbatch}, "
                                f"whose I it has not run (or whose W ran already): I first")
        self.model.backward_weight(store)

    def _backward(self, microbatch: int, dy, loss_scale: float,
                  store: Optional[WeightGradStore]) -> Optional[np.ndarray]:
        if microbatch not in self._saved:
            raise ScheduleError(f"stage {self.index} runs the backward of micro-batch "
                                f"{microbatch}, whose forward it has not run (or whose "
                                f"backward ran already)")
        s_embed, s_blocks, s_head = self._saved.pop(microbatch)
        m = self.model
        if self.is_last:
            dy = m.head_backward(s_head, loss_scale, store)  # dy: [s, b, h]
        dx = m.blocks_backward(dy, s_blocks, self.lo, self.hi, store, loss_scale)  # dx: [s, b, h]
        if self.is_first:
            m.embed_backward(dx, s_embed, store)
            return None
        return dx


class RankStages:
    """The stages one pipeline rank holds, seen as one model by a data-parallel engine
    (Megatron-LM wraps each model chunk in its DDP; here one engine spans a rank's chunks):
    `units()` lists the stages' units in stage order, a tied wte once (in EMBED) when the
    rank holds the first and the last stage; hooks, cfg and the dropout generator are the
    GPT's. No unit is ROOT when the stages are more than one, so no hook ends a backward:
    the engine reduces when the pipeline tells it (finish_grad_sync)."""

    def __init__(self, stages: Sequence[PipelineStage]):
        if not stages:
            raise ScheduleError("RankStages needs the rank's stages (build_stages), got none")
        self.stages = list(stages)
        self.model = self.stages[0].model
        self.cfg, self.hooks = self.model.cfg, self.model.hooks

    @property
    def dropout_generator(self) -> np.random.Generator:
        return self.model.dropout_generator

    def units(self) -> list[tuple[str, list[Parameter]]]:
        out, seen = [], set()
        for st in self.stages:
            for unit, ps in st.units():
                mine = [p for p in ps if id(p) not in seen]
                seen.update(id(p) for p in mine)
                if mine:
                    out.append((unit, mine))
        return out

    def parameters(self) -> list[Parameter]:
        return [p for _, ps in self.units() for p in ps]

    def __repr__(self) -> str:
        return f"RankStages({', '.join(repr(st) for st in self.stages)})"


def build_stages(model, placement: dict, pp_rank: int,
                 layers: Optional[Sequence[int]] = None) -> list[PipelineStage]:
    """This rank's stages (stage -> rank in `placement`, as ScheduleInfo gives it), in stage
    order, over blocks split by `split_layers`. The parameters of the stages other ranks
    hold are released from this rank's ledger: a pipeline rank holds its stages only."""
    S = len(placement)
    bounds = split_layers(len(model.blocks), S, layers)
    mine = [PipelineStage(model, s, S, *bounds[s]) for s in sorted(placement)
            if placement[s] == pp_rank]
    if not mine:
        raise ScheduleError(f"pipeline rank {pp_rank} holds no stage of the placement "
                            f"{placement}")
    kept = {id(p) for st in mine for p in st.parameters()}
    for p in model.parameters():
        if id(p) not in kept:
            p.release()  # another rank's: not on this device
    return mine
