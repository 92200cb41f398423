"""Every lesson opens as a notebook and runs as one: jupytext reads lesson.py (py:percent)
into a notebook, nbclient executes it cell by cell in a fresh IPython kernel, from the
repository's root as `python lessons/NN_topic/lesson.py` runs it.

A cell that raises fails the test with the cell's source and the traceback; every code cell
that prints must have printed (a notebook whose outputs went missing is as broken as one
that raises). The cells' text is the file's: the conversion round-trips (all but the
header, where jupytext records its version). Lessons 00–10 draw their figures inline: each
notebook must hold at least one image/png output, a real PNG (minipar.viz.figures; without
matplotlib, the line saying what was not drawn).

Executing eleven lessons in kernels costs about a minute of processor time, so these tests
are marked `notebooks` and run by .ci/run beside the MPI and scale tests, not by the
README's command (setup.cfg deselects them); they skip, saying why, without jupytext,
nbclient or ipykernel (the test extras bring them).
"""

from __future__ import annotations

import base64
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from minipar.course import all_lessons
from minipar.viz import figures

jupytext = pytest.importorskip("jupytext", reason="the notebook tests need jupytext "
                                                  "(pip install -e '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient "
                                                  "(pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel "
                                        "(pip install -e '.[test]')")

pytestmark = pytest.mark.notebooks
ROOT = Path(__file__).resolve().parents[2]
LESSONS = all_lessons()


def prints(source: str) -> bool:
    """Whether a code cell writes to stdout when run: a print( call at the cell's top level
    or inside a loop; a cell of definitions and assignments may print nothing."""
    return any(line.lstrip().startswith("print(") for line in source.splitlines())


def pngs(nb) -> list[bytes]:
    """The images an executed notebook shows: each image/png output, decoded."""
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells
            for o in c.get("outputs", []) if "image/png" in o.get("data", {})]


def execute(path: Path, drawn: bool = False) -> list[str]:
    """Run the py:percent file at `path` as a notebook; what is wrong with it (empty: it
    round-trips, runs without an error, and every cell that prints printed; and with
    `drawn`, it shows at least one figure, each a non-empty PNG, where matplotlib is
    installed, or says what it did not draw)."""
    nb = jupytext.read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or not any(c.cell_type == "markdown" for c in nb.cells):
        return ["no code or no markdown cells"]

    def body(text):  # after the YAML header (jupytext writes its version into it)
        return text.split("# ---\n", 2)[-1]
    if body(jupytext.writes(nb, fmt="py:percent")) != body(path.read_text(encoding="utf-8")):
        return ["the notebook does not convert back to the same file"]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    with redirect_stdout(io.StringIO()):
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as e:
            return [f"a cell raised when run as a notebook:\n{e}"[:6000]]
    problems = [f"a cell that prints printed nothing: {c.source[:200]!r}" for c in code
                if prints(c.source) and not any(o.output_type == "stream" and
                                                 o.get("name") == "stdout"
                                                 for o in c.get("outputs", []))]
    if drawn and figures.available():
        shown = pngs(nb)
        problems += [] if shown else ["no figure shown: no image/png output in any cell"]
        problems += [f"figure {i} is not a PNG of any size: {len(png)} bytes, starting "
                     f"{png[:8]!r}" for i, png in enumerate(shown)
                     if not (png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000)]
    elif drawn:
        text = "".join(o.get("text", "") for c in code for o in c.get("outputs", []))
        problems += [] if "[figure not drawn: " in text else ["no figure, and no line saying so"]
    return problems


@pytest.fixture(autouse=True)
def figures_inline(monkeypatch):
    """The kernel draws its figures inline (tests/conftest.py turns them off for the
    lessons the other tests run in their own process)."""
    monkeypatch.delenv("MINIPAR_FIGURES", raising=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.name for lesson in LESSONS])
def test_every_lesson_executes_as_a_notebook(lesson):
    assert execute(lesson.path("lesson"), drawn=True) == [], lesson.name


HEADER = """# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A planted lesson

"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell,says", [
    ("# %%\nx = {}\nprint(x['missing'])\n", "a cell raised"),
    ("# %%\nif False:\n    print('never')\n", "printed nothing"),
])
def test_a_lesson_that_raises_or_prints_nothing_fails(tmp_path, cell, says):
    path = tmp_path / "lesson.py"
    path.write_text(HEADER + "# %%\nprint('fine')\n\n" + cell, encoding="utf-8")
    problems = execute(path)
    assert problems and says in problems[0], problems
