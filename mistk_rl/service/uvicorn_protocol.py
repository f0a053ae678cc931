"""The one place that uses uvicorn's internals: `CoalescingHttpTools`, uvicorn's httptools
protocol with one send per answer, a fast path for the per-step requests and the step
stream, and what it needs (`_HeadWithBody`, `AwakeAfterAnswers`).

It subclasses ``HttpToolsProtocol`` and relies on parts of it that uvicorn does not publish:
the names in `UVICORN_PRIVATE` and the per-connection attributes in `UVICORN_ATTRIBUTES`.
setup.cfg pins uvicorn to the versions this was tested with; `check_uvicorn` (run by
`mistk-rl serve` before gunicorn starts, and by the tests) fails loudly, naming what is
missing, on a uvicorn that lacks any of them, rather than letting a service misbehave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional

import httptools

try:
    import uvicorn
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    from uvicorn.server import ServerState
except ImportError as exc:  # (a uvicorn that moved its modules)
    raise ImportError(
        f"mistk_rl.service.uvicorn_protocol: this uvicorn lacks {exc.name}: "
        "install the versions setup.cfg names"
    ) from exc

from mistk_rl.wire import frames
from mistk_rl.wire.spin import default_spin

log = logging.getLogger("mistk_rl.service.server")  # (the log lines' name before the move)
# frames of one step stream answered in a row before the event loop gets a turn: ~1-3 ms of
# small steps, so a status or another connection waits no longer than that
FRAMES_PER_TURN = 32
# bytes of HTTP fed to the parser in a row before the event loop gets a turn: after a slice
# that held whole requests, a small one (~30 tiny pipelined requests: a millisecond or two,
# as `FRAMES_PER_TURN`); while a large body comes in, a large one (few turns per MB)
HTTP_BYTES_PER_TURN = 4 * 1024
HTTP_BODY_BYTES_PER_TURN = 64 * 1024
WATCH_EVERY_S = 1.0  # how often an open stream is checked for idleness and half-sent frames
TESTED_UVICORN = "0.54"  # setup.cfg: uvicorn>=0.54,<0.55
# HttpToolsProtocol's methods this module calls or overrides, its private ones among them
UVICORN_PRIVATE = (
    "_get_upgrade",
    "_should_upgrade",
    "_unset_keepalive_if_required",
    "handle_websocket_upgrade",
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "data_received",
    "resume_writing",
    "connection_made",
    "connection_lost",
    "shutdown",
)
# what a connection has once a request's head is parsed
UVICORN_ATTRIBUTES = (
    "app",
    "loop",
    "parser",
    "root_path",
    "expect_100_continue",
    "cycle",
    "transport",
    "server_state",
    "url",
    "headers",
    "scope",
    "flow",
    "pipeline",
)


class IncompatibleUvicorn(RuntimeError):
    """The installed uvicorn lacks what `CoalescingHttpTools` uses of it."""


def check_uvicorn(protocol: type = HttpToolsProtocol) -> None:
    """Raise `IncompatibleUvicorn` naming each part of `protocol` (uvicorn's by default)
    that `CoalescingHttpTools` needs and does not find: a method, a connection attribute
    (looked for on a connection made on a loop of its own, whose head was begun), or a
    status line."""
    missing = [name for name in UVICORN_PRIVATE if not callable(getattr(protocol, name, None))]
    loop = asyncio.new_event_loop()
    try:
        connection = protocol(Config(app=_no_app), ServerState(), {}, _loop=loop)
        if "on_message_begin" not in missing:
            connection.on_message_begin()
        missing += [name for name in UVICORN_ATTRIBUTES if not hasattr(connection, name)]
    except Exception as exc:  # noqa: BLE001 - any way it fails to build is the finding
        missing.append(f"a connection ({type(exc).__name__}: {exc})")
    finally:
        loop.close()
    if not all(status in STATUS_LINE for status in (101, 200, 400, 413)):
        missing.append("STATUS_LINE")
    if missing:
        raise IncompatibleUvicorn(
            f"uvicorn {uvicorn.__version__} lacks what mistk-rl's HTTP protocol uses: "
            f"{', '.join(missing)} (tested with uvicorn {TESTED_UVICORN}; install "
            "the versions setup.cfg names)"
        )


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    """(an app for the check's connection, never called)"""


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
            self.prompt = (
                connection is self._answered_to and self._clock() - self._answered_at <= self.spin
            )
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
    (`ServicePipeline.fast_operation`), on a kept-alive HTTP/1.1 connection with nothing else of
    its own in progress, skips all that: its body is gathered as it is parsed and
    `ServicePipeline.answer_now` answers it the moment the request is complete, through the same
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
    _turn_scheduled = False  # the stream's next frames are answered at the loop's next turn
    _last_data = 0.0  # (loop time) the stream's last bytes came then
    _partial_since: Optional[float] = None  # a frame begun and not finished since then
    _watchdog: Optional[asyncio.TimerHandle] = None
    _drain_left = 0  # bytes of an over-limit frame still to come, dropped (its 413 written)
    # HTTP bytes received and not yet parsed (pipelined requests beyond one turn's, or sent
    # while answers are unread), and whether their next slice is scheduled
    _http_pending: Optional[bytearray] = None
    _http_turn = False
    _completed = 1  # requests the last slice completed (none: a body is coming in)
    # bytes this connection holds of a frame or a fast-path body not yet whole (the worker's
    # connections' together: the pipeline's `held_bytes`, bounded by `max_buffered_bytes`)
    _held = 0
    _max_held = 0  # (the limit, read once per connection)
    _refused = False  # closed by `_refuse`: what is still parsed is dropped

    awake: Optional[AwakeAfterAnswers] = None  # (made by the worker's first connection)
    # uvicorn types its transport asyncio.Transport; ours is one by delegation
    transport: _HeadWithBody  # type: ignore[assignment]

    def connection_made(self, transport: Any) -> None:
        if CoalescingHttpTools.awake is None:
            CoalescingHttpTools.awake = AwakeAfterAnswers(default_spin())
        limits = getattr(self.app, "limits", None)
        self._max_held = limits.max_buffered_bytes if limits is not None else 1 << 62
        super().connection_made(_HeadWithBody(transport))  # type: ignore[arg-type]

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
        if (
            not hasattr(pipeline, "fast_operation")
            or self.root_path
            or self.expect_100_continue
            or self.parser.should_upgrade()
            or self.parser.get_http_version() != "1.1"
            or not self.parser.should_keep_alive()
            or not (self.cycle is None or self.cycle.response_complete)
        ):
            return None
        url = httptools.parse_url(self.url)
        if b"%" in url.path:  # (uvicorn's way unquotes it)
            return None
        headers = dict(self.headers)
        op = pipeline.fast_operation(
            self.parser.get_method().decode("ascii"),
            url.path.decode("ascii"),
            headers.get(b"content-length"),
        )
        return None if op is None else (op, headers, url.query or b"")

    def on_body(self, body: bytes) -> None:
        if self._fast is None:
            super().on_body(body)
            return
        if self._refused:
            return
        if self.app.held_bytes + len(body) > self._max_held:
            self._refuse(len(body))
            return
        self._fast_body += body
        held = len(self._fast_body)  # (`_hold`, inline: every step request comes here)
        self.app.held_bytes += held - self._held
        self._held = held

    def on_message_complete(self) -> None:
        self._completed += 1
        if self._fast is None:
            super().on_message_complete()
            return
        if self._refused:  # (by `_refuse`: nothing to answer)
            self._fast = None
            return
        (op, headers, query), self._fast = self._fast, None
        if self._held:
            self.app.held_bytes -= self._held
            self._held = 0
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
        if (
            self._stream is None
            and not self._http_pending
            and len(data) <= HTTP_BODY_BYTES_PER_TURN
            and not self.flow.write_paused
        ):
            super().data_received(data)  # (one request, or a few: the usual case)
        elif self._stream is not None:
            self._last_data = self.loop.time()
            if self._drain_left:
                self._drain(len(data))
                return
            if self.app.held_bytes + len(data) > self._max_held:
                self._refuse(len(data))
                return
            self._frames += data
            self._hold(len(self._frames))
            if not self._turn_scheduled:
                self._answer_frames()
        elif self._http_pending:  # (a slice is scheduled or waits for writes: in order)
            self._http_pending += data
        else:
            self._http_pending = bytearray(data)
            self._feed_http()

    def _refuse(self, more: int) -> None:
        """Close the connection, saying why: holding `more` bytes would take the worker past
        `Limits.max_buffered_bytes` (its callers check, inline: the step path comes there)."""
        log.warning(
            "a connection closed: the worker holds %d bytes of unfinished frames and bodies "
            "and %d more would pass max_buffered_bytes=%d",
            self.app.held_bytes,
            more,
            self._max_held,
        )
        self._hold(0)
        self._refused = True
        if self._stream is not None:
            self._frames.clear()
        self.transport.close()

    def _hold(self, held: int) -> None:
        if held != self._held:
            self.app.held_bytes += held - self._held
            self._held = held

    def _feed_http(self) -> None:
        """Parse (and so answer) pipelined HTTP `HTTP_BYTES_PER_TURN` bytes at a time with a
        turn of the event loop between, and none while the answers already written are
        unread (`resume_writing` goes on): as `_answer_frames` does for a stream, reading
        stops meanwhile, so a caller that pipelines faster than it reads is held back by
        its own socket."""
        self._http_turn = False
        pending = self._http_pending
        while pending:
            if self.transport.is_closing():
                pending.clear()
                return
            if self.flow.write_paused:
                self.flow.pause_reading()
                return
            size = HTTP_BYTES_PER_TURN if self._completed else HTTP_BODY_BYTES_PER_TURN
            chunk = bytes(pending[:size])
            del pending[:size]
            self._completed = 0
            super().data_received(chunk)
            if self._stream is not None:  # (upgraded: what follows is the stream's)
                self._frames += pending
                pending.clear()
                self._answer_frames()
                return
            if pending:
                self.flow.pause_reading()
                self._http_turn = True
                self.loop.call_soon(self._feed_http)
                return
        if not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            self.flow.resume_reading()  # (uvicorn's own pause, for a pipelined cycle, stays)

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
        self.app.streams_open += 1
        self.app.streams_opened += 1
        self._last_data = self.loop.time()
        self._watchdog = self.loop.call_later(WATCH_EVERY_S, self._watch)
        log.info(
            "%s: a step stream opened (%s)",
            op.id,
            headers.get(b"content-type", b"").decode("latin-1"),
        )
        self.transport.write(self._http_answer(answer))
        self.transport.flush()

    def _answer_frames(self) -> None:
        self._answer_whole_frames()
        self._hold(len(self._frames))

    def _answer_whole_frames(self) -> None:
        """Answer the whole frames received, in order (two may come before one is answered:
        a caller that pipelines), at most `FRAMES_PER_TURN` before the event loop gets a
        turn (status, other connections), and none while the answers already written are
        unread (the transport's buffer over its high-water mark: `pause_writing`). Reading
        stops while frames wait, so a caller that writes faster than it reads is held back
        by its own socket, not buffered here."""
        self._turn_scheduled = False
        if self._stream is None:  # (closed meanwhile)
            return
        op, headers = self._stream
        buffer, limit = self._frames, self.app.limits.max_body_bytes
        answered = 0
        while len(buffer) >= frames.REQUEST_HEAD.size:
            (length,) = frames.REQUEST_HEAD.unpack_from(buffer)
            if length > limit:  # a 413, the frame read and dropped, and the stream ends
                self._write_frame(self.app.frame_too_large(op))
                self._drain_left = frames.REQUEST_HEAD.size + length - len(buffer)
                buffer.clear()
                self._partial_since = self.loop.time()  # (the watchdog bounds the drain)
                if self._drain_left <= 0:
                    self.transport.close()
                return
            end = frames.REQUEST_HEAD.size + length
            if len(buffer) < end:
                break
            if self.flow.write_paused:  # (its answers unread: `resume_writing` goes on)
                self.flow.pause_reading()
                return
            if answered == FRAMES_PER_TURN:
                self.flow.pause_reading()
                self._turn_scheduled = True
                self.loop.call_soon(self._answer_frames)
                return
            body = bytes(buffer[frames.REQUEST_HEAD.size : end])
            del buffer[:end]
            self.awake.request_came(self)  # type: ignore[union-attr]
            self.app.stream_frames += 1
            self._write_frame(self.app.answer_now(op, headers, b"", body))
            self.app.settle()  # (as after an HTTP answer: deferred work, the caller reads)
            self.awake.answered(self.loop, self)  # type: ignore[union-attr]
            answered += 1
        self.flow.resume_reading()  # (every whole frame answered: read on)
        if not buffer:
            self._partial_since = None
        elif answered or self._partial_since is None:  # (the frame left begun just now)
            self._partial_since = self.loop.time()

    def _drain(self, received: int) -> None:
        """Drop the bytes of an over-limit frame, whose 413 is written, and close once it is
        all in: closing with its bytes unread would reset the connection, and a caller
        still sending would see the reset, not the 413."""
        self._drain_left = max(0, self._drain_left - received)
        if not self._drain_left:
            self.transport.close()

    def _watch(self) -> None:
        """Close a stream that sent nothing for `Limits.stream_idle_s`, or left a frame
        unfinished for `Limits.frame_timeout_s` (its bytes are dropped), saying so."""
        if self._stream is None:
            return
        limits, now = self.app.limits, self.loop.time()
        op = self._stream[0]
        why = None
        begun = self._partial_since
        late = begun is not None and now - begun > limits.frame_timeout_s
        if late and self._drain_left:
            why = (
                f"an over-limit frame's last {self._drain_left} bytes did not come in "
                f"{limits.frame_timeout_s} s (frame_timeout_s)"
            )
        elif late and begun is not None:
            why = (
                f"a frame begun {now - begun:.0f} s ago is unfinished "
                f"(frame_timeout_s={limits.frame_timeout_s}); {len(self._frames)} bytes dropped"
            )
        # (a frame begun is governed by frame_timeout_s alone: its bytes can come in before
        # the turn that marks it begun, and an idle check in between took it for an idle
        # stream, on a loaded machine)
        elif begun is None and (idle := now - self._last_data) > limits.stream_idle_s:
            why = f"nothing came for {idle:.0f} s (stream_idle_s={limits.stream_idle_s})"
        if why is None:
            self._watchdog = self.loop.call_later(WATCH_EVERY_S, self._watch)
            return
        log.warning("%s: a step stream closed: %s", op.id, why)
        self._frames.clear()
        self._hold(0)
        self.transport.close()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stream is not None and not self._turn_scheduled:
            self._answer_frames()  # (the frames held back while answers were unread)
        elif self._http_pending and not self._http_turn:
            self._feed_http()  # (the requests held back so)

    def _http_answer(self, answer: Any, *more: tuple[bytes, bytes]) -> bytes:
        """An answer as HTTP/1.1 bytes: the status line, the headers (a 101 has no body, so
        neither type nor length) and the body."""
        body = (
            ()
            if answer.status == 101
            else (
                (b"content-type", answer.content_type),
                (b"content-length", str(len(answer.payload)).encode()),
            )
        )
        head = [STATUS_LINE[answer.status]]
        for name, value in (*self.server_state.default_headers, *body, *answer.headers, *more):
            head += [name, b": ", value, b"\r\n"]
        head += [b"\r\n", answer.payload]
        return b"".join(head)

    def _write_frame(self, answer: Any) -> None:
        self.transport.write(
            frames.ANSWER_HEAD.pack(
                answer.status, frames.CONTENT_CODES[answer.content_type], len(answer.payload)
            )
            + answer.payload
        )

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._hold(0)
        if self._stream is not None:
            self._stream = None
            self.app.streams_open -= 1
            if self._watchdog is not None:
                self._watchdog.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._stream is None:
            super().shutdown()
        else:  # (between frames: nothing is half answered, the loop answers them whole)
            self.transport.close()
