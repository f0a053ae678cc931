"""Plain HTTP to the service under test, every exchange kept for the report.

The kit speaks HTTP itself (`requests`), not through the SDK: it has to see what a
stranger's service really answers (a wrong status, a missing header, a body that is not
JSON) where the SDK would raise or repair.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional
from urllib.parse import urlencode, urlsplit

import requests

from mistk_rl.conformance.contract import Contract
from mistk_rl.conformance.report import Exchange


@dataclass
class Reply:
    """What came back: the status (0: nothing did), the body and its JSON, if it is."""

    status: int
    content_type: str
    body: bytes
    exchange: Exchange
    seconds: float

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def field(self, name: str) -> Any:
        value = self.json
        return value.get(name) if isinstance(value, dict) else None


def service_url(url: str, contract: Contract) -> str:
    """The base path the spec names (``/v1/mistk/agent``) when `url` is a bare root."""
    url = url.rstrip("/")
    return url if urlsplit(url).path not in ("", "/") else url + contract.base_path


class Probe:
    """Calls one service's operations by operationId, with or without its token."""

    def __init__(
        self, url: str, contract: Contract, token: Optional[str] = None, timeout: float = 30.0
    ) -> None:
        self.contract = contract
        self.base_url = service_url(url, contract)
        self.token = token
        self.timeout = timeout
        self.session = requests.Session()

    def close(self) -> None:
        self.session.close()

    def call(
        self,
        operation_id: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        body: Any = None,
        raw: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        token: Any = "default",  # None: send none; a string: send that one
        timeout: Optional[float] = None,
    ) -> Reply:
        op = self.contract.operations[operation_id]
        url = self.base_url + op.path
        if params:
            url += "?" + urlencode({k: _query(v) for k, v in params.items()})
        sent = dict(headers or {})
        bearer = self.token if token == "default" else token
        if bearer:
            sent.setdefault("Authorization", f"Bearer {bearer}")
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        shown = (data or b"").decode("utf-8", "replace")
        began = time.perf_counter()
        try:
            response = self.session.request(
                op.method, url, data=data, headers=sent, timeout=timeout or self.timeout
            )
        except requests.RequestException as exc:
            exchange = Exchange(op.method, url, 0, request_body=shown, error=str(exc))
            return Reply(0, "", b"", exchange, time.perf_counter() - began)
        content_type = response.headers.get("Content-Type", "")
        exchange = Exchange(
            op.method,
            url,
            response.status_code,
            content_type,
            shown,
            response.content.decode("utf-8", "replace"),
        )
        return Reply(
            response.status_code,
            content_type,
            response.content,
            exchange,
            time.perf_counter() - began,
        )


def _query(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value
