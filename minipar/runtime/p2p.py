"""Point to point: send, recv and their asynchronous forms, torch.distributed's names.

`send` costs the sender a + V/B on its p2p stream. Under `launch(..., sends="rendezvous")`
(the default) it returns only once the receiver has posted the matching recv, as on NCCL;
under `sends="eager"` at once, like a buffered MPI send. The simulated clock is the same
in both modes: the mode decides which programs can finish, not what they cost. `isend`
never blocks; its Work completes once matched. `recv` returns the message (a new array)
once it has arrived, on the receiver's clock. `dst` and `src` are global ranks; `group`,
if given, must contain both.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import cost as cost_model
from .context import Context, rank_context
from .errors import CollectiveUsageError
from .group import ProcessGroup
from .trace import Event
from .work import Work, as_array, call_site


def _peer(ctx: Context, peer: int, what: str, kind: str, group: Optional[ProcessGroup]) -> None:
    g = ctx.world if group is None else group
    g.check_world(ctx.world_size, ctx.rank, kind)  # a group made for another world
    if peer not in g or peer == ctx.rank:
        raise CollectiveUsageError(
            f"rank {ctx.rank}: {kind}({what}={peer}) needs another member of group {g}; "
            f"{what} is a global rank other than {ctx.rank}")


def isend(x, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0, *,
          meta: Optional[dict] = None) -> Work:
    """Start sending x to `dst`; the message costs a + V/B on this rank's p2p stream.
    meta: what the send's trace event also records (a pipeline's runner names the
    message, e.g. {"message": "0SEND_F1", "stage": 0, "microbatch": 1})."""
    ctx = rank_context("send")
    _peer(ctx, dst, "dst", "send", group)
    x = as_array(x, ctx, "send")
    link = ctx.topology.link(ctx.rank, dst)
    start = max(ctx.clock.compute, ctx.clock.p2p)
    end = start + cost_model.p2p_time(x.nbytes, link)
    ctx.clock.p2p = end
    where = call_site()
    handle = ctx.backend.send(ctx.rank, x, dst, tag, end, where)
    ctx.trace.record(Event(ctx.rank, "p2p", "send", start, end, nbytes=x.nbytes,
                           group=(ctx.rank, dst), label=f"to {dst}",
                           meta={"sent_bytes": x.nbytes, "link": link.name, "where": where,
                                 **(meta or {})}))

    def finish():
        handle.wait()  # rendezvous: until dst has posted the matching recv
        return None, end

    return Work(ctx, finish, ready=handle.is_completed)


def irecv(src: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> Work:
    """Post a receive from `src`; wait() returns the array once it has arrived."""
    ctx = rank_context("recv")
    _peer(ctx, src, "src", "recv", group)
    posted = ctx.clock.compute
    handle = ctx.backend.recv(ctx.rank, src, tag, call_site())

    def finish():
        out = handle.wait()
        arr = out.result
        link = ctx.topology.link(src, ctx.rank)
        end = max(posted, out.start)
        begin = max(posted, out.start - cost_model.p2p_time(arr.nbytes, link))
        ctx.trace.record(Event(ctx.rank, "recv", "recv", begin, end, nbytes=arr.nbytes,
                               group=(src, ctx.rank), label=f"from {src}",
                               meta={"link": link.name}))
        return arr, end

    return Work(ctx, finish, ready=handle.is_completed)


def send(x, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> None:
    """Blocking send: the compute stream waits until the message has left (a + V/B);
    under rendezvous sends the call also waits until `dst` has posted its recv."""
    isend(x, dst, group, tag).wait()


def recv(src: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> np.ndarray:
    """Blocking receive: returns the message from `src` (a new array)."""
    return irecv(src, group, tag).wait()
