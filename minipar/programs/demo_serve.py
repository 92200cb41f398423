"""`minipar demo --serve`: the demo page on a local port, with a JSON API that computes any
scenario the page's controls ask for (standard library only).

    GET /                  the page (the same file `minipar demo` writes, with served: true)
    GET /api/scenario?model=tiny&dp=2&tp=2&pp=2&microbatches=4&chunks=1&schedule=1f1b
                          &zero=0&recompute=none
        200  the scenario's data (a real run of the tiny GPT, or the 70B's dry run or
             plan: programs/demo.py's scenario_data), computed once and kept
        400  {"error": "..."}: a parameter missing or not a number, or a scenario minipar
             cannot build (demo_scenario.check's message: which control to change)
    anything else          404

One scenario is computed at a time (a lock): a tiny run launches its ranks as threads.
The server listens on 127.0.0.1 unless told otherwise; it is a teaching tool, not a
service to expose.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import parse_qs, urlsplit

from ..viz.demo import render_page
from .demo_scenario import Scenario, check

INTS = ("dp", "tp", "pp", "microbatches", "chunks", "zero")
STRINGS = ("model", "schedule", "recompute")


def parse_query(query: str) -> Scenario:
    """The scenario a query string names, checked; a ValueError that says what is wrong."""
    got = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    missing = [k for k in STRINGS + INTS if k not in got]
    if missing:
        raise ValueError(f"the query lacks {', '.join(missing)}: give all of "
                         f"{', '.join(STRINGS + INTS)}")
    unknown = sorted(set(got) - set(STRINGS + INTS))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}: expected "
                         f"{', '.join(STRINGS + INTS)}")
    args = {k: got[k] for k in STRINGS}
    for k in INTS:
        try:
            args[k] = int(got[k])
        except ValueError:
            raise ValueError(f"{k} must be a whole number, got {got[k]!r}") from None
    return check(Scenario(**args))


class DemoServer(ThreadingHTTPServer):
    """The page and the scenario API (module docstring)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], data: dict,
                 compute: Callable[[Scenario], dict],
                 log: Optional[Callable[[str], None]] = None):
        self.page = render_page(dict(data, served=True)).encode("utf-8")
        self.cache = dict(data.get("scenarios", {}))
        self.compute, self.log = compute, log
        self.lock = threading.Lock()
        super().__init__(address, Handler)

    def scenario(self, s: Scenario) -> dict:
        with self.lock:
            if s.key not in self.cache:
                if self.log:
                    self.log(f"computing {s.key} ...")
                self.cache[s.key] = self.compute(s)
            return self.cache[s.key]


class Handler(BaseHTTPRequestHandler):
    server: DemoServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html", "/demo.html"):
            return self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        if url.path == "/api/scenario":
            try:
                s = parse_query(url.query)
            except ValueError as e:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return self._json(HTTPStatus.OK, self.server.scenario(s))
        self._json(HTTPStatus.NOT_FOUND, {"error": f"no such path {url.path!r}: the page "
                                                   f"is at / and the API at /api/scenario"})

    def _json(self, status: HTTPStatus, body: dict) -> None:
        self._send(status, json.dumps(body, separators=(",", ":")).encode("utf-8"),
                   "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's signature)
        if self.server.log:
            self.server.log(f"{self.address_string()} {format % args}")
