"""What both services' handlers share: `ServiceBase` (status, long-polls, reset and
terminate, the lifecycle and data dir), the answers' content types and the long-poll bound."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Optional

from mistk_rl import API_VERSION
from mistk_rl.errors import IllegalState, InvalidRequest, ResourceNotFound
from mistk_rl.files import atomic_write_bytes
from mistk_rl.lifecycle import Lifecycle
from mistk_rl.lifecycle.machine import Facts
from mistk_rl.limits import Limits

Response = tuple[dict[str, Any], int, dict[str, str]]
JSON = {"Content-Type": "application/json"}  # the spec also lists problem+json: be explicit
OCTET = {"Content-Type": "application/octet-stream"}
MAX_LONG_POLL_S = 60.0


class ServiceBase:
    """What both roles share: status (with long-poll), apiVersion, terminate, data paths."""

    role = ""

    def __init__(
        self,
        impl: Any,
        lifecycle: Lifecycle,
        data_dir: Path,
        limits: Limits,
        shares: Optional[dict[str, Path]] = None,
    ) -> None:
        self.impl = impl
        self.shares = dict(shares or {})
        self.lifecycle = lifecycle
        self.limits = limits
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        impl.data_dir = self.data_dir
        impl.shares = self.shares
        impl.limits = limits
        impl._lifecycle = lifecycle

    async def status(
        self, resource_version: Optional[int] = None, timeout: float = 30.0
    ) -> Response:
        """A coroutine: a long-poll waits on the event loop, holding no thread."""
        if resource_version is None:
            return self.lifecycle.status(), 200, JSON
        status = await self.lifecycle.wait_async(resource_version, min(timeout, MAX_LONG_POLL_S))
        return status, 200, JSON

    capabilities: tuple[str, ...] = ()

    def apiVersion(self) -> Response:  # noqa: N802 - named by the spec's operationId
        return (
            {"version": API_VERSION, "role": self.role, "capabilities": list(self.capabilities)},
            200,
            JSON,
        )

    def terminate(self) -> Response:
        self.lifecycle.run("terminate", self.impl.do_terminate)
        return self._done()

    def getFile(self, path: str) -> tuple[bytes, int, dict[str, str]]:  # noqa: N802
        resolved = self._path(path)
        try:
            return resolved.read_bytes(), 200, OCTET
        except FileNotFoundError:
            raise ResourceNotFound(f"no file at {path!r}") from None
        except OSError as exc:
            raise InvalidRequest(f"{path!r} cannot be read: {exc.strerror}") from None

    def putFile(self, path: str, body: bytes) -> Response:  # noqa: N802
        if self.lifecycle.state == "terminated":
            raise IllegalState("putFile", "terminated", self.lifecycle.allowed_api())
        resolved = self._path(path)
        try:
            atomic_write_bytes(resolved, body)
        except OSError as exc:
            raise InvalidRequest(f"{path!r} cannot be written: {exc.strerror}") from None
        return (
            {"path": path, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()},
            200,
            JSON,
        )

    def _path(self, path: str) -> Path:
        return self.impl.resolve_path(path)

    def _done(self) -> Response:
        return self.lifecycle.status(), 200, JSON

    def _accepted(
        self, operation: str, hook: Callable[[], object], facts: Facts = None
    ) -> Response:
        """Run a background operation (the table's ``background=True``): `run` answers the
        status at once, with the hook started in a thread; 202. `facts`: `Lifecycle.run`'s."""
        status = self.lifecycle.run(operation, hook, facts=facts)
        assert isinstance(status, dict), f"{operation} is not a background operation"
        return status, 202, JSON
