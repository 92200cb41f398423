"""The `minipar` command.

    minipar tour [--trace PATH] [--ascii] [--width N] [--megabytes M]
    minipar --version
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import __version__


def _tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    if args.megabytes <= 0:
        raise SystemExit("minipar tour: --megabytes must be positive")
    run_tour(nbytes=int(args.megabytes * (1 << 20)), trace_path=args.trace,
             ascii=args.ascii, width=args.width)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="minipar",
        description="How large language models are trained across many accelerators, "
                    "executable in NumPy on simulated devices.")
    p.add_argument("--version", action="version", version=f"minipar {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("tour", help="run every collective on 8 simulated GPUs (2 nodes) and "
                                    "show what moved where, what it cost, and a timeline")
    t.add_argument("--trace", metavar="PATH",
                   help="also write a Chrome trace (open in Perfetto or chrome://tracing)")
    t.add_argument("--ascii", action="store_true", help="draw the timeline in plain ASCII")
    t.add_argument("--width", type=int, default=72, help="timeline width in columns (72)")
    t.add_argument("--megabytes", type=float, default=4.0,
                   help="per-rank buffer size of the costed collectives, in MiB (4)")
    t.set_defaults(func=_tour)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `minipar tour | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
