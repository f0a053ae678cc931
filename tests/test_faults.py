"""Faults end to end: a service that dies, restarts or hangs, and a harness that is stopped,
end in a known state with a reason, never in a hang and never with processes left behind."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness.bench.faults import HarnessProcess, long_run_config, restart_worker
from mistk_rl.deploy.launch import wait_until_gone
from mistk_rl.sdk.client import ServiceRestarted, ServiceUnavailable
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT, REPO, SIGINT_IGNORED


def test_a_restarted_service_is_never_taken_for_the_old_one(launch):
    service = launch("orchestrator", GYM_ORCHESTRATOR)
    orch = service.client(timeout=30)
    orch.initialize("CartPole-v1")
    seen = orch.status()
    restart_worker(service.process.pid)
    deadline = time.monotonic() + 30
    while True:  # until the new worker answers (the master restarts it: no fixed wait)
        try:
            orch.status()
        except ServiceUnavailable:
            assert time.monotonic() < deadline, "the restarted worker never answered"
            continue
        except ServiceRestarted as exc:
            assert exc.previous == seen.instance and exc.current != seen.instance
            break
        pytest.fail("a restarted service passed for the old one")
    fresh = service.client()  # a new client meets the new instance, back at the start
    status = fresh.status()
    assert (status.state, status.resource_version) == ("uninitialized", 0)
    # a long-poll from a version this instance never had answers at once, not at its timeout
    assert fresh.status(seen.resource_version, timeout=60).instance == status.instance


def test_a_hung_agent_fails_the_episode_naming_the_agent_and_the_call(launch):
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR, extra_args=["--agent-timeout", "2"])
    agent_service = launch("agent", RANDOM_AGENT)
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize("CartPole-v1")
    agent.initialize()
    agent.build_model()
    orch.register_agent("player", agent_service.url)
    orch.start_episode({"numEpisodes": 100_000, "maxSteps": 500})
    status, deadline = orch.wait_for_state("running", timeout=10), time.monotonic() + 30
    while not status.payload.get("envSteps"):  # progress: the agent is being asked per step
        assert time.monotonic() < deadline, "no env steps reported"
        status = orch.status(status.resource_version, timeout=10)
    os.killpg(agent_service.process.pid, signal.SIGSTOP)
    try:
        failed = orch.wait_for_state("failed", timeout=30)
    finally:
        os.killpg(agent_service.process.pid, signal.SIGCONT)
    assert agent_service.url in failed.reason and "no answer within 2" in failed.reason
    assert "/step" in failed.reason and failed.reason.startswith("startEpisode raised")


# ---- the harness, run as a user runs it -----------------------------------------------------
@pytest.fixture
def harness(tmp_path):
    run = HarnessProcess(long_run_config(), tmp_path / "run", REPO)
    run.wait_for_line("episode")  # episodes are being played
    masters = {name: run.master(name) for name in ("orchestrator", "player")}
    yield run, masters
    if run.process.poll() is None:
        run.process.kill()
        run.process.wait(10)
    left = {name: pid for name, pid in masters.items() if not wait_until_gone(pid, 15)}
    assert not left, f"service processes left behind: {left}"


def test_the_harness_stops_naming_the_orchestrator_when_its_worker_restarts(harness):
    run, masters = harness
    restart_worker(masters["orchestrator"])
    code, stderr = run.finish()
    assert code == 1
    assert "restarted and lost its state" in stderr and "episode block 0" in stderr


def test_the_harness_stops_naming_the_agent_when_it_dies(harness):
    run, masters = harness
    os.killpg(masters["player"], signal.SIGKILL)
    code, stderr = run.finish()
    assert code == 1
    assert "episode block 0" in stderr and "/v1/mistk/agent/step" in stderr


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, pytest.param(signal.SIGINT, marks=SIGINT_IGNORED)]
)
def test_a_signalled_harness_stops_every_service_it_started(harness, sig):
    run, _ = harness
    run.process.send_signal(sig)
    code, stderr = run.finish()
    assert code != 0
    # the fixture checks that no service process is left


def test_a_killed_harness_leaves_no_service_behind(harness):
    run, _ = harness
    run.process.kill()  # SIGKILL: no clean-up runs in the harness; the services follow it
    run.process.wait(10)
