"""The README's command synopses list every flag of every command, and no flag argparse
does not know: the two are compared both ways."""

import re
from pathlib import Path

from minipar.cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def _subcommands() -> dict:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(sub.choices)


def _argparse_flags() -> dict[str, set[str]]:
    """command -> its long options, without --help."""
    return {name: {o for a in p._actions for o in a.option_strings
                   if o.startswith("--") and o != "--help"}
            for name, p in _subcommands().items()}


def _readme_flags(text: str) -> dict[str, set[str]]:
    """command -> the long options its synopses in the README's code blocks name: a line
    `minipar CMD ...` and the indented lines that continue it."""
    flags: dict[str, set[str]] = {}
    blocks, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
    for block in blocks:
        current = None
        for line in block:
            m = re.match(r"minipar ([\w-]+)", line)
            if m:
                current = m.group(1)
            elif not line.startswith(" "):
                current = None
            if current is not None:
                # drop the comment after a synopsis, e.g. (see "Training on one device")
                body = re.sub(r"\s{2,}\(.*$", "", line)
                flags.setdefault(current, set()).update(re.findall(r"--[a-z][a-z-]*", body))
    return flags


def test_the_readme_names_every_flag_of_every_command_and_no_other():
    want, got = _argparse_flags(), _readme_flags(README.read_text(encoding="utf-8"))
    assert set(want) <= set(got), f"commands without a synopsis: {set(want) - set(got)}"
    for command, flags in want.items():
        assert flags - got[command] == set(), f"minipar {command}: not in the README"
        assert got[command] - flags == set(), f"minipar {command}: in the README, not argparse"


def test_the_comparison_sees_a_missing_flag():
    text = README.read_text(encoding="utf-8").replace(" [--prompt TEXT]", "")
    assert "--prompt" not in _readme_flags(text)["train"]
    assert "--prompt" in _readme_flags(README.read_text(encoding="utf-8"))["train"]
