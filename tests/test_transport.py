"""The SDK's keep-alive transport: reuse, reconnect after the server closed, no double POST."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import mistk_rl.sdk.transport as transport_module
from mistk_rl.sdk.transport import Transport, TransportError
from mistk_rl.wire.spin import DEFAULT_SPIN, SPIN_ENV, default_spin, spin_from_env


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts: list[bytes] = []
    gets: list[str] = []
    connections: set[tuple] = set()

    def do_GET(self):
        """The first GET on a connection is answered; a later one finds it dropped unanswered."""
        type(self).gets.append(self.path)
        if self.path == "/dropped" and self.connection_requests > 1:
            self.close_connection = True
            return
        if self.path in _FRAMINGS:
            return _FRAMINGS[self.path](self)
        self._reply(b"")

    def _chunked(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Mixed-Case", "yes")
        self.end_headers()
        for piece in (b'{"a": ', b"[1, 2, 3]", b"}"):
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\nTrailer: t\r\n\r\n")

    def _until_close(self):
        """HTTP/1.0 style: no length, the body ends with the connection."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"to the end")
        self.close_connection = True

    def _continue_then_answer(self):
        self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._reply(b"")

    def _no_content(self):
        self.send_response(204)
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append(body)
        if body == b"drop-unanswered":
            self.close_connection = True
            return
        if self.path == "/echo":
            return self._reply(body, echo=True)
        self._reply(body)

    def handle_one_request(self):
        self.connection_requests = getattr(self, "connection_requests", 0) + 1
        super().handle_one_request()

    def _reply(self, body: bytes, echo: bool = False) -> None:
        type(self).connections.add(self.client_address)  # one source port per connection
        reply = body if echo else b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        if body == b"close-after":
            self.close_connection = True  # the server drops the kept-alive connection

    def log_message(self, *args):
        pass


_FRAMINGS = {
    "/chunked": _Handler._chunked,
    "/until-close": _Handler._until_close,
    "/continue": _Handler._continue_then_answer,
    "/no-content": _Handler._no_content,
}


class _Server(ThreadingHTTPServer):
    """Counts the connections it has closed, so a test can wait for a close (no sleeps)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.closed = threading.Semaphore(0)

    def shutdown_request(self, request) -> None:
        super().shutdown_request(request)
        self.closed.release()


@pytest.fixture
def httpd():
    _Handler.posts, _Handler.gets, _Handler.connections = [], [], set()
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def server(httpd):
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def test_connection_is_reused(server):
    transport = Transport(server)
    for i in range(5):
        assert transport.request("POST", "/x", body=str(i).encode()).status == 200
    assert len(_Handler.connections) == 1
    transport.close()


def test_reconnects_after_the_server_closed_and_never_sends_twice(httpd, server):
    transport = Transport(server)
    transport.request("POST", "/x", body=b"close-after")
    assert httpd.closed.acquire(timeout=10), "the server never closed the connection"
    # the idle connection is closed now; the next POST must go out exactly once
    assert transport.request("POST", "/x", body=b"second").status == 200
    assert _Handler.posts == [b"close-after", b"second"]
    assert len(_Handler.connections) == 2
    transport.close()


def test_a_post_the_server_dropped_unanswered_is_an_error_not_a_resend(server):
    transport = Transport(server)
    transport.request("POST", "/x", body=b"first")
    with pytest.raises(TransportError, match="RemoteDisconnected|ConnectionReset|BrokenPipe"):
        transport.request("POST", "/x", body=b"drop-unanswered")
    assert _Handler.posts == [b"first", b"drop-unanswered"]
    transport.close()


def test_a_get_the_server_dropped_on_a_kept_alive_connection_is_sent_again_once(server):
    transport = Transport(server)
    assert transport.request("GET", "/dropped").status == 200
    # the kept-alive connection is dropped unanswered; GET is idempotent: one fresh retry
    assert transport.request("GET", "/dropped").status == 200
    assert _Handler.gets == ["/dropped"] * 3
    transport.close()


@pytest.mark.parametrize("spin", [0.0, 0.002])
def test_bodies_in_every_framing_are_read_whole_and_the_connection_kept_when_it_can(server, spin):
    transport = Transport(server, spin=spin)  # (waiting awake reads the same bytes)
    chunked = transport.request("GET", "/chunked")
    assert (chunked.status, chunked.body) == (200, b'{"a": [1, 2, 3]}')
    assert chunked.headers["x-mixed-case"] == chunked.headers.get("X-MIXED-CASE") == "yes"
    assert transport.request("GET", "/continue").status == 200  # the 100 is skipped
    assert transport.request("GET", "/no-content").body == b""
    assert len(_Handler.connections) == 1  # one connection served all three
    to_end = transport.request("GET", "/until-close")
    assert (to_end.body, to_end.headers["Content-Type"]) == (b"to the end", "text/plain")
    assert transport.request("GET", "/x").status == 200  # a fresh connection after the close
    assert len(_Handler.connections) == 2
    transport.close()


def test_an_answer_that_is_not_http_is_a_transport_error():
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    transport = Transport(f"http://127.0.0.1:{listener.getsockname()[1]}")
    with pytest.raises(TransportError, match="not an HTTP/1.x status line"):
        transport.request("POST", "/x", body=b"{}", timeout=5)
    thread.join(timeout=5)
    listener.close()


def test_a_header_or_url_with_a_line_break_is_refused_before_anything_is_sent(server):
    with pytest.raises(ValueError, match="line break"):
        Transport(server, headers={"Authorization": "Bearer x\r\nX-Evil: 1"})
    transport = Transport(server)
    with pytest.raises(ValueError, match="line break"):
        transport.request("GET", "/x\r\nX-Evil: 1")
    assert _Handler.gets == []


def test_unreachable_service_is_a_transport_error():
    transport = Transport("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(TransportError):
        transport.request("GET", "/status", timeout=2)
    with pytest.raises(ValueError):
        Transport("ftp://example.org")


def test_pipelined_requests_are_answered_in_order_on_one_connection(server):
    transport = Transport(server)
    pipe = transport.pipeline()
    for i in range(3):
        pipe.send("POST", "/echo", body=f"request {i}".encode())
    assert pipe.pending == 3
    assert [pipe.receive().body for _ in range(3)] == [b"request 0", b"request 1", b"request 2"]
    pipe.close()  # nothing in flight: the connection goes back to the pool
    assert transport.request("POST", "/echo", body=b"after").body == b"after"
    assert len(_Handler.connections) == 1
    assert transport.bytes_sent > 0 and transport.bytes_received > 0
    transport.close()


def test_a_pipelined_request_the_server_left_unanswered_fails_and_is_not_sent_again(httpd, server):
    transport = Transport(server)
    pipe = transport.pipeline()
    pipe.send("POST", "/x", body=b"close-after")
    pipe.send("POST", "/echo", body=b"second")
    assert pipe.receive().status == 200
    with pytest.raises(TransportError, match="closed the connection"):
        pipe.receive()
    assert pipe.pending == 0
    with pytest.raises(RuntimeError, match="no request is waiting"):
        pipe.receive()
    assert _Handler.posts == [b"close-after"]  # the server read no further; nothing resent
    transport.close()


def _slow_server(*delays: float) -> tuple[socket.socket, threading.Thread]:
    """A server that answers its requests, one after another on one kept-alive connection,
    each `delays[i]` seconds after it came: a service that is sometimes slow."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for delay in delays:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                time.sleep(delay)  # (the service's work, not a wait for the client)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


class _CountingPoll:
    """`select.poll` that counts the polls its owner makes: polling awake for a spin takes
    many, a blocking read none. (Counted, not CPU time, which a busy machine moves.)"""

    polls = 0

    def __init__(self) -> None:
        self._poll = _REAL_POLL()

    def register(self, *args) -> None:
        self._poll.register(*args)

    def poll(self, timeout=None):
        type(self).polls += 1
        return self._poll.poll(timeout)


_REAL_POLL = select.poll


def _polls_per_answer(monkeypatch, spin: float, *delays: float) -> list[int]:
    """How many times the connection polled its socket awaiting each request's answer from
    `_slow_server(*delays)`."""
    monkeypatch.setattr(transport_module.select, "poll", _CountingPoll)
    listener, thread = _slow_server(*delays)
    transport = Transport(f"http://127.0.0.1:{listener.getsockname()[1]}", spin=spin)
    counts = []
    try:
        for _ in delays:
            before = _CountingPoll.polls
            answer = transport.request("GET", "/slow", timeout=10)
            counts.append(_CountingPoll.polls - before)
            assert (answer.status, answer.body) == (200, b"late")
    finally:
        transport.close()
        thread.join(10)
        listener.close()
    return counts


# polling for a 10 ms spin takes thousands of polls; a kept-alive connection's reuse check
# takes one (`still_open`), a blocking read none
AWAKE, ASLEEP = 5, 1


@pytest.mark.parametrize("spin", [0.0, 0.01])
def test_a_spinning_connection_waits_awake_then_blocks_for_a_late_answer(monkeypatch, spin):
    """With a spin the caller polls for up to that long; an answer later than that is still
    read, by the blocking read that follows. Without one it does not poll."""
    (polls,) = _polls_per_answer(monkeypatch, spin, 0.15)
    if spin:
        assert polls >= AWAKE, f"{polls} polls waiting: it slept"
    else:
        assert polls == 0, f"{polls} polls waiting: it spun"


def test_after_a_late_answer_a_connection_blocks_until_one_comes_within_the_spin(monkeypatch):
    """The spin follows the service's pace: after an answer later than the spin the next is
    awaited asleep; one that comes within it brings the polling back."""
    late, fast = 0.1, 0.0
    polls = _polls_per_answer(monkeypatch, 0.01, late, late, fast, late)
    assert polls[0] >= AWAKE, f"{polls[0]} polls: the first wait did not poll"
    assert polls[1] <= ASLEEP, f"{polls[1]} polls: it polled after a late answer"
    assert polls[3] >= AWAKE, f"{polls[3]} polls: a fast answer did not bring the polling back"


@pytest.mark.parametrize(
    "given, seconds", [("", None), (" 250 ", 0.00025), ("0", 0.0), ("10000", 0.01)]
)
def test_the_spin_comes_from_the_environment_in_microseconds(monkeypatch, given, seconds):
    """Set, the variable is every client's spin and every service's; unset or empty, both
    take the default where they have two CPUs (`default_spin`)."""
    monkeypatch.setenv(SPIN_ENV, given)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert spin_from_env() == pytest.approx(seconds or 0.0)
    assert default_spin() == pytest.approx(DEFAULT_SPIN if seconds is None else seconds)
    assert Transport("http://127.0.0.1:9").spin == pytest.approx(
        DEFAULT_SPIN if seconds is None else seconds
    )
    assert Transport("http://127.0.0.1:9", spin=0.001).spin == 0.001  # (given beats it)


@pytest.mark.parametrize(
    "cpus, spin", [({0}, 0.0), ({0, 1}, DEFAULT_SPIN), ({0, 1, 2, 3}, DEFAULT_SPIN)]
)
def test_without_the_variable_a_process_polls_only_with_a_second_cpu(monkeypatch, cpus, spin):
    """On one CPU a polling caller would keep the service that owes it the answer waiting
    (and a polling service the caller that owes it the next request)."""
    monkeypatch.delenv(SPIN_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cpus, raising=False)
    assert default_spin() == spin
    assert Transport("http://127.0.0.1:9").spin == spin


@pytest.mark.parametrize("given", ["abc", "-1", "10001", "nan", "inf"])
def test_a_spin_that_is_not_microseconds_in_range_is_refused_naming_the_variable(
    monkeypatch, given
):
    monkeypatch.setenv(SPIN_ENV, given)
    with pytest.raises(ValueError, match=f"{SPIN_ENV}=.*0 to 10000"):
        Transport("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="0 to 0.01 seconds"):
        Transport("http://127.0.0.1:9", spin=-0.5)
