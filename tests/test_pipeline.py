"""The serving pipeline: each cross-cutting rule, proven once for every operation of both specs.

The app is driven in-process as ASGI (no sockets), so every (rule, operation) pair is cheap;
the end-to-end tests cover the same pipeline behind gunicorn.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from pathlib import Path

import pytest

from agents.random_agent import RandomAgent
from mistk_rl.errors import InvalidRequest
from mistk_rl.limits import Limits
from mistk_rl.service.app import BASE_PATHS, create_app, load_spec
from mistk_rl.service.handlers import AgentService, OrchestratorService
from mistk_rl.wire import codec
from orchestrators.gym_orchestrator import GymOrchestrator

TOKEN = "s3cret"
OPERATIONS = [
    (role, path, method, op)
    for role in ("agent", "orchestrator")
    for path, methods in load_spec(role)["paths"].items()
    for method, op in methods.items()
]
# JSON (or binary tensor) bodies; putFile's body is a file: any bytes
FILE_BODY = [
    o
    for o in OPERATIONS
    if "application/octet-stream" in o[3].get("requestBody", {}).get("content", {})
]
WITH_BODY = [o for o in OPERATIONS if "requestBody" in o[3] and o not in FILE_BODY]
SECURED = [o for o in OPERATIONS if o[3].get("security") != []]


def _ids(ops):
    return [f"{role}.{op['operationId']}" for role, _, _, op in ops]


class Served:
    """One service behind its app, called over ASGI."""

    def __init__(self, role: str, data_dir: Path, **limits: int) -> None:
        self.service = (
            AgentService(RandomAgent(), data_dir)
            if role == "agent"
            else OrchestratorService(GymOrchestrator(), data_dir)
        )
        self.app = create_app(self.service, token=TOKEN, limits=Limits(**limits))
        self.base = BASE_PATHS[role]

    def call(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        query: str = "",
        content_type: str = "application/json",
        token: str | None = TOKEN,
        chunks: list[bytes] | None = None,
    ) -> tuple[int, dict, bytes]:
        headers = [(b"content-type", content_type.encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        if chunks is None:
            chunks = [body]
            headers.append((b"content-length", str(len(body)).encode()))
        return asyncio.run(
            _asgi(self.app, method.upper(), self.base + path, query, headers, chunks)
        )

    @property
    def version(self) -> int:
        return self.service.lifecycle.version


async def _asgi(app, method, path, query, headers, chunks):
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return (
        start["status"],
        {k.decode(): v.decode() for k, v in start["headers"]},
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


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
def test_every_body_over_the_limit_gets_413_declared_or_streamed(served, role, path, method, op):
    s = served(role, max_body_bytes=64)
    big = json.dumps({"obs": {"p": [0.0] * 40}}).encode()
    before = s.version
    _problem(*s.call(method, path, big), 413)
    _problem(*s.call(method, path, chunks=[big[:50], big[50:]]), 413)  # chunked upload
    assert s.version == before


@pytest.mark.parametrize("role, path, method, op", FILE_BODY, ids=_ids(FILE_BODY))
def test_a_file_over_its_limit_gets_413_and_nothing_is_written(served, role, path, method, op):
    """Files have their own limit (max_file_bytes: checkpoints outgrow request bodies)."""
    s = served(role, max_body_bytes=16, max_file_bytes=64)
    octet = "application/octet-stream"
    for chunks in ([b"x" * 65], [b"x" * 40, b"x" * 25]):  # declared, or streamed
        _problem(
            *s.call(
                method,
                path,
                query="path=f.bin",
                content_type=octet,
                chunks=chunks if len(chunks) > 1 else None,
                body=chunks[0],
            ),
            413,
        )
    assert not (s.service.data_dir / "f.bin").exists()
    status, _, _ = s.call(method, path, b"x" * 64, query="path=f.bin", content_type=octet)
    assert status == 200 and (s.service.data_dir / "f.bin").read_bytes() == b"x" * 64
    problem = _problem(*s.call(method, path, b"{}", query="path=g.bin"), 415)
    assert octet in problem["detail"] and not (s.service.data_dir / "g.bin").exists()


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
def test_every_operation_refuses_unknown_or_malformed_query_parameters(
    served, role, path, method, op
):
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


def _binary(header, payload: bytes = bytes(16)) -> bytes:
    """A message of the binary encoding with this header (an object, or raw header bytes)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<I", len(raw)) + raw + payload


def _obs(**spec) -> dict:
    """A header whose one map, obs, is `spec` over a well-formed one."""
    return {
        "maps": {"obs": {"entities": ["a"], "dtype": "<f4", "shape": [1, 2], "offset": 0, **spec}}
    }


def _keyed(**spec) -> dict:
    return {
        "maps": {
            "obs": {
                "entities": ["a"],
                "keys": {"k": {"dtype": "<f4", "shape": [1, 2], "offset": 0, **spec}},
            }
        }
    }


MALFORMED_BINARY = {
    "header is a list": struct.pack("<I", 2) + b"[]",
    "header is a number": _binary(b"5"),
    "header length past the body": struct.pack("<I", 100) + b"{}",
    "header length only": struct.pack("<I", 0)[:3],
    "header not JSON": _binary(b"{x"),
    "header not UTF-8": _binary(b'{"\xff": 1}'),
    "NaN in the header": _binary(b'{"maps": {}, "values": {"epsilon": NaN}}'),
    "header nested too deep": _binary(b"[" * 100_000 + b"]" * 100_000),
    "no maps": _binary({"values": {}}),
    "maps is a list": _binary({"maps": [["obs", {}]]}),
    "values is a list": _binary({"maps": {}, "values": [1]}),
    "unknown header key": _binary({"maps": {}, "arrays": {}}),
    "map spec is a list": _binary({"maps": {"obs": [1, 2]}}),
    "map spec is a string": _binary({"maps": {"obs": "a"}}),
    "entities is a string": _binary(_obs(entities="ab")),
    "entities are numbers": _binary(_obs(entities=[1])),
    "an entity twice": _binary(_obs(entities=["a", "a"], shape=[2, 2])),
    "more rows than entities": _binary(_obs(shape=[2, 2])),
    "no dtype": _binary({"maps": {"obs": {"entities": ["a"], "shape": [1], "offset": 0}}}),
    "dtype is a number": _binary(_obs(dtype=4)),
    "dtype is a list": _binary(_obs(dtype=[["x", "<f4"]])),
    "dtype unknown": _binary(_obs(dtype="<q9")),
    "dtype text": _binary(_obs(dtype="<U4")),
    "dtype object": _binary(_obs(dtype="O")),
    "dtype complex": _binary(_obs(dtype="<c8")),
    "dtype structured": _binary(_obs(dtype="f4,f4")),
    "shape is a string": _binary(_obs(shape="12")),
    "shape is empty": _binary(_obs(shape=[])),
    "shape is a number": _binary(_obs(shape=1)),
    "shape negative": _binary(_obs(shape=[1, -1])),
    "shape fractional": _binary(_obs(shape=[1, 1.5])),
    "shape boolean": _binary(_obs(shape=[True, 2])),
    "shape of 70 axes": _binary(_obs(shape=[1] * 70)),
    "array past the body": _binary(_obs(shape=[1, 1_000_000])),
    "offset negative": _binary(_obs(offset=-4)),
    "offset fractional": _binary(_obs(offset=1.5)),
    "offset a string": _binary(_obs(offset="0")),
    "offset past the body": _binary(_obs(offset=10**12)),
    "unknown array field": _binary(_obs(strides=[4])),
    "keys is a list": _binary({"maps": {"obs": {"entities": ["a"], "keys": [1]}}}),
    "keys empty": _binary({"maps": {"obs": {"entities": ["a"], "keys": {}}}}),
    "key spec is a number": _binary({"maps": {"obs": {"entities": ["a"], "keys": {"k": 1}}}}),
    "key spec with entities": _binary(_keyed(entities=["a"])),
    "key spec negative offset": _binary(_keyed(offset=-1)),
    "key spec past the body": _binary(_keyed(shape=[1, 100])),
    "keys beside an array": _binary({"maps": {"obs": {**_obs()["maps"]["obs"], "keys": {}}}}),
    "empty path": _binary({"maps": {"": _obs()["maps"]["obs"]}}),
    "path into a field": _binary({"maps": {"obs.x": _obs()["maps"]["obs"]}}),
    "path too deep": _binary({"maps": {"replay.prevObs.x": _obs()["maps"]["obs"]}}),
    "path given twice": _binary({"values": {"obs": 1}, **_obs()}),
    "path inside a value": _binary(
        {"values": {"replay": 5}, "maps": {"replay.prevObs": _obs()["maps"]["obs"]}}
    ),
}


@pytest.mark.parametrize("operation", ["getAction", "replayAction", "step"])
@pytest.mark.parametrize("name", MALFORMED_BINARY)
def test_every_malformed_binary_body_gets_400_saying_so(served, operation, name):
    """A binary body whose header or maps are not the encoding's is a 400 that says the
    encoding is malformed (a header that was JSON but not an object was a 500)."""
    s = served("agent")
    before = s.version
    problem = _problem(
        *s.call("post", f"/{operation}", MALFORMED_BINARY[name], content_type=codec.CONTENT_TYPE),
        400,
    )
    assert problem["detail"].startswith(f"malformed {codec.CONTENT_TYPE} body: "), problem
    assert s.version == before


@pytest.mark.parametrize("key", ["", "a\n"])
def test_a_dict_key_the_spec_refuses_gets_400_before_the_handler(served, key):
    """The spec says what Dict keys the services take (x-key-pattern): '' is refused as the
    body is validated, as the handler would (tests/test_bad_input.py), naming the field."""
    s = served("agent")
    service = s.service
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    before = s.version
    body = {
        "name": "p",
        "observationSpace": {"type": "Dict", "spaces": {key: {"type": "Discrete", "n": 2}}},
        "actionSpace": {"type": "Discrete", "n": 2},
    }
    problem = _problem(*s.call("post", "/agentRegistered", json.dumps(body).encode()), 400)
    assert problem["detail"].startswith(f"key {key!r} does not match "), problem
    assert problem["detail"].endswith("- 'observationSpace.spaces'"), problem
    assert s.version == before and service.lifecycle.state == "initialized"


DICT_SPACES = {
    "observationSpace": {
        "type": "Dict",
        "spaces": {
            "cue": {
                "type": "Box",
                "shape": [2],
                "dtype": "float32",
                "low": [-1, -1],
                "high": [1, 1],
            },
            "d": {"type": "Discrete", "n": 3},
        },
    },
    "actionSpace": {"type": "Discrete", "n": 2},
}
GOOD_OBS = '{"cue": [0, 0], "d": 1}'
REPLAY = (
    '{"prevObs": {"p": %s}, "actions": {"p": 0}, "rewards": {"p": 0}, '
    '"terminated": {"p": false}, "newObs": {"p": %%s}}' % GOOD_OBS
)


@pytest.mark.parametrize(
    "operation, template, field",
    [
        ("getAction", '{"obs": {"p": %s}}', "obs"),
        ("episodeStarted", '{"obs": {"p": %s}}', "obs"),
        ("replayAction", REPLAY, "newObs"),
        ("step", '{"obs": {"p": %s}, "replay": %s}' % (GOOD_OBS, REPLAY), "replay.newObs"),
    ],
)
@pytest.mark.parametrize(
    "obs, where",
    [
        ('{"cue": [0, NaN], "d": 1}', "['p']['cue'][1]"),
        ('{"cue": [0, 0], "d": -Infinity}', "['p']['d']"),
    ],
)
def test_a_nan_in_a_dict_observation_gets_400_naming_the_entity_and_key(
    served, operation, template, field, obs, where
):
    """JSON has no NaN: the parser refuses one before any check that knows the field, so its
    400 said only "NaN is not a JSON number"; it names where it is, as the per-key checks
    do (a non-finite number decoded from JSON or the binary encoding reaches those)."""
    s = served("agent")
    service = s.service
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered({"name": "p", **DICT_SPACES})
    if operation != "episodeStarted":
        service.episodeStarted({"obs": {"p": json.loads(GOOD_OBS)}})
    before = s.version
    body = (template % obs).encode()
    problem = _problem(*s.call("post", f"/{operation}", body), 400)
    assert problem["detail"].startswith(f"{field}{where}: "), problem
    assert "is not a JSON number" in problem["detail"]
    assert s.version == before


def test_a_nan_anywhere_in_a_json_body_is_named_by_where_it_is():
    from mistk_rl.service.pipeline import parse_json

    for text, where in (
        ('{"hyperparameters": {"lr": [1, {"x": NaN}]}}', "hyperparameters['lr'][1]['x']: NaN"),
        ("[Infinity]", "the body[0]: Infinity"),
        ("NaN", "the body: NaN"),
        ('{"a": 1, "b": [2, -Infinity, NaN]}', "b[1]: -Infinity"),
    ):
        with pytest.raises(InvalidRequest, match=re.escape(where)):
            parse_json(text.encode(), 64)


def test_query_parameters_are_converted_and_checked_against_the_spec(served):
    s = served("agent")
    status, headers, body = s.call("get", "/status", query="resourceVersion=0&timeout=0")
    assert status == 200 and json.loads(body)["instance"] == headers["mistk-instance"]
    for query in (
        "timeout=61",
        "timeout=-1",
        "resourceVersion=-1",
        "resourceVersion=1.5",
        "timeout=inf",
        "timeout=0&timeout=1",
    ):
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
            return _asgi(
                s.app,
                "GET",
                s.base + "/status",
                "resourceVersion=0&timeout=30",
                [(b"authorization", f"Bearer {TOKEN}".encode())],
                [b""],
            )

        waiting = [asyncio.create_task(poll()) for _ in range(2)]
        while _long_polls(s) < 2:
            await asyncio.sleep(0)  # let both reach their wait (no time passes: yields only)
        refused = await poll()
        plain = await _asgi(
            s.app,
            "GET",
            s.base + "/status",
            "",
            [(b"authorization", f"Bearer {TOKEN}".encode())],
            [b""],
        )
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
            return _asgi(
                s.app,
                method,
                s.base + path,
                query,
                [(b"authorization", f"Bearer {TOKEN}".encode())],
                [b""],
            )

        polls = [
            asyncio.create_task(call("GET", "/status", "resourceVersion=0&timeout=60"))
            for _ in range(64)
        ]
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
