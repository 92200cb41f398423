"""Lesson 02's numbers and grader: each figure the lesson prints is checked against the
formula written out here, and the grader's hints against the wrong answers issue 12 names.

The content it must get right: T*, the tokens per rank at which the backward hides the
gradient all-reduce, is (N − 1)/N · peak/β on one node — 1,099 tokens at N = 2 only — and
grows across nodes; exercise 2.5's problem is the same in the lesson and the grader, and
the grader's shortcut (activations proportional to the sequences) holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import minipar as mp
from minipar.course import find_lesson
from minipar.course.corpus import corpus_of, run_case
from minipar.course.grading import load_implementation
from minipar.nn import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[3]
LESSON = find_lesson("02")
TEXT = LESSON.path("lesson").read_text(encoding="utf-8")
PEAK_BF16, PEAK_FP64 = 989e12, 67e12  # H100 SXM, dense
NVLINK, IB = 450e9, 50e9  # bytes/s per direction
A_NVLINK, A_IB = 1e-6, 5e-6  # seconds a step


@pytest.fixture(scope="module")
def printed(run_lesson):
    run = run_lesson(str(LESSON.path("lesson")))  # the run tests/test_course.py times
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()


@pytest.fixture(scope="module")
def grader():
    return load_implementation(LESSON.path("grader"))


def line(printed, *words):
    found = [ln for ln in printed if all(w in ln for w in words)]
    assert len(found) == 1, (words, found)
    return found[0]


def t_star(nodes: int, per_node: int, psi: float = 7e9) -> float:
    """Tokens at which a token's backward time, 4Ψ/peak, times T equals the all-reduce of
    the 2Ψ bf16 gradient bytes S: a ring of N, 2(N−1)α + 2(N−1)/N · S/β, in one node
    (NVLink) or over nodes of one GPU (InfiniBand); over k nodes of m, the hierarchical
    reduce-scatter in the node, all-reduce of S/m across, all-gather in the node."""
    S, n = 2 * psi, nodes * per_node
    if nodes == 1 or per_node == 1:
        beta, alpha = (NVLINK, A_NVLINK) if nodes == 1 else (IB, A_IB)
        seconds = 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / beta
    else:
        k, m = nodes, per_node
        in_node = (m - 1) * A_NVLINK + (m - 1) / m * S / NVLINK  # reduce-scatter, all-gather
        seconds = 2 * in_node + 2 * (k - 1) * A_IB + 2 * (k - 1) / k * (S / m) / IB
    return seconds * PEAK_BF16 / (4 * psi)


LAYOUTS = [(1, 2), (1, 4), (1, 8), (2, 8), (8, 8), (64, 8), (2, 1), (8, 1)]


@pytest.mark.parametrize("nodes, per_node", LAYOUTS)
def test_t_star_is_the_formula_for_every_layout(printed, nodes, per_node):
    label = f"{nodes} node{'s' if nodes > 1 else ''} of {per_node}"
    shown = line(printed, f"({label:<13})", "T* =")
    value = int(re.search(r"T\* =\s*([\d,]+)", shown).group(1).replace(",", ""))
    assert value == round(t_star(nodes, per_node))
    bandwidth_only = t_star(nodes, per_node, psi=1e15)  # the latencies vanish
    assert abs(value - bandwidth_only) < 0.01 * value  # 7B: latencies add < 1 %


def test_the_text_says_t_star_holds_at_n_2_only_and_how_it_grows():
    assert f"{round(t_star(1, 2)):,}" == "1,099"
    prose = {f"{round(t_star(*lay)):,}" for lay in [(1, 2), (1, 8), (2, 8), (64, 8), (2, 1), (8, 1)]}
    for figure in prose:
        assert figure in TEXT, figure
    assert round(PEAK_BF16 / NVLINK) == 2198 and "2,198" in TEXT  # the limit inside a node
    assert round(2 * PEAK_BF16 / NVLINK, -2) == 4400 and "about 4,400" in TEXT  # across nodes
    assert round(t_star(2, 1) / t_star(1, 2)) == 9  # the bandwidth ratio, "nine times"
    summary = TEXT.split("# ## Summary")[1]
    assert "N = 2" in summary and "1,099" in summary and "1,924" in summary
    assert "3,160" in summary and "1,100" not in summary


def test_float64_t_star_for_exercise_2_5(printed):
    shown = line(printed, "float64, N = 2 in a node: T* =")
    assert f"T* = {round(4 * 0.5 * PEAK_FP64 / NVLINK)} tokens" in shown  # 8-byte gradients
    assert "exercise 2.5 has 768" in shown


def lesson_value(name: str):
    """The value a top-level line `name = ...` of lesson.py gives (GPTConfig, numbers, US)."""
    found = re.search(rf"^{name} = (.+?)(\s+#.*)?$", TEXT, re.M)
    assert found, name
    return eval(found.group(1), {"GPTConfig": GPTConfig, "US": 1e-6})


def test_exercise_2_5_is_the_same_problem_in_the_lesson_and_the_grader(printed, grader):
    assert lesson_value("budget_cfg") == grader.BUDGET_CFG
    per_rank, max_sequences = lesson_value("PER_RANK, MAX_SEQUENCES")
    assert (per_rank, max_sequences) == (grader.SCENARIOS[0][0], grader.MAX_SEQUENCES)
    assert lesson_value("EXPOSED_BUDGET") == grader.EXPOSED_BUDGET
    assert grader.NODE.world_size == 4 and grader.NODE.num_nodes == 1
    held = grader.shard(per_rank, 0)[2] * max_sequences / per_rank
    assert f"activations {held / 2**20:.2f} MiB (what {max_sequences} sequences hold)" in \
        line(printed, "budgets: activations")
    naive = line(printed, "DDP's defaults, all 24 sequences at once")
    peak, over = map(float, re.findall(r"([\d.]+) (?:MiB|µs)", naive))
    assert peak > held / 2**20 and over > grader.EXPOSED_BUDGET / 1e-6  # over both budgets


def test_the_ledger_holds_activations_in_proportion_to_the_sequences(grader):
    """What the grader of 2.5 relies on to read the budget off one pass."""
    ids, targets = grader.BATCH
    held = {}
    for n in (8, 16, 24):
        with mp.device() as ctx:
            ctx.ledger.reset_peak()
            GPT(grader.BUDGET_CFG).loss_and_grad(ids[:, :n], targets[:, :n])
            held[n] = ctx.ledger.peak("activations")
    assert held[16] * 8 == held[8] * 16 and held[24] * 16 == held[16] * 24


def case(title: str):
    wrongs, _ = corpus_of(LESSON)
    return next(w for w in wrongs if w.title == title)


def test_an_answer_that_never_leaves_no_sync_gets_the_count_hint_not_the_scale_one(tmp_path):
    result = run_case(LESSON, case("never leaves no_sync(), so nothing is all-reduced"),
                      tmp_path)
    assert result.ok, result.report
    assert "expected 1 but received 0" in result.report
    assert "weighed by its part" not in result.report  # the loss-scale hint of the values


def test_a_sum_is_named_and_ranks_are_named_one_way(tmp_path):
    result = run_case(LESSON, case("sums the gradients instead of averaging them"), tmp_path)
    assert result.ok, result.report
    words = "dp rank 0 of 2 = global rank 0 of 4, the first dp group [0, 1]"
    assert f"{words}: wte.weight.grad" in result.report  # the prefix ...
    assert f"(raised on {words})" in result.report  # ... and the note say the same
    assert "received = 2× expected everywhere: summed over the group" in result.report
