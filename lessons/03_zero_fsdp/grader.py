"""Grader for lesson 03: your ZeRO-1 step against one device running minipar's AdamW, and
your byte and traffic counts against minipar.plan's."""

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import (SETTINGS, GradeFailure, exercise, expect_close,
                                    expect_equal, on_ranks)
from minipar.nn import Parameter
from minipar.optim import AdamW
from minipar.plan import dp_comm_elements, flat_padding, model_state_bytes
from minipar.runtime.reference import reduce_blocks

BETAS = (0.9, 0.99)  # not the defaults: the hyperparameters passed in must be the ones used
EPS = 1e-8


def initial_weights(numel: int) -> np.ndarray:
    return np.sin(1.0 + 0.37 * np.arange(numel))  # [numel]


def local_grad(rank: int, t: int, numel: int) -> np.ndarray:
    """Rank `rank`'s gradient at step t: different on every rank, index and step."""
    i = np.arange(numel)
    return (rank + 1) * np.cos(0.7 * i + 1.3 * rank + 0.5 * t) + 0.1 * (i - rank)  # [numel]


def padded_to(x: np.ndarray, padded: int) -> np.ndarray:
    out = np.zeros(padded)
    out[:x.size] = x
    return out


def one_device(numel: int, n: int, steps: int, hyper: dict) -> list[tuple]:
    """minipar's AdamW on one device with the averaged gradient: (w, m, v) after each step,
    each [numel]. The average is the collective's, ((g_0 + g_1) + ...) / n."""
    out = []
    with mp.device():
        p = Parameter("w", initial_weights(numel))
        opt = AdamW([p], **hyper)
        for t in range(1, steps + 1):
            p.grad = reduce_blocks([local_grad(r, t, numel) for r in range(n)], "avg")
            opt.step()
            state = opt.state["w"]
            out.append((p.data.copy(), state["m"].copy(), state["v"].copy()))
    return out


@exercise("3.1", "the ZeRO-1 AdamW step: reduce-scatter, Adam on the shard, all-gather")
@SETTINGS
@given(world_size=st.integers(1, 4), numel=st.integers(1, 13), steps=st.integers(1, 3),
       lr=st.sampled_from([1e-2, 1e-3]), weight_decay=st.sampled_from([0.0, 0.1]))
def check_zero1_step(impl, world_size, numel, steps, lr, weight_decay):
    n = world_size
    padded = numel + flat_padding(numel, n)
    shard = padded // n
    hyper = dict(lr=lr, betas=BETAS, eps=EPS, weight_decay=weight_decay)
    expected = one_device(numel, n, steps, hyper)
    wire = 2 * padded * (n - 1) / n * 8  # bytes: reduce-scatter + all-gather of float64

    def program(ctx):
        r = ctx.rank
        lo, hi = r * shard, (r + 1) * shard
        w, m, v = padded_to(initial_weights(numel), padded), np.zeros(shard), np.zeros(shard)
        for t, (ew, em, ev) in enumerate(expected, start=1):  # [numel] each
            call = (f"zero1_step(flat_params [{padded}], flat_grad [{padded}], m [{shard}], "
                    f"v [{shard}], step={t}, lr={lr}, betas={BETAS}, eps={EPS}, "
                    f"weight_decay={weight_decay}) on {n} rank(s)")
            start = len(ctx.trace.events)
            out = impl.zero1_step(w.copy(), padded_to(local_grad(r, t, numel), padded),
                                  m.copy(), v.copy(), t, **hyper)
            if not (isinstance(out, tuple) and len(out) == 3):
                raise GradeFailure(f"rank {r}: {call} returned {type(out).__name__}, expected "
                                   "a tuple (new flat_params, new m, new v)")
            w, m, v = (np.asarray(a) for a in out)
            ew, em, ev = (padded_to(a, padded) for a in (ew, em, ev))  # [padded] each
            expect_equal(w.shape, (padded,), rank=r, what=f"the shape of {call}'s flat_params",
                         hint="return the whole flat weights, padding included, as "
                              "all_gather assembles them")
            expect_close(m, em[lo:hi], rank=r, what=f"{call}: the new m (this rank's shard)",
                         hint=f"m = β1·m + (1 − β1)·g, with g the averaged gradient of the "
                              f"shard rank {r} owns, flat[{lo}:{hi}]")
            expect_close(v, ev[lo:hi], rank=r, what=f"{call}: the new v (this rank's shard)",
                         hint=f"v = β2·v + (1 − β2)·g², with g the averaged gradient of the "
                              f"shard rank {r} owns, flat[{lo}:{hi}]")
            expect_close(w[lo:hi], ew[lo:hi], rank=r,
                         what=f"{call}: flat_params[{lo}:{hi}], the shard this rank updated",
                         hint="AdamW on the owned shard: m̂ = m/(1 − β1^t), "
                              "v̂ = v/(1 − β2^t); w = w − lr·wd·w before "
                              "w = w − lr·m̂/(√v̂ + ε)")
            expect_close(w, ew, rank=r, what=f"{call}: the new flat_params",
                         hint="this rank's own shard is right, so the others' are not: every "
                              "rank r must update flat[r·Ψ'/N:(r+1)·Ψ'/N] and all_gather puts "
                              "the shards back in rank order")
            sent = sum(float(e.meta.get("sent_bytes", 0))
                       for e in ctx.trace.events[start:] if e.stream == "comm")
            expect_close(sent, wire, rank=r, rtol=1e-12, atol=1e-9,
                         what=f"bytes this rank sent during {call}",
                         hint="ZeRO-1 sends one reduce_scatter of the padded gradient and one "
                              "all_gather of the updated shard, 2Ψ'(N−1)/N elements of 8 "
                              "bytes: DDP's all-reduce volume, nothing more")

    on_ranks(program, n)


PSI = st.integers(1, 10**12)  # parameter counts that rarely divide n: padding matters
N = st.sampled_from([1, 2, 3, 4, 5, 7, 8, 64, 1000])
DTYPES = st.sampled_from([(2, 2, 12), (8, 8, 16), (4, 4, 8)])  # bf16 + fp32 Adam; fp64; fp32


@exercise("3.2", "model-state bytes per rank, padding included")
@SETTINGS
@given(psi=PSI, stage=st.integers(0, 3), n=N, sizes=DTYPES)
def check_zero_bytes_per_rank(impl, psi, stage, n, sizes):
    pb, gb, k = sizes
    expected = model_state_bytes(psi, stage, n, k=k, param_bytes=pb, grad_bytes=gb,
                                 padding=flat_padding(psi, n) if stage else 0)
    call = (f"zero_bytes_per_rank(psi={psi}, stage={stage}, n={n}, param_bytes={pb}, "
            f"grad_bytes={gb}, k={k})")
    got = impl.zero_bytes_per_rank(psi, stage, n, param_bytes=pb, grad_bytes=gb, k=k)
    if not isinstance(got, dict):
        raise GradeFailure(f"{call} returned {type(got).__name__}, expected a dict with keys "
                           "'parameters', 'gradients', 'optimizer_states' and 'total'")
    expect_equal(sorted(got), sorted(expected), what=f"the keys of {call}",
                 hint="use the ledger's category names, plus 'total'")
    for key in ("parameters", "gradients", "optimizer_states", "total"):
        expect_close(got[key], expected[key], rtol=1e-12, atol=0, what=f"{call}[{key!r}]",
                     hint="stage k partitions the last k of (optimizer states, gradients, "
                          "weights) over n; at stages >= 1 every term counts the padded "
                          "Ψ' = Ψ + ((−Ψ) mod n) elements (a shard is Ψ'/n); DDP pads nothing")


@exercise("3.3", "elements sent per rank and step under DDP and ZeRO-1/2/3")
@SETTINGS
@given(psi=PSI, stage=st.integers(0, 3), n=N)
def check_zero_comm_elements(impl, psi, stage, n):
    expected = dp_comm_elements(psi, stage, n, padding=flat_padding(psi, n) if stage else 0)
    expect_close(impl.zero_comm_elements(psi, stage, n), expected, rtol=1e-12, atol=0,
                 what=f"zero_comm_elements(psi={psi}, stage={stage}, n={n})",
                 hint="a ring all-reduce is a reduce-scatter plus an all-gather, (n−1)/n of "
                      "the buffer each; ZeRO-3 all-gathers twice; stages >= 1 send the padded "
                      "Ψ'")
