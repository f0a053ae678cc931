"""The conformance kit: our agents pass it; a service that breaks the contract fails it,
with the checks it breaks named (and only those), through the `mistk-rl conformance`
command as a CI system runs it."""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import requests

from harness.cli import main
from mistk_rl.conformance import check_agent, check_orchestrator
from mistk_rl.conformance.contract import contract
from mistk_rl.conformance.suite import allowed_by
from mistk_rl.lifecycle.tables import AGENT

TOKEN = "conformance-secret"


def test_our_random_agent_passes_with_its_token(launch, tmp_path: Path, capsys) -> None:
    agent = launch("agent", "agents.random_agent:RandomAgent", token=TOKEN)
    junit = tmp_path / "kit.xml"
    code = main(
        ["conformance", "agent", agent.client().base_url, "--token", TOKEN, "--junit", str(junit)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert int(suite.get("tests", "0")) == len(cases) > 200
    assert suite.get("failures") == "0" and not suite.findall(".//failure")
    names = {f"{c.get('classname')}.{c.get('name')}" for c in cases}
    # the capabilities it lists are exercised, and the token is checked
    for name in (
        "agent.token.missing.refused",
        "agent.episode.columns.stepColumns.step-ids",
        "agent.stream.frame-answered",
        "agent.longPoll.woken-by-change",
        "agent.terminated.getAction.refused",
    ):
        assert name in names, name
    assert f"{len(cases)} of {len(cases)} checks passed" in out


def test_our_dqn_agent_passes(launch) -> None:
    agent = launch("agent", "agents.dqn_agent:DQNAgent")
    report = check_agent(agent.client().base_url)
    assert report.passed, report.text()


# ---- a deliberately broken service: our agent behind a proxy that breaks three rules -----
Breakage = Callable[[str, str, int, bytes], tuple[int, bytes]]


def _broken(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes]:
    """200 where the table says 409 (episodeStopped out of an episode), a missing field
    (apiVersion's role, and no stream: a proxy cannot upgrade), a wrong status (initialize
    answers 200, not 202)."""
    if path.endswith("/episodeStopped") and status == 409:
        return 200, json.dumps({"state": "ready", "resourceVersion": 0, "payload": {}}).encode()
    if path.endswith("/apiVersion"):
        answer = json.loads(body)
        answer.pop("role")
        answer["capabilities"] = [c for c in answer.get("capabilities", []) if c != "stream"]
        return status, json.dumps(answer).encode()
    if path.endswith("/initialize") and status == 202:
        return 200, body
    return status, body


@pytest.fixture
def broken_agent(launch) -> Iterator[str]:
    upstream = launch("agent", "agents.random_agent:RandomAgent").client().base_url
    yield from _proxied(upstream, _broken)


def _proxied(upstream: str, breakage: Breakage) -> Iterator[str]:
    """A proxy on a free loopback port in front of `upstream` (a base URL), changing the
    answers as `breakage` says; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _proxy_handler(upstream, breakage))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{urlsplit(upstream).path}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def _proxy_handler(upstream: str, breakage: Breakage) -> type[BaseHTTPRequestHandler]:
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            sent = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
            path = self.path.removeprefix(urlsplit(upstream).path)
            answer = requests.request(
                self.command, upstream + path, data=sent, headers=headers, timeout=60
            )
            status, body = breakage(
                self.command, self.path.split("?")[0], answer.status_code, answer.content
            )
            self.send_response(status)
            self.send_header("Content-Type", answer.headers.get("Content-Type", ""))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _forward

        def log_message(self, *args: object) -> None:  # (quiet)
            pass

    return Proxy


def test_a_broken_agent_fails_the_checks_it_breaks(broken_agent: str, tmp_path: Path, capsys):
    junit = tmp_path / "kit.xml"
    code = main(["conformance", "agent", broken_agent, "--junit", str(junit)])
    out = capsys.readouterr().out
    assert code == 1
    failed = {
        f"{c.get('classname')}.{c.get('name')}"
        for c in ET.parse(junit).getroot().findall("testcase")
        if c.find("failure") is not None
    }
    refused_in = [
        s
        for s in ("started", "initialized", "ready", "terminated")
        if "episodeStopped" not in allowed_by(AGENT, s)
    ]
    assert failed == {
        "agent.apiVersion.answers",  # role is required by the ApiVersion schema
        "agent.apiVersion.role",
        "agent.started.initialize.answers",  # 200 for 202
        "agent.reset.initialize",  # (the same, later in the walk)
        *(f"agent.{state}.episodeStopped.refused" for state in refused_in),
    }, out
    # the report shows the request that failed and what came back
    assert "POST " in out and "/episodeStopped" in out and "expected 409" in out
    assert "'role' is a required property" in out


def test_every_operation_of_the_contract_is_known_to_the_kit() -> None:
    """A new lifecycle operation in the spec must be taught to the kit: a valid call of it,
    for the refusals in each state where the table forbids it."""
    from mistk_rl.conformance.agent_suite import AgentSuite

    suite = AgentSuite("http://127.0.0.1:9")  # (nothing is called)
    suite.capabilities = ["columns"]
    taught = set(suite.calls())
    suite.close()
    own_checks = {  # legal in every state, or checked under their own capability
        "status",
        "apiVersion",
        "getFile",
        "putFile",
        "reset",
        "terminate",
        "stepStream",
        "getPolicy",
        "replayColumns",
    }
    assert set(contract("agent").operations) - own_checks == taught


def test_our_gym_orchestrator_passes(launch, capsys) -> None:
    orchestrator = launch("orchestrator", "orchestrators.gym_orchestrator:GymOrchestrator")
    code = main(["conformance", "orchestrator", orchestrator.client().base_url, "-v"])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in (  # the kit's agent was registered and driven, a long run stopped
        "orchestrator.waiting_for_agents.registerAgent.told-the-agent",
        "orchestrator.episodes.agent-acted-each-step",
        "orchestrator.running.startEpisode.refused",
        "orchestrator.reset.resets-the-agents",
    ):
        assert f"PASS  {name}" in out


def _broken_orchestrator(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes]:
    """Results without the episodes' lengths (a missing field); saveEpisode answers 200
    in ready, where the table says 409."""
    if path.endswith("/results") and status == 200:
        answer = json.loads(body)
        for episode in answer["episodes"]:
            episode.pop("length")
        return status, json.dumps(answer).encode()
    if path.endswith("/saveEpisode") and status == 409:
        return 200, json.dumps({"state": "ready", "resourceVersion": 0, "payload": {}}).encode()
    return status, body


@pytest.fixture
def broken_orchestrator(launch) -> Iterator[str]:
    upstream = launch("orchestrator", "orchestrators.gym_orchestrator:GymOrchestrator")
    yield from _proxied(upstream.client().base_url, _broken_orchestrator)


def test_a_broken_orchestrator_fails_the_checks_it_breaks(broken_orchestrator: str) -> None:
    report = check_orchestrator(broken_orchestrator)
    assert not report.passed
    failed = set(report.names(passed=False))
    assert {
        "orchestrator.ready.saveEpisode.refused",
        "orchestrator.completed_episode.getResults",  # length is required in EpisodeResult
        "orchestrator.completed_episode.getResults.since",
        "orchestrator.completed_episode.getResults.limit",
    } <= failed, report.text()
    refused_elsewhere = {n for n in failed if n.endswith("saveEpisode.refused")}
    assert (
        failed
        - refused_elsewhere
        - {
            "orchestrator.completed_episode.getResults",
            "orchestrator.completed_episode.getResults.since",
            "orchestrator.completed_episode.getResults.limit",
            "orchestrator.episodes.agent-acted-each-step",  # (no lengths: 0 steps counted)
        }
        == set()
    ), report.text()
