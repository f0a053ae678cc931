"""What a service shows an operator (`mistk_rl.service.metrics`): ``/metrics`` counts every
answer by operation and status, with latency histograms, the lifecycle state, the step
streams and what the implementation counts; ``/healthz`` and ``/readyz`` answer on the
event loop while a handler blocks; all three are open with a token configured. A real
Prometheus server (Debian's package) scrapes an agent and an orchestrator during a run and
answers a PromQL query with the run's env step count."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from mistk_rl.sdk.client import BadRequest, ColumnPipeline, Conflict
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT
from tests.test_step_stream import _registered

BLOCKING = "tests.service_fixtures:BlockingAgent"
DQN = "agents.dqn_agent:DQNAgent"


def scrape(url: str, **kwargs: Any) -> dict[tuple[str, tuple], float]:
    """The samples at ``url/metrics``: (name, sorted labels) -> value."""
    answer = requests.get(f"{url}/metrics", timeout=10, **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def requests_of(samples: dict, operation: str) -> dict[str, float]:
    """mistk_requests_total of `operation`, by status."""
    return {
        dict(labels)["status"]: value
        for (name, labels), value in samples.items()
        if name == "mistk_requests_total" and dict(labels).get("operation") == operation
    }


def test_metrics_count_answers_by_operation_and_status(launch):
    service = launch("agent", RANDOM_AGENT)
    agent = service.client()
    assert scrape(service.url)[("mistk_lifecycle_state", (("state", "started"),))] == 1.0
    agent.initialize(hyperparameters={"seed": 0})
    with pytest.raises(Conflict):
        agent.initialize()  # (initialized: a second initialize is 409)
    with pytest.raises(BadRequest):
        agent.build_model("../outside.pt")
    agent.build_model()
    for _ in range(3):
        agent.status()
    samples = scrape(service.url)
    assert requests_of(samples, "initialize") == {"202": 1.0, "409": 1.0}
    assert requests_of(samples, "buildModel") == {"202": 1.0, "400": 1.0}
    assert requests_of(samples, "status")["200"] >= 3
    assert requests_of(samples, "getAction") == {}  # (none yet: no sample)
    count = samples[("mistk_request_duration_seconds_count", (("operation", "initialize"),))]
    inf = samples[
        ("mistk_request_duration_seconds_bucket", (("le", "+Inf"), ("operation", "initialize")))
    ]
    assert count == inf == 2.0
    state = {dict(k[1])["state"]: v for k, v in samples.items() if k[0] == "mistk_lifecycle_state"}
    assert state["initialized"] == 1.0 and sum(state.values()) == 1.0
    info = next(dict(k[1]) for k in samples if k[0] == "mistk_service_info")
    assert info["role"] == "agent" and info["implementation"] == RANDOM_AGENT
    assert samples[("mistk_process_resident_memory_bytes", ())] > 10 * 2**20  # (the process's own)


def test_the_probes_are_open_with_a_token_and_the_operations_are_not(launch):
    service = launch("agent", RANDOM_AGENT, token="s3cret")
    base = f"{service.url}/v1/mistk/agent"
    assert requests.get(f"{base}/status", timeout=10).status_code == 401
    health = requests.get(f"{service.url}/healthz", timeout=10)
    assert health.status_code == 200 and health.json() == {"alive": True, "state": "started"}
    assert requests.get(f"{service.url}/readyz", timeout=10).status_code == 200
    samples = scrape(service.url)
    assert requests_of(samples, "status") == {"401": 1.0}
    post = requests.post(f"{service.url}/metrics", timeout=10)
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"


def test_health_answers_while_a_handler_blocks_and_readiness_says_busy(launch):
    service = launch("agent", BLOCKING)
    agent = service.client()
    agent.initialize()
    agent.build_model(wait=False)  # (202: its hook blocks until cancelled)
    agent.wait_for_state("building_model", 30)
    started = time.monotonic()
    health = requests.get(f"{service.url}/healthz", timeout=10)
    ready = requests.get(f"{service.url}/readyz", timeout=10)
    assert time.monotonic() - started < 5  # (not queued behind the blocked hook)
    assert health.status_code == 200 and health.json()["state"] == "building_model"
    assert ready.status_code == 503
    assert ready.json() == {
        "ready": False,
        "state": "building_model",
        "reason": "busy in 'building_model'",
    }
    agent.reset()  # (cancels the hook)
    agent.wait_for_state("started", 30)
    assert requests.get(f"{service.url}/readyz", timeout=10).json()["ready"] is True


def test_step_streams_and_their_frames_are_counted(launch):
    service = launch("agent", RANDOM_AGENT)
    agent = _registered(service)  # (an episode started)
    pipeline = ColumnPipeline(agent, stream=True)
    obs = np.zeros((2, 4), np.float32)
    for _ in range(5):
        pipeline.send(np.array([0, 1]), obs)
        pipeline.receive()
    assert pipeline.upgraded
    samples = scrape(service.url)
    assert samples[("mistk_step_streams_open", ())] == 1.0
    assert samples[("mistk_step_stream_frames_total", ())] == 5.0
    assert requests_of(samples, "stepColumns") == {"200": 5.0}
    pipeline.close()
    deadline = time.monotonic() + 10  # (the server sees the close a moment later)
    while scrape(service.url)[("mistk_step_streams_open", ())] != 0.0:
        assert time.monotonic() < deadline, "the closed stream is still counted open"
        time.sleep(0.05)
    assert scrape(service.url)[("mistk_step_streams_opened_total", ())] == 1.0


def test_an_orchestrator_and_a_learning_agent_say_what_they_count(launch):
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
    agent_service = launch("agent", DQN)
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize({"id": "CartPole-v1"})
    agent.initialize(
        hyperparameters={
            "seed": 0,
            "log_every": 0,
            "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 2},
            "policy": {"model": {"hidden_sizes": [32]}},
        }
    )
    agent.build_model()
    orch.register_agent("player", agent_service.url)
    orch.start_episode({"numSteps": 200, "numEnvs": 2, "seed": 0}, wait=True, timeout=120)
    episodes = orch.get_results().episodes
    samples = scrape(orch_service.url)
    steps = orch.status().payload["envSteps"]
    assert steps >= 200 and samples[("mistk_env_steps_total", ())] == steps
    assert samples[("mistk_episodes_total", (("agent", "player"),))] == len(episodes)
    mean = samples[("mistk_episode_return_mean", (("agent", "player"),))]
    assert mean == pytest.approx(np.mean([e.return_ for e in episodes[-100:]]))
    assert samples[("mistk_env_restarts_total", ())] == 0.0
    learner = scrape(agent_service.url)
    progress = agent.status().payload
    assert learner[("mistk_env_steps_total", ())] == progress["envSteps"] > 0
    assert learner[("mistk_learner_updates_total", ())] == progress["updates"] > 0
    assert learner[("mistk_learner_last", (("name", "loss"),))] == pytest.approx(progress["loss"])
    assert learner[("mistk_buffer_items", ())] == progress["bufferSize"]
    assert 0.0 < learner[("mistk_exploration_epsilon", ())] <= 1.0


# ---- a real Prometheus server --------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="no Prometheus server here: `apt-get install prometheus` (.ci/run installs it)",
)
def test_a_real_prometheus_scrapes_a_run_and_counts_its_env_steps(launch, tmp_path: Path):
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
    agent_service = launch("agent", RANDOM_AGENT)
    port = _free_port()
    targets = {"orchestrator": orch_service.url, "agent": agent_service.url}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [url.split("://")[1]]}]}
            for job, url in targets.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # (JSON is YAML)
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
        start_new_session=True,
    )
    try:
        orch, agent = orch_service.client(), agent_service.client()
        orch.initialize({"id": "CartPole-v1"})
        agent.initialize(hyperparameters={"seed": 0})
        agent.build_model()
        orch.register_agent("player", agent_service.url)
        orch.start_episode({"numSteps": 3000, "numEnvs": 4, "seed": 0}, wait=True, timeout=120)
        steps = orch.status().payload["envSteps"]
        assert steps >= 3000  # (copies finish the step they are in)
        deadline, result, asked = time.monotonic() + 60, [], []
        while time.monotonic() < deadline:  # (until scrapes of both after the run are stored)
            try:
                result = _query(port, 'mistk_env_steps_total{job="orchestrator"}')
                asked = _query(port, 'sum(mistk_requests_total{job="agent",status="200"})')
            except OSError:  # (the server is still starting)
                result = asked = []
            if result and float(result[0]["value"][1]) == steps and asked:
                break
            time.sleep(0.5)
        log = (tmp_path / "prometheus.log").read_text()[-2000:]
        assert result and float(result[0]["value"][1]) == steps, f"{result}\n{log}"
        assert asked and float(asked[0]["value"][1]) > 0, f"{asked}\n{log}"
        up = {r["metric"]["job"]: r["value"][1] for r in _query(port, "up")}
        assert up == {"orchestrator": "1", "agent": "1"}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
