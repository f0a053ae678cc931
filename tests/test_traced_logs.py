"""Traced logs (`mistk_rl.wire.tracing`, `mistk_rl.service.logs`): the W3C ``traceparent``
parsed as the spec says; a caller's trace goes on through the orchestrator (its pool, its
background episode run) to the agent it calls, so one run's lines in the two services'
JSON logs share its trace id; every line of a service logged with ``--log-format json``
is one JSON object (gunicorn's too); an access line names operation, status, duration and
request id, and a refusal is logged while a step's 200 is not (at INFO)."""

from __future__ import annotations

import json
import logging

from mistk_rl.service.logs import JsonFormatter, TextFormatter, access
from mistk_rl.wire.tracing import Trace, child_of, new_trace, outgoing_line, parse, traced
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_traceparent_is_parsed_as_the_spec_says():
    assert parse(VALID) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert parse(VALID.upper().encode()) == parse(VALID)  # (bytes from a header, any case)
    for bad in (
        None,
        "",
        VALID[:-1],  # too short
        VALID + "-extra",  # version 00 has exactly four fields
        "ff" + VALID[2:],  # version ff is invalid
        VALID.replace("4bf92f3577b34da6a3ce929d0e0e4736", "0" * 32),  # all-zero trace id
        VALID.replace("00f067aa0ba902b7", "0" * 16),  # all-zero parent
        VALID.replace("a", "g"),  # not hex
    ):
        assert parse(bad) is None, bad
    child = child_of(VALID)
    assert child.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert child.parent_id == "00f067aa0ba902b7" and child.span_id != child.parent_id
    assert len(child_of("garbage").trace_id) == 32  # (a bad header starts a new trace)


def test_requests_sent_in_a_trace_carry_it():
    assert outgoing_line() == ""
    with traced() as trace:
        assert outgoing_line() == f"traceparent: 00-{trace.trace_id}-{trace.span_id}-01\r\n"
    assert outgoing_line() == ""


def _lines(path) -> list[dict]:
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    objects = []
    for line in lines:
        try:
            objects.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"{path.name}: a line that is not JSON: {line!r}") from None
    return objects


def traced_run(orch_service, agent_service) -> Trace:
    """One CartPole episode driven in a new trace (returned): the orchestrator and the agent
    set up, the agent registered, the episode played."""
    orch, agent = orch_service.client(), agent_service.client()
    with traced(new_trace()) as trace:
        orch.initialize({"id": "CartPole-v1"})
        agent.initialize(hyperparameters={"seed": 0})
        agent.build_model()
        orch.register_agent("player", agent_service.url)
        orch.start_episode({"numEpisodes": 1, "seed": 0}, wait=True, timeout=60)
    return trace


def test_one_runs_calls_share_its_trace_across_orchestrator_and_agent(launch):
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR, extra_args=["--log-format", "json"])
    agent_service = launch("agent", RANDOM_AGENT, extra_args=["--log-format", "json"])
    trace = traced_run(orch_service, agent_service)
    agent_service.client().status()  # (outside the trace)
    orch_service.begin_stop()
    agent_service.begin_stop()
    orch_service.stop()
    agent_service.stop()
    orch_lines, agent_lines = _lines(orch_service.log_path), _lines(agent_service.log_path)
    assert any(line["logger"].startswith("gunicorn") for line in orch_lines)  # (one format)

    def traced_ops(lines: list[dict]) -> dict[str, dict]:
        return {
            line["operation"]: line
            for line in lines
            if line.get("trace_id") == trace.trace_id and "operation" in line
        }

    in_orch = traced_ops(orch_lines)
    assert {"initialize", "registerAgent", "startEpisode"} <= set(in_orch)
    start = in_orch["startEpisode"]
    assert start["status"] == 202 and start["duration_ms"] >= 0 and len(start["request_id"]) == 16
    in_agent = traced_ops(agent_lines)
    # the agent's own calls, and those the orchestrator made for the run: registering it
    # (on its pool) and the episode (on its background task)
    assert {"initialize", "buildModel", "agentRegistered", "episodeStarted"} <= set(in_agent)
    assert "getAction" not in in_agent  # (a step's 200 is a DEBUG line)
    ids = [line["request_id"] for line in in_orch.values()] + [
        line["request_id"] for line in in_agent.values()
    ]
    assert len(set(ids)) == len(ids)  # (a span per request)


def test_access_lines_in_both_formats(caplog):
    trace = child_of(VALID)
    with caplog.at_level(logging.INFO, logger="mistk_rl.access"):
        access("getAction", 200, 0.0001, trace, quiet=True)  # a step's 200: DEBUG
        access("getAction", 409, 0.0002, trace, quiet=True)  # a refusal: INFO
        access("initialize", 202, 0.0031, None, quiet=False)
    records = caplog.records
    assert [(r.operation, r.status) for r in records] == [("getAction", 409), ("initialize", 202)]
    as_json = json.loads(JsonFormatter().format(records[0]))
    assert as_json["operation"] == "getAction" and as_json["status"] == 409
    assert as_json["duration_ms"] == 0.2 and as_json["request_id"] == trace.span_id
    assert as_json["trace_id"] == trace.trace_id and as_json["level"] == "info"
    assert as_json["time"].endswith("Z") and as_json["message"] == "getAction 409 0.200 ms"
    text = TextFormatter().format(records[0])
    assert text.endswith(
        f"INFO mistk_rl.access: getAction 409 0.200 ms [trace={trace.trace_id} "
        f"request={trace.span_id}]"
    )
