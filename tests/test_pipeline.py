"""The serving pipeline: each cross-cutting rule, proven once for every operation of both specs.

The app is driven in-process as ASGI (no sockets), so every (rule, operation) pair is cheap;
the end-to-end tests cover the same pipeline behind gunicorn.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agents.random_agent import RandomAgent
from mistk_rl import codec
from mistk_rl.limits import Limits
from mistk_rl.service.app import BASE_PATHS, create_app, load_spec
from mistk_rl.service.handlers import AgentService, OrchestratorService
from orchestrators.gym_orchestrator import GymOrchestrator

TOKEN = "s3cret"
OPERATIONS = [(role, path, method, op) for role in ("agent", "orchestrator")
              for path, methods in load_spec(role)["paths"].items()
              for method, op in methods.items()]
WITH_BODY = [o for o in OPERATIONS if "requestBody" in o[3]]
SECURED = [o for o in OPERATIONS if o[3].get("security") != []]


def _ids(ops):
    return [f"{role}.{op['operationId']}" for role, _, _, op in ops]


class Served:
    """One service behind its app, called over ASGI."""

    def __init__(self, role: str, data_dir: Path, **limits: int) -> None:
        self.service = (AgentService(RandomAgent(), data_dir) if role == "agent"
                        else OrchestratorService(GymOrchestrator(), data_dir))
        self.app = create_app(self.service, token=TOKEN, limits=Limits(**limits))
        self.base = BASE_PATHS[role]

    def call(self, method: str, path: str, body: bytes = b"", *, query: str = "",
             content_type: str = "application/json", token: str | None = TOKEN,
             chunks: list[bytes] | None = None) -> tuple[int, dict, bytes]:
        headers = [(b"content-type", content_type.encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        if chunks is None:
            chunks = [body]
            headers.append((b"content-length", str(len(body)).encode()))
        return asyncio.run(_asgi(self.app, method.upper(), self.base + path, query, headers,
                                 chunks))

    @property
    def version(self) -> int:
        return self.service.lifecycle.version


async def _asgi(app, method, path, query, headers, chunks):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
               for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.fixture
def served(tmp_path):
    made = {}

    def get(role: str, **limits: int) -> Served:
        key = (role, tuple(sorted(limits.items())))
        if key not in made:
            made[key] = Served(role, tmp_path / f"{role}{len(made)}", **limits)
        return made[key]
    return get


def _problem(status: int, headers: dict, body: bytes, expected: int) -> dict:
    assert status == expected, body
    assert headers["content-type"] == "application/problem+json"
    assert "mistk-instance" in headers
    problem = json.loads(body)
    assert problem["status"] == expected and problem["detail"]
    return problem


@pytest.mark.parametrize("role, path, method, op", SECURED, ids=_ids(SECURED))
def test_every_secured_operation_wants_the_token(served, role, path, method, op):
    s = served(role)
    before = s.version
    for token in (None, "wrong"):
        _problem(*s.call(method, path, b"{}", token=token), 401)
    assert s.version == before


@pytest.mark.parametrize("role, path, method, op", WITH_BODY, ids=_ids(WITH_BODY))
def test_every_body_over_the_limit_gets_413_declared_or_streamed(served, role, path, method,
                                                                   op):
    s = served(role, max_body_bytes=64)
    big = json.dumps({"obs": {"p": [0.0] * 40}}).encode()
    before = s.version
    _problem(*s.call(method, path, big), 413)
    _problem(*s.call(method, path, chunks=[big[:50], big[50:]]), 413)  # chunked upload
    assert s.version == before


BAD_BODIES = {
    "invalid UTF-8": b'{"obs": {"p": "\xff"}}',
    "not JSON": b'{"obs": ',
    "NaN": b'{"obs": {"p": [NaN]}}',
    "Infinity": b'{"obs": {"p": -Infinity}}',
    "deep nesting": b"[" * 10_000 + b"]" * 10_000,
    "empty": b"",
}


@pytest.mark.parametrize("role, path, method, op", WITH_BODY, ids=_ids(WITH_BODY))
def test_every_bad_body_gets_400_and_changes_nothing(served, role, path, method, op):
    s = served(role)
    before = s.version
    for name, body in BAD_BODIES.items():
        problem = _problem(*s.call(method, path, body), 400)
        assert problem["title"] != "Internal Server Error", name
    assert s.version == before


@pytest.mark.parametrize("role, path, method, op", WITH_BODY, ids=_ids(WITH_BODY))
def test_every_body_in_an_unlisted_media_type_gets_415(served, role, path, method, op):
    s = served(role)
    problem = _problem(*s.call(method, path, b"obs=1", content_type="text/plain"), 415)
    assert "application/json" in problem["detail"]


@pytest.mark.parametrize("role, path, method, op", OPERATIONS, ids=_ids(OPERATIONS))
def test_every_operation_refuses_unknown_or_malformed_query_parameters(served, role, path,
                                                                       method, op):
    s = served(role)
    before = s.version
    problem = _problem(*s.call(method, path, b"{}", query="bogus=1"), 400)
    assert "bogus" in problem["detail"]
    for param in op.get("parameters", []):
        if "$ref" in param or param["schema"].get("type") == "string":
            continue
        _problem(*s.call(method, path, b"{}", query=f"{param['name']}=NaN"), 400)
    assert s.version == before


def test_malformed_binary_bodies_get_400(served):
    s = served("agent")
    good = codec.encode({"obs": {"p": [0.0, 1.0]}})
    for body in (b"\x01", b"\xff\xff\xff\x7f{}", good[:-3], good[:6] + b"X" + good[7:]):
        _problem(*s.call("post", "/getAction", body, content_type=codec.CONTENT_TYPE), 400)


def test_query_parameters_are_converted_and_checked_against_the_spec(served):
    s = served("agent")
    status, headers, body = s.call("get", "/status", query="resourceVersion=0&timeout=0")
    assert status == 200 and json.loads(body)["instance"] == headers["mistk-instance"]
    for query in ("timeout=61", "timeout=-1", "resourceVersion=-1", "resourceVersion=1.5",
                  "timeout=inf", "timeout=0&timeout=1"):
        _problem(*s.call("get", "/status", query=query), 400)


def test_a_long_poll_from_another_instance_answers_at_once(served):
    s = served("agent")
    # a version this instance never had: the caller saw a previous instance
    status, _, body = s.call("get", "/status", query="resourceVersion=99&timeout=60")
    assert status == 200 and json.loads(body)["resourceVersion"] == 0


def test_long_polls_over_the_cap_get_429(served):
    s = served("agent", max_long_polls=2)

    async def scenario():
        def poll():
            return _asgi(s.app, "GET", s.base + "/status", "resourceVersion=0&timeout=30",
                         [(b"authorization", f"Bearer {TOKEN}".encode())], [b""])
        waiting = [asyncio.create_task(poll()) for _ in range(2)]
        while _long_polls(s) < 2:
            await asyncio.sleep(0)  # let both reach their wait (no time passes: yields only)
        refused = await poll()
        plain = await _asgi(s.app, "GET", s.base + "/status", "",
                            [(b"authorization", f"Bearer {TOKEN}".encode())], [b""])
        assert plain[0] == 200  # a status without resourceVersion is never refused
        s.service.lifecycle.update_payload({"x": 1})  # wakes the waiting two
        return refused, await asyncio.gather(*waiting)
    refused, answered = asyncio.run(scenario())
    problem = _problem(*refused, 429)
    assert refused[1]["retry-after"] == "1" and "long-polls" in problem["detail"]
    assert [a[0] for a in answered] == [200, 200]


def _long_polls(s: Served) -> int:
    return len(s.service.lifecycle._watchers)


def test_64_waiting_long_polls_do_not_delay_reset_or_terminate(served):
    s = served("agent")

    async def scenario():
        def call(method, path, query=""):
            return _asgi(s.app, method, s.base + path, query,
                         [(b"authorization", f"Bearer {TOKEN}".encode())], [b""])
        polls = [asyncio.create_task(call("GET", "/status", "resourceVersion=0&timeout=60"))
                 for _ in range(64)]
        while _long_polls(s) < 64:
            await asyncio.sleep(0)
        reset = await call("POST", "/reset")  # on the control pool, not behind the polls
        terminate = await call("POST", "/terminate")
        return reset, terminate, await asyncio.gather(*polls)
    reset, terminate, polls = asyncio.run(scenario())
    assert (reset[0], terminate[0]) == (202, 200)
    # every poll was answered by reset's change, not by its 60 s timeout: reset ran while all
    # 64 were waiting (with a thread per poll it would have queued behind them)
    assert all(p[0] == 200 and json.loads(p[2])["resourceVersion"] > 0 for p in polls)
