"""Part 15 of `minipar tour`: the planner, memory first, then time, then the search.

    the small check    a GPT trained by parallelize on the tour's 8 ranks (dp 2, pp 2 under
                       1F1B, tp 2 with SP, ZeRO-1, float32): the planner's parameters,
                       gradients and optimizer states of the first pipeline rank against
                       that rank's ledger, held and at the peak, to the byte
    at scale           Llama 3 70B on 256 H100s (TP 8, PP 4, DP 8, interleaved 1F1B,
                       SP, selective recompute, the distributed optimizer): the busiest
                       rank's memory by category and the step's time by term
    the search         the three fastest layouts of 16 H100s for Llama 3 8B that fit,
                       with the tuning checklist's findings

plan.rank_memory and plan.step_time (docs/planner.md) read numbers only; the small check
is the one place where they meet a run.
"""

from __future__ import annotations

import numpy as np

from ...nn import GPTConfig
from ...parallel import ParallelDims, parallelize
from ...plan import CLUSTERS, MODELS, Layout, ModelSpec, rank_memory, search, step_time
from ...plan.sized import as_gpt
from ...plan.timeline import timeline
from ...runtime.launch import launch
from ...runtime.ledger import CATEGORIES, fmt_bytes
from .cluster import TOPOLOGY
from .common import Print, Record, no_recorder

TINY = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=4, num_layers=4,
                 dtype="float32")
SPEC = ModelSpec("the tour's GPT", 4, 16, 4, 64, 32, 8)  # the same: GeLU 4h, biases, untied
SMALL = Layout(tp=2, pp=2, dp=2, zero=1, global_batch=8, sequence_parallel=True,
               precision="fp32", fp32_grads=False)
BIG = Layout(tp=8, pp=4, dp=8, schedule="interleaved_1f1b", chunks=2, global_batch=512,
             sequence_parallel=True, recompute="selective", distributed_optimizer=True)
STATES = ("parameters", "gradients", "optimizer_states")


def _small_run(ctx):
    run = parallelize(TINY, ParallelDims(dp_shard=2, tp=2, pp=2), zero=1,
                      sequence_parallel=True, schedule="1f1b", microbatches=4, lr=1e-2,
                      placement="any")
    ctx.ledger.reset_peak()  # the build initialises full-shape weights once: not a step
    ids, tgt = np.random.default_rng(0).integers(0, 32, (2, 8, 8))
    for _ in range(2):
        run.train_step(ids, tgt)
    return ({c: ctx.ledger.held(c) for c in CATEGORIES},
            {c: ctx.ledger.peak(c) for c in CATEGORIES})


def planner_part(out: Print, record: Record = no_recorder) -> None:
    """Print part 15."""
    out("15. The planner: memory first, then time, then the search (docs/planner.md)")
    res = record("15. the planner's small check", launch(_small_run, 8, topology=TOPOLOGY))
    held, peak = res[0]
    plan = rank_memory(SPEC, SMALL)
    out(f"   {SMALL}: the first pipeline rank, planner against ledger (held, peak)")
    for c in STATES:
        term = getattr(plan, c)
        same = (held[c], peak[c]) == (term.steady, term.peak)
        out(f"   {c:<17} planner {fmt_bytes(term.steady):>11} {fmt_bytes(term.peak):>11}"
            f"   ledger {fmt_bytes(held[c]):>11} {fmt_bytes(peak[c]):>11}"
            f"   {'equal to the byte' if same else 'DIFFERENT'}")
    m, h100 = MODELS["llama3-70b"], CLUSTERS["h100"]
    mem = rank_memory(m, BIG, h100, dropout=False)
    t = step_time(m, BIG, h100, dropout=False)
    out(f"   {m.name} on {BIG.gpus} H100s, {BIG}")
    cats = ", ".join(f"{c} {fmt_bytes(getattr(mem, c).peak)}" for c in
                     ("parameters", "gradients", "optimizer_states", "activations",
                      "comm_buffers"))
    out(f"   memory, the busiest rank's peaks: {cats}; {fmt_bytes(mem.peak)} of "
        f"{fmt_bytes(mem.capacity)}")
    terms = ", ".join(f"{k} {v:.3f}" for k, v in t.terms.items() if v > 0)
    out(f"   time: {t.seconds:.2f} s a step ({terms} s), MFU {t.mfu:.1%}, HFU {t.hfu:.1%}, "
        f"bubble over ideal {t.bubble_fraction:.1%}")
    small_model = MODELS["llama3-8b"]
    out(f"   the search: the 3 fastest layouts of 16 H100s that fit {small_model.name} "
        f"(B = 64)")
    for i, p in enumerate(search(small_model, 16, h100, 64, top=3), start=1):
        found = "; ".join(p.reasons) or "no finding"
        out(f"   {i}. {p.layout}: {p.time.seconds:.2f} s, MFU {p.time.mfu:.1%}, peak "
            f"{fmt_bytes(p.memory.peak)} ({found})")
    huge = Layout(dp=128, pp=16, tp=8, schedule="interleaved_1f1b", chunks=2,
                  global_batch=2048, sequence_parallel=True, recompute="selective")
    tl = timeline(as_gpt(MODELS["llama3-405b"]), huge, h100.topology(huge.gpus // 8),
                  compute_model="calibrated")
    out(f"   the dry run (minipar dry-run): a Llama-3-405B-sized GPT on {tl.world_size:,} "
        f"H100s, {huge}: {len(tl.ranks)} ranks stand for all (one a pipeline coordinate), "
        f"{sum(len(r.events) for r in tl.ranks):,} kernels, collectives and messages, a "
        f"{tl.step_time:.2f} s step on the calibrated clock")
