"""Lesson 00's numbers: each figure the lesson prints is checked against the formula written
out here, and what it says of the ledger against a run of the ledger.

The content it must get right: Megatron's 18 bytes a parameter (6 + 12/d with its
distributed optimizer) beside ZeRO's 16; activations with the attention scores stored and
with FlashAttention (34sbh + 4asb); the peak of full recomputation, 2sbh(L - 1) + A_layer;
the float32 logits, s·b·V·4; and exercise 0.4's problem, the same in the lesson, the
solution and the grader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minipar as mp
from minipar.course import find_lesson
from minipar.course.grading import load_implementation
from minipar.nn import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[3]
LESSON = find_lesson("00")
GB = 1e9
SHAPES = {"8B": (4096, 32, 32), "70B": (8192, 64, 80), "405B": (16384, 128, 126)}  # h, a, L
S, B, V = 8192, 1, 128_256


@pytest.fixture(scope="module")
def printed(run_lesson):
    run = run_lesson(str(LESSON.path("lesson")))  # the run tests/test_course.py times
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()


def line(printed, *words):
    found = [ln for ln in printed if all(w in ln for w in words)]
    assert len(found) == 1, (words, found)
    return found[0]


def per_layer(h, a, s=S, b=B):
    """Korthikanti et al.'s sbh(34 + 5as/h), the scores stored, and FlashAttention's
    34sbh + 4asb."""
    sbh = s * b * h
    return sbh * (34 + 5 * a * s / h), 34 * sbh + 4 * a * s * b


def test_megatron_keeps_18_bytes_and_6_plus_12_over_d_with_its_distributed_optimizer(printed):
    psi, d = 7e9, 8
    for label, bpp in [("ZeRO's 16", 2 + 2 + 12), ("Megatron's 18", 2 + 4 + 12),
                       (f"ZeRO-1 over d = {d}", 2 + 2 + 12 / d),
                       (f"distributed optimizer, d = {d}", 6 + 12 / d)]:
        assert f"{bpp:5.2f} bytes a parameter = {bpp * psi / GB:6.1f} GB" in \
            line(printed, "7B, ", label)
    assert 6 + 12 / d == 7.5 and (2 + 4 + 12) * psi / GB == 126  # the prose's figures


def test_activations_with_the_scores_stored_and_with_flash_attention(printed):
    for name, (h, a, layers) in SHAPES.items():
        stored, flash = per_layer(h, a)
        assert line(printed, f"{name:>5}{layers * stored / GB:>16,.1f}").endswith(
            f"{layers * flash / GB:>17,.1f}")
    stored, flash = per_layer(4096, 32)
    assert 5 * 32 * S / 4096 == 320 and 0.09 < flash / stored < 0.11  # "about a tenth"


def test_full_recomputation_peaks_at_one_recomputed_layer_above_the_kept_inputs(printed):
    for name, (h, a, layers) in SHAPES.items():
        stored, flash = per_layer(h, a)
        inputs = 2 * S * B * h
        text = line(printed, f"{name:>5}: full recomputation keeps")
        assert f"keeps {layers * inputs / GB:5.1f} GB of inputs" in text
        assert f"is {((layers - 1) * inputs + stored) / GB:5.1f} GB with stored scores" in text
        assert f"{((layers - 1) * inputs + flash) / GB:5.1f} GB with FlashAttention" in text


@pytest.mark.parametrize("layers, dropout", [(1, 0.0), (3, 0.1), (4, 0.1)])
def test_the_ledger_holds_the_recomputed_layer_on_top_of_the_kept_inputs(layers, dropout):
    s, b, h, a, vocab = 32, 2, 48, 4, 64
    cfg = GPTConfig(vocab_size=vocab, seq_len=s, hidden=h, num_heads=a, num_layers=layers,
                    dropout=dropout, dtype="bfloat16", recompute="full")
    with mp.device() as ctx:
        model = GPT(cfg)
        ids = np.random.default_rng(0).integers(0, vocab, (s, b))
        _, cache = model.forward(ids, ids)
        kept = ctx.ledger.held("activations")
        model.backward(cache)
        peak = ctx.ledger.peak("activations")
    sbh = s * b * h
    masks = 1 if dropout else 0  # bytes an element of a dropout mask
    layer = sbh * (2 * 16 + 2 * masks) + a * s * s * b * (4 + masks if dropout else 2)
    embedding = 2 * 8 * s * b + masks * sbh  # int64 ids and positions, its dropout mask
    head = s * b * (2 * 2 * h + 2 * vocab + 4 + 8)  # ln_f, lm_head inputs, logits, lse, targets
    assert kept == layers * 2 * sbh + embedding + head
    assert peak == (layers - 1) * 2 * sbh + layer + embedding


def test_the_lesson_prints_the_ledger_decomposition(printed):
    sbh, s, b, h, a = 32 * 2 * 48, 32, 2, 48, 4
    layer = sbh * 34 + 5 * a * s * s * b
    embedding = 2 * 8 * s * b + sbh
    assert line(printed, "peak in the backward") == (
        f"peak in the backward {3 * 2 * sbh + layer + embedding:,} bytes = 2sbh·(L − 1) "
        f"{3 * 2 * sbh:,} + A_layer {layer:,} + the embedding's {embedding:,}")


def test_float32_logits_are_s_b_v_4_bytes(printed):
    logits = S * B * V * 4
    text = line(printed, "float32 logits of")
    assert f"{logits / GB:.2f} GB" in text and logits / GB == pytest.approx(4.2026, abs=1e-4)
    assert f"{logits / (34 * S * B * 4096):.1f} layers of 34sbh" in text


def test_exercise_0_4_poses_one_problem_in_the_lesson_the_solution_and_the_grader(printed):
    grader = load_implementation(LESSON.path("grader"))
    solution = load_implementation(LESSON.path("solution"))
    assert solution.MODEL == {**grader.MODEL, "dtype": "bfloat16"}
    assert (solution.GPUS, solution.GLOBAL_BATCH, solution.BUDGET_BYTES,
            solution.MAX_FLOPS_RATIO) == (grader.GPUS, grader.GLOBAL_BATCH, grader.BUDGET,
                                          grader.MAX_FLOPS_RATIO)
    text = LESSON.path("lesson").read_text(encoding="utf-8")
    m = grader.MODEL
    assert (f"GPTConfig(vocab_size={m['vocab_size']}, seq_len=s, hidden={m['hidden']},\n# "
            f"num_heads={m['num_heads']}, num_layers={m['num_layers']}, dtype=\"bfloat16\")"
            in text)
    assert (f"GPUS, GLOBAL_BATCH, BUDGET = {grader.GPUS}, {grader.GLOBAL_BATCH}, "
            f"{grader.BUDGET:_}" in text)
    assert "s in 32, 64 and 128" in text and grader.SEQ_LENS == (32, 64, 128)
    # the lesson's example, DDP at s = 32: 16Ψ alone is over the budget
    psi = GPTConfig(seq_len=32, **solution.MODEL).num_parameters()
    assert f"16Ψ alone is {16 * psi:,} bytes" in line(printed, "16Ψ alone")
    assert 16 * psi > grader.BUDGET


def test_the_grader_measures_what_the_ledger_holds():
    """Exercise 0.4's FLOPs ratio and peaks come from the runs: full recomputation costs
    3 more forward matmuls for every 9 of a step (the head excepted); the peak of a rank is
    its ledger's."""
    grader = load_implementation(LESSON.path("grader"))
    plain = {"zero": 1, "recompute": "none", "micro_batch": 2, "accumulation": 2}
    full = {**plain, "recompute": "full"}
    runs = {k: grader.run_plan(p, 32, "bfloat16") for k, p in (("plain", plain), ("full", full))}
    _, reference = grader.one_device(32, "float64", grader.GLOBAL_BATCH // grader.GPUS)
    assert all(r[2] == reference for r in runs["plain"])  # the same step's FLOPs, every rank
    h, s, b, layers, vocab = 64, 32, 4, 4, 128
    forward_layers = layers * (24 * b * s * h * h + 4 * b * s * s * h)
    assert runs["full"][0][2] - reference == pytest.approx(forward_layers, rel=1e-12)
    assert reference == pytest.approx(3 * (forward_layers + 2 * b * s * h * vocab), rel=1e-12)
    for peak, parts, _, _ in runs["plain"]:
        assert max(parts.values()) <= peak <= sum(parts.values())
