"""`minipar dry-run`: one training step of a layout at full scale, every kernel on the clock.

    minipar dry-run --model llama3-405b --gpu h100 --tp 8 --pp 16 --dp 128 \\
                    --schedule interleaved_1f1b --chunks 2 --microbatches 16 \\
                    --global-batch 2048 --sp [--trace step.json]

plan/timeline.py runs the step as parallelize would, one rank per pipeline coordinate
(the mesh's symmetry), the model as a GPT of the preset's size (plan/sized.py), on the
runtime's clock with the planner's compute model for the node (its GEMM efficiency and
achieved HBM bandwidth; --compute-model peak: every matmul at peak, nothing else). It prints
the step's time, each pipeline rank's GEMM, memory-bound, blocking-communication and idle
time, its peak activations and memory (model states plus activations), and the step's
HFU; `--trace` writes the ranks' Chrome trace
(chrome://tracing or ui.perfetto.dev).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from ..parallel.pp.schedules import SCHEDULES
from ..plan.layout import Layout
from ..plan.presets import cluster, model
from ..plan.sized import as_gpt
from ..plan.timeline import timeline
from ..plan.gemm import default_gemm
from ..runtime.compute_model import ComputeModel
from ..viz.chrome import to_chrome_trace
from .plan_command import model_and_node_flags


def add_parser(sub, arg) -> None:
    """The `dry-run` subcommand's flags (arg: the command's argparse types)."""
    dr = sub.add_parser("dry-run", help="time one step of a layout at full scale, kernel by "
                                        "kernel, without arithmetic",
                        description="The real schedules and the runtime's cost model run "
                                    "without arithmetic: one rank per pipeline coordinate "
                                    "(docs/planner.md, 'The dry run').")
    model_and_node_flags(dr)
    for flag, default, what in (("--tp", 8, "tensor-parallel size (8)"),
                                ("--pp", 1, "pipeline stages' ranks (1)"),
                                ("--dp", 1, "data-parallel replicas, DDP (1)"),
                                ("--microbatches", None, "micro-batches a step (pp x 2)"),
                                ("--chunks", None, "stages a rank (the schedule's own)"),
                                ("--global-batch", None, "sequences a step (microbatches x "
                                                         "dp)"),
                                ("--seq", None, "tokens a sequence (the model's)")):
        dr.add_argument(flag, type=arg.positive_int, default=default, metavar="N", help=what)
    dr.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES),
                    help="the pipeline schedule (1f1b)")
    dr.add_argument("--sp", action="store_true", help="sequence parallelism")
    dr.add_argument("--recompute", default="none", choices=("none", "selective", "full"),
                    help="activation recomputation (none)")
    dr.add_argument("--compute-model", choices=("calibrated", "peak"), default="calibrated",
                    help="what the clock charges: calibrated, each GEMM at the planner's "
                         "efficiency of its shape and elementwise work by its bytes over "
                         "HBM; peak, every matmul at peak and nothing else (calibrated)")
    dr.add_argument("--trace", metavar="PATH", default=None,
                    help="write the ranks' Chrome trace to PATH")
    dr.set_defaults(func=run, parser=dr)


def run(args: argparse.Namespace) -> int:
    spec = model(args.model)
    if args.seq is not None:
        spec = dataclasses.replace(spec, seq_len=args.seq)
    node = cluster(args.gpu)
    m = args.microbatches or 2 * args.pp
    B = args.global_batch or m * args.dp
    # the planner's clock for this node: its GEMM calibration, its achieved HBM bandwidth
    clock = ComputeModel(default_gemm(node.device.name), node.elementwise_bandwidth) \
        if args.compute_model == "calibrated" else ComputeModel.peak()
    if B % (m * args.dp):
        args.parser.error(f"--global-batch {B} must split into --microbatches {m} of --dp "
                          f"{args.dp} equal blocks: give a multiple of {m * args.dp}")
    try:
        gpt = as_gpt(spec)
        layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, schedule=args.schedule,
                        chunks=args.chunks or (2 if args.schedule in ("zbv", "dualpipev")
                                               else 1),
                        micro_batch=B // (m * args.dp),
                        global_batch=B, sequence_parallel=args.sp, recompute=args.recompute)
        nodes = -(-layout.gpus // node.gpus_per_node)
        began = time.perf_counter()
        tl = timeline(gpt, layout, node.topology(nodes), compute_model=clock)
        took = time.perf_counter() - began
    except ValueError as e:
        args.parser.error(str(e))
    flops = sum(e.flops for r in tl.ranks for e in r.events) * args.dp * args.tp
    peak = node.device.peak("bfloat16")
    print(f"minipar dry-run: {gpt.name} (h {gpt.hidden}, f {gpt.ffn}, {gpt.layers} layers, "
          f"s {gpt.seq_len}, bf16) on {layout.gpus:,} x "
          f"{node.device.name}: dp {args.dp} x pp {args.pp} x tp {args.tp}"
          f"{' + SP' if args.sp else ''}, {args.schedule}, m = {m}, global batch {B}")
    print(f"  compute: {clock.describe()}")
    print(f"  step {tl.step_time:.3f} s simulated ({took:.2f} s to dry-run "
          f"{sum(len(r.events) for r in tl.ranks):,} events), HFU "
          f"{flops / (tl.step_time * layout.gpus * peak):.1%} (the matmuls run, "
          f"recomputation included, over the step's peak FLOPs)")
    print(f"  {'pp rank':>7} {'matmul':>9} {'memory':>9} {'comm':>9} {'idle':>9} "
          f"{'peak act.':>10} {'peak mem.':>10}")
    for r in tl.ranks:
        gemm = r.busy("compute", "matmul")
        kernels = sum(e.duration for e in r.events if e.stream == "compute"
                      and "action" not in e.meta)
        comm = sum(e.duration for e in r.events if e.stream == "comm")
        idle = tl.step_time - kernels - comm
        act = max((a for _, a in r.activations), default=0.0)
        mem = max((m for _, m in r.memory()), default=0.0)
        print(f"  {r.pipeline_rank:>7} {gemm:>8.3f}s {kernels - gemm:>8.3f}s {comm:>8.3f}s "
              f"{idle:>8.3f}s {act / 2**30:>6.1f} GiB {mem / 2**30:>6.1f} GiB")
    worst = max(max((m for _, m in r.memory()), default=0.0) for r in tl.ranks)
    if worst > node.device.memory_bytes:
        print(f"  model states (DDP: every replica holds them whole) and activations reach "
              f"{worst / 1e9:,.0f} GB of the device's {node.device.memory_bytes / 1e9:,.0f}: "
              f"this layout does not fit (more pp, --sp, --recompute; ZeRO and the "
              f"distributed optimizer, which `minipar plan` searches, shard the states)")
    print("  matmul: GEMMs; memory: memory-bound kernels (norms, softmax, GeLU, dropout, "
          "the loss, AdamW); comm: blocking collectives and DDP's buckets; idle: the "
          "bubble and p2p waits. One rank per pipeline coordinate, exact for it "
          "(plan/timeline.py).")
    if args.trace:
        to_chrome_trace(tl.events(), args.trace)
        print(f"  wrote {args.trace} (chrome://tracing or ui.perfetto.dev)")
    return 0
