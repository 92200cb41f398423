"""`minipar demo`'s page: one self-contained HTML file (styles, script and data inline).

    html = render_page(data)        # data: plain JSON-able dict (programs/demo.py builds it)

The page is readable files beside this one, joined at render time: page.html (the markup,
with {{CSS}}, {{JS}} and {{DATA}} where the others go), demo.css, and the script in parts,
each one idea, joined in PARTS' order inside one function (they share its scope):

    common.js        the data, the palette, DOM helpers, number formats (minipar's)
    architecture.js  nodes and GPUs with the mesh laid on them
    controls.js      the scenario controls' rules: options, keys, minipar's refusals
    scenario.js      the scenario controls on the page, the source line and the numbers
    data.js          one global batch's journey, stepped through the trace
    state.js         each rank's memory: peaks by category, and over the step
    performance.js   per-rank timelines, the time split, schedules side by side
    tabs.js          the four modes as a tablist (and #mode in the address); start-up;
                     window.minipar

Vanilla JavaScript, no library, no network: it opens from file://. The data goes in a
`<script type="application/json">` block, with "<" escaped so no string in it can end the
block.
"""

from __future__ import annotations

import json
from importlib import resources

PARTS = ("page.html", "demo.css", "common.js", "architecture.js", "controls.js", "scenario.js",
         "data.js", "state.js", "performance.js", "tabs.js")


def _read(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def render_page(data: dict) -> str:
    """The page with `data` embedded: a string of HTML that needs nothing else."""
    page, css, *scripts = (_read(n) for n in PARTS)
    js = "\n".join(scripts)
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return page.replace("{{CSS}}", css).replace("{{JS}}", js).replace("{{DATA}}", payload)
