"""Paths inside a service's data dir, and atomic writes (a crash never leaves half a file)."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping, Optional

from mistk_rl.errors import InvalidRequest

MAX_NAME_BYTES = 255  # one path component, on the file systems Linux uses


def resolve_in(root: Path, path: str, shares: Optional[Mapping[str, Path]] = None) -> Path:
    """`path` as a file inside `root`; raises InvalidRequest (400) when it would escape it,
    name `root` itself or a directory, or could not be a file name at all (NUL, a component
    longer than the file system takes), so a save never fails half-way for a bad name.

    `shares` (``mistk-rl serve --share NAME=DIR``): a path whose first component is NAME
    resolves inside DIR instead, the one directory outside the data dir the operator opened
    (a league's snapshots, written by one service and read by others). Symlinks are never
    followed out of a root: a caller cannot create them, so one that escapes is refused."""
    if "\x00" in path:
        raise InvalidRequest(f"path {path!r} contains a NUL character")
    long = next(
        (
            part
            for part in Path(path).parts
            if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES
        ),
        None,
    )
    if long is not None:
        raise InvalidRequest(
            f"path {path!r}: the name {long[:40]!r}... is longer than {MAX_NAME_BYTES} bytes"
        )
    first, _, rest = path.partition("/")
    if shares and first in shares and rest:
        root, path = shares[first], rest
    base = Path(root).resolve()
    candidate = (base / path).resolve()
    if candidate != base and base not in candidate.parents:
        raise InvalidRequest(f"path {path!r} resolves outside the service's data dir")
    if candidate.is_dir():
        raise InvalidRequest(f"path {path!r} is a directory, not a file")
    return candidate


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: a temporary file beside it, fsynced and
    renamed over `path` when the block ends, removed if the block raises (for writes too big
    to hold in memory first, e.g. a long run's episodes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would make it (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    with atomic_writer(path) as fh:
        fh.write(data)


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would race other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


_UMASK = _umask()


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())
