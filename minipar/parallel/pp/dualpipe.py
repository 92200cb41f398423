"""DualPipeV: DeepSeek's DualPipe cut in half, two chunks a rank in a V, overlapped pairs.

    schedule("dualpipev", pp=4, microbatches=10)   # 8 stages on 4 ranks

DeepSeek-AI 2024 (the DeepSeek-V3 report, section 3.2.1) trains with DualPipe: each rank
runs the forward of one micro-batch and the backward of another *at once*, so that each
one's communication (the experts' all-to-all dispatch and combine, and the pipeline's
sends) hides behind the other's compute. DualPipeV (github.com/deepseek-ai/DualPipe,
dualpipev.py, after Sea AI Lab's "cut-in-half") keeps one copy of the parameters: 2p
stages, rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r (ZB-V's placement).

An overlapped pair is one item of a rank's list, OverlapFB(F, B), written as torch writes
it: `(0F7;7B3)OVERLAP_F_B`. The runner runs its F, then its B, each half's p2p message
overlapping the other half's compute (lowering.py's pair_overlap), and the dry run times
it so when its durations have no "F&B"; given t_F&B ("F&B"), it is one block of that
duration, standing for the experts' all-to-all overlap this model does not have yet.
The bubble DualPipe's README gives, with F, B (full), W per chunk:

    DualPipeV   (PP/2 - 1)(F&B + B - 3W)    PP = 2p stages    2x parameters, PP + 1
                activations per device (in chunk-micro-batches: 2p + 1)
    1F1B        (PP - 1)(F + B)             over PP devices of one stage each

DualPipe itself (bidirectional) feeds half the micro-batches from each end of the pipeline
through two copies of the model: a micro-batch of the reverse direction runs the stages
in the opposite rank order on the second copy. minipar's schedules are one chain of
stages every micro-batch crosses in full, so that schedule is not written here
(docs/zero_bubble.md says why and what it would take).
"""

from __future__ import annotations

from .actions import B, F, I, W, Action, OverlapFB, Schedule, ScheduleError


def dualpipev(pp: int, microbatches: int) -> Schedule:
    """DualPipeV in the order of DeepSeek's dualpipev.py `step` (and torch.distributed.
    pipelining's ScheduleDualPipeV). On rank r of p, with chunk 0 = stage r, chunk 1 =
    stage 2p - 1 - r, and m >= 2p micro-batches, eight steps:
        1  2(p - r - 1)      chunk-0 F
        2  r + 1             chunk-0 F, chunk-1 F
        3  p - r - 1         chunk-1 I, the oldest deferred W, chunk-1 F
        4  m - 2p + r + 1    (chunk-0 F; chunk-1 B), (chunk-1 F; chunk-0 B); on the last
                             rank the very first of these pairs runs as F then B, unpaired
        5  p - r - 1         chunk-1 B, (chunk-1 F; chunk-0 B)
        6  r + 1             chunk-1 backward, chunk-0 backward; from the (r + 1)//2-th
                             on they are split into I with W deferred (odd r: from that
                             iteration's chunk 1; even r: from its chunk 0)
        7  p - r - 1         the oldest deferred W, chunk-0 I
        8  r + 1             the oldest deferred W
    Micro-batches count per (stage, direction); W's run oldest first (DualPipe's
    WeightGradStore queue)."""
    p, m = pp, microbatches
    if m < 2 * p:
        raise ScheduleError(f"dualpipev needs at least 2p = {2 * p} micro-batches for pp = "
                            f"{p} (its steady step runs m - 2p + r + 1 times on rank r; "
                            f"DeepSeek's DualPipeV asserts m >= 2p, torch's m >= stages), "
                            f"got {m}: use microbatches >= {2 * p}")
    return [_rank(r, p, m) for r in range(p)]


def _rank(r: int, p: int, m: int) -> list:
    c0, c1 = r, 2 * p - 1 - r
    fwd = {c0: 0, c1: 0}
    bwd = {c0: 0, c1: 0}
    deferred: list[Action] = []                # W's waiting, oldest first
    row: list = []

    def forward(stage: int) -> Action:
        fwd[stage] += 1
        return Action(stage, F, fwd[stage] - 1)

    def backward(stage: int, split: bool = False) -> Action:
        bwd[stage] += 1
        if split:
            deferred.append(Action(stage, W, bwd[stage] - 1))
        return Action(stage, I if split else B, bwd[stage] - 1)

    def weight() -> None:
        if deferred:
            row.append(deferred.pop(0))

    row += [forward(c0) for _ in range(2 * (p - r - 1))]              # 1
    for _ in range(r + 1):                                             # 2
        row += [forward(c0), forward(c1)]
    for _ in range(p - r - 1):                                         # 3
        row.append(backward(c1, split=True))
        weight()
        row.append(forward(c1))
    for k in range(m - 2 * p + r + 1):                                 # 4
        if k == 0 and r == p - 1:
            row += [forward(c0), backward(c1)]
        else:
            row.append(OverlapFB(forward(c0), backward(c1)))
        row.append(OverlapFB(forward(c1), backward(c0)))
    for _ in range(p - r - 1):                                         # 5
        row.append(backward(c1))
        row.append(OverlapFB(forward(c1), backward(c0)))
    split = False
    for k in range(r + 1):                                             # 6
        split |= k == (r + 1) // 2 and r % 2 == 1
        row.append(backward(c1, split))
        split |= k == (r + 1) // 2 and r % 2 == 0
        row.append(backward(c0, split))
    for _ in range(p - r - 1):                                         # 7
        weight()
        row.append(backward(c0, split=True))
    for _ in range(r + 1):                                             # 8
        weight()
    return row
