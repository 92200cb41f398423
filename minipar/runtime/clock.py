"""A device's simulated clock: one time per stream, advanced by work, never by wall time.

    compute:  t_compute += FLOPs / peak(dtype)
    comm:     a collective issued at t_compute starts at max(t_issue, t_comm) on this rank,
              and on the group at the max of its members' starts; it ends at start + cost.
    wait():   t_compute = max(t_compute, end of the awaited work)
Two streams are what make overlap visible: asynchronous communication proceeds on the
comm stream while compute goes on, exactly as with NCCL on its own CUDA stream.
"""

from __future__ import annotations


class Clock:
    """Per-rank stream times in simulated seconds."""

    def __init__(self) -> None:
        self.compute = 0.0  # when the compute stream is next free: "now" for the program
        self.comm = 0.0  # when the collective stream is next free
        self.p2p = 0.0  # when the point-to-point stream is next free

    @property
    def now(self) -> float:
        """The program's current simulated time (its compute stream)."""
        return self.compute

    def advance_compute(self, seconds: float) -> tuple[float, float]:
        """Run `seconds` of compute; returns (start, end)."""
        if seconds < 0:
            raise ValueError(f"compute time cannot be negative, got {seconds}")
        start = self.compute
        self.compute = start + seconds
        return start, self.compute

    def wait_until(self, t: float) -> None:
        """Block the compute stream until simulated time t (a `wait()` on a work handle)."""
        self.compute = max(self.compute, t)

    def elapsed(self) -> float:
        """The latest time on any stream: how long this rank's program took."""
        return max(self.compute, self.comm, self.p2p)
