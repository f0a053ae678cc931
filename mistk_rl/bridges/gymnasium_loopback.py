"""An agent service served from inside this process: the project's own agent service (its
handlers, checks and pipeline: `mistk_rl.service.app.create_app`), on uvicorn with the
services' settings, on one thread, on a loopback port the kernel picks.

The gymnasium bridge serves its `RelayAgent` this way, so an orchestrator anywhere on the
machine can call it while the caller's code runs in the same process. `close` stops the
server, joins its thread and shuts the service's thread pools down: nothing is left.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

import uvicorn

from mistk_rl.framework.agent import AbstractAgent
from mistk_rl.sdk.client import AgentClient, ServiceError
from mistk_rl.service.app import create_app
from mistk_rl.service.handlers import AgentService
from mistk_rl.service.server import ServiceWorker
from mistk_rl.service.uvicorn_protocol import check_uvicorn

# seconds uvicorn gives open connections to finish once it is told to stop
GRACEFUL_S = 2.0


class LoopbackAgent:
    """`agent` served on 127.0.0.1 (module doc); its root URL is `url`."""

    def __init__(self, agent: AbstractAgent, *, ready_timeout: float = 30.0) -> None:
        check_uvicorn()
        self._data = tempfile.TemporaryDirectory(prefix="mistk-rl-gymnasium-")
        service = AgentService(agent, Path(self._data.name))
        self._app: Any = create_app(service)
        self._socket = socket.create_server(("127.0.0.1", 0))
        host, port = self._socket.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_level="warning",
            timeout_graceful_shutdown=int(GRACEFUL_S),
            **ServiceWorker.CONFIG_KWARGS,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            daemon=True,  # (close joins it; a caller that never closes still exits)
            name="mistk-rl-gymnasium-agent",
        )
        self._thread.start()
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        """One apiVersion call: the socket listens already, so it queues until uvicorn
        serves it."""
        client = AgentClient(self.url, timeout=timeout)
        try:
            client.api_version()
        except ServiceError as exc:
            self.close()
            raise RuntimeError(
                f"the bridge's own agent service at {self.url} did not answer within "
                f"{timeout} s: {exc}"
            ) from exc
        finally:
            client.close()

    def client(self, timeout: float) -> AgentClient:
        return AgentClient(self.url, timeout=timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> Optional[str]:
        """Stop serving and release everything; what was left running, if anything."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()
        for pool in (self._app.control, self._app.steps):  # (`ServicePipeline`'s)
            pool.shutdown(wait=True, cancel_futures=True)
        self._data.cleanup()
        return f"thread {self._thread.name}" if self._thread.is_alive() else None
