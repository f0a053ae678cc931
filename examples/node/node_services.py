"""Build the Node examples and run them as services, for the tests and the bench.

`build` runs ``npm ci`` (from the committed lockfile) and ``npm run build`` (types
generated from the packaged contracts, then tsc) in this directory; `start_node` starts
one service on a free loopback port and waits until it listens; `NodeService.stop` ends
it (its own process group, so nothing is left behind)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")
ENTRY = {"agent": "dist/agent/main.js", "orchestrator": "dist/orchestrator/main.js"}


def missing_tools() -> Optional[str]:
    """Why the examples cannot be built here (no node or npm), else None."""
    absent = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    return f"{' and '.join(absent)} not on PATH" if absent else None


def _inputs() -> str:
    """A digest of what the build reads: the lockfile, the sources and the specs."""
    digest = hashlib.sha256()
    specs = HERE.parent.parent / "mistk_rl" / "openapi"
    files = [HERE / "package-lock.json", HERE / "tsconfig.json", *sorted(specs.glob("*.yaml"))]
    files += sorted(p for p in (HERE / "src").rglob("*.ts") if "generated" not in p.parts)
    for path in files:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def build(timeout: float = 600.0) -> None:
    """npm ci, then npm run build, unless the build in dist/ was made from these inputs;
    one process at a time (test workers share this folder: a second `npm ci` would delete
    node_modules under services the first one started). CalledProcessError with npm's
    output when a step fails."""
    stamp = HERE / "dist" / ".inputs"
    with open(HERE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        inputs = _inputs()
        if stamp.exists() and stamp.read_text() == inputs:
            return
        for command in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"]):
            subprocess.run(
                command, cwd=HERE, check=True, capture_output=True, text=True, timeout=timeout
            )
        stamp.write_text(inputs)


@dataclass
class NodeService:
    role: str
    url: str  # root URL, e.g. http://127.0.0.1:40123
    process: subprocess.Popen

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)


def start_node(
    role: str,
    data_dir: Path,
    log_path: Path,
    token: Optional[str] = None,
    timeout: float = 30.0,
) -> NodeService:
    """The Node `role` service on a free port (``--port 0``), once it listens."""
    env = {k: v for k, v in os.environ.items() if k != "MISTK_RL_TOKEN"}
    if token:
        env["MISTK_RL_TOKEN"] = token
    process = subprocess.Popen(
        ["node", ENTRY[role], "--port", "0", "--data-dir", str(data_dir)],
        cwd=HERE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    found: list[str] = []
    ready = threading.Event()

    def follow() -> None:  # (the log goes on being written after the first line)
        assert process.stdout is not None
        with open(log_path, "w") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()
                match = LISTENING.search(line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
        ready.set()

    threading.Thread(target=follow, daemon=True).start()
    if not ready.wait(timeout) or not found:
        NodeService(role, "", process).stop()
        raise RuntimeError(f"node {role} did not start: {log_path.read_text()[-2000:]}")
    return NodeService(role, found[0], process)
