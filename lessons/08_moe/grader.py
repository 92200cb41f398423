"""Grader for lesson 08: your dispatch permutation and its inverse against nn/moe's
plan_routing, permute and unpermute on drawn routings (skewed, some experts unchosen);
your kept pairs against plan_routing's capacity and drop policies (ties in weight
included); and your reduction of an expert's gradient, on simulated dp × ep (× tp) meshes,
against the mean of every data-parallel rank's share, with the groups your collectives ran
over read from the trace."""

import math

import numpy as np
from hypothesis import assume, given, strategies as st

from minipar.course.expect import constant_ratio
from minipar.course.grading import learner
from minipar.course.grading import (SETTINGS, GradeFailure, calls, exercise, expect_close,
                                    on_ranks, world_sizes)
from minipar.nn.moe import capacity, permute, plan_routing, unpermute
from minipar.parallel import ParallelDims, ParallelGroups

SEED = st.integers(0, 2**16)



def routing(T: int, E: int, k: int, skew: float, seed: int, ties: bool = False):
    """(experts int [T, k], weights [T, k]): each token's k distinct experts, drawn with
    probabilities that fall by exp(-skew) an expert (expert 0 the most popular), best
    first; weights normalised per token, or multiples of 1/4 (ties) when asked."""
    g = np.random.default_rng(seed)
    p = np.exp(-skew * np.arange(E))
    experts = np.stack([g.choice(E, size=k, replace=False, p=p / p.sum()) for _ in range(T)])
    if ties:
        weights = g.integers(1, 4, size=(T, k)) / 4.0
    else:
        weights = g.random((T, k)) + 0.1
        weights /= weights.sum(axis=1, keepdims=True)
    return experts.astype(np.int64), weights


# ---- exercise 8.1: the dispatch permutation and its inverse -------------------------------

def tokens_of(rows: np.ndarray, x: np.ndarray) -> list:
    """The token each row holds (-1 for a row that is no token's)."""
    out = []
    for r in rows:
        hit = np.flatnonzero(np.all(x == r, axis=1))
        out.append(int(hit[0]) if len(hit) else -1)
    return out


def diagnose_rows(got_tokens: list, want_tokens: np.ndarray, experts: np.ndarray,
                  counts: np.ndarray) -> str:
    """The most specific reason the rows are in the wrong order."""
    T, k = experts.shape
    want_tokens = [int(t) for t in want_tokens]
    if got_tokens == list(np.repeat(np.arange(T), k)):
        return ("your rows are in token order (token 0's k choices, then token 1's, ...): "
                "group them by expert, so that each expert's rows form one contiguous block "
                "(sort the pairs by expert, then token)")
    starts = np.concatenate([[0], np.cumsum(counts)])
    for e in range(len(counts)):
        got, want = got_tokens[starts[e]:starts[e + 1]], want_tokens[starts[e]:starts[e + 1]]
        if got == want:
            continue
        if sorted(got) != sorted(want):
            return (f"expert {e}'s block (rows {starts[e]}..{starts[e + 1] - 1}) should hold "
                    f"tokens {want}, yours holds {got}: the rows are grouped by expert 0, 1, "
                    f"..., E - 1 in turn, one row per (token, choice) pair that chose it")
        column = np.argsort(experts.T.reshape(-1), kind="stable") % T  # pair j·T + t
        hint = (" (a column-major flatten of experts: the pair of token t's j-th choice is "
                "t·k + j, row-major)" if got_tokens == [int(t) for t in column] else
                " (a sort that is not stable, such as np.argsort's default, reorders equal "
                "keys: pass kind=\"stable\")")
        return (f"expert {e}'s rows hold tokens {got}, not in token order {want}: inside an "
                f"expert the rows keep token order{hint}")
    return "the rows are not those of minipar's permute"


@exercise("8.1", "the dispatch permutation and its inverse")
@SETTINGS
@given(T=st.integers(3, 24), E=st.integers(2, 6), k=st.integers(1, 3),
       skew=st.sampled_from([0.7, 0.0, 2.0]), seed=SEED)
def check_permutation(impl, T, E, k, skew, seed):
    assume(k <= E)
    h = 3
    experts, weights = routing(T, E, k, skew, seed)
    x = np.random.default_rng(seed + 1).standard_normal((T, h))  # x: [T, h], distinct rows
    plan = plan_routing(experts, weights, E)  # dropless
    want_xs, want_counts = permute(x, plan), plan.counts
    where = f"T = {T} tokens, E = {E}, k = {k}, experts {experts.tolist()}"
    got = learner(f"permute_rows(x, experts, {E})", impl.permute_rows, x, experts, E)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise GradeFailure(f"permute_rows(x, experts, {E}) returned {got!r:.80}; expected a "
                           f"tuple (xs [T·k, h], counts [E])")
    xs, counts = (np.asarray(v) for v in got)
    expect_close(counts, want_counts, what=f"permute_rows' counts ({where})",
                 hint="counts[e] = the pairs that chose expert e, an entry for every expert "
                      "0..E-1 (np.bincount(..., minlength=E))")
    if xs.shape != want_xs.shape:
        raise GradeFailure(f"permute_rows' xs has shape {xs.shape}, expected {want_xs.shape}: "
                           f"one row of h for each of the T·k = {T * k} pairs ({where})")
    if not np.array_equal(xs, want_xs):
        reason = diagnose_rows(tokens_of(xs, x), plan.tokens, experts, want_counts)
        raise GradeFailure(f"permute_rows' rows ({where}): {reason}")

    ys = np.random.default_rng(seed + 2).standard_normal((T * k, h))  # the experts' outputs
    want, _ = unpermute(ys, plan, weights)
    y = learner("unpermute_rows(ys, experts, weights)", impl.unpermute_rows, ys, experts,
                weights)
    if y is None or np.shape(y) != want.shape:
        raise GradeFailure(f"unpermute_rows returned {'None' if y is None else np.shape(y)}; "
                           f"expected y of shape {want.shape} ({where})")
    y = np.asarray(y)
    if np.allclose(y, want, rtol=1e-10, atol=1e-12):
        return
    rows = np.argsort(experts.reshape(-1), kind="stable")
    gathered = np.einsum("tk,tkh->th", weights, ys[rows].reshape(T, k, h))
    per_pair = np.empty_like(ys)
    per_pair[rows] = ys
    unweighted = per_pair.reshape(T, k, h).sum(axis=1)
    if k > 1 and np.allclose(y, unweighted):
        hint = ("summed each token's k outputs without its routing weights: y[t] = Σ_j "
                "weights[t, j] · (row of (t, j))")
    elif np.allclose(y, gathered):
        hint = ("read ys[order] — a gather — where the inverse of the permutation is a "
                "scatter: row r came from pair order[r], so per_pair[order] = ys")
    else:
        hint = ("y[t] = Σ_j weights[t, j] · ys[row of pair (t, j)], the row being that "
                "pair's place in permute_rows' order (by expert, then token)")
    expect_close(y, want, what=f"unpermute_rows(ys, experts, weights) ({where}, weights "
                 f"{np.round(weights, 3).tolist()})", hint=hint)


# ---- exercise 8.2: capacity and dropped pairs --------------------------------------------

def kept_with(experts, weights, E, C, policy) -> np.ndarray:
    return plan_routing(experts, weights, E, C, policy).kept


@exercise("8.2", "capacity and dropped pairs")
@SETTINGS
@given(T=st.integers(5, 30), E=st.sampled_from([3, 4, 5, 8]), k=st.sampled_from([2, 3, 1]),
       factor=st.sampled_from([1.0, 1.25, 0.6, 1.5, 2.0]),
       policy=st.sampled_from(["probs", "position"]), skew=st.sampled_from([1.0, 0.3]),
       ties=st.booleans(), seed=SEED)
def check_kept_pairs(impl, T, E, k, factor, policy, skew, ties, seed):
    assume(k <= E)
    experts, weights = routing(T, E, k, skew, seed, ties)
    C = capacity(T, E, k, factor)
    want = kept_with(experts, weights, E, C, policy)
    what = (f"kept_pairs(experts, weights, {E}, {factor}, {policy!r}) with T = {T}, k = {k}"
            f" (C = ceil({k}·{T}/{E} · {factor}) = {C}; choices per expert "
            f"{np.bincount(experts.reshape(-1), minlength=E).tolist()})")
    got = learner(what, impl.kept_pairs, experts, weights, E, factor, policy)
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype.kind not in "bui":
        raise GradeFailure(f"{what} returned {got.dtype} of shape {got.shape}; expected a "
                           f"bool array [T, k] = {list(want.shape)}")
    got = got.astype(bool)
    if np.array_equal(got, want):
        return
    raw = k * T / E * factor
    if np.array_equal(got, np.ones_like(want)):
        raise GradeFailure(f"{what}: kept every pair: an expert keeps at most C = {C}, the "
                           f"rest are dropped")
    formulas = {  # a capacity a learner computes, and what it forgot
        "ceil(T/E · factor), without the k: C counts (token, choice) pairs, k a token":
            math.ceil(T / E * factor),
        "rounded down (int() or //): C is the ceiling": math.floor(raw),
        "rounded to the nearest: C is the ceiling": round(raw),
        "ceil(k·T/E), without the factor": math.ceil(k * T / E),
    }
    for cap in sorted(set(formulas.values()) - {C}):
        if cap >= 0 and np.array_equal(got, kept_with(experts, weights, E, cap, policy)):
            why = "; or ".join(f for f, v in formulas.items() if v == cap)
            raise GradeFailure(f"{what}: your experts keep at most {cap} pairs where C = "
                               f"ceil(k·T/E · factor) = ceil({raw:g}) = {C}: {cap} is {why}")
    other = "position" if policy == "probs" else "probs"
    if np.array_equal(got, kept_with(experts, weights, E, C, other)):
        raise GradeFailure(f"{what}: you kept by {other!r} where {policy!r} was asked: " + (
            "'probs' keeps the C pairs of highest weight" if policy == "probs"
            else "'position' keeps the first C pairs in token order, whatever their weight"))
    for e in range(E):
        t, j = np.nonzero(experts == e)
        if np.array_equal(got[t, j], want[t, j]):
            continue
        pairs = ", ".join(f"token {a} ({w:.3g})" for a, w in zip(t, weights[t, j]))
        kept_want = [int(a) for a in t[want[t, j]]]
        kept_got = [int(a) for a in t[got[t, j]]]
        tie = (" Among equal weights the earlier token is kept." if policy == "probs"
               and len(set(weights[t, j])) < len(t) else "")
        raise GradeFailure(f"{what}: expert {e} is chosen by {pairs}; it keeps the tokens "
                           f"{kept_want}, yours keeps {kept_got}.{tie}")
    raise GradeFailure(f"{what}: the pairs kept differ from plan_routing's")


# ---- exercise 8.3: an expert's gradient under dp × ep ------------------------------------

def share(seed: int, dp_rank: int, expert: int, shape) -> np.ndarray:
    """Data-parallel rank dp_rank's share of expert `expert`'s gradient (its tokens')."""
    return np.random.default_rng([seed, dp_rank, expert]).standard_normal(shape)


def owner_grad(groups: ParallelGroups, seed: int, shape) -> tuple[int, np.ndarray]:
    """(expert, gradient) on a rank: its first local expert (its place in the ep group),
    from the rows of every rank of its ep group: the sum of their shares."""
    e = groups.ep.group_rank(groups.rank)
    dp_ranks = [groups.dp.group_rank(r) for r in groups.ep.ranks]
    return e, sum(share(seed, d, e, shape) for d in dp_ranks)


@exercise("8.3", "an expert's gradient under dp × ep")
@SETTINGS
@given(ep=world_sizes(1, 4, first=2), replicas=world_sizes(1, 3, first=2),
       tp=st.sampled_from([1, 2]), shard=st.booleans(), n=st.integers(1, 5), seed=SEED)
def check_reduce_expert_grad(impl, ep, replicas, tp, shard, n, seed):
    dp = ep * replicas
    assume(dp * tp <= 12)
    dims = (ParallelDims(dp_shard=dp, ep=ep, tp=tp) if shard
            else ParallelDims(dp_replicate=dp, ep=ep, tp=tp))
    shape = (n, 2)

    def program(ctx):
        g = ParallelGroups(dims)
        e, grad = owner_grad(g, seed, shape)
        want = sum(share(seed, d, e, shape) for d in range(dp)) / dp
        words = (f"rank {ctx.rank} of {dims} (ep group {list(g.ep.ranks)}, edp group "
                 f"{list(g.edp.ranks)}, dp group {list(g.dp.ranks)}; expert {e} of the ep "
                 f"group's)")
        start = len(ctx.trace.events)
        call = calls(ctx, impl.reduce_expert_grad, grad, dims, names=["grad", "dims"],
                     rank=words)
        got = call.result
        used = [(ev.name, list(ev.group)) for ev in ctx.trace.events[start:]
                if ev.stream == "comm"]
        if got is None or np.shape(got) != shape:
            return (f"{words}: reduce_expert_grad returned "
                    f"{'None' if got is None else np.shape(got)}; expected the gradient's "
                    f"shape {shape}")
        got = np.asarray(got, dtype=np.float64)
        if np.allclose(got, want, rtol=1e-10, atol=1e-12):
            return None
        for name, ranks in used:
            if len(ranks) > g.edp.size and set(g.edp.ranks) < set(ranks):
                return (f"{words}: your {name} ran over ranks {ranks}, beyond the expert's "
                        f"replicas {list(g.edp.ranks)} (the edp group): the other ranks hold "
                        f"other experts, and their gradients are not this expert's. Reduce "
                        f"over ParallelGroups(dims).edp, the dp/ep ranks holding the same "
                        f"experts")
            if ranks == list(g.ep.ranks) and g.ep.size > 1:
                return (f"{words}: your {name} ran over the ep group {ranks}: its ranks hold "
                        f"the other experts. An expert's replicas are the edp group "
                        f"{list(g.edp.ranks)}")
        if not used and g.edp.size > 1:
            return (f"{words}: no collective ran, but this expert has {g.edp.size} replicas "
                    f"{list(g.edp.ranks)}, each with the rows of another ep group: average "
                    f"over them (the edp group)")
        c = constant_ratio(got, want)
        named = [(dims.ep, f"received = ep× (ep = {dims.ep}) one device's gradient: the "
                           f"replicas' mean still sums ep data-parallel shares (the owner "
                           f"got rows from all {dims.ep} ep ranks): scale it by 1/ep (dividing "
                           f"the sum by the edp size instead of dp gives the same mistake)"),
                 (dp, f"received = dp× (dp = {dp}) one device's gradient: summed where the "
                      f"mean was wanted"),
                 (1 / dims.ep, "received = 1/ep of one device's gradient: divided by ep "
                               "twice")]
        for ratio, hint in named:  # ep first: at ep = dp it is the likelier mistake
            if c is not None and ratio != 1 and math.isclose(c, ratio, rel_tol=1e-9):
                return f"{words}: {hint}"
        try:
            expect_close(got, want, what=f"{words}: reduce_expert_grad(grad, dims)",
                         hint="one device's gradient of an expert is the mean over all dp "
                              "ranks of their shares; the owner holds the sum of its ep "
                              "group's shares")
        except GradeFailure as failure:
            return str(failure)
        return None

    for message in on_ranks(program, dims.world_size):
        if message:
            raise GradeFailure(message)  # the lowest failing rank, the same every run
