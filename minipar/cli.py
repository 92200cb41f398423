"""The `minipar` command.

    minipar tour [--trace PATH] [--ascii] [--width N] [--megabytes M]
    minipar incident NAME          (a: TP across nodes, b: the pipeline bubble, c: ZeRO-3 + activation checkpointing)
    minipar example NAME           (kitchen: DP 2 x TP 4 x PP 3; 70b: TP 4, PP 2, DP 8; 7b)
    minipar train [--steps N] [--batch B] [--micro-batches K] [--seq-len S] [--layers L]
                  [--hidden H] [--heads A] [--lr LR] [--warmup W] [--dtype D] [--seed N]
                  [--dp N] [--zero Z] [--dp-replicate R] [--pp N] [--schedule NAME]
                  [--chunks V] [--tp N] [--sp] [--cp N] [--cp-method ring|ulysses]
                  [--order ORDER]
                  [--nodes N] [--gpus-per-node G] [--make-vocab-size-divisible-by N]
                  [--experts E] [--top-k K] [--ep N] [--capacity-factor F] [--moe-every J]
                  [--aux-loss-coeff A] [--global-aux-loss] [--z-loss-coeff Z]
                  [--bias-update-rate G] [--compute-model calibrated|peak]
                  [--sample N] [--temperature T] [--prompt TEXT] [--quiet]
    minipar plan --model NAME --gpus N [--gpu a100|h100|h200|h800] [--global-batch B]
                 [--seq S] [--micro-batch b] [--top K] [--json]
    minipar dry-run --model NAME [--gpu G] [--tp N] [--pp N] [--dp N] [--microbatches N]
                    [--chunks N] [--global-batch N] [--seq N] [--schedule NAME] [--sp]
                    [--recompute MODE] [--compute-model calibrated|peak] [--trace PATH]
    minipar demo [--out demo.html | --serve [--port P]] [--layout DPxTPxPP ...]
    minipar lessons [list | open NN | build [--check] [--force] [NN ...] | corpus [NN ...]]
    minipar grade NN [--impl exercise|solution|PATH] [--time-limit SECONDS]
    minipar --version

Every flag is checked when it is parsed (a number is finite and in its range, a path can be
written, a lesson exists): a bad one is argparse's usage error, exit status 2, before any
work. An exception from deeper inside is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Optional, Sequence

from . import __version__
from .course import find_lesson, grade
from .course.grading import TIME_LIMIT
from .parallel.pp import SCHEDULES
from .programs import examples, lessons, train_command
from .programs import arguments as arg
from .programs import demo_command, dry_run_command, plan_command
from .programs.incidents import INCIDENTS, get
from .programs.tour import MAX_MEGABYTES, run_tour, tour_nbytes


def _tour(args: argparse.Namespace) -> int:
    nbytes = tour_nbytes(args.megabytes)
    if nbytes != args.megabytes * (1 << 20):
        print(f"(--megabytes {args.megabytes:g} is rounded to {nbytes:,} bytes: a whole "
              f"number of float32 elements that splits evenly over the 8 ranks)\n")
    run_tour(print, nbytes=nbytes, trace_path=args.trace, ascii=args.ascii, width=args.width)
    return 0


def _incident(args: argparse.Namespace) -> int:
    get(args.name).run(out=print)
    return 0


def _example(args: argparse.Namespace) -> int:
    examples.get(args.name).run(out=print)
    return 0


def _lessons(args: argparse.Namespace) -> int:
    action = args.action or "list"
    if action == "open" and len(args.numbers) != 1:
        args.parser.error(f"open takes one lesson number, e.g. `minipar lessons open 01`; got "
                          f"{len(args.numbers)}")
    if action == "list" and args.numbers:
        args.parser.error(f"list takes no lesson number (got {' '.join(args.numbers)}); "
                          f"`minipar lessons open NN` shows one lesson")
    if action != "build" and (args.check or args.force):
        args.parser.error("--check and --force apply to `minipar lessons build` only")
    if args.check and args.force:
        args.parser.error("--check only compares and --force overwrites: give one of them")
    if _missing_lesson("lessons", args.numbers):
        return 2
    return lessons.run(action, args.numbers, check=args.check, force=args.force)


def _grade(args: argparse.Namespace) -> int:
    if _missing_lesson("grade", [args.lesson]):
        return 2
    report = grade(args.lesson, args.impl, seconds_per_check=args.time_limit)
    return 0 if report.passed else 1


def _output_path(text: str) -> str:
    """An argparse `type=` for a file to write: non-empty, not a directory, in a directory
    that exists and can be written; checked before any work so a long run is not lost."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty one")
    path = os.path.abspath(text)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; name a file in it, e.g. "
                                         f"{os.path.join(text, 'trace.json')}")
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no directory {parent!r}")
    if not os.access(parent, os.W_OK) or (os.path.exists(path)
                                           and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return text


def _lesson_number(text: str) -> str:
    """An argparse `type=` for a lesson number: "1", "01" or "01_collectives" (whether the
    course has it is looked up when the command runs, by `_missing_lesson`)."""
    if not re.fullmatch(r"\d{1,2}(_\w+)?", text):
        raise argparse.ArgumentTypeError(f"expected a lesson number such as 01, got {text!r}")
    return text


def _missing_lesson(command: str, numbers: Sequence[str]) -> bool:
    """True, after saying so on stderr, when a lesson in `numbers` is not in the course."""
    for n in numbers:
        try:
            find_lesson(n)
        except KeyError as e:
            print(f"minipar {command}: {e.args[0]}", file=sys.stderr)
            return True
    return False


def _implementation(text: str) -> str:
    """An argparse `type=` for `grade --impl`: exercise, solution, or a .py file that exists."""
    if text in ("exercise", "solution"):
        return text
    if not text.endswith(".py"):
        raise argparse.ArgumentTypeError(f"expected exercise, solution or the path of a .py "
                                         f"file, got {text!r}")
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no file {text!r}")
    return text


def _train(args: argparse.Namespace) -> int:
    return train_command.run(args)  # the flags' checks across each other, the run, the summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="minipar",
        description="How large language models are trained across many accelerators, "
                    "executable in NumPy on simulated devices.")
    p.add_argument("--version", action="version", version=f"minipar {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("tour", help="run every collective on 8 simulated GPUs (2 nodes) and "
                                    "show what moved where, what it cost, and a timeline")
    t.add_argument("--trace", metavar="PATH", type=_output_path,
                   help="also write a Chrome trace of every part (open in Perfetto or "
                        "chrome://tracing)")
    t.add_argument("--ascii", action="store_true",
                   help="print ASCII only: timelines, units, formulas and diagrams")
    t.add_argument("--width", metavar="N", type=arg.width, default=72,
                   help="timeline width in columns, 1 to 1000 (72)")
    t.add_argument("--megabytes", metavar="M", type=arg.megabytes, default=4.0,
                   help=f"per-rank buffer size of the costed collectives, in MiB, above 0 "
                        f"and at most {MAX_MEGABYTES:g}; rounded to whole float32 elements "
                        f"that split over 8 ranks (4)")
    t.set_defaults(func=_tour)

    inc = sub.add_parser("incident", help="run an incident case on simulated "
                                          "GPUs and show what went wrong and what fixes it",
                         description="Reproduce an incident case: measure the failure and "
                                     "its fixes side by side. " + "; ".join(
                                         f"{k}: {why}" for k, (_, why) in INCIDENTS.items()))
    inc.add_argument("name", choices=sorted(INCIDENTS), metavar="NAME",
                     help="which incident: " + ", ".join(sorted(INCIDENTS)))
    inc.set_defaults(func=_incident)

    ex = sub.add_parser("example", help="run one of the seed's 3-D layouts on simulated GPUs",
                        description="; ".join(f"{k}: {w}" for k, (_, w) in
                                              examples.EXAMPLES.items()))
    ex.add_argument("name", choices=sorted(examples.EXAMPLES), metavar="NAME")
    ex.set_defaults(func=_example)

    le = sub.add_parser("lessons", help="the course: list the lessons, show one's files, "
                                         "regenerate the exercises",
                        description="The course in lessons/: `minipar lessons` lists the "
                                    "lessons, `minipar lessons open NN` prints where one's "
                                    "files are, `minipar lessons build` regenerates every "
                                    "exercise.py from its solution.py (--check only compares), "
                                    "`minipar lessons corpus` checks that every known wrong "
                                    "answer fails with its hint and every right one passes.")
    le.add_argument("action", nargs="?", choices=("list", "open", "build", "corpus"),
                    metavar="ACTION",
                    help="list (default) | open NN | build [NN ...] | corpus [NN ...]: grade "
                         "the known wrong and right answers of each lesson's corpus.py")
    le.add_argument("numbers", nargs="*", metavar="NN", type=_lesson_number,
                    help="lesson number(s)")
    le.add_argument("--check", action="store_true",
                    help="build: only check that each exercise.py is what its solution.py "
                         "generates (exit 1 if not)")
    le.add_argument("--force", action="store_true",
                    help="build: overwrite an exercise.py that differs (your answers too)")
    le.set_defaults(func=_lessons, parser=le)

    gr = sub.add_parser("grade", help="grade a lesson's exercises on simulated devices",
                        description="Run lesson NN's grader on your exercise.py (or on the "
                                    "solution, or any file): each exercise is checked against "
                                    "minipar's own implementation over many configurations, "
                                    "and a failure names the rank, what was expected, what "
                                    "was received and the smallest failing configuration.")
    gr.add_argument("lesson", metavar="NN", type=_lesson_number, help="lesson number, e.g. 01")
    gr.add_argument("--impl", default="exercise", metavar="WHICH", type=_implementation,
                    help="exercise (default: your file), solution, or a path to a .py file")
    gr.add_argument("--time-limit", metavar="SECONDS", default=TIME_LIMIT,
                    type=arg.number(float, 0, True, "a positive number of seconds"),
                    help=f"stop a check that runs longer than this (default {TIME_LIMIT:g} s): "
                         "a loop that never ends, a collective some rank never joins")
    gr.set_defaults(func=_grade)

    tr = sub.add_parser("train", help="train a small GPT on the bundled corpus on one "
                                      "simulated GPU or any dp x cp x pp x tp layout of them "
                                      "and "
                                      "report loss, time, FLOPs and memory",
                        description="Train a character-level GPT on the bundled corpus on one "
                                    "simulated H100: gradient accumulation over micro-batches, "
                                    "global-norm clipping, AdamW with warmup and cosine decay, "
                                    "mixed precision for bfloat16/float16; with --dp, --cp, "
                                    "--pp, --tp on that many simulated H100s (ZeRO, a "
                                    "pipeline schedule, sequence and context parallelism, "
                                    "nodes), with "
                                    "each rank's memory and where its step's time went.")
    tr.add_argument("--steps", metavar="N", type=arg.steps, default=200,
                    help="optimizer steps, at most 1,000,000 (200)")
    tr.add_argument("--batch", metavar="B", type=arg.positive_int, default=32,
                    help="global batch, in sequences (32)")
    tr.add_argument("--micro-batches", metavar="K", type=arg.positive_int, default=1,
                    help="gradient-accumulation micro-batches per step; must divide --batch (1)")
    tr.add_argument("--seq-len", metavar="S", type=arg.positive_int, default=32,
                    help="characters per sequence (32)")
    tr.add_argument("--layers", metavar="L", type=arg.positive_int, default=2,
                    help="transformer blocks (2)")
    tr.add_argument("--hidden", metavar="H", type=arg.positive_int, default=64,
                    help="hidden size (64)")
    tr.add_argument("--heads", metavar="A", type=arg.positive_int, default=4,
                    help="attention heads; must divide --hidden (4)")
    tr.add_argument("--lr", metavar="LR", type=arg.positive_float, default=1e-2,
                    help="peak learning rate; the cosine ends at a tenth of it (0.01)")
    tr.add_argument("--warmup", metavar="W", type=arg.count, default=None,
                    help="warmup steps (a tenth of --steps)")
    tr.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                    default="float32", metavar="D",
                    help="float32 | bfloat16 | float16 | float64: parameters and activations; "
                         "the 16-bit ones with float32 master weights (float32)")
    tr.add_argument("--seed", metavar="N", type=arg.count, default=0,
                    help="seed of the weights and the data (0)")
    tr.add_argument("--dp", metavar="N", type=arg.devices, default=1,
                    help="data-parallel ranks, each on its block of --batch, at most 64 (1)")
    tr.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, metavar="Z",
                    help="0: DDP over --dp; 1, 2, 3: ZeRO-1/2/3 (optimizer states, + "
                         "gradients, + parameters partitioned over --dp) (0)")
    tr.add_argument("--dp-replicate", metavar="R", type=arg.devices, default=1,
                    help="with --zero 1-3: shard over --dp / R ranks and replicate the shards "
                         "R times (HYBRID_SHARD's split: shard inside a node, replicate "
                         "across) (1)")
    tr.add_argument("--pp", metavar="N", type=arg.devices, default=1,
                    help="pipeline stages, one simulated device each, at most 64; "
                         "--micro-batches is then the pipeline's m (1: one device)")
    tr.add_argument("--schedule", choices=list(SCHEDULES), default=None, metavar="NAME",
                    help=" | ".join(SCHEDULES) + ": the pipeline's schedule (1f1b)")
    tr.add_argument("--chunks", metavar="V", type=arg.positive_int, default=None,
                    help="stages per rank: any for interleaved_1f1b, 2 (implied) for the V "
                         "schedules zbv and dualpipev, 1 for the others (the schedule's own)")
    tr.add_argument("--tp", metavar="N", type=arg.devices, default=1,
                    help="tensor-parallel ranks (Megatron), at most 64; must divide --heads, "
                         "the MLP's 4 x --hidden and the vocabulary (1)")
    tr.add_argument("--sp", action="store_true",
                    help="sequence parallelism over the --tp group; --seq-len divides by --tp")
    tr.add_argument("--cp", metavar="N", type=arg.devices, default=1,
                    help="context-parallel ranks: each sequence's zigzag rows through "
                         "attention over N ranks, gradients over --dp x --cp; --seq-len "
                         "divides by 2N (1)")
    tr.add_argument("--cp-method", choices=["ring", "ulysses"], default="ring",
                    help="how attention reaches the other ranks' keys: K/V around a ring, "
                         "or an all-to-all of heads (Ulysses; --heads / --tp divides by "
                         "--cp) (ring)")
    tr.add_argument("--order", metavar="ORDER", default="tp-cp-ep-dp-pp",
                    help="how ranks are laid out, Megatron's order, fastest first: tp-pp-dp "
                         "puts dp across the nodes (tp-cp-ep-dp-pp)")
    tr.add_argument("--nodes", metavar="N", type=arg.devices, default=None,
                    help="nodes of the simulated cluster (InfiniBand between them); the "
                         "ranks, tp fastest, fill a node before the next (derived)")
    tr.add_argument("--gpus-per-node", metavar="G", type=arg.devices, default=None,
                    help="devices per node (NVLink inside it); --nodes x --gpus-per-node "
                         "= --dp x --cp x --pp x --tp (one node of every rank)")
    tr.add_argument("--make-vocab-size-divisible-by", metavar="N", type=arg.positive_int,
                    default=1, dest="vocab_divisible_by",
                    help="pad the vocabulary to a multiple of N, on every layout alike, so "
                         "--tp can split it (Megatron's flag) (1)")
    moe = tr.add_argument_group("mixture of experts (nn/moe, parallel/ep; DDP, no --sp)")
    moe.add_argument("--experts", metavar="E", type=arg.count, default=0,
                     help="experts in each MoE block (0: dense MLPs) (0)")
    moe.add_argument("--top-k", metavar="K", type=arg.positive_int, default=2,
                     help="experts each token is routed to, at most --experts (2)")
    moe.add_argument("--ep", metavar="N", type=arg.devices, default=1,
                     help="expert-parallel ranks, folded into --dp; divides --dp and "
                          "--experts (1)")
    moe.add_argument("--capacity-factor", metavar="F", type=arg.positive_float, default=None,
                     help="an expert keeps ceil(K x tokens / E x F) choices, the lowest "
                          "weights dropped (dropless)")
    moe.add_argument("--moe-every", metavar="J", type=arg.positive_int, default=1,
                     help="every J-th block is an MoE, from block 0 (1)")
    moe.add_argument("--aux-loss-coeff", metavar="A", type=arg.nonnegative_float, default=0.01,
                     help="the load-balancing loss's weight, GShard/Switch (0.01)")
    moe.add_argument("--global-aux-loss", action="store_true",
                     help="measure that loss's expert loads over every data-parallel rank's "
                          "micro-batch (Megatron's global_aux_loss), not each rank's own")
    moe.add_argument("--z-loss-coeff", metavar="Z", type=arg.nonnegative_float, default=0.0,
                     help="the router z-loss's weight, ST-MoE (0)")
    moe.add_argument("--bias-update-rate", metavar="G", type=arg.nonnegative_float, default=0.0,
                     help="DeepSeek-V3's aux-loss-free bias step per optimizer step (0)")
    tr.add_argument("--compute-model", choices=("calibrated", "peak"), default="calibrated",
                    help="what the simulated clock charges: calibrated, each GEMM at the "
                         "planner's efficiency of its shape (e_max 0.766 x g(M)g(N)g(K)) and "
                         "elementwise work by its bytes over the device's HBM; peak, every "
                         "matmul at peak and nothing else, so one device's MFU is 100 %% by "
                         "construction (calibrated)")
    tr.add_argument("--sample", type=arg.sample, default=0, metavar="N",
                    help="print N characters generated by the trained model, at most "
                         "100,000 (0)")
    tr.add_argument("--temperature", metavar="T", type=arg.nonnegative_float, default=0.0,
                    help="sampling temperature for --sample; 0 is greedy (0)")
    tr.add_argument("--prompt", metavar="TEXT", default="The ",
                    help="text the sample continues ('The ')")
    tr.add_argument("--quiet", action="store_true",
                    help="no progress display, only the summary")
    tr.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                    help="save a sharded checkpoint into DIR/step-NNNNNNNN every --save-every "
                         "steps (none)")
    tr.add_argument("--save-every", metavar="N", type=arg.positive_int, default=10,
                    help="steps between checkpoints (10)")
    tr.add_argument("--resume", metavar="DIR", default=None,
                    help="continue from the newest complete checkpoint in DIR, at any layout "
                         "(the same, or fewer --dp replicas); saves go on into DIR")
    tr.add_argument("--fail-at", metavar="RANK:STEP[:POINT]", action="append", default=[],
                    help="make RANK fail in STEP (from 1) as it begins, at a pipeline action "
                         "POINT such as 2F1, or at 'save' midway through a checkpoint")
    tr.set_defaults(func=_train, parser=tr)
    plan_command.add_parser(sub, arg)
    dry_run_command.add_parser(sub, arg)
    demo_command.add_parser(sub, _output_path)
    return p


def _lesson_numbers_after_flags(parser: argparse.ArgumentParser, args: argparse.Namespace,
                                extra: list[str]) -> None:
    """`minipar lessons build --force 06`: argparse ends the NN list at the first flag, so
    numbers after a flag come back unparsed; they are lesson numbers, anything else is an
    error as parse_args would have made it."""
    if getattr(args, "command", None) != "lessons" or any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        args.numbers = list(args.numbers) + [_lesson_number(e) for e in extra]
    except argparse.ArgumentTypeError as e:
        args.parser.error(f"argument NN: {e}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _lesson_numbers_after_flags(parser, args, extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `minipar tour | head`
        return 0
    except FileNotFoundError as e:  # no lessons directory (lesson numbers are parse-time)
        if args.command not in ("lessons", "grade"):
            raise  # anything else unexpected is a bug: its traceback stays
        print(f"minipar {args.command}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
