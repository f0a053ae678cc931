"""Schemathesis (`st run --checks all`) against both live services, in several lifecycle states:
no server error, no answer outside the spec (status, content type, headers, body schema), auth
never ignored, schema-invalid data always refused. `schemathesis.toml` holds the one setting
that differs from the defaults, with the reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT, REPO

TOKEN = "fuzz-token"
EXAMPLES = 10  # per operation and phase: bounded, so the whole file takes under a minute
SEED = os.environ.get("MISTK_FUZZ_SEED", "1")  # another seed explores other cases
CARTPOLE_SPACES = {
    "observationSpace": {
        "type": "Box",
        "shape": [4],
        "dtype": "float32",
        "low": [-4.8, -1e38, -0.42, -1e38],
        "high": [4.8, 1e38, 0.42, 1e38],
    },
    "actionSpace": {"type": "Discrete", "n": 2},
}


def fuzz(service, *, keep_state: bool = True) -> int:
    """Run st on the service's spec; returns the number of cases it generated."""
    role = service.role
    cmd = [
        sys.executable,
        "-c",
        "from schemathesis.cli import schemathesis; schemathesis()",
        "run",
        f"{service.url}/v1/mistk/{role}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",
        "--seed",
        SEED,
        "--no-color",
        "--request-timeout",
        "30",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "--generation-database",
        "none",
    ]  # no cases replayed from earlier runs: a seed
    # generates the same cases on every machine (CI's clean clone has no database)
    if keep_state:  # the lifecycle state is what this run is about: do not end it
        cmd += ["--exclude-operation-id", "terminate"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    summary = _failures(done.stdout)
    assert done.returncode == 0, summary
    generated = re.search(r"(\d+) generated", done.stdout)
    assert generated, summary
    print(f"{role}: {generated.group(0)}")
    return int(generated.group(1))


def _failures(stdout: str) -> str:
    """The report's failures section (each case's curl line is long: the tail alone can hold
    only the last one, cut)."""
    start = stdout.find("FAILURES")
    end = stdout.find("WARNINGS", start)
    section = stdout[start : end if end > 0 else None] if start >= 0 else stdout[-3000:]
    return "\n".join(
        line if len(line) < 1500 else line[:1500] + " ..."  # long bodies
        for line in section.splitlines()
    )


def _agent(launch):
    return launch("agent", RANDOM_AGENT, token=TOKEN, extra_args=["--log-level", "warning"])


@pytest.mark.long(40)
def test_agent_in_every_resting_state(launch):
    service = _agent(launch)
    agent = service.client(token=TOKEN)
    cases = fuzz(service)  # started
    agent.reset()
    agent.initialize()
    agent.build_model()
    cases += fuzz(service)  # initialized (unless the fuzzing moved it on)
    agent.reset()
    agent.initialize()
    agent.build_model()
    agent.agent_registered({"name": "p", **CARTPOLE_SPACES})
    agent.episode_started({"p": [0.0, 0.0, 0.0, 0.0]})
    cases += fuzz(service, keep_state=False)  # in_episode, then anything, terminate too
    assert cases > 600


@pytest.mark.long(65)
def test_orchestrator_in_every_resting_state(launch):
    service = launch(
        "orchestrator",
        GYM_ORCHESTRATOR,
        token=TOKEN,
        extra_args=["--agent-timeout", "2", "--log-level", "warning"],
    )
    agent_service = _agent(launch)
    orch = service.client(token=TOKEN)
    cases = fuzz(service)  # uninitialized
    orch.reset()
    orch.initialize("CartPole-v1")
    cases += fuzz(service)  # waiting_for_agents
    orch.reset()
    orch.initialize("CartPole-v1")
    agent = agent_service.client(token=TOKEN)
    agent.reset()
    agent.initialize()
    agent.build_model()
    orch.register_agent("player", agent_service.url)
    cases += fuzz(service, keep_state=False)  # ready (episodes may start), then anything
    assert cases > 600


@pytest.fixture(autouse=True)
def _st_available():
    pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")
