"""Part 9 of `minipar tour`: Megatron tensor and sequence parallelism on one node of 4.

A small GPT split over tp = 4 ranks: the f/g pairs around each block, what one layer
communicates (read from the trace), what it keeps for backward (read from the ledger,
against Korthikanti et al.'s Table 2), and the loss and gradients against one device.
"""

from __future__ import annotations

from collections import Counter
import numpy as np

from ... import runtime as mp
from ...nn import GPT, GPTConfig
from ...parallel.tp.gpt import TensorParallelGPT
from ...plan import activation_bytes_per_layer
from ...runtime.ledger import fmt_bytes
from .common import Print, Record, no_recorder

DIAGRAM = """\
   x ─ f ─► ColumnParallel (W split by rows) ─► GeLU ─► RowParallel (W split by columns) ─ g ─► y
        f: identity forward, all-reduce backward      g: all-reduce forward, identity backward
   with sequence parallelism, between the blocks x is split along s:
   x_r ─ LN ─ f̄ (all-gather s) ─► Column ─► ... ─► Row ─ ḡ (reduce-scatter s) ─ dropout ─► y_r"""


def _layer(ctx: mp.Context, cfg, tp: int, sp: bool, ids: np.ndarray) -> dict:
    """One forward and backward; block 0's collectives and saved bytes, and the gradients."""
    model = TensorParallelGPT(cfg, mp.new_group(range(tp), "tp"), sequence_parallel=sp)
    marks: dict = {}
    for ev in ("forward_pre", "forward_post", "backward_pre", "backward_post"):
        model.hooks.register(ev, lambda u, ev=ev: marks.__setitem__(
            (ev, u), (len(ctx.trace.events), ctx.ledger.held("activations"))))
    loss = model.loss_and_grad(ids, ids)
    calls = {}
    for phase in ("forward", "backward"):
        lo, hi = marks[(f"{phase}_pre", "blocks.0")][0], marks[(f"{phase}_post", "blocks.0")][0]
        calls[phase] = Counter((e.name, e.nbytes) for e in ctx.trace.events[lo:hi]
                               if e.stream == "comm")
    saved = marks[("forward_post", "blocks.0")][1] - marks[("forward_pre", "blocks.0")][1]
    return {"loss": loss, "calls": calls, "saved": saved,
            "grads": model.full_parameters(grad=True)}


def tensor_parallel_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 9."""
    tp, s, b = 4, 16, 2
    cfg = GPTConfig(vocab_size=64, seq_len=s, hidden=32, num_heads=4, num_layers=2,
                    dropout=0.1, dtype="bfloat16")
    h, a = cfg.hidden, cfg.num_heads
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (s, b))
    out(f"9. Tensor and sequence parallelism (Megatron-LM): the GPT split over tp = {tp} "
        "ranks of one node")
    out(DIAGRAM)
    heads = f"{a // tp} head{'s' if a // tp > 1 else ''}"
    out(f"   GPT: l={cfg.num_layers}, h={h}, a={a} ({heads} a rank), ffn={cfg.ffn} "
        f"({cfg.ffn // tp} a rank), V={cfg.vocab_size} ({cfg.vocab_size // tp} a rank),\n"
        f"   s={s}, b={b}, bf16, dropout {cfg.dropout}")
    sbh = s * b * h * 2
    out(f"   one layer's collectives, from the trace (S = s·b·h·2 bytes = {fmt_bytes(sbh)})")
    runs = {}
    for sp in (False, True):
        name = "tp + sp" if sp else "tp"
        runs[sp] = record(f"9. {name}, bf16", mp.launch(
            lambda ctx, sp=sp: _layer(ctx, cfg, tp, sp, ids), tp))
        for phase in ("forward", "backward"):
            calls = runs[sp][0]["calls"][phase]
            what = ", ".join(f"{c} x{k}" + ("" if n == sbh else f" ({fmt_bytes(n)})")
                             for (c, n), k in sorted(calls.items()))
            out(f"   {name:<8}{phase:<9}{what}")
    out("   (tp + sp backward: the conjugates, one all-gather per column-parallel layer that "
        "rebuilds its\n    saved input, and one all-reduce of the LayerNorm and bias "
        "gradients the sequence shards left partial)")
    out("   activation bytes one layer keeps for backward, per rank: the ledger against "
        "Table 2")
    rows = (("one device", 1, False, "sbh(34 + 5as/h)"),
            ("tp", tp, False, "sbh(10 + 24/t + 5as/(ht))"),
            ("tp + sp", tp, True, "sbh(34/t + 5as/(ht))"))
    for label, t, sp, formula in rows:
        got = runs[sp][0]["saved"] if t > 1 else None
        if got is None:
            got = record("9. one device, bf16", mp.launch(
                lambda ctx: _layer(ctx, cfg, 1, False, ids), 1))[0]["saved"]
        want = activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=sp)
        out(f"   {label:<12}{got:>8,} B   {formula:<26} = {want:>8,.0f} B   "
            f"equal: {got == want}")
    cfg64 = cfg.with_(dtype="float64")
    with mp.device() as one:
        model = GPT(cfg64)
        loss0 = model.loss_and_grad(ids, ids)
        ref = {p.name: p.grad.copy() for p in model.parameters()}
    record("9. one device, float64", one)
    out("   the same step in float64, dropout on, against one device (masks: the single "
        "device's, sliced)")
    for sp in (False, True):
        got = record(f"9. {'tp + sp' if sp else 'tp'}, float64", mp.launch(
            lambda ctx, sp=sp: _layer(ctx, cfg64, tp, sp, ids), tp))[0]
        worst = max(float(np.abs(got["grads"][k] - g).max() / np.abs(g).max())
                    for k, g in ref.items())
        out(f"   {'tp + sp' if sp else 'tp':<8}loss {got['loss']:.12f} (one device "
            f"{loss0:.12f}); gathered gradients, worst relative difference {worst:.1e}")
    out("   across nodes the same all-reduces cross InfiniBand: `minipar incident a` shows "
        "the collapse")
