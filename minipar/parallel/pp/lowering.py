"""The lowering: the sends and receives a compute schedule implies, derived, never written.

For each compute action of rank r, with stage s on r and micro-batch i:

    sF i          RECV_F s i just before   if stage s - 1 is on another rank (its output)
                  SEND_F s i just after    if stage s + 1 is on another rank
    sB i, sI i    RECV_B s i just before   if stage s + 1 is on another rank (the gradient
                                           of s's output)
                  SEND_B s i just after    if stage s - 1 is on another rank (the gradient
                                           of s's input)
    sW i          nothing: weight gradients stay on the rank
    (sF i; tB j)  a pair: both receives just before it (RECV_F of its F, then RECV_B of
                  its B), both sends just after (SEND_F, then SEND_B), as DualPipe's
                  _forward_backward_chunk posts them around the overlapped compute;
                  each is timed by the half it belongs to (pair_overlap): the F half
                  waits for RECV_F; its SEND_F is posted as soon as the F half ends, so
                  the activations travel while the B half computes; RECV_B is waited
                  only when the B half starts, so the gradient travels while the F half
                  computes; SEND_B follows the B half. (With t_F&B given to the dry run
                  the pair is one block: both receives at its start, both sends at its
                  end.) What this overlaps is the pipeline's p2p only: the experts'
                  all-to-all that DualPipe hides behind the other half is not modelled
Two stages on one rank (interleaving with p = 1, or the turn of a V: stages p - 1 and p on
the last rank) pass the tensor in memory, with no message.

The runner's contract, the order that cannot deadlock under rendezvous sends:
    SEND   isend: never blocks; its Work is waited only once the rank's list has ended
    RECV   irecv, waited at once: the compute action just after it consumes the message
Proof. Every RECV sits just before the action that consumes it and every SEND just after
the one that produces it, so the lowered lists' dependency graph (each rank's order, plus
send -> recv) is the compute graph with each cross-rank edge split in two. Splitting edges
keeps a graph acyclic, and validate_schedule has shown the compute graph acyclic (it ran
the lists to the end). An overlapped pair is one node of that graph (the validator runs it
as one item), its receives just before it and its sends just after, so the same holds; that
its SEND_F leaves earlier (after the F half) and its RECV_B is waited later (before the B
half) than the list says only removes waiting, so it cannot add a deadlock. isend never
blocks, so a rank can stop only at a RECV, whose SEND
follows a finished action by induction along a topological order, or at its final waits,
which end once every rank has posted every RECV, which every rank does as it reaches the
end of its list. No rank waits forever. (dry_run.py checks this on any lowered lists.)
Blocking sends would not do: in 1F1B's steady state rank r sends activations to r + 1
while r + 1 sends a gradient to r; if each waited for the other's receive, both would
hang. Megatron pairs the two in one batched send_forward_recv_backward; isend, with the
waits at the end, needs no pairing.

A message is matched by its tag, unique per (boundary, micro-batch, direction), so the
order of arrivals between two ranks never matters: message(action, where).tag.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional, Sequence

from .actions import (B, F, I, RECV_B, RECV_F, SEND_B, SEND_F, Action, Kind, OverlapFB,
                      Schedule, ScheduleError, parts)
from .validate import validate_schedule


def lower(actions: Schedule) -> Schedule:
    """The compute schedule with every send and receive in place (see the module docstring).

    actions: one list of compute actions per rank, valid (validate_schedule is run first).
    """
    if any(a.is_communication for row in actions for a in row):
        first = next(a for row in actions for a in row if a.is_communication)
        raise ScheduleError(f"lower() takes compute actions only, got {first}: these lists "
                            f"are already lowered")
    info = validate_schedule(actions)
    where, S = info.placement, info.stages
    lowered = []
    for r, row in enumerate(actions):
        out = []
        for item in row:
            recvs, sends = [], []
            for a in parts(item):
                s, i = a.stage, a.microbatch
                if a.kind == F:
                    if s > 0 and where[s - 1] != r:
                        recvs.append(Action(s, RECV_F, i))
                    if s + 1 < S and where[s + 1] != r:
                        sends.append(Action(s, SEND_F, i))
                elif a.kind in (B, I):
                    if s + 1 < S and where[s + 1] != r:
                        recvs.append(Action(s, RECV_B, i))
                    if s > 0 and where[s - 1] != r:
                        sends.append(Action(s, SEND_B, i))
            out += recvs + [item] + sends
        lowered.append(out)
    return lowered


def pair_overlap(row: Sequence) -> dict[int, tuple[Optional[int], Optional[int]]]:
    """For one rank's lowered list: each pair's position -> (the position of its B half's
    RECV_B among the receives just before it, the position of its F half's SEND_F among the
    sends just after it), None where the pair has no such message (its neighbour stage on
    this rank, or the last stage's loss). These two are timed per half (module docstring):
    the RECV_B waited when the B half starts, the SEND_F posted when the F half ends."""
    out = {}
    for k, item in enumerate(row):
        if not isinstance(item, OverlapFB):
            continue
        f, b = item.forward, item.backward
        recv = send = None
        q = k - 1
        while q >= 0 and row[q].is_communication and row[q].kind in (RECV_F, RECV_B):
            if row[q] == Action(b.stage, RECV_B, b.microbatch):
                recv = q
            q -= 1
        q = k + 1
        while q < len(row) and row[q].is_communication and row[q].kind in (SEND_F, SEND_B):
            if row[q] == Action(f.stage, SEND_F, f.microbatch):
                send = q
            q += 1
        out[k] = (recv, send)
    return out


class Message(NamedTuple):
    """What one SEND/RECV pair moves: activations (kind F) or gradients (kind B)."""

    kind: Kind         # F: output activations of src_stage; B: gradient of src_stage's input
    src_stage: int
    dst_stage: int
    microbatch: int
    src: int           # pipeline rank (position in the pp group) that sends
    dst: int           # pipeline rank that receives
    tag: int           # unique per message: 2·(microbatch·S + boundary) + (0 for F, 1 for B)

    @property
    def send(self) -> Action:
        return Action(self.src_stage, SEND_F if self.kind == F else SEND_B, self.microbatch)

    @property
    def recv(self) -> Action:
        return Action(self.dst_stage, RECV_F if self.kind == F else RECV_B, self.microbatch)


def message(action: Action, where: Mapping[int, int]) -> Message:
    """The message a communication action sends or receives; `where`: stage -> rank."""
    s, i, S = action.stage, action.microbatch, len(where)
    src_stage = {SEND_F: s, RECV_F: s - 1, SEND_B: s, RECV_B: s + 1}.get(action.kind)
    if src_stage is None:
        raise ScheduleError(f"{action} is a compute action; message() takes SEND_F, RECV_F, "
                            f"SEND_B or RECV_B")
    forward = action.kind in (SEND_F, RECV_F)
    dst_stage = src_stage + 1 if forward else src_stage - 1
    if not (0 <= src_stage < S and 0 <= dst_stage < S):
        flow = "activations go from s to s + 1" if forward else "gradients go from s to s - 1"
        raise ScheduleError(f"{action} has no peer: stages are 0..{S - 1}, and {flow}")
    boundary = min(src_stage, dst_stage)
    return Message(F if forward else B, src_stage, dst_stage, i, where[src_stage],
                   where[dst_stage], 2 * (i * S + boundary) + (0 if forward else 1))
