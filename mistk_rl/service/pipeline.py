"""The serving pipeline: every spec operation passes through this one ASGI layer.

Each cross-cutting rule lives here once and holds for every operation: the bearer token, the
body size limit (413, by Content-Length or while streaming), decoding (JSON, strict: valid
UTF-8, no NaN/Infinity, bounded nesting; or the binary tensor encoding where the spec lists
it), validation of the body and the query parameters against the spec (compiled once by
`validation.py`), a typed error for every failure rendered as ``application/problem+json``,
and where the handler runs:

- the per-step operations (`STEP_OPERATIONS`) inline on the event loop: a hop to a thread
  and back cost ~100 us of CPU a step on 2 cores, the lifecycle allows one step at a time
  anyway, and a burst of control calls (on their pool) still never delays a step. An agent
  whose step blocks (on I/O, a remote model) sets ``steps_inline = False`` and its steps run
  on a small pool of their own instead, as an inline step would hold up every request;
- every other operation on the control pool;
- a status long-poll as an async wait on the event loop, holding no thread, so any number of
  waiting callers cannot starve reset, terminate or stopEpisode; past `max_long_polls` at
  once a long-poll gets 429.

Requests that name no operation (the Swagger UI, ``openapi.json``, unknown paths) go on to
connexion, which serves the docs and answers 404/405.

An inline step whose body's size is declared can skip ASGI altogether: the services' HTTP
protocol (`mistk_rl.service.uvicorn_protocol.CoalescingHttpTools`) gathers its body and calls
`ServicePipeline.answer_now` the moment it is complete. That runs the same steps as `__call__`
(`_admit`, `_decode`, the handler, `_render`, `_failure`), so both ways answer alike.

After each answer is sent, the work its handler deferred runs (`settle`; an agent's step
learns from its transitions then, while the caller steps its envs: `Lifecycle.defer`), where
the handler ran: on the loop for an inline step, on its pool otherwise.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import inspect
import json
import logging
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NamedTuple, Optional
from urllib.parse import parse_qsl

from connexion.json_schema import resolve_refs

from mistk_rl.errors import InvalidRequest, MistkError
from mistk_rl.limits import Limits
from mistk_rl.service import otel
from mistk_rl.service.logs import ACCESS, access
from mistk_rl.service.metrics import PROBE_PATHS, OperationCounts, Probes, RequestCounts
from mistk_rl.service.validation import Check, compile_schema
from mistk_rl.wire import codec, frames
from mistk_rl.wire.jsonable import dumps, loads_fast
from mistk_rl.wire.tracing import TRACE, Trace, child_of

log = logging.getLogger(__name__)
Send = Callable[[dict], Awaitable[None]]
STEP_OPERATIONS = frozenset(
    {"getAction", "replayAction", "step", "stepColumns", "getPolicy", "replayColumns"}
)
# answered thousands of times a second in a run: their access lines are DEBUG (a refusal's
# INFO), and they are served in a span only while DEBUG is on (a step, which calls no other
# service, pays for no ids it would not show; its rare log lines then name no trace)
QUIET_OPERATIONS = STEP_OPERATIONS | {"status", "stepStream"}
TRACEPARENT = b"traceparent"
PROBES_TAKE = ("GET", "HEAD")  # the methods /metrics, /healthz and /readyz answer
JSON_TYPE = "application/json"
OCTET_TYPE = "application/octet-stream"


class Refused(MistkError):
    """A request the pipeline refuses before any handler runs (status set per case)."""

    def __init__(self, status: int, title: str, detail: str, **extra: object) -> None:
        super().__init__(detail, **extra)
        self.status = status
        self.title = title


@dataclass
class Parameter:
    """One query parameter of an operation, as the spec declares it."""

    name: str
    argument: str  # the handler's keyword (snake_case)
    kind: str  # the schema's type
    check: Check
    required: bool
    default: Any = None


@dataclass
class ServedOperation:
    """One spec operation, ready to serve."""

    id: str
    handler: Callable[..., Any]
    secured: bool
    params: dict[str, Parameter] = field(default_factory=dict)
    body: Optional[Check] = None  # the JSON body's check; None: the operation takes no body
    body_required: bool = False
    binary: bool = False  # the spec lists the binary tensor encoding for the body
    binary_answer: bool = False  # ... for the 200 answer (when the caller accepts it)
    raw: bool = False  # the body is bytes as sent (application/octet-stream: a file)
    step: bool = False
    inline: bool = False  # a step run on the event loop itself (no thread hop)
    waits: bool = False  # the handler is a coroutine (a long-poll): awaited on the loop
    quiet: bool = False  # in `QUIET_OPERATIONS`: DEBUG access lines, no span of its own
    counts: OperationCounts = field(default_factory=OperationCounts)  # for /metrics


class ServicePipeline:
    """One service's ASGI app: it serves the spec's operations and hands anything else (the
    docs, unknown paths, lifespan events) to `app`, the service's connexion app."""

    def __init__(
        self,
        app: Any,
        *,
        service: Any,
        spec: dict,
        base_path: str,
        token: Optional[str],
        limits: Limits = Limits(),
        control_threads: int = 16,
        step_threads: int = 8,
    ) -> None:
        self.app = app
        self.service = service
        self.token = token
        self.limits = limits
        self.routes = _operations(resolve_refs(spec), service, base_path)
        # a spec path's methods, for the Allow header of a 405 (connexion lists only one
        # operation's when a path has several)
        methods: dict[str, set[str]] = {}
        for method, path in self.routes:
            methods.setdefault(path, set()).add(method)
            if method == "GET":
                methods[path].add("HEAD")
        self.allow = {path: ", ".join(sorted(names)) for path, names in methods.items()}
        self.allow.update(dict.fromkeys(PROBE_PATHS, ", ".join(PROBES_TAKE)))
        inline = getattr(service.impl, "steps_inline", False)
        for operation in self.routes.values():
            operation.inline = operation.step and inline
        # a step stream's path -> the operation its frames are (`mistk_rl.wire.frames`)
        self.streams = {
            path: self.routes[("POST", path[: -len(frames.PATH)] + frames.FRAMES_OF)]
            for (_, path), op in self.routes.items()
            if op.id == "stepStream"
        }
        # every answer names the instance (the SDK notices a restarted service by it)
        self.instance = (b"mistk-instance", service.lifecycle.instance.encode())
        self.lifecycle = service.lifecycle
        self.lifecycle.after_answers = True  # `settle` runs deferred work after answers
        self.control = ThreadPoolExecutor(control_threads, thread_name_prefix="control")
        self.steps = ThreadPoolExecutor(step_threads, thread_name_prefix="step")
        self.long_polls = 0
        # what /metrics shows (`mistk_rl.service.metrics`): counted as answers go
        self.requests = RequestCounts(op.id for op in self.routes.values())
        for op in self.routes.values():
            op.counts, op.quiet = self.requests.of[op.id], op.id in QUIET_OPERATIONS
        # (read once: a quiet operation's lines and spans exist only while DEBUG is on)
        self.debug = ACCESS.isEnabledFor(logging.DEBUG)
        self.spans = otel.from_environment(service.role, service.impl)  # (None: no export)
        self.streams_open = self.streams_opened = self.stream_frames = 0
        # bytes held of step frames and request bodies not yet whole, over all connections
        # (the HTTP protocol counts them; `Limits.max_buffered_bytes` bounds them)
        self.held_bytes = 0
        self.probes = Probes(self)

    async def __call__(self, scope: dict, receive: Any, send: Send) -> None:
        started = time.perf_counter()
        operation = (
            self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        )
        if (
            operation is None
            and scope["type"] == "http"
            and scope["path"] in PROBE_PATHS
            and scope["method"] in PROBES_TAKE
        ):
            # (answered here on the loop: no thread pool, no lifecycle lock in the way)
            probe = Answer(*self.probes.answer(scope["path"]), (self.instance,))
            return await send_answer(send, probe)
        if operation is None:
            allow = self.allow.get(scope["path"]) if scope["type"] == "http" else None
            if allow is None or scope["method"] == "HEAD" and "HEAD" in allow:
                return await self.app(scope, receive, send)
            return await send_answer(
                send,
                problem(
                    405,
                    "Method Not Allowed",
                    f"{scope['method']} is not allowed here: {allow}",
                    None,
                    self.instance,
                    (b"allow", allow.encode()),
                ),
            )
        headers = dict(scope.get("headers") or [])
        trace = None if operation.quiet and not self.debug else child_of(headers.get(TRACEPARENT))
        if trace is not None:  # (this request's task has a context of its own)
            TRACE.set(trace)
        try:
            result, status = await self._serve(operation, scope, headers, receive)
            answer = self._render(operation, headers, result, status)
        except Exception as exc:  # noqa: BLE001 - rendered as a problem (`_failure`)
            answer = self._failure(operation, exc)
        self._served(operation, answer.status, started, trace)
        await send_answer(send, answer)
        if operation.inline:
            self.settle()
        elif operation.step:
            await asyncio.get_running_loop().run_in_executor(self.steps, self.settle)

    def settle(self) -> None:
        """Run what the last answered operation deferred (module doc)."""
        self.lifecycle.settle()

    def _served(
        self, op: ServedOperation, status: int, started: float, trace: Optional[Trace]
    ) -> None:
        """Count an answer for /metrics and log its access line (a quiet operation's 2xx
        only at DEBUG: `mistk_rl.service.logs`)."""
        seconds = time.perf_counter() - started
        op.counts.observe(status, seconds)
        if not op.quiet or status >= 400 or self.debug:
            access(op.id, status, seconds, trace, op.quiet)
        if self.spans is not None and trace is not None:
            self.spans.served(op.id, status, seconds, trace)

    # -- the fast path: an inline step answered as soon as its body is in --
    def fast_operation(
        self, method: str, path: str, content_length: Optional[bytes]
    ) -> Optional[ServedOperation]:
        """The operation of a request that `answer_now` can answer, or None (it goes the ASGI
        way): a step run inline whose body's size is declared and within the limit (a
        chunked or too large body takes the ASGI path, which streams and refuses it)."""
        op = self.routes.get((method, path))
        if op is None or not op.inline or content_length is None:
            return None
        if not content_length.isdigit() or int(content_length) > self.limits.max_body_bytes:
            return None
        return op

    def answer_now(self, op: ServedOperation, headers: dict, query: bytes, raw: bytes) -> "Answer":
        """What `__call__` answers `op` with, computed at once from the whole body (no ASGI
        messages, no task): the same admission, decoding, checks, handler and rendering."""
        started = time.perf_counter()
        trace = None if op.quiet and not self.debug else child_of(headers.get(TRACEPARENT))
        token = None if trace is None else TRACE.set(trace)
        try:
            kwargs = self._admit(op, headers, query)
            if op.body is not None and (raw or op.body_required):
                kwargs["body"] = self._decode(op, headers, raw)
            result, status, _ = op.handler(**kwargs)
            answer = self._render(op, headers, result, status)
        except Exception as exc:  # noqa: BLE001 - rendered as a problem (`_failure`)
            answer = self._failure(op, exc)
        finally:
            if token is not None:
                TRACE.reset(token)
        self._served(op, answer.status, started, trace)
        return answer

    # -- the step stream: frames answered as requests on an upgraded connection --
    def open_stream(
        self, method: str, path: str, headers: dict
    ) -> tuple[Optional[ServedOperation], "Answer"]:
        """A request to upgrade to the step stream on `path` (`mistk_rl.wire.frames`): the
        operation its frames are and the ``101`` answer, or None and the problem that
        refuses it. It is admitted as a request of that operation would be (the token), and
        its headers (Content-Type, Accept) hold for every frame."""
        if path in self.streams and method != "GET":
            return None, problem(
                405,
                "Method Not Allowed",
                f"open a step stream with GET, not {method}",
                None,
                self.instance,
                (b"allow", b"GET"),
            )
        try:
            return self._stream_operation(path, headers), Answer(
                101,
                b"",
                b"",
                (
                    (b"connection", b"upgrade"),
                    (b"upgrade", frames.PROTOCOL.encode()),
                    self.instance,
                ),
            )
        except MistkError as exc:
            return None, problem(exc.status, exc.title, exc.detail, exc.extra, self.instance)

    def _stream_operation(self, path: str, headers: dict) -> ServedOperation:
        op = self.streams.get(path)
        if op is None:
            raise Refused(404, "Not Found", f"no step stream at {path}")
        self._admit(op, headers, b"")
        if self.streams_open >= self.limits.max_streams:
            raise Refused(
                429,
                "Too Many Requests",
                f"{self.streams_open} step streams are open here already (the limit "
                f"max_streams={self.limits.max_streams}): close one, or step over HTTP",
                retryAfter=1,
            )
        if not op.inline:  # (`answer_now` runs on the loop: a blocking step must not)
            raise Refused(
                501,
                "Not Implemented",
                f"{op.id} runs off the event loop here "
                "(steps_inline is False): step over HTTP requests",
            )
        content_type = (
            headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()
        )
        if content_type not in (JSON_TYPE, codec.CONTENT_TYPE):
            raise Refused(
                415,
                "Unsupported Media Type",
                f"a step stream's Content-Type {content_type or '(none)'!r}: its "
                f"frames are {JSON_TYPE} or {codec.CONTENT_TYPE}",
            )
        return op

    def frame_too_large(self, op: ServedOperation) -> "Answer":
        """The 413 a step stream's frame over the body limit gets."""
        return self._failure(op, _too_large(self.limits.max_body_bytes))

    # -- the steps of serving one operation --
    def _admit(self, op: ServedOperation, headers: dict, query: bytes) -> dict[str, Any]:
        """The token, then the query parameters: the handler's keyword arguments so far."""
        if (
            op.secured
            and self.token
            and not _authorized(headers.get(b"authorization", b""), self.token)
        ):
            raise Refused(
                401, "Unauthorized", "No authorization token provided, or it is not valid"
            )
        return _query(op, query) if query or op.params else {}

    async def _serve(
        self, op: ServedOperation, scope: dict, headers: dict, receive: Any
    ) -> tuple[Any, int]:
        kwargs = self._admit(op, headers, scope.get("query_string", b""))
        if op.body is not None:
            raw = await self._read_body(
                headers,
                receive,
                self.limits.max_file_bytes if op.raw else self.limits.max_body_bytes,
            )
            if raw or op.body_required:
                kwargs["body"] = self._decode(op, headers, raw)
        if op.waits:
            return await self._long_poll(op, kwargs)
        if op.inline:
            result, status, _ = op.handler(**kwargs)
            return result, status
        pool = self.steps if op.step else self.control
        context = contextvars.copy_context()  # (the request's span, for the handler's calls)
        result, status, _ = await asyncio.get_running_loop().run_in_executor(
            pool, lambda: context.run(op.handler, **kwargs)
        )
        return result, status

    def _render(self, op: ServedOperation, headers: dict, result: Any, status: int) -> "Answer":
        if isinstance(result, bytes):  # a file
            return Answer(status, OCTET_TYPE.encode(), result, (self.instance,))
        if op.binary_answer and codec.CONTENT_TYPE.encode() in headers.get(b"accept", b""):
            columns = not isinstance(result.get("actions"), dict)  # (entity maps, or columns)
            return Answer(
                status,
                codec.CONTENT_TYPE.encode(),
                codec.encode(result, columns=columns),
                (self.instance,),
            )
        return Answer(status, JSON_TYPE.encode(), dumps(result), (self.instance,))

    def _failure(self, op: ServedOperation, exc: Exception) -> "Answer":
        if isinstance(exc, MistkError):
            if exc.status >= 500:
                log.error("%s: %s", op.id, exc.detail)
            return problem(
                exc.status,
                exc.title,
                exc.detail,
                exc.extra,
                self.instance,
                *getattr(exc, "headers", ()),
            )
        log.error("%s", op.id, exc_info=exc)  # a bug: say so, keep serving
        return problem(
            500,
            "Internal Server Error",
            f"{op.id}: {type(exc).__name__}: {exc}",
            None,
            self.instance,
        )

    async def _long_poll(self, op: ServedOperation, kwargs: dict) -> tuple[Any, int]:
        if "resource_version" not in kwargs:  # a plain status answers at once: never capped
            result, status, _ = await op.handler(**kwargs)
            return result, status
        if self.long_polls >= self.limits.max_long_polls:
            raise Refused(
                429,
                "Too Many Requests",
                f"{self.limits.max_long_polls} status long-polls are waiting "
                "already; retry later or poll without resourceVersion",
                retryAfter=1,
            )
        self.long_polls += 1
        try:
            result, status, _ = await op.handler(**kwargs)
        finally:
            self.long_polls -= 1
        return result, status

    async def _read_body(self, headers: dict, receive: Any, limit: int) -> bytes:
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refused(400, "Bad Request", "the client went away mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _decode(self, op: ServedOperation, headers: dict, raw: bytes) -> Any:
        content_type = (
            headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()
        )
        if op.raw:
            if content_type != OCTET_TYPE:
                raise Refused(
                    415,
                    "Unsupported Media Type",
                    f"Content-Type {content_type or '(none)'!r} is not accepted "
                    f"here: use {OCTET_TYPE}",
                )
            return raw
        if op.binary and content_type == codec.CONTENT_TYPE:
            body = codec.decode(raw)
        elif content_type == JSON_TYPE or (not raw and op.body_required):
            # step bodies are checked against strict, shallow schemas (Tensor has rank <= 4),
            # so only the free-form control bodies need the nesting check
            body = parse_json(raw, None if op.step else self.limits.max_json_depth)
        else:
            accepted = [JSON_TYPE] + ([codec.CONTENT_TYPE] if op.binary else [])
            raise Refused(
                415,
                "Unsupported Media Type",
                f"Content-Type {content_type or '(none)'!r} is not accepted here: "
                f"use {' or '.join(accepted)}",
            )
        assert op.body is not None  # (callers decode only an operation that takes a body)
        try:
            op.body(body, "")
        except RecursionError:  # (a list a thousand deep where the spec wants a number)
            raise InvalidRequest("the request body nests too deeply") from None
        return body


# ---- decoding -------------------------------------------------------------------------------
def parse_json(raw: bytes, max_depth: Optional[int]) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity (JSON has none; Python accepts them), nesting
    at most `max_depth` deep (a deep free-form object would make later code recurse).

    Without a depth bound (the step bodies) orjson decodes first (`jsonable.loads_fast`:
    7x faster than `json` for 64 entities); a body it refuses goes down the `json` path,
    which says what is wrong and where (and reads 1e400 as `json` always did)."""
    if not raw:
        raise InvalidRequest("the request body is empty: this operation needs a JSON body")
    if max_depth is None:
        try:
            return loads_fast(raw)
        except ValueError:
            pass
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid UTF-8: {exc}") from exc
    if max_depth is not None and _depth(text) > max_depth:
        raise InvalidRequest(f"the request body nests deeper than {max_depth} levels")
    try:
        return _DECODER.decode(text)
    except _NotANumber as exc:
        where = _constant_path(text)
        raise InvalidRequest(
            f"{where + ': ' if where else ''}{exc.name} is not a JSON number: "
            "send finite numbers only"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequest("the request body nests too deeply") from exc


class _NotANumber(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _no_constant(name: str) -> None:
    raise _NotANumber(name)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # json.loads(..., **kw) makes one per call
_MARK = object()
_MARKING = json.JSONDecoder(parse_constant=lambda name: _MARK)


def _constant_path(text: str) -> str:
    """Where in `text` (a JSON body that holds NaN or Infinity) the first of them is, as a
    field with its entity, key and index (``obs['p']['cue'][0]``, ``replay.newObs['p'][1]``):
    what the checks past decoding name, since a caller must find the value to fix it. Empty
    when the body cannot be walked (it nests too deeply)."""
    try:
        stack: list[tuple[Any, tuple]] = [(_MARKING.decode(text), ())]
    except (ValueError, RecursionError):
        return ""
    while stack:  # depth first, in document order
        value, path = stack.pop()
        if value is _MARK:
            return _render(path)
        items = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, list)
            else ()
        )
        stack.extend((child, (*path, key)) for key, child in reversed(list(items)))
    return ""


def _render(path: tuple) -> str:
    """``field['entity']['key'][i]``; a container's field as ``replay.newObs``."""
    if not path or not isinstance(path[0], str):  # (a body that is no object)
        return "the body" + "".join(f"[{part!r}]" for part in path)
    head, rest = path[0], path[1:]
    if head in codec.CONTAINERS and rest and isinstance(rest[0], str):
        head, rest = f"{head}.{rest[0]}", rest[1:]
    return head + "".join(f"[{part!r}]" for part in rest)


_BRACKETS = re.compile(r'[\[\]{}]|"(?:[^"\\]|\\.)*"')


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _query(op: ServedOperation, query_string: bytes) -> dict[str, Any]:
    """The handler's keyword arguments from the query string, checked against the spec."""
    try:
        pairs = parse_qsl(
            query_string.decode("utf-8"), keep_blank_values=True, strict_parsing=False
        )
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the query string is not valid UTF-8") from exc
    kwargs: dict[str, Any] = {}
    for name, text in pairs:
        param = op.params.get(name)
        if param is None:
            raise InvalidRequest(
                f"unknown query parameter {name!r}; this operation takes "
                f"{', '.join(op.params) or 'none'}"
            )
        if param.argument in kwargs:
            raise InvalidRequest(f"query parameter {name!r} is given more than once")
        value = _convert(param, text)
        param.check(value, name)
        kwargs[param.argument] = value
    for param in op.params.values():
        if param.argument not in kwargs:
            if param.required:
                raise InvalidRequest(f"missing query parameter {param.name!r}")
            if param.default is not None:
                kwargs[param.argument] = param.default
    return kwargs


def _convert(param: Parameter, text: str) -> Any:
    if "\x00" in text:
        raise InvalidRequest(f"query parameter {param.name!r} contains a NUL character")
    try:
        if param.kind == "integer":
            if not re.fullmatch(r"[+-]?\d{1,30}", text):  # the spec's maximum is checked next
                raise ValueError
            return int(text)
        if param.kind == "number":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if param.kind == "boolean":
            return {"true": True, "false": False}[text.lower()]
    except (ValueError, KeyError):
        raise InvalidRequest(
            f"query parameter {param.name!r}: {text!r} is not {_EXPECTED[param.kind]}"
        ) from None
    return text


_EXPECTED = {"integer": "an integer", "number": "a finite number", "boolean": "true or false"}


# ---- building the routes --------------------------------------------------------------------
def _operations(spec: dict, service: Any, base_path: str) -> dict[tuple[str, str], ServedOperation]:
    secured_default = bool(spec.get("security"))
    routes = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            op_id = op["operationId"]
            params = {}
            for p in op.get("parameters", []):
                if p["in"] != "query":
                    raise ValueError(f"{op_id}: only query parameters are supported")
                schema = p.get("schema", {})
                params[p["name"]] = Parameter(
                    p["name"],
                    _snake(p["name"]),
                    schema.get("type", "string"),
                    compile_schema(schema),
                    p.get("required", False),
                    schema.get("default"),
                )
            secured = bool(op["security"]) if "security" in op else secured_default
            handler = getattr(service, op_id)
            operation = ServedOperation(
                op_id,
                handler,
                secured,
                params,
                step=op_id in STEP_OPERATIONS,
                waits=inspect.iscoroutinefunction(handler),
            )
            answer = op.get("responses", {}).get("200", {})
            operation.binary_answer = codec.CONTENT_TYPE in answer.get("content", {})
            body = op.get("requestBody")
            if body and OCTET_TYPE in body["content"]:  # a file: any bytes
                operation.raw, operation.body = True, _any_bytes
                operation.body_required = body.get("required", False)
            elif body:
                content = body["content"]
                operation.body = compile_schema(content[JSON_TYPE]["schema"])
                operation.body_required = body.get("required", False)
                operation.binary = codec.CONTENT_TYPE in content
            routes[(method.upper(), base_path + path)] = operation
    return routes


def _any_bytes(_body: bytes, _where: str) -> None:
    """The check of a file body: every byte string is one."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# ---- answering ------------------------------------------------------------------------------
class Answer(NamedTuple):
    """An answer as the pipeline renders it, before the server writes it."""

    status: int
    content_type: bytes
    payload: bytes
    headers: tuple = ()  # (name, value) pairs besides content-type and content-length


async def send_answer(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [
                (b"content-type", answer.content_type),
                (b"content-length", str(len(answer.payload)).encode()),
                *answer.headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer.payload})


def problem(
    status: int,
    title: str,
    detail: str,
    extra: Optional[dict],
    instance: tuple[bytes, bytes],
    *headers: tuple[bytes, bytes],
) -> Answer:
    """An ``application/problem+json`` answer (RFC 9457)."""
    body = {
        "type": "about:blank",
        "title": title,
        "detail": detail,
        "status": status,
        **(extra or {}),
    }
    named = [instance, *headers]
    if extra and "retryAfter" in extra:
        named.append((b"retry-after", str(extra["retryAfter"]).encode()))
    return Answer(status, b"application/problem+json", dumps(body), tuple(named))


def _too_large(limit: int) -> Refused:
    return Refused(413, "Payload Too Large", f"request body is larger than {limit} bytes")


def _authorized(header: bytes, token: str) -> bool:
    scheme, _, value = header.decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode("latin-1"), token.encode("utf-8")
    )
