"""64 GPUs, 70B, nodes of 8: TP = 4, PP = 2, DP = 8 — run small, computed at full width.

    N = TP x PP x DP = 4 x 2 x 8 = 64        bytes a rank sends a step, by link class

The seed's example, in two parts. Measured: the layout itself, 64 simulated H100s on 8
nodes of 8, runs one training step (1F1B, ZeRO-1 over dp) of a tiny GPT in float64; each
rank's bytes by group and link class come from its trace, its loss and gradients are one
device's, and traffic.predict gives the same bytes from the model's shape alone. Computed:
the same predict, and the cost model's time for each collective, at the width of a
GPT-shaped 70B-class model (Llama-2-70B's h = 8192, 80 layers, 64 heads, s = 4096; 65.0B
parameters in this GPT's shape), bf16, 1,024 sequences a step (4M tokens, micro-batches of
1), with plan's memory formulas. Two placements of the same sizes are compared: Megatron's
order (tp fastest, pp slowest: a node holds 2 tp groups of one stage, a dp group spans 4
nodes) and the seed's rule read literally, dp outermost ("tp-pp-dp": a node holds one whole
model replica), and the seed's own rule of thumb, TP = the GPUs of a node (TP = 8, PP = 1).
"""

from __future__ import annotations

from typing import Any, Callable

from ...nn import GPTConfig
from ...parallel import ParallelDims
from ...plan import activation_bytes_per_layer, model_flops, model_state_bytes
from ...runtime.topology import Link, Topology
from .common import batch, bytes_text, compare, one_device, step_3d
from .kitchen import matches_prediction, traffic_lines
from .traffic import predict, unit_elements

TOPOLOGY = Topology.nodes(8, 8)  # H100s, NVLink 4 inside a node, InfiniBand NDR across
LAYOUTS = {  # key -> (label, dims)
    "megatron": ("TP=4 PP=2 DP=8, Megatron's order", ParallelDims(dp_shard=8, pp=2, tp=4)),
    "dp_outer": ("TP=4 PP=2 DP=8, dp outermost",
                 ParallelDims(dp_shard=8, pp=2, tp=4, order="tp-pp-dp")),
    "tp8": ("TP=8 PP=1 DP=8, TP = the node", ParallelDims(dp_shard=8, tp=8)),
    "pp1": ("TP=4 PP=1 DP=16, no pipeline", ParallelDims(dp_shard=16, tp=4)),
}
SMALL = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=8, num_layers=2,
                  ffn_hidden=32, seed=0)
SMALL_BATCH, SMALL_M = 16, 2
BIG = GPTConfig(vocab_size=32000, seq_len=4096, hidden=8192, num_heads=64, num_layers=80,
                dtype="bfloat16")
BIG_BATCH = 1024  # sequences a step; micro-batches of 1 on each of 8 dp ranks: m = 128
ZERO = 1
HBM = 80e9


def measure_small(key: str) -> dict[str, Any]:
    """The layout on 64 simulated GPUs with the tiny model: one step, traced."""
    dims = LAYOUTS[key][1]
    ids, targets = batch(SMALL, SMALL_BATCH)
    res = step_3d(SMALL, dims, TOPOLOGY, ids, targets, SMALL_M, zero=ZERO)
    return {"ranks": res, "equal": compare(res, one_device(SMALL, ids, targets, SMALL_M)),
            "predicted": matches_prediction(res, SMALL, dims, TOPOLOGY, SMALL_BATCH, SMALL_M,
                                            ZERO)}


def at_full_width(key: str, topology: Topology = TOPOLOGY) -> dict[str, Any]:
    """traffic.predict for the first rank of each stage at 70B width, the step's matmul
    time on one GPU at the bf16 peak, and the stage-0 GPU's memory (ZeRO-1, 1F1B keeping
    p micro-batches, bf16, no dropout) under three recompute choices."""
    dims = LAYOUTS[key][1]
    m = BIG_BATCH // dims.dp
    stages = {}
    for stage in range(dims.pp):
        rank = stage * (dims.world_size // dims.pp) if dims.order == "tp-cp-ep-dp-pp" \
            else stage * dims.tp
        stages[stage] = predict(BIG, dims, topology, rank, BIG_BATCH, m, ZERO)
    cfg = BIG
    flops = model_flops(BIG_BATCH, cfg.seq_len, cfg.num_layers, cfg.hidden, cfg.vocab_size)
    compute = flops / dims.world_size / topology.device.peak("bfloat16")
    psi = sum(unit_elements(cfg, dims.tp, 0, dims.pp))
    states = model_state_bytes(psi, ZERO, dims.dp)["total"]
    layers = cfg.num_layers // dims.pp
    memory = {}
    for label, recompute, sp in (("no recompute", "none", False),
                                 ("selective", "selective", False),
                                 ("SP + selective", "selective", True),
                                 ("full recompute", "full", False)):
        act = activation_bytes_per_layer(cfg.seq_len, 1, cfg.hidden, cfg.num_heads, recompute,
                                         dropout=False, tp=dims.tp, sequence_parallel=sp)
        memory[label] = states + act * layers * min(dims.pp, m)
    ddp = model_state_bytes(psi, 0, dims.dp)["total"]
    return {"stages": stages, "compute_seconds": compute, "psi_rank": psi,
            "states": states, "ddp_states": ddp, "memory": memory, "m": m}


def _total(rows: dict, link: str) -> float:
    return sum(r[link] for r in rows.values())


def claims(small: dict, big: dict, ethernet: dict) -> list[tuple[str, str]]:
    """(the seed's claim, what the numbers say) — every verdict computed here."""
    dims = LAYOUTS["megatron"][1]
    ranks = small["megatron"]["ranks"]
    tp_inter = max(r["traffic"]["tp"]["inter"] for r in ranks)
    s0 = big["megatron"]["stages"][0]
    tp, pp, dp = (s0[k]["intra"] + s0[k]["inter"] for k in ("tp", "pp", "dp"))
    pp_msg = BIG.seq_len * BIG.hidden * 2
    dp_msg = max(unit_elements(BIG, 4, 0, 2)) * 2
    compute = big["megatron"]["compute_seconds"]
    eth = ethernet["stages"][0]
    tp8 = big["tp8"]["stages"][0]["tp"]
    tp8_bytes = tp8["intra"] + tp8["inter"]
    mem8, mem4 = (big[k]["memory"]["SP + selective"] for k in ("tp8", "megatron"))
    one = big["pp1"]["stages"][0]
    dp1 = one["dp"]["intra"] + one["dp"]["inter"]
    ib = {k: _total(big[k]["stages"][0], "inter") for k in LAYOUTS}
    fewest = min(ib, key=ib.get)
    ddp = big["megatron"]["ddp_states"]
    fits = [k for k, v in big["megatron"]["memory"].items() if v <= HBM]
    out = [
        ("N = TP x PP x DP", f"{dims.tp} x {dims.pp} x {dims.dp} = {dims.world_size}: "
         f"{'holds' if dims.world_size == TOPOLOGY.world_size else 'does not hold'}"),
        ("TP stays inside the node, on NVLink", f"TP bytes across nodes, measured: "
         f"{tp_inter:g} ({'holds' if tp_inter == 0 else 'does not hold'})"),
        ("TP moves the most data", f"at 70B a stage-0 GPU sends {bytes_text(tp)} for TP, "
         f"{tp / dp:.0f}x its DP bytes and {tp / pp:.0f}x its PP bytes: "
         f"{'holds' if tp > max(pp, dp) else 'does not hold'}"),
        ("PP transfers are few but large", f"{big['megatron']['m']} sends a GPU (activations "
         f"or their gradients) against "
         f"{s0['tp']['count']:,} TP all-reduces (few: holds); each send "
         f"{bytes_text(pp_msg)}, the size of one TP all-reduce's buffer and 1/"
         f"{dp_msg / pp_msg:.0f} of one block's DP reduce-scatter (large: no)"),
        ("DP syncs once a step, so Ethernet suffices", f"on 100G Ethernet the DP "
         f"reduce-scatters and all-gathers take {eth['dp']['seconds']:.2f} s, "
         f"{100 * eth['dp']['seconds'] / compute:.1f} % of the {compute:.1f} s of matmuls "
         f"(and the PP sends {eth['pp']['seconds']:.2f} s, on the critical path): "
         + ("holds at this batch, if overlapped" if eth["dp"]["seconds"] < 0.1 * compute
            else "does not hold: over 10 % of the compute")),
        ("TP=4 x PP=2 x DP=8 fits a 70B model", f"states "
         f"{bytes_text(ddp)} a GPU under DDP ({'fits' if ddp <= HBM else 'does not fit'} "
         f"{HBM / 1e9:.0f} GB), "
         f"{bytes_text(big['megatron']['states'])} under ZeRO-1; with activations it fits "
         f"with: {', '.join(fits) or 'none'}"),
        ("TP = the GPUs of a node (8), yet the example takes TP = 4",
         f"TP = 8 with PP = 1 sends {tp8_bytes / tp:.2f}x the TP bytes of TP = 4, PP = 2 "
         f"({bytes_text(tp8_bytes)}: 7/8 of each buffer instead of 3/4, twice the layers a "
         f"GPU), {tp8['seconds']:.1f} s against {s0['tp']['seconds']:.1f} s; it has no bubble, "
         f"and with SP + selective recompute needs {mem8 / 1e9:.0f} GB against "
         f"{mem4 / 1e9:.0f} GB"),
        ("communication > 30 % of compute: fewer PP stages", f"TP=4 PP=1 DP=16 sends "
         f"{bytes_text(one['tp']['intra'] + one['tp']['inter'])} for TP (the same: "
         f"L B s h tp / N a GPU whatever pp and dp are) and {dp1 / dp:.2f}x the DP bytes "
         f"(twice the parameters a GPU): fewer stages remove the bubble and the sends, not "
         f"the all-reduces"),
        ("place TP in the node first, DP outermost", "IB bytes a stage-0 GPU sends: " + ", ".join(
            f"{LAYOUTS[k][0]} {bytes_text(ib[k])}" for k in LAYOUTS)
         + f"; fewest: {LAYOUTS[fewest][0]}; dp outermost sends {ib['dp_outer'] / ib[fewest]:.2f}x "
           f"as much (pp slowest lets the 2 dp ranks of a node reduce over NVLink first)"),
    ]
    return out


def run(out: Callable[[str], Any] = print) -> dict[str, Any]:
    """Measure the small runs, compute the full width, print both and the seed's claims."""
    small = {k: measure_small(k) for k in ("megatron", "dp_outer")}
    big = {k: at_full_width(k) for k in LAYOUTS}
    ethernet = at_full_width("megatron", Topology.nodes(8, 8, inter=Link.ethernet_100g()))
    out(f"64 GPUs, 70B, nodes of 8: TP = 4, PP = 2, DP = 8 ({TOPOLOGY.describe()})")
    out(f"Measured: one step of a tiny GPT ({SMALL.num_layers} blocks, h={SMALL.hidden}, "
        f"{SMALL.num_parameters():,} parameters, float64), {SMALL_BATCH} sequences, 1F1B over "
        f"{SMALL_M} micro-batches, ZeRO-1; bytes one rank sent, from the trace")
    for key, got in small.items():
        eq = got["equal"]
        out(f"  {LAYOUTS[key][0]} ({LAYOUTS[key][1]})")
        for line in traffic_lines(got["ranks"], TOPOLOGY):
            out(line)
        out(f"   loss {eq['loss']:.12f} (one device {eq['loss_one_device']:.12f}), gradients "
            f"within {eq['grad_rel']:.1e}; traffic.predict gives these bytes: "
            f"{got['predicted']}")
    out("")
    out(f"Computed (traffic.predict and the cost model at full width, not run): a GPT-shaped "
        f"70B-class model, {BIG.num_parameters() / 1e9:.1f}B parameters, bf16, {BIG_BATCH} x "
        f"{BIG.seq_len} tokens a step, micro-batches of 1; one GPU of each stage")
    out(f"   {'layout':<34} {'stage':>5} {'group':>5} {'events':>7} {'NVLink':>10} "
        f"{'IB':>10} {'time':>9}")
    for key, r in big.items():
        for stage, rows in r["stages"].items():
            for kind, row in rows.items():
                out(f"   {LAYOUTS[key][0]:<34} {stage:>5} {kind:>5} {row['count']:>7,} "
                    f"{bytes_text(row['intra']):>10} {bytes_text(row['inter']):>10} "
                    f"{row['seconds']:>7.2f} s")
    mega = big["megatron"]
    out(f"   the step's matmuls on one GPU at the bf16 peak: {mega['compute_seconds']:.1f} s "
        f"(times are the cost model's, summed: no overlap, no bubble)")
    out(f"   memory of a stage-0 GPU, {mega['psi_rank'] / 1e9:.2f}B parameters (ZeRO-1 over "
        f"8; 1F1B keeps {LAYOUTS['megatron'][1].pp} micro-batches): " + ", ".join(
            f"{k} {v / 1e9:.0f} GB" for k, v in mega["memory"].items()))
    out("")
    out("The seed's claims, against these numbers:")
    checked = claims(small, big, ethernet)
    for claim, verdict in checked:
        out(f"  - {claim}: {verdict}")
    return {"small": small, "big": big, "ethernet": ethernet, "claims": checked}
