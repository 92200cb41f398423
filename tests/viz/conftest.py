"""The browser set-up of the demo's tests (tests/viz/test_demo_*.py): `minipar demo`'s page
in Debian's chromium, driven by Playwright for Python, and the helpers that read it.

Playwright's own browser download cannot work on these machines, so the tests launch
/usr/bin/chromium (the `chromium` Debian package; .ci/run installs it) and skip, saying
why, where it or the playwright package is missing. MINIPAR_CHROMIUM names another binary.
The page is the session's (tests/conftest.py's demo_page: written once, about 10 s). It is
opened from file:// with every other request refused, so it must work offline. The
README's command deselects the `browser` tests (setup.cfg); .ci/run runs them with
`-m browser`.

Each demo file marks itself `pytestmark = [pytest.mark.browser,
pytest.mark.usefixtures("sync_api")]`: the skip is the `sync_api` fixture's, so the other
tests of this folder (test_chrome.py, test_pipeline.py, test_timeline.py) neither skip nor
carry the mark. The page-reading helpers more than one file uses are fixtures that return
them (open_page, scenario_key, value, shown_numbers, fmt_time, modes).
"""

from __future__ import annotations

import math
import os

import pytest

from minipar.runtime.ledger import fmt_bytes

CHROMIUM = os.environ.get("MINIPAR_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MODES = ("architecture", "data", "state", "performance")


@pytest.fixture(scope="session")
def sync_api():
    """playwright.sync_api, or a skip saying what is missing: the playwright package, or a
    browser at CHROMIUM."""
    api = pytest.importorskip("playwright.sync_api", exc_type=ImportError,
                              reason="the playwright package cannot be imported (pip install "
                                     "-e '.[test]' installs it)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no browser at {CHROMIUM}: install Debian's chromium (apt-get install "
                    f"chromium; .ci/run does) or set MINIPAR_CHROMIUM")
    return api


@pytest.fixture(scope="module")
def page_url(demo_page):
    return demo_page[0].as_uri()


@pytest.fixture(scope="module")
def data(demo_page):
    return demo_page[1]


@pytest.fixture(scope="module")
def context(sync_api):
    """One chromium, and one context of it (a fresh profile) for the module's pages."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = b.new_context(viewport={"width": 1280, "height": 800})
        yield context
        context.close()
        b.close()


def _open_page(context, url: str, allowed=None, width: int = 1280, height: int = 800):
    """A new page at width x height with `url` open; `page.problems` collects console
    errors and warnings, uncaught exceptions and any request for something else than the
    page (or than allowed(url)). Close it with page.close()."""
    pg = context.new_page()
    pg.set_viewport_size({"width": width, "height": height})
    pg.problems = []
    pg.on("console", lambda m: m.type in ("error", "warning")
          and pg.problems.append(f"console {m.type}: {m.text}"))
    pg.on("pageerror", lambda e: pg.problems.append(f"uncaught: {e}"))

    def refuse_network(route):
        u = route.request.url
        if u != url.split("#")[0] and not (allowed and allowed(u)):
            pg.problems.append(f"request: {u}")
            return route.abort()
        return route.continue_()
    pg.route("**/*", refuse_network)
    pg.goto(url)
    return pg


@pytest.fixture(scope="session")
def open_page():
    """open_page(context, url, allowed=None, width=1280, height=800) -> a page with its
    `problems` log (_open_page)."""
    return _open_page


@pytest.fixture
def page(context, page_url):
    """The demo from file:// at 1280x800 (open_page)."""
    pg = _open_page(context, page_url)
    yield pg
    pg.close()


@pytest.fixture(scope="session")
def modes():
    """The page's four modes, in the order of their tabs."""
    return MODES


# ------------------------------------------------------------- reading the scenario shown

def _scenario_key(pg) -> str | None:
    return pg.evaluate("window.minipar.scenario() && window.minipar.scenario().scenario.key")


def _value(pg, id_: str) -> float:
    return float(pg.get_attribute(f"#{id_}", "data-value"))


def to_precision(x: float, digits: int) -> str:
    """x with `digits` significant digits, trailing zeros kept (JavaScript's toPrecision,
    for the numbers shown here)."""
    return f"{x:.{max(0, digits - 1 - math.floor(math.log10(abs(x))))}f}"


def _fmt_time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(t) >= scale or unit == "ns":
            return f"{to_precision(t / scale, 4)} {unit}"


FORMATS = {"num-step-time": _fmt_time, "num-compute": lambda x: f"{x * 100:.1f}%",
           "num-comm": lambda x: f"{x * 100:.1f}%", "num-idle": lambda x: f"{x * 100:.1f}%",
           "num-mfu": lambda x: to_precision(x * 100, 3) + "%",
           "num-peak": lambda x: fmt_bytes(int(x))}
FIELDS = {"num-step-time": "step_time", "num-compute": "compute_share",
          "num-comm": "comm_share", "num-idle": "idle_share", "num-mfu": "mfu",
          "num-peak": "peak_memory"}


def _shown_numbers(pg, sc: dict) -> dict:
    """The numbers panel: each data-value is the scenario's, its text the value formatted."""
    out = {}
    for id_, fmt in FORMATS.items():
        v = _value(pg, id_)
        assert v == sc["numbers"][FIELDS[id_]], id_
        assert pg.inner_text(f"#{id_}") == fmt(v), id_
        out[id_] = v
    where = pg.inner_text("#num-peak-where")
    assert f"rank {sc['numbers']['peak_rank']}" in where
    over = sc["numbers"]["peak_memory"] > sc["capacity"]
    assert ("does not fit in " + fmt_bytes(sc["capacity"]) in where) == over
    return out


@pytest.fixture(scope="session")
def scenario_key():
    """scenario_key(page) -> the key of the scenario the page draws, or None."""
    return _scenario_key


@pytest.fixture(scope="session")
def value():
    """value(page, id) -> the element's data-value (the raw number behind its text)."""
    return _value


@pytest.fixture(scope="session")
def fmt_time():
    """fmt_time(seconds) -> the text the page shows for a time (4 significant digits)."""
    return _fmt_time


@pytest.fixture(scope="session")
def shown_numbers():
    """shown_numbers(page, scenario data) -> the numbers panel's values, after asserting
    each is the scenario's and shown formatted as the page formats it."""
    return _shown_numbers
