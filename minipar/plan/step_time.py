"""Time of one training step, term by term: compute, recomputation, communication, the
pipeline's bubble from the real schedule, and MFU / HFU.

    st = step_time(MODELS["175b"], Layout(tp=8, pp=8, schedule="interleaved_1f1b",
                   chunks=3, global_batch=64, sequence_parallel=True,
                   recompute="selective"), CLUSTERS["a100"])
    st.seconds, st.terms, st.mfu

The pieces, each in its own file with its formulas:

    gemm.py           eff(M, N, K) = e_max · g(M) g(N) g(K), g(x) = x / (x + x_half)
    compute_time.py   a layer's GEMMs (FLOPs / (eff · peak)) and elementwise bytes (/ W)
    comm_time.py      each collective's alpha-beta time (runtime/cost.py) on its links
    stage_time.py     F_i, B_i (and W_i) of each pipeline stage for one micro-batch
    pipeline_time.py  the schedule's dry run on those durations (minipar.parallel.pp)

Then, with f_r the dry run's finish time of pipeline rank r (its busy time
m Σ_{i on r} (F_i + B_i) plus its bubble and waits for p2p), every rank ends its step:

    tail_r = DP_r + AG_r + OPT_r
      DP_r   the gradient reduction (AR, or RS when the optimizer states are sharded;
             none under ZeRO-3, which reduces every micro-batch): with Overlap.dp_grad
             max(0, t_reduce - Σ_{i on r} B_i), behind the rank's last micro-batch's
             backward (DDP's buckets), else t_reduce
      AG_r   ZeRO-1/2 and the distributed optimizer: the all-gather of the updated
             weights (Overlap.param_gather: behind the next step's first forward, up to it)
      OPT_r  Adam: Ψ_opt · bytes_per_parameter / W (compute_time.py; Ψ_opt the rank's
             parameters, divided by dp·cp when the optimizer states are sharded)
    step = max_r (f_r + tail_r)

`terms` splits the step of the rank that ends last: matmul, attention (the s² GEMMs),
elementwise, recompute, tp, cp, ep, zero3 (each m Σ over its stages), pipeline (f_r minus
its busy time: bubble and p2p waits), dp, param_gather, optimizer. They sum to `seconds`;
with one GPU the step is matmul + attention + elementwise + recompute + optimizer.

    MFU = model FLOPs / (step · GPUs · peak)   model FLOPs: flops.model_flops,
          72 B s l h² (1 + s/(6h) + V/(12 l h)), for a GPT; 3 x the GEMMs' forward FLOPs
          of compute_time.py for other shapes (SwiGLU, grouped KV heads, experts)
    HFU = (model FLOPs + recompute FLOPs) / (step · GPUs · peak)
recompute FLOPs: every layer's forward ("full"), or its two s² matmuls, 4 B s² h a layer
("selective": the attention core reruns whole, Q Kᵀ and the product with V; note that
flops.selective_recompute_extra_flops counts Q Kᵀ alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..parallel.pp.dry_run import DryRun
from . import comm_time as comm
from .compute_time import optimizer_bytes_per_parameter
from .flops import model_flops
from .gemm import GemmEfficiency, default_gemm
from .pipeline_time import pipeline_dry_run, stage_layers
from .presets import ModelSpec
from .stage_parameters import stage_parameters
from .stage_time import COMPUTE, TERMS, Overlap, Setup, empty, layer_parts, setup, stage_time

COMMUNICATION = ("tp", "cp", "ep", "zero3", "dp", "param_gather")


@dataclass(frozen=True)
class StepTime:
    """One training step's time (module docstring) and where it goes."""

    seconds: float
    terms: dict                # TERMS -> seconds on the rank that ends last; sum = seconds
    forward: tuple             # per stage: F_i, seconds a micro-batch
    backward: tuple            # per stage: B_i
    microbatches: int
    critical_rank: int         # the pipeline rank whose step ends last
    bubble_fraction: float     # the dry run's bubble / ideal, (p - 1)/m for equal stages
    communication: dict        # COMMUNICATION -> seconds on that rank before any overlap
    model_flops: float
    hardware_flops: float
    mfu: float
    hfu: float
    dry_run: DryRun = field(repr=False, compare=False)

    @property
    def compute(self) -> float:
        return sum(self.terms[k] for k in COMPUTE)

    @property
    def exposed_communication(self) -> float:
        return sum(self.terms[k] for k in COMMUNICATION)


def step_time(model: ModelSpec, layout, cluster, gemm: Optional[GemmEfficiency] = None,
              overlap: Overlap = Overlap(), dropout: bool = True,
              flash_attention: bool = False) -> StepTime:
    """One training step of `model` (presets.ModelSpec) under `layout` (layout.Layout) on
    `cluster` (presets.ClusterSpec); module docstring. gemm: the GEMM efficiency (default:
    the device's calibrated one, gemm.py); overlap: what hides behind compute; dropout:
    Megatron's GPT drops out (masks written and read); flash_attention: the s² scores
    stay on chip (no softmax or dropout bytes)."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"step_time takes a presets.ModelSpec, got {type(model).__name__}")
    gemm = gemm or default_gemm(cluster.device.name)
    su = setup(model, layout, cluster, gemm, dropout, flash_attention)
    S, m = layout.pp * layout.chunks, layout.microbatches
    layers = stage_layers(model.layers, S)
    params = [stage_parameters(model, layout, i, S, n) for i, n in enumerate(layers)]
    e = su.sh.e
    g_bytes = 4 if layout.fp32_grads or layout.precision == "fp32" else e
    parts = layer_parts(su, layout.recompute, overlap)
    stages = []
    for i, n in enumerate(layers):
        z3 = (0.0, 0.0)
        if layout.zero == 3:
            psi = sum(params[i])
            z3 = comm.zero3_stage(psi * e, psi * g_bytes, su.groups, su.topo)
        stages.append(stage_time(su, parts, n, i == 0, i == S - 1, overlap, z3))
    Fs, Bs = [s.F for s in stages], [s.B for s in stages]
    Ws = [min(s.weight, s.B) for s in stages]
    durations = {"F": Fs, "B": Bs, "I": [b - w for b, w in zip(Bs, Ws)], "W": Ws}
    cache: dict = {}

    def p2p(msg) -> float:
        if (msg.src, msg.dst) not in cache:
            cache[msg.src, msg.dst] = comm.p2p_message(su.sh, su.groups, su.topo, msg.src,
                                                       msg.dst)
        return cache[msg.src, msg.dst]

    run = pipeline_dry_run(layout.schedule, layout.pp, m, layout.chunks, durations, p2p)
    W = cluster.elementwise_bandwidth
    tails = [_tail(su, layout, overlap, W, run.info.stages_of(r), params, Fs, Bs, g_bytes)
             for r in range(layout.pp)]
    ends = [run.finish[r] + sum(t.values()) for r, (t, _) in enumerate(tails)]
    r = max(range(layout.pp), key=lambda q: (ends[q], -q))
    mine = run.info.stages_of(r)
    terms, raw = empty(), empty()
    for i in mine:
        for k in TERMS:
            terms[k] += m * (stages[i].forward[k] + stages[i].backward[k])
            raw[k] += m * stages[i].communication[k]
    terms["pipeline"] = max(0.0, run.finish[r] - m * sum(Fs[i] + Bs[i] for i in mine))
    tail, raw_tail = tails[r]
    terms.update(tail)
    raw.update(raw_tail)
    mflops, hflops = _flops(model, layout, su)
    denom = ends[r] * layout.gpus * su.peak
    return StepTime(seconds=ends[r], terms=terms, forward=tuple(Fs), backward=tuple(Bs),
                    microbatches=m, critical_rank=r,
                    bubble_fraction=float(run.bubble_over_ideal),
                    communication={k: raw[k] for k in COMMUNICATION}, model_flops=mflops,
                    hardware_flops=hflops, mfu=mflops / denom, hfu=hflops / denom,
                    dry_run=run)


def _tail(su: Setup, layout, overlap: Overlap, W: float, mine, params, Fs, Bs,
          g_bytes: int) -> tuple[dict, dict]:
    """({dp, param_gather, optimizer: seconds exposed}, {dp, param_gather: seconds}) of a
    pipeline rank holding stages `mine`, after its last micro-batch (module docstring)."""
    dense = sum(params[i][0] for i in mine)
    expert = sum(params[i][1] for i in mine)
    sharded = layout.zero >= 1 or layout.distributed_optimizer
    tail = dict(dp=0.0, param_gather=0.0)
    raw = dict(dp=0.0, param_gather=0.0)
    if layout.zero < 3:
        t = comm.dp_reduce(dense * g_bytes, expert * g_bytes, sharded, su.groups, su.topo)
        hide = sum(Bs[i] for i in mine) if overlap.dp_grad else 0.0
        tail["dp"], raw["dp"] = max(0.0, t - hide), t
        if sharded:
            t = comm.dp_param_gather(dense * su.sh.e, expert * su.sh.e, su.groups, su.topo)
            hide = min(Fs[i] for i in mine) if overlap.param_gather else 0.0
            tail["param_gather"], raw["param_gather"] = max(0.0, t - hide), t
    dpc = layout.dp * layout.cp
    psi = dense / (dpc if sharded else 1) + expert / (dpc // layout.ep if sharded else 1)
    tail["optimizer"] = psi * optimizer_bytes_per_parameter(layout.precision,
                                                            layout.fp32_grads) / W
    return tail, raw


def gpt_shaped(model: ModelSpec) -> bool:
    """flops.py's model: multi-head attention, a GeLU MLP of 4h, no experts."""
    return (not model.swiglu and model.kv == model.heads and model.ffn == 4 * model.hidden
            and not model.experts)


def _flops(model: ModelSpec, layout, su: Setup) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step (module docstring)."""
    copies = layout.tp * layout.cp * layout.global_batch / layout.micro_batch
    if gpt_shaped(model):
        counted = model_flops(layout.global_batch, model.seq_len, model.layers, model.hidden,
                              model.vocab)
    else:
        counted = 3 * copies * (model.layers * su.layer.flops + su.head.flops)
    extra = {"none": 0.0, "selective": su.layer.attention_flops,
             "full": su.layer.flops}[layout.recompute]
    return counted, counted + copies * model.layers * extra
