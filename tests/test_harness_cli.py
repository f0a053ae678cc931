"""`mistk-rl run` as a user runs it: a subprocess, real services, results on disk."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, group_alive


def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def _service_pids(run_dir: Path) -> list[int]:
    """gunicorn master pids of the run, read back from its logs."""
    pids = []
    for log in (run_dir / "logs").glob("*.log"):
        for line in log.read_text().splitlines():
            if "Listening at" in line or "Starting gunicorn" in line:
                pids.extend(int(tok.strip("[]")) for tok in line.split() if
                            tok.startswith("[") and tok.strip("[]").isdigit())
    return pids


def test_run_example_config_writes_results(tmp_path):
    out = tmp_path / "run"
    proc = _run([str(REPO / "configs" / "cartpole_random.yaml"), "--out", str(out)], REPO)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert len(results["episodes"]) == 3 and results["wall_s"] > 0
    for episode in results["episodes"]:
        assert {"agent", "return", "length"} <= set(episode)
        assert f"return {episode['return']:9.2f}" in proc.stdout
    assert (out / "data" / "player" / "player.json").exists()  # saveModel
    assert (out / "data" / "orchestrator" / "episodes.json").exists()  # saveEpisode
    pids = _service_pids(out)
    assert pids and not any(group_alive(pid) for pid in pids)


def test_run_fails_clearly_and_cleans_up(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text((REPO / "configs" / "cartpole_random.yaml").read_text()
                      .replace("id: CartPole-v1", "id: NoSuchEnv-v0"))
    out = tmp_path / "run"
    proc = _run([str(config), "--out", str(out)], REPO)
    assert proc.returncode == 1
    assert "orchestrator initialize failed" in proc.stderr and "NoSuchEnv-v0" in proc.stderr
    assert not (out / "results.json").exists()
    pids = _service_pids(out)
    assert pids and not any(group_alive(pid) for pid in pids)


def test_run_reports_a_bad_target(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text((REPO / "configs" / "cartpole_random.yaml").read_text()
                      .replace("RandomAgent", "RandomAgnet"))
    proc = _run([str(config), "--out", str(tmp_path / "run")], REPO)
    assert proc.returncode == 1
    assert "RandomAgnet" in proc.stderr
