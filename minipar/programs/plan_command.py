"""`minipar plan`: the layouts of N GPUs that fit a model, fastest first, with the reasons.

    minipar plan --model llama3-70b --gpus 256 --gpu h100 --global-batch 512 [--seq 8192]
                 [--micro-batch 1] [--top 10] [--json]

Memory first, then time: plan/search.py enumerates the layouts, drops those whose busiest
rank does not fit the device (plan/rank_memory.py) and ranks the others by the predicted
step (plan/step_time.py). Each plan prints its layout, step time, MFU, bubble, exposed
communication and peak memory, and the tuning checklist's findings with their fixes.
`--json` prints the same as a JSON list, for tools. A search of a few hundred layouts takes
seconds; on a terminal a progress line counts them on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..plan.presets import CLUSTERS, MODELS, ModelSpec, cluster, model
from ..plan.search import search

#: every preset but DeepSeek-V3, whose latent attention the time model does not describe
PLANNABLE = sorted(k for k, m in MODELS.items() if isinstance(m, ModelSpec))


def model_and_node_flags(parser) -> None:
    """--model and --gpu, as `plan` and `dry-run` take them."""
    parser.add_argument("--model", required=True, choices=PLANNABLE, metavar="NAME",
                        help=" | ".join(PLANNABLE))
    parser.add_argument("--gpu", default="h100", choices=sorted(CLUSTERS),
                        help="the node kind: its device and links (h100)")


def add_parser(sub, arg) -> None:
    """The `plan` subcommand's flags (arg: the command's argparse types)."""
    pl = sub.add_parser("plan", help="list the layouts of N GPUs that fit a model, fastest "
                                     "first, with the tuning checklist's findings",
                        description="Memory first, then time: every layout of --gpus GPUs "
                                    "whose busiest rank fits the device, ranked by the "
                                    "predicted step time (docs/planner.md).")
    model_and_node_flags(pl)
    pl.add_argument("--gpus", required=True, type=arg.positive_int, metavar="N",
                    help="GPUs in all, nodes of 8")
    pl.add_argument("--global-batch", type=arg.positive_int, default=None, metavar="B",
                    help="sequences a step (default: 2 x --gpus)")
    pl.add_argument("--seq", type=arg.positive_int, default=None, metavar="S",
                    help="tokens a sequence (default: the model's training length)")
    pl.add_argument("--micro-batch", type=arg.positive_int, default=1, metavar="b",
                    help="sequences a micro-batch (1)")
    pl.add_argument("--top", type=arg.positive_int, default=10, metavar="K",
                    help="how many plans to list (10)")
    pl.add_argument("--json", action="store_true", help="print the plans as JSON")
    pl.set_defaults(func=run, parser=pl)


def run(args: argparse.Namespace) -> int:
    m = model(args.model)
    if args.seq is not None:
        m = dataclasses.replace(m, seq_len=args.seq)
    batch = args.global_batch or 2 * args.gpus
    node = cluster(args.gpu)
    show = sys.stderr.isatty() and not args.json

    def progress(done: int, total: int) -> None:
        if show:
            end = "\n" if done == total else ""
            print(f"\rplanning: {done} of {total} layouts", end=end, file=sys.stderr,
                  flush=True)

    try:
        plans = search(m, args.gpus, node, batch, args.micro_batch, args.top, progress)
    except ValueError as e:
        args.parser.error(str(e))
    if args.json:
        print(json.dumps([p.row() for p in plans], indent=1))
        return 0 if plans else 1
    print(f"minipar plan: {m.name} ({m.parameters() / 1e9:.1f}B parameters, s = {m.seq_len}) "
          f"on {args.gpus} x {node.device.name} ({node.name} nodes of "
          f"{node.gpus_per_node}), global batch {batch}")
    if not plans:
        print("  no layout fits: every candidate's busiest rank exceeds the device's "
              "memory; add GPUs, or shorten the sequence")
        return 1
    for i, p in enumerate(plans, start=1):
        t, cap = p.time, p.memory.capacity or 0
        bubble = max(0.0, t.terms["pipeline"]) / t.seconds
        print(f"{i:>3}. {p.layout}")
        print(f"     step {t.seconds:.3f} s, MFU {t.mfu:.1%}, bubble {bubble:.1%}, exposed "
              f"communication {t.exposed_communication / t.seconds:.1%}, peak "
              f"{p.memory.peak / 2**30:.1f} of {cap / 2**30:.0f} GiB")
        for r in p.reasons:
            print(f"     - {r}")
    print("  predicted by plan.rank_memory and plan.step_time (docs/planner.md)")
    return 0
