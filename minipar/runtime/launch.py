"""`launch(fn, world_size)`: run `fn(ctx)` once per rank, as `torchrun` or `mpiexec` would.

On the simulated backend every rank is a thread of this process with its own `Context`.
If any rank raises, the run stops: the other ranks are woken out of whatever they wait in,
and `launch` raises. A diagnosis the runtime made (collective mismatch, deadlock,
simulated out-of-memory, bad arguments) is raised as itself, with a note naming the rank;
any other exception is wrapped in `RankFailedError`, which names the rank and carries its
traceback. No thread is left behind. While the ranks run, BLAS may use at most
max(1, cores // world_size) threads each, so simulated devices share the cores instead of
fighting over them (runtime/blas.py).

With `backend="mpi"` this process is one rank of an `mpiexec -n N` job: `fn` runs once,
here, and `launch` returns this rank's result in a one-element list.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any, Callable, Optional

from .backends.sim import SimWorld
from .blas import limit_blas_threads, threads_per_rank
from .cost import ALGORITHMS
from .context import Context, set_current
from .errors import DeadlockError, MiniparError, RankFailedError, WorldAborted
from .result import LaunchResult
from .topology import Topology


def launch(fn: Callable[[Context], Any], world_size: int, topology: Optional[Topology] = None,
           backend: str = "sim", algorithm: str = "auto") -> LaunchResult:
    """Run `fn(ctx)` on `world_size` ranks and return their results in rank order.

    topology:  where the ranks sit (default: one node of `world_size` H100s on NVLink)
    backend:   "sim" (threads, this process) or "mpi" (this process is one MPI rank)
    algorithm: the collective algorithm the cost model charges ("auto", "ring", "tree",
               "halving_doubling", "hierarchical"), applied to each collective that has it
               and whose group fits it, "auto" elsewhere; see runtime/cost.py
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    topology = topology or Topology.single_node(world_size)
    if topology.world_size != world_size:
        raise ValueError(
            f"the topology has {topology.num_nodes} node(s) x {topology.gpus_per_node} = "
            f"{topology.world_size} devices but world_size={world_size}; make them agree")
    if backend == "mpi":
        from .backends.mpi import launch_mpi  # needs mpi4py, an optional dependency

        return launch_mpi(fn, world_size, topology, algorithm)
    if backend != "sim":
        raise ValueError(f"unknown backend {backend!r}: expected 'sim' or 'mpi'")

    world = SimWorld(world_size)
    contexts = [Context(r, world_size, topology, world, algorithm) for r in range(world_size)]
    results: list[Any] = [None] * world_size
    failures: dict[int, tuple[BaseException, str]] = {}

    def run(rank: int) -> None:
        set_current(contexts[rank])
        try:
            results[rank] = fn(contexts[rank])
            contexts[rank].resolve_pending()  # a collective never waited on still ends
        except BaseException as exc:  # noqa: BLE001 - reported by launch
            failures[rank] = (exc, traceback.format_exc())
            world.fail(exc)
        finally:
            world.finish(rank)
            set_current(None)

    threads = [threading.Thread(target=run, args=(r,), name=f"minipar-rank-{r}", daemon=True)
               for r in range(world_size)]
    with limit_blas_threads(threads_per_rank(world_size)):  # see runtime/blas.py
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if world.error is not None:
        raise _first_failure(world.error, failures)
    return LaunchResult(results, contexts)


def _first_failure(error: BaseException, failures: dict) -> BaseException:
    """The error launch raises: the first failure, not the WorldAborted echoes of it."""
    if isinstance(error, MiniparError) and not isinstance(error, WorldAborted):
        rank = next((r for r, (e, _) in sorted(failures.items()) if e is error), None)
        if (rank is not None and not isinstance(error, DeadlockError)
                and not getattr(error, "_rank_noted", False)):
            error.add_note(f"(raised on rank {rank})")
            error._rank_noted = True
        return error
    for rank, (exc, tb) in sorted(failures.items()):
        if exc is error:
            wrapped = RankFailedError(rank, exc, tb)
            wrapped.__cause__ = exc
            return wrapped
    return error
