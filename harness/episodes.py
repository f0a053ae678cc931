"""A run's ``episodes.jsonl``: every episode (game) the run played, one JSON object a line,
appended as the run goes (at each checkpoint and at the end) instead of held in memory: a
long run plays millions, and results.json keeps only the summary a person opens.

The orchestrator numbers its episodes from 0 at each initialize; a resumed run's file keeps
the episodes its checkpoint had saved (`EpisodesFile(run_dir, keep)` drops the ones played
after it, which the resumed run plays again) and numbers the new ones on from there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional, Union

from mistk_rl.files import atomic_writer
from mistk_rl.sdk.client import OrchestratorClient

EPISODES = "episodes.jsonl"


class EpisodesFile:
    """``run_dir/episodes.jsonl`` and the count and mean return of what it holds."""

    def __init__(self, run_dir: Path, keep: int = 0) -> None:
        """Open it keeping its first `keep` episodes (a resumed run's checkpoint saved
        that many; 0: a new run, the file starts empty)."""
        self.path = Path(run_dir) / EPISODES
        self.count, self.return_sum = 0, 0.0
        self.base = keep  # this run's orchestrator episode 0 is line `base` of the file
        with atomic_writer(self.path) as out:
            for episode in _lines(self.path, keep):
                out.write(episode)
                self.count += 1
                self.return_sum += json.loads(episode)["return"]
        if self.count < keep:
            raise ValueError(
                f"{self.path} holds {self.count} episodes; the checkpoint saved {keep}"
            )

    @property
    def mean_return(self) -> Optional[float]:
        return self.return_sum / self.count if self.count else None

    def sync(self, orch: OrchestratorClient) -> int:
        """Append the episodes `orch` finished since the last sync (in pages); returns the
        count now in the file, flushed to disk."""
        with open(self.path, "ab") as out:
            for e in orch.iter_episodes(since=self.count - self.base):
                record = e.model_dump(by_alias=True, exclude_none=True)
                record["episode"] = e.episode + self.base
                out.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
                self.count += 1
                self.return_sum += e.return_
            out.flush()
            os.fsync(out.fileno())
        return self.count


def read_episodes(run_dir: Union[str, Path]) -> list[dict]:
    """The episodes a run wrote (`EpisodesFile`), as dicts."""
    return list(iter_episodes(run_dir))


def iter_episodes(run_dir: Union[str, Path]) -> Iterator[dict]:
    """As `read_episodes`, one at a time (a long run's file need not fit in memory)."""
    for line in _lines(Path(run_dir) / EPISODES):
        yield json.loads(line)


def _lines(path: Path, limit: Optional[int] = None) -> Iterator[bytes]:
    """The first `limit` (all: None) non-empty lines of `path`; none if it is missing."""
    if limit == 0 or not path.exists():
        return
    with open(path, "rb") as fh:
        for n, line in enumerate(ln for ln in fh if ln.strip()):
            if limit is not None and n >= limit:
                return
            yield line if line.endswith(b"\n") else line + b"\n"
