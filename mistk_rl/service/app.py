"""The connexion app factory: routes, validation and auth come from the OpenAPI spec.

`create_app(service)` loads ``openapi/<role>.yaml``, routes each operationId to the method of
the same name on the `AgentService` / `OrchestratorService`, maps library errors to
``application/problem+json``, refuses bodies over a size limit with 413, and requires a bearer
token on every operation but apiVersion when one is configured.
"""
from __future__ import annotations

import copy
import hmac
import json
import logging
from functools import lru_cache
from importlib import resources
from typing import Any, Optional, Union

import yaml
from a2wsgi import WSGIMiddleware
from connexion import FlaskApp
from connexion.jsonifier import Jsonifier
from connexion.middleware import MiddlewarePosition
from connexion.options import SwaggerUIOptions
from connexion.problem import problem
from connexion.resolver import Resolver
from connexion.security import BearerSecurityHandler
from starlette.exceptions import HTTPException

from mistk_rl.errors import MistkError
from mistk_rl.service.fastpath import StepPath, send_problem
from mistk_rl.service.handlers import AgentService, OrchestratorService

log = logging.getLogger(__name__)
BASE_PATHS = {"agent": "/v1/mistk/agent", "orchestrator": "/v1/mistk/orchestrator"}
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
HANDLER_THREADS = 32  # long-polls hold a thread each; connexion's default pool has 10


@lru_cache(maxsize=None)
def load_spec(role: str) -> dict[str, Any]:
    """The role's OpenAPI document (packaged as `mistk_rl.openapi`)."""
    text = resources.files("mistk_rl.openapi").joinpath(f"{role}.yaml").read_text()
    return yaml.safe_load(text)


def create_app(service: Union[AgentService, OrchestratorService], *,
               token: Optional[str] = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FlaskApp:
    spec = copy.deepcopy(load_spec(service.role))
    security_map = {}
    if token:
        security_map["bearer"] = _bearer_handler(token)
    else:  # no token configured: the operations are open (services bind loopback by default)
        spec.pop("security", None)
    app = FlaskApp(__name__)
    if service.role == "agent":  # the per-step operations skip connexion's stack
        app.add_middleware(StepPath, position=MiddlewarePosition.BEFORE_EXCEPTION,
                           service=service, spec=spec, base_path=BASE_PATHS[service.role],
                           token=token, max_body_bytes=max_body_bytes)
    app.add_middleware(BodySizeLimit, position=MiddlewarePosition.BEFORE_EXCEPTION,
                       max_bytes=max_body_bytes)
    app.add_api(spec,
                base_path=BASE_PATHS[service.role],
                resolver=Resolver(lambda operation_id: getattr(service, operation_id)),
                strict_validation=True,
                jsonifier=Jsonifier(json),  # compact: no indent on the hot path
                pythonic_params=True,
                security_map=security_map,
                swagger_ui_options=SwaggerUIOptions(swagger_ui=True, swagger_ui_path="/ui"))
    app.add_error_handler(MistkError, _problem_from_error)
    flask_app = app.app
    app._middleware_app.asgi_app = WSGIMiddleware(flask_app.wsgi_app, workers=HANDLER_THREADS)
    return app


def _problem_from_error(_request: Any, exc: MistkError):
    if exc.status >= 500:
        log.error("%s: %s", exc.title, exc.detail)
    return problem(status=exc.status, title=exc.title, detail=exc.detail, ext=exc.extra or None)


def _bearer_handler(expected: str) -> type:
    """A connexion security handler that accepts exactly `expected` (compared in constant
    time)."""

    def check(token: str) -> Optional[dict]:
        return {"sub": "client"} if hmac.compare_digest(token, expected) else None

    class TokenBearer(BearerSecurityHandler):
        def _resolve_func(self, _security_scheme: dict):
            return check

    return TokenBearer


class BodySizeLimit:
    """ASGI middleware: 413 problem+json for bodies over `max_bytes`, by Content-Length or
    while streaming (chunked uploads)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send)
        seen = 0
        started = False

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        await send_problem(send, 413, "Payload Too Large",
                           f"request body is larger than {self.max_bytes} bytes")


class _TooLarge(HTTPException):
    """Raised mid-stream; connexion renders it as a 413 problem if it gets there first."""

    def __init__(self) -> None:
        super().__init__(413, "request body is larger than the service accepts")
