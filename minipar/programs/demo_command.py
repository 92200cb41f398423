"""`minipar demo`: write the visual demo, one self-contained HTML page.

    minipar demo [--out demo.html] [--layout DPxTPxPP ...]

The page (minipar/viz/demo/) shows the architecture mode: nodes of 8 GPUs with the mesh of
a 3-D layout laid on them, each GPU's tp, pp and dp groups lit when it is pointed at or
focused, and the link each group crosses (NVLink inside a node, InfiniBand between). The
seed's layouts are embedded with the groups minipar's ParallelGroups builds for them
(programs/demo.py); each --layout adds one more. Any other layout picked on the page is
computed there by the same rule. Open the file in a browser: it needs no network.
"""

from __future__ import annotations

import argparse
import os

from .demo import MAX_GPUS, parse_layout, write_demo


def _layout(text: str) -> tuple[int, int, int]:
    """An argparse `type=` for --layout: DPxTPxPP, e.g. 2x4x3."""
    try:
        return parse_layout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub, output_path) -> None:
    """The `demo` subcommand's flags (output_path: the command's type for a file to write)."""
    de = sub.add_parser("demo", help="write the visual demo of 3-D parallelism: one HTML "
                                     "page that opens offline (architecture mode)",
                        description="Write one self-contained HTML page (docs/demo.md): the "
                                    "nodes and GPUs of a layout with its tp, pp and dp groups "
                                    "laid on them. Only the architecture mode is built; the "
                                    "data, state and performance modes are not yet.")
    de.add_argument("--out", metavar="PATH", type=output_path, default="demo.html",
                    help="the HTML file to write (demo.html)")
    de.add_argument("--layout", metavar="DPxTPxPP", type=_layout, action="append",
                    default=[],
                    help=f"embed this layout's groups from minipar too, e.g. 4x2x2 (at most "
                         f"{MAX_GPUS} GPUs); repeat for more. The seed's kitchen (2x4x3) and "
                         f"70B layout (8x4x2) are always in")
    de.set_defaults(func=run, parser=de)


def run(args: argparse.Namespace) -> int:
    data = write_demo(args.out, args.layout)
    names = ", ".join(f"{d['title']} ({d['gpus']} GPUs)" for d in data["layouts"])
    print(f"minipar demo: wrote {args.out} ({os.path.getsize(args.out):,} bytes): {names}")
    print(f"  open it in a browser: file://{os.path.abspath(args.out)}")
    print("  architecture mode only; the data, state and performance modes are not built yet")
    return 0
