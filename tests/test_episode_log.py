"""Episodes on disk: the orchestrator's `EpisodeLog` (reads like the list it replaced,
from the file), paged getResults through the SDK, and the harness's `EpisodesFile` (a
resumed run keeps the checkpoint's episodes and numbers on)."""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from harness.episodes import EpisodesFile, read_episodes
from harness.training import Progress
from mistk_rl.framework.episode_log import STRIDE, EpisodeLog
from mistk_rl.sdk.client import OrchestratorClient
from mistk_rl.sdk.schemas import EpisodeResult, Results


def _episode(i: int) -> dict:
    return {"episode": i, "agent": "a", "return": float(i), "length": i % 7 + 1}


def _log(n: int) -> EpisodeLog:
    log = EpisodeLog()
    for i in range(n):
        log.append(_episode(i))
    return log


@pytest.mark.parametrize("n", [0, 1, STRIDE - 1, STRIDE, 3 * STRIDE + 5])
def test_reads_from_any_episode_as_a_list_would(n):
    log, kept = _log(n), [_episode(i) for i in range(n)]
    assert len(log) == n and list(log) == kept
    for since in {0, 1, STRIDE - 1, STRIDE, STRIDE + 1, max(0, n - 1), n, n + 10}:
        assert log.read(since) == kept[since:]
        for limit in (1, 2, STRIDE, 10_000):
            assert log.read(since, limit) == kept[since : since + limit]
    assert log[-1:] == kept[-1:] and log[2:5] == kept[2:5] and log[::2] == kept[::2]
    if n:
        assert log[0] == kept[0] and log[-1] == kept[-1]
    with pytest.raises(IndexError):
        log[n]


def test_clear_starts_again_and_a_reader_of_the_old_episodes_finishes():
    log = _log(2 * STRIDE)
    reader = log.iter(STRIDE - 1)
    assert next(reader) == _episode(STRIDE - 1)
    log.clear()
    assert len(log) == 0 and log.read() == []
    log.append(_episode(0))
    assert log.read() == [_episode(0)]
    assert [e["episode"] for e in reader] == list(range(STRIDE, 2 * STRIDE))


def test_memory_does_not_grow_with_the_episodes():
    log = _log(10)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            log.append(_episode(i))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a list of these dicts holds ~300 bytes each (6 MB); the log, its offsets (8 bytes
    # per STRIDE episodes) and whatever the allocator keeps for reuse
    assert grown < 50_000, grown


def test_readers_while_the_episodes_are_appended_see_whole_episodes():
    log, done = EpisodeLog(), threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not done.is_set():
            episodes = log.read(max(0, len(log) - 50))
            seen.append(len(episodes))
            assert all(e == _episode(e["episode"]) for e in episodes)

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(5000):
        log.append(_episode(i))
    done.set()
    reader.join(timeout=30)
    assert not reader.is_alive() and seen and log.read() == [_episode(i) for i in range(5000)]


def test_save_writes_every_episode_as_json(tmp_path):
    for n in (0, 1, 600):
        _log(n).save(tmp_path / "e.json", totals={"a": 1})
        saved = json.loads((tmp_path / "e.json").read_text())
        assert saved == {"episodes": [_episode(i) for i in range(n)], "totals": {"a": 1}}


class _Orchestrator:
    """The SDK's paging (`OrchestratorClient.iter_episodes`) over an EpisodeLog, as the
    service answers getResults (tests/test_gym_orchestrator.py pages a real one)."""

    def __init__(self, log: EpisodeLog, page: int) -> None:
        self.log, self.page, self.calls = log, page, 0

    def get_results(self, since: int = 0, limit: int | None = None) -> Results:
        self.calls += 1
        return Results.model_validate({"episodes": self.log.read(since, limit)})

    def iter_episodes(self, since: int = 0) -> Iterator[EpisodeResult]:
        return OrchestratorClient.iter_episodes(self, since, self.page)  # type: ignore[arg-type]


def test_the_run_file_appends_in_pages_and_a_resume_keeps_the_checkpoints_episodes(tmp_path):
    log = _log(25)
    orch = _Orchestrator(log, page=10)
    first = EpisodesFile(tmp_path)
    assert first.sync(orch) == 25 and orch.calls == 3  # 10 + 10 + 5
    assert first.sync(orch) == 25  # nothing new: one short page
    log.append(_episode(25))
    assert first.sync(orch) == 26 and first.mean_return == pytest.approx(12.5)
    # a resume from a checkpoint that had saved 20: the orchestrator starts from 0 again
    resumed = EpisodesFile(tmp_path, keep=20)
    assert resumed.count == 20 and len(read_episodes(tmp_path)) == 20
    again = _log(3)
    resumed.sync(_Orchestrator(again, page=10))
    episodes = read_episodes(str(tmp_path))
    assert [e["episode"] for e in episodes] == list(range(23))
    assert [e["return"] for e in episodes[20:]] == [0.0, 1.0, 2.0]
    assert EpisodeResult.model_validate(episodes[-1]).return_ == 2.0
    with pytest.raises(ValueError, match="holds 23 episodes; the checkpoint saved 30"):
        EpisodesFile(tmp_path, keep=30)


def test_a_progress_file_from_before_moves_its_episodes_to_the_run_file(tmp_path):
    old = [{"episode": i, "agent": "a", "return": 1.0, "length": 3} for i in range(4)]
    (tmp_path / "progress.json").write_text(json.dumps({"train_steps": 12, "episodes": old}))
    progress = Progress.load(tmp_path)
    assert progress.train_steps == 12 and progress.episodes_saved == 4
    assert read_episodes(tmp_path) == old
