"""The step path's speed-ups keep every rule: steps inline on the event loop (an agent may opt
out), orjson with the `json` path's refusals and messages, and an answer's head sent with
its body. In-process ASGI as in test_pipeline.py, plus one served agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agents.random_agent import RandomAgent
from mistk_rl.limits import Limits
from mistk_rl.service.app import create_app
from mistk_rl.service.handlers import AgentService
from mistk_rl.service.pipeline import STEP_OPERATIONS
from mistk_rl.service.server import ServiceWorker
from mistk_rl.service.uvicorn_protocol import (
    UVICORN_ATTRIBUTES,
    UVICORN_PRIVATE,
    AwakeAfterAnswers,
    CoalescingHttpTools,
    IncompatibleUvicorn,
    _HeadWithBody,
    check_uvicorn,
)
from mistk_rl.wire import jsonable
from tests.conftest import RANDOM_AGENT
from tests.test_pipeline import _asgi

OBS = b'{"obs": {"p": [0, 0, 0, 0]}}'
STEP = {
    "getAction": OBS,
    "step": OBS,
    "replayAction": (
        b'{"prevObs": {"p": [0, 0, 0, 0]}, "actions": {"p": 0}, '
        b'"rewards": {"p": 1}, "terminated": {"p": false}, '
        b'"newObs": {"p": [0, 0, 0, 0]}}'
    ),
}


class ThreadNoting(RandomAgent):
    """Notes the thread each step hook runs in; a step blocks while `hold` is set, and
    episodeStopped while `hold_stop` is (each says so on `entered`)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.hold, self.hold_stop = threading.Event(), threading.Event()
        self.entered, self.release = threading.Event(), threading.Event()

    def _noted(self) -> None:
        self.threads.append(threading.current_thread().name)

    def _maybe_hold(self, flag: threading.Event) -> None:
        if flag.is_set():
            self.entered.set()
            assert self.release.wait(10)

    def do_act(self, batch):
        self._noted()
        self._maybe_hold(self.hold)
        return super().do_act(batch)

    def do_learn(self, transitions) -> None:
        self._noted()

    def do_episode_stopped(self) -> None:
        self._maybe_hold(self.hold_stop)


class OnThePool(ThreadNoting):
    steps_inline = False  # e.g. its step waits on a remote model server


def _in_episode(agent: RandomAgent, tmp_path: Path) -> AgentService:
    from harness.bench.step import cartpole_agent_config

    service = AgentService(agent, tmp_path)
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered(cartpole_agent_config("p"))
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    return service


def _call(app, method: str, path: str, body: bytes = b""):
    return _asgi(
        app,
        method,
        "/v1/mistk/agent" + path,
        "",
        [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        [body],
    )


@pytest.mark.parametrize("cls, where", [(ThreadNoting, "loop"), (OnThePool, "step")])
def test_steps_run_inline_on_the_loop_unless_the_agent_opts_out(tmp_path, cls, where):
    agent = cls()
    app = create_app(_in_episode(agent, tmp_path))

    async def scenario():
        loop_thread = threading.current_thread().name
        answers = [await _call(app, "POST", f"/{op}", STEP[op]) for op in sorted(STEP)]
        return loop_thread, answers

    loop_thread, answers = asyncio.run(scenario())
    assert [a[0] for a in answers] == [200, 200, 200]
    assert len(agent.threads) == 3  # one hook per operation (the step has no replay)
    for name in agent.threads:
        assert (name == loop_thread) if where == "loop" else name.startswith("step_")


def test_an_opted_out_step_still_gets_409_beside_a_running_step(tmp_path):
    agent = OnThePool()
    app = create_app(_in_episode(agent, tmp_path))
    agent.hold.set()

    async def scenario():
        first = asyncio.create_task(_call(app, "POST", "/getAction", OBS))
        await asyncio.get_running_loop().run_in_executor(None, agent.entered.wait, 10)
        agent.hold.clear()
        second = await _call(app, "POST", "/getAction", OBS)
        agent.release.set()
        return await first, second

    first, second = asyncio.run(scenario())
    assert first[0] == 200
    assert second[0] == 409 and "busy" in json.loads(second[2])["detail"]


def test_an_inline_step_gets_409_while_a_control_operation_runs(tmp_path):
    """Inline steps run one at a time on the loop; the lifecycle still refuses a step while
    a control operation (on its pool) holds the agent, and the loop stays free meanwhile."""
    agent = ThreadNoting()
    service = _in_episode(agent, tmp_path)
    app = create_app(service)
    agent.hold_stop.set()

    async def scenario():
        stopping = asyncio.create_task(_call(app, "POST", "/episodeStopped"))
        await asyncio.get_running_loop().run_in_executor(None, agent.entered.wait, 10)
        refused = await _call(app, "POST", "/getAction", OBS)
        status = await _call(app, "GET", "/status")
        agent.release.set()
        return refused, status, await stopping

    refused, status, stopped = asyncio.run(scenario())
    problem = json.loads(refused[2])
    assert refused[0] == 409 and problem["state"] == "episode_stopping", problem
    assert status[0] == 200 and stopped[0] == 200
    assert service.lifecycle.state == "ready" and agent.threads == []


def test_the_step_operations_are_the_spec_operations_that_serve_per_step():
    assert {"getAction", "replayAction", "step"} <= STEP_OPERATIONS


# ---- JSON -----------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [2_000, 200_000, 4_000_000])
def test_a_step_body_nested_past_any_parser_gets_400_not_a_crash(tmp_path, depth):
    """orjson before 3.9.15 recursed without a bound (a 2M-deep list crashed the process);
    a body that might nest deeper than `FAST_DEPTH` goes to `json`, which refuses it."""
    app = create_app(_in_episode(RandomAgent(), tmp_path))
    body = b'{"obs": {"p": ' + b"[" * depth + b"]" * depth + b"}}"
    status, _, answer = asyncio.run(_call(app, "POST", "/getAction", body))
    assert status == 400, answer
    assert "nests too deeply" in json.loads(answer)["detail"]


def test_a_step_body_with_many_brackets_is_read_by_json_as_well(tmp_path):
    """Past `FAST_DEPTH` brackets a body is read by the `json` path: same answer."""
    service = _in_episode(RandomAgent(), tmp_path)
    service.episodeStopped()
    entities = [f"e{i}" for i in range(jsonable.FAST_DEPTH + 1)]
    service.episodeStarted({"obs": {e: [0, 0, 0, 0] for e in entities}})
    app = create_app(service)
    body = json.dumps({"obs": {e: [0, 0, 0, 0] for e in entities}}).encode()
    status, _, answer = asyncio.run(_call(app, "POST", "/getAction", body))
    assert status == 200 and set(json.loads(answer)["actions"]) == set(entities)


@pytest.mark.parametrize(
    "text, where",
    [
        (b'{"obs": {"p": [0, 0, 0, NaN]}}', "obs['p'][3]: NaN is not a JSON number"),
        (b'{"obs": {"p": [0, 0, 0, 1e400]}}', "obs['p']"),  # json reads inf: the check refuses
        (b'{"obs": {"p": "\xff"}}', "not valid UTF-8"),
        (b'{"obs": {"p": [0, 0, 0, 0]}', "not valid JSON"),
    ],
)
def test_a_step_body_orjson_refuses_gets_the_json_paths_message(tmp_path, text, where):
    app = create_app(_in_episode(RandomAgent(), tmp_path))
    status, _, answer = asyncio.run(_call(app, "POST", "/getAction", text))
    assert status == 400 and where in json.loads(answer)["detail"], answer


def test_dumps_writes_what_json_writes_of_to_jsonable():
    f32 = np.array([0.7, 1e-8, 3.4e38], np.float32)
    for value in (
        {"obs": {"p": f32, "q": np.int64(3), "r": np.bool_(True)}},
        {"a": [1, (2, 3)], "b": "x"},
        {"nan": [float("nan")]},
        {"inf": np.array([np.inf])},
        {1: "int key"},
        {"big": 2**70},
        {"empty": None},
    ):
        expected = json.dumps(jsonable.to_jsonable(value), separators=(",", ":"))
        assert json.loads(jsonable.dumps(value)) == json.loads(expected) or (
            jsonable.dumps(value).decode() == expected
        )
    # the numbers a float32 array has as float64 (orjson's own numpy writes 0.7f as 0.7)
    assert json.loads(jsonable.dumps(f32)) == f32.tolist()
    assert jsonable.dumps({"x": [float("nan")]}) == b'{"x":[NaN]}'  # json's NaN, not null


def test_loads_fast_refuses_what_it_must_leave_to_json():
    for raw in (b"[NaN]", b"1e400", b'"\xff"', b"[" * 5000 + b"]" * 5000):
        with pytest.raises(ValueError):
            jsonable.loads_fast(raw)
    assert jsonable.loads_fast(b'{"a": [1, 2.5, true, null]}') == {"a": [1, 2.5, True, None]}


# ---- the worker -----------------------------------------------------------------------------
class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_an_answers_head_goes_out_with_its_body():
    raw = _Transport()
    transport = _HeadWithBody(raw)
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for this one
    assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert len(raw.writes) == 1
    transport.write(b"{}")
    assert raw.writes[1] == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # a HEAD answer
    transport.flush()  # (the protocol flushes at the end of every answer)
    assert raw.writes[2].endswith(b"content-length: 5\r\n\r\n")
    transport.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    transport.close()
    assert raw.writes[3].startswith(b"HTTP/1.1 500") and raw.closed
    assert transport.is_closing()  # the rest is the transport's own


def test_the_installed_uvicorn_has_what_the_protocol_uses():
    check_uvicorn()


@pytest.mark.parametrize(
    "lacking", [UVICORN_PRIVATE[0], "on_response_complete", UVICORN_ATTRIBUTES[-1]]
)
def test_a_uvicorn_without_a_part_the_protocol_uses_fails_loudly(lacking):
    """A uvicorn whose protocol lost a method or a connection attribute is refused by name
    before any service starts on it (`mistk-rl serve` runs the check first)."""

    class Changed(HttpToolsProtocol):
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if lacking in UVICORN_ATTRIBUTES:
                delattr(self, lacking)

    if lacking in UVICORN_PRIVATE:
        setattr(Changed, lacking, None)
    with pytest.raises(IncompatibleUvicorn, match=rf"uvicorn .* lacks .*\b{lacking}\b.*tested"):
        check_uvicorn(Changed)


def test_the_worker_serves_with_the_coalescing_protocol_and_no_date_or_server_header():
    assert ServiceWorker.CONFIG_KWARGS["http"] is CoalescingHttpTools
    assert not ServiceWorker.CONFIG_KWARGS["date_header"]
    assert not ServiceWorker.CONFIG_KWARGS["server_header"]


def test_a_served_answer_comes_whole_and_without_date_or_server(launch):
    client = launch("agent", RANDOM_AGENT).client()
    response = client.transport.request("GET", "/apiVersion")
    assert response.status == 200 and json.loads(response.body)["role"] == "agent"
    assert "date" not in response.headers and "server" not in response.headers
    head = client.transport.request("HEAD", "/apiVersion")  # (connexion answers HEAD)
    assert head.body == b""
    assert client.transport.request("GET", "/apiVersion").status == 200  # still in step


# ---- the protocol's fast path: an inline step answered as soon as its body is in ---------
class _Counted:
    """Which way each operation request went: `answer_now` (the fast path) or `_serve`."""

    def __init__(self, app) -> None:
        self.fast, self.asgi = 0, 0
        answer_now, serve = app.answer_now, app._serve

        def counted_answer_now(*args):
            self.fast += 1
            return answer_now(*args)

        async def counted_serve(*args):
            self.asgi += 1
            return await serve(*args)

        app.answer_now, app._serve = counted_answer_now, counted_serve


@contextlib.contextmanager
def _on_uvicorn(agent: RandomAgent, tmp_path: Path):
    """`agent` in an episode, served by uvicorn with the services' settings on a thread of
    this process: (port, the app's `_Counted`, the agent)."""
    import socket

    import uvicorn

    app = create_app(
        _in_episode(agent, tmp_path), token="sesame", limits=Limits(max_body_bytes=4096)
    )
    counted = _Counted(app)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="off", log_level="warning", **ServiceWorker.CONFIG_KWARGS)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], counted, agent
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert not thread.is_alive()


@pytest.fixture
def uvicorn_agent(tmp_path):
    with _on_uvicorn(ThreadNoting(), tmp_path) as served:
        yield served


def _request(
    op: str,
    body: bytes,
    *,
    token: str = "sesame",
    chunked: bool = False,
    extra: str = "",
    method: str = "POST",
    version: str = "1.1",
) -> bytes:
    head = (
        f"{method} /v1/mistk/agent/{op} HTTP/{version}\r\nHost: t\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {token}\r\n{extra}"
    )
    if chunked:
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + (
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _answers(port: int, wire: bytes, count: int):
    """Send `wire` at once on one connection; the `count` answers, and whether the server
    kept the connection."""
    from mistk_rl.sdk.transport import _Connection

    conn = _Connection("127.0.0.1", port, 10, None)
    try:
        conn.sock.sendall(wire)
        answers, keep = [], True
        for _ in range(count):
            answer, keep = conn.read_answer(head_only=False)
            answers.append(answer)
        return answers, keep
    finally:
        conn.close()


def _same(fast, slow) -> None:
    assert (fast.status, dict(fast.headers), fast.body) == (
        slow.status,
        dict(slow.headers),
        slow.body,
    )


def test_a_step_with_its_size_declared_is_answered_at_once_as_the_asgi_way_would(uvicorn_agent):
    port, counted, agent = uvicorn_agent
    [fast], keep = _answers(port, _request("getAction", OBS), 1)
    assert (counted.fast, counted.asgi) == (1, 0) and keep
    assert fast.status == 200 and json.loads(fast.body)["actions"]["p"] in (0, 1)
    assert fast.headers["content-type"] == "application/json"
    assert int(fast.headers["content-length"]) == len(fast.body)
    assert "mistk-instance" in fast.headers
    [slow], _ = _answers(port, _request("getAction", OBS, chunked=True), 1)
    assert (counted.fast, counted.asgi) == (1, 1)  # a chunked body goes the ASGI way
    assert dict(slow.headers).keys() == dict(fast.headers).keys()
    assert len(agent.threads) == 2  # both acted, on the loop
    # refusals: the same problem either way, and the agent untouched
    for body, kwargs, status in (
        (b'{"obs": 5}', {}, 400),
        (OBS, {"token": "wrong"}, 401),
        (b"[" * 3000, {}, 400),
    ):
        [fast], _ = _answers(port, _request("getAction", body, **kwargs), 1)
        [slow], _ = _answers(port, _request("getAction", body, chunked=True, **kwargs), 1)
        assert fast.status == status
        _same(fast, slow)
    assert len(agent.threads) == 2


def test_requests_the_fast_path_leaves_to_uvicorn_are_answered_as_before(uvicorn_agent):
    port, counted, _ = uvicorn_agent
    big = b'{"obs": {"p": [0, 0, 0, 0]}, "pad": "' + b"x" * 5000 + b'"}'  # over 4096
    [answer], _ = _answers(port, _request("getAction", big), 1)
    assert answer.status == 413
    [answer], keep = _answers(port, _request("getAction", OBS, extra="Connection: close\r\n"), 1)
    assert answer.status == 200 and not keep
    [answer], keep = _answers(port, _request("getAction", OBS, version="1.0"), 1)
    assert answer.status == 200 and not keep
    assert counted.fast == 0 and counted.asgi == 3


def test_pipelined_requests_are_answered_in_order_whichever_way_each_goes(uvicorn_agent):
    """A control operation runs on its pool: a step pipelined behind it waits its turn."""
    port, counted, agent = uvicorn_agent
    wire = (
        _request("getAction", OBS)
        + _request("apiVersion", b"", method="GET")
        + _request("getAction", OBS)
        + _request("getAction", b'{"obs": 5}')
    )
    answers, keep = _answers(port, wire, 4)
    assert [a.status for a in answers] == [200, 200, 200, 400] and keep
    assert json.loads(answers[1].body)["role"] == "agent"
    assert all("actions" in json.loads(answers[i].body) for i in (0, 2))
    assert counted.fast >= 1 and counted.asgi >= 2 and counted.fast + counted.asgi == 4
    assert len(agent.threads) == 2


class LearnsAfterAnswers(RandomAgent):
    """Its learning (what `do_learn` leaves for after the answer) waits until the caller
    says it has read the step's answer (`answered`), and notes whether that came; with
    `fail`, it raises instead."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.answered, self.learned, self.fail = threading.Event(), [], fail

    def do_learn(self, transitions):
        def rest():
            if self.fail:
                raise ValueError("the replay is full")
            self.learned.append(self.answered.wait(5))

        return rest


REPLAY = (
    b'"replay": {"prevObs": {"p": [0, 0, 0, 0]}, "actions": {"p": 0}, "rewards": {"p": 1}, '
    b'"terminated": {"p": false}, "newObs": {"p": [0, 0, 0, 0]}}'
)


def _learning_step(port: int, op: str, chunked: bool):
    """A step that brings an outcome: the entity step with a replay, or stepColumns naming
    the step id of a first stepColumns' action."""
    if op == "step":
        body = b'{"obs": {"p": [0, 0, 0, 0]}, ' + REPLAY + b"}"
    else:
        [first], _ = _answers(port, _request(op, b'{"envs": [0], "obs": [[0, 0, 0, 0]]}'), 1)
        step_id = json.loads(first.body)["stepIds"][0]
        body = (
            b'{"envs": [0], "obs": [[0, 0, 0, 0]], "stepIds": [%d], "rewards": [1], '
            b'"terminated": [false]}' % step_id
        )
    [answer], _ = _answers(port, _request(op, body, chunked=chunked), 1)
    return answer


@pytest.mark.parametrize("op", ["step", "stepColumns"])
@pytest.mark.parametrize("chunked", [False, True])  # the fast path, the ASGI way
def test_a_steps_learning_runs_after_its_answer_is_out(tmp_path, op, chunked):
    """The learning waits for the caller to have the answer: run before the answer, it would
    wait in vain (5 s) and note False."""
    with _on_uvicorn(LearnsAfterAnswers(), tmp_path) as (port, counted, agent):
        answer = _learning_step(port, op, chunked)
        assert answer.status == 200 and agent.learned == []
        agent.answered.set()
        [after], _ = _answers(port, _request("getAction", OBS), 1)  # (settles first)
        assert after.status == 200 and agent.learned == [True]
        assert counted.asgi == (1 if chunked else 0)


class ReturnsAValue(RandomAgent):
    """A do_learn written before it could leave work for later: what it returns is no work."""

    def do_learn(self, transitions):
        return len(transitions)


def test_a_do_learn_that_returns_something_else_than_work_is_served_as_before(tmp_path):
    with _on_uvicorn(ReturnsAValue(), tmp_path) as (port, _, _agent):
        for op in ("step", "stepColumns"):
            assert _learning_step(port, op, chunked=False).status == 200
        [after], _ = _answers(port, _request("getAction", OBS), 1)
        assert after.status == 200


def test_learning_that_fails_after_the_answer_fails_the_agent_for_its_next_call(tmp_path):
    with _on_uvicorn(LearnsAfterAnswers(fail=True), tmp_path) as (port, _, agent):
        answer = _learning_step(port, "step", chunked=False)
        assert answer.status == 200 and "p" in json.loads(answer.body)["actions"]
        [after], _ = _answers(port, _request("getAction", OBS), 1)
        assert after.status == 409 and "'failed'" in json.loads(after.body)["detail"]
        [status], _ = _answers(port, _request("status", b"", method="GET"), 1)
        assert (
            "step raised ValueError after its answer: the replay is full"
            in json.loads(status.body)["reason"]
        )


def _uvloop():
    return pytest.importorskip("uvloop").new_event_loop()


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, _uvloop], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("spin", [0.0, 0.01])
def test_after_an_answer_the_loop_polls_awake_for_the_spin_then_sleeps(spin, new_loop):
    """`AwakeAfterAnswers`: with a spin the loop keeps polling for that long after an answer
    (and takes a timer due meanwhile as always); without one it sleeps. Counted in polls,
    not CPU time, which a busy machine moves either way."""
    awake = AwakeAfterAnswers(spin)
    polls = []
    poll = awake._poll
    awake._poll = lambda loop: (polls.append(1), poll(loop))  # type: ignore[method-assign]
    loop = new_loop()
    try:
        fired = []
        awake.answered(loop, "a connection")
        loop.call_later(0.005, fired.append, "timer")  # (due within the spin)
        loop.run_until_complete(asyncio.sleep(0.1))
    finally:
        loop.close()
    assert fired == ["timer"] and not awake._polling  # the polling ended by itself
    if spin:  # (polling for 10 ms of the 100 takes hundreds of polls)
        assert len(polls) > 10, f"{len(polls)} polls: the loop slept"
    else:
        assert polls == [], "the loop polled without a spin"


class _Soon:
    """An event loop as `AwakeAfterAnswers` sees it: the callbacks it was asked to run."""

    def __init__(self) -> None:
        self.soon: list = []

    def call_soon(self, callback, *args) -> None:
        self.soon.append((callback, args))

    def run_ready(self) -> None:
        ready, self.soon = self.soon, []
        for callback, args in ready:
            callback(*args)


def test_a_request_later_than_the_spin_turns_the_polling_off_until_one_comes_within_it():
    """Polling pays only where the next request comes that soon (a step loop); for a caller
    that comes back later (a harness, a busy orchestrator) it would only burn a CPU."""
    now = [0.0]
    awake, loop = AwakeAfterAnswers(0.001, clock=lambda: now[0]), _Soon()
    awake.answered(loop, "caller")  # (the first answer: nothing known yet, it polls)
    assert awake._polling and loop.soon
    now[0] = 0.0011
    loop.run_ready()  # (the deadline passed: it stops)
    assert not awake._polling and not loop.soon
    now[0] = 0.005
    awake.request_came("caller")  # 3.9 ms after the answer
    awake.answered(loop, "caller")
    assert not awake.prompt and not awake._polling and not loop.soon
    now[0] = 0.0055
    awake.request_came("caller")  # 0.5 ms after it
    awake.answered(loop, "caller")
    assert awake.prompt and awake._polling and loop.soon


def test_a_request_from_another_connection_turns_the_polling_off():
    """A service that several callers share (a league's player, called by every game
    worker) runs among as many busy processes: it polls only for one caller in a loop, the
    connection it answered last."""
    now = [0.0]
    awake, loop = AwakeAfterAnswers(0.001, clock=lambda: now[0]), _Soon()
    awake.answered(loop, "worker 1")
    now[0] = 0.0011
    loop.run_ready()
    now[0] = 0.0012
    awake.request_came("worker 2")  # prompt, but from another caller
    awake.answered(loop, "worker 2")
    assert not awake.prompt and not awake._polling and not loop.soon
    now[0] = 0.0013
    awake.request_came("worker 2")  # the same caller again, at once
    awake.answered(loop, "worker 2")
    assert awake.prompt and awake._polling


def test_the_served_loop_times_each_request_from_the_answer_before_it(uvicorn_agent, monkeypatch):
    """`CoalescingHttpTools` tells its `AwakeAfterAnswers` when each request begins, and on
    which connection."""
    port, _counted, _agent = uvicorn_agent
    now, answered = [0.0], threading.Event()

    class Noted(AwakeAfterAnswers):
        def answered(self, loop, connection) -> None:
            super().answered(loop, connection)
            answered.set()

    awake = Noted(0.001, clock=lambda: now[0])
    monkeypatch.setattr(CoalescingHttpTools, "awake", awake)
    from mistk_rl.sdk.transport import _Connection

    conn = _Connection("127.0.0.1", port, 10, None)
    try:
        for at, prompt in ((0.0, True), (0.01, False), (0.0105, True)):
            now[0] = at
            answered.clear()
            conn.sock.sendall(_request("getAction", OBS))
            answer, _keep = conn.read_answer(head_only=False)
            assert answer.status == 200
            assert answered.wait(10)  # (the answer is sent before its bookkeeping)
            assert awake.prompt is prompt, f"a request at {at}"
        other = _Connection("127.0.0.1", port, 10, None)  # another caller, as prompt
        try:
            now[0] = 0.0106
            answered.clear()
            other.sock.sendall(_request("getAction", OBS))
            assert other.read_answer(head_only=False)[0].status == 200
            assert answered.wait(10)
            assert awake.prompt is False
        finally:
            other.close()
    finally:
        conn.close()
