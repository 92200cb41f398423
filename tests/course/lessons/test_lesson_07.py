"""Lesson 07's numbers, as the lesson computes them, against hand-written formulas: the
rank <-> (pp, dp, tp) table, the bytes of each group of the 2 x 2 x 2 run by link class,
what moves onto InfiniBand when the order changes, the cost model's tp all-reduce at 70B
scale inside and across nodes, the checklist's states and bubbles, the "<= 7B" figures,
the design puzzle against the grader's budgets, and the 3-D run equal to one device."""


import pytest

from minipar.course import find_lesson
from minipar.course.grading import load_implementation

LESSON = find_lesson("07")
NV_B, NV_A = 450e9, 1e-6  # NVLink 4, one direction
IB_B, IB_A = 50e9, 5e-6  # InfiniBand NDR, one GPU
GB = 1e9


@pytest.fixture(scope="module")
def lesson(run_lesson):
    """The lesson's variables after running it (the run tests/test_course.py times)."""
    return run_lesson(str(LESSON.path("lesson"))).names


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


def ring_ar(S, n, B, a):
    return 2 * (n - 1) * a + 2 * (n - 1) / n * S / B


def ring_half(S, n, B, a):
    return (n - 1) * a + (n - 1) / n * S / B


def test_rank_is_tp_plus_tp_times_dp_plus_dp_times_pp(lesson):
    tp = dp = pp = 2
    for r, c in enumerate(lesson["coords"]):
        assert r == c["tp"] + tp * (c["dp"] + dp * c["pp"])
        assert c["node"] == r // 4
        assert c["tp group"] == [r - c["tp"], r - c["tp"] + 1]
        assert c["dp group"] == [r - tp * c["dp"] + tp * i for i in range(dp)]
        assert c["pp group"] == [r - tp * dp * c["pp"] + tp * dp * i for i in range(pp)]


def test_each_groups_bytes_by_link_class(lesson):
    cfg = lesson["MODEL"]
    s, h, item, m, dp, tp, ranks = cfg.seq_len, cfg.hidden, 8, 2, 2, 2, 8
    b = lesson["BATCH"] // m // dp  # sequences of a micro-batch on one dp rank
    sbh = s * b * h * item
    layers = cfg.num_layers // 2  # a stage's blocks
    links = lesson["link_bytes"]
    # a ring all-reduce of 2 sends (n-1)/n * 2 S = S a rank: 4 a block and micro-batch, the
    # embedding's on the first stage, the head's input gradient and the loss's three [s, b]
    # on the last
    tp_sent = ranks * m * (4 * layers + 1) * sbh + (ranks // 2) * m * 3 * s * b * item
    assert links[("tp (all_reduce)", "NVLink")] == tp_sent
    assert links[("tp (all_reduce)", "IB")] == 0
    # every tp and dp rank sends its [s, b, h] forward and its gradient back, per micro-batch
    assert links[("pp (send)", "IB")] == tp * dp * m * 2 * sbh
    assert links[("pp (broadcast)", "IB")] == 4 * item  # the loss, to the first stage
    rs, ag = (links[(f"dp_shard ({k})", "NVLink")] for k in ("reduce_scatter", "all_gather"))
    assert rs == ag > 0 and links[("dp_shard (reduce_scatter)", "IB")] == 0
    assert lesson["cross_222"] == tp * dp * m * 2 * sbh + 4 * item


def test_the_order_decides_what_crosses_nodes(lesson):
    links, p = lesson["link_bytes"], lesson["placement"]
    dp_bytes = sum(links[(f"dp_shard ({k})", "NVLink")] for k in ("reduce_scatter", "all_gather"))
    assert p["tp-cp-ep-dp-pp"]["cross"] == lesson["cross_222"]
    # tp-pp-dp: the dp pairs {r, r + 4} cross, pp stays inside; every hop of a ring of 2 crosses
    assert p["tp-pp-dp"]["cross"] == dp_bytes
    # pp-dp-tp: every tp all-reduce crosses, and takes longer
    assert p["pp-dp-tp"]["cross"] == links[("tp (all_reduce)", "NVLink")]
    assert p["pp-dp-tp"]["tp seconds"] > 2 * p["tp-cp-ep-dp-pp"]["tp seconds"]


def test_the_tp_all_reduce_at_70b_scale(lesson):
    S, k = 4096 * 8192 * 2, 4 * 80
    got = lesson["tp_step"]
    assert got["in node"] == pytest.approx(k * ring_ar(S, 8, NV_B, NV_A), rel=1e-12)
    assert got["ring across"] == pytest.approx(k * ring_ar(S, 8, IB_B, IB_A), rel=1e-12)
    assert got["hierarchical"] == pytest.approx(
        k * (2 * ring_half(S, 4, NV_B, NV_A) + ring_ar(S / 4, 2, IB_B, IB_A)), rel=1e-12)


def test_the_checklist_numbers(lesson):
    psi = 70e9 / 8  # TP x PP = 8
    want = {0: 16 * psi, 1: 4 * psi + 12 * psi / 8, 2: 2 * psi + 14 * psi / 8, 3: 16 * psi / 8}
    for z, v in want.items():
        assert lesson["states"][z] == pytest.approx(v / GB, rel=1e-12)
    assert lesson["states"][0] > 80 > lesson["states"][1]  # ZeRO-1 is what fits an H100
    for (p, m), bubble in lesson["bubbles"].items():
        assert bubble == pytest.approx((p - 1) / m, rel=1e-12)
    assert lesson["dp_ar"].seconds == pytest.approx(ring_ar(2 * 70e9 / 8, 8, IB_B, IB_A), rel=1e-12)
    B, s, l, h, V = 512, 4096, 80, 8192, 32000
    flops = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)) / 64
    assert lesson["step_compute"] == pytest.approx(flops / (989e12 * 0.5), rel=1e-12)


def test_the_seven_b_rule_holds_with_zero_and_fails_without_it_or_at_long_sequences(lesson):
    v, psi, n = lesson["seven_b"], 7e9, 16
    assert v["ddp"] == pytest.approx(16 * psi / GB)
    assert v["zero1"] == pytest.approx((4 * psi + 12 * psi / n) / GB)
    assert v["zero2"] == pytest.approx((2 * psi + 14 * psi / n) / GB)
    for s in (4096, 32768):  # selective recomputation: 34 sbh a layer, b = 1, 32 layers
        assert v[f"act {s}"] == pytest.approx(32 * 34 * s * 4096 / GB)
    assert v["ddp"] > 80 and v["zero2"] + v["act 4096"] < v["zero1"] + v["act 4096"] < 80
    assert v["act 32768"] > 80


def test_the_puzzle_is_the_graders_and_two_candidates_fit(lesson, grader):
    name, topo, batch, memory, cross = grader.SCENARIOS[0]
    assert (topo.num_nodes, topo.gpus_per_node, batch) == (2, 4, lesson["BATCH"])
    assert grader.MODEL == lesson["MODEL"]
    fits = sorted(k for k, (peak, ib) in lesson["design"].items() if peak <= memory and ib <= cross)
    assert fits == ["dp=2 pp=2 tp=2, ZeRO-1", "pp=4 tp=2"]
    peak, ib = lesson["design"]["dp=2 pp=2 tp=2, DDP"]
    assert peak > memory and ib <= cross  # DDP misses on memory alone
    # pp sends at one boundary: every tp rank sends [s, B/m, h] forward and back per
    # micro-batch; pp = 2, tp = 4: m = 2, 4 loss broadcasts of 8 bytes to the other node
    cfg = lesson["MODEL"]
    sbh = lambda b: cfg.seq_len * b * cfg.hidden * 8
    assert lesson["design"]["pp=2 tp=4"][1] == 4 * 2 * 2 * sbh(batch // 2) + 4 * 8
    # pp = 4, tp = 2, m = 4: stages 1 and 2 sit on different nodes, one boundary crosses
    sends = 2 * 4 * 2 * sbh(batch // 4)
    assert sends < lesson["design"]["pp=4 tp=2"][1] <= sends + 2 * 3 * 8


def test_the_3d_run_equals_one_device(lesson):
    assert lesson["equal"]
    assert lesson["parallel_losses"] == pytest.approx(lesson["single_losses"], rel=1e-12)
    assert len(set(lesson["single_losses"])) == 3  # three different steps


def test_the_placement_check_on_the_three_orders_and_the_64_gpu_example(lesson):
    kinds = {o: [f.kind for f in fs] for o, fs in lesson["findings"].items()}
    assert kinds == {"tp-cp-ep-dp-pp": ["cheaper_order"], "tp-pp-dp": [],
                     "pp-dp-tp": ["tp_across_nodes", "cheaper_order"]}
    cfg = lesson["BIG70"]
    S, G = 4096 * 8192 * 2, 2 * cfg.num_parameters() / 8  # [s, b, h] and a GPU's gradients, bf16
    default, outer = lesson["example_64"]["tp-cp-ep-dp-pp"], lesson["example_64"]["tp-pp-dp"]
    for c in (default, outer):  # tp = 4 inside a node: 4 all-reduces, 40 blocks, m = 8
        assert c.tp == pytest.approx(8 * 40 * 4 * ring_ar(S, 4, NV_B, NV_A), rel=1e-12)
    # default: dp groups of 8 with 2 ranks a node, hierarchical; pp across nodes
    assert default.dp == pytest.approx(2 * ring_half(G, 2, NV_B, NV_A)
                                       + ring_ar(G / 2, 4, IB_B, IB_A), rel=1e-12)
    assert default.pp == pytest.approx(2 * 8 * (IB_A + S / IB_B), rel=1e-12)
    # dp outermost: one rank a node, a flat ring over InfiniBand; pp inside a node
    assert outer.dp == pytest.approx(ring_ar(G, 8, IB_B, IB_A), rel=1e-12)
    assert outer.pp == pytest.approx(2 * 8 * (NV_A + S / NV_B), rel=1e-12)
    assert default.total < outer.total
    assert lesson["incident_a"].kind == "tp_larger_than_node" and lesson["incident_a"].ratio > 1
