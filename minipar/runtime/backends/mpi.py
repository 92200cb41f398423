"""The MPI backend: each rank is a process of `mpiexec -n N python prog.py` (mpi4py).

The front end (`collectives.py`) is the sim backend's; this backend only moves data (the
wire format and one generator per collective are in mpi_steps.py), with
MPI's nonblocking buffer calls on one communicator per process group (`Create_group` at
the group's first collective, cached by `group.key`; group rank i is communicator rank i):

    all_reduce  Iallreduce        reduce_scatter  Ireduce_scatter_block (axis moved first)
    reduce      Ireduce           all_gather      Iallgather, then concatenated on `axis`
    gather      Igather           broadcast       Ibcast of a header, then of the data
    barrier     Ibarrier          scatter         Ibcast of a header, then Iscatter
    all_to_all  Ialltoall of one header per piece, then Ialltoallv of the bytes

Each also Iallreduces (MAX) the members' `local_start` into `Outcome.start` and
Iallgathers their `size_info`, so clocks, ledgers and traces are the sim backend's. Data
moves as bytes; a header (dtype code, ndim, shape, a time) tells receivers what comes.

Reductions: MPI reduces integers, and float32/64 over two ranks or above 64 KiB a rank
(mpi_steps.ORDERED_BYTES), itself (avg = sum / n, as in reference.py), in an order of
its choosing: the sim backend's bits wherever order cannot matter (integers, max, min,
a + b = b + a over two ranks), and maybe not in the last bits of a large float sum over
more ranks. Smaller float sums and products over more than two ranks, and every
reduction of bfloat16 or float16 (which MPI cannot add), are all-gathered and reduced by
reference.py in group order, giving the sim backend's bits (mpi_steps.in_group_order).

Point to point: `send` Isends a header and a private copy of the data and keeps both until
complete (all complete at the end of `launch_mpi`); `recv` posts its header receive at
once, so receives match messages in posting order, and its data receive when the header
is in. Under sends="rendezvous" (the default) the header goes by Issend, MPI's synchronous
send, which completes only once the receiver has posted the matching receive: a blocking
`send` waits for that, as on NCCL and on the sim backend (the data itself still moves
when the receiver takes it). Under sends="eager" a send returns at once. A ring that sends
before it receives therefore hangs here under rendezvous, as on a cluster, with no
diagnosis: run it on the sim backend to see it named.

Collectives of different groups may be in flight at once (the front end orders each group's own); a two-stage one (broadcast, scatter,
all_to_all) posts its second stage when its first is done, and a rank blocked on anything
keeps the others moving, so that what runs on the sim backend does not deadlock here.

Not available under MPI: mismatch and deadlock diagnosis. MPI matches collectives by
order and trusts them; ranks that call different things may hang, fail inside MPI or get
wrong data: run the program with backend="sim" to see which rank called what. Making a
group's communicator blocks until all its members reach their first collective on it, so
ranks that start two shared groups in opposite orders (with async_op) wait forever. A rank
that raises aborts the job (MPI_Abort) after printing its traceback, as the others would
wait for it forever.
"""

from __future__ import annotations

import sys
import traceback
import zlib
from collections import deque
from typing import Any, Callable, Optional

import numpy as np

try:
    from mpi4py import MPI
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('backend="mpi" needs mpi4py and an MPI library: pip install -e ".[mpi]" '
                      "(mpi4py and the mpich wheel), then run under mpiexec -n N") from exc

from ..context import Context, set_current
from ..errors import CollectiveUsageError, MiniparError
from ..group import ProcessGroup
from ..result import LaunchResult
from ..topology import Topology
from .base import Call, Outcome
from .mpi_steps import (CACHE, CODES, HEADER, KINDS, MAX_NDIM, Steps, as_bytes, by_reference,
                        caller, check_movable, header, in_group_order, private_copy,
                        unheader)


# ---- handles --------------------------------------------------------------------------
class MpiHandle:
    """One collective in flight: the requests of its current stage, then its Outcome."""

    def __init__(self, backend: "MpiBackend", call: Call, steps: Steps, first: list,
                 keep: tuple):
        self._b, self._call, self._steps, self._keep = backend, call, steps, keep
        self._outcome: Optional[Outcome] = None  # keep: our buffers, which mpi4py does not
        self._reqs = first + self._guard(next, steps)
        backend.inflight.append(self)

    def _guard(self, fn: Callable, *args):
        try:
            return fn(*args)
        except MPI.Exception as exc:
            raise MiniparError(
                f"{caller(self._call)}: MPI failed: {exc}. The mpi backend cannot diagnose ranks "
                "that call different collectives; run the program with backend='sim' to see "
                "which rank called what") from exc

    def _next(self) -> None:
        try:
            self._reqs = self._guard(self._steps.send, None)
        except StopIteration as stop:
            _, latest, _, infos = self._keep
            self._outcome = Outcome(stop.value, float(latest[0]),
                                    None if infos is None else [r.tolist() for r in infos])
            self._b.inflight.remove(self)

    def is_completed(self) -> bool:
        """Post the next stage if the current one is done; never blocks."""
        while self._outcome is None and self._guard(MPI.Request.Testall, self._reqs):
            self._next()
        return self._outcome is not None

    def wait(self) -> Outcome:
        while self._outcome is None:
            if len(self._b.inflight) == 1:  # only this one: nothing else to keep moving
                self._guard(MPI.Request.Waitall, self._reqs)
            else:
                self._guard(self._b.block, self._reqs, self)
            self._next()
        return self._outcome


class _Receive:
    """A posted receive: the header now, the data once the header says how much."""

    def __init__(self, backend: "MpiBackend", src: int, tag: int, queue: deque):
        self._b, self._src, self._tag, self._queue = backend, src, tag, queue
        self._head = np.empty(HEADER, np.int64)
        self._req = backend.heads.Irecv(self._head, src, tag)
        self._data: Optional[np.ndarray] = None
        self._outcome: Optional[Outcome] = None
        queue.append(self)  # receives from one (src, tag) post their data in this order

    def is_completed(self) -> bool:
        """Move on without blocking; True once the message is in."""
        if self._data is None and self._queue[0] is self and self._req.Test():
            shape, dtype, self._arrival = unheader(self._head)
            self._data = CACHE.empty(shape, dtype)
            self._req = self._b.data.Irecv(as_bytes(self._data), self._src, self._tag)
            self._queue.popleft()
        if self._outcome is None and self._data is not None and self._req.Test():
            self._outcome = Outcome(self._data, self._arrival)
        return self._outcome is not None

    def wait(self) -> Outcome:
        while self._data is None and self._queue[0] is not self:
            self._queue[0].wait()  # an earlier receive from the same (src, tag) goes first
        while not self.is_completed():
            self._b.block([self._req], None)
        return self._outcome


class _Sent:
    """A send in flight: complete once the receiver has posted its recv (the header's
    Issend, rendezvous) or at once (eager)."""

    def __init__(self, backend: "MpiBackend", head_req, arrival: float):
        self._b, self._req, self._arrival = backend, head_req, arrival

    def is_completed(self) -> bool:
        return self._req is None or self._req.Test()

    def wait(self) -> Outcome:
        if self._req is not None:
            self._b.block([self._req], None)
        return Outcome(None, self._arrival)


# ---- the backend -----------------------------------------------------------------------
class MpiBackend:
    """This process's side of every collective and message, through mpi4py."""

    name = "mpi"

    def __init__(self, world=MPI.COMM_WORLD, sends: str = "rendezvous"):
        self.world = world
        self.sends = sends
        self.heads, self.data = world.Dup(), world.Dup()  # p2p: headers, then the data
        self.inflight: list[MpiHandle] = []  # collectives not yet finished
        self._comms: dict[tuple, Any] = {}
        self._sends: list[tuple] = []  # (requests, buffers) of sends not known complete
        self._queues: dict[tuple, deque] = {}
        self._tag_ub = int(world.Get_attr(MPI.TAG_UB))

    def block(self, reqs: list, waiter: Optional[MpiHandle]) -> None:
        """Wait for `reqs`; while other collectives are in flight, keep them moving (post
        their next stage as soon as they can), since other ranks may be waiting on them."""
        while any(h is not waiter for h in self.inflight):
            if MPI.Request.Testall(reqs):
                return
            for h in [h for h in self.inflight if h is not waiter]:
                h.is_completed()
        MPI.Request.Waitall(reqs)

    def comm(self, group: ProcessGroup):
        """The communicator of `group`; made at its first use, collectively over it."""
        if group.key not in self._comms:
            tag = zlib.crc32(repr(group.key).encode()) % 32768  # the same on every member
            everyone = self.world.Get_group()
            members = everyone.Incl(list(group.ranks))
            comm = self.world.Create_group(members, tag)
            self._comms[group.key] = (comm, comm.Get_rank())  # group rank i = comm rank i
            members.Free(), everyone.Free()
        return self._comms[group.key][0]

    def collective(self, call: Call) -> MpiHandle:
        if call.ref_kind not in KINDS:
            raise CollectiveUsageError(f"{caller(call)}: the mpi backend has no {call.kind!r}")
        x = call.payload
        if isinstance(x, np.ndarray):
            if x.dtype not in CODES or x.ndim > MAX_NDIM:
                check_movable(x, call)
        else:
            for a in x or ():
                check_movable(np.asarray(a), call)
        if call.group.key not in self._comms:
            self.comm(call.group)
        comm, me = self._comms[call.group.key]
        start, latest = np.array([call.local_start]), np.empty(1)  # float64 both
        first, mine, infos = [comm.Iallreduce(start, latest, MPI.MAX)], None, None
        if call.size_info is not None:
            mine = np.asarray(call.size_info, np.int64)
            infos = np.empty((comm.size, mine.size), np.int64)
            first.append(comm.Iallgather(mine, infos))
        kind = KINDS[call.ref_kind]
        if call.kind in ("all_reduce", "reduce", "reduce_scatter") and \
                in_group_order(call.payload, call.params["op"], comm.size):
            kind = by_reference
        return MpiHandle(self, call, kind(comm, me, call), first, (start, latest, mine, infos))

    def _check_tag(self, tag: int, what: str) -> None:
        if not 0 <= tag <= self._tag_ub:
            raise CollectiveUsageError(f"{what} tag={tag}: an MPI tag is in [0, {self._tag_ub}]")

    def send(self, rank: int, array, dst: int, tag: int, arrival: float, where: str) -> _Sent:
        who = f"rank {rank}: send to rank {dst} at {where}"
        self._check_tag(tag, who)
        data = private_copy(np.asarray(array))  # the message: a private copy
        head = header(data, who, arrival)
        isend = self.heads.Issend if self.sends == "rendezvous" else self.heads.Isend
        reqs = [isend(head, dst, tag), self.data.Isend(as_bytes(data), dst, tag)]
        self._sends = [s for s in self._sends if not MPI.Request.Testall(s[0])]
        self._sends.append((reqs, head, data))
        return _Sent(self, reqs[0] if self.sends == "rendezvous" else None, arrival)

    def recv(self, rank: int, src: int, tag: int, where: str) -> _Receive:
        self._check_tag(tag, f"rank {rank}: recv from rank {src} at {where}")
        return _Receive(self, src, tag, self._queues.setdefault((src, tag), deque()))

    def close(self) -> None:
        """Take in every posted receive, complete every send, free the communicators."""
        for queue in self._queues.values():
            while queue:
                queue[0].wait()
        for reqs, *_ in self._sends:
            MPI.Request.Waitall(reqs)
        self._sends.clear()
        for c in [self.heads, self.data, *(c for c, _ in self._comms.values())]:
            c.Free()
        self._comms.clear()


def launch_mpi(fn: Callable[[Context], Any], world_size: int, topology: Topology,
               algorithm: str = "auto", sends: str = "rendezvous",
               compute_model=None) -> LaunchResult:
    """Run `fn(ctx)` once, as this process's rank of the MPI job; returns [its result].
    compute_model: what its clock charges (a ComputeModel; None: peak)."""
    world = MPI.COMM_WORLD
    if world.Get_size() != world_size:
        raise ValueError(
            f"launch(..., world_size={world_size}, backend='mpi') is running in an MPI job "
            f"of {world.Get_size()} process(es); start it with: "
            f"mpiexec -n {world_size} python <your program>")
    backend = MpiBackend(world, sends)
    ctx = Context(world.Get_rank(), world_size, topology, backend, algorithm, compute_model)
    set_current(ctx)
    try:
        result = fn(ctx)
        ctx.resolve_pending()  # a collective never waited on still ends
        backend.close()
    except BaseException:
        if world_size == 1:
            raise
        sys.stderr.write(f"minipar: rank {ctx.rank} of {world_size} failed; aborting the MPI "
                         f"job, or the other ranks would wait for it forever.\n"
                         f"--- traceback of rank {ctx.rank} ---\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)
    finally:
        set_current(None)
    return LaunchResult([result], [ctx])
