"""The incident cases reproduce their mechanism, on the numbers they return."""

import contextlib
from fractions import Fraction
import io

import pytest

from minipar.cli import main
from minipar.programs.incidents import INCIDENTS, get
from minipar.programs.incidents import pipeline_bubble, tp_across_nodes, zero3_recompute
from minipar.plan import best_segment, model_flops, segments_activation_bytes
from minipar.runtime.topology import Topology


def through_the_command(name: str, module):
    """`minipar incident NAME`, run once through the command: (what module.run returned,
    the lines it printed, its exit status)."""
    returned = []
    real = module.run

    def recording(*args, **kwargs):
        returned.append(real(*args, **kwargs))
        return returned[-1]

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp_, contextlib.redirect_stdout(out):
        mp_.setattr(module, "run", recording)
        code = main(["incident", name])
    assert len(returned) == 1, f"minipar incident {name} no longer calls {module.__name__}.run"
    return returned[0], out.getvalue().splitlines(), code


@pytest.fixture(scope="module")
def case_c():
    return through_the_command("c", zero3_recompute)


@pytest.mark.timeout(120)
def test_zero3_without_a_limit_peaks_above_zero2(case_c):
    s = case_c[0]["scenarios"]
    assert s["zero3"]["total"] > s["zero2"]["total"]
    # what piles up is gathered weights: the run-ahead all-gathers (comm) hold more than
    # the model's weights minus one block, and ZeRO-3's own weights are a quarter of ZeRO-2's
    assert s["zero3"]["peak"]["comm_buffers"] > 0.9 * s["zero2"]["peak"]["parameters"]
    assert s["zero3"]["peak"]["parameters"] < 0.35 * s["zero2"]["peak"]["parameters"]


@pytest.mark.timeout(120)
def test_the_limit_brings_the_peak_below_zero2_and_both_fixes_keep_it_there(case_c):
    s = case_c[0]["scenarios"]
    for fixed in ("zero3_limit", "zero3_both"):
        assert s[fixed]["total"] < s["zero3"]["total"], fixed
        assert s[fixed]["total"] < s["zero2"]["total"], fixed
        assert s[fixed]["vs_zero2"] < 1.0
    # the limit bounds the gathered weights: at most 2 blocks in flight
    assert s["zero3_limit"]["peak"]["comm_buffers"] < 0.1 * s["zero3"]["peak"]["comm_buffers"]


@pytest.mark.timeout(120)
def test_segments_of_two_change_the_activations_by_the_formula(case_c):
    """The seed's second fix, measured: every row's activation peak is the plan's formula
    (plan/training_memory.py); segments of 2 keep L/2 inputs instead of L but rerun 2
    layers at once, and lower the peak exactly when L > 2A/I, by (L/2 - 1) I + 2A minus
    (L - 1) I + A; the FLOPs do not change; ZeRO-3 holds the segment's 2 blocks whole."""
    result = case_c[0]
    s, t, L = result["scenarios"], result["terms"], result["model"]["layers"]
    for key, r in s.items():
        assert r["peak"]["activations"] == r["planned_activations"], key
    per, seg = s["zero3"]["peak"]["activations"], s["zero3_segments"]["peak"]["activations"]
    I, A = t["I"], t["A"]
    assert seg - per == segments_activation_bytes(L, 2, A, I) - segments_activation_bytes(
        L, 1, A, I) == (L // 2 - 1) * I + 2 * A - ((L - 1) * I + A)
    assert (seg < per) == (L > 2 * A / I) and t["threshold"] == 2 * A / I
    assert s["zero3_both"]["peak"]["activations"] == seg
    assert len({r["flops"] for r in s.values()}) == 1  # every layer rerun once, any k
    cfg = zero3_recompute.MODEL
    block = cfg.num_parameters() - cfg.with_(num_layers=L - 1).num_parameters()
    assert block % zero3_recompute.DP == 0  # no padding: a whole block is 2 bytes a weight
    assert s["zero3_segments"]["peak"]["parameters"] - s["zero3"]["peak"]["parameters"] \
        == 2 * block


def test_where_segments_of_two_help_and_the_best_segment():
    """kA/I: 34 layers for this model's A = 17 I; below it (the lesson's 8 layers) segments
    of 2 raise the peak; the best k is near sqrt(L I / A), not sqrt(L)."""
    m = zero3_recompute.MODEL
    for L in (8, 34, 40):
        t = zero3_recompute.segment_terms(L, m.seq_len, 1, m.hidden, m.num_heads)
        assert t["A"] == 17 * t["I"] and t["threshold"] == 34
        assert (t["segments"] < t["per_layer"]) == (L > 34)
        assert t["best"] == best_segment(L, t["A"], t["I"]) == (2 if L > 34 else 1)
        assert t["sqrt_rule"] == pytest.approx((L / 17) ** 0.5)


@pytest.mark.timeout(120)
def test_the_report_prints_every_scenario_with_its_ratio(case_c):
    result, lines, _ = case_c
    text = "\n".join(lines)
    for r in result["scenarios"].values():
        assert r["label"] in text and f"{100 * r['vs_zero2']:.1f} %" in text
    assert result["model"]["dp"] == 4 and result["model"]["dtype"] == "bfloat16"
    for key in ("zero3", "zero3_segments"):  # the ledger's peak and the formula's, printed
        r = result["scenarios"][key]
        assert f"{r['peak']['activations']:>10,} B{r['planned_activations']:>10,.0f} B" in text
    assert "they lower it" in text and "L > 2A/I = 34 layers; this model has 40" in text


def test_incidents_are_listed_by_name():
    assert get("c") is zero3_recompute
    assert "c" in INCIDENTS
    with pytest.raises(KeyError, match="no incident 'z'"):
        get("z")


@pytest.mark.timeout(120)
def test_cli_runs_incident_c(case_c):
    _, lines, code = case_c
    out = "\n".join(lines)
    assert code == 0
    assert "Incident C" in out and "limit_all_gathers" in out and "vs ZeRO-2" in out


def test_cli_refuses_an_unknown_incident(capsys):
    with pytest.raises(SystemExit):
        main(["incident", "z"])
    assert "invalid choice" in capsys.readouterr().err


# ---- incident A: tensor parallelism across nodes ---------------------------------------
# small enough for a fast test, the same 2 nodes x 4 GPUs and layouts as the demo
SMALL_A = tp_across_nodes.MODEL.with_(hidden=128, seq_len=64, vocab_size=128)
BATCH_A = 16


@pytest.fixture(scope="module")
def case_a():
    lines = []
    return tp_across_nodes.run(out=lines.append, cfg=SMALL_A, global_batch=BATCH_A), lines


def test_tp_across_nodes_is_slower_and_the_fix_restores_it(case_a):
    """Measured at these sizes: tp=8 over 2 nodes 2.28x the fix's step, tp=4 across nodes
    1.75x; their TP all-reduces 2.9x and 2.2x as long. Asserted with margin."""
    s = case_a[0]["layouts"]
    fix = s["tp_in_node"]
    for bad in ("tp_all", "tp_across"):
        r = s[bad]
        assert r["step_seconds"] > 1.5 * fix["step_seconds"], bad
        assert r["vs_fix"] > 1.5, bad
        assert r["tp_comm_seconds"] > 1.8 * fix["tp_comm_seconds"], bad
        assert r["comm_share"] > fix["comm_share"], bad
        # time spent communicating, not just its share of a longer step
        assert r["comm_share"] * r["step_seconds"] > 1.5 * fix["comm_share"] * fix["step_seconds"]
        assert r["mfu"] * 1.5 < fix["mfu"], bad  # the fix restores MFU
        assert r["ib_bytes"] > 2 * fix["ib_bytes"], bad  # TP traffic crossed the nodes
    # placement alone: same tp and dp sizes, only which group crosses the nodes
    assert s["tp_across"]["mesh"] == {"tp": 4, "dp": 2}
    assert sorted(fix["mesh"].items()) == sorted(s["tp_across"]["mesh"].items())
    assert fix["tp_group"] == (0, 1, 2, 3) and fix["dp_group"] == (0, 4)
    assert s["tp_across"]["tp_group"] == (0, 2, 4, 6) and s["tp_across"]["dp_group"] == (0, 1)
    assert s["tp_all"]["tp_group"] == tuple(range(8)) and s["tp_all"]["dp_comm_seconds"] == 0
    # the fix's only inter-node traffic is the gradient all-reduce
    assert fix["dp_comm_seconds"] > 0 and s["tp_across"]["dp_comm_seconds"] < fix["dp_comm_seconds"]


def test_tp_across_nodes_numbers_agree_with_each_other(case_a):
    result = case_a[0]
    topo = tp_across_nodes.CLUSTER
    peak = topo.device.peak("bfloat16")
    flops = model_flops(BATCH_A, SMALL_A.seq_len, SMALL_A.num_layers, SMALL_A.hidden,
                        SMALL_A.vocab_size) / topo.world_size
    losses = [r["loss"] for r in result["layouts"].values()]
    for key, r in result["layouts"].items():
        assert 0.0 <= r["exposed_share"] <= r["comm_share"] <= 1.0, key
        assert r["flops"] == pytest.approx(flops, rel=1e-9), key  # same work in every layout
        assert r["mfu"] == pytest.approx(r["flops"] / (r["step_seconds"] * peak), rel=1e-12)
        assert r["compute_seconds"] == pytest.approx(r["flops"] / peak, rel=1e-12)
        # compute plus exposed communication cannot outlast the step
        assert r["compute_seconds"] + r["exposed_share"] * r["step_seconds"] \
            <= r["step_seconds"] * (1 + 1e-9), key
        assert r["tp_comm_seconds"] + r["dp_comm_seconds"] \
            <= r["comm_share"] * r["step_seconds"] * (1 + 1e-9) + 1e-12, key
        assert r["vs_fix"] == pytest.approx(
            r["step_seconds"] / result["layouts"]["tp_in_node"]["step_seconds"])
    # every layout trains the same model on the same batch (bf16: reduction order differs)
    assert max(losses) - min(losses) < 1e-2 * max(losses)


def test_tp_across_nodes_at_scale_is_the_alpha_beta_model():
    """The 70B lines recomputed by hand: ring all-reduce 2(n-1)a + 2(n-1)/n S/B."""
    scale = tp_across_nodes.at_scale()
    rows = scale["rows"]
    topo = tp_across_nodes.CLUSTER
    S = 4096 * 1 * 8192 * 2
    assert scale["all_reduce_bytes"] == S
    nv, ib = topo.intra, topo.inter
    ring8 = 2 * 7 * nv.latency + 2 * 7 / 8 * S / nv.bandwidth
    ring16 = 2 * 15 * ib.latency + 2 * 15 / 16 * S / ib.bandwidth
    assert rows["tp8_in_node"]["all_reduce_seconds"] == pytest.approx(ring8)
    assert rows["tp16_ring"]["all_reduce_seconds"] == pytest.approx(ring16)
    assert rows["tp16_hierarchical"]["algorithm"] == "hierarchical"
    assert (rows["tp8_in_node"]["all_reduce_seconds"]
            < rows["tp16_hierarchical"]["all_reduce_seconds"]
            < rows["tp16_ring"]["all_reduce_seconds"])
    for r in rows.values():
        assert r["comm_seconds"] == pytest.approx(4 * r["all_reduce_seconds"])
        assert r["model_comm_seconds"] == pytest.approx(80 * r["comm_seconds"])
        assert r["busy"] == pytest.approx(r["compute_seconds"]
                                          / (r["compute_seconds"] + r["comm_seconds"]))
    assert rows["tp8_in_node"]["busy"] > 1.5 * rows["tp16_hierarchical"]["busy"]
    # a flat ring across nodes is slower by about the links' bandwidth ratio
    ratio = rows["tp16_ring"]["all_reduce_seconds"] / rows["tp8_in_node"]["all_reduce_seconds"]
    assert 0.9 * nv.bandwidth / ib.bandwidth < ratio < 1.2 * nv.bandwidth / ib.bandwidth


def test_tp_across_nodes_report_prints_every_layout(case_a):
    result, lines = case_a
    text = "\n".join(lines)
    assert text.startswith("Incident A")
    for r in result["layouts"].values():
        assert r["label"] in text
        assert f"{r['step_seconds'] * 1e6:.1f} us" in text and f"{r['vs_fix']:.2f}x" in text
        assert f"{100 * r['mfu']:.1f} %" in text
    assert "At the seed's scale" in text and "flat ring" in text


def test_tp_across_nodes_refuses_what_it_cannot_lay_out():
    with pytest.raises(KeyError, match="no layout 'tp_everywhere'"):
        tp_across_nodes.measure("tp_everywhere", SMALL_A, BATCH_A)
    with pytest.raises(ValueError, match="at least 2 nodes"):
        tp_across_nodes.layouts(Topology.nodes(1, 8))
    with pytest.raises(ValueError, match="must divide among"):
        tp_across_nodes.measure("tp_in_node", SMALL_A, 3)


def test_incident_a_is_listed():
    assert get("a") is tp_across_nodes
    assert "a" in INCIDENTS


def test_cli_runs_incident_a(capsys, monkeypatch):
    monkeypatch.setattr(tp_across_nodes, "MODEL", SMALL_A)  # the demo's sizes take longer
    assert main(["incident", "a"]) == 0
    out = capsys.readouterr().out
    assert "Incident A" in out and "tp=4 in node" in out and "vs fix" in out


# ---- incident B: the pipeline bubble at PP = 64 ------------------------------------------
@pytest.fixture(scope="module")
def case_b():
    return through_the_command("b", pipeline_bubble)


@pytest.mark.timeout(60)
def test_incident_b_prints_the_bubble_formulas_of_each_case(case_b):
    """Each row: over ideal (p - 1)/(v m), idle share (p - 1)/(v m + p - 1), MFU bound
    v m/(v m + p - 1), computed here from p, m, v; 1F1B's peak in flight min(p - r, m)."""
    result, lines, _ = case_b
    cases = result["cases"]
    assert [(c["m"], c["v"]) for c in cases.values()][:2] == [(4, 1), (32, 1)]
    for key, c in cases.items():
        p, m, v = c["p"], c["m"], c["v"]
        assert p == 64
        want = (Fraction(p - 1, v * m), Fraction(p - 1, v * m + p - 1),
                Fraction(v * m, v * m + p - 1))
        assert (c["over_ideal"], c["idle_share"]) == (float(want[0]), float(want[1])), key
        assert c["mfu_bound"] == float(want[2]), key
        row = next(line for line in lines if f"{m:>5}{v:>3}" in line)
        for x in want:
            assert f"{100 * float(x):.1f} %" in row, (key, row)
        if v == 1:
            assert c["peak_in_flight"] == [min(p - r, m) for r in range(p)], key
        else:  # v chunks of 1/v of a rank's layers: never more than m micro-batches held
            assert max(c["peak_activations"]) <= m
    text = "\n".join(lines)
    assert "1575.0 %" in text and "63/67 = 94.0 % idle" in text


@pytest.mark.timeout(60)
def test_incident_b_dry_run_makespan_is_m_plus_p_minus_1_stage_times(case_b):
    result = case_b[0]
    t = result["t_F"] + result["t_B"]
    assert result["t_B"] == pytest.approx(2 * result["t_F"], rel=1e-9)  # one block's B: 2 F
    for key, c in result["cases"].items():
        p, m, v = c["p"], c["m"], c["v"]
        assert c["makespan"] == pytest.approx((v * m + p - 1) * t / v, rel=1e-12), key


@pytest.mark.timeout(60)
def test_incident_b_runner_clock_equals_the_dry_run_at_the_small_size(case_b):
    small = case_b[0]["small"]
    assert (small["p"], small["m"]) == (pipeline_bubble.SMALL_P, pipeline_bubble.SMALL_M)
    assert small["makespan"] > 1e-4 and len(small["clock"]) == small["p"]
    for got, want in zip(small["clock"], small["predicted"]):
        assert abs(got - want) < 1e-9
    assert small["worst_ns"] < 1


@pytest.mark.timeout(60)
def test_incident_b_names_what_the_seeds_numbers_imply_and_what_51_percent_takes(case_b):
    result, lines, _ = case_b
    text, p = "\n".join(lines), 64
    imp, need = result["implied"], result["needed"]
    assert imp["at_seed"] == pytest.approx(0.28 * (4 + p - 1) / 4)      # 469 %: impossible
    assert imp["at_fix"] == pytest.approx(0.51 * (32 + p - 1) / 32)     # 151 %: impossible
    assert imp["at_seed"] > 1 and imp["at_fix"] > 1
    assert f"{100 * imp['at_seed']:.0f} % MFU" in text and f"{100 * imp['at_fix']:.0f} %" in text
    for key, stage in (("floor", 1.0), ("at_assumed", need["assumed_mfu"])):
        m = need[key]  # the least m whose bound reaches 51 %
        assert m / (m + p - 1) * stage >= 0.51 > (m - 1) / (m - 1 + p - 1) * stage, key
        assert f"m >= {m}" in text
    assert result["cases"]["needed"]["m"] == need["floor"]
    inter = result["cases"]["interleaved"]
    assert inter["m"] % p == 0 and inter["mfu_bound"] >= 0.51
    with pytest.raises(ValueError, match="at most the stages' own MFU"):
        pipeline_bubble.needed_m(p, 0.51, 0.5)


@pytest.mark.timeout(60)
def test_cli_runs_incident_b(case_b):
    _, lines, code = case_b
    assert code == 0 and "Incident B" in lines[0]
    assert get("b") is pipeline_bubble and "b" in INCIDENTS
