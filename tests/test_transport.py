"""The SDK's keep-alive transport: reuse, reconnect after the server closed, no double POST."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mistk_rl.transport import Transport, TransportError


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts: list[bytes] = []
    connections: set[int] = set()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append(body)
        type(self).connections.add(id(self.connection))
        reply = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        if body == b"close-after":
            self.close_connection = True  # the server drops the kept-alive connection

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.posts, _Handler.connections = [], set()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_connection_is_reused(server):
    transport = Transport(server)
    for i in range(5):
        assert transport.request("POST", "/x", body=str(i).encode()).status == 200
    assert len(_Handler.connections) == 1
    transport.close()


def test_reconnects_after_the_server_closed_and_never_sends_twice(server):
    transport = Transport(server)
    transport.request("POST", "/x", body=b"close-after")
    # the idle connection is closed by now; the next POST must go out exactly once
    assert transport.request("POST", "/x", body=b"second").status == 200
    assert _Handler.posts == [b"close-after", b"second"]
    assert len(_Handler.connections) == 2
    transport.close()


def test_unreachable_service_is_a_transport_error():
    transport = Transport("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(TransportError):
        transport.request("GET", "/status", timeout=2)
    with pytest.raises(ValueError):
        Transport("ftp://example.org")
