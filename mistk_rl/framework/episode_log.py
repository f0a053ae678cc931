"""`EpisodeLog`: an orchestrator's finished episodes, kept on disk instead of in memory.

A league plays thousands of games a second and a soak runs for days: a list of result dicts
grew by a few hundred bytes per episode for as long as the service lived. The log appends
each episode as one JSON line to an unlinked temporary file (in ``$TMPDIR``; nothing is
left behind, even when the process is killed) and keeps in memory only the count and the
file offset of every `STRIDE`-th episode, so reading from any episode on seeks close to it
and skips at most `STRIDE` - 1 lines. It reads like the list it replaces (``len``,
indexing, slices, iteration), each read served from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union, overload

from mistk_rl.files import atomic_writer

STRIDE = 256  # episodes between two remembered offsets: 8 bytes of memory per 256 episodes
READ_CHUNK = 1 << 16


class _File:
    """One generation of the log: `clear` starts another, so a reader still going through
    the old one reads it to its end, unaffected."""

    def __init__(self) -> None:
        self.fh: BinaryIO = tempfile.TemporaryFile(prefix="mistk-episodes-")
        self.offsets = array("q")  # the byte offset of episode i * STRIDE
        self.count = 0
        self.end = 0


class EpisodeLog(Sequence[dict[str, Any]]):
    """Append-only, disk-backed episodes; thread-safe (the episode thread appends while
    request handlers read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: Optional[_File] = None  # opened by the first append

    def append(self, episode: dict[str, Any]) -> None:
        line = (json.dumps(episode, separators=(",", ":")) + "\n").encode()
        with self._lock:
            file = self._file
            if file is None:
                file = self._file = _File()
            if file.count % STRIDE == 0:
                file.offsets.append(file.end)
            view = memoryview(line)
            while view:  # a regular file takes it whole; loop in case it does not
                written = os.pwrite(file.fh.fileno(), view, file.end)
                file.end += written
                view = view[written:]
            file.count += 1

    def clear(self) -> None:
        """Forget every episode (initialize and reset start the numbering again)."""
        with self._lock:
            self._file = None  # closed when the last reader lets go of it

    def __len__(self) -> int:
        file = self._file
        return 0 if file is None else file.count

    def read(self, since: int = 0, limit: Optional[int] = None) -> list[dict[str, Any]]:
        """Episodes numbered `since` on, at most `limit` of them."""
        return list(self.iter(since, limit))

    def iter(self, since: int = 0, limit: Optional[int] = None) -> Iterator[dict[str, Any]]:
        """As `read`, one episode at a time: the episodes there were when the first was
        read (a reader meanwhile sees no later ones, nor a `clear`)."""
        for line in self._lines(since, limit):
            yield json.loads(line)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter()

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[dict[str, Any], list[dict[str, Any]]]:
        count = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(count)
            if step != 1:
                return self.read()[index]
            return self.read(start, max(0, stop - start))
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"episode {index} of {count}")
        return self.read(index, 1)[0]

    def save(self, path: Path, **extra: Any) -> None:
        """Write ``{"episodes": [...], **extra}`` to `path` atomically, streamed from disk
        (a long run's episodes need not fit in memory)."""
        with atomic_writer(path) as out:
            out.write(b'{"episodes": [')
            for i, line in enumerate(self._lines(0, None)):
                out.write(b"\n  " if i == 0 else b",\n  ")
                out.write(line)
            out.write(b"\n]")
            for key, value in extra.items():
                out.write(f", {json.dumps(key)}: {json.dumps(value)}".encode())
            out.write(b"}\n")

    def _lines(self, since: int, limit: Optional[int]) -> Iterator[bytes]:
        """The raw JSON lines of episodes `since` on (at most `limit`), as of this call."""
        with self._lock:
            file = self._file
            if file is None or since >= file.count or limit == 0:
                return
            count, end = file.count, file.end
            offset = file.offsets[since // STRIDE]
        skip = since % STRIDE
        left = count - since if limit is None else min(limit, count - since)
        pending = b""
        fd = file.fh.fileno()
        while offset < end and left:
            chunk = os.pread(fd, min(READ_CHUNK, end - offset), offset)
            if not chunk:  # shorter than written: cannot happen, but never loop on it
                return
            offset += len(chunk)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if skip:
                    skip -= 1
                    continue
                yield line
                left -= 1
                if not left:
                    return
