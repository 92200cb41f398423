"""`minipar train`: the flags' checks across each other, the run, the summary.

cli.py parses the flags one by one (a number is finite and in its range); this module
checks them against each other, in flag names, the way argparse reports its own errors
(`args.parser.error`, exit status 2, before any work), builds the TrainConfig, and runs it:
every size 1 on one device (train.py), any other layout on dp x pp x tp simulated devices
(train_parallel.py). The rules are the library's: the schedule's (pipeline_flag_error), the
layout's (layout_flag_error: ParallelDims' world, check_tensor_parallel's split), and
whatever TrainConfig still refuses becomes a usage error too.
"""

from __future__ import annotations

import argparse
import re
import sys

from ..data import CharTokenizer, load_corpus
from ..files import CheckpointError
from ..runtime.errors import RankFailedError
from ..parallel.mesh import check_placement
from . import train_report
from .train import generate, train
from .train_checks import (TrainingDiverged, TrainingRefused, cp_flag_error, divisors,
                           in_flags, layout_flag_error, moe_flag_error, pipeline_flag_error,
                           tp_in_flags)
from .train_config import TrainConfig, gpt_config
from .train_parallel import train_parallel
from .train_resume import recovery_from_args, failure_report, resume_note


def check_flags(args: argparse.Namespace, warmup: int) -> None:
    """Checks across flags, reported in flag names the way argparse reports its own."""
    if args.hidden % args.heads:
        args.parser.error(f"--heads {args.heads} must divide --hidden {args.hidden} (each head "
                          f"gets hidden/heads dimensions); try --heads in "
                          f"{divisors(args.hidden)}")
    if args.batch % args.micro_batches:
        args.parser.error(f"--micro-batches {args.micro_batches} must divide --batch "
                          f"{args.batch} (equal micro-batches); try one of "
                          f"{divisors(args.batch)}")
    if warmup > args.steps:
        args.parser.error(f"--warmup {warmup} is longer than the run (--steps {args.steps})")
    corpus = load_corpus()
    if args.seq_len >= len(corpus):
        args.parser.error(f"--seq-len {args.seq_len} is too long for the bundled corpus of "
                          f"{len(corpus)} characters (a window needs seq_len + 1)")
    error = pipeline_flag_error(args.pp, args.schedule, args.chunks, args.micro_batches,
                                args.layers, args.dtype)
    if error:
        args.parser.error(error)
    mcfg = gpt_config(CharTokenizer.from_text(corpus).vocab_size, args.vocab_divisible_by,
                      seq_len=args.seq_len, hidden=args.hidden, num_heads=args.heads,
                      num_layers=args.layers, dtype=args.dtype, seed=args.seed)
    error = layout_flag_error(args.dp, args.pp, args.tp, args.zero, args.sp, args.nodes,
                              args.gpus_per_node, args.batch, args.micro_batches, args.dtype,
                              mcfg, args.dp_replicate, args.cp)
    if error:
        args.parser.error(error)
    error = cp_flag_error(args, mcfg)
    if error:
        args.parser.error(error)
    error = moe_flag_error(args)
    if error:
        args.parser.error(error)
    unknown = sorted(set(args.prompt) - set(corpus))
    if args.sample and (not args.prompt or unknown):
        args.parser.error(f"--prompt must be non-empty and use only the corpus's characters; "
                          f"{args.prompt!r} has {''.join(unknown) or 'no characters'!r}")


def _config(args: argparse.Namespace, warmup: int) -> TrainConfig:
    return TrainConfig(steps=args.steps, global_batch=args.batch,
                       num_microbatches=args.micro_batches, seq_len=args.seq_len,
                       num_layers=args.layers, hidden=args.hidden, num_heads=args.heads,
                       lr=args.lr, warmup_steps=warmup, min_lr=args.lr / 10,
                       dtype=args.dtype, seed=args.seed, pp=args.pp,
                       schedule=args.schedule or "1f1b", chunks=args.chunks, dp=args.dp,
                       tp=args.tp, cp=args.cp, cp_method=args.cp_method,
                       sequence_parallel=args.sp, zero=args.zero,
                       dp_replicate=args.dp_replicate, order=args.order,
                       nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                       vocab_divisible_by=args.vocab_divisible_by, experts=args.experts,
                       top_k=args.top_k, ep=args.ep, capacity_factor=args.capacity_factor,
                       moe_every=args.moe_every, aux_loss_coeff=args.aux_loss_coeff,
                       global_aux_loss=args.global_aux_loss,
                       z_loss_coeff=args.z_loss_coeff, bias_update_rate=args.bias_update_rate,
                       compute_model=args.compute_model)


def warn_placement(cfg: TrainConfig) -> None:
    """The placement check's findings (a tp group across nodes, a cheaper order of the same
    sizes, priced with the cost model) on stderr, in flag names; the run goes on as asked,
    so that a lesson can measure what a bad placement costs."""
    if not cfg.parallel:
        return
    mcfg = cfg.model_config(CharTokenizer.from_text(load_corpus()).vocab_size)
    findings = check_placement(cfg.dims, cfg.topology(), mcfg,
                               micro_batch=cfg.global_batch // (cfg.dp * cfg.num_microbatches),
                               microbatches=cfg.num_microbatches, chunks=cfg.chunks,
                               sequence_parallel=cfg.sequence_parallel, zero=cfg.zero)
    for f in findings:
        text = re.sub(r"order='([\w-]+)'", r"--order \1", f.message)
        text = re.sub(r"[;,]? (or )?placement='any' (to run|runs) it as it is", "", text)
        sys.stderr.write(f"minipar train: placement: {text} (running it as asked)\n")


def run(args: argparse.Namespace) -> int:
    """Check the flags, train, print the summary (and a sample); the exit status."""
    warmup = args.warmup if args.warmup is not None else args.steps // 10
    check_flags(args, warmup)
    try:
        cfg = _config(args, warmup)
    except ValueError as e:  # anything TrainConfig refuses that the checks above missed
        args.parser.error(tp_in_flags(in_flags(str(e))))
    warn_placement(cfg)
    recovery = recovery_from_args(args, cfg)  # --checkpoint-dir, --resume, --fail-at
    progress = None if args.quiet else train_report.Progress(sys.stderr, cfg.log_every)
    try:
        if recovery.active:  # through parallelize on every layout, one device included
            sys.stderr.write(resume_note(recovery))
            r = train_parallel(cfg, on_step=progress, recovery=recovery)
        else:
            r = (train_parallel if cfg.parallel else train)(cfg, on_step=progress)
    except KeyboardInterrupt:
        sys.stderr.write("\nminipar train: interrupted\n")
        return 130
    except TrainingRefused as e:  # too large for the device or this machine: nothing ran
        args.parser.error(str(e))
    except TrainingDiverged as e:  # the step and the likely cause; exit status 1
        sys.stderr.write(f"\nminipar train: {e}\n")
        return 1
    except (RankFailedError, CheckpointError) as e:  # a rank failed: its traceback, and
        sys.stderr.write(f"\n{failure_report(e, recovery)}\n")  # where to resume from
        return 1
    print("\n".join(train_report.summary(cfg, r)))
    if args.sample:
        how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
        text = generate(r.model, r.tokenizer, args.prompt, args.sample,
                        temperature=args.temperature, seed=cfg.seed)
        print(f"\nsample ({how}, {args.sample} characters after {args.prompt!r}):")
        print(text)
    return 0
