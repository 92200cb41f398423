"""The per-device context: who am I, and where my memory, time and events are recorded.

Every simulated device runs in its own thread with one `Context`; `current()` returns the
calling thread's. Outside `launch`, a thread gets a default single device (rank 0 of a
world of one, an H100), so single-device code runs and is charged the same way.

What work costs on the clock is the context's `compute_model` (compute_model.py):

    compute(flops, dtype, dims=(M, N, K))   t = flops / (eff(M, N, K) · peak(dtype))
    memory_bound(nbytes, name)              t = nbytes / W  (nothing at all when the model
                                            has no bandwidth W: the default, peak model)

A thread that a rank starts does not inherit the rank's context (thread-local state never
crosses threads). Communication from such a thread is refused (`rank_context`): the
rendezvous matches calls by rank and call order, and a default world of one would hand the
worker its own input back as if it were the group's answer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

from .backends.sim import SimWorld
from .clock import Clock
from .compute_model import PEAK, ComputeModel
from .device import DeviceSpec
from .errors import RankThreadError
from .group import ProcessGroup
from .ledger import MemoryLedger
from .topology import Topology
from .trace import Event, Trace


class Context:
    """One device's view of the run: rank, world, device spec, ledger, clock and trace."""

    def __init__(self, rank: int, world_size: int, topology: Topology, backend,
                 algorithm: str = "auto", compute_model=None):
        self.rank = rank
        self.world_size = world_size
        self.topology = topology
        self.device: DeviceSpec = topology.device
        self.ledger = MemoryLedger(self.device.memory_bytes, self.device.name, rank)
        self.clock = Clock()
        self.trace = Trace(rank)
        self.backend = backend
        self.algorithm = algorithm  # default collective algorithm for the cost model
        self.world = ProcessGroup(tuple(range(world_size)), "world", world_size)
        self.pending: dict = {}  # group key -> last collective issued, timing not yet known
        self.cost_cache: dict = {}  # memoised cost-model answers (see collectives._cost)
        self.faults = None  # this rank's planned faults (runtime/faults.py's inject), if any
        # what a matmul and elementwise work cost (compute_model.py); default: peak, free
        self.compute_model: ComputeModel = resolve_compute_model(compute_model, self.device)

    @property
    def node(self) -> int:
        return self.topology.node_of(self.rank)

    def resolve_pending(self) -> None:
        """Learn when every collective issued so far ends (at the end of a program, a
        collective never waited on still takes its time on the clock)."""
        for work in list(self.pending.values()):
            work._resolve()

    def compute(self, flops: float, dtype="float32", name: str = "compute",
                label: str = "", dims: Optional[tuple] = None) -> Event:
        """Charge `flops` of work: the compute stream advances by flops / (eff · peak(dtype)),
        eff the compute model's efficiency of a GEMM of dims (M, N, K) (1 under the peak
        model; e_max when dims is None)."""
        seconds = self.compute_model.matmul_seconds(flops, dims, self.device.peak(dtype))
        start, end = self.clock.advance_compute(seconds)
        return self.trace.record(Event(self.rank, "compute", name, start, end,
                                       flops=flops, label=label))

    def memory_bound(self, nbytes: float, name: str = "elementwise",
                     label: str = "") -> Optional[Event]:
        """Charge elementwise work that moves `nbytes` through HBM: the compute stream
        advances by nbytes / W, a "compute" event with meta {"bytes": nbytes}. Under a
        model without a bandwidth (the peak model) nothing is charged or recorded: None."""
        if self.compute_model.memory_bandwidth is None:
            return None
        start, end = self.clock.advance_compute(self.compute_model.elementwise_seconds(nbytes))
        return self.trace.record(Event(self.rank, "compute", name, start, end, label=label,
                                       meta={"bytes": nbytes}))

    def __repr__(self) -> str:
        return (f"Context(rank={self.rank}, world_size={self.world_size}, "
                f"device={self.device.name}, node={self.node})")


_local = threading.local()
_ranks_lock = threading.Lock()
_rank_threads: dict[int, Context] = {}  # thread ident -> context, for threads running a rank


def current() -> Context:
    """The calling thread's context; a default single device outside `launch`."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = single_device()
        _local.ctx = ctx
    return ctx


def set_current(ctx: Optional[Context]) -> None:
    """Bind (or, with None, unbind) the calling thread to a rank's context; launchers call it."""
    _local.ctx = ctx
    with _ranks_lock:
        if ctx is None:
            _rank_threads.pop(threading.get_ident(), None)
        else:
            _rank_threads[threading.get_ident()] = ctx


def rank_context(kind: str) -> Context:
    """The context a communication call runs on; refuses a thread that is not a rank while
    a launch is running (a thread some rank started: it has no context of its own)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is not None:
        return ctx
    if threading.current_thread() is threading.main_thread():
        return current()
    with _ranks_lock:
        running = sorted(_rank_threads.values(), key=lambda c: c.rank)
    if not running:
        return current()
    here = threading.current_thread().name
    sizes = "/".join(str(n) for n in sorted({c.world_size for c in running}))
    error = RankThreadError(
        f"{kind} was called from thread {here!r}, which is not a rank: a launch of {sizes} "
        f"ranks is running in threads minipar-rank-N, so this is probably a thread a rank "
        f"started. It does not inherit its rank's context, and collectives are matched by "
        f"rank and call order: on a world of its own it would get its own input back as the "
        f"group's answer. Communicate from the rank's own thread: let the worker compute, "
        f"join it (or wait on its future), then call {kind} from the rank. (In "
        f"torch.distributed, two threads calling collectives on one group may order them "
        f"differently on different ranks, and NCCL hangs.)")
    worlds_running = {id(c.backend): c.backend for c in running}
    if len(worlds_running) == 1:  # the launch fails too, even if the thread's error is lost
        backend = next(iter(worlds_running.values()))
        if hasattr(backend, "fail"):
            backend.fail(error)
    raise error


def resolve_compute_model(model, device: DeviceSpec) -> ComputeModel:
    """The ComputeModel `model` names on `device`: a ComputeModel as it is, None or "peak"
    the peak model, "calibrated" ComputeModel.calibrated(device); a clear error otherwise."""
    if isinstance(model, str):
        if model not in ("peak", "calibrated"):
            raise ValueError(f"unknown compute_model {model!r}: expected 'peak' (every matmul "
                             f"at peak, elementwise free), 'calibrated' (the planner's GEMM "
                             f"efficiency and HBM bandwidth) or a ComputeModel")
        return PEAK if model == "peak" else ComputeModel.calibrated(device)
    if model is None:
        return PEAK
    if not isinstance(model, ComputeModel):
        raise TypeError(f"compute_model must be a minipar ComputeModel (ComputeModel.peak(), "
                        f"ComputeModel.calibrated(device)), 'peak', 'calibrated' or None "
                        f"(peak), got {type(model).__name__} {model!r}")
    return model


def single_device(device: Optional[DeviceSpec] = None, compute_model=None) -> Context:
    """A fresh context for one device that is the whole world."""
    topo = Topology.nodes(1, 1, device or DeviceSpec.h100_sxm())
    return Context(0, 1, topo, SimWorld(1), compute_model=compute_model)


@contextlib.contextmanager
def device(spec: Optional[DeviceSpec] = None, compute_model=None) -> Iterator[Context]:
    """Run a block on a fresh single device: `with minipar.device() as ctx: ...`;
    compute_model: what its clock charges, a ComputeModel or "peak" | "calibrated" (None:
    "peak", every matmul at peak and elementwise work free; see compute_model.py)."""
    previous = getattr(_local, "ctx", None)
    ctx = single_device(spec, compute_model)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous
