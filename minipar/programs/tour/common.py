"""What the parts of the tour share: where they print, and how numbers are shown."""

from __future__ import annotations

from typing import Callable

import numpy as np

Print = Callable[[str], None]
Record = Callable[[str, object], object]  # record(label, launch result) -> the result


def fmt_t(seconds: float) -> str:
    """Seconds as microseconds or milliseconds, right-aligned in 12 columns."""
    return f"{seconds * 1e6:9.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def fmt_array(a) -> str:
    """An array on one line, comma-separated."""
    return np.array2string(np.asarray(a), separator=",", max_line_width=200)


# What `--ascii` prints instead of the tour's few non-ASCII characters: units, the ZeRO
# paper's Psi, Megatron's conjugate operators (f-bar, g-bar) and the diagrams' arrows.
ASCII_FOR = {"µ": "u", "Ψ": "Psi", "─": "-", "►": ">", "·": "*", "│": "|", "█": "#",
             "▒": "=", "▓": "@", "\u0304": "-bar", "ḡ": "g-bar", "—": "-", "…": "..."}


def to_ascii(text: str) -> str:
    """`text` with every character of ASCII_FOR replaced; any other non-ASCII one is '?'."""
    out = "".join(ASCII_FOR.get(c, c) for c in text)
    return out.encode("ascii", "replace").decode("ascii")


def ascii_print(out: Print) -> Print:
    """`out`, printing ASCII only."""
    return lambda text: out(to_ascii(text))


class Recorder:
    """The launches of the tour, in order, for its Chrome trace: `record(label, result)`
    keeps the events of a LaunchResult (or of a `minipar.device()` Context) and returns it."""

    def __init__(self) -> None:
        self.runs: list = []  # (label, events) in the order they ran

    def __call__(self, label: str, result):
        events = result.events() if hasattr(result, "events") else result.trace.events
        self.runs.append((label, list(events)))
        return result


def no_recorder(label: str, result):
    """What a part records through when nobody keeps its trace."""
    return result
