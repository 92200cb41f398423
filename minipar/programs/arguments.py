"""The `minipar` command's argparse types: each flag's number checked when it is parsed.

A bad value is argparse's usage error (exit status 2) saying what was expected, what was
received and, for a maximum, why, before any work starts.
"""

from __future__ import annotations

import argparse
import math

from .tour import MAX_MEGABYTES


def number(cast, minimum, strict: bool, what: str, maximum=None, why: str = ""):
    """An argparse `type=` that parses with `cast` and accepts finite values > minimum
    (strict) or >= minimum, and <= maximum when given; the error says what was expected,
    what was received and, for the maximum, why."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        ok = math.isfinite(v) and (v > minimum if strict else v >= minimum)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        if maximum is not None and v > maximum:
            top = f"{maximum:,}" if isinstance(maximum, int) else f"{maximum:g}"
            raise argparse.ArgumentTypeError(f"must be at most {top}{why}, got {text}")
        return v
    return parse


positive_int = number(int, 0, True, "a positive integer")
count = number(int, 0, False, "an integer >= 0")
positive_float = number(float, 0.0, True, "a positive number")
nonnegative_float = number(float, 0.0, False, "a number >= 0")
steps = number(int, 0, True, "a positive integer", maximum=1_000_000,
                 why=" (about a day on this machine at the defaults)")
sample = number(int, 0, False, "an integer >= 0", maximum=100_000,
                  why=" characters (one forward per character)")
megabytes = number(float, 0.0, True, "a positive number of MiB", maximum=MAX_MEGABYTES,
                     why=" MiB (the tour holds about 80 copies of the buffer over its 8 ranks, "
                         "5 GB at 64 MiB)")
width = number(int, 0, True, "a positive number of columns", maximum=1000,
                 why=" columns")
devices = number(int, 0, True, "a positive integer", maximum=64,
              why=" simulated devices (one thread each)")
