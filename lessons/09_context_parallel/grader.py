"""Grader for lesson 09: your merge of two partial attentions against parallel/cp's
merge_ref (the definition) on drawn blocks — ordinary scores, scores past e^x's overflow,
and blocks whose lse lie hundreds apart; your zigzag positions against layout.positions
and your ring step's chunk pairs against blocks.plan_block, for every rank and step at cp
up to 8; and your prices of context parallelism against costs.py (ring_attention_bytes,
ulysses_attention_bytes, ring_attention_flops, ring_hidden_length) and the runtime's cost
model (p2p_time).
A wrong answer is compared with the known mistakes, on the drawn case and on a few fixed
ones, and the one it makes is named."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, strategies as st

from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close, learner,
                                    world_sizes)
from minipar.parallel.cp import (chunks, merge_ref, plan_block, positions,
                                 ring_attention_bytes, ring_attention_flops, ring_hidden_length,
                                 ulysses_attention_bytes)
from minipar.runtime.cost import p2p_time
from minipar.runtime.topology import Link

SEED = st.integers(0, 2**16)
OVERFLOW = math.log(np.finfo(np.float64).max)  # 709.78: e^x is inf past it


# ---- exercise 9.1: the log-sum-exp merge ---------------------------------------------------

def partial(scores: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One block's (out [..., m, d], lse [..., m]) from its scores [..., m, n] and values
    [..., n, d], computed stably (the max subtracted)."""
    top = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - top)
    total = p.sum(axis=-1, keepdims=True)
    return (p @ v) / total, (top + np.log(total))[..., 0]


REGIMES = {  # what is added to each block's scores, row by row: (block 1, block 2)
    "ordinary scores": lambda m: (np.zeros(m), np.zeros(m)),
    "scores near 1000": lambda m: (np.full(m, 1000.0), np.full(m, 1001.5)),
    "blocks whose lse lie 800 apart": lambda m: (400.0 * (-1.0) ** np.arange(m),
                                                 -400.0 * (-1.0) ** np.arange(m)),
}


def blocks(seed: int, lead: tuple, m: int, n1: int, n2: int, d: int, regime: str):
    g = np.random.default_rng(seed)
    scores = [2.0 * g.standard_normal(lead + (m, n)) for n in (n1, n2)]  # [..., m, n]
    v = [g.standard_normal(lead + (n, d)) for n in (n1, n2)]  # [..., n, d]
    for sc, add in zip(scores, REGIMES[regime](m)):
        sc += add[:, None]  # the same shift for every key of a row: one row's lse moves
    return partial(scores[0], v[0]), partial(scores[1], v[1])


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@exercise("9.1", "the log-sum-exp merge")
@SETTINGS
@given(lead=st.sampled_from([(2,), (), (2, 3)]), m=st.integers(2, 4), n1=st.integers(1, 4),
       n2=st.integers(1, 4), d=st.integers(1, 5), seed=SEED)
def check_merge(impl, lead, m, n1, n2, d, seed):
    for regime in REGIMES:  # the ordinary case first: it diagnoses best
        (o1, l1), (o2, l2) = blocks(seed, lead, m, n1, n2, d, regime)
        want_out, want_lse = merge_ref([o1, o2], [l1, l2])
        where = (f"merge_partials(out1, lse1, out2, lse2) with out [..., m, d] = "
                 f"{list(o1.shape)}, {regime} (lse1 {np.round(l1, 2).reshape(-1)[:4].tolist()}, "
                 f"lse2 {np.round(l2, 2).reshape(-1)[:4].tolist()})")
        with np.errstate(all="ignore"):  # an overflow shows in the values, diagnosed below
            got = learner(where, impl.merge_partials, o1.copy(), l1.copy(), o2.copy(), l2.copy())
        if not (isinstance(got, tuple) and len(got) == 2):
            raise GradeFailure(f"{where} returned {got!r:.80}; expected a tuple (out, lse)")
        out, lse = (np.asarray(x, dtype=np.float64) for x in got)
        if out.shape != want_out.shape or lse.shape != want_lse.shape:
            raise GradeFailure(f"{where} returned out {out.shape} and lse {lse.shape}; "
                               f"expected {want_out.shape} and {want_lse.shape}")
        if not (np.isfinite(out).all() and np.isfinite(lse).all()):
            bad = "out" if not np.isfinite(out).all() else "lse"
            if regime == "scores near 1000":
                why = (f"exp(lse) overflows: lse reaches {float(max(l1.max(), l2.max())):.0f} "
                       f"here, and e^x is inf past x = {OVERFLOW:.1f} in float64, so "
                       f"e^lse1·out1 + e^lse2·out2 over e^lse1 + e^lse2 is inf/inf. "
                       f"Exponentiate only differences: subtract the larger lse first, or "
                       f"use sigmoid(lse2 − lse1) and logsigmoid")
            elif regime == "blocks whose lse lie 800 apart":
                why = (f"the two blocks' lse differ by up to "
                       f"{float(np.abs(l1 - l2).max()):.0f} here, and the exp of that "
                       f"difference overflows (e^x is inf past x = {OVERFLOW:.1f}): "
                       f"exponentiate only −|lse1 − lse2| (sigmoid and logsigmoid written "
                       f"from e^(−|x|), or log1p(e^(−|x|)) after the larger lse)")
            else:
                why = "the inputs are finite and so is the answer"
            raise GradeFailure(f"{where}: your {bad} holds inf or NaN: {why}")
        w1, w2 = sigmoid(l1 - l2)[..., None], sigmoid(l2 - l1)[..., None]  # the blocks' shares
        if not np.allclose(out, want_out, rtol=1e-9, atol=1e-10):
            if np.allclose(out, w2 * o1 + w1 * o2, rtol=1e-9, atol=1e-10):
                hint = ("the blocks' weights are swapped: block 1 weighs e^lse1 / (e^lse1 + "
                        "e^lse2) = sigmoid(lse1 − lse2), so out = out1 − sigmoid(lse2 − lse1)"
                        "·(out1 − out2); the sign inside the sigmoid is the other way round")
            elif np.allclose(out, (o1 + o2) / 2, rtol=1e-9, atol=1e-10):
                hint = ("you averaged out1 and out2 with equal weights: each block counts by "
                        "its share of the softmax denominator, e^lse_i / (e^lse1 + e^lse2)")
            elif np.allclose(out, o1 + o2, rtol=1e-9, atol=1e-10):
                hint = ("you added out1 and out2: each is already normalised over its own "
                        "keys, so they combine as a weighted mean, weights e^lse_i / "
                        "(e^lse1 + e^lse2)")
            else:
                hint = ("out = (e^lse1·out1 + e^lse2·out2) / (e^lse1 + e^lse2) = out1 − "
                        "sigmoid(lse2 − lse1)·(out1 − out2)")
            expect_close(out, want_out, what=f"{where}: out", rtol=1e-9, atol=1e-10, hint=hint)
        if not np.allclose(lse, want_lse, rtol=1e-12, atol=1e-10):
            if np.array_equal(lse, l1):
                hint = ("your lse is lse1, unchanged: the merged attention's lse is log(e^lse1 "
                        "+ e^lse2), and the next merge of the ring weighs this result by it")
            elif np.allclose(lse, np.maximum(l1, l2), rtol=1e-12, atol=1e-10):
                hint = ("your lse is max(lse1, lse2), which drops log(1 + e^(−|lse1 − lse2|)):"
                        " lse = max + log1p(exp(−|lse1 − lse2|))")
            elif np.allclose(lse, l1 + l2, rtol=1e-12, atol=1e-10):
                hint = "the lse of the union is log(e^lse1 + e^lse2), not lse1 + lse2"
            else:
                hint = "lse = log(e^lse1 + e^lse2) = lse1 − logsigmoid(lse1 − lse2)"
            expect_close(lse, want_lse, what=f"{where}: lse", rtol=1e-12, atol=1e-10,
                         hint=hint)


# ---- exercise 9.2: the zigzag layout and a ring step's chunk pairs ------------------------

def chunk_positions(pair, c: int) -> list:
    return [int(p) for j in pair for p in range(j * c, (j + 1) * c)]


@exercise("9.2", "the zigzag layout and a ring step's chunk pairs")
@SETTINGS
@given(cp=world_sizes(1, 8, first=2), per_chunk=st.integers(1, 3),
       layout=st.sampled_from(["zigzag", "contiguous"]))
def check_zigzag(impl, cp, per_chunk, layout):
    s = 2 * cp * per_chunk
    c = per_chunk
    for r in range(cp):
        what = f"zigzag_positions({r}, {cp}, {s}) (2·cp = {2 * cp} chunks of {c})"
        got = learner(what, impl.zigzag_positions, r, cp, s)
        got = np.asarray(got).reshape(-1).tolist() if got is not None else None
        want = positions("zigzag", r, cp, s).tolist()
        if got == want:
            continue
        mistakes = [
            (chunk_positions((r, 2 * cp - r), c),
             f"you gave rank {r} chunks {r} and 2·cp − r = {2 * cp - r}: the chunks are "
             f"0..{2 * cp - 1}, so rank 0 would hold chunk 2·cp = {2 * cp}, which does not "
             f"exist, and no rank chunk cp = {cp}. The mirror of chunk r is 2·cp − 1 − r"),
            (positions("contiguous", r, cp, s).tolist(),
             f"these are the contiguous layout's positions (rank r holds tokens r·s/cp .. "
             f"(r+1)·s/cp − 1): zigzag cuts 2·cp chunks and gives rank r chunk r and its "
             f"mirror 2·cp − 1 − r"),
            (chunk_positions((r, 2 * cp - 1 - r), 2 * c),
             f"your chunks are s/cp = {2 * c} tokens long: zigzag cuts the sequence into "
             f"2·cp chunks of c = s/(2·cp) = {c}"),
            (chunk_positions((r, r + cp), c),
             f"you gave rank {r} chunks {r} and r + cp = {r + cp}, a shift, not a mirror: "
             f"every rank would then hold one early and one late chunk at the same distance, "
             f"and the last rank still the most work. The mirror is 2·cp − 1 − r = "
             f"{2 * cp - 1 - r}"),
            (chunk_positions((2 * cp - 1 - r, r), c),
             f"the right tokens in the wrong order: rank r stores chunk r first, then chunk "
             f"2·cp − 1 − r (their rows are what ring attention computes with)"),
        ]
        for positions_of_mistake, hint in mistakes:
            if got == positions_of_mistake:
                raise GradeFailure(f"{what} returned {got}, expected {want}: {hint}")
        raise GradeFailure(f"{what} returned {got}, expected {want}: chunk r = {r} "
                           f"(positions {r * c}..{(r + 1) * c - 1}) and chunk 2·cp − 1 − r = "
                           f"{2 * cp - 1 - r}")

    for r in range(cp):
        for step in range(cp):
            what = f"step_pairs({layout!r}, {r}, {step}, {cp})"
            src = (r - step) % cp
            want = kinds_of(layout, r, src, cp)
            got = learner(what, impl.step_pairs, layout, r, step, cp)
            if not isinstance(got, dict):
                raise GradeFailure(f"{what} returned {got!r:.80}; expected a dict {{(query "
                                   f"chunk, key chunk): 'full' | 'diagonal' | 'masked'}}")
            try:
                got = {(int(i), int(j)): str(kind) for (i, j), kind in got.items()}
            except (TypeError, ValueError):
                raise GradeFailure(f"{what} returned keys {list(got)[:4]}; expected pairs "
                                   f"(i, j) of chunk indices") from None
            if got == want:
                continue
            raise GradeFailure(f"{what}: {diagnose_pairs(got, want, layout, r, step, cp)}")


def kinds_of(layout: str, rank: int, src: int, cp: int) -> dict:
    """{(query chunk, key chunk): kind} from blocks.plan_block, keyed by global chunks."""
    mine, theirs = chunks(layout, rank, cp), chunks(layout, src, cp)
    block = plan_block(mine, theirs)
    return {(i, j): block.kinds[a][b] for a, i in enumerate(mine) for b, j in enumerate(theirs)}


def diagnose_pairs(got: dict, want: dict, layout: str, r: int, step: int, cp: int) -> str:
    src = (r - step) % cp
    shown = f"expected {want}, received {got}"
    if got == kinds_of(layout, r, (r + step) % cp, cp):
        return (f"{shown}: at step {step} rank {r} holds the K/V of rank (r − t) mod cp = "
                f"{src}: the blocks move from rank i to rank i + 1, so what arrives comes "
                f"from behind. Yours are rank (r + t) mod cp = {(r + step) % cp}'s (the same "
                f"rank when cp <= 2)")
    if set(got) != set(want):
        slots = {(a, b) for a in range(len(chunks(layout, r, cp)))
                 for b in range(len(chunks(layout, src, cp)))}
        if set(got) == slots and slots != set(want):
            return (f"{shown}: your keys are the chunks' places in each rank's list (0, 1); "
                    f"the keys are global chunk indices: rank {r} holds chunks "
                    f"{chunks(layout, r, cp)}, rank {src} chunks {chunks(layout, src, cp)}")
        return (f"{shown}: the pairs are every chunk rank {r} holds {chunks(layout, r, cp)} "
                f"against every chunk of rank {src} {chunks(layout, src, cp)}")
    by_rank = {key: "full" if src < r else "diagonal" if src == r else "masked" for key in want}
    if got == by_rank:
        return (f"{shown}: you compared the ranks ({r} and {src}), not the chunks: the kind "
                f"of a pair is decided by its chunk indices i and j (global positions), which "
                f"under zigzag are not in rank order: rank r's second chunk 2·cp − 1 − r comes "
                f"after every chunk of a later rank")
    full_diag = {k: ("full" if k[1] <= k[0] else "masked") for k in want}
    if got == full_diag:
        return (f"{shown}: a pair with j == i is diagonal, not full: inside one chunk query "
                f"position p sees keys up to p only, half the pairs (a causal mask in the "
                f"block)")
    masked_diag = {k: ("full" if k[1] < k[0] else "masked") for k in want}
    if got == masked_diag:
        return (f"{shown}: a pair with j == i is diagonal, not masked: every query sees at "
                f"least its own key, so the block is computed with a causal mask")
    wrong = [(k, want[k], got[k]) for k in sorted(want) if got[k] != want[k]]
    return (f"{shown}: pair {wrong[0][0]} is {wrong[0][1]!r}, yours {wrong[0][2]!r}; a pair "
            f"(i, j) is 'full' if j < i, 'diagonal' if j == i, 'masked' if j > i")


# ---- exercise 9.3: a rank's bytes and the send that hides --------------------------------

LINKS = {"NVLink": Link.nvlink4(), "InfiniBand": Link.infiniband_ndr(),
         "Ethernet": Link.ethernet_100g()}
PEAKS = (989e12, 312e12, 67e12)  # H100 bf16, A100 bf16, H100 float64


def crossover(b: int, h: int, cp: int, e: int, peak: float, link: Link) -> float:
    """The s at which one zigzag forward step's compute equals its K/V send (lesson.py,
    section 5)."""
    a2, a1 = 2 * b * h / (cp**2 * peak), 2 * b * h * e / (cp * link.bandwidth)
    return (a1 + math.sqrt(a1**2 + 4 * a2 * link.latency)) / (2 * a2)


def reference(c: dict) -> dict:
    """What cp_costs must return for the case c, from costs.py and the cost model."""
    s, b, a, d, cp, e = c["s"], c["b"], c["num_heads"], c["head_dim"], c["cp"], c["itemsize"]
    ring = ring_attention_bytes(s, b, a * d, cp, e)
    uly = ulysses_attention_bytes(s, b, a * d, cp, e) if a % cp == 0 else None
    compute = ring_attention_flops("zigzag", 0, cp, s, b, a, d)[0] / cp / c["peak_flops"]
    send = p2p_time(2 * (s // cp) * b * a * d * e, c["link"])
    hidden = s >= ring_hidden_length(b, a * d, cp, e, c["peak_flops"], c["link"])
    return {"ring_forward": ring.forward, "ring_backward": ring.backward,
            "ulysses_forward": None if uly is None else uly.forward,
            "ulysses_backward": None if uly is None else uly.backward,
            "step_compute": compute, "step_send": send, "ring_hidden": hidden}


def case(s, b, num_heads, head_dim, cp, itemsize, peak_flops, link) -> dict:
    return dict(s=s, b=b, num_heads=num_heads, head_dim=head_dim, cp=cp, itemsize=itemsize,
                peak_flops=peak_flops, link=link)


PROBES = [case(96, 2, 12, 16, 3, 2, 989e12, LINKS["NVLink"]),
          case(160, 1, 10, 8, 5, 8, 67e12, LINKS["InfiniBand"]),
          case(64, 3, 8, 32, 4, 2, 312e12, LINKS["Ethernet"]),
          case(48, 1, 4, 64, 2, 4, 989e12, LINKS["NVLink"])]


def parts(c: dict) -> dict:
    """The pieces the mistakes are made of."""
    s, b, h, cp, e = c["s"], c["b"], c["num_heads"] * c["head_dim"], c["cp"], c["itemsize"]
    return dict(s=s, b=b, h=h, cp=cp, e=e, g=4 if e == 2 else e, kv=2 * (s // cp) * b * h,
                alpha=c["link"].latency, bw=c["link"].bandwidth)


def one_step(p: dict) -> float:
    """A zigzag step's forward compute from the pieces: 2 units x 2 matmuls of 2·b·h·c²."""
    c = p["s"] // (2 * p["cp"])
    return 4 * (2 * p["b"] * p["h"] * c * c) / p["peak"]


# each key's known mistakes: (the value they give, what the hint says)
MISTAKES = {
    "ring_forward": [
        (lambda p: p["cp"] * p["kv"] * p["e"],
         "you counted cp K/V sends a rank; the forward makes cp − 1: at step t a rank "
         "forwards the block it received at step t − 1, and after the last step nobody "
         "needs it"),
        (lambda p: p["kv"] * p["e"],
         "you counted one send of the rank's own K/V; each of the cp − 1 steps forwards "
         "the block that arrived the step before, another rank's (right at cp = 2 only)"),
        (lambda p: (p["cp"] - 1) * p["kv"] * 4,
         "you counted 4 bytes an element (float32) whatever the dtype: q, k and v travel in "
         "`itemsize` bytes (2 for bf16)"),
        (lambda p: (p["cp"] - 1) * p["kv"] // 2 * p["e"],
         "one send carries K and V: 2·(s/cp)·b·h elements"),
        (lambda p: (p["cp"] - 1) * 2 * p["s"] * p["b"] * p["h"] * p["e"],
         "a rank's K/V cover its s/cp tokens, not the whole sequence"),
    ],
    "ring_backward": [
        (lambda p: (p["cp"] - 1) * p["kv"] * p["e"],
         "your backward sends what the forward sends: it also sends the dK/dV accumulators "
         "around the ring with their blocks, cp times, to bring each block's gradient home"),
        (lambda p: (p["cp"] - 1) * p["kv"] * p["e"] + p["cp"] * p["kv"] * p["e"],
         "the dK/dV accumulators travel in float32 under bf16 (4 bytes an element), as "
         "ring-flash-attention keeps them, not in the inputs' itemsize"),
        (lambda p: (p["cp"] - 1) * p["kv"] * (p["e"] + p["g"]),
         "dK/dV travel cp times, not cp − 1: the last send brings each block's accumulator "
         "home to its owner"),
        (lambda p: p["cp"] * p["kv"] * p["g"],
         "the backward passes K/V around again too (it recomputes each block), then the "
         "dK/dV: (cp − 1)·K/V + cp·dK/dV"),
    ],
    "ulysses_forward": [
        (lambda p: 4 * (p["s"] // p["cp"]) * p["b"] * p["h"] * p["e"],
         "you counted every byte of the four tensors; a rank keeps 1/cp of each (its own "
         "heads' share of its own tokens) and sends (cp − 1)/cp"),
        (lambda p: 3 * (p["s"] // p["cp"]) * p["b"] * p["h"] * p["e"] * (p["cp"] - 1) / p["cp"],
         "four tensors go through the all-to-alls each way: q, k, v and the context "
         "forward (dcontext and dq, dk, dv backward)"),
        (lambda p: 4 * p["s"] * p["b"] * p["h"] * p["e"] * (p["cp"] - 1) / p["cp"],
         "a rank holds s/cp tokens of each tensor, not the whole sequence"),
        (lambda p: 4 * (p["s"] // p["cp"]) * p["b"] * p["h"] * 4 * (p["cp"] - 1) / p["cp"],
         "you counted 4 bytes an element (float32) whatever the dtype"),
    ],
    "step_compute": [
        (lambda p: 2 * one_step(p),
         "you charged the whole 2 × 2 chunk rectangle (4 units): under the causal mask a "
         "zigzag step computes half of it, 2 chunk-pair units (a diagonal counts ½)"),
        (lambda p: p["cp"] * one_step(p),
         "that is the whole forward (cp steps); the send overlaps one step's compute"),
        (lambda p: 4 * one_step(p),
         "your chunk is s/cp tokens; zigzag's chunks are c = s/(2·cp)"),
    ],
    "step_send": [
        (lambda p: p["kv"] * p["e"] / p["bw"],
         "a send costs latency + bytes/bandwidth; yours lacks the link's latency (right "
         "only while the bytes dominate)"),
        (lambda p: p["alpha"] + p["kv"] // 2 * p["e"] / p["bw"],
         "one send carries K and V: 2·(s/cp)·b·h elements"),
        (lambda p: p["alpha"] + p["kv"] * 4 / p["bw"],
         "you counted 4 bytes an element (float32) whatever the dtype"),
    ],
}


def value(result: dict, key: str, what: str):
    if key not in result:
        raise GradeFailure(f"{what} returned no {key!r}; expected the keys ring_forward, "
                           f"ring_backward, ulysses_forward, ulysses_backward, step_compute, "
                           f"step_send, ring_hidden")
    return result[key]


def call(impl, c: dict) -> dict:
    what = (f"cp_costs(s={c['s']}, b={c['b']}, num_heads={c['num_heads']}, "
            f"head_dim={c['head_dim']}, cp={c['cp']}, itemsize={c['itemsize']}, "
            f"peak_flops={c['peak_flops']:.3g}, link={c['link'].name})")
    got = learner(what, impl.cp_costs, c["s"], c["b"], c["num_heads"], c["head_dim"], c["cp"],
                  c["itemsize"], c["peak_flops"], c["link"])
    if not isinstance(got, dict):
        raise GradeFailure(f"{what} returned {got!r:.80}; expected a dict")
    return got, what


def close(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    except (TypeError, ValueError):
        return False


def named_mistake(impl, key: str, drawn: dict, got_value) -> str:
    """The hint of the known mistake your values match, on the drawn case and on every
    probe, or "" when none does."""
    cases = [drawn] + [c for c in PROBES if c["num_heads"] % c["cp"] == 0]
    answers = [got_value] + [call(impl, c)[0].get(key) for c in cases[1:]]
    for mistake, hint in MISTAKES.get(key, []):
        if all(close(ans, mistake({**parts(c), "peak": c["peak_flops"]}))
               for c, ans in zip(cases, answers)):
            return hint
    return ""


@exercise("9.3", "a rank's bytes and the send that hides")
@SETTINGS
@given(cp=world_sizes(2, 16, first=2), num_heads=st.sampled_from([8, 12, 6, 5, 32, 40]),
       head_dim=st.sampled_from([16, 128, 64]), b=st.sampled_from([1, 2, 3]),
       itemsize=st.sampled_from([2, 4, 8]), link=st.sampled_from(list(LINKS)),
       peak=st.sampled_from(PEAKS), where=st.sampled_from([2.0, 0.5, 1.1, 0.9, 0.25, 4.0]))
def check_cp_costs(impl, cp, num_heads, head_dim, b, itemsize, link, peak, where):
    h = num_heads * head_dim
    s_star = crossover(b, h, cp, itemsize, peak, LINKS[link])
    s = 2 * cp * max(1, math.ceil(where * s_star / (2 * cp)))  # around the crossover
    c = case(s, b, num_heads, head_dim, cp, itemsize, peak, LINKS[link])
    want = reference(c)
    got, what = call(impl, c)
    for key in ("ring_forward", "ring_backward", "ulysses_forward", "ulysses_backward",
                "step_compute", "step_send"):
        mine = value(got, key, what)
        if key.startswith("ulysses"):
            if want[key] is None:
                if mine is not None:
                    raise GradeFailure(f"{what}: {key} is {mine!r}; expected None: cp = {cp} "
                                       f"does not divide num_heads = {num_heads}, and the "
                                       f"heads are what Ulysses splits over the cp ranks "
                                       f"(minipar refuses it)")
                continue
            if mine is None:
                raise GradeFailure(f"{what}: {key} is None; cp = {cp} divides num_heads = "
                                   f"{num_heads}, so Ulysses runs with {num_heads // cp} "
                                   f"heads a rank")
        if close(mine, want[key]):
            continue
        hint = named_mistake(impl, key, c, mine)
        expect_close(mine if mine is not None else None, want[key], what=f"{what}: {key}",
                     rtol=1e-9, atol=0.0,
                     hint=hint or FORMULAS[key])
    hidden = value(got, "ring_hidden", what)
    if not isinstance(hidden, (bool, np.bool_)) or bool(hidden) != want["ring_hidden"]:
        raise GradeFailure(f"{what}: ring_hidden is {hidden!r}, expected {want['ring_hidden']}:"
                           f" the send hides when one step's compute ({want['step_compute']:.3g}"
                           f" s) lasts at least as long as the send ({want['step_send']:.3g} s):"
                           f" step_compute >= step_send")


FORMULAS = {
    "ring_forward": "ring forward: (cp − 1) sends of 2·(s/cp)·b·h elements of itemsize bytes",
    "ring_backward": "ring backward: (cp − 1)·2(s/cp)bh·itemsize (K/V) + cp·2(s/cp)bh·g "
                     "(dK/dV, g = 4 under bf16, else itemsize)",
    "ulysses_forward": "Ulysses: (cp − 1)/cp · 4·(s/cp)·b·h·itemsize",
    "ulysses_backward": "Ulysses: (cp − 1)/cp · 4·(s/cp)·b·h·itemsize, the same backward",
    "step_compute": "one zigzag step: 2 units × 2 matmuls × 2·b·a·c²·d FLOPs, c = s/(2·cp), "
                    "over peak_flops",
    "step_send": "one send: link.latency + 2·(s/cp)·b·h·itemsize / link.bandwidth",
}
