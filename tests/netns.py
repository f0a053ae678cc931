"""A pytest of its own inside a loopback-only network namespace (``unshare --net
--map-root-user``, then ``ip link set lo up``): the cluster cases (Ray binds the machine's
interface address otherwise) and the hostile-client suite run there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent


def can_unshare() -> Optional[str]:
    """None if a loopback-only namespace can be made here, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(
        ["unshare", "--net", "--map-root-user", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.strip()[:200]}"
    return None


def pytest_in_namespace(
    args: str, timeout: float, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """``python -m pytest -q -p no:cacheprovider ARGS`` inside the namespace, from the repo
    root, with MISTK_RL_NETNS=1 (what the cases' fixtures look for)."""
    return subprocess.run(
        [
            "unshare",
            "--net",
            "--map-root-user",
            "sh",
            "-c",
            f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider {args}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "MISTK_RL_NETNS": "1", **(env or {})},
    )
