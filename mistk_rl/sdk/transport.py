"""A lean HTTP/1.1 client for the SDK: kept-alive socket connections in a small pool.

Every env step is one request, so the client's own cost is on the step path. `requests`
cost about 0.4 ms a call on loopback and `http.client` 0.2 ms against a server that answers
at once; this client costs 0.08 ms (measured against the same bare uvicorn app). The savings
come from writing a request in one `sendall` (http.client writes the head and the body
separately: two syscalls, and two reads for the server) and from parsing the answer's head
with `bytes` methods instead of the `email` package.

What it implements of HTTP/1.1 is what a client of these services needs: bodies delimited by
Content-Length, chunked encoding or the end of the connection; 1xx answers skipped;
keep-alive unless the server says ``Connection: close``; TLS for https URLs; pipelining
(`PipelinedConnection`: requests written before earlier answers are read, on one connection); the
upgrade of a connection of its own to the services' step stream (`Stream`,
`mistk_rl.wire.frames`). Keep-alive
brings one hazard, handled here: an idle connection the server closed is noticed *before* a
request is written (the socket reads as at EOF), so a request is never sent twice. A server
may still close a kept-alive connection just as a request goes out; then only an idempotent
GET is sent again (once, on a fresh connection, RFC 9112 9.3.1), and any other method
reports the error.

Waiting awake (`spin`): a caller that blocks on a socket lets its CPU idle, and on a
virtual machine an idle vCPU halts; the answer then waits for the hypervisor to wake it (tens
of microseconds, docs/serving.md "Idle CPUs"). So a connection first polls its socket without
sleeping, for up to `DEFAULT_SPIN` (1 ms) where this process may use two CPUs or more
(``MISTK_RL_SPIN_US`` sets another bound for every client and service of a process, 0 turns
it off), as OpenMP's ``OMP_WAIT_POLICY=active`` and most runtimes' spin-then-block locks do.
The bound is long enough for what a step loop waits for: a small network's answer (a DQN
step, 300-500 us) and an orchestrator stepping 64 CartPole copies between requests; 200
us, the earlier default, covered neither (docs/serving.md "Waiting awake").
It polls only while its answers come within that bound: after one that took longer (a
request that trains, a long poll, a machine with more work than CPUs) it blocks at once,
until an answer comes within the bound again. The caller's CPU is busy at most the time it
would have waited for a fast answer. A service waits so for the next request after each
answer, by the same rule: only while requests come within the bound of the answer before
them on its connection, as they do in a step loop with one caller
(`mistk_rl.service.uvicorn_protocol.AwakeAfterAnswers`).
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.client import RemoteDisconnected
from typing import Callable, Iterator, Mapping, Optional, TypeVar
from urllib.parse import urlencode, urlsplit

from mistk_rl.wire import frames
from mistk_rl.wire.spin import MAX_SPIN, default_spin
from mistk_rl.wire.tracing import outgoing_line

T = TypeVar("T")
# The server closed a kept-alive connection as the request went out: nothing was answered.
_CLOSED_BEFORE_ANSWER = (RemoteDisconnected, ConnectionResetError, BrokenPipeError)
MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers
_RECV_BYTES = 256 * 1024


class TransportError(ConnectionError):
    """The request could not be sent or its answer not read (`timed_out` says which)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ProtocolError(ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Headers(Mapping[str, str]):
    """An answer's headers; names compare without case, as HTTP says."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items  # lowercase name -> value (repeated headers joined by ", ")

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def get(self, name: str, default=None):
        return self._items.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


@dataclass
class Response:
    status: int
    reason: str
    headers: Headers
    body: bytes


class _Connection:
    """One socket to the service, with what was read past the last answer."""

    def __init__(
        self, host: str, port: int, timeout: float, tls: Optional[ssl.SSLContext], spin: float = 0.0
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.buffer = bytearray()
        self.received = 0  # bytes read from the socket (heads and bodies)
        self.spin = spin
        # seconds the last answer's head took to come, from when it was awaited: the next
        # answer is polled for only if it came within the spin (module doc)
        self.last_wait = 0.0
        self._poll_until = 0.0  # while awaiting an answer: when polling gives way to blocking
        self._poller: Optional[select.poll] = None
        if spin and hasattr(select, "poll"):  # (Linux and macOS; elsewhere it just blocks)
            self._poller = select.poll()
            self._poller.register(self.sock, select.POLLIN)

    def close(self) -> None:
        self.sock.close()

    def still_open(self) -> bool:
        """An idle connection is usable if the server has not closed it (nothing to read)."""
        if self.sock.fileno() < 0:
            return False
        try:
            if self._poller is not None:  # (registered already: no fd sets to build)
                return not self._poller.poll(0)
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def exchange(self, request: bytes, head_only: bool) -> tuple[Response, bool]:
        """Send one request, read its answer; returns it and whether to keep the socket."""
        self.sock.sendall(request)
        return self.read_answer(head_only)

    def read_answer(self, head_only: bool) -> tuple[Response, bool]:
        """The next answer on this connection, and whether to keep the socket."""
        started = time.perf_counter()
        # poll for it only if the last answer came within the spin (module doc)
        self._poll_until = (
            started + self.spin if self._poller is not None and self.last_wait <= self.spin else 0.0
        )
        while True:  # (1xx answers come before the answer; 101 ends HTTP on the connection)
            status, reason, version, headers = self._read_head()
            if not 100 <= status < 200 or status == 101:
                break
        self.last_wait = time.perf_counter() - started
        self._poll_until = 0.0  # (the body follows its head: read it blocking)
        connection = _tokens(headers, "connection") if "connection" in headers else ()
        closes = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if head_only or status in (101, 204, 304):
            body = b""
        elif "transfer-encoding" in headers and "chunked" in _tokens(headers, "transfer-encoding"):
            body = self._read_chunked()
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise ProtocolError(f"bad Content-Length {headers['content-length']!r}") from None
            body = self._read_exactly(length)
        else:  # delimited by the end of the connection
            body, closes = self._read_to_end(), True
        return Response(status, reason, Headers(headers), body), not closes

    def read_frame(self) -> tuple[int, int, bytes]:
        """The next answer frame of a step stream (`mistk_rl.wire.frames`): its status, content
        type (an index into `frames.CONTENT_TYPES`) and payload; awaited as an answer is."""
        started = time.perf_counter()
        self._poll_until = (
            started + self.spin if self._poller is not None and self.last_wait <= self.spin else 0.0
        )
        buffer, size = self.buffer, frames.ANSWER_HEAD.size
        while len(buffer) < size:
            if not self._fill():
                raise ProtocolError("the step stream closed before an answer frame")
        self.last_wait = time.perf_counter() - started
        self._poll_until = 0.0
        status, kind, length = frames.ANSWER_HEAD.unpack_from(buffer)
        if kind >= len(frames.CONTENT_TYPES) or not 100 <= status < 600:
            raise ProtocolError(
                f"not a step stream's answer frame: status {status}, content type {kind}"
            )
        while len(buffer) < size + length:
            if not self._fill():
                raise ProtocolError("the step stream closed in the middle of an answer frame")
        payload = bytes(buffer[size : size + length])
        del buffer[: size + length]
        return status, kind, payload

    # -- reading --
    def _fill(self) -> bool:
        """Read more from the socket into the buffer; False at the end of the stream."""
        if self._poll_until:
            self._await_awake()
        chunk = self.sock.recv(_RECV_BYTES)
        if not chunk:
            return False
        self.received += len(chunk)
        self.buffer += chunk
        return True

    def _await_awake(self) -> None:
        """Poll the socket without sleeping until it has something to read or the answer's
        spin has passed; the blocking read that follows then finds it at once (module doc)."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return  # (decrypted bytes wait in the TLS layer: the socket may read as empty)
        poll = self._poller.poll  # type: ignore[union-attr]
        deadline = self._poll_until
        while not poll(0) and time.perf_counter() < deadline:
            pass

    def _read_head(self) -> tuple[int, str, str, dict[str, str]]:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError(f"an answer's head is over {MAX_HEAD_BYTES} bytes")
            if not self._fill():
                if self.buffer:
                    raise ProtocolError("the connection closed in the middle of an answer")
                raise RemoteDisconnected("the server closed the connection without answering")
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ProtocolError(f"not a header line: {line[:80]!r}")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return int(code), reason, version, headers

    def _read_exactly(self, length: int) -> bytes:
        while len(self.buffer) < length:
            if not self._fill():
                raise ProtocolError(
                    f"the connection closed {length - len(self.buffer)} "
                    "bytes short of the answer's body"
                )
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return body

    def _read_line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > MAX_HEAD_BYTES or not self._fill():
                raise ProtocolError("bad chunked encoding")
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        return line

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_field = self._read_line().split(b";")[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_field[:20]!r}") from None
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._read_exactly(size))
            if self._read_exactly(2) != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")

    def _read_to_end(self) -> bytes:
        while self._fill():
            pass
        body = bytes(self.buffer)
        self.buffer.clear()
        return body


def _tokens(headers: dict[str, str], name: str) -> list[str]:
    return [token.strip().lower() for token in headers.get(name, "").split(",")]


def _safe(text: str, what: str) -> str:
    """Refuse a header or URL that would split the request (CR, LF)."""
    if "\r" in text or "\n" in text:
        raise ValueError(f"{what} holds a line break: {text!r}")
    return text


class Transport:
    """Requests to one service; thread-safe (each request takes its own connection)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        max_idle: int = 4,
        spin: Optional[float] = None,
    ) -> None:
        """`spin`: seconds each answer is waited for awake before the connection blocks
        (module doc); None: `default_spin()`."""
        spin = default_spin() if spin is None else spin
        if not 0 <= spin <= MAX_SPIN:
            raise ValueError(f"spin {spin!r}: 0 to {MAX_SPIN} seconds")
        self.spin = spin
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.host = parts.hostname
        self.port = parts.port or (443 if self._tls else 80)
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = self.port == (443 if self._tls else 80)
        fixed = {
            "Host": host if default_port else f"{host}:{self.port}",
            "Accept-Encoding": "identity",
            **(headers or {}),
        }
        # the header lines every request carries, encoded once
        self._fixed_head = "".join(
            f"{_safe(k, 'a header name')}: {_safe(v, 'a header')}\r\n" for k, v in fixed.items()
        ).encode("latin-1")
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        # bytes on the wire, requests and answers with their heads (for `bench transport`;
        # counted without a lock: exact for one caller at a time, close for several)
        self.bytes_sent = 0
        self.bytes_received = 0

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        params: Optional[Mapping[str, object]] = None,
        timeout: float = 30.0,
        accept: str = "application/json",
    ) -> Response:
        request = self.encode(method, path, body, content_type, params, accept)
        head_only = method == "HEAD"
        conn, reused = self._take(timeout)
        try:
            return self._exchange(conn, request, head_only, timeout)
        except TransportError as exc:
            if not (
                reused and method == "GET" and isinstance(exc.__cause__, _CLOSED_BEFORE_ANSWER)
            ):
                raise
        return self._exchange(self._connect(timeout), request, head_only, timeout)

    def encode(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        params: Optional[Mapping[str, object]] = None,
        accept: str = "application/json",
        extra: str = "",
    ) -> bytes:
        """One request as the bytes that go on the wire (head and body); `extra`: header
        lines of its own (an upgrade's)."""
        url = _safe(self.prefix + path + (f"?{urlencode(params)}" if params else ""), "the URL")
        # (the span it is sent in, `mistk_rl.wire.tracing`: a served request's, a run's)
        head = f"{method} {url} HTTP/1.1\r\nAccept: {accept}\r\n{extra}{outgoing_line()}"
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        elif method not in ("GET", "HEAD"):
            head += "Content-Length: 0\r\n"
        return head.encode("latin-1") + self._fixed_head + b"\r\n" + (body or b"")

    def pipeline(self) -> "PipelinedConnection":
        """A connection of its own on which requests go out before earlier answers are read."""
        return PipelinedConnection(self)

    def open_stream(
        self, path: str, *, content_type: str, accept: str, timeout: float = 30.0
    ) -> tuple[Optional["Stream"], Response]:
        """A connection of its own upgraded to a step stream by GET `path` (`Stream`): the
        stream and the ``101`` answer, or None and the answer that refused it."""
        request = self.encode(
            "GET",
            path,
            accept=_safe(accept, "a header"),
            extra=(
                f"Content-Type: {_safe(content_type, 'a header')}\r\n"
                f"Connection: Upgrade\r\nUpgrade: {frames.PROTOCOL}\r\n"
            ),
        )
        conn = self._connect(timeout)
        response, _ = self._exchange_on(conn, request, False, timeout)
        if response.status != 101:
            conn.close()
            return None, response
        return Stream(self, conn), response

    def _exchange(
        self, conn: _Connection, request: bytes, head_only: bool, timeout: float
    ) -> Response:
        response, keep = self._exchange_on(conn, request, head_only, timeout)
        if keep:
            self._give_back(conn)
        else:
            conn.close()
        return response

    def _exchange_on(
        self, conn: _Connection, request: bytes, head_only: bool, timeout: float
    ) -> tuple[Response, bool]:
        """One request on `conn` (closed on an error): the answer, and whether to keep it."""
        received = conn.received
        self.bytes_sent += len(request)
        try:
            response, keep = conn.exchange(request, head_only)
        except (socket.timeout, TimeoutError) as exc:
            conn.close()
            raise TransportError(f"no answer within {timeout} s", timed_out=True) from exc
        except (OSError, ProtocolError) as exc:
            conn.close()
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        self.bytes_received += conn.received - received
        return response, keep

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, timeout: float) -> tuple[_Connection, bool]:
        """A connection for one request, and whether it was kept alive from an earlier one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(timeout), False
            if conn.still_open():
                if conn.sock.gettimeout() != timeout:  # (setting it costs two fcntl calls)
                    conn.sock.settimeout(timeout)
                return conn, True
            conn.close()

    def _connect(self, timeout: float) -> _Connection:
        try:
            return _Connection(self.host, self.port, timeout, self._tls, self.spin)
        except (socket.timeout, TimeoutError) as exc:
            raise TransportError(f"no connection within {timeout} s", timed_out=True) from exc
        except OSError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()


class _InFlight:
    """What `PipelinedConnection` and `Stream` share: a connection of their own on which writes
    go out before earlier answers are read, in order. No write is ever sent again: after an error
    the connection is closed and what is still unanswered is lost (the error says how
    many). Not thread-safe: it belongs to one caller's loop."""

    ITEM, LOST = "request", "request"  # what a write is; what an error counts

    def __init__(self, transport: Transport, conn: Optional[_Connection] = None) -> None:
        self.transport = transport
        self._conn = conn
        self._waiting: deque[tuple[bool, float]] = deque()  # (head only, timeout) per write

    @property
    def pending(self) -> int:
        """Writes sent whose answers are not read yet."""
        return len(self._waiting)

    def _write(self, conn: _Connection, data: bytes, timeout: float, head_only: bool) -> None:
        try:
            if conn.sock.gettimeout() != timeout:  # (setting it costs two fcntl calls)
                conn.sock.settimeout(timeout)
            conn.sock.sendall(data)
        except (socket.timeout, TimeoutError) as exc:
            raise self._fail(f"could not send within {timeout} s", True) from exc
        except OSError as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc
        self.transport.bytes_sent += len(data)
        self._waiting.append((head_only, timeout))

    def _read(self, read: Callable[[_Connection, bool], T]) -> T:
        """`read(connection, head only)` for the oldest write, with its timeout."""
        if not self._waiting:
            raise RuntimeError(f"no {self.ITEM} is waiting for its answer")
        if self._conn is None:  # the server closed the connection after an earlier answer
            raise self._fail("the server closed the connection before answering")
        conn = self._conn
        head_only, timeout = self._waiting[0]
        received = conn.received
        try:
            if conn.sock.gettimeout() != timeout:
                conn.sock.settimeout(timeout)
            answer = read(conn, head_only)
        except (socket.timeout, TimeoutError) as exc:
            raise self._fail(f"no answer within {timeout} s", True) from exc
        except (OSError, ProtocolError) as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc
        self._waiting.popleft()
        self.transport.bytes_received += conn.received - received
        return answer

    def _fail(self, message: str, timed_out: bool = False) -> TransportError:
        lost = len(self._waiting)
        self._waiting.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if lost:
            message += f" ({lost} {self.LOST}{'s' if lost > 1 else ''} unanswered)"
        return TransportError(message, timed_out)


class PipelinedConnection(_InFlight):
    """HTTP/1.1 pipelining (RFC 9112 9.3.2) on one connection: `send` writes a request
    without waiting for the answers to earlier ones, `receive` reads the oldest answer.

    Why: a caller that has other work to do while the service computes (an orchestrator
    stepping half its env copies while the agent answers for the other half) keeps a
    request in flight instead of waiting a round trip. The answers come back in the order
    the requests went, and uvicorn (these services' server) also runs one connection's
    requests one at a time in that order, so a seeded agent sees the same sequence of
    requests as without pipelining (`_InFlight`: errors).
    """

    ITEM, LOST = "request", "pipelined request"

    def send(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        params: Optional[Mapping[str, object]] = None,
        timeout: float = 30.0,
        accept: str = "application/json",
    ) -> None:
        request = self.transport.encode(method, path, body, content_type, params, accept)
        if self._conn is None:
            self._conn = self.transport._take(timeout)[0]
        self._write(self._conn, request, timeout, method == "HEAD")

    def receive(self) -> Response:
        """The answer to the oldest request not answered yet."""
        response, keep = self._read(_Connection.read_answer)
        if not keep:  # (the requests after this one, if any, fail at their receive)
            conn, self._conn = self._conn, None
            conn.close()  # type: ignore[union-attr]
        return response

    def close(self) -> None:
        """Give the connection back when nothing is in flight, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._waiting:
            self._waiting.clear()
            conn.close()
        else:
            self.transport._give_back(conn)


class Stream(_InFlight):
    """A step stream (`mistk_rl.wire.frames`): bodies go out as frames on an upgraded connection
    of its own and their answers are read in the order sent, with no HTTP per step. `send`
    and `receive` are `PipelinedConnection`'s, so a caller may keep several frames in flight; the
    frames' Content-Type and Accept are the ones the stream was opened with
    (`Transport.open_stream`); errors as `_InFlight` says."""

    ITEM, LOST = "frame", "frame"

    @property
    def closed(self) -> bool:
        return self._conn is None

    def send(self, body: bytes, timeout: float = 30.0) -> None:
        if self._conn is None:
            raise TransportError("the step stream is closed")
        self._write(self._conn, frames.REQUEST_HEAD.pack(len(body)) + body, timeout, False)

    def receive(self) -> Response:
        """The answer to the oldest frame not answered yet, as a `Response`."""
        status, kind, payload = self._read(lambda conn, _: conn.read_frame())
        return Response(status, "", Headers({"content-type": frames.CONTENT_TYPES[kind]}), payload)

    def close(self) -> None:
        """End the stream (the service forgets it); frames in flight are not answered."""
        self._waiting.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
