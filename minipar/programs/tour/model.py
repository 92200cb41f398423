"""Part 7 of `minipar tour`: one bf16 training step of the single-device GPT, with every
byte and FLOP accounted."""

from __future__ import annotations

import numpy as np

from ... import runtime as mp
from ...nn import GPT, GPTConfig
from ...optim import AdamW, MixedPrecisionOptimizer
from ...plan import activation_bytes_per_layer, model_flops
from ...runtime.ledger import fmt_bytes
from .common import Print, Record, fmt_t, no_recorder


def single_device_part(out: Print, record: Record = no_recorder) -> None:
    """Part 7: one bf16 training step of a small GPT, with every byte and FLOP accounted."""
    s, b = 32, 4
    cfg = GPTConfig(vocab_size=128, seq_len=s, hidden=64, num_heads=4, num_layers=2,
                    dropout=0.1, dtype="bfloat16")
    out("7. The model every parallel form is checked against: one bf16 training step of a GPT")
    with mp.device() as ctx:
        model = GPT(cfg)
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), dtype="bfloat16", lr=1e-3)
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (s, b))
        loss, cache = model.forward(ids, np.roll(ids, -1, axis=0), np.random.default_rng(0))
        act = ctx.ledger.held("activations")
        model.backward(cache)
        opt.step()
        psi = model.num_parameters()
        flops = sum(e.flops for e in ctx.trace.of("compute"))
        per_layer = activation_bytes_per_layer(s, b, cfg.hidden, cfg.num_heads)
        out(f"   GPT: l={cfg.num_layers}, h={cfg.hidden}, a={cfg.num_heads}, V={cfg.vocab_size}, "
            f"s={s}, b={b}: {psi:,} parameters (psi); loss {loss:.4f}")
        for cat, per in (("parameters", 2), ("gradients", 2), ("optimizer_states", 12)):
            held = ctx.ledger.held(cat)
            out(f"   {cat:<17}{fmt_bytes(held):>12}  = {held / psi:>4g} bytes x psi "
                f"(expected {per})")
        out(f"   activations after forward {fmt_bytes(act)}; per layer "
            f"sbh(34 + 5as/h) = {fmt_bytes(per_layer)} (Korthikanti et al. 2022)")
        out(f"   FLOPs on the clock {flops:,.0f} = 72Bslh^2(1 + s/6h + V/12lh) = "
            f"{model_flops(b, s, cfg.num_layers, cfg.hidden, cfg.vocab_size):,.0f}; "
            f"{fmt_t(ctx.clock.now).strip()} on one {ctx.device.name}")
    record("7. one bf16 training step", ctx)
