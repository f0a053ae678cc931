"""The Node.js examples (examples/node): a random agent and a CartPole orchestrator typed
from the packaged contracts, built from the lockfile here (npm ci, npm run build), run as
services and paired with ours: the Node agent against the gym orchestrator, our random
agent against the Node orchestrator; their lifecycle tables against ours."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from mistk_rl.lifecycle import AGENT, ORCHESTRATOR, Table
from mistk_rl.sdk.client import AgentClient, OrchestratorClient
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT, REPO

NODE_DIR = REPO / "examples" / "node"
_spec = importlib.util.spec_from_file_location("node_services", NODE_DIR / "node_services.py")
assert _spec is not None and _spec.loader is not None
node_services = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("node_services", node_services)
_spec.loader.exec_module(node_services)

_missing = node_services.missing_tools()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"Node examples: {_missing}")


@pytest.fixture(scope="session")
def node_built() -> Path:
    """npm ci from the lockfile and npm run build, once per session."""
    try:
        node_services.build()
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"{' '.join(exc.cmd)} failed:\n{exc.stdout}\n{exc.stderr}")
    return NODE_DIR


@pytest.fixture
def node(node_built: Path, tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Start a Node service; all are stopped at teardown, leaving no process."""
    started: list = []

    def _start(role: str, token: str | None = None):
        name = f"node-{role}{len(started)}"
        service = node_services.start_node(
            role, tmp_path / name, tmp_path / f"{name}.log", token=token
        )
        started.append(service)
        return service

    yield _start
    for service in started:
        service.stop()
    assert all(s.process.poll() is not None for s in started), "a Node service is left running"


def _check_cartpole(played_episodes: list, count: int, agent: str) -> None:
    assert len(played_episodes) == count
    for episode in played_episodes:
        assert episode.agent == agent
        assert 1 <= episode.length <= 500  # CartPole-v1's time limit
        assert episode.return_ == pytest.approx(episode.length)  # reward 1 per step
        assert episode.terminated or episode.truncated
        assert not episode.cancelled


def test_node_agent_against_the_gym_orchestrator(launch, node) -> None:
    agent = node("agent")
    client = AgentClient(agent.url)
    assert {"step", "columns"} <= set(client.api_version().capabilities)
    client.initialize(hyperparameters={"seed": 0})
    client.build_model()
    orchestrator = launch("orchestrator", GYM_ORCHESTRATOR).client()
    orchestrator.initialize("CartPole-v1")
    orchestrator.register_agent("node", agent.url)
    played = orchestrator.play({"numEpisodes": 6, "numEnvs": 3, "seed": 0}, timeout=120)
    episodes = played.results.episodes
    _check_cartpole(episodes, 6, "node")
    assert played.after.env_steps - played.before.env_steps == sum(e.length for e in episodes)
    status = client.status()
    assert status.state == "ready"  # episodeStopped came
    assert status.payload["actionsTaken"] >= sum(e.length for e in episodes)


def test_python_agent_against_the_node_orchestrator(launch, node) -> None:
    agent = launch("agent", RANDOM_AGENT)
    agent_client = agent.client()
    agent_client.initialize(hyperparameters={"seed": 0})
    agent_client.build_model()
    orchestrator = OrchestratorClient(node("orchestrator").url)
    orchestrator.initialize("NodeCartPole-v1")
    orchestrator.register_agent("py", agent.url)
    played = orchestrator.play({"numEpisodes": 5, "numEnvs": 2, "seed": 1}, timeout=120)
    _check_cartpole(played.results.episodes, 5, "py")
    assert played.after.env_steps == sum(e.length for e in played.results.episodes)
    assert agent_client.status().state == "ready"
    # stopEpisode cancels a run that would not end by itself: its episodes say so
    orchestrator.start_episode({"numSteps": 10_000_000, "numEnvs": 2})
    status = orchestrator.wait_for_state("running", timeout=30)
    for _ in range(60):  # long-polls (the progress comes within a second) until it steps
        if (status.payload or {}).get("envSteps", 0) > played.after.env_steps:
            break
        status = orchestrator.status(status.resource_version, 5)
    assert orchestrator.stop_episode().state == "ready"
    cancelled = orchestrator.get_results(since=5).episodes
    assert cancelled and cancelled[-1].cancelled
    assert agent_client.status().state == "ready"


def test_node_agent_lifecycle_conflicts_and_bad_input(node) -> None:
    base = node("agent").url + "/v1/mistk/agent"
    before = httpx.get(f"{base}/status").json()
    refused = httpx.post(f"{base}/getAction", json={"obs": {"a": [0, 0, 0, 0]}})
    assert refused.status_code == 409
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["state"] == "started"
    assert refused.json()["allowed"] == ["initialize", "reset", "terminate"]
    assert httpx.get(f"{base}/status").json()["resourceVersion"] == before["resourceVersion"]
    bad = httpx.post(f"{base}/initialize", json={"hyperparameters": {}, "extra": 1})
    assert bad.status_code == 400 and "extra" in bad.json()["detail"]
    not_json = httpx.post(
        f"{base}/initialize", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert not_json.status_code == 415
    accepted = httpx.post(f"{base}/initialize", json={})
    assert accepted.status_code == 202 and accepted.json()["state"] == "initializing"
    waited = httpx.get(
        f"{base}/status",
        params={"resourceVersion": accepted.json()["resourceVersion"], "timeout": 10},
        timeout=20,
    ).json()
    assert waited["state"] == "initialized" and waited["instance"] == before["instance"]


def test_node_services_require_the_token(node) -> None:
    for role in ("agent", "orchestrator"):
        base = f"{node(role, token='s3cret').url}/v1/mistk/{role}"
        assert httpx.get(f"{base}/status").status_code == 401
        wrong = httpx.get(f"{base}/status", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = httpx.get(f"{base}/status", headers={"authorization": "Bearer s3cret"})
        assert right.status_code == 200
        assert httpx.get(f"{base}/apiVersion").json()["role"] == role  # needs no token


def _python_rows(table: Table) -> list[list]:
    rows = []
    for row in table.transitions:
        sources = [row["source"]] if isinstance(row["source"], str) else list(row["source"])
        when = row["conditions"][0].__defaults__[0] if "conditions" in row else None
        rows.append([row["trigger"], sources, row["dest"], when])
    return rows


@pytest.mark.parametrize("table", [AGENT, ORCHESTRATOR], ids=lambda t: t.role)
def test_node_lifecycle_tables_are_the_python_ones(node_built: Path, table: Table) -> None:
    script = (
        "const t = require('./dist/lib/tables.js');"
        f"const table = t.{table.role.upper()};"
        "console.log(JSON.stringify({initial: table.initial, states: table.states,"
        " rows: table.rows.map(r => [r.trigger, r.source, r.dest, r.when ?? null]),"
        " operations: [...table.operations.values()].map(o =>"
        " [o.name, !!o.background, !!o.preempts]), busy: [...table.busy].sort()}));"
    )
    out = subprocess.run(
        ["node", "-e", script], cwd=node_built, check=True, capture_output=True, text=True
    )
    node_table = json.loads(out.stdout)
    assert node_table["initial"] == table.initial
    assert node_table["states"] == list(table.states)
    assert node_table["rows"] == _python_rows(table)
    assert node_table["operations"] == [
        [o.name, o.background, o.preempts] for o in table.operations.values()
    ]
    assert node_table["busy"] == sorted(table.busy_states)


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_the_node_services_pass_the_conformance_kit(node, role: str) -> None:
    """The kit's whole walk (mistk_rl.conformance), with the token the service runs with."""
    from mistk_rl.conformance import check_agent, check_orchestrator

    service = node(role, token="node-kit-token")
    check = check_agent if role == "agent" else check_orchestrator
    report = check(service.url, token="node-kit-token")
    assert report.passed, report.text()
    assert len(report.checks) > 70
