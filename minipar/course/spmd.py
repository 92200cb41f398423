"""Running a learner's code as a cluster would: a mesh, an explicit group, rendezvous sends.

    on_ranks(program, n)                      program(ctx) on n simulated ranks
    on_mesh(program, (2, 3), ("dp", "tp"), "tp")   program(ctx, spmd) on a 2 × 3 mesh;
                                              spmd.group is this rank's tp group
    calls(ctx, fn, *args)                     fn(*copies) -> Call(result, collectives,
                                              sends, bytes_sent); names a written input
    forbid_collectives(call, ...)             an exercise built from send/recv may not
                                              call mp.all_reduce
    world_sizes(1, 5, first=2)                a strategy that shrinks toward 2, not 1

An exercise that takes a group is graded on a 2-D mesh with that group passed explicitly:
code that ignores it (works on the world) or uses the global rank where the group rank is
meant then fails, as it would inside Megatron's or torchtitan's meshes. Ranks are named
in one vocabulary everywhere: "tp rank 1 of 2 = global rank 3 of 4, the second tp group".
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
from hypothesis import strategies as st

from ..runtime.errors import MiniparError, RankFailedError, WorldAborted
from ..runtime.group import ProcessGroup
from ..runtime.launch import launch
from ..runtime.mesh import DeviceMesh
from .expect import GradeFailure

#: how checks launch a learner's code: rendezvous sends, as NCCL's (a ring that sends
#: before it receives is the deadlock it would be on a cluster, not a pass), and a watchdog
#: that names a rank which never comes back to minipar (an endless loop, a sleep)
LAUNCH = {"sends": "rendezvous", "timeout": 10.0}

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _ordinal(i: int) -> str:
    return _ORDINALS[i] if i < len(_ORDINALS) else f"{i + 1}th"


def rank_words(mesh: DeviceMesh, dim: str, global_rank: int) -> str:
    """"tp rank 1 of 2 = global rank 3 of 4, the second tp group" (one vocabulary)."""
    groups = mesh.groups(dim)
    which = next(i for i, g in enumerate(groups) if global_rank in g)
    g = groups[which]
    return (f"{dim} rank {g.group_rank(global_rank)} of {g.size} = global rank {global_rank} "
            f"of {mesh.size}, the {_ordinal(which)} {dim} group {list(g.ranks)}")


@dataclass(frozen=True)
class Spmd:
    """Where this rank sits, for a check: the mesh, the dimension under test, its group."""

    mesh: DeviceMesh
    dim: str
    global_rank: int
    group: ProcessGroup

    @property
    def rank(self) -> int:
        """This rank's position in `group` (torch.distributed.get_rank(group))."""
        return self.group.group_rank(self.global_rank)

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def words(self) -> str:
        return rank_words(self.mesh, self.dim, self.global_rank)


def on_ranks(program: Callable, world_size: int, **launch_kw):
    """mp.launch(program, world_size) for a check, with LAUNCH's sends and timeout unless
    given: an exercise's NotImplementedError or a failed expectation inside a rank comes
    out as itself, noting the rank."""
    try:
        return launch(program, world_size, **{**LAUNCH, **launch_kw})
    except RankFailedError as e:
        if isinstance(e.original, (NotImplementedError, AssertionError)):
            original = e.original
            if not isinstance(original, NotImplementedError):
                original.add_note(f"(raised on rank {e.rank} of {world_size})")
            raise original.with_traceback(original.__traceback__) from None
        raise


def on_mesh(program: Callable, shape: Sequence[int], names: Sequence[str], dim: str,
            **launch_kw) -> list:
    """program(ctx, spmd) on every rank of DeviceMesh(shape, names), spmd.group being the
    rank's group along `dim`; returns the per-rank results. An exception (a failed check,
    a crash, NotImplementedError) is caught on its rank, and the others finish or deadlock
    waiting for it; then the lowest failing global rank's exception is raised, noting
    where it was in the rank vocabulary: the same report whichever thread failed first."""
    mesh = DeviceMesh(shape, names)
    if dim not in mesh.mesh_dim_names:
        raise ValueError(f"on_mesh: dim {dim!r} is not one of the mesh's {mesh.mesh_dim_names}")
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()

    def run(ctx):
        spmd = Spmd(mesh, dim, ctx.rank, mesh.get_group(dim, ctx.rank))
        try:
            return program(ctx, spmd)
        except WorldAborted:  # stopped because another rank failed or all deadlocked
            raise
        except Exception as failure:  # a failed check, a crash, a todo: decided below
            with lock:
                failures[ctx.rank] = failure
            return None

    def raise_lowest():
        rank = min(failures)
        failure = failures[rank]
        if not isinstance(failure, NotImplementedError):
            failure.add_note(f"(raised on {rank_words(mesh, dim, rank)})")
        raise failure.with_traceback(failure.__traceback__) from None

    try:
        results = on_ranks(run, mesh.size, **launch_kw)
    except (MiniparError, AssertionError):
        if failures:  # a rank that failed its check left the others waiting for it
            raise_lowest()
        raise
    if failures:
        raise_lowest()
    return list(results)


@dataclass
class Call:
    """What one call of the learner's function did on this rank."""

    result: Any
    collectives: list[str]  # built-in collectives it ran, in order ("all_reduce", ...)
    sends: int  # point-to-point sends it posted
    bytes_sent: float  # bytes it put on the wire (trace.bytes_sent)


def _arrays(value: Any, path: str):
    """(path, array) for every ndarray inside value (tuples, lists, dicts)."""
    if isinstance(value, np.ndarray):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _arrays(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _arrays(v, f"{path}[{k!r}]")


def _mutation(name: str, before: np.ndarray, after: np.ndarray) -> Optional[str]:
    if before.shape != after.shape:
        return f"`{name}` changed shape from {before.shape} to {after.shape}"
    same = before == after
    if before.dtype.kind in "fc":
        same |= np.isnan(before) & np.isnan(after)
    if same.all():
        return None
    first = tuple(int(k) for k in np.argwhere(~same)[0])
    at = f" (first at index {first})" if before.ndim else ""
    return f"{int((~same).sum())} of {same.size} elements of `{name}` changed{at}"


def calls(ctx, fn: Callable, *args, names: Optional[Sequence[str]] = None,
          rank: Any = None, **kwargs) -> Call:
    """Call fn(*args, **kwargs) on copies of its array inputs and record what it ran; raise
    GradeFailure if it wrote into one of them (names: the parameters' names, for the
    message; rank: how to name this rank, an int or words such as spmd.words; default
    ctx.rank)."""
    names = list(names or [])
    names += [f"argument {i + 1}" for i in range(len(names), len(args))]
    given = list(args) + list(kwargs.values())
    labels = names[:len(args)] + list(kwargs)
    before = [copy.deepcopy(v) for v in given]
    passed = [copy.deepcopy(v) for v in given]
    start, sent = len(ctx.trace.events), ctx.trace.bytes_sent()
    result = fn(*passed[:len(args)], **dict(zip(kwargs, passed[len(args):])))
    events = ctx.trace.events[start:]
    for label, b, p in zip(labels, before, passed):
        for (path, old), (_, new) in zip(_arrays(b, label), _arrays(p, label)):
            change = _mutation(path, old, new)
            if change:
                who = (f"rank {ctx.rank if rank is None else rank}"
                       if rank is None or isinstance(rank, int) else str(rank))
                raise GradeFailure(
                    f"{who}: {getattr(fn, '__name__', 'your function')} wrote into its input "
                    f"`{path}`: {change}. The caller still needs its input: compute into a "
                    f"new array (y = x * 2, x.copy(), np.concatenate) instead of in place "
                    f"(x *= 2, x[...] = ..., np.add(x, y, out=x))")
    return Call(result, [e.name for e in events if e.stream == "comm"],
                sum(e.stream == "p2p" for e in events), ctx.trace.bytes_sent() - sent)


def forbid_collectives(call: Call, *, what: str, rank: Any = None, hint: str = "",
                       allowed: Sequence[str] = ()) -> None:
    """GradeFailure if the call ran a built-in collective not in `allowed`."""
    used = [c for c in call.collectives if c not in allowed]
    if used:
        where = f"{'rank ' + str(rank) if isinstance(rank, int) else rank}: " if rank is not None else ""
        raise GradeFailure(f"{where}{what} called the built-in {', '.join(sorted(set(used)))}: "
                           f"this exercise builds it from point-to-point sends and receives "
                           f"(mp.send/recv, isend/irecv). {hint}".rstrip())


def world_sizes(lo: int = 1, hi: int = 5, first: int = 2) -> st.SearchStrategy[int]:
    """Group sizes lo..hi that shrink toward `first` (the smallest size that shows most
    bugs), then larger ones, and the edge cases below `first` last: a failure found at n = 4
    of an answer hard-coded for 2 ranks shrinks to n = 3, not to the n = 1 edge case."""
    if not lo <= first <= hi:
        raise ValueError(f"world_sizes: need lo <= first <= hi, got {lo}, {first}, {hi}")
    return st.sampled_from(list(range(first, hi + 1)) + list(range(lo, first)))


def mesh_of(group_size: int, other: int = 2, strided: bool = False,
            names: tuple[str, str] = ("dp", "tp")) -> tuple[tuple[int, int], tuple[str, str], str]:
    """(shape, names, dim) of a 2-D mesh whose `dim` groups have group_size ranks: the
    last (consecutive ranks) dimension, or with strided=True the first (ranks other apart)."""
    if strided:
        return (group_size, other), names, names[0]
    return (other, group_size), names, names[1]
