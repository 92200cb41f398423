"""A device's simulated clock: one time per stream, advanced by work, never by wall time.

    compute:  t_compute += FLOPs / peak(dtype)
    comm:     a collective of group g issued at t_compute starts at max(t_issue, t_comm[g])
              on this rank, and on the group at the max of its members' starts; it ends
              at start + cost, and t_comm[g] = end.
    wait():   t_compute = max(t_compute, end of the awaited work)
Separate streams are what make overlap visible: asynchronous communication proceeds on a
comm stream while compute goes on. As in PyTorch's NCCL process groups, each process
group has its own comm stream: collectives of one group run in issue order, collectives
of different groups (say a data-parallel all-reduce and a tensor-parallel one) may run
at the same time.
"""

from __future__ import annotations


class Clock:
    """Per-rank stream times in simulated seconds."""

    def __init__(self) -> None:
        self.compute = 0.0  # when the compute stream is next free: "now" for the program
        self.comm_free: dict = {}  # group key -> when that group's comm stream is next free
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

    @property
    def comm(self) -> float:
        """When the last collective of any group ends."""
        return max(self.comm_free.values(), default=0.0)

    def comm_stream(self, group_key) -> float:
        """When the comm stream of one group is next free."""
        return self.comm_free.get(group_key, 0.0)

    def wait_until(self, t: float) -> None:
        """Block the compute stream until simulated time t (a `wait()` on a work handle)."""
        self.compute = max(self.compute, t)

    def elapsed(self) -> float:
        """The latest time on any stream: how long this rank's program took."""
        return max(self.compute, self.comm, self.p2p)
