"""The seed's 3-D examples: bytes by link class split as the algorithms move them, the
kitchen and the 64-GPU layout equal to one device, their bytes equal to hand formulas and
to traffic.predict, the 70B figures to the formulas, and the CLI runs them."""

import re
from pathlib import Path

import numpy as np
import pytest

import minipar as mp
from minipar.cli import main
from minipar.nn import GPTConfig
from minipar.plan import model_state_bytes
from minipar.programs import examples
from minipar.programs.examples import kitchen, seventy_b
from minipar.programs.examples.traffic import measured, predict, split_sent, unit_elements
from minipar.runtime.collectives import all_reduce, new_group
from minipar.runtime.p2p import recv, send

TOPO = mp.Topology.nodes(2, 4)


def test_a_ring_sends_to_its_successor_and_a_hierarchical_one_splits_by_formula():
    # ring over {0, 1, 4, 5}: 1 -> 4 crosses nodes, 0 -> 1 does not
    assert split_sent("all_reduce", "ring", 800, (0, 1, 4, 5), 1, TOPO, 1200) == (0.0, 1200.0)
    assert split_sent("all_reduce", "ring", 800, (0, 1, 4, 5), 0, TOPO, 1200) == (1200.0, 0.0)
    # hierarchical, k = 2 nodes of m = 2: 2(m-1)/m S inside, 2(k-1)/k S/m across
    assert split_sent("all_reduce", "hierarchical", 800, (0, 1, 4, 5), 0, TOPO,
                      800 + 400) == (800.0, 400.0)
    assert split_sent("all_gather", "hierarchical", 800, (0, 1, 4, 5), 0, TOPO,
                      400 + 200) == (400.0, 200.0)
    with pytest.raises(ValueError, match="expected 1200 B"):
        split_sent("all_reduce", "hierarchical", 800, (0, 1, 4, 5), 0, TOPO, 1000)
    with pytest.raises(ValueError, match="not tree all_reduce"):
        split_sent("all_reduce", "tree", 800, (0, 1, 4, 5), 0, TOPO, 800)


def test_measured_reads_each_rank_from_its_trace():
    """All-reduce of 1,000 B over {0,1,4,5} (hierarchical: 1,000 B inside, 500 across), over
    {0,4} (a ring across: 1,000 B on InfiniBand), and a send 0 -> 1 of 800 B on NVLink."""
    def program(ctx):
        a, b = new_group([0, 1, 4, 5]), new_group([0, 4])
        if ctx.rank in a.ranks:
            all_reduce(np.ones(125), group=a)
        if ctx.rank in b.ranks:
            all_reduce(np.ones(125), group=b)
        if ctx.rank == 0:
            send(np.ones(100), 1)
        elif ctx.rank == 1:
            recv(0)
        ctx.resolve_pending()
        return measured(ctx.trace.events, TOPO)

    res = mp.launch(program, 8, topology=TOPO)
    total = [[sum(v[link] for v in r.values()) for link in ("intra", "inter")] for r in res]
    assert total[0] == [1000.0 + 800.0, 500.0 + 1000.0]
    assert res[0]["pp"] == {"intra": 800.0, "inter": 0.0, "count": 1}  # a send: the pipeline's
    assert total[4] == [1000.0, 500.0 + 1000.0] and total[5] == [1000.0, 500.0]
    assert res[2] == {}


@pytest.fixture(scope="module")
def kitchen_run():
    return kitchen.run(out=lambda line: None)


def test_the_kitchen_is_one_device_and_its_bytes_are_the_hand_formulas(kitchen_run):
    eq = kitchen_run["equal"]
    assert eq["covered"] and eq["loss_diff"] <= 1e-12 * eq["loss_one_device"]
    assert eq["grad_rel"] < 1e-12
    assert kitchen_run["predicted"] is True
    cfg, dims = kitchen.MODEL, kitchen.DIMS
    res = kitchen_run["ranks"]
    assert len(res) == 24 == dims.dp * dims.tp * dims.pp
    for r in res:
        c, g = r["coordinate"], r["groups"]
        assert r["rank"] == c["tp"] + 4 * c["dp"] + 8 * c["pp"]  # tp fastest, pp slowest
        assert g["tp"] == tuple(range(r["rank"] - c["tp"], r["rank"] - c["tp"] + 4))
        assert g["pp"] == tuple(c["tp"] + 4 * c["dp"] + 8 * s for s in range(3))
        assert g["dp"] == tuple(c["tp"] + 4 * d + 8 * c["pp"] for d in range(2))
        assert r["node"] == c["pp"]  # a stage a node on 3 nodes of 8
        t = r["traffic"]
        assert t["tp"]["inter"] == t["dp"]["inter"] == t["pp"]["intra"] == 0
    # rank 0, stage 0: 1 block, m = 4 micro-batches of b = 8 / (2 x 4) = 1 sequence
    h, s, m, V, F = cfg.hidden, cfg.seq_len, kitchen.MICROBATCHES, cfg.vocab_size, 32
    act = s * 1 * h * 8  # [s, b, h] float64
    t0 = res[0]["traffic"]
    assert t0["tp"]["intra"] == m * (4 * 1 + 1) * 2 * 3 / 4 * act  # blocks + embedding
    assert t0["pp"]["inter"] == m * act + 8  # activations forward, the loss passed on
    params = (V * h // 4 + s * h) + (6 * h + (4 * h * h + 3 * h + 2 * h * F + F) // 4)
    assert t0["dp"]["intra"] == 2 * (2 - 1) / 2 * params * 8


def test_predict_refuses_what_it_does_not_model():
    cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, tie_embeddings=True)
    with pytest.raises(ValueError, match="untie the embeddings"):
        predict(cfg, kitchen.DIMS, kitchen.TOPOLOGY, 0, 8, 4)


@pytest.fixture(scope="module")
def small_runs():
    return {k: seventy_b.measure_small(k) for k in ("megatron", "dp_outer")}


@pytest.mark.parametrize("key", ["megatron", "dp_outer"])
def test_the_64_gpu_layout_runs_small_like_one_device(key, small_runs):
    got = small_runs[key]
    eq = got["equal"]
    assert eq["covered"] and eq["loss_diff"] <= 1e-12 * eq["loss_one_device"]
    assert eq["grad_rel"] < 1e-12 and got["predicted"] is True
    for r in got["ranks"]:
        t = r["traffic"]
        assert t["tp"]["inter"] == 0  # TP = 4 inside a node of 8 either way
        if key == "megatron":  # the stages on different nodes; dp 2 a node, 4 nodes
            assert t["pp"]["intra"] == 0 and t["pp"]["inter"] > 0
            assert t["dp"]["intra"] > 0 and t["dp"]["inter"] > 0
        else:  # a node holds a whole replica: pp on NVLink, dp across nodes only
            assert t["pp"]["inter"] == 0 and t["dp"]["intra"] == 0


def test_the_70b_figures_are_the_formulas():
    big = seventy_b.at_full_width("megatron")
    cfg, m = seventy_b.BIG, big["m"]
    assert m == 1024 // 8
    h, s, V, L = cfg.hidden, cfg.seq_len, cfg.vocab_size, cfg.num_layers
    act = s * 1 * h * 2  # [s, b, h] in bf16
    s0 = big["stages"][0]
    assert s0["tp"]["intra"] == m * (4 * L // 2 + 1) * 2 * 3 / 4 * act
    assert s0["tp"]["inter"] == 0
    assert s0["tp"]["count"] == m * (4 * 40 + 1)
    assert s0["pp"]["inter"] == m * act and s0["pp"]["intra"] == 0  # activations forward
    # the last stage sends the gradients back and the loss (8 B) to stage 0, the chain's end
    assert big["stages"][1]["pp"]["inter"] == m * act + 8
    units = [V * h // 4 + s * h] + [6 * h + (12 * h * h + 7 * h) // 4] * (L // 2)
    assert unit_elements(cfg, 4, 0, 2) == units
    # ZeRO-1 over 8 ranks on 4 nodes (2 a node, hierarchical): RS + AG of each unit
    padded = sum(-(-u // 8) * 8 for u in units) * 2
    assert s0["dp"]["intra"] == pytest.approx(2 * (1 / 2) * padded, rel=1e-12)
    assert s0["dp"]["inter"] == pytest.approx(2 * (3 / 4) * padded / 2, rel=1e-12)
    psi = sum(units)
    assert big["states"] == 4 * psi + 12 * psi / 8 == model_state_bytes(psi, 1, 8)["total"]
    assert big["ddp_states"] == 16 * psi > seventy_b.HBM  # DDP cannot hold it
    # full recompute keeps each layer's input, 2sbh bytes in bf16, 40 layers, p = 2 in flight
    assert big["memory"]["full recompute"] == big["states"] + 2 * s * h * 40 * 2


def test_the_70b_claims_are_computed_from_the_runs(small_runs):
    small = small_runs
    big = {k: seventy_b.at_full_width(k) for k in seventy_b.LAYOUTS}
    eth = seventy_b.at_full_width("megatron", mp.Topology.nodes(
        8, 8, inter=mp.Link.ethernet_100g()))
    claims = dict(seventy_b.claims(small, big, eth))
    assert claims["N = TP x PP x DP"].endswith("holds")
    assert "measured: 0 (holds)" in claims["TP stays inside the node, on NVLink"]
    assert claims["TP moves the most data"].endswith("holds")
    assert "(large: no)" in claims["PP transfers are few but large"]
    assert "does not fit" in claims["TP=4 x PP=2 x DP=8 fits a 70B model"]
    fewest = claims["place TP in the node first, DP outermost"]
    assert "fewest: TP=4 PP=2 DP=8, Megatron's order" in fewest
    assert eth["stages"][0]["dp"]["seconds"] > big["megatron"]["stages"][0]["dp"]["seconds"]


def test_the_command_runs_an_example(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(kitchen, "run", lambda out: seen.append(out) or {})
    assert main(["example", "kitchen"]) == 0 and seen == [print]
    with pytest.raises(SystemExit) as e:
        main(["example", "nope"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert sorted(examples.EXAMPLES) == ["70b", "7b", "kitchen"]
    with pytest.raises(KeyError, match="the examples are"):
        examples.get("13b")


def test_the_7b_rule_is_zero2_plus_the_activation_formula():
    from minipar.programs.examples.small_model import SEVEN_B, pipeline_idle, zero2_memory
    psi, h, a, L = SEVEN_B.num_parameters(), SEVEN_B.hidden, SEVEN_B.num_heads, 32
    for s in (4096, 32768):  # bf16, no dropout, one sequence: 32 s h + 2 a s^2 a layer
        assert zero2_memory(SEVEN_B, 8, s) == pytest.approx(
            2 * psi + 14 * psi / 8 + L * (32 * s * h + 2 * a * s * s), rel=1e-12)
        assert zero2_memory(SEVEN_B, 8, s, "full") == pytest.approx(
            2 * psi + 14 * psi / 8 + L * 2 * s * h, rel=1e-12)
    assert pipeline_idle(2, 8) == 1 / 9
    from minipar.programs.examples.small_model import run
    lines = []
    got = run(lines.append)
    fits = {(r["seq_len"], r["recompute"]) for r in got["rows"] if r["fits"]}
    assert {(4096, k) for k in ("none", "selective", "full")} <= fits
    assert {k for s, k in fits if s == 32768} == {"full"}
    assert "every short-sequence row fits: True" in "\n".join(lines)


DOC = Path(__file__).resolve().parents[2] / "docs" / "composition.md"


def test_the_composition_page_cites_names_the_code_has_and_its_figures():
    text = DOC.read_text()
    source = " ".join(p.read_text() for p in (DOC.parents[1] / "minipar").rglob("*.py"))
    cited = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text)) - {"init_device_mesh"}
    missing = sorted(n for n in cited if not re.search(rf"\b{n}\b", source))
    assert not missing, f"docs/composition.md cites names the code does not have: {missing}"
    from minipar.programs.examples.small_model import rule_table
    rows = {(r["dp"], r["seq_len"], r["recompute"]): r["gb"] for r in rule_table()}
    for key in ((8, 4096, "none"), (8, 4096, "selective"), (8, 4096, "full"),
                (8, 32768, "full"), (8, 32768, "selective")):
        assert f"{rows[key]:.0f} GB" in text, key
    big = {k: seventy_b.at_full_width(k) for k in ("megatron", "dp_outer")}
    ib = [sum(r["inter"] for r in big[k]["stages"][0].values()) for k in big]
    assert f"{ib[0] / 1e9:.1f} GB across nodes" in text and f"{ib[1] / 1e9:.1f} GB, " \
        f"{ib[1] / ib[0]:.2f}x as much" in text
