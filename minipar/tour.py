"""`minipar tour`: a guided run of the simulated cluster.

Eight simulated H100s on two nodes of four; every collective runs once on tiny,
rank-dependent data so you can see what moved where, then once more on megabytes so the
simulated clock has something to say; a ring all-reduce built from send/recv shows its
steps; the same all-reduce inside a node and across nodes shows why tensor parallelism
stays on NVLink; two timelines show the collectives and then compute and communication
overlapping on their streams; one training step of the single-device GPT, with its
memory and FLOPs accounted; and the same GPT trained data-parallel on 4 ranks under DDP
and ZeRO-1/2/3, its memory and traffic against the formulas and its weights against the
single device; and the GPT split by Megatron's tensor and sequence parallelism, its
collectives, its activation memory against the paper and its gradients against one device,
closes the tour (tour_tensor.py).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from . import runtime as mp
from .runtime import cost
from .runtime.algorithms import ring_all_reduce, ring_schedule
from .runtime.ledger import fmt_bytes

Print = Callable[[str], None]


def _fmt_t(seconds: float) -> str:
    return f"{seconds * 1e6:9.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def _arr(a) -> str:
    return np.array2string(np.asarray(a), separator=",", max_line_width=200)


def _semantics(ctx: mp.Context) -> dict:
    """Every collective on tiny data: x_r = [10 r, 10 r + 1]."""
    r, n = ctx.rank, ctx.world_size
    x = np.array([10.0 * r, 10.0 * r + 1])
    out = {"input": x}
    out["all_reduce"] = mp.all_reduce(x)
    out["all_gather"] = mp.all_gather(x)
    out["reduce_scatter"] = mp.reduce_scatter(np.arange(2.0 * n) + 100 * r)
    out["broadcast"] = mp.broadcast(x if r == 3 else None, src=3)
    out["reduce"] = mp.reduce(x, dst=0)
    out["gather"] = mp.gather(x, dst=0)
    out["scatter"] = mp.scatter([np.array([i, i]) * 1.0 for i in range(n)] if r == 0 else None,
                                src=0)
    out["all_to_all"] = mp.all_to_all([np.array([10.0 * r + j]) for j in range(n)])
    left, right = (r - 1) % n, (r + 1) % n
    mp.send(x, dst=right)
    out["recv"] = mp.recv(src=left)
    mp.barrier()
    return out


def _costs(ctx: mp.Context, nbytes: int) -> None:
    """Every collective on `nbytes` of float32 per rank, for the clock."""
    n = ctx.world_size
    x = np.ones(nbytes // 4, np.float32)
    mp.all_reduce(x)
    mp.all_gather(x[: x.size // n])
    mp.reduce_scatter(x)
    mp.broadcast(x, src=0)
    mp.all_to_all_single(x)
    mp.barrier()


def run_tour(out: Print = print, nbytes: int = 4 << 20, trace_path: Optional[str] = None,
             ascii: bool = False, width: int = 72) -> mp.LaunchResult:
    """Run the tour and print it through `out`; returns the launch result of the costs run."""
    from .viz.chrome import to_chrome_trace
    from .viz.timeline import COLLECTIVE_LETTERS, render_timeline, summarize

    topo = mp.Topology.nodes(2, gpus_per_node=4)
    n = topo.world_size
    out("minipar tour: one program, run once per simulated device")
    out(f"cluster: {topo.describe()}")
    out("ranks 0-3 sit on node 0, ranks 4-7 on node 1\n")

    out("1. What moves where (x_r = [10r, 10r+1] on rank r; results as rank 0 sees them"
        " unless noted)")
    res = mp.launch(_semantics, n, topology=topo)
    r0, r5 = res[0], res[5]
    rows = [
        ("all_reduce(x)", "sum over ranks", r0["all_reduce"]),
        ("all_gather(x)", "concat over ranks", r0["all_gather"]),
        ("reduce_scatter(y_r)", "rank 5's chunk of the sum", r5["reduce_scatter"]),
        ("broadcast(x, src=3)", "rank 3's x everywhere", r0["broadcast"]),
        ("reduce(x, dst=0)", "sum, on rank 0 only", r0["reduce"]),
        ("gather(x, dst=0)", "all x, on rank 0 only", np.stack(r0["gather"])[:, 0]),
        ("scatter(p, src=0)", "rank 5 gets piece 5", r5["scatter"]),
        ("all_to_all(p_r)", "rank 5 gets p_j[5] from each j", np.concatenate(r5["all_to_all"])),
        ("send right / recv left", "rank 5 gets rank 4's x", r5["recv"]),
    ]
    for call, meaning, value in rows:
        out(f"   {call:<24}{meaning:<32}{_arr(value)}")
    out("   (y_r = [0, 1, ..., 15] + 100 r; gather shows the first element of each x)\n")

    out(f"2. What it costs: every collective on {fmt_bytes(nbytes)} of float32 per rank")
    res = mp.launch(lambda ctx: _costs(ctx, nbytes), n, topology=topo)
    events = res.contexts[0].trace.of("comm")
    out(f"   {'collective':<16}{'algorithm':<14}{'time':>13}{'algbw':>12}{'busbw':>12}"
        f"{'sent by r0':>13}  formula")
    for e in events:
        out(f"   {e.name:<16}{e.meta['algorithm']:<14}{_fmt_t(e.duration):>13}"
            f"{e.meta['algbw'] / 1e9:>9.1f} GB/s{e.meta['busbw'] / 1e9:>7.1f} GB/s"
            f"{fmt_bytes(e.meta['sent_bytes']):>13}  {e.meta['formula']}")
    out("   algbw = S / t;  busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for gathers,\n"
        "   scatters and all_to_all: busbw compares with the link bandwidth (nccl-tests).\n")

    out("3. A ring all-reduce built from send/recv (4 ranks of node 0), step by step")
    for s in ring_schedule(4):
        if s.rank == 0:
            out(f"   rank 0, {s.phase:<15} step {s.step}: send chunk {s.send_chunk} to rank "
                f"{s.send_to}, receive chunk {s.recv_chunk} from rank {s.recv_from}")
    ring = mp.launch(lambda ctx: _timed(ctx, lambda x: ring_all_reduce(x), nbytes), 4)
    direct = mp.launch(lambda ctx: _timed(ctx, lambda x: mp.all_reduce(x), nbytes), 4)
    formula = cost.ring_all_reduce_time(nbytes, 4, topo.intra)
    out(f"   {fmt_bytes(nbytes)}: ring of sends took {_fmt_t(ring[0][0]).strip()}, the direct "
        f"all_reduce {_fmt_t(direct[0][0]).strip()}, formula 2(n-1)a + 2(n-1)/n*S/B = "
        f"{_fmt_t(formula).strip()}; same result: {bool(np.array_equal(ring[0][1], direct[0][1]))}\n")

    out("4. Why tensor parallelism stays inside a node: all_reduce over 4 ranks")
    same = mp.launch(lambda ctx: _group_allreduce(ctx, (0, 1, 2, 3), (4, 5, 6, 7), nbytes),
                     n, topology=topo)
    split = mp.launch(lambda ctx: _group_allreduce(ctx, (0, 1, 4, 5), (2, 3, 6, 7), nbytes),
                      n, topology=topo)
    t_same, t_split = same[0], split[0]
    out(f"   group {{0,1,2,3}} (one node, NVLink):     {_fmt_t(t_same)}")
    out(f"   group {{0,1,4,5}} (two nodes, InfiniBand): {_fmt_t(t_split)}   "
        f"{t_split / t_same:.1f}x slower\n")

    out("5. The collectives of part 2 on the timeline (one row per rank, a letter each)")
    out(render_timeline(res.events(), n, width=width, ascii=ascii, symbols=COLLECTIVE_LETTERS))
    out("")
    out("6. Overlap: compute on one stream, communication on another")
    out("   each rank computes 4 layers' gradients (backward, last layer first) and starts an")
    out("   asynchronous all_reduce of each as soon as it is ready; it waits once, at the end")
    res = mp.launch(lambda ctx: _overlap(ctx, nbytes), n, topology=topo)
    all_events = res.events()
    out(render_timeline(all_events, n, width=width, ascii=ascii))
    out(summarize(all_events, n))
    out("")
    _single_device_step(out)
    out("")
    _data_parallel(out)
    out("")
    from .tour_tensor import tensor_parallel_part
    tensor_parallel_part(out)
    if trace_path:
        to_chrome_trace(all_events, trace_path, topology=topo)
        out(f"\nChrome trace written to {trace_path}: open it in https://ui.perfetto.dev "
            "or chrome://tracing")
    return res


def _single_device_step(out: Print) -> None:
    """Part 7: one bf16 training step of a small GPT, with every byte and FLOP accounted."""
    from .nn import GPT, GPTConfig
    from .optim import AdamW, MixedPrecisionOptimizer
    from .plan import activation_bytes_per_layer, model_flops

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
            f"{_fmt_t(ctx.clock.now).strip()} on one {ctx.device.name}")


# The equivalence tests' tolerance (tests/parallel/conftest.py: RTOL, ATOL_SCALE), per
# array: |a - b| <= RTOL |b| + ATOL_SCALE max|b|. In float64 a parallel run differs from one
# device only by the order of its reductions; Adam's lr / eps slope near |g| = eps turns
# such 1e-18 differences into up to ~1e-12 of the weights after a few steps.
DP_RTOL, DP_ATOL_SCALE = 1e-12, 1e-11
_DP_STAGES = {0: ("DDP", "16Ψ"), 1: ("ZeRO-1", "4Ψ' + 12Ψ'/N"), 2: ("ZeRO-2", "2Ψ' + 14Ψ'/N"),
              3: ("ZeRO-3", "16Ψ'/N")}


def _dp_train(ctx: mp.Context, cfg, batches, stage: int, n: int) -> dict:
    """One rank of a data-parallel run: the GPT under zero_engine(stage), a step per batch."""
    from .data.batches import split_data_parallel
    from .nn import GPT
    from .parallel import zero_engine

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


def _data_parallel(out: Print) -> None:
    """Part 8: DDP and ZeRO-1/2/3 on 4 ranks: memory, traffic and weights, each checked."""
    from collections import Counter

    from .nn import GPT, GPTConfig
    from .optim import AdamW
    from .plan import dp_comm_elements, model_state_bytes

    n, s, gb, steps = 4, 16, 8, 2
    cfg = GPTConfig(vocab_size=32, seq_len=s, hidden=18, num_heads=3, num_layers=2,
                    dtype="bfloat16")
    rng = np.random.default_rng(0)
    batches = [tuple(rng.integers(0, cfg.vocab_size, (2, s, gb))) for _ in range(steps)]
    topo = mp.Topology.nodes(1, gpus_per_node=n)
    runs = {st: mp.launch(lambda ctx, st=st: _dp_train(ctx, cfg, batches, st, n), n,
                          topology=topo) for st in _DP_STAGES}
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
    with mp.device():
        model = GPT(cfg64)
        opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        for ids, tgt in batches:
            model.loss_and_grad(ids, tgt)
            opt.step()
            opt.zero_grad()
        ref = {p.name: p.data.copy() for p in model.parameters()}
    out(f"   the same {steps} steps in float64: updated weights against one device on the "
        f"whole batch")
    for st, (name, _) in _DP_STAGES.items():
        got = mp.launch(lambda ctx, st=st: _dp_train(ctx, cfg64, batches, st, n), n,
                        topology=topo)[0]["params"]
        worst = max(float(np.abs(got[k] - w).max()) for k, w in ref.items())
        equal = all(bool(np.all(np.abs(got[k] - w) <= DP_RTOL * np.abs(w)
                                + DP_ATOL_SCALE * np.abs(w).max())) for k, w in ref.items())
        out(f"   {st} {name:<8}max |w - w_one_device| = {worst:.1e}; equal within "
            f"{DP_RTOL:g}|w| + {DP_ATOL_SCALE:g} max|w|: {equal}")


def _overlap(ctx: mp.Context, nbytes: int) -> None:
    """Backward of 4 layers with each layer's gradient all-reduced asynchronously."""
    flops = 2 * 2 * 4096 * 4096 * 2048  # two matmuls of a 4096 x 4096 layer, 2048 tokens
    works = []
    for layer in reversed(range(4)):
        ctx.compute(flops, "bfloat16", name="backward", label=f"layer {layer}")
        grad = np.full(nbytes // 4, float(ctx.rank), np.float32)
        works.append(mp.all_reduce(grad, async_op=True))
    for w in works:
        w.wait()


def _timed(ctx: mp.Context, fn, nbytes: int):
    x = np.arange(nbytes // 4, dtype=np.float32) % 7 + ctx.rank
    t0 = ctx.clock.now
    y = fn(x)
    return ctx.clock.now - t0, y


def _group_allreduce(ctx: mp.Context, a: tuple, b: tuple, nbytes: int) -> float:
    g = mp.new_group(a if ctx.rank in a else b, name="tp")
    t0 = ctx.clock.now
    mp.all_reduce(np.ones(nbytes // 4, np.float32), group=g)
    return ctx.clock.now - t0
