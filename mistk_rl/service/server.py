"""`mistk-rl serve`: one implementation class behind gunicorn (one worker, ASGI).

State lives in the worker's memory, so there is exactly one worker process; scale out by
running more services. The implementation class is imported before gunicorn starts, so a
typo fails at once with a clear message instead of in a worker boot loop.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import httptools
from gunicorn.app.base import BaseApplication
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from mistk_rl.wire import frames
from mistk_rl.framework.agent import AbstractAgent
from mistk_rl.limits import Limits
from mistk_rl.framework.orchestrator import AbstractOrchestrator
from mistk_rl.wire.spin import default_spin

ROLES = {"agent": AbstractAgent, "orchestrator": AbstractOrchestrator}
log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    role: str
    target: str  # "module:Class"
    host: str = "127.0.0.1"
    port: int = 8081
    data_dir: Path = Path("data")
    token: Optional[str] = None
    fd: Optional[int] = None  # serve on an inherited listening socket instead of host:port
    allow_agent_hosts: list[str] = field(default_factory=list)
    env_modules: list[str] = field(default_factory=list)  # modules envs may come from
    agent_timeout: float = 20.0  # seconds an orchestrator waits for one agent call
    limits: Limits = field(default_factory=Limits)
    # NAME -> DIR: paths NAME/... resolve inside DIR (`mistk_rl.files.resolve_in`)
    shares: dict[str, Path] = field(default_factory=dict)
    log_level: str = "info"
    worker_class: str = "mistk_rl.service.server.ServiceWorker"


def import_implementation(role: str, target: str) -> type:
    """The class named by ``module:Class``, checked to be an agent or orchestrator."""
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"expected MODULE:CLASS, got {target!r}")
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, ROLES[role])):
        raise ValueError(f"{target} is not a subclass of {ROLES[role].__name__}")
    return cls


def build_app(options: ServeOptions, cls: type):
    """Instantiate the implementation and wrap it in its connexion app (in the worker)."""
    from mistk_rl.service.app import create_app
    from mistk_rl.service.handlers import AgentService, OrchestratorService

    _one_thread_for_math()
    impl = cls()
    if options.role == "agent":
        service: Any = AgentService(impl, options.data_dir, limits=options.limits,
                                    shares=options.shares)
    else:
        service = OrchestratorService(impl, options.data_dir, agent_token=options.token,
                                      allowed_agent_hosts=options.allow_agent_hosts,
                                      agent_timeout=options.agent_timeout,
                                      env_modules=options.env_modules, limits=options.limits,
                                      shares=options.shares)
    return create_app(service, token=options.token, limits=options.limits)


def _one_thread_for_math() -> None:
    """The machines have 2 cores shared by services and env workers."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


class _HeadWithBody:
    """A connection's transport that sends an answer's head together with its body.

    uvicorn writes the head when the app sends ``http.response.start`` and the body on
    ``http.response.body``: two sends, two TCP segments, and often two reads for the client.
    Here the head of a final answer (not ``100 Continue``, which the client waits for) is
    held until the next write, the end of the answer (`flush`, a HEAD answer has no body)
    or `close`. Everything else is the transport's own."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._head = b""

    def write(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        elif data[:7] == b"HTTP/1." and data[9:10] != b"1" and data[-4:] == b"\r\n\r\n":
            self._head = data
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._head:
            data, self._head = self._head, b""
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class AwakeAfterAnswers:
    """Keeps the worker's event loop polling instead of sleeping for `spin` seconds after each
    answer, while requests come that soon after the answer before them (`default_spin`: 1
    ms with two CPUs or more, ``MISTK_RL_SPIN_US`` sets it; the clients' side is
    `mistk_rl.sdk.transport`).

    In a step loop the next request comes within a step's time; a loop that slept meanwhile
    lets its vCPU halt, and on a virtual machine the request then waits for the hypervisor
    to wake it (docs/serving.md "Idle CPUs"). A callback that is ready to run makes the loop
    poll its sockets with a zero timeout, so one that schedules itself again until the
    deadline keeps the loop, and its CPU, awake; nothing else changes. A request that came
    later than the spin (a harness polling now and then, a caller busy between requests)
    turns the polling off until one comes within it again, and so does a request from
    another connection than the one last answered: a service that several callers share (a
    league's player, called by every game worker) runs among as many busy processes, whose
    CPU its polling would take (a tic-tac-toe league on 2 cores trained 4-11% slower with its
    services polling, docs/serving.md). The CPU is only kept busy for one caller in a loop."""

    def __init__(self, spin: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.spin = spin
        self._clock = clock
        self._until = 0.0
        self._polling = False
        self._answered_at: Optional[float] = None  # the last answer, while none came since
        self._answered_to: object = None  # the connection it went to
        # the last request came within the spin of the answer before it, on its connection
        self.prompt = True

    def request_came(self, connection: object) -> None:
        if self._answered_at is not None:
            self.prompt = (connection is self._answered_to
                           and self._clock() - self._answered_at <= self.spin)
            self._answered_at = None

    def answered(self, loop: Any, connection: object) -> None:
        if not self.spin:
            return
        now = self._answered_at = self._clock()
        self._answered_to = connection
        if not self.prompt:
            return
        self._until = now + self.spin
        if not self._polling:
            self._polling = True
            loop.call_soon(self._poll, loop)

    def _poll(self, loop: Any) -> None:
        if self._clock() < self._until:
            loop.call_soon(self._poll, loop)
        else:
            self._polling = False


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with one send per answer (`_HeadWithBody`) and a fast
    path for the per-step requests.

    uvicorn turns every request into an ASGI cycle: a scope, an event, a task scheduled on
    the loop, then the body and the answer as messages. A step that the pipeline runs
    inline on the loop anyway, with its body's size declared and within the limit
    (`Pipeline.fast_operation`), on a kept-alive HTTP/1.1 connection with nothing else of
    its own in progress, skips all that: its body is gathered as it is parsed and
    `Pipeline.answer_now` answers it the moment the request is complete, through the same
    checks, handler and rendering (30-40 us less a round trip on 2 cores, docs/serving.md).
    Any other request takes uvicorn's own way. After each answer the loop stays awake for
    a while if requests come that fast (`AwakeAfterAnswers`, one per worker).

    A request that upgrades to the step stream (`mistk_rl.wire.frames`) turns its connection
    into one: after the ``101`` every frame is answered the same way, `answer_now` with
    the upgrade request's headers, and no HTTP is parsed or written again."""

    # the operation, headers and query string of the request gathered for the fast path
    _fast: Optional[tuple[Any, dict, bytes]] = None
    _fast_body: bytearray
    # a step stream's operation and headers, once the connection is one; its unread bytes
    _stream: Optional[tuple[Any, dict]] = None
    _frames: bytearray

    awake: Optional[AwakeAfterAnswers] = None  # (made by the worker's first connection)

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        if CoalescingHttpTools.awake is None:
            CoalescingHttpTools.awake = AwakeAfterAnswers(default_spin())
        super().connection_made(_HeadWithBody(transport))

    def on_message_begin(self) -> None:
        self.awake.request_came(self)  # type: ignore[union-attr]
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._fast = self._fast_operation()
        if self._fast is None:
            super().on_headers_complete()
            return
        self._fast_body = bytearray()

    def _fast_operation(self) -> Optional[tuple[Any, dict, bytes]]:
        pipeline = self.app
        if (not hasattr(pipeline, "fast_operation") or self.root_path
                or self.expect_100_continue or self.parser.should_upgrade()
                or self.parser.get_http_version() != "1.1"
                or not self.parser.should_keep_alive()
                or not (self.cycle is None or self.cycle.response_complete)):
            return None
        url = httptools.parse_url(self.url)
        if b"%" in url.path:  # (uvicorn's way unquotes it)
            return None
        headers = dict(self.headers)
        op = pipeline.fast_operation(self.parser.get_method().decode("ascii"),
                                     url.path.decode("ascii"), headers.get(b"content-length"))
        return None if op is None else (op, headers, url.query or b"")

    def on_body(self, body: bytes) -> None:
        if self._fast is None:
            super().on_body(body)
            return
        self._fast_body += body

    def on_message_complete(self) -> None:
        if self._fast is None:
            super().on_message_complete()
            return
        (op, headers, query), self._fast = self._fast, None
        answer = self.app.answer_now(op, headers, query, bytes(self._fast_body))
        self.transport.write(self._http_answer(answer))
        self.transport.flush()
        self.app.settle()  # the handler's deferred work, while the caller reads the answer
        self.on_response_complete()  # (uvicorn's keep-alive bookkeeping; awake from now)

    def on_response_complete(self) -> None:
        self.transport.flush()
        super().on_response_complete()
        self.awake.answered(self.loop, self)  # type: ignore[union-attr]

    # -- the step stream (`mistk_rl.wire.frames`) --
    def data_received(self, data: bytes) -> None:
        if self._stream is None:
            super().data_received(data)
        else:
            self._frames += data
            self._answer_frames()

    def _should_upgrade(self) -> bool:
        return self._get_upgrade() == frames.PROTOCOL.encode() or super()._should_upgrade()

    def handle_websocket_upgrade(self) -> None:
        """uvicorn's one way out of HTTP: the step stream's upgrade, else a websocket's."""
        if self._get_upgrade() != frames.PROTOCOL.encode():
            super().handle_websocket_upgrade()
            return
        path = httptools.parse_url(self.url).path.decode("ascii", "replace")
        headers = dict(self.headers)
        op, answer = self.app.open_stream(self.scope["method"], path, headers)
        if op is None:  # refused: a problem, and the connection ends (its parser stopped)
            self.transport.write(self._http_answer(answer, (b"connection", b"close")))
            self.transport.close()
            return
        self._unset_keepalive_if_required()
        self._stream, self._frames = (op, headers), bytearray()
        log.info("%s: a step stream opened (%s)", op.id,
                 headers.get(b"content-type", b"").decode("latin-1"))
        self.transport.write(self._http_answer(answer))
        self.transport.flush()

    def _answer_frames(self) -> None:
        """Answer every whole frame received, in order (two may come before one is answered:
        a caller that pipelines)."""
        op, headers = self._stream  # type: ignore[misc]
        buffer, limit = self._frames, self.app.limits.max_body_bytes
        while len(buffer) >= frames.REQUEST_HEAD.size:
            (length,) = frames.REQUEST_HEAD.unpack_from(buffer)
            if length > limit:  # a 413, and the stream ends (the frame is not read)
                self._write_frame(self.app.frame_too_large(op))
                self.transport.close()
                return
            end = frames.REQUEST_HEAD.size + length
            if len(buffer) < end:
                return
            body = bytes(buffer[frames.REQUEST_HEAD.size:end])
            del buffer[:end]
            self.awake.request_came(self)  # type: ignore[union-attr]
            self._write_frame(self.app.answer_now(op, headers, b"", body))
            self.app.settle()  # (as after an HTTP answer: deferred work, the caller reads)
            self.awake.answered(self.loop, self)  # type: ignore[union-attr]

    def _http_answer(self, answer: Any, *more: tuple[bytes, bytes]) -> bytes:
        """An answer as HTTP/1.1 bytes: the status line, the headers (a 101 has no body, so
        neither type nor length) and the body."""
        body = () if answer.status == 101 else (
            (b"content-type", answer.content_type),
            (b"content-length", str(len(answer.payload)).encode()))
        head = [STATUS_LINE[answer.status]]
        for name, value in (*self.server_state.default_headers, *body, *answer.headers, *more):
            head += [name, b": ", value, b"\r\n"]
        head += [b"\r\n", answer.payload]
        return b"".join(head)

    def _write_frame(self, answer: Any) -> None:
        self.transport.write(frames.ANSWER_HEAD.pack(
            answer.status, frames.CONTENT_CODES[answer.content_type], len(answer.payload))
            + answer.payload)

    def shutdown(self) -> None:
        if self._stream is None:
            super().shutdown()
        else:  # (between frames: nothing is half answered, the loop answers them whole)
            self.transport.close()


class ServiceWorker(UvicornWorker):
    """uvicorn as these services need it: one answer is one send (`_HeadWithBody`), no
    Date or Server header (bytes on every answer that nobody reads), no access log and no
    proxy headers (loopback or a private network: nothing rewrites the client), uvloop
    where it is installed."""

    CONFIG_KWARGS = {"http": CoalescingHttpTools, "server_header": False,
                     "date_header": False, "access_log": False, "proxy_headers": False,
                     "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"}


class _Gunicorn(BaseApplication):
    def __init__(self, options: ServeOptions, cls: type) -> None:
        self.options, self.cls = options, cls
        super().__init__()

    def load_config(self) -> None:
        opts = self.options
        bind = f"fd://{opts.fd}" if opts.fd is not None else f"{opts.host}:{opts.port}"
        settings = {"bind": [bind], "workers": 1, "worker_class": opts.worker_class,
                    "graceful_timeout": 3, "timeout": 60, "keepalive": 75,
                    "loglevel": opts.log_level, "proc_name": f"mistk-rl-{opts.role}",
                    # gunicorn's control socket is one path per user: every service on the
                    # machine would take it over from the last (and remove it on exit)
                    "control_socket_disable": True}
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        return build_app(self.options, self.cls)


def serve(options: ServeOptions) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    logging.basicConfig(level=options.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("transitions").setLevel(logging.WARNING)  # one line per callback
    cls = import_implementation(options.role, options.target)
    for module in options.env_modules:  # importing registers their envs; a typo fails here
        importlib.import_module(module)
    options.data_dir = Path(options.data_dir).resolve()
    options.data_dir.mkdir(parents=True, exist_ok=True)
    for name, directory in options.shares.items():
        options.shares[name] = Path(directory).resolve()
        options.shares[name].mkdir(parents=True, exist_ok=True)
    _Gunicorn(options, cls).run()
