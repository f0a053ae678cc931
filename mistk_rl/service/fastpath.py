"""The step path: the per-step operations served without connexion's middleware stack.

getAction, replayAction and step run once per env step, where connexion's stack (routing,
security, jsonschema validation, a WSGI thread hop into Flask) costs about 0.8 ms per call,
several times the work itself. `StepPath` answers those operations directly: same spec, same
handlers, same bearer token, same 413/400/401/409/500 problem bodies, with validation compiled
from the spec (`validation.py`) and the handler run on a small thread pool (a hop of ~40 us).
Bodies may be JSON or the binary tensor encoding (`mistk_rl.codec`, which the answer also
uses when the request's Accept names it). Every other request goes on to connexion.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Optional

from connexion.json_schema import resolve_refs

from mistk_rl import codec
from mistk_rl.errors import InvalidRequest, MistkError
from mistk_rl.service.validation import compile_schema

log = logging.getLogger(__name__)
STEP_OPERATIONS = ("getAction", "replayAction", "step")
Send = Callable[[dict], Awaitable[None]]


async def send_json(send: Send, status: int, body: Any,
                    content_type: bytes = b"application/json") -> None:
    await send_bytes(send, status, json.dumps(body).encode(), content_type)


async def send_bytes(send: Send, status: int, payload: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def send_problem(send: Send, status: int, title: str, detail: str,
                       extra: Optional[dict] = None) -> None:
    """An ``application/problem+json`` answer, as connexion writes them."""
    body = {"type": "about:blank", "title": title, "detail": detail, "status": status,
            **(extra or {})}
    await send_json(send, status, body, b"application/problem+json")


class StepPath:
    """ASGI middleware in front of the connexion app of one service."""

    def __init__(self, app: Any, *, service: Any, spec: dict, base_path: str,
                 token: Optional[str], max_body_bytes: int, threads: int = 8) -> None:
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.routes: dict[str, tuple[Callable, Callable]] = {}
        resolved = resolve_refs(spec)
        for path, methods in resolved["paths"].items():
            op = methods.get("post")
            if op is None or op["operationId"] not in STEP_OPERATIONS:
                continue
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            self.routes[base_path + path] = (compile_schema(schema),
                                             getattr(service, op["operationId"]))
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="step-path")

    async def __call__(self, scope: dict, receive: Any, send: Send) -> None:
        route = (self.routes.get(scope["path"]) if scope["type"] == "http"
                 and scope["method"] == "POST" else None)
        headers = dict(scope.get("headers") or []) if route else {}
        content_type = headers.get(b"content-type", b"")
        binary = content_type.startswith(codec.CONTENT_TYPE.encode())
        if route is None or not (binary or content_type.startswith(b"application/json")):
            return await self.app(scope, receive, send)
        validate, handler = route
        if self.token and not _authorized(headers.get(b"authorization", b""), self.token):
            return await send_problem(send, 401, "Unauthorized",
                                      "No authorization token provided, or it is not valid")
        body = await self._read_body(headers, receive)
        if body is None:
            return await send_problem(send, 413, "Payload Too Large",
                                      f"request body is larger than {self.max_body_bytes} bytes")
        try:
            request = codec.decode(body) if binary else json.loads(body)
            validate(request, "")
        except json.JSONDecodeError as exc:
            return await send_problem(send, 400, "Bad Request", str(exc))
        except InvalidRequest as exc:
            return await send_problem(send, 400, "Bad Request", exc.detail)
        try:
            result, status, _ = await asyncio.get_running_loop().run_in_executor(
                self.executor, handler, request)
        except MistkError as exc:
            if exc.status >= 500:
                log.error("%s: %s", exc.title, exc.detail)
            return await send_problem(send, exc.status, exc.title, exc.detail, exc.extra)
        except Exception as exc:  # noqa: BLE001 - a bug: answer 500 like connexion does
            log.exception("step path %s", scope["path"])
            return await send_problem(send, 500, "Internal Server Error",
                                      f"{type(exc).__name__}: {exc}")
        if "actions" in result and codec.CONTENT_TYPE.encode() in headers.get(b"accept", b""):
            return await send_bytes(send, status, codec.encode(result),
                                    codec.CONTENT_TYPE.encode())
        await send_json(send, status, result)

    async def _read_body(self, headers: dict, receive: Any) -> Optional[bytes]:
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


def _authorized(header: bytes, token: str) -> bool:
    scheme, _, value = header.decode(errors="replace").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)
