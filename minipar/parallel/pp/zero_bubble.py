"""Zero-bubble schedules: the backward split into I (input gradient) and W (weight gradient).

    schedule("zb_h1", pp=4, microbatches=8)     # 1F1B's memory, a third of its bubble
    schedule("zb_h2", pp=4, microbatches=8)     # about twice the memory, no bubble in steady state
    schedule("zbv", pp=4, microbatches=8)       # two chunks a rank in a V, 1F1B's memory

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ZB-H1, ZB-H2), and Qi et al. 2024,
"Pipeline Parallelism with Controllable Memory" (ZB-V). Stage s's I needs stage s + 1's I
only, not its W: W can wait, and a rank fills the slots where 1F1B idles with the W's it
deferred. With t_B = t_I + t_W (the full backward) and one stage a rank:

    1F1B    idle per rank (p - 1)(t_F + t_B)                  in flight on rank r: p - r
    ZB-H1   idle per rank (p - 1)(t_F + t_B - 2 t_W)          in flight: p on every rank
            (when t_W <= t_F and t_W <= t_I; a third of 1F1B's at t_F = t_I = t_W)
    ZB-H2   idle per rank (p - 1) t_F in a flushed step, 0 between back-to-back steps at
            t_F = t_I = t_W (m >= 2p - 1)                     in flight: min(2p - 1, m)
    ZB-V    2p stages, rank r holds stages r and 2p - 1 - r; at t_F = t_I = t_W (per chunk)
            0 between back-to-back steps, (p - 1) t_F in a flushed step; in flight 2p
            chunk-micro-batches = p of a rank's layers, 1F1B's rank 0

The rules, and the orders they reproduce, are in each function's docstring. Every one is
checked by validate_schedule and timed by dry_run (tests/parallel/pp/test_zero_bubble.py).
"""

from __future__ import annotations

from .actions import F, I, W, Action, Schedule, ScheduleError


def zb_h1(pp: int, microbatches: int) -> Schedule:
    """ZB-H1 as torch.distributed.pipelining's ScheduleInterleavedZeroBubble runs it with one
    stage a rank (its ZB1P): w = min(p - r - 1, m) warm-up forwards; then, for k = 0, 1, ...,
    F(w + k) and I(k) while forwards remain, then I(k) alone; after each I from the r-th on
    the oldest deferred W; the W's still deferred run last. Rank r defers r W's, so every
    rank holds p micro-batches at its peak, 1F1B's rank 0."""
    p, m = pp, microbatches
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [Action(r, F, i) for i in range(warmup)]
        weights = 0                                  # W's run so far, oldest first
        for k in range(m):
            if warmup + k < m:
                row.append(Action(r, F, warmup + k))
            row.append(Action(r, I, k))
            if k >= r:                               # the first r W's wait
                row.append(Action(r, W, weights))
                weights += 1
        row += [Action(r, W, i) for i in range(weights, m)]
        ranks.append(row)
    return ranks


def zb_h2(pp: int, microbatches: int) -> Schedule:
    """ZB-H2: the order a greedy clock gives at t_F = t_I = t_W, with at most 2p - 1
    micro-batches in flight on a rank. At each tick every free rank runs the first of:
        I of its next micro-batch, once the gradient of its output is there (the last
          stage: once its own F is done);
        F of its next micro-batch, once its input is there, if fewer than 2p - 1 are held;
        the oldest deferred W.
    Rank r so warms up with 2(p - r) - 1 forwards (the paper's ZB-H2: extra F's fill the
    bubble before the first I) and runs its W's where the I's thin out at the
    tail, so each rank is busy without a gap from its first action to its last: a
    parallelogram, zero bubble between back-to-back steps with the optimizer's
    post-validation (section 4 of the paper) when m >= 2p - 1."""
    return _greedy(pp, microbatches, limit=2 * pp - 1)


def _greedy(p: int, m: int, limit: int) -> Schedule:
    """The greedy clock of zb_h2 on unit durations: one action a rank per tick."""
    rows: list[list[Action]] = [[] for _ in range(p)]
    ends: dict[Action, int] = {}                     # action -> the tick it ends
    f, i, w = [0] * p, [0] * p, [0] * p              # per rank: F, I, W run so far
    tick = 0
    while any(w[r] < m for r in range(p)):
        chosen = []
        for r in range(p):
            grad = Action(r + 1, I, i[r]) if r + 1 < p else Action(r, F, i[r])
            ready = Action(r - 1, F, f[r]) if r > 0 else None
            if i[r] < f[r] and ends.get(grad, tick + 1) <= tick:
                chosen.append(Action(r, I, i[r]))
                i[r] += 1
            elif f[r] < m and f[r] - w[r] < limit and \
                    (ready is None or ends.get(ready, tick + 1) <= tick):
                chosen.append(Action(r, F, f[r]))
                f[r] += 1
            elif w[r] < i[r]:
                chosen.append(Action(r, W, w[r]))
                w[r] += 1
        if not chosen:  # unit durations: nothing running, nothing will change
            raise ScheduleError(f"zb_h2's greedy clock stalled at tick {tick} (p = {p}, "
                                f"m = {m}): no rank can run an action")
        for a in chosen:
            rows[a.stage].append(a)
            ends[a] = tick + 1
        tick += 1
    return rows


def zbv(pp: int, microbatches: int) -> Schedule:
    """ZB-V (Qi et al. 2024) as torch.distributed.pipelining's ScheduleZBVZeroBubble orders it.
    2p stages in a V: rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r, so the
    last rank turns the forward around (stages p - 1 and p, passed in memory) and rank 0
    holds the first and the last stage. With n = max(m, 2p - 1) micro-batches, on rank r:
        warm-up   2(p - r) - 1 chunk-0 forwards; r pairs (chunk-1 F, chunk-0 F);
                  p - r triples (chunk-1 F, I, W)
        steady    while chunk-1 forwards lag chunk 0's or chunk 0 has forwards left:
                  [chunk-0 F if any left], chunk-0 I, W, chunk-1 F, I, W
        cool-down r pairs (chunk-0 I, chunk-1 I); p - r pairs (chunk-0 I, W); then the
                  deferred chunk-1 W's, then chunk 0's
    and the micro-batches m..n - 1 (when m < 2p - 1) are left out, as torch leaves them out."""
    p, m = pp, microbatches
    n, S = max(m, 2 * p - 1), 2 * p
    ranks = []
    for r in range(p):
        first, second = r, S - 1 - r
        count = {(s, k): 0 for s in (first, second) for k in (F, I, W)}
        row: list[Action] = []

        def run(stage: int, *kinds) -> None:
            for kind in kinds:
                row.append(Action(stage, kind, count[stage, kind]))
                count[stage, kind] += 1

        for _ in range(2 * (p - r) - 1):
            run(first, F)
        for _ in range(r):
            run(second, F)
            run(first, F)
        for _ in range(p - r):
            run(second, F, I, W)
        while count[second, F] < count[first, F] or count[first, F] < n:
            if count[first, F] < n:
                run(first, F)
            run(first, I, W)
            run(second, F, I, W)
        for _ in range(r):
            run(first, I)
            run(second, I)
        for _ in range(p - r):
            run(first, I, W)
        while count[second, W] < count[second, I]:
            run(second, W)
        while count[first, W] < count[first, I]:
            run(first, W)
        ranks.append([a for a in row if a.microbatch < m])
    return ranks


def check_v(name: str, pp: int, chunks) -> None:
    """A V schedule places exactly two chunks on each rank: refuse any other count."""
    if chunks not in (None, 2):
        raise ScheduleError(f"{name!r} places two chunks on each rank in a V (rank r holds "
                            f"stages r and 2p - 1 - r: at pp = {pp}, rank 0 holds stages 0 and "
                            f"{2 * pp - 1}), got chunks={chunks}: "
                            f"leave chunks out or pass chunks=2; for other chunk counts use "
                            f"'interleaved_1f1b'")
