"""The step stream (`mistk_rl.wire.frames`): stepColumns as frames on one upgraded connection.
Served agents (gunicorn on loopback) driven through the SDK, checked against the same agent
driven in process and against the HTTP requests' answers."""

from __future__ import annotations

import numpy as np
import pytest

from agents.dqn_agent import DQNAgent
from harness.bench.step import InProcessClient
from mistk_rl.sdk.client import (
    BadRequest,
    ColumnPipeline,
    Conflict,
    PayloadTooLarge,
    ServiceUnavailable,
    Unauthorized,
)
from mistk_rl.sdk.stepping import ColumnStepper, stepper_for
from mistk_rl.wire import frames
from tests.conftest import RANDOM_AGENT
from tests.test_fast_path import OnThePool
from tests.test_step_columns import SPACES, RecordingAgent, _drive_recording, _obs, _service

DQN_HPARAMS = {
    "log_every": 0,
    "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 5},
    "policy": {"model": {"hidden_sizes": [32]}},
}


def _registered(service, hparams=None, episode: bool = True, token=None):
    agent = service.client(token=token)
    agent.initialize(hyperparameters={"seed": 0, **(hparams or {})})
    agent.build_model()
    agent.agent_registered({"name": "p", **SPACES})
    if episode:
        agent.episode_started({"p": [0, 0, 0, 0]})
    return agent


@pytest.mark.parametrize("depth, binary", [(1, True), (2, False)])
def test_the_stream_trains_an_agent_as_in_process(launch, tmp_path, depth, binary):
    """A seeded DQN agent stepped on its stream acts and learns bit for bit as the same
    agent driven in process, one frame at a time and two in flight, in either encoding."""
    in_process = _service(tmp_path, DQNAgent(), DQN_HPARAMS)
    in_process.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    local_calls, _ = _drive_recording(ColumnStepper(InProcessClient(in_process), depth), 4, 60)
    agent = _registered(launch("agent", "agents.dqn_agent:DQNAgent"), DQN_HPARAMS)
    assert "stream" in agent.api_version().capabilities
    agent.binary = binary
    stepper = stepper_for(agent, frozenset({"columns", "stream"}), "p", 4, depth=depth)
    served_calls, _ = _drive_recording(stepper, 4, 60)
    assert stepper._pipeline.stream and stepper._pipeline.pending == 0  # (no fallback)
    assert stepper._pipeline._stream is None  # the loop's end closed it
    assert [{i: int(a) for i, a in c.items()} for c in served_calls] == [
        {i: int(a) for i, a in c.items()} for c in local_calls
    ]
    assert in_process.agent.learner.train_iter > 0
    served, local = agent.get_policy(weights=True), InProcessClient(in_process).get_policy()
    assert served.env_steps == local.env_steps == 60 * 4 // depth  # (a call steps 4 / depth)
    for name in local.weights:
        np.testing.assert_array_equal(served.weights[name], local.weights[name])


def test_frames_answer_as_step_columns_requests_and_a_refusal_leaves_the_stream_open(launch):
    service = launch("agent", RANDOM_AGENT)
    agent = _registered(service, episode=False)
    pipe = ColumnPipeline(agent, stream=True)
    pipe.send(np.arange(2), _obs(2, 0))  # no episode yet: the lifecycle refuses
    with pytest.raises(Conflict, match="not allowed in state 'ready'"):
        pipe.receive()
    agent.episode_started({"p": [0, 0, 0, 0]})  # (over HTTP, beside the stream)
    pipe.send(np.arange(3), _obs(3, 0))
    first = pipe.receive()
    assert first.step_ids.tolist() == [0, 1, 2] and set(first.actions.tolist()) <= {0, 1}
    for bad, match in (
        ({"step_ids": np.array([7, 8, 9])}, "is not one this agent is waiting"),
        ({}, "NaN is not a JSON number"),
    ):
        obs = _obs(3, np.nan) if not bad else _obs(3, 0)
        pipe.send(
            np.arange(3),
            obs,
            **bad,
            **({"rewards": np.ones(3), "terminated": np.zeros(3, bool)} if bad else {}),
        )
        with pytest.raises(BadRequest, match=match):
            pipe.receive()
    # two frames in flight, answered in order; nothing the refusals sent was kept
    pipe.send(
        np.arange(3),
        _obs(3, 1),
        step_ids=first.step_ids,
        rewards=np.ones(3),
        terminated=np.zeros(3, bool),
    )
    pipe.send(np.arange(3, 5), _obs(2, 2))
    assert pipe.receive().step_ids.tolist() == [3, 4, 5]
    assert pipe.receive().step_ids.tolist() == [6, 7]
    # the same requests over HTTP get the same answers from a second, same-seeded agent
    twin = _registered(launch("agent", RANDOM_AGENT))
    assert twin.step_columns(np.arange(3), _obs(3, 0)).actions.tolist() == first.actions.tolist()
    # a service that stops ends its open streams: the next frame fails, it is not awaited
    service.stop()
    with pytest.raises(ServiceUnavailable):
        pipe.send(np.arange(3, 5), _obs(2, 2))
        pipe.receive()


def test_opening_a_stream_is_admitted_as_a_step_request(launch):
    service = launch("agent", RANDOM_AGENT, token="sesame", extra_args=["--max-body-bytes", "4096"])
    agent = _registered(service, token="sesame")
    intruder = service.client(token="wrong")
    pipe = ColumnPipeline(intruder, stream=True)
    with pytest.raises(Unauthorized):
        pipe.send(np.arange(2), _obs(2, 0))
    # a Content-Type the frames cannot have; a plain request to the stream's path
    stream, refused = agent.transport.open_stream(
        frames.PATH, content_type="text/plain", accept="application/json"
    )
    assert stream is None and refused.status == 415
    plain = agent.transport.request("GET", frames.PATH, timeout=10)
    assert plain.status == 426 and plain.headers["upgrade"] == frames.PROTOCOL
    # a frame over the body limit: 413, and the stream ends without reading it
    pipe = ColumnPipeline(agent, stream=True)
    pipe.send(np.arange(400), _obs(400, 0))
    with pytest.raises(PayloadTooLarge):
        pipe.receive()
    pipe.send(np.arange(2), _obs(2, 0))
    with pytest.raises(ServiceUnavailable):
        pipe.receive()
    assert agent.status().state == "in_episode"  # nothing changed


def test_an_agent_whose_steps_leave_the_event_loop_offers_no_stream(tmp_path):
    from mistk_rl.service.app import create_app

    service = _service(tmp_path, OnThePool())
    assert "stream" not in service.capabilities
    assert "stream" in _service(tmp_path, RecordingAgent()).capabilities
    pipeline = create_app(service)
    op, answer = pipeline.open_stream(
        "GET", "/v1/mistk/agent" + frames.PATH, {b"content-type": b"application/json"}
    )
    assert op is None and answer.status == 501 and b"steps_inline" in answer.payload
    op, answer = pipeline.open_stream("GET", "/v1/mistk/agent/nowhere", {})
    assert op is None and answer.status == 404
    op, answer = pipeline.open_stream("POST", "/v1/mistk/agent" + frames.PATH, {})
    assert op is None and answer.status == 405 and (b"allow", b"GET") in answer.headers


def test_a_server_that_cannot_upgrade_is_stepped_over_http(launch, monkeypatch):
    """An agent behind a server without the stream (it answers the path's 426) is stepped
    with HTTP requests, the same answers."""
    agent = _registered(launch("agent", RANDOM_AGENT))
    monkeypatch.setattr(
        agent.transport,
        "open_stream",
        lambda path, **kw: (None, agent.transport.request("GET", path, timeout=10)),
    )  # (the stock answer)
    pipe = ColumnPipeline(agent, stream=True)
    pipe.send(np.arange(2), _obs(2, 0))
    assert pipe.receive().step_ids.tolist() == [0, 1] and not pipe.stream
    pipe.send(np.arange(2), _obs(2, 0))  # (HTTP pipelining from now on)
    assert pipe.receive().step_ids.tolist() == [2, 3]
    pipe.close()


def test_the_gym_orchestrator_steps_an_agent_that_lists_stream_on_its_stream():
    """`stepper_for` (the gym orchestrator's choice) takes the stream at any depth when the
    agent lists it, and HTTP requests otherwise."""
    from mistk_rl.sdk.client import AgentClient

    client = AgentClient("http://127.0.0.1:1")
    for depth in (1, 2):
        streamed = stepper_for(client, frozenset({"columns", "stream"}), "p", 4, depth=depth)
        assert streamed._pipeline.stream
    assert stepper_for(client, frozenset({"columns"}), "p", 4)._pipeline is None
    assert not stepper_for(client, frozenset({"columns"}), "p", 4, depth=2)._pipeline.stream
