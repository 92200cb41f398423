"""plan.rank_memory: one rank's memory by category, against published figures, against its
own laws (hypothesis), and against minipar's ledger on small runs.

Published figures: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (Table 3's layouts, Figure 1's GiB per GPU, Figure 7's shares), and
Rajbhandari et al. 2020, "ZeRO" (Figure 1). Expected values are written out from the papers,
never obtained from the function under test.
"""

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import minipar as mp
from minipar.nn import GPTConfig
from minipar.nn.moe import MoEConfig
from minipar.parallel import ParallelDims, parallelize
from minipar.plan import activation_bytes_per_layer, zero_figure1
from minipar.plan.layout import Layout
from minipar.plan.presets import CLUSTERS, MODELS, ModelSpec
from minipar.plan.rank_memory import in_flight, layer_activation_bytes, rank_memory
from minipar.plan.rank_states import layer_on_rank, rank_parameters

GiB = 2 ** 30
# Korthikanti et al. 2022, Table 3: seq 2048, micro-batch 4 (22B) or 1, dp 1; 175B and 530B
# interleaved with 3 chunks a rank
TABLE3 = {"22b": dict(tp=8, pp=1, global_batch=4, micro_batch=4),
          "175b": dict(tp=8, pp=8, global_batch=64, schedule="interleaved_1f1b", chunks=3),
          "530b": dict(tp=8, pp=35, global_batch=280, schedule="interleaved_1f1b", chunks=3),
          "1t": dict(tp=8, pp=64, global_batch=512)}
SP_SELECTIVE = dict(sequence_parallel=True, recompute="selective")


def states(r) -> float:
    return r.parameters.steady + r.gradients.steady + r.optimizer_states.steady


# ---- Korthikanti et al. 2022, Figure 1: memory per GPU, GiB ----------------------------
@pytest.mark.parametrize("name, published", [
    ("22b", 45.5625), ("175b", 45.5625), ("530b", 31.640625), ("1t", 32.958984375)])
def test_figure1_parameters_and_optimizer_states(name, published):
    """Korthikanti et al. 2022, Figure 1: the figure counts the layers' weight matrices,
    12·l·h²/(t·p) a GPU, at 18 bytes each (Megatron's fp32 gradient copy: 2 + 4 + 12);
    scope="layers" is that count, exactly. The default scope counts the whole first stage
    (biases, norms, the embedding ceil(V/t)·h and positions s·h): more, by what the figure
    leaves out."""
    m, layout = MODELS[name], Layout(**TABLE3[name])
    l, h, t, p = m.layers, m.hidden, layout.tp, layout.pp
    assert 12 * l * h * h // (t * p) * 18 / GiB == published  # the figure's own count
    paper = rank_memory(m, layout, scope="layers")
    assert states(paper) / GiB == pytest.approx(published, rel=0.01)
    assert states(paper) / GiB == published  # exactly, in fact
    whole = states(rank_memory(m, layout))
    ends = (m.vocab // t * h + m.seq_len * h) * 18  # the embedding on the first stage
    assert whole > states(paper) + ends
    assert 1.03 < whole / GiB / published < 1.12  # 22B +3.4 %, 175B +3.9 %, 530B +9.2 %, 1T +11 %
    # Calculon's count, 16 bytes a parameter (ZeRO's 2 + 2 + 12), is 16/18 of the figure
    ddp16 = rank_memory(m, Layout(**TABLE3[name], fp32_grads=False), scope="layers")
    assert states(ddp16) / GiB == published * 16 / 18


@pytest.mark.parametrize("name, none, sp_selective", [
    ("22b", 59.25, 9.5625), ("175b", 66.84375, 12.3515625),
    ("530b", 114.0234375, 23.076171875), ("1t", 131.25, 26.5625)])
def test_figure1_activations(name, none, sp_selective):
    """Korthikanti et al. 2022, Figure 1: activations of the first stage, no recompute (TP
    only: sbh(10 + 24/t + 5as/(ht)) a layer) and SP + selective (34sbh/t), times L layers'
    worth, times 1 + (p - 1)/(p·v) interleaved; the figure counts the layers alone."""
    m = MODELS[name]
    for kw, published in ((dict(), none), (SP_SELECTIVE, sp_selective)):
        layers = rank_memory(m, Layout(**TABLE3[name], **kw), scope="layers").activations
        assert layers.steady / GiB == pytest.approx(published, rel=0.01)
        assert layers.steady / GiB == published  # exactly, in fact
        # the default adds the embedding's dropout mask (and, at pp = 1, the head): at most
        # 2.5 % here (22B with SP + selective: the head's float32 logits 4sbV/t)
        whole = rank_memory(m, Layout(**TABLE3[name], **kw)).activations
        assert 1 < whole.steady / layers.steady < 1.025


def test_figure1_activations_by_hand_for_175b():
    """Korthikanti et al. 2022: 175B, s = 2048, b = 1, h = 12288, a = 96, t = 8, p = 8, v = 3:
    sbh(10 + 3 + 10) a layer, 96 layers' worth, times 1 + 7/24; the first rank holds 31
    chunk passes of 4 layers at once (2(p - 1) + (v - 1)p warm-up forwards and one more)."""
    r = rank_memory(MODELS["175b"], Layout(**TABLE3["175b"]), scope="layers")
    sbh = 2048 * 1 * 12288
    assert r.layer_activations == sbh * (10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8))
    assert r.in_flight == 31 == 8 * 3 + 8 - 1
    assert r.activations.steady == 23 * sbh * 96 * (1 + 7 / 24) == 31 * 4 * 23 * sbh


@pytest.mark.parametrize("name, shares", [
    ("530b", {"sp": 58.3, "selective": 61.9, "sp+selective": 20.2, "full": 9.5}),
    ("1t", {"sp": 58.3, "selective": 61.9, "sp+selective": 20.2, "full": 9.5}),
    ("22b", {"sp": 66.8})])
def test_figure7_shares_of_the_tensor_parallel_baseline(name, shares):
    """Korthikanti et al. 2022, Figure 7: activation memory as a share of TP alone;
    5as/(ht) = 8 for 530B and 1T, 13.33 for 22B. Within 0.5 percentage points."""
    m = MODELS[name]
    kws = {"sp": dict(sequence_parallel=True), "selective": dict(recompute="selective"),
           "sp+selective": SP_SELECTIVE, "full": dict(recompute="full")}

    def act(**kw):
        return rank_memory(m, Layout(**TABLE3[name], **kw), scope="layers").activations.steady

    base = act()
    for key, published in shares.items():
        assert 100 * act(**kws[key]) / base == pytest.approx(published, abs=0.5), key


# ---- ZeRO, Figure 1: 7.5B parameters, N_d = 64, K = 12 ---------------------------------
def test_zero_figure1_exactly():
    """Rajbhandari et al. 2020, Figure 1: 120, 31.4, 16.6, 1.88 GB. A model of exactly
    7.5e9 weights (one layer: 12·h² with h = 25,000) on dp = 64 with 16-bit gradients."""
    m = ModelSpec("7.5B", 1, 25_000, 8, 100_000, 64, 8)
    assert rank_parameters(m, Layout(), "layers").total == 12 * 25_000 ** 2 == 7.5e9
    got = [states(rank_memory(m, Layout(dp=64, global_batch=64, zero=z, fp32_grads=False),
                              scope="layers")) for z in range(4)]
    assert got == [r["bytes"] for r in zero_figure1()]  # plan.zero's figure, reused
    assert [g / 1e9 for g in got] == [120.0, 31.40625, 16.640625, 1.875]
    assert [round(g / 1e9, 2) for g in got] == [120.0, 31.41, 16.64, 1.88]
    # Megatron's distributed optimizer is ZeRO-1 by another name
    dist = Layout(dp=64, global_batch=64, distributed_optimizer=True, fp32_grads=False)
    assert states(rank_memory(m, dist, scope="layers")) == got[1]


# ---- layouts the model cannot split -----------------------------------------------------
@pytest.mark.parametrize("model, kw, match", [
    ("22b", dict(tp=3), r"64 heads, which tp = 3 cannot split.*use tp in \[1, 2, 4, 8"),
    ("llama3-70b", dict(tp=16), r"8 key-value heads, which tp = 16.*num_query_groups"),
    ("22b", dict(pp=5, global_batch=5), r"48 layers do not split into pp x chunks = 5 x 1"),
    ("175b", dict(pp=8, chunks=5, schedule="interleaved_1f1b", global_batch=8),
     r"96 layers do not split into pp x chunks = 8 x 5 = 40 .*expected pp x chunks in"),
    ("mixtral-8x7b", dict(dp=3, ep=3, global_batch=3), r"8 experts do not split over ep = 3"),
    ("22b", dict(dp=2, ep=2, global_batch=2), r"ep = 2 splits experts, but 22B is dense"),
    ("22b", dict(cp=3), r"s = 2048 must split over cp = 3"),
])
def test_a_layout_the_model_cannot_split_is_refused_naming_the_fix(model, kw, match):
    with pytest.raises(ValueError, match=match):
        rank_memory(MODELS[model], Layout(**kw))


def test_other_refusals():
    with pytest.raises(TypeError, match="takes a ModelSpec.*plan.moe"):
        rank_memory(MODELS["deepseek-v3"], Layout())
    with pytest.raises(ValueError, match="scope must be one of"):
        rank_memory(MODELS["22b"], Layout(), scope="all")
    with pytest.raises(ValueError, match="multiple of pp = 4"):  # the schedule's own rule
        rank_memory(MODELS["22b"], Layout(pp=4, chunks=2, schedule="interleaved_1f1b",
                                          global_batch=6))


# ---- the laws, on drawn models and layouts ----------------------------------------------
@st.composite
def gpts(draw, moe=False):
    """A small Megatron-style GPT (or GQA / SwiGLU / MoE variant) and its divisors."""
    heads = draw(st.sampled_from([4, 8, 16]))
    d = draw(st.sampled_from([8, 16]))
    h, layers = heads * d, draw(st.sampled_from([2, 4, 8, 12]))
    kv = draw(st.sampled_from([None, heads // 2, heads // 4]))
    swiglu = draw(st.booleans())
    experts = draw(st.sampled_from([4, 8])) if moe else 0
    return ModelSpec("drawn", layers, h, heads, 4 * h, draw(st.sampled_from([64, 1000])),
                     draw(st.sampled_from([16, 64])), kv_heads=kv, swiglu=swiglu,
                     biases=not swiglu, layernorm=not swiglu, learned_positions=not swiglu,
                     experts=experts, top_k=2 if experts else 0,
                     expert_ffn=2 * h if experts else 0)


def model_states_bytes(m, **kw):
    return states(rank_memory(m, Layout(**kw)))


@given(m=gpts(), data=st.data())
def test_memory_falls_as_tp_pp_and_dp_sharding_grow(m, data):
    t = data.draw(st.sampled_from([1, 2]))
    assume(m.kv % (2 * t) == 0)
    for kw in (dict(), dict(zero=1), dict(zero=3)):
        one = model_states_bytes(m, tp=t, **kw)
        assert model_states_bytes(m, tp=2 * t, **kw) < one
        assert model_states_bytes(m, tp=t, pp=2, global_batch=2, **kw) < one
        two = model_states_bytes(m, tp=t, dp=2, global_batch=2, **kw)
        four = model_states_bytes(m, tp=t, dp=4, global_batch=4, **kw)
        assert (four < two < one) if kw else (four == two == one)  # DDP replicates
    # activations: tp divides what lies inside the blocks (and with SP the rest)
    for sp in (False, True):
        small = rank_memory(m, Layout(tp=2 * t, sequence_parallel=sp)).activations.steady
        assert small < rank_memory(m, Layout(tp=t, sequence_parallel=sp and t > 1)
                                   ).activations.steady


@given(m=gpts(), dp=st.sampled_from([1, 2, 8]),
       fp32_grads=st.booleans(), precision=st.sampled_from(["bf16", "fp32"]))
def test_zero_stages_order(m, dp, fp32_grads, precision):
    got = [model_states_bytes(m, dp=dp, global_batch=dp, zero=z, fp32_grads=fp32_grads,
                              precision=precision) for z in range(4)]
    assert got[3] <= got[2] <= got[1] <= got[0]
    assert (got[3] < got[2] < got[1] < got[0]) == (dp > 1)


@given(m=gpts(), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]),
       dropout=st.booleans(), cp=st.sampled_from([1, 2]))
def test_recompute_order_and_peaks_above_steady(m, tp, pp, dropout, cp):
    assume(m.kv % tp == 0)
    lay = dict(tp=tp, pp=pp, cp=cp, global_batch=4)
    got = {r: rank_memory(m, Layout(recompute=r, **lay), dropout=dropout)
           for r in ("none", "selective", "full")}
    act = {r: g.activations for r, g in got.items()}
    assert act["full"].steady < act["selective"].steady <= act["none"].steady
    assert act["full"].peak <= act["selective"].peak <= act["none"].peak
    if tp > 1:
        sp = rank_memory(m, Layout(sequence_parallel=True, **lay), dropout=dropout)
        assert sp.activations.steady < act["none"].steady
    for r in got.values():
        for term in r.terms().values():
            assert term.peak >= term.steady >= 0
        assert r.peak >= r.steady


@given(m=gpts(moe=True), ep=st.sampled_from([1, 2, 4]))
def test_experts_divide_by_ep(m, ep):
    one = rank_parameters(m, Layout(dp=4, global_batch=4))
    split = rank_parameters(m, Layout(dp=4, ep=ep, global_batch=4))
    assert split.dense == one.dense and split.expert * ep == one.expert


@pytest.mark.parametrize("name", sorted(n for n in MODELS if n != "deepseek-v3"))
def test_one_rank_holds_the_presets_exact_counts(name):
    """At t = ep = 1 a layer is ModelSpec.layer_parameters; at pp = 1 the rank holds
    ModelSpec.parameters(); the layers' matrices of a GPT are 12h² a layer."""
    m = MODELS[name]
    dense, expert, _ = layer_on_rank(m, 1, 1)
    assert dense + expert == m.layer_parameters()
    assert rank_parameters(m, Layout()).total == m.parameters()
    if name in ("22b", "175b", "530b", "1t") or name.startswith("sc21"):
        assert rank_parameters(m, Layout(), "layers").total == 12 * m.layers * m.hidden ** 2


@given(s=st.sampled_from([8, 16, 64]), b=st.sampled_from([1, 2]), heads=st.sampled_from([2, 4]),
       d=st.sampled_from([4, 8]), t=st.sampled_from([1, 2]), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]), act=st.sampled_from([2, 4, 8]),
       dropout=st.booleans())
def test_a_gpt_layer_is_plan_memory_formula(s, b, heads, d, t, sp, recompute, act, dropout):
    """The generalised per-layer figure equals plan.memory's Korthikanti et al. formula on a
    GPT (q = kv = h, f = 4h, GeLU)."""
    h = heads * d
    m = ModelSpec("gpt", 2, h, heads, 4 * h, 64, s)
    assert layer_activation_bytes(m, s, b, t, sp and t > 1, recompute, act, dropout) == \
        activation_bytes_per_layer(s, b, h, heads, recompute, act, dropout, t, sp and t > 1)


@given(p=st.integers(1, 8), k=st.integers(1, 6), v=st.integers(1, 4))
def test_passes_in_flight_follow_the_closed_forms(p, k, v):
    """The first rank holds min(p, m) micro-batches under 1F1B, m under GPipe, and
    min(p·v + p - 1, m·v) chunk passes interleaved, m a multiple of p (Narayanan et al.
    2021, section 2.2, Megatron's warm-up 2(p - 1) + (v - 1)p; Korthikanti et al. 2022,
    the first stage holds L(1 + (p - 1)/(p·v)) layers' worth)."""
    count = lambda lay: in_flight(lay, lambda stage: 1.0)[1]  # noqa: E731
    m = k * p
    assert count(Layout(pp=p, global_batch=k)) == min(p, k)
    assert count(Layout(pp=p, global_batch=k, schedule="gpipe")) == k
    assert count(Layout(pp=p, global_batch=m, schedule="interleaved_1f1b", chunks=v)) == \
        min(p * v + p - 1, m * v)


# ---- against minipar's ledger on small runs ---------------------------------------------
def ledger(cfg: GPTConfig, lay: Layout, steps: int = 2):
    """Rank 0's ledger (the first pipeline rank): held after the last step, and peaks."""
    dims = ParallelDims(dp_replicate=lay.dp if lay.zero == 0 else 1,
                        dp_shard=1 if lay.zero == 0 else lay.dp, tp=lay.tp, pp=lay.pp,
                        ep=lay.ep)
    pipe = dict(schedule=lay.schedule, microbatches=lay.microbatches,
                chunks=lay.chunks) if lay.pp > 1 else {}
    ids, tgt = np.random.default_rng(0).integers(0, cfg.vocab_size,
                                                 (2, cfg.seq_len, lay.global_batch))

    def program(ctx):
        run = parallelize(cfg, dims, zero=lay.zero, sequence_parallel=lay.sequence_parallel,
                          lr=1e-2, placement="any", **pipe)
        ctx.ledger.reset_peak()  # the build's full-shape initialisation is not a step's
        for _ in range(steps):
            run.train_step(ids, tgt)
        return ({c: ctx.ledger.held(c) for c in mp.CATEGORIES},
                {c: ctx.ledger.peak(c) for c in mp.CATEGORIES})

    return mp.launch(program, dims.world_size)[0]


TINY = dict(vocab_size=32, seq_len=8, hidden=16, num_heads=4, num_layers=4, dropout=0.1)
SPEC = ModelSpec("tiny", 4, 16, 4, 64, 32, 8)  # the same GPT: GeLU 4h, biases, untied
LAYOUTS = [dict(global_batch=2, micro_batch=2), dict(dp=2, global_batch=4, micro_batch=2),
           dict(tp=2, sequence_parallel=True, global_batch=2, micro_batch=2),
           dict(pp=2, global_batch=4), dict(pp=2, global_batch=4, schedule="gpipe"),
           dict(pp=2, tp=2, global_batch=4, schedule="interleaved_1f1b", chunks=2),
           dict(pp=2, tp=2, dp=2, zero=1, global_batch=8)]
ZERO = [dict(dp=2, zero=z, global_batch=4, micro_batch=2) for z in (1, 2, 3)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype, precision, kw", [("float32", "fp32", kw) for kw in LAYOUTS + ZERO]
                         + [("bfloat16", "bf16", kw) for kw in LAYOUTS if "zero" not in kw])
def test_model_states_equal_the_ledger_to_the_byte(dtype, precision, kw):
    """Parameters, gradients and optimizer states of the first pipeline rank: held after a
    step = steady, the ledger's peaks = peak (ZeRO-2/3's unreduced gradients of the ends and
    two blocks, ZeRO-3's gathered ends and block, bf16's float32 copy of the largest
    gradient in the step). Under ZeRO with 16-bit gradients the step copies a piece of a
    shard, not a whole tensor: the formula is then a bound, so ZeRO is checked in float32."""
    lay = Layout(precision=precision, fp32_grads=False, **kw)
    held, peak = ledger(GPTConfig(**TINY, dtype=dtype), lay)
    r = rank_memory(SPEC, lay)
    for c in ("parameters", "gradients", "optimizer_states"):
        assert (held[c], peak[c]) == (getattr(r, c).steady, getattr(r, c).peak), c


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", ZERO + [LAYOUTS[-1]])
def test_zero_with_16_bit_gradients_stays_under_the_bound(kw):
    """bf16 under ZeRO: steady to the byte; the gradients' peak at most the formula's (the
    step's float32 copy is of the largest piece of the rank's shard, at most a tensor)."""
    lay = Layout(fp32_grads=False, **kw)
    held, peak = ledger(GPTConfig(**TINY, dtype="bfloat16"), lay)
    r = rank_memory(SPEC, lay)
    for c in ("parameters", "gradients", "optimizer_states"):
        assert held[c] == getattr(r, c).steady and peak[c] <= getattr(r, c).peak, c


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dp, ep", [(2, 2), (4, 4)])
def test_experts_on_the_ledger(dp, ep):
    """A mixture of experts over dp x ep (DDP): the router and E/ep experts a rank."""
    cfg = GPTConfig(**{**TINY, "num_layers": 2, "dropout": 0.0}, dtype="float32",
                    moe=MoEConfig(num_experts=4, top_k=2))
    spec = ModelSpec("tiny-moe", 2, 16, 4, 64, 32, 8, experts=4, top_k=2, expert_ffn=64)
    lay = Layout(dp=dp, ep=ep, global_batch=dp, precision="fp32")
    held, peak = ledger(cfg, lay, steps=1)
    r = rank_memory(spec, lay, dropout=False)
    for c in ("parameters", "gradients", "optimizer_states"):
        assert held[c] == peak[c] == getattr(r, c).steady, c


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype, precision", [("float32", "fp32"), ("bfloat16", "bf16")])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("kw", [dict(global_batch=2, micro_batch=2),
                                dict(tp=2, sequence_parallel=True, global_batch=2, micro_batch=2),
                                dict(pp=2, global_batch=4),
                                dict(pp=2, tp=2, global_batch=4, schedule="gpipe")])
def test_activations_against_the_ledger(dtype, precision, recompute, kw):
    """The ledger's activation peak = the formula's, plus what minipar's GPT keeps that
    Megatron's (the formula) does not, minus what it keeps that Megatron's does not:
    - the embedding keeps the token ids and position ids (int64) and the vocabulary-parallel
      out-of-range mask (1 byte): 17 bytes a token of every stage-0 pass held;
    - the head (pp = 1; freed before a layer's rerun) keeps its logits in the
      model's dtype, not float32 ((4 - e)·sbV/t less), and adds the log-sum-exp (float32),
      the local target indices (int64) and two 1-byte masks: 14 bytes a token;
    - a selective rerun puts the softmax output and its mask on the ledger, not the dropped
      probabilities (a temporary of the backward): e·a·s²·b/t less.
    s = 32 > h = 8 makes the selective rerun outgrow what the backward frees before it."""
    cfg = GPTConfig(**{**TINY, "seq_len": 32, "hidden": 8}, dtype=dtype, recompute=recompute)
    spec = ModelSpec("tiny", 4, 8, 4, 32, 32, 32)
    lay = Layout(precision=precision, fp32_grads=False, recompute=recompute, **kw)
    _, peak = ledger(cfg, lay, steps=1)
    r = rank_memory(spec, lay)
    e, t, sb = (4 if precision == "fp32" else 2), lay.tp, 32 * lay.micro_batch
    first_stage = in_flight(lay, lambda stage: float(stage == 0))[0]  # stage-0 passes held
    expected = r.activations.peak + 17 * sb * first_stage
    rerun = r.activations.peak > r.activations.steady  # the peak is in a layer's rerun
    if lay.pp == 1 and not rerun:  # the peak at the forward's end, the head held
        expected += 14 * sb - (4 - e) * sb * 32 // t
    if recompute == "selective" and rerun:
        expected -= e * 4 * 32 * sb // t
    assert peak["activations"] == expected


@pytest.mark.timeout(60)
def test_communication_buffers_on_the_ledger():
    """tp: one collective's output [s, b, h]; DDP: one bucket (here every gradient)."""
    for kw in (dict(tp=2), dict(tp=2, sequence_parallel=True), dict(dp=2, global_batch=4)):
        lay = Layout(precision="fp32", micro_batch=2, **{"global_batch": 2, **kw})
        _, peak = ledger(GPTConfig(**TINY, dtype="float32"), lay, steps=1)
        r = rank_memory(SPEC, lay)
        assert peak["comm_buffers"] == r.comm_buffers.peak
        assert r.comm_buffers.steady == 0


# ---- the report ---------------------------------------------------------------------------
def test_report_formulas_and_fit():
    r = rank_memory(MODELS["175b"], Layout(**TABLE3["175b"], **SP_SELECTIVE), CLUSTERS["a100"])
    text = r.report()
    for piece in ("parameters", "activations", "comm_buffers", "capacity 74.51 GiB",
                  "31 × 4 ×", "interleaved 1F1B: p·v + p − 1 = 31", "4 B (gradients)",
                  "Ψ_r = L/p · layer + ends = 12 ×", "embedding ceil(V/t)·h = 78,643,200"):
        assert piece in text, piece
    assert r.fits is (r.peak <= 80 * GiB)
    assert r.peak == sum(t.peak for t in r.terms().values())
    assert rank_memory(MODELS["22b"], Layout()).fits is None
