"""Part 8 of `minipar tour`: DDP and ZeRO-1/2/3 on 4 ranks: memory, traffic and weights,
each checked against its formula or against one device."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ... import runtime as mp
from ...data.batches import split_data_parallel
from ...nn import GPT, GPTConfig
from ...optim import AdamW
from ...parallel import zero_engine
from ...plan import dp_comm_elements, model_state_bytes
from .common import Print, Record, no_recorder


# The equivalence tests' tolerance (tests/parallel/conftest.py: RTOL, ATOL_SCALE), per
# array: |a - b| <= RTOL |b| + ATOL_SCALE max|b|. In float64 a parallel run differs from one
# device only by the order of its reductions; Adam's lr / eps slope near |g| = eps turns
# such 1e-18 differences into up to ~1e-12 of the weights after a few steps.
DP_RTOL, DP_ATOL_SCALE = 1e-12, 1e-11
_DP_STAGES = {0: ("DDP", "16Ψ"), 1: ("ZeRO-1", "4Ψ' + 12Ψ'/N"), 2: ("ZeRO-2", "2Ψ' + 14Ψ'/N"),
              3: ("ZeRO-3", "16Ψ'/N")}


def _dp_train(ctx: mp.Context, cfg, batches, stage: int, n: int) -> dict:
    """One rank of a data-parallel run: the GPT under zero_engine(stage), a step per batch."""
    model = GPT(cfg)
    engine = zero_engine(model, stage=stage, lr=1e-2, weight_decay=0.1)
    for ids, tgt in batches:
        start = len(ctx.trace.events)
        model.loss_and_grad(*split_data_parallel(ids, tgt, ctx.rank, n))
        engine.step()  # measured right after it: every unit resharded, no buffer in flight
        comm = [e for e in ctx.trace.events[start:] if e.stream == "comm"]
        held = {c: ctx.ledger.held(c) for c in ("parameters", "gradients", "optimizer_states")}
        engine.zero_grad()
    units = [] if stage == 0 else list(engine.state.values())
    return {"held": held, "sent": sum(float(e.meta["sent_bytes"]) for e in comm),
            "calls": [e.name for e in comm],
            "padding": sum(u.flat.padding for u in units),
            "root": units[0].flat.padded_numel if units else None,
            "block": (units[1].flat.numel, units[1].flat.padded_numel) if units else None,
            "params": {k[6:]: v for k, v in engine.full_state_dict().items()
                       if k.startswith("param/")}}


def data_parallel_part(out: Print, record: Record = no_recorder) -> None:
    """Part 8: DDP and ZeRO-1/2/3 on 4 ranks: memory, traffic and weights, each checked."""
    n, s, gb, steps = 4, 16, 8, 2
    cfg = GPTConfig(vocab_size=32, seq_len=s, hidden=18, num_heads=3, num_layers=2,
                    dtype="bfloat16")
    rng = np.random.default_rng(0)
    batches = [tuple(rng.integers(0, cfg.vocab_size, (2, s, gb))) for _ in range(steps)]
    topo = mp.Topology.nodes(1, gpus_per_node=n)
    runs = {st: record(f"8. {_DP_STAGES[st][0]}, bf16", mp.launch(
        lambda ctx, st=st: _dp_train(ctx, cfg, batches, st, n), n, topology=topo))
        for st in _DP_STAGES}
    psi, pad = cfg.num_parameters(), runs[1][0]["padding"]
    block, block_padded = runs[1][0]["block"]
    out(f"8. Data parallelism: a GPT on {n} ranks of one node under DDP and ZeRO-1/2/3")
    out(f"   GPT: l={cfg.num_layers}, h={cfg.hidden}, a={cfg.num_heads}, V={cfg.vocab_size}, "
        f"s={s}: Ψ = {psi:,} parameters; global batch {gb}, {gb // n} sequences per rank;")
    out(f"   {steps} AdamW steps, bf16 weights and gradients, float32 master weights, m and v")
    out(f"   ZeRO's flat buffers split evenly over N = {n}: each block's {block:,} elements "
        f"are padded to {block_padded:,},")
    out(f"   Ψ' = Ψ + {pad} = {psi + pad:,} (the engine's padding); DDP pads nothing")
    out("   model-state bytes per rank after the last step, the ledger against "
        "minipar.plan.model_state_bytes")
    cats = ("parameters", "gradients", "optimizer_states")
    out(f"   {'stage':<19}{'parameters':>11}{'gradients':>11}{'optimizer_states':>18}"
        f"{'total':>10}")
    for st, (name, formula) in _DP_STAGES.items():
        res = runs[st]
        held = res[0]["held"]
        alike = all(r["held"] == held for r in res)
        f = model_state_bytes(psi, st, n, padding=res[0]["padding"])
        rows = (("ledger", [held[c] for c in cats], f"every rank alike: {alike}"),
                ("formula", [f[c] for c in cats], formula))
        for i, (what, vals, note) in enumerate(rows):
            label = f"{st} {name}" if i == 0 else ""
            out(f"   {label:<10}{what:<9}" + "".join(f"{v:>{w},.0f}" for v, w in
                                                   zip(vals, (11, 11, 18)))
                + f"{sum(vals):>10,.0f}   {note}")
    out("   bytes each rank sends in one step, from the trace, against the ring theory (2 "
        "bytes an element)")
    for st, (name, _) in _DP_STAGES.items():
        res = runs[st]
        sent, calls = res[0]["sent"], Counter(res[0]["calls"])
        alike = all(r["sent"] == sent for r in res)
        what = ", ".join(f"{c} x{k}" for c, k in sorted(calls.items(), reverse=True))
        theory = 2 * dp_comm_elements(psi, st, n, padding=res[0]["padding"])
        if st < 3:
            formula = "2Ψ(N-1)/N" if st == 0 else "2Ψ'(N-1)/N"
            out(f"   {st} {name:<8}{what:<34}{sent:>9,.0f} B  theory {formula} x 2 = "
                f"{theory:,.0f} B")
        else:  # the root stays whole from forward to backward: one all-gather saved
            saved = 2 * res[0]["root"] * (n - 1) / n
            out(f"   {st} {name:<8}{what:<34}{sent:>9,.0f} B  theory (3Ψ' - Ψ'_root)(N-1)/N x 2 "
                f"= {theory - saved:,.0f} B")
            out(f"             (ZeRO's 3Ψ'(N-1)/N x 2 = {theory:,.0f} B, less the root's "
                f"backward all-gather, {saved:,.0f} B)")
        if not alike:
            out("   (ranks differ)")
    # the same steps in float64: one device on the whole batch, then each stage on 4 ranks
    cfg64 = cfg.with_(dtype="float64")
    with mp.device() as one:
        model = GPT(cfg64)
        opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        for ids, tgt in batches:
            model.loss_and_grad(ids, tgt)
            opt.step()
            opt.zero_grad()
        ref = {p.name: p.data.copy() for p in model.parameters()}
    record("8. one device, float64", one)
    out(f"   the same {steps} steps in float64: updated weights against one device on the "
        f"whole batch")
    for st, (name, _) in _DP_STAGES.items():
        got = record(f"8. {name}, float64", mp.launch(
            lambda ctx, st=st: _dp_train(ctx, cfg64, batches, st, n), n,
            topology=topo))[0]["params"]
        worst = max(float(np.abs(got[k] - w).max()) for k, w in ref.items())
        equal = all(bool(np.all(np.abs(got[k] - w) <= DP_RTOL * np.abs(w)
                                + DP_ATOL_SCALE * np.abs(w).max())) for k, w in ref.items())
        out(f"   {st} {name:<8}max |w - w_one_device| = {worst:.1e}; equal within "
            f"{DP_RTOL:g}|w| + {DP_ATOL_SCALE:g} max|w|: {equal}")
