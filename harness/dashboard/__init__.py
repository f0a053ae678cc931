"""A live web page for runs and leagues: ``mistk-rl dashboard RUN_DIR...`` (or ``mistk-rl
run --dashboard``). It serves one page whose script (packaged here, no CDN: it works
offline) polls ``/api/view`` (`harness.dashboard.view.DashboardView`) every two seconds and
draws the return curves (seeds as bands), the evaluations, a league's payoff heatmap and
ratings over time, and the run's services with their state and rates (from their
``/metrics``).

The server is the standard library's, on a thread: it reads files and scrapes, and a
browser or two is all it serves. It binds 127.0.0.1 by default: a run's numbers are for
whoever can reach the port.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from harness.dashboard.view import DashboardView

log = logging.getLogger(__name__)

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


class Dashboard:
    """The page and its data for `run_dirs`, served on `host`:`port` (0: a free port) from
    a daemon thread until `close`."""

    def __init__(self, run_dirs: list[Path], host: str = "127.0.0.1", port: int = 0) -> None:
        self.view = DashboardView([Path(d) for d in run_dirs])
        self._server = ThreadingHTTPServer((host, port), _handler(self.view))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dashboard", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}/"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "Dashboard":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _handler(view: DashboardView) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # one view built at a time (the scraper's window is shared)

    class Handler(BaseHTTPRequestHandler):
        server_version = "mistk-rl-dashboard"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/view":
                with lock:
                    body = json.dumps(_finite(view.build()), allow_nan=False).encode()
                self._send(HTTPStatus.OK, "application/json", body)
            elif path in STATIC:
                name, kind = STATIC[path]
                self._send(HTTPStatus.OK, kind, _static(name))
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")

        def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("dashboard: " + format, *args)

    return Handler


def _static(name: str) -> bytes:
    return resources.files("harness.dashboard").joinpath("static").joinpath(name).read_bytes()


def _finite(value: Any) -> Any:
    """`value` as JSON holds it: NaN and infinities as null, numpy numbers as numbers."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (bool, str, int)) or value is None:
        return value
    number = float(value)
    return number if math.isfinite(number) else None
