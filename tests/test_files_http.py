"""getFile / putFile: files (checkpoints, snapshots) move between services over HTTP, so
services on machines that share no file system can hand each other weights."""

from __future__ import annotations

import hashlib
import os

import pytest
import requests

from mistk_rl.sdk.client import BadRequest, Conflict, NotFound, PayloadTooLarge
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT


def test_a_checkpoint_copied_between_two_agents_builds_the_same_model(launch):
    """One agent saves a checkpoint; its bytes go through getFile and putFile into another
    agent's data dir, which builds its model from it."""
    first, second = launch("agent", RANDOM_AGENT), launch("agent", RANDOM_AGENT)
    a, b = first.client(), second.client()
    a.initialize(hyperparameters={"seed": 42})
    a.build_model()
    a.save_model("checkpoints/step-10.json")
    data = a.get_file("checkpoints/step-10.json")
    assert data == (first.data_dir / "checkpoints" / "step-10.json").read_bytes()

    assert b.put_file("from-a/step-10.json", data).sha256 == hashlib.sha256(data).hexdigest()
    assert (second.data_dir / "from-a" / "step-10.json").read_bytes() == data
    b.initialize()
    assert b.build_model("from-a/step-10.json").state == "initialized"
    b.save_model("again.json")
    assert b.get_file("again.json") == data  # the same model: seed 42 came with it


def test_binary_files_round_trip_unchanged_and_replace_whole(launch):
    service = launch("orchestrator", GYM_ORCHESTRATOR)
    orch = service.client()
    blob = os.urandom(300_000) + b"\r\n\x00"
    orch.put_file("league/weights.bin", blob)
    assert orch.get_file("league/weights.bin") == blob
    orch.put_file("league/weights.bin", b"short")
    assert orch.get_file("league/weights.bin") == b"short"
    # nothing but the file itself is left in its directory (no temporary files)
    assert os.listdir(service.data_dir / "league") == ["weights.bin"]


def test_bad_file_requests_are_refused_and_change_nothing(launch):
    service = launch("agent", RANDOM_AGENT, extra_args=["--limit", "max_file_bytes=1000"])
    agent = service.client()
    before = sorted(p.name for p in service.data_dir.iterdir())
    with pytest.raises(NotFound, match="no file at 'missing.pt'"):
        agent.get_file("missing.pt")
    for path in ("../outside.pt", "/etc/passwd"):
        with pytest.raises(BadRequest, match="outside the service's data dir"):
            agent.get_file(path)
        with pytest.raises(BadRequest, match="outside the service's data dir"):
            agent.put_file(path, b"x")
    with pytest.raises(PayloadTooLarge):
        agent.put_file("big.pt", b"x" * 1001)
    answer = requests.put(
        f"{service.url}/v1/mistk/agent/files",
        params={"path": "a.pt"},
        data=b"{}",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == 415 and "application/octet-stream" in answer.json()["detail"]
    assert sorted(p.name for p in service.data_dir.iterdir()) == before
    agent.terminate()
    with pytest.raises(Conflict, match="putFile"):
        agent.put_file("late.pt", b"x")
