"""The per-device context: who am I, and where my memory, time and events are recorded.

Every simulated device runs in its own thread with one `Context`; `current()` returns the
calling thread's. Outside `launch`, a thread gets a default single device (rank 0 of a
world of one, an H100), so single-device code runs and is charged the same way.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

from .backends.sim import SimWorld
from .clock import Clock
from .device import DeviceSpec
from .group import ProcessGroup
from .ledger import MemoryLedger
from .topology import Topology
from .trace import Event, Trace


class Context:
    """One device's view of the run: rank, world, device spec, ledger, clock and trace."""

    def __init__(self, rank: int, world_size: int, topology: Topology, backend,
                 algorithm: str = "auto"):
        self.rank = rank
        self.world_size = world_size
        self.topology = topology
        self.device: DeviceSpec = topology.device
        self.ledger = MemoryLedger(self.device.memory_bytes, self.device.name, rank)
        self.clock = Clock()
        self.trace = Trace(rank)
        self.backend = backend
        self.algorithm = algorithm  # default collective algorithm for the cost model
        self.world = ProcessGroup(tuple(range(world_size)), "world")
        self.pending: dict = {}  # group key -> last collective issued, timing not yet known
        self.cost_cache: dict = {}  # memoised cost-model answers (see collectives._cost)

    @property
    def node(self) -> int:
        return self.topology.node_of(self.rank)

    def resolve_pending(self) -> None:
        """Learn when every collective issued so far ends (at the end of a program, a
        collective never waited on still takes its time on the clock)."""
        for work in list(self.pending.values()):
            work._resolve()

    def compute(self, flops: float, dtype="float32", name: str = "compute",
                label: str = "") -> Event:
        """Charge `flops` of work: the compute stream advances by flops / peak(dtype)."""
        start, end = self.clock.advance_compute(flops / self.device.peak(dtype))
        return self.trace.record(Event(self.rank, "compute", name, start, end,
                                       flops=flops, label=label))

    def __repr__(self) -> str:
        return (f"Context(rank={self.rank}, world_size={self.world_size}, "
                f"device={self.device.name}, node={self.node})")


_local = threading.local()


def current() -> Context:
    """The calling thread's context; a default single device outside `launch`."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = single_device()
        _local.ctx = ctx
    return ctx


def set_current(ctx: Optional[Context]) -> None:
    _local.ctx = ctx


def single_device(device: Optional[DeviceSpec] = None) -> Context:
    """A fresh context for one device that is the whole world."""
    topo = Topology.nodes(1, 1, device or DeviceSpec.h100_sxm())
    return Context(0, 1, topo, SimWorld(1))


@contextlib.contextmanager
def device(spec: Optional[DeviceSpec] = None) -> Iterator[Context]:
    """Run a block on a fresh single device: `with minipar.device() as ctx: ...`."""
    previous = getattr(_local, "ctx", None)
    ctx = single_device(spec)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous
