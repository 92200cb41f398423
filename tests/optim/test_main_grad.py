"""Megatron's float32 gradient accumulation, `main_grad=True`: the bytes on the ledger (18 a
parameter against 16, the distributed optimizer's 6 + 12/d), the error it removes from
accumulated and all-reduced bf16 gradients against float64, and its equivalence to one
device where the arithmetic allows (MixedPrecisionOptimizer and the data-parallel engines).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, AdamW, DynamicLossScaler, MixedPrecisionOptimizer
from minipar.parallel import DistributedDataParallel, ZeroEngine, zero_engine
from minipar.parallel.dp import accumulate_gradients
from minipar.plan import Layout, model_state_bytes
from minipar.plan.rank_states import bytes_per_parameter

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = {"w1": (4, 6), "b1": (6,), "g": (3,)}
PSI = 4 * 6 + 6 + 3  # Ψ = 33
CFG = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=2,
                dtype="bfloat16")
PSI_GPT = CFG.num_parameters()  # 7744: every unit a multiple of 2 and 4 (no ZeRO padding)


def make_params(dtype=BF16, seed=0, prefix=""):
    rng = np.random.default_rng(seed)
    return [Parameter(prefix + n, rng.standard_normal(s).astype(dtype))
            for n, s in SHAPES.items()]


def micro_grads(k, seed=1, shape=(4096,), mean=0.5):
    """k bf16 micro-batch gradients with a common mean, so that their sum grows with k."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) + mean).astype(BF16) for _ in range(k)]


def relative(x, ref):
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


def tokens(columns, seed=0):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, (CFG.seq_len + 1, columns))


# ---- the ledger -------------------------------------------------------------------------
def test_the_ledger_shows_18_bytes_a_parameter_with_main_grad_and_16_without():
    """2 (bf16 weights) + 4 (float32 main_grad) + 12 (master, m, v) = 18Ψ, held through
    zero_grad; without it 2 + 2 + 12 = 16Ψ (tests/optim/test_mixed_precision.py)."""
    with mp.device() as ctx:
        led = ctx.ledger
        params = make_params()
        opt = MixedPrecisionOptimizer(AdamW, params, lr=1e-2, main_grad=True)
        assert opt.main_grad and all(p.grad.dtype == np.float32 for p in params)
        assert led.held("parameters") == 2 * PSI == 66
        assert led.held("gradients") == 4 * PSI == 132  # made at construction, for good
        assert led.held("optimizer_states") == 4 * PSI  # the masters (m, v at the first step)
        for p in params:
            p.accumulate(np.ones(p.shape, BF16))
        assert opt.step() is True
        assert led.held("parameters") == 2 * PSI
        assert led.held("gradients") == 4 * PSI
        assert led.held("optimizer_states") == 12 * PSI == 396
        assert led.held() == 18 * PSI == 594
        # no transient float32 copy: the step reads the buffers themselves
        assert led.peak("gradients") == 4 * PSI
        assert not any(a.name.endswith(".grad32") for a in led.live())
        opt.zero_grad()  # zeroed in place, still held
        assert led.held("gradients") == 4 * PSI
        assert all(p.grad is opt.main_grads[p.name] and not p.grad.any() for p in params)
        opt.release()
        assert led.held("gradients") == led.held("optimizer_states") == 0
        assert all(p.grad is None for p in params)


def test_a_bf16_gpt_holds_18_psi_with_main_grad_and_16_psi_without():
    held = {}
    for main in (True, False):
        with mp.device() as ctx:
            model = GPT(CFG)
            opt = MixedPrecisionOptimizer(AdamW, model.parameters(), lr=1e-3, main_grad=main)
            ids = tokens(2)
            model.loss_and_grad(ids[:-1], ids[1:])
            opt.step()
            held[main] = {c: ctx.ledger.held(c) for c in
                          ("parameters", "gradients", "optimizer_states")}
    assert held[True] == {"parameters": 2 * PSI_GPT, "gradients": 4 * PSI_GPT,
                          "optimizer_states": 12 * PSI_GPT}
    assert held[False] == {"parameters": 2 * PSI_GPT, "gradients": 2 * PSI_GPT,
                           "optimizer_states": 12 * PSI_GPT}
    w, g, k = bytes_per_parameter(Layout())  # the planner's (2, 4, 12), the same 18
    assert sum(held[True].values()) == (w + g + k) * PSI_GPT
    w, g, k = bytes_per_parameter(Layout(fp32_grads=False))
    assert sum(held[False].values()) == (w + g + k) * PSI_GPT


@pytest.mark.parametrize("n", [2, 4])
def test_engines_hold_18_psi_and_the_distributed_optimizers_6_plus_12_over_d(n):
    """DDP with float32 buckets: 18Ψ; ZeRO-1 with float32 gradients (Megatron's distributed
    optimizer): 6Ψ + 12Ψ/N; ZeRO-2: 2Ψ + 16Ψ/N; ZeRO-3: 18Ψ/N — each to the byte, equal to
    minipar.plan's model_state_bytes with grad_bytes=4."""
    ids = tokens(2 * n)

    def program(ctx, stage):
        model = GPT(CFG)
        engine = zero_engine(model, AdamW, stage=stage, lr=1e-3, main_grad=True)
        cols = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]
        model.loss_and_grad(cols[:-1], cols[1:])
        engine.step()
        return {c: ctx.ledger.held(c) for c in ("parameters", "gradients", "optimizer_states")}

    for stage in (0, 1, 2, 3):
        want = model_state_bytes(PSI_GPT, stage, n, grad_bytes=4)
        for held in mp.launch(lambda ctx: program(ctx, stage), n):
            assert held == {c: want[c] for c in held}, stage
    assert model_state_bytes(PSI_GPT, 1, n, grad_bytes=4)["total"] == (6 + 12 / n) * PSI_GPT


# ---- what it removes: the error of accumulating in bf16 ---------------------------------
@pytest.mark.parametrize("k", [64, 128])
def test_float32_accumulation_error_is_a_millionth_of_bf16s(k):
    """k bf16 micro-batch gradients added into p.grad, against their exact (float64) sum:
    bf16 accumulation rounds every partial sum to 8 significant bits (measured 8.0e-3 at 64,
    1.1e-2 at 128, growing with k); the float32 main_grad only to 24 (measured 5.2e-9 and
    8.4e-9). Asserted: the ratio above 1e5 (measured 1.5e6 and 1.3e6)."""
    grads = micro_grads(k)
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    err = {}
    with mp.device():
        for main in (True, False):
            p = Parameter(f"w_{main}", np.zeros(grads[0].shape, BF16))
            MixedPrecisionOptimizer(AdamW, [p], main_grad=main)
            for g in grads:
                p.accumulate(g)
            err[main] = relative(p.grad, exact)
    assert 5e-3 < err[False] < 2e-2
    assert err[True] < 2e-8
    assert err[False] / err[True] > 1e5


def test_bf16_accumulation_error_grows_with_the_micro_batches_and_float32s_does_not():
    grads = micro_grads(128)
    with mp.device():
        p = Parameter("w", np.zeros(grads[0].shape, BF16))
        q = Parameter("q", np.zeros(grads[0].shape, BF16))
        MixedPrecisionOptimizer(AdamW, [q], main_grad=True)
        errs, errs32 = [], []
        exact = np.zeros(grads[0].shape)
        for i, g in enumerate(grads, start=1):
            p.accumulate(g)
            q.accumulate(g)
            exact += g.astype(np.float64)
            if i in (2, 8, 32, 128):
                errs.append(relative(p.grad, exact))
                errs32.append(relative(q.grad, exact))
    assert errs == sorted(errs) and errs[-1] > 4 * errs[0]
    assert max(errs32) < 1e-7 < min(errs)


def test_on_a_gpt_main_grad_leaves_only_the_bf16_compute_error():
    """128 micro-batches of one sequence, a bf16 GPT: against the exact sum of its own bf16
    micro-batch gradients the float32 buffer is off by 6.6e-9 (measured) and bf16
    accumulation by 1.4e-2; against the float64 model's gradient, what is left with
    main_grad is the bf16 forward and backward's own rounding (measured 3.9e-3), and bf16
    accumulation's is 3.6x that (1.4e-2): asserted > 2.5x."""
    cfg = CFG.with_(num_layers=1)
    k = 128
    ids = tokens(k, seed=1)

    def run(dtype, main=False, each=False):
        with mp.device():
            model = GPT(cfg.with_(dtype=dtype))
            opt = (MixedPrecisionOptimizer(AdamW, model.parameters(), main_grad=main)
                   if dtype == "bfloat16" else None)
            total = 0.0
            for i in range(k):
                model.loss_and_grad(ids[:-1, i:i + 1], ids[1:, i:i + 1], loss_scale=1 / k)
                if each:  # this micro-batch's bf16 gradient alone, summed in float64
                    total = total + np.concatenate([p.grad.astype(np.float64).ravel()
                                                    for p in model.parameters()])
                    opt.zero_grad()
            if each:
                return total
            return np.concatenate([p.grad.astype(np.float64).ravel()
                                   for p in model.parameters()])

    exact, f64 = run("bfloat16", each=True), run("float64")
    main, bf16 = run("bfloat16", main=True), run("bfloat16")
    assert relative(main, exact) < 3e-8 < 1e-3 < relative(bf16, exact)
    assert relative(bf16, f64) > 2.5 * relative(main, f64)


# ---- equivalence where the arithmetic allows -----------------------------------------------
def test_one_micro_batch_steps_bit_for_bit_as_without_main_grad():
    """main = 0 + float32(g₁₆) is exact, so one backward's step is the same bits (with
    clipping and, in float16, a loss scale: the unscaling divides the same numbers)."""
    for dtype, scaler in (("bfloat16", None), ("float16", DynamicLossScaler(2.0**8))):
        weights = {}
        for main in (True, False):
            with mp.device():
                params = make_params(np.dtype(dtype) if dtype == "float16" else BF16)
                opt = MixedPrecisionOptimizer(AdamW, params, dtype=dtype, lr=1e-2,
                                              weight_decay=0.1, max_grad_norm=0.5,
                                              loss_scaler=scaler and DynamicLossScaler(
                                                  scaler.scale), main_grad=main)
                for step in range(3):
                    rng = np.random.default_rng(step)
                    for p in params:
                        p.accumulate((rng.standard_normal(p.shape) * opt.loss_scale)
                                     .astype(p.data.dtype))
                    assert opt.step()
                    opt.zero_grad()
                weights[main] = [p.data.copy() for p in params]
                masters = [opt.masters[p.name].data.copy() for p in params]
                weights[main] += masters
        for a, b in zip(weights[True], weights[False]):
            np.testing.assert_array_equal(a.view(np.uint16) if a.itemsize == 2 else a,
                                          b.view(np.uint16) if b.itemsize == 2 else b)


def test_float16_overflow_is_skipped_and_the_scale_backs_off_with_main_grad():
    with mp.device():
        params = make_params(np.float16)
        scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=2)
        opt = MixedPrecisionOptimizer(SGD, params, dtype="float16", lr=0.1,
                                      loss_scaler=scaler, main_grad=True)
        before = [opt.masters[p.name].data.copy() for p in params]
        with np.errstate(over="ignore"):  # 2·S = 131072 overflows float16 (max 65504)
            for p in params:
                p.accumulate((np.full(p.shape, 2.0) * opt.loss_scale).astype(np.float16))
        assert opt.step() is False and opt.loss_scale == 2.0**15
        assert all(np.array_equal(opt.masters[p.name].data, w) for p, w in zip(params, before))
        opt.zero_grad()
        for p in params:  # a clean step: main_grad / S is the true gradient, 0.5
            p.accumulate((np.full(p.shape, 0.5) * opt.loss_scale).astype(np.float16))
        assert opt.step() is True
        for p, w in zip(params, before):
            np.testing.assert_allclose(opt.masters[p.name].data, w - 0.1 * 0.5, rtol=1e-6)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_engines_with_main_grad_equal_one_device_with_main_grad(stage, n):
    """The global batch of 8 sequences in 4 micro-batches on one device, against n ranks of
    4/n micro-batches each: the same bf16 micro-batch gradients (scaled by powers of two),
    summed in float32 on both sides, give the same bits at these sizes; the weights after
    the step too."""
    ids = tokens(8, seed=2)
    with mp.device():
        model = GPT(CFG)
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), lr=1e-3, main_grad=True)
        for i in range(4):
            cols = ids[:, 2 * i:2 * i + 2]
            model.loss_and_grad(cols[:-1], cols[1:], loss_scale=1 / 4)
        grads = {p.name: p.grad.copy() for p in model.parameters()}
        opt.step()
        weights = {p.name: p.data.copy() for p in model.parameters()}

    def program(ctx):
        model = GPT(CFG)
        engine = zero_engine(model, AdamW, stage=stage, lr=1e-3, main_grad=True)
        per = 8 // n
        mine = ids[:, ctx.rank * per:(ctx.rank + 1) * per]
        micro = [(mine[:-1, j:j + 2], mine[1:, j:j + 2]) for j in range(0, per, 2)]
        accumulate_gradients(model, engine, micro)
        got = engine.full_grads()
        engine.step()
        return got, {k[len("param/"):]: v for k, v in engine.full_state_dict().items()
                     if k.startswith("param/")}

    for got, w in mp.launch(program, n):
        for name, g in grads.items():
            assert got[name].dtype == np.float32
            np.testing.assert_array_equal(got[name], g)
            np.testing.assert_array_equal(w[name], weights[name].astype(np.float32))


def test_three_ranks_equal_one_device_that_sums_in_float32_and_divides_by_three():
    """At n = 3, DDP's float32 average ((g₀ + g₁) + g₂)/3 is what one device with main_grad
    computes from the same three micro-batches summed unscaled, then divided by 3: the same
    bits. Without main_grad the bf16 all-reduce rounds each partial sum and the quotient to
    bf16: about 1e-3 away from the float64 average of the ranks' bf16 gradients."""
    ids = tokens(6, seed=3)
    with mp.device():
        model = GPT(CFG)
        opt = MixedPrecisionOptimizer(AdamW, model.parameters(), main_grad=True)
        for i in range(3):
            cols = ids[:, 2 * i:2 * i + 2]
            model.loss_and_grad(cols[:-1], cols[1:])
        ref = {name: g / np.float32(3) for name, g in opt.main_grads.items()}

    def program(ctx, main):
        model = GPT(CFG)
        engine = DistributedDataParallel(model, AdamW, main_grad=main)
        cols = ids[:, 2 * ctx.rank:2 * ctx.rank + 2]
        model.loss_and_grad(cols[:-1], cols[1:])
        return engine.full_grads()

    got = mp.launch(lambda ctx: program(ctx, True), 3)
    for g in got:
        for name, want in ref.items():
            np.testing.assert_array_equal(g[name], want)
    bf16 = mp.launch(lambda ctx: program(ctx, False), 3)[0]
    flat = lambda d: np.concatenate([np.asarray(d[k], np.float64).ravel() for k in ref])
    assert 1e-4 < relative(flat(bf16), flat(ref)) < 1e-2


# ---- the reduction over the ranks -----------------------------------------------------------
def test_the_all_reduce_adds_in_float32_and_sends_twice_the_bytes():
    """DDP over 8 ranks: each rank's bf16 gradient of the same batch columns; float32
    buckets all-reduce in float32 (their error against the float64 sum of the ranks' bf16
    gradients about 1e-8), bf16 buckets in bf16 (about 1e-3); the float32 all-reduce sends
    2x the bytes."""
    n = 8
    ids = tokens(n, seed=4)

    def program(ctx, main):
        model = GPT(CFG)
        engine = DistributedDataParallel(model, AdamW, main_grad=main)
        cols = ids[:, ctx.rank:ctx.rank + 1]
        start = ctx.trace.bytes_sent()
        model.loss_and_grad(cols[:-1], cols[1:])
        sent = ctx.trace.bytes_sent() - start
        return engine.full_grads(), sent

    def local(rank):
        with mp.device():
            model = GPT(CFG)
            cols = ids[:, rank:rank + 1]
            model.loss_and_grad(cols[:-1], cols[1:])
            return {p.name: p.grad.astype(np.float64) for p in model.parameters()}

    locals_ = [local(r) for r in range(n)]
    exact = {k: sum(g[k] for g in locals_) / n for k in locals_[0]}
    (g32, sent32), (g16, sent16) = (mp.launch(lambda ctx: program(ctx, m), n)[0]
                                    for m in (True, False))
    flat = lambda d: np.concatenate([np.asarray(d[k], np.float64).ravel() for k in exact])
    e32, e16 = relative(flat(g32), flat(exact)), relative(flat(g16), flat(exact))
    assert e32 <= 1e-7 < 1e-4 < e16 < 1e-2  # e32 is 0 here: 8 bf16 values sum exactly
    assert sent32 == 2 * sent16 == 2 * 2 * (n - 1) / n * 2 * PSI_GPT


# ---- refusals and repairs -------------------------------------------------------------------
def test_main_grad_is_refused_where_it_means_nothing():
    with mp.device():
        with pytest.raises(TypeError, match="main_grad is True"):
            MixedPrecisionOptimizer(AdamW, make_params(), main_grad="yes")
        model = GPT(CFG.with_(dtype="float64"))
        with pytest.raises(ValueError, match="main_grad=True keeps float32 gradients"):
            DistributedDataParallel(model, AdamW, main_grad=True)
    with mp.device():
        with pytest.raises(TypeError, match="main_grad is True"):
            ZeroEngine(GPT(CFG), AdamW, main_grad=1)


def test_a_freed_main_grad_is_named_at_the_step_and_zero_grad_repairs_it():
    with mp.device() as ctx:
        params = make_params()
        opt = MixedPrecisionOptimizer(AdamW, params, lr=1e-2, main_grad=True)
        params[0].free_grad()  # gives the buffer's bytes back, as a model's zero_grad would
        assert ctx.ledger.held("gradients") == 4 * (PSI - 24)
        params[0].accumulate(np.ones((4, 6), BF16))  # a bf16 gradient of its own
        with pytest.raises(RuntimeError, match="no longer its float32 main_grad"):
            opt.step()
        opt.zero_grad()
        assert params[0].grad is opt.main_grads["w1"] and params[0].grad.dtype == np.float32
        assert ctx.ledger.held("gradients") == 4 * PSI
        for p in params:
            p.accumulate(np.ones(p.shape, BF16))
        assert opt.step()


def test_an_existing_gradient_is_kept_and_the_state_dict_is_unchanged():
    with mp.device():
        params = make_params()
        for p in params:
            p.accumulate(np.full(p.shape, 0.25, BF16))
        opt = MixedPrecisionOptimizer(AdamW, params, lr=1e-2, main_grad=True)
        assert all(np.array_equal(p.grad, np.full(p.shape, 0.25, np.float32)) for p in params)
        opt.step()
        sd = opt.state_dict()
        assert set(sd) == {"inner", "master", "loss_scaler", "steps_taken", "steps_skipped"}
    with mp.device():
        fresh = make_params(seed=5)
        other = MixedPrecisionOptimizer(AdamW, fresh, lr=1e-2, main_grad=True)
        other.load_state_dict(sd)
        assert all(np.array_equal(p.data.view(np.uint16), q.data.view(np.uint16))
                   for p, q in zip(fresh, params))
        assert "main_grad=True" in repr(other)


@pytest.mark.parametrize("dims, kw", [
    (dict(dp_replicate=2, tp=2), dict(zero=0, sequence_parallel=True)),
    (dict(dp_shard=2, pp=2), dict(zero=1, schedule="1f1b", microbatches=2)),
])
def test_parallelize_passes_main_grad_to_the_data_parallel_engine(dims, kw):
    """Composed with tensor or pipeline parallelism through parallelize's engine knobs: the
    rank's gradient buffers are float32 (twice the bf16 bytes, to the byte), and the bf16
    run trains as without it (the losses of three steps within 1 %)."""
    from minipar.parallel import ParallelDims, parallelize
    cfg = CFG.with_(vocab_size=16, seq_len=4, hidden=8, num_layers=4)
    ids = tokens(8, seed=5)[:4, :8] % 16

    def program(ctx, main):
        run = parallelize(cfg, ParallelDims(**dims), lr=1e-2, main_grad=main, **kw)
        losses = [run.train_step(ids, ids) for _ in range(3)]
        return losses, run.engine.main_grad, run.engine.grad_dtype, ctx.ledger.held("gradients")

    with_main, without = (mp.launch(lambda ctx: program(ctx, m), 4) for m in (True, False))
    for (l32, on, dt32, g32), (l16, off, dt16, g16) in zip(with_main, without):
        assert on and not off and dt32 == np.float32 and dt16 == BF16
        assert g32 == 2 * g16 > 0
        np.testing.assert_allclose(l32, l16, rtol=1e-2)
