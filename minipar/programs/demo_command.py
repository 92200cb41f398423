"""`minipar demo`: write the visual demo, one self-contained HTML page, or serve it.

    minipar demo [--out demo.html] [--layout DPxTPxPP ...]
    minipar demo --serve [--port 8000] [--host 127.0.0.1] [--layout DPxTPxPP ...]

The page (minipar/viz/demo/, docs/demo.md) has four modes. Architecture: the nodes and GPUs
of a layout with its tp, pp and dp groups (the seed's layouts embedded from ParallelGroups;
each --layout adds one; any other is computed in the page by the same rule). Data, state
and performance: one training step's batch, memory and time, from real runs of a tiny GPT
and from the dry run or the planner for a Llama 3 70B-sized one (programs/demo_scenario.py
says which are embedded). Writing the page computes those scenarios, one worker process a
core (about 10 s on one core, 4.5 s on two); on a terminal a progress line counts them on
stderr. The written file needs no network.
With --serve the page is served on a local port and computes any other scenario its
controls ask for (demo_serve.py); Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import os
import sys

from .demo import MAX_GPUS, demo_data, parse_layout, scenario_data, write_demo
from .demo_serve import DemoServer


def _layout(text: str) -> tuple[int, int, int]:
    """An argparse `type=` for --layout: DPxTPxPP, e.g. 2x4x3."""
    try:
        return parse_layout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 .. 65535 (0: any free one), got {port}")
    return port


def add_parser(sub, output_path) -> None:
    """The `demo` subcommand's flags (output_path: the command's type for a file to write)."""
    de = sub.add_parser("demo", help="the visual demo of 3-D parallelism: one HTML page that "
                                     "opens offline (architecture, data, state, performance)",
                        description="Write one self-contained HTML page (docs/demo.md) with "
                                    "four modes: the mesh on the nodes, one batch's journey "
                                    "through the collectives, each device's memory, and "
                                    "where the time goes, from real runs of a tiny GPT and "
                                    "the dry run of a 70B-sized one. --serve serves it and "
                                    "computes any layout its controls ask for.")
    de.add_argument("--out", metavar="PATH", type=output_path, default=None,
                    help="the HTML file to write (demo.html); not with --serve")
    de.add_argument("--layout", metavar="DPxTPxPP", type=_layout, action="append",
                    default=[],
                    help=f"embed this layout's groups from minipar too, e.g. 4x2x2 (at most "
                         f"{MAX_GPUS} GPUs); repeat for more. The seed's kitchen (2x4x3) and "
                         f"70B layout (8x4x2) are always in")
    de.add_argument("--serve", action="store_true",
                    help="serve the page on a local port instead of writing it; the page "
                         "then computes any scenario its controls pick")
    de.add_argument("--port", metavar="P", type=_port, default=8000,
                    help="with --serve: the port (8000; 0 picks a free one)")
    de.add_argument("--host", metavar="ADDR", default="127.0.0.1",
                    help="with --serve: the address to listen on (127.0.0.1: this machine)")
    de.set_defaults(func=run, parser=de)


def _progress():
    """A progress line on stderr when it is a terminal, else nothing."""
    show = sys.stderr.isatty()

    def progress(done: int, total: int, key: str) -> None:
        if show:
            end = "\n" if done == total else ""
            print(f"\rminipar demo: {done} of {total} scenarios ({key})".ljust(78), end=end,
                  file=sys.stderr, flush=True)
    return progress


def run(args: argparse.Namespace) -> int:
    if args.serve:
        if args.out is not None:
            args.parser.error("--out writes the page to a file and --serve serves it: give "
                              "one of them")
        return serve(args)
    args.out = args.out or "demo.html"
    data = write_demo(args.out, args.layout, progress=_progress())
    names = ", ".join(f"{d['title']} ({d['gpus']} GPUs)" for d in data["layouts"])
    print(f"minipar demo: wrote {args.out} ({os.path.getsize(args.out):,} bytes): {names}; "
          f"{len(data['scenarios'])} scenarios")
    print(f"  open it in a browser: file://{os.path.abspath(args.out)}")
    return 0


def serve(args: argparse.Namespace) -> int:
    data = demo_data(args.layout, progress=_progress(), served=True)
    try:
        server = DemoServer((args.host, args.port), data, scenario_data,
                            log=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    except OSError as e:
        args.parser.error(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; "
                          f"pick another --port (0: any free one)")
    host, port = server.server_address[:2]
    print(f"minipar demo: serving on http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nminipar demo: stopped")
    finally:
        server.server_close()
    return 0
