"""A real browser for the tests: Debian's chromium, headless, driven over the DevTools
protocol (its JSON-over-WebSocket API; `websockets`' synchronous client). Small on purpose:
open a page, evaluate JavaScript in it, wait (with a timeout) until an expression holds,
take a screenshot."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws, self._id = ws, 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # (events arrive in between: skip them)
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """The expression's value once it is truthy (one that throws, e.g. on an element
        not drawn yet, counts as not yet); AssertionError after `timeout` s."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:
                value = exc
            if value and not isinstance(value, Exception):
                return value
            time.sleep(0.1)  # (polling the page's state, which its own timer changes)
        raise AssertionError(f"{expression} still {value!r} after {timeout} s")

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        Path(path).write_bytes(base64.b64decode(shot["data"]))


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


class Browser:
    """Headless chromium with its own profile, stopped (and the profile removed) on exit."""

    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        assert CHROMIUM is not None, "no chromium on PATH"
        self.profile = Path(tempfile.mkdtemp(prefix="mistk-chromium-"))
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",  # (root in a container)
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # (its helpers in its group: `close` stops them all)
        )
        self.port = self._port(timeout=30)
        self._sockets = ExitStack()

    def _port(self, timeout: float) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            time.sleep(0.05)  # (the file chromium writes once it listens)
        raise RuntimeError(f"chromium wrote no {active} in {timeout} s")

    def open(self, url: str, width: Optional[int] = None, height: Optional[int] = None) -> Page:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT"
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            target = json.load(answer)
        ws = self._sockets.enter_context(
            connect(
                target["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=10, proxy=None
            )
        )
        page = Page(ws)
        page.call("Runtime.enable")
        if width and height:
            page.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        return page

    def close(self) -> None:
        self._sockets.close()
        group = self.process.pid
        _signal_group(group, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _signal_group(group, signal.SIGKILL)  # (a helper that outlived the browser)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
