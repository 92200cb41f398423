"""What `launch` returns: the ranks' return values in rank order, and their contexts.

Its own module so that the launcher (`launch.py`) and the backends that run ranks
(`backends/mpi.py`) both build one without importing each other.
"""

from __future__ import annotations

from typing import Any, Iterable

from .context import Context


class LaunchResult(list):
    """The per-rank return values, in rank order; `.contexts` keeps each rank's context
    (ledger, clock, trace) for inspection after the run."""

    contexts: list[Context]

    def __init__(self, results: Iterable[Any] = (), contexts: Iterable[Context] = ()):
        super().__init__(results)
        self.contexts = list(contexts)

    def elapsed(self) -> float:
        """Simulated time of the whole run: the latest stream time over all ranks."""
        return max(c.clock.elapsed() for c in self.contexts)

    def events(self) -> list:
        """Every rank's trace events, rank by rank."""
        return [e for c in self.contexts for e in c.trace.events]
