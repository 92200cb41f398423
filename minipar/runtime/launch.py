"""`launch(fn, world_size)`: run `fn(ctx)` once per rank, as `torchrun` or `mpiexec` would.

On the simulated backend every rank is a thread of this process with its own `Context`.
If any rank raises, the run stops: the other ranks are woken out of whatever they wait in,
and `launch` raises. A diagnosis the runtime made (collective mismatch, deadlock,
simulated out-of-memory, bad arguments) is raised as itself, with a note naming the rank;
any other exception is wrapped in `RankFailedError`, which names the rank and carries its
traceback. When several ranks fail of their own accord, the report is the lowest rank's,
whichever thread failed first (wall-clock timeouts excepted: the first to expire aborts the
others). No thread is left behind, except one that never comes back
to minipar after the run failed (runtime/watchdog.py). While the ranks run, BLAS may use
at most max(1, cores // world_size) threads each, so simulated devices share the cores
instead of fighting over them (runtime/blas.py); CPython's full garbage collections are
rarer and its switch interval longer (runtime/heap.py), and on Linux the kernel's futex
hash has a bucket for every few ranks (runtime/futex_hash.py).

Sends are rendezvous by default (a blocking send returns once its receiver has posted the
recv, as on NCCL); `sends="eager"` buffers them. With `timeout=T` a watchdog ends a run
in which ranks wait and nothing happens for T seconds. See docs/runtime.md.

With `backend="mpi"` this process is one rank of an `mpiexec -n N` job: `fn` runs once,
here, and `launch` returns this rank's result in a one-element list.
"""

from __future__ import annotations

import numbers
import threading
import traceback
import warnings
from typing import Any, Callable, Optional

from .backends.sim import SENDS, SimWorld
from .blas import limit_blas_threads, threads_per_rank
from .cost import ALGORITHMS
from .context import Context, resolve_compute_model, set_current
from .errors import DeadlockError, MiniparError, RankFailedError, WorldAborted
from .futex_hash import enough_futex_slots
from .heap import fewer_full_collections, longer_switch_interval
from .result import LaunchResult
from .topology import Topology
from .watchdog import abandoned_note, watch
from .work import check_timeout


class UnreceivedMessageWarning(UserWarning):
    """An eager send that no rank ever posted a recv for (under rendezvous sends the
    sender cannot end its program, and the run fails with a DeadlockError instead)."""


def launch(fn: Callable[[Context], Any], world_size: int, topology: Optional[Topology] = None,
           backend: str = "sim", algorithm: str = "auto", sends: str = "rendezvous",
           timeout: Optional[float] = None, compute_model=None) -> LaunchResult:
    """Run `fn(ctx)` on `world_size` ranks and return their results in rank order.

    topology:  where the ranks sit (default: one node of `world_size` H100s on NVLink)
    backend:   "sim" (threads, this process) or "mpi" (this process is one MPI rank)
    algorithm: the collective algorithm the cost model charges ("auto", "ring", "tree",
               "halving_doubling", "hierarchical"), applied to each collective that has it
               and whose group fits it, "auto" elsewhere; see runtime/cost.py
    sends:     "rendezvous" (default): a blocking send returns once the receiver has posted
               the matching recv, as on NCCL and with MPI_Ssend, so a ring that sends
               before it receives deadlocks, and is diagnosed, as on a cluster; "eager":
               sends are buffered and return at once. Results and simulated times of a
               program that finishes are the same in both.
    timeout:   seconds (sim backend): if ranks wait and nothing happens for that long, the
               run ends with a CollectiveTimeoutError naming the ranks that never arrived
               and where the others wait (NCCL's watchdog). None (default): no watchdog;
               deadlocks inside minipar are diagnosed at once either way.
    compute_model: what every rank's clock charges for work (runtime/compute_model.py): a
               ComputeModel, "calibrated" (the planner's GEMM efficiency, elementwise work
               over the device's HBM bandwidth) or "peak"; None (default): "peak", every
               matmul at the device's peak and elementwise work free
    """
    if not callable(fn):
        raise TypeError(f"launch(fn, world_size) needs a function of the rank's context, "
                        f"fn(ctx), got {type(fn).__name__} {fn!r}")
    if (not isinstance(world_size, numbers.Integral) or isinstance(world_size, bool)
            or world_size < 1):
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    world_size = int(world_size)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    if sends not in SENDS:
        raise ValueError(f"unknown sends={sends!r}: expected 'rendezvous' (a blocking send "
                         "waits for its receiver, as on NCCL) or 'eager' (buffered)")
    if timeout is not None:
        timeout = check_timeout(timeout, "launch(..., timeout=...)")
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"topology must be a minipar Topology (e.g. Topology.nodes(2, 4)), "
                        f"got {type(topology).__name__} {topology!r}")
    topology = topology or Topology.single_node(world_size)
    if topology.world_size != world_size:
        raise ValueError(
            f"the topology has {topology.num_nodes} node(s) x {topology.gpus_per_node} = "
            f"{topology.world_size} devices but world_size={world_size}; make them agree")
    compute_model = resolve_compute_model(compute_model, topology.device)
    if backend == "mpi":
        if timeout is not None:
            raise ValueError("launch(..., timeout=) is the simulated backend's watchdog; under "
                             "backend='mpi' use your MPI's own (MPICH: MPIEXEC_TIMEOUT=seconds "
                             "mpiexec ...), or drop timeout=")
        from .backends.mpi import launch_mpi  # needs mpi4py, an optional dependency

        return launch_mpi(fn, world_size, topology, algorithm, sends, compute_model)
    if backend != "sim":
        raise ValueError(f"unknown backend {backend!r}: expected 'sim' or 'mpi'")

    world = SimWorld(world_size, sends)
    contexts = [Context(r, world_size, topology, world, algorithm, compute_model)
                for r in range(world_size)]
    results: list[Any] = [None] * world_size
    failures: dict[int, tuple[BaseException, str]] = {}

    def run(rank: int) -> None:
        set_current(contexts[rank])
        try:
            results[rank] = fn(contexts[rank])
            contexts[rank].resolve_pending()  # a collective never waited on still ends
            world.settle_sends(rank)  # rendezvous: a send never matched cannot end
        except BaseException as exc:  # noqa: BLE001 - reported by launch
            failures[rank] = (exc, traceback.format_exc())
            world.fail(exc)
        finally:
            world.finish(rank)
            set_current(None)

    threads = [threading.Thread(target=run, args=(r,), name=f"minipar-rank-{r}", daemon=True)
               for r in range(world_size)]
    fired, left = False, []
    with limit_blas_threads(threads_per_rank(world_size)), longer_switch_interval(), \
            fewer_full_collections(world_size), enough_futex_slots(world_size):
        # see runtime/blas.py, runtime/heap.py, runtime/futex_hash.py
        for t in threads:
            t.start()
        if timeout is None:
            for t in threads:
                t.join()
        else:
            fired, left = watch(world, threads, timeout)  # see runtime/watchdog.py
    if world.error is not None:
        error = world.error if fired else _first_failure(world.error, dict(failures))
        if left:
            error.add_note(abandoned_note(left))
        raise error
    unreceived = world.unreceived()
    if unreceived:
        warnings.warn(UnreceivedMessageWarning(
            f"{len(unreceived)} message(s) sent (sends='eager') and never received:\n  "
            + "\n  ".join(unreceived[:10]) + "\nEvery send needs a matching recv; on NCCL "
            "the sender would wait for it forever (run with sends='rendezvous' to see it as "
            "a deadlock)."), stacklevel=2)
    return LaunchResult(results, contexts)


def _first_failure(error: BaseException, failures: dict) -> BaseException:
    """The error launch raises: the lowest rank's own failure (not a WorldAborted echo of
    another's), so the report does not depend on which thread failed first (except among
    wall-clock timeouts, where the first to expire aborts the others); the world's
    error if no rank raised one of its own (a deadlock seen as the last rank returned)."""
    own = sorted((r, e, tb) for r, (e, tb) in failures.items()
                 if not isinstance(e, WorldAborted))
    if not own:
        return error
    rank, exc, tb = own[0]
    if isinstance(exc, MiniparError):
        if not isinstance(exc, DeadlockError) and not getattr(exc, "_rank_noted", False):
            exc.add_note(f"(raised on rank {rank})")
            exc._rank_noted = True
        return exc
    wrapped = RankFailedError(rank, exc, tb)
    wrapped.__cause__ = exc
    return wrapped
