"""`minipar demo`'s page: one self-contained HTML file (styles, script and data inline).

    html = render_page(data)        # data: plain JSON-able dict (programs/demo.py builds it)

The page is three readable files beside this one, joined at render time: page.html (the
markup, with {{CSS}}, {{JS}} and {{DATA}} where the others go), demo.css and demo.js
(vanilla JavaScript, no library, no network: it opens from file://). The data goes in a
`<script type="application/json">` block, with "<" escaped so no string in it can end the
block. Only the architecture mode is built; the page says so.
"""

from __future__ import annotations

import json
from importlib import resources

PARTS = ("page.html", "demo.css", "demo.js")


def _read(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def render_page(data: dict) -> str:
    """The page with `data` embedded: a string of HTML that needs nothing else."""
    page, css, js = (_read(n) for n in PARTS)
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return page.replace("{{CSS}}", css).replace("{{JS}}", js).replace("{{DATA}}", payload)
