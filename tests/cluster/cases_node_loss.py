"""A node lost mid-run: the run starts its services again elsewhere and resumes from its last
checkpoint, which the harness copied off the lost node (`Checkpoints.mirror`)."""

from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from harness.config import RunConfig
from harness.run import run_from_file

pytestmark = pytest.mark.usefixtures("in_repo")


def _training_config(tmp_path, orchestrator=None, **agent) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "node-loss",
            "orchestrator": {
                "target": "orchestrators.gym_orchestrator:GymOrchestrator",
                "env": {"id": "CartPole-v1"},
                "cpus": 0.5,
                "resources": orchestrator or {"head": 1},
            },
            "agents": [
                {
                    "name": "player",
                    "target": "agents.random_agent:RandomAgent",
                    "hyperparameters": {"seed": 0},
                    "cpus": 0.5,
                    **agent,
                }
            ],
            "training": {
                "env_steps": 1500,
                "eval_every": 500,
                "eval_episodes": 2,
                "max_steps": 100,
            },
            "cluster": {"address": "auto", "data_root": str(tmp_path / "nodes")},
            "timeouts": {"startup": 60, "call": 20},
        }
    )


def _write(config: RunConfig, path):
    import yaml

    path.write_text(yaml.safe_dump(config.model_dump()))
    return path


def _follow(monkeypatch, on_line) -> list[tuple[str, bool]]:
    """What the run prints, as (line, went to stderr), each line passed to `on_line` as it
    comes (the test acts at a point of the run); the restart's pause is skipped."""
    lines: list[tuple[str, bool]] = []

    def printed(*parts, file=None, **_):
        lines.append((" ".join(map(str, parts)), file is not None))
        on_line(lines[-1][0])

    monkeypatch.setattr("builtins.print", printed)
    monkeypatch.setattr("harness.run.time.sleep", lambda seconds: None)
    return lines


def _wait_gone(url: str, timeout: float = 60.0) -> None:
    """Until nothing listens at `url` any more. A lost node's processes end with it; on a
    cluster of one machine they end a moment after `remove_node` (the actor sees its raylet
    gone, then SIGTERMs the service), and a test that acts at a point of the run waits for
    that, or the service may answer a few more requests: the loss would come later."""
    where = urlsplit(url)
    deadline, pause = time.monotonic() + timeout, 0.01
    while time.monotonic() < deadline:
        try:
            socket.create_connection((where.hostname, where.port), timeout=1).close()
        except OSError:
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.5)
    raise AssertionError(f"{url} still answers {timeout:.0f} s after its node was removed")


@pytest.mark.parametrize("role, name", [("agent", "player"), ("orchestrator", "orchestrator")])
def test_a_run_that_loses_a_services_node_resumes_on_another(
    cluster, add_node, tmp_path, monkeypatch, role, name
):
    """Two nodes offer `trainer`; the agent (or the orchestrator) asks for it. After the
    first checkpoint the node it runs on is removed: the run restarts its services, the
    service lands on the other node, the agent gets the checkpoint back over HTTP and
    training ends where it would have."""
    spare = {add_node(num_cpus=1, resources={"trainer": 1}) for _ in range(2)}
    trainer = {"trainer": 1}
    config = (
        _training_config(tmp_path, resources=trainer)
        if role == "agent"
        else _training_config(tmp_path, orchestrator=trainer)
    )
    run_dir = tmp_path / "run"
    where, removed = [], []

    def on_line(line: str) -> None:
        started = re.search(rf"started {role} {name} .* at (\S+) on node (\w+)", line)
        if started:
            where.append(started.groups())
        if not removed and (run_dir / "progress.json").exists():  # (the first checkpoint)
            url, node_id = where[-1]
            node = next(n for n in spare if n.node_id.startswith(node_id))
            cluster.remove_node(node)  # (kills its raylet, the service's actor and process)
            removed.append(node.node_id)
            _wait_gone(url)  # (the run waits here: this runs within its print)

    lines = _follow(monkeypatch, on_line)
    code = run_from_file(_write(config, tmp_path / "c.yaml"), out=run_dir)
    assert code == 0, lines
    results = json.loads((run_dir / "results.json").read_text())
    assert removed and any(f"lost {name}" in line for line, _ in lines), lines
    assert results["placement"][name]["node"] != removed[0]
    assert results["placement"][name]["node"] in {n.node_id for n in spare}
    assert results["resumed_at"] == [500]  # from the first checkpoint, by itself
    assert [e["env_steps"] for e in results["evals"]] == [500, 1000, 1500]
    # the checkpoints came to the run dir; the newest two are kept
    kept = sorted(p.name for p in (run_dir / "checkpoints" / "player" / "checkpoints").iterdir())
    assert kept == ["step-1000.pt", "step-1500.pt"]


def test_a_run_whose_service_cannot_be_placed_again_ends_naming_it(
    cluster, add_node, tmp_path, monkeypatch
):
    """The only node with `lonely` is lost: the restart cannot place the agent, and the run
    ends with an error naming it, not a hang: once no live node has what it asks for
    (`UNPLACEABLE_GRACE_S`), not at the startup timeout."""
    node = add_node(num_cpus=1, resources={"lonely": 1})
    config = _training_config(tmp_path, resources={"lonely": 1})
    # (long enough for the orchestrator's restart on a loaded 2-core machine: at 8 s it once
    # was the one reported unplaced)
    config.timeouts.startup = 20
    run_dir = tmp_path / "run"
    removed = []

    def on_line(_line: str) -> None:
        if not removed and (run_dir / "progress.json").exists():
            cluster.remove_node(node)
            removed.append(node)

    lines = _follow(monkeypatch, on_line)
    code = run_from_file(_write(config, tmp_path / "c.yaml"), out=run_dir, max_restarts=1)
    errors = [line for line, to_stderr in lines if to_stderr]
    assert code == 1 and removed
    assert re.search(
        r"starting agent 'player'.*not placed: no live node of the cluster has .*1 lonely",
        errors[-1],
    ), lines
