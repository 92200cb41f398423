"""What the parts of the tour share: where they print, and how numbers are shown."""

from __future__ import annotations

from typing import Callable

import numpy as np

Print = Callable[[str], None]


def fmt_t(seconds: float) -> str:
    """Seconds as microseconds or milliseconds, right-aligned in 12 columns."""
    return f"{seconds * 1e6:9.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def fmt_array(a) -> str:
    """An array on one line, comma-separated."""
    return np.array2string(np.asarray(a), separator=",", max_line_width=200)
