"""Paths inside a service's data dir, and atomic writes (a crash never leaves half a file)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mistk_rl.errors import InvalidRequest


def resolve_in(root: Path, path: str) -> Path:
    """`path` resolved inside `root`; raises InvalidRequest (400) if it would escape it."""
    base = Path(root).resolve()
    candidate = (base / path).resolve()
    if candidate != base and base not in candidate.parents:
        raise InvalidRequest(f"path {path!r} resolves outside the service's data dir")
    return candidate


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())
