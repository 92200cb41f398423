"""The errors the runtime raises: each says what was expected, what was received, and where.

Diagnoses (mismatch, deadlock, out-of-memory) are raised instead of hanging or crashing, so
a learner sees which rank did what, from which line, and what to change.
"""

from __future__ import annotations


class MiniparError(Exception):
    """Base class of every error minipar raises on purpose."""


class CollectiveUsageError(MiniparError, ValueError):
    """A collective was called with arguments that cannot work (shapes, roots, sizes)."""


class CollectiveMismatchError(MiniparError):
    """Ranks of one group called different collectives (or different shapes/dtypes/ops/roots)
    at the same call index of that group."""


class RankThreadError(MiniparError, RuntimeError):
    """A communication call came from a thread that is not a rank of the running launch."""


class DeadlockError(MiniparError):
    """Every live rank is blocked and nothing any of them waits for can ever happen."""


class CollectiveTimeoutError(MiniparError, TimeoutError):
    """A wait ran out of time: `launch(..., timeout=)` saw no progress for that long while
    ranks waited (NCCL's watchdog), or `Work.wait(timeout=)` expired."""


class SimulatedOutOfMemoryError(MiniparError, MemoryError):
    """A device's memory ledger went over the device's capacity."""


class RankFailedError(MiniparError):
    """A rank raised an exception inside `launch`; carries that rank's traceback."""

    def __init__(self, rank: int, exc: BaseException, tb_text: str):
        self.rank = rank
        self.original = exc
        self.traceback_text = tb_text
        super().__init__(
            f"rank {rank} raised {type(exc).__name__}: {exc}\n"
            f"--- traceback of rank {rank} ---\n{tb_text.rstrip()}"
        )


class WorldAborted(MiniparError):
    """Raised inside the other ranks' threads once one rank has failed, so none stays blocked."""
