"""minipar.viz.figures: the lessons' pictures. Bad data is refused saying what was expected
and what was received (with or without matplotlib); bars, lines, timeline and timelines
write PNGs where $MINIPAR_FIGURES says; a pipeline DryRun and a plain launch both draw; in a
kernel the PNG goes to the notebook instead; without matplotlib one line of text stands in,
and a lesson run that way prints the same numbers."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import minipar as mp
from minipar.course import find_lesson
from minipar.parallel.pp import dry_run, lower, schedule
from minipar.runtime.trace import Event
from minipar.viz import figures

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.skipif(not figures.available(),
                                      reason="needs matplotlib (pip install -e '.[test]')")


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 2000


@pytest.fixture
def out(tmp_path, monkeypatch):
    """Figures go to tmp_path/figs ($MINIPAR_FIGURES)."""
    monkeypatch.setenv("MINIPAR_FIGURES", str(tmp_path / "figs"))
    return tmp_path / "figs"


def step(ctx):
    ctx.compute(2e10, "bfloat16")
    mp.all_reduce(np.ones(2**18, np.float32))
    ctx.compute(1e10, "bfloat16")


# ---- refused data --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "has space", "../up", "a/b", "-dash", None])
def test_a_name_that_cannot_be_a_file_name_is_refused(name, out):
    with pytest.raises(ValueError, match=r"expected letters, digits.*received") as info:
        figures.bars(name, "t", ["a"], {"s": [1]}, ylabel="y")
    assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="received"):
        figures.timeline(name, "t", [Event(0, "compute", "mm", 0.0, 1.0)])
    assert not out.exists()


def test_a_series_of_the_wrong_length_says_expected_and_received(out):
    with pytest.raises(ValueError, match=r"series 'b' has 2 values, expected 3, one per "
                                         r"category"):
        figures.bars("x", "t", ["p", "q", "r"], {"a": [1, 2, 3], "b": [1, 2]}, ylabel="y")
    with pytest.raises(ValueError, match=r"series 'a' has 4 values, expected 3, one per "
                                         r"x value"):
        figures.lines("x", "t", [1, 2, 3], {"a": [1, 2, 3, 4]}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match=r"expected at least one series.*received \{\}"):
        figures.lines("x", "t", [1], {}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="no events to draw"):
        figures.timeline("x", "t", [])
    with pytest.raises(ValueError, match=r"expected at least one source"):
        figures.timelines("x", "t", {})
    assert not out.exists()


# ---- where a figure goes ---------------------------------------------------------------
def test_directory_is_minipar_figures_else_beside_the_script_else_the_working_directory(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAR_FIGURES", str(tmp_path / "mine"))
    assert figures.directory() == tmp_path / "mine"
    monkeypatch.delenv("MINIPAR_FIGURES")
    script = tmp_path / "lessons" / "99_x" / "lesson.py"
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    assert figures.directory() == script.parent / "figures"
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace())  # python -c
    monkeypatch.chdir(tmp_path)
    assert figures.directory() == tmp_path / "figures"


@needs_matplotlib
def test_bars_and_lines_write_pngs_and_say_where(out, capsys):
    got = [
        figures.bars("t_bars", "Stacked, annotated, a limit", ["DDP", "ZeRO-1", "a category "
                     "long enough to wrap"], {"w": [2, 2, 2], "g": [2, 2, 0.5],
                                              "o": [12, 1.5, 1.5]},
                     ylabel="bytes", stacked=True, annotate="{:.1f}", hline=(16, "16")),
        figures.bars("t_grouped", "Grouped, log", ["a", "b"], {"x": [1, 100], "y": [10, 1e4]},
                     ylabel="y", logy=True),
        figures.lines("t_lines", "Lines", [1, 2, 4, 8], {"one": [3, 1.5, 0.75, 0.375],
                                                         "two": [3, 1.5, 0.75, 0.375]},
                      xlabel="m", ylabel="bubble", logx=True, hline=(0.5, "half")),
    ]
    assert got == [out / "t_bars.png", out / "t_grouped.png", out / "t_lines.png"]
    assert all(is_png(p) for p in got)
    said = capsys.readouterr().out.splitlines()
    assert said == [f"[figure: {p}]" for p in got]


@needs_matplotlib
def test_a_pipeline_dry_run_and_a_plain_launch_both_draw(out):
    d = dry_run(lower(schedule("zb_h1", 4, 6)), {"F": 1, "I": 1, "W": 1})
    run = mp.launch(step, 4)
    assert is_png(figures.timeline("t_dry", "ZB-H1", d))
    assert is_png(figures.timeline("t_run", "A launch", run))
    assert is_png(figures.timeline("t_events", "Its events, a window", run.events(),
                                   start=1e-5, end=4e-5, world_size=4))
    with pytest.raises(ValueError, match="no event between"):
        figures.timeline("t_none", "Nothing there", run, start=1.0)
    v = dry_run(lower(schedule("dualpipev", 4, 8)), {"F": 1, "I": 1, "W": 1, "B": 2, "F&B": 2})
    assert is_png(figures.timelines("t_both", "On one clock", {"ZB-H1": d, "DualPipeV": v}))
    assert is_png(figures.timelines("t_runs", "Two runs, each from its start",
                                    {"a": run, "b": run}, starts={"b": 1e-5}))
    assert is_png(figures.timelines("t_part", "Their first 20 µs", {"a": run, "b": run},
                                    starts={"b": 1e-5}, length=2e-5))


@needs_matplotlib
def test_in_a_kernel_the_png_goes_to_the_notebook_not_to_a_file(tmp_path, monkeypatch,
                                                                 capsys):
    published = []
    shell = types.SimpleNamespace(kernel=object(), display_pub=types.SimpleNamespace(
        publish=lambda data, metadata: published.append((data, metadata))))
    monkeypatch.setitem(sys.modules, "IPython",
                        types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.delenv("MINIPAR_FIGURES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert figures.directory() is None
    assert figures.bars("t_inline", "Inline", ["a"], {"s": [1]}, ylabel="y") is None
    (data, metadata), = published
    assert base64.b64decode(data["image/png"]).startswith(PNG)
    assert data["text/plain"] == "<figure t_inline: Inline>" and "image/png" in metadata
    assert capsys.readouterr().out == "" and not list(tmp_path.iterdir())


# ---- without matplotlib ------------------------------------------------------------------
def test_without_matplotlib_a_line_of_text_stands_in(out, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    assert not figures.available()
    d = dry_run(lower(schedule("1f1b", 2, 2)), {"F": 1, "B": 2})
    assert figures.bars("t", "Some bars", ["a"], {"s": [1]}, ylabel="y") is None
    assert figures.lines("t", "Some lines", [1], {"s": [1]}, xlabel="x", ylabel="y") is None
    assert figures.timeline("t", "A timeline", d) is None
    assert figures.timelines("t", "Timelines", {"d": d}) is None
    said = capsys.readouterr().out.splitlines()
    assert [ln.split("'")[1] for ln in said] == ["Some bars", "Some lines", "A timeline",
                                                 "Timelines"]
    assert all(ln.startswith("[figure not drawn: ") and "pip install -e \".[plots]\"" in ln
               for ln in said)
    assert not out.exists()
    with pytest.raises(ValueError, match="expected 1"):  # the data are still checked
        figures.bars("t", "t", ["a"], {"s": [1, 2]}, ylabel="y")


@pytest.mark.timeout(60)
def test_a_lesson_without_matplotlib_runs_and_prints_the_same_numbers(run_lesson, tmp_path):
    """Lesson 00 run with matplotlib unimportable: it exits 0, says what it did not draw
    where it would have drawn, and prints everything else exactly as with figures."""
    lesson = str(find_lesson("00").path("lesson"))
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIPAR_FIGURES=str(tmp_path))
    bare = subprocess.run([sys.executable, "-c", code, lesson], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0, bare.stderr[-3000:]
    drawn = run_lesson(lesson).stdout.splitlines()
    said = bare.stdout.splitlines()
    not_drawn = [ln for ln in said if ln.startswith("[figure not drawn: ")]
    assert len(not_drawn) == sum(ln.startswith("[figure: ") for ln in drawn) >= 1
    assert [ln for ln in said if ln not in not_drawn] == [
        ln for ln in drawn if not ln.startswith("[figure: ")]
    assert not list(tmp_path.iterdir())
