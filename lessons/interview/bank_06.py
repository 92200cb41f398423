"""Interview questions on lesson 06 (zero-bubble pipelines and DualPipe), part of bank.py.

bank.py loads this file and turns each entry of ENTRIES into a Question; run the questions
with `python lessons/interview/bank.py --lesson 06`. An entry is a dict of the Question's
fields: the example data (`given`), the question and the answer as format strings, and
`compute`, which returns every number the answer shows: from the schedules and their dry
run (minipar.parallel.pp), the planning formulas (minipar.plan), and the FLOPs a one-layer
GPT's matmuls charge to a simulated device's clock (minipar.launch). t_B is the full
backward, t_I + t_W, as DualPipe's README writes it.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel import zero_engine
from minipar.parallel.pp import (Kind, OverlapFB, dry_run, lower, placement, schedule,
                                 split_layers)
from minipar.plan import activation_bytes_per_layer, model_state_bytes
from minipar.runtime.device import DeviceSpec

GB = 10**9
MS = 1e-3


# ---- helpers ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def lowered(name: str, p: int, m: int) -> list:
    """lower(schedule(name, p, m)), built once (the lists are read, never changed)."""
    return lower(schedule(name, p, m))


def clock(name: str, p: int, m: int, **durations):
    """The dry run of schedule `name` on p ranks and m micro-batches; durations in ms by
    kind (F, B, I, W, and FB for DualPipe's overlapped pair, "F&B")."""
    if "FB" in durations:
        durations["F&B"] = durations.pop("FB")
    return dry_run(lowered(name, p, m), durations)


def sends(name: str, p: int, m: int) -> int:
    """The messages schedule `name` sends in one step (activations and gradients)."""
    return sum(a.kind.value.startswith("SEND") for row in lowered(name, p, m) for a in row)


def int_list(values) -> str:
    return ", ".join(str(int(x)) for x in values)


def num(x):
    """An exact dry-run figure as the bank prints it: an int when whole, else a float."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def layer_bytes(s, b, h, a) -> float:
    """34 sbh: what one layer keeps of a micro-batch with the attention core recomputed."""
    return activation_bytes_per_layer(s, b, h, a, recompute="selective")


def block_parameters(h: int) -> int:
    """12h^2 + 13h: the parameters of one transformer block (a GPT with one layer more)."""
    one, two = (GPTConfig(vocab_size=16, seq_len=1, hidden=h, num_heads=1, num_layers=k)
                for k in (1, 2))
    return two.num_parameters() - one.num_parameters()


@functools.lru_cache(maxsize=None)
def block_flops(s: int, b: int, h: int) -> dict:
    """One forward and split backward of a one-layer GPT on a simulated device (forward,
    backward_input = I, backward_weight = W): the FLOPs its block's matmuls charge to the
    clock in each phase, by part (the weight matmuls "linear", the attention core "core"),
    and those of its fc1."""
    cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=2, num_layers=1, seed=1)
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (s, b))  # [s, b]

    def program(ctx):
        model = GPT(cfg)
        marks = [len(ctx.trace.events)]
        _, cache = model.forward(ids, np.roll(ids, -1, axis=0))
        marks.append(len(ctx.trace.events))
        store = model.backward_input(cache)
        marks.append(len(ctx.trace.events))
        model.backward_weight(store)
        marks.append(len(ctx.trace.events))
        return [[(e.label, e.flops) for e in ctx.trace.events[lo:hi] if e.name == "matmul"]
                for lo, hi in zip(marks, marks[1:])]

    out = {(part, phase): 0 for part in ("linear", "core") for phase in "FIW"}
    fc1 = dict.fromkeys("FIW", 0)
    for phase, events in zip("FIW", mp.launch(program, 1)[0]):
        for label, flops in events:
            if label.startswith("lm_head"):
                continue
            out["core" if label.startswith("attn") else "linear", phase] += flops
            if label.startswith("blocks.0.mlp.fc1"):
                fc1[phase] += flops
    return {"parts": out, "fc1": fc1}


@functools.lru_cache(maxsize=None)
def w_record_elements(s: int, b: int, h: int) -> float:
    """The elements one block's deferred W holds after I: what a two-layer GPT's W store
    holds (WeightGradStore.nbytes, float64) less a one-layer GPT's."""
    def held(layers: int) -> int:
        cfg = GPTConfig(vocab_size=16, seq_len=s, hidden=h, num_heads=2, num_layers=layers,
                        seed=1)
        ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (s, b))  # [s, b]

        def program(ctx):
            _, cache = (model := GPT(cfg)).forward(ids, np.roll(ids, -1, axis=0))
            return model.backward_input(cache).nbytes()

        return mp.launch(program, 1)[0]

    return (held(2) - held(1)) / 8


def w_record_terms(s: int, h: int) -> tuple:
    """(per-token elements / h, constant elements / h) of a block's W records, from two
    micro-batch sizes: E(b) = c1 s b h + c0 h."""
    e1, e2 = w_record_elements(s, 1, h), w_record_elements(s, 2, h)
    per_token = (e2 - e1) / (s * h)
    return per_token, (e1 - per_token * s * h) / h


def split_coefficients(s: int, b: int, h: int) -> dict:
    """The measured FLOPs as coefficients: linear / (b s h^2) and core / (b s^2 h) per phase,
    fc1's per phase / (b s h^2)."""
    run = block_flops(s, b, h)
    lin = {ph: Fraction(run["parts"]["linear", ph], b * s * h * h) for ph in "FIW"}
    core = {ph: Fraction(run["parts"]["core", ph], b * s * s * h) for ph in "FIW"}
    fc1 = {ph: Fraction(run["fc1"][ph], b * s * h * h) for ph in "FIW"}
    return {"linear": lin, "core": core, "fc1": fc1}


def layer_times(s, b, h, sim_s, sim_b, sim_h) -> dict:
    """t_F, t_I, t_W of one layer at (s, b, h) in seconds at the H100's bf16 peak, from the
    coefficients measured at (sim_s, sim_b, sim_h)."""
    c = split_coefficients(sim_s, sim_b, sim_h)
    peak = DeviceSpec.h100_sxm().peak("bfloat16")
    return {ph: float(c["linear"][ph] * b * s * h * h + c["core"][ph] * b * s * s * h) / peak
            for ph in "FIW"}


def w_tail(name: str, p: int, m: int, **durations) -> dict:
    """Per rank, from the lists and their dry run: the W's run after the rank's last I, the
    W's not yet run at its m-th backward call (I or W, the count an unsplit backward
    makes), and when its last I and its last W end."""
    d = clock(name, p, m, **durations)
    out = {"after_last_i": [], "missing_at_m": [], "last_i": [], "last_w": []}
    for r, row in enumerate(schedule(name, p, m)):
        calls = [k for k, a in enumerate(row) if a.kind in (Kind.I, Kind.W)]
        mth = calls[m - 1]
        last_i = max(k for k, a in enumerate(row) if a.kind == Kind.I)
        out["after_last_i"].append(sum(a.kind == Kind.W for a in row[last_i:]))
        out["missing_at_m"].append(m - sum(a.kind == Kind.W for a in row[:mth + 1]))
        spans = [sp for sp in d.timeline[r] if sp.action.is_compute]
        out["last_i"].append(max(sp.end for sp in spans if sp.action.kind == Kind.I))
        out["last_w"].append(max(sp.end for sp in spans if sp.action.kind == Kind.W))
    return out


TINY_DDP = GPTConfig(vocab_size=18, seq_len=6, hidden=12, num_heads=3, num_layers=3, seed=3)


@functools.lru_cache(maxsize=None)
def ddp_split_run(n: int) -> dict:
    """TINY_DDP under DDP on n ranks, its backward fused, split (backward_input, then
    backward_weight), and split with W run without the backward_post hooks (torch's trap:
    store.run with only finish_backward): the all-reduces issued during I and after it,
    the largest difference between the fused and split averaged gradients, and, for the
    trap, how far rank 0's gradient is from the average and from rank 1's (relative)."""
    rng = np.random.default_rng(5)
    ids, tgt = (rng.integers(0, TINY_DDP.vocab_size, (TINY_DDP.seq_len, 2 * n))
                for _ in range(2))  # [s, 2n]: two sequences a rank

    def program(ctx, mode):
        model = GPT(TINY_DDP)
        engine = zero_engine(model, stage=0, lr=1e-3)
        cols = slice(2 * ctx.rank, 2 * ctx.rank + 2)
        _, cache = model.forward(ids[:, cols], tgt[:, cols])
        start = len(ctx.trace.events)
        store = model.backward(cache) if mode == "fused" else model.backward_input(cache)
        mid = len(ctx.trace.events)
        if mode == "split":
            model.backward_weight(store)
        elif mode == "trap":
            store.run(model.finish_backward)  # W done, backward_post never fired
        ctx.resolve_pending()
        names = lambda lo, hi=None: [e.name for e in ctx.trace.events[lo:hi]
                                     if e.stream == "comm"]
        flat = np.concatenate([g.reshape(-1) for g in engine.full_grads().values()])
        return names(start, mid), names(mid), flat

    runs = {mode: mp.launch(functools.partial(program, mode=mode), n)
            for mode in ("fused", "split", "trap")}
    fused, split, trap = runs["fused"], runs["split"], runs["trap"]
    mean = fused[0][2]
    rel = lambda x, y: float(np.linalg.norm(x - y) / np.linalg.norm(y))
    return {"during_i": split[0][0].count("all_reduce"),
            "after_i": split[0][1].count("all_reduce"),
            "fused": fused[0][0].count("all_reduce") + fused[0][1].count("all_reduce"),
            "diff": max(float(np.max(np.abs(a[2] - b[2]))) for a, b in zip(fused, split)),
            "trap_reduces": sum(x.count("all_reduce") for x in trap[0][:2]),
            "trap_err": rel(trap[0][2], mean), "trap_gap": rel(trap[0][2], trap[1][2])}


# ---- the questions ---------------------------------------------------------------------
SIM = dict(sim_s=7, sim_b=3, sim_h=10)  # the one-layer GPT whose matmuls are counted


def q45(s, b, h, a, sim_s, sim_b, sim_h):
    """F, I and W of a linear layer and of a block, measured on a simulated device; what a
    deferred W holds."""
    c = split_coefficients(sim_s, sim_b, sim_h)
    lin, core, fc1 = c["linear"], c["core"], c["fc1"]
    if len({lin["F"], lin["I"], lin["W"]}) != 1 or len(set(fc1.values())) != 1:
        raise RuntimeError(f"a block's weight matmuls should cost the same in F, I and W: "
                           f"{lin}, fc1 {fc1}")
    t = layer_times(s, b, h, sim_s, sim_b, sim_h)
    per_token, const = w_record_terms(sim_s, sim_h)
    return {"rec_tok": num(per_token), "w_mb": 2 * (per_token * s * b * h + const * h) / 1e6,
            "f_mb": layer_bytes(s, b, h, a) / 1e6, "lin": num(lin["F"]),
            "core_f": num(core["F"]), "core_i": num(core["I"]),
            "core_w": num(core["W"]), "fc1_gflop": float(fc1["F"] * b * s * h * h) / 1e9,
            "t_f_ms": t["F"] / MS, "t_i_ms": t["I"] / MS, "t_w_ms": t["W"] / MS,
            "w_share": t["W"] / (t["I"] + t["W"])}


def q46(p, m, t_ms, t_f_ms, t_i_ms, t_w_ms):
    """ZB-H1 against 1F1B: a third of the bubble at equal times, 2(p - 1)t_W less at any."""
    eq_one = clock("1f1b", p, m, F=t_ms, B=2 * t_ms)
    eq_zb = clock("zb_h1", p, m, F=t_ms, I=t_ms, W=t_ms)
    one = clock("1f1b", p, m, F=t_f_ms, B=t_i_ms + t_w_ms)
    zb = clock("zb_h1", p, m, F=t_f_ms, I=t_i_ms, W=t_w_ms)
    return {"eq_f1b_idle": num(eq_one.idle[0]), "eq_f1b_ms": num(eq_one.makespan),
            "eq_zb_idle": num(eq_zb.idle[0]), "eq_zb_ms": num(eq_zb.makespan),
            "eq_ratio": float(Fraction(eq_zb.idle[0]) / eq_one.idle[0]),
            "t_b_ms": t_i_ms + t_w_ms, "f1b_idle": num(one.idle[0]), "zb_idle": num(zb.idle[0]),
            "ratio": float(Fraction(zb.idle[0]) / one.idle[0]),
            "f1b_peaks": int_list(one.peak_in_flight), "zb_peaks": int_list(zb.peak_in_flight)}


def q47(p, m, t_f_ms, t_i_ms, t_w_ms, s, h):
    """ZB-H1 when t_W > t_F: the formula undercounts; a transformer layer's FLOPs keep
    t_W < t_F."""
    zb = clock("zb_h1", p, m, F=t_f_ms, I=t_i_ms, W=t_w_ms)
    one = clock("1f1b", p, m, F=t_f_ms, B=t_i_ms + t_w_ms)
    t = layer_times(s, 1, h, **SIM)
    return {"t_b_ms": t_i_ms + t_w_ms,
            "formula_ms": (p - 1) * (t_f_ms + t_i_ms + t_w_ms - 2 * t_w_ms),
            "clock_ms": num(zb.idle[0]), "f1b_ms": num(one.idle[0]),
            "block_ratio": t["W"] / t["F"]}


def q48(p, m, t_ms, t_f_ms, t_i_ms, t_w_ms, s, b, h, a, layers):
    """ZB-H2: no bubble back to back at 2p - 1 micro-batches in flight, against ZB-H1's p."""
    h2 = clock("zb_h2", p, m, F=t_ms, I=t_ms, W=t_ms)
    h1 = clock("zb_h1", p, m, F=t_ms, I=t_ms, W=t_ms)
    h2u = clock("zb_h2", p, m, F=t_f_ms, I=t_i_ms, W=t_w_ms)
    h1u = clock("zb_h1", p, m, F=t_f_ms, I=t_i_ms, W=t_w_ms)
    per_stage = [hi - lo for lo, hi in split_layers(layers, p)][0]
    stage = per_stage * layer_bytes(s, b, h, a)  # one micro-batch through a stage
    return {"h2_idle": num(h2.idle[0]), "h2_ms": num(h2.makespan),
            "h2_period": num(h2.steady_period),
            "h2_steady": float(h2.steady_bubble_over_ideal),
            "h1_steady": float(h1.steady_bubble_over_ideal),
            "h1_peak": h1.peak_in_flight[0], "h2_peak": h2.peak_in_flight[0],
            "per_stage": per_stage, "stage_gb": stage / GB,
            "h1_gb": h1.peak_in_flight[0] * stage / GB,
            "h2_gb": h2.peak_in_flight[0] * stage / GB,
            "mem_ratio": h2.peak_in_flight[0] / h1.peak_in_flight[0],
            "h2_uneven": float(h2u.steady_bubble_over_ideal),
            "h1_uneven": float(h1u.steady_bubble_over_ideal)}


def q49(p, m, t_ms, layers):
    """ZB-V: stages r and 2p - 1 - r, a sixth of 1F1B's flushed bubble, none back to back,
    1F1B's memory, twice its messages."""
    v = clock("zbv", p, m, F=t_ms, I=t_ms, W=t_ms)
    one = clock("1f1b", p, m, F=2 * t_ms, B=4 * t_ms)  # a rank's layers: two chunks
    where = placement(schedule("zbv", p, m))
    stages = lambda r: " and ".join(str(s) for s in sorted(s for s in where if where[s] == r))
    return {"rank0": stages(0), "last": stages(p - 1),
            "chunk_layers": [hi - lo for lo, hi in split_layers(layers, 2 * p)][0],
            "v_idle": num(v.idle[0]), "f1b_idle": num(one.idle[0]),
            "v_ratio": float(Fraction(v.idle[0]) / one.idle[0]),
            "v_steady": float(v.steady_bubble_over_ideal), "v_chunks": v.peak_in_flight[0],
            "v_worth": num(v.peak_activations[0]), "f1b_peak": one.peak_in_flight[0],
            "v_sends": sends("zbv", p, m), "f1b_sends": sends("1f1b", p, m),
            "send_ratio": sends("zbv", p, m) / sends("1f1b", p, m)}


def q50(p, m, t_ms, fb_ms, s, b, h, a, layers):
    """DualPipeV against DualPipe's README: (PP/2 - 1)(F&B + B - 3W), PP + 1 activations,
    2x parameters; the bidirectional DualPipe's second copy, in bytes."""
    PP = 2 * p
    dv = clock("dualpipev", p, m, F=t_ms, I=t_ms, W=t_ms, B=2 * t_ms, FB=fb_ms)
    one = clock("1f1b", PP, m, F=t_ms, B=2 * t_ms)  # 1F1B over PP devices, one stage each
    zb = clock("zb_h1", PP, m, F=t_ms, I=t_ms, W=t_ms)
    stage_layers = [hi - lo for lo, hi in split_layers(layers, PP)][0]
    stage_psi = stage_layers * block_parameters(h)
    stage_states = model_state_bytes(stage_psi, 0, 1)["total"]  # 16 bytes a parameter
    act = stage_layers * layer_bytes(s, b, h, a)  # one micro-batch through one stage
    dv_stages = len(dv.info.stages_of(0))
    return {"pp_stages": PP, "formula_ms": (PP // 2 - 1) * (fb_ms + 2 * t_ms - 3 * t_ms),
            "dv_worst": num(max(dv.idle)), "dv_idles": int_list(dv.idle),
            "f1b_idle": num(one.idle[0]), "zb_idle": num(zb.idle[0]),
            "dv_peak": dv.peak_in_flight[0], "f1b_peak": one.peak_in_flight[0],
            "stage_layers": stage_layers, "dv_act_gb": dv.peak_in_flight[0] * act / GB,
            "f1b_act_gb": one.peak_in_flight[0] * act / GB,
            "stage_b": stage_psi / 1e9, "stage_gb": stage_states / GB,
            "two_gb": dv_stages * stage_states / GB,
            "v_total_gb": PP * stage_states / GB, "bi_total_gb": 2 * PP * stage_states / GB}


def q51(pp, m, t_f_ms, t_i_ms, t_w_ms, ratio):
    """DeepSeek-V3's reason: the experts' all-to-all (about as long as the compute) exposed
    under 1F1B and ZB-H1, hidden inside DualPipeV's overlapped pairs, on pp ranks."""
    c = ratio * t_f_ms  # the forward's dispatch + combine; the input gradient's as long
    one = clock("1f1b", pp, m, F=t_f_ms + c, B=t_i_ms + t_w_ms + c)
    zb = clock("zb_h1", pp, m, F=t_f_ms + c, I=t_i_ms + c, W=t_w_ms)
    free = clock("1f1b", pp, m, F=t_f_ms, B=t_i_ms + t_w_ms)
    half = lambda x: Fraction(x) / 2  # a chunk is half a rank's layers
    pair = max(half(t_f_ms + t_i_ms + t_w_ms), half(2 * c))  # comm hidden behind compute
    dv = clock("dualpipev", pp, m, F=half(t_f_ms + c), I=half(t_i_ms + c), W=half(t_w_ms),
               B=half(t_i_ms + t_w_ms + c), FB=pair)
    rows = schedule("dualpipev", pp, m)
    pairs = [sum(isinstance(item, OverlapFB) for item in row) for row in rows]
    return {"c_ms": c, "f1b_ms": num(one.makespan), "zb_ms": num(zb.makespan),
            "dv_ms": num(dv.makespan), "free_ms": num(free.makespan),
            "compute_ms": m * (t_f_ms + t_i_ms + t_w_ms),
            "speedup": float(one.makespan / dv.makespan),
            "over_free": float(dv.makespan / free.makespan) - 1,
            "pairs_first": pairs[0], "pairs_last": pairs[-1], "forwards": 2 * m}


def q52(p, m, t_ms):
    """A flushed step against back-to-back steps: what post-validation buys ZB-H2 and ZB-V,
    and what it does not change (ZB-H1, DualPipeV)."""
    h2 = clock("zb_h2", p, m, F=t_ms, I=t_ms, W=t_ms)
    h1 = clock("zb_h1", p, m, F=t_ms, I=t_ms, W=t_ms)
    half = Fraction(t_ms) / 2  # the V schedules: a chunk is half a rank's layers
    v = clock("zbv", p, m, F=half, I=half, W=half)
    dv = clock("dualpipev", p, m, F=half, I=half, W=half, B=2 * half, FB=2 * half)
    for name, d in (("zb_h1", h1), ("dualpipev", dv)):
        if d.bubble_over_ideal != d.steady_bubble_over_ideal:
            raise RuntimeError(f"{name}'s rank 0 runs from the step's start to its end, so "
                               f"its flushed and back-to-back bubbles should be one number")
    return {"h2_ms": num(h2.makespan), "h2_period": num(h2.steady_period),
            "h2_cost": float(h2.makespan / h2.steady_period) - 1,
            "h1_bubble": float(h1.steady_bubble_over_ideal),
            "v_ms": num(v.makespan), "v_period": num(v.steady_period),
            "v_cost": float(v.makespan / v.steady_period) - 1,
            "dv_bubble": float(dv.steady_bubble_over_ideal)}


def q53(p, m, t_f_ms, t_i_ms, t_w_ms, sim_dp):
    """The DDP-hook trap: where a split backward's gradient is complete, rank by rank; and
    minipar's DDP under a split backward, reducing after W."""
    tail = w_tail("zb_h1", p, m, F=t_f_ms, I=t_i_ms, W=t_w_ms)
    run = ddp_split_run(sim_dp)
    if run["diff"] != 0 or run["after_i"] != run["fused"] or run["trap_reduces"]:
        raise RuntimeError(f"DDP under a split backward should reduce after W what the fused "
                           f"backward reduces, bit for bit, and nothing without its hooks: "
                           f"{run}")
    return {"sim_during_i": run["during_i"], "sim_after_i": run["after_i"],
            "sim_err": run["trap_err"], "sim_gap": run["trap_gap"],
            "after_last_i": int_list(tail["after_last_i"]),
            "missing_at_m": int_list(tail["missing_at_m"]),
            "last_i": int_list(tail["last_i"]), "last_w": int_list(tail["last_w"]),
            "calls": 2 * m}


# ---- the entries (bank.py makes each a Question) ----------------------------------------
PP_MODEL = dict(s=2048, b=2, h=6144, a=64, layers=48)  # lesson 05's model, cut into stages


def entry(id, given, question, answer, compute):
    return dict(id=id, lesson="06", given=given, question=question, answer=answer,
                compute=compute)


ENTRIES = [
    entry(
        "q45", dict(s=2048, b=2, h=6144, a=64, **SIM),
        "Zero-bubble schedules split each backward into I (the input gradient) and W (the "
        "weight gradient) and run W later. Why may W wait and I not, how large is each, and "
        "what does the wait cost, for a linear layer and for a transformer block at "
        "s = {s}, b = {b}, h = {h}, a = {a} in bf16?",
        "Because nobody waits for W. A linear layer y = x w^T makes two things in its "
        "backward: dx = dy w, the input gradient (I), which the layer below needs next "
        "(from a stage's first layer it goes to the previous stage, which waits for it), "
        "and dw = dy^T x, the weight gradient "
        "(W), which nothing reads until the optimizer step. Stage s's I needs stage s + 1's "
        "I, not its W: I is on the critical path, and W can run later, in a slot where the "
        "rank would idle, as long as x and dy stay in memory until it runs. Each is one "
        "matmul as large as the forward: for fc1 ([sb, h] to [sb, 4h]) F, I and W each cost "
        "8bsh^2 = {fc1_gflop:.0f} GFLOP. A block is not even, because the attention core "
        "(QK^T and PV) has no weights. The matmuls a one-layer GPT (s = {sim_s}, "
        "b = {sim_b}, h = {sim_h}) charges to a simulated device in its forward, its I and "
        "its W (minipar's split backward): {lin}bsh^2 of weight "
        "matmuls in each of F, I and W; {core_f}bs^2h of attention core in F, {core_i}bs^2h "
        "in I, {core_w} in W. So F = ({lin}h + {core_f}s)bsh, I = ({lin}h + {core_i}s)bsh, "
        "W = {lin}bsh^2 (the zero-bubble paper's Table 1). Here a layer takes "
        "t_F = {t_f_ms:.2f} ms, t_I = {t_i_ms:.2f} ms and t_W = {t_w_ms:.2f} ms at the H100's "
        "bf16 peak: W is {w_share:.1%} of the backward and the shortest of the three, as "
        "ZB-H1's bubble formula needs. The wait costs memory: measured on the same GPT, a "
        "block's deferred W holds {rec_tok}sbh elements after I (each linear layer's input "
        "and output gradient) plus a few [h] vectors, {w_mb:.0f} MB in bf16 here, against "
        "the 34sbh = {f_mb:.0f} MB its forward kept with the attention core recomputed: a W "
        "in flight costs about a micro-batch's activations.",
        q45),
    entry(
        "q46", dict(p=6, m=10, t_ms=3, t_f_ms=5, t_i_ms=7, t_w_ms=4),
        "Compare the bubble of ZB-H1 with 1F1B's for p = {p} and m = {m}, first at "
        "t_F = t_I = t_W = {t_ms} ms, then at t_F = {t_f_ms} ms, t_I = {t_i_ms} ms, "
        "t_W = {t_w_ms} ms. What does ZB-H1 cost in memory?",
        "1F1B idles (p - 1)(t_F + t_B) a rank, with t_B = t_I + t_W the full backward: "
        "{eq_f1b_idle} ms of a {eq_f1b_ms} ms step at equal times (the dry run). ZB-H1 runs "
        "each I at once and defers W into the slots where 1F1B waits for the next gradient: "
        "(p - 1)(t_F + t_B - 2t_W) = {eq_zb_idle} ms of a {eq_zb_ms} ms step, a third "
        "({eq_ratio:.3f}). The third holds at equal times only. At t_F = {t_f_ms}, "
        "t_I = {t_i_ms}, t_W = {t_w_ms} (t_B = {t_b_ms} ms) 1F1B idles {f1b_idle} ms and "
        "ZB-H1 {zb_idle} ms, a ratio of {ratio:.2f}: what ZB-H1 removes is 2(p - 1)t_W, as "
        "much as there is W to move. Memory: ZB-H1 warms up as 1F1B does, with "
        "min(p - r - 1, m) forwards, but rank r defers r W's, and a deferred W keeps its "
        "micro-batch's activations: every rank holds p micro-batches at its peak, "
        "{zb_peaks} from the first rank to the last, against 1F1B's {f1b_peaks}. The largest, "
        "rank 0's, does not grow: ZB-H1 spends the spare memory of the later ranks.",
        q46),
    entry(
        "q47", dict(p=6, m=12, t_f_ms=5, t_i_ms=4, t_w_ms=7, s=2048, h=6144),
        "ZB-H1's bubble (p - 1)(t_F + t_B - 2t_W) holds under a condition. Which one, and "
        "what happens when it fails, for p = {p}, m = {m}, t_F = {t_f_ms} ms, "
        "t_I = {t_i_ms} ms, t_W = {t_w_ms} ms? Does a transformer layer at s = {s}, "
        "h = {h} meet it?",
        "A deferred W must fit the slot it fills: t_W <= t_F and t_W <= t_I. Here t_W is "
        "longer than both (t_B = {t_b_ms} ms). The formula gives {formula_ms} ms a rank; "
        "the dry run of ZB-H1's lists gives {clock_ms} ms, (p - 1)t_F: the W's overrun the "
        "gaps they fill, and the I's behind them wait. Still less than 1F1B's {f1b_ms} ms. "
        "In FLOPs a transformer layer meets the condition at any size: "
        "t_W/t_F = 24h/(24h + 4s) = {block_ratio:.3f} here, below 1 because the attention "
        "core has no weights. Measured times can break it: W's matmuls have other shapes "
        "than F's (they reduce over every token of the micro-batch) and so another "
        "efficiency, and in mixed precision W also adds into the fp32 main gradients. "
        "Profile t_F, t_I and t_W; the zero-bubble paper's automatic scheduler places the "
        "W's from such measured times rather than from a fixed pattern.",
        q47),
    entry(
        "q48", dict(p=6, m=12, t_ms=9, t_f_ms=5, t_i_ms=7, t_w_ms=4, **PP_MODEL),
        "ZB-H2 promises a pipeline with no bubble. For p = {p}, m = {m} and "
        "t_F = t_I = t_W = {t_ms} ms, how much does it idle and what does it hold, for the "
        "{layers}-layer model (s = {s}, b = {b}, h = {h}, a = {a}, the attention core "
        "recomputed)? Does the zero survive t_F = {t_f_ms} ms, t_I = {t_i_ms} ms, "
        "t_W = {t_w_ms} ms?",
        "ZB-H2 warms up with more forwards, 2(p - r) - 1 on rank r, and runs the W's where "
        "the I's thin out at the end, so every rank is busy from its first action to its "
        "last: a parallelogram. Back to back, each rank starting the next step as soon as "
        "it ends this one, a step takes {h2_period} ms = 3mt, a bubble of {h2_steady:.0%} "
        "against ZB-H1's {h1_steady:.1%}. A flushed step, where every rank waits for the "
        "optimizer, still pays the ramp: {h2_ms} ms, {h2_idle} ms idle a rank, (p - 1)t_F, "
        "ZB-H1's whole bubble. The price is memory: ZB-H2 holds 2p - 1 = {h2_peak} "
        "micro-batches on every rank, against ZB-H1's {h1_peak} ({mem_ratio:.2f}x). A stage "
        "of {per_stage} layers keeps {stage_gb:.2f} GB of each micro-batch: {h1_gb:.1f} GB "
        "of activations under ZB-H1, {h2_gb:.1f} GB under ZB-H2, most of an H100 before any "
        "weight; it needs recomputation, tensor parallelism or a smaller micro-batch "
        "first. And the zero needs equal times: at t_F = {t_f_ms}, t_I = {t_i_ms}, "
        "t_W = {t_w_ms} ms the back-to-back bubble is {h2_uneven:.1%} (ZB-H1's "
        "{h1_uneven:.1%}); the paper's automatic scheduler is there for such times.",
        q48),
    entry(
        "q49", dict(p=6, m=14, t_ms=3, layers=48),
        "ZB-V places two model chunks on each of p = {p} ranks in a V. Which stages does a "
        "rank hold, and what does the V buy and cost against 1F1B with the same layers a "
        "rank? Take m = {m}, t_F = t_I = t_W = {t_ms} ms per chunk and a {layers}-layer "
        "model.",
        "There are 2p stages and rank r holds stages r and 2p - 1 - r: rank 0 holds stages "
        "{rank0}, the last rank {last}, each of {chunk_layers} layers. The forward runs "
        "down the ranks and back up, turning on the last rank, whose two stages pass the "
        "tensor in memory; rank 0 holds the first stage and the last, so the two ends of "
        "tied embeddings sit on one rank. The dry run: a flushed step idles {v_idle} ms a "
        "rank, (p - 1)t, a sixth ({v_ratio:.3f}) of 1F1B's {f1b_idle} ms (1F1B's stage is "
        "both chunks: 2t forward, 4t backward), and back-to-back steps idle {v_steady:.0%}. "
        "Memory: {v_chunks} chunk-micro-batches at the peak, each half a rank's layers, so "
        "{v_worth} micro-batches' worth on every rank: what 1F1B holds on rank 0 "
        "({f1b_peak}). The cost is messages: every stage boundary but the V's turn crosses "
        "ranks, 2p - 2 of them instead of p - 1, so a step sends {v_sends} messages against "
        "1F1B's {f1b_sends} ({send_ratio:.1f}x), each the same [s, b, h]. And the zero "
        "needs equal chunk times, as torch's ScheduleZBVZeroBubble warns.",
        q49),
    entry(
        "q50", dict(p=4, m=10, t_ms=3, fb_ms=7, **PP_MODEL),
        "DualPipe's README gives its bubble as (PP/2 - 1)(F&B + B - 3W), with 2x parameters "
        "and PP + 1 activations per device. Check it on DualPipeV with p = {p} ranks "
        "(PP = 2p stages), m = {m}, F = I = W = {t_ms} ms a stage (B = I + W) and an "
        "overlapped forward-and-backward pair of F&B = {fb_ms} ms; then put bytes on it for "
        "the {layers}-layer model (s = {s}, b = {b}, h = {h}, a = {a}, the attention core "
        "recomputed).",
        "PP = {pp_stages} stages, two a rank in ZB-V's V. The formula gives {formula_ms} ms. "
        "The dry run's worst rank idles {dv_worst} ms, ranks 0 to p - 1 idle {dv_idles}: the "
        "last two ranks match the formula exactly, and rank r < p - 2 idles less by "
        "(p - 2 - r)(F + B - F&B), because it runs that many more overlapped pairs. The "
        "README's other rows, on PP devices of one stage each at the same times: 1F1B idles "
        "(PP - 1)(F + B) = {f1b_idle} ms, ZB1P (ZB-H1) (PP - 1)(F + B - 2W) = {zb_idle} ms. "
        "Activations: {dv_peak} chunk-micro-batches at the peak on every rank, PP + 1, "
        "against 1F1B's {f1b_peak} on its first device; with stages of {stage_layers} "
        "layers, {dv_act_gb:.1f} GB against {f1b_act_gb:.1f} GB. Parameters: a stage holds "
        "{stage_b:.2f}B, {stage_gb:.1f} GB of model states at 16 bytes each. A DualPipeV "
        "device holds two different stages, {two_gb:.1f} GB, the README's 2x, on half as "
        "many devices: the pipeline holds the model once, {v_total_gb:.0f} GB. The "
        "bidirectional DualPipe on PP devices holds two copies of one stage each, the same "
        "{two_gb:.1f} GB a device, but the model twice, {bi_total_gb:.0f} GB in all, and "
        "sums the copies' gradients every step. DeepSeek-V3 accepted the second copy "
        "because with its large expert parallelism a device holds only a few experts' "
        "parameters, and ZeRO-1 shards the optimizer states over data parallelism.",
        q50),
    entry(
        "q51", dict(pp=16, m=40, t_f_ms=6, t_i_ms=7, t_w_ms=5, ratio=1),
        "DeepSeek-V3 trained with PP = {pp} and DualPipe. Why that schedule? Its MoE layers "
        "send tokens to experts on other nodes and back (all-to-all), and its report "
        "puts that communication at about {ratio}:1 against the computation. Take a rank's "
        "layers at t_F = {t_f_ms} ms, t_I = {t_i_ms} ms, t_W = {t_w_ms} ms a micro-batch and "
        "m = {m}.",
        "Under 1F1B or ZB-H1 the all-to-all sits on each micro-batch's critical path: "
        "dispatch before the experts, combine after, {c_ms} ms in the forward and as much in "
        "the input gradient (W sends nothing). The dry run: 1F1B takes {f1b_ms:g} ms a step "
        "and ZB-H1 {zb_ms:g} ms, for {compute_ms} ms of computation a rank. DualPipe pairs "
        "one micro-batch's forward with another's backward on the same rank, so each one's "
        "all-to-all runs while the other computes; when a pair's communication is no longer "
        "than its computation, the pair costs its computation alone. DualPipeV on the same "
        "{pp} ranks (two chunks of half the layers a rank; the one-copy form of DualPipe) "
        "takes {dv_ms:g} ms, {speedup:.2f}x faster than 1F1B and only {over_free:.1%} slower "
        "than 1F1B with an all-to-all that cost nothing ({free_ms:g} ms). The actions "
        "outside pairs, at the ramps, still pay their communication: rank 0 runs "
        "{pairs_first} of its {forwards} chunk forwards in a pair, the last rank "
        "{pairs_last}, and more micro-batches mean more pairs. The rest of the layout: "
        "2048 H800 GPUs, EP = 64 over 8 nodes, ZeRO-1 data parallelism, and all-to-all "
        "kernels that leave most of the GPU's SMs to the computation.",
        q51),
    entry(
        "q52", dict(p=8, m=24, t_ms=4),
        "A profile of ZB-H2 shows idle time in every step, where the paper promises none. "
        "Why, and which other schedules does it affect? Take p = {p}, m = {m}, "
        "t_F = t_I = t_W = {t_ms} ms for a rank's layers (half that per chunk for the two-"
        "chunk V schedules).",
        "The zero holds for back-to-back steps, where rank r starts the next step as soon as "
        "it ends this one, every rank shifted by the same period. A flush breaks that: when "
        "the optimizer step waits for every rank (a global gradient-norm clip, an inf/NaN "
        "check under loss scaling), rank 0 starts the next step only after the last rank "
        "ends, and the ramp is paid again every step. ZB-H2: {h2_ms} ms flushed against "
        "{h2_period} ms back to back, {h2_cost:.1%} more, exactly ZB-H1's bubble "
        "({h1_bubble:.1%}): flushed, ZB-H2 gains nothing for its p - 1 extra micro-batches "
        "in flight. ZB-V: {v_ms} ms against {v_period} ms, {v_cost:.1%} more. ZB-H1 and "
        "DualPipeV idle the same either way ({h1_bubble:.1%} and {dv_bubble:.1%}, with "
        "F&B = B): their first rank's actions span the whole step, so no next step can "
        "start it sooner, and none of their bubble is the flush's. The zero-bubble paper "
        "removes the flush with "
        "its optimizer post-validation: every rank steps at once, the global checks are "
        "reduced while the next step runs, and a step that fails them is rolled back.",
        q52),
    entry(
        "q53", dict(p=6, m=10, t_f_ms=5, t_i_ms=7, t_w_ms=4, sim_dp=2),
        "With data parallelism around a zero-bubble pipeline, torch's pipelining computed "
        "the weight gradients outside autograd's backward, and DDP never reduced them "
        "(pytorch issue 144530). Where must the gradient reduction go? ZB-H1, p = {p}, "
        "m = {m}, t_F = {t_f_ms} ms, t_I = {t_i_ms} ms, t_W = {t_w_ms} ms.",
        "DDP starts a bucket's all-reduce from hooks that fire when autograd accumulates a "
        "parameter's gradient. torch's split backward computed both halves with "
        "torch.autograd.grad instead of backward(), which accumulates nothing, so the hooks "
        "never fired: no all-reduce, each replica stepped on its own gradient, and the "
        "replicas drifted apart without an error. "
        "The reduction belongs after a parameter's last W, and counting is the second trap: "
        "split, a stage makes {calls} backward calls a step, not m. A reduction fired at the "
        "m-th, the unsplit count, would send gradients missing {missing_at_m} of the m "
        "micro-batches' W's on ranks 0 to p - 1 (torch's fix counts the split calls). The "
        "last I is not the end either: after it, rank r still runs r + 1 W's "
        "({after_last_i}). On the clock rank r's last I ends at {last_i} ms and its last W "
        "at {last_w} ms; a stage's all-reduce may start only at the second, r + 1 W's "
        "after the first, longest on the last ranks, which defer the most. minipar's "
        "engines reduce a unit at its backward_post hook, which a split backward fires at "
        "the unit's W: on {sim_dp} simulated replicas DDP issues {sim_during_i} all-reduces "
        "during I and {sim_after_i} after the W's, what the fused backward issues, and the "
        "averaged gradients are the fused ones bit for bit. Run W there with the hooks "
        "skipped, as torch did, and nothing is reduced: rank 0 steps on a gradient "
        "{sim_err:.0%} away from the average (relative), {sim_gap:.0%} away from rank 1's.",
        q53),
]
