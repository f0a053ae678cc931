"""A step stream (or pipelined HTTP) written faster than it is read (issue 57 item 5): the
agent answers its
frames a few dozen at a time, giving the event loop a turn between, and reads no more
while the answers it wrote are unread. So during a burst of 3,000,000 tiny frames whose
answers are never read, a status call is answered, the agent stops reading (the caller's
send makes no progress: its own socket holds it back) after answering a small part, and
the worker's memory stays bounded. (Latencies are measured apart, not asserted here.)"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from typing import Optional

import numpy as np
import pytest
import requests

from mistk_rl.sdk.client import ColumnPipeline, PayloadTooLarge
from mistk_rl.wire import frames
from tests.conftest import RANDOM_AGENT
from tests.test_step_stream import _registered

FRAMES = 3_000_000  # 15 MB: more than the kernel's socket buffers hold on loopback


def _open_raw_stream(url: str) -> socket.socket:
    """A connection upgraded to the agent's step stream, by hand (no SDK: a hostile
    client), with a small receive buffer (the answers it never reads back up sooner)."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(30)
    sock.connect((parts.hostname, parts.port))
    sock.sendall(
        (
            f"GET /v1/mistk/agent{frames.PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
            f"Connection: Upgrade\r\nUpgrade: {frames.PROTOCOL}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # (byte by byte: nothing of the answers after it is taken)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _metric(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=30).text
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def _flood(url: str, sock: socket.socket, data: bytes) -> Optional[OSError]:
    """Write `data` on `sock` from a thread, never reading the answers, while a status call
    (another connection) is answered; what the write raised: a timeout once it made no
    progress for 5 s (the agent stopped reading), None if the agent read it all."""
    sock.settimeout(5)
    outcome: list[OSError] = []

    def send() -> None:
        try:
            sock.sendall(data)
        except OSError as exc:
            outcome.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    status = requests.get(f"{url}/v1/mistk/agent/status", timeout=30)
    assert status.status_code == 200 and status.json()["state"] == "in_episode"
    sender.join(120)
    assert not sender.is_alive()
    return outcome[0] if outcome else None


def test_a_burst_on_a_stream_neither_holds_the_loop_nor_fills_memory(launch):
    service = launch("agent", RANDOM_AGENT)
    agent = _registered(service)  # (an episode started)
    sock = _open_raw_stream(service.url)
    # frames of 5 bytes ("x" is not a stepColumns body: each is answered with a 400 frame)
    outcome = _flood(service.url, sock, (frames.REQUEST_HEAD.pack(1) + b"x") * FRAMES)
    answered = _metric(service.url, "mistk_step_stream_frames_total")
    assert isinstance(outcome, socket.timeout), (
        f"the agent read the whole burst (answered {answered:.0f}) with its answers unread"
    )
    assert answered < FRAMES / 10, f"{answered:.0f} frames answered, none read"
    rss = _metric(service.url, "mistk_process_resident_memory_bytes")
    assert rss < 400 * 2**20, f"the worker holds {rss / 2**20:.0f} MiB"
    sock.close()
    deadline = time.monotonic() + 30  # (the stream's close is seen a moment later)
    while _metric(service.url, "mistk_step_streams_open") != 0.0:
        assert time.monotonic() < deadline, "the closed stream is still open"
        time.sleep(0.05)
    assert agent.status().state == "in_episode"  # (the burst changed nothing)


def test_pipelined_http_is_answered_in_turns_and_held_back_while_unread(launch):
    """The same attack as pipelined HTTP: 15 MB of tiny stepColumns requests (each a 400)
    written at once, answers never read. They are parsed a slice per turn of the event
    loop, and not at all while the answers are unread."""
    service = launch("agent", RANDOM_AGENT)
    agent = _registered(service)
    parts = urllib.parse.urlsplit(service.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    one = (
        f"POST /v1/mistk/agent/stepColumns HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1\r\n\r\nx"
    ).encode()
    requests_sent = 15_000_000 // len(one)
    outcome = _flood(service.url, sock, one * requests_sent)
    text = requests.get(f"{service.url}/metrics", timeout=30).text
    answered = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("mistk_requests_total") and 'operation="stepColumns"' in line
    )
    assert isinstance(outcome, socket.timeout), (
        f"the agent read every request (answered {answered:.0f}) with its answers unread"
    )
    # (a 400's answer is a few times its request: the kernel's loopback buffers, some MB,
    # hold a few ten thousand before the agent sees its writes back up)
    assert answered < requests_sent / 4, f"{answered:.0f} of {requests_sent} answered"
    rss = _metric(service.url, "mistk_process_resident_memory_bytes")
    assert rss < 400 * 2**20, f"the worker holds {rss / 2**20:.0f} MiB"
    sock.close()
    assert agent.status().state == "in_episode"


def _ready(launch, *limits: str):
    service = launch("agent", RANDOM_AGENT, extra_args=[a for x in limits for a in ("--limit", x)])
    _registered(service)  # (an episode started)
    return service


def _closed_by_the_agent(sock: socket.socket) -> bool:
    """True once the agent closes the connection (its answers before that are read and
    dropped); the socket's timeout bounds the wait."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_streams_past_the_limit_are_refused_and_idle_or_half_sent_ones_closed(launch):
    service = _ready(launch, "max_streams=2", "stream_idle_s=1", "frame_timeout_s=1")
    first, second = _open_raw_stream(service.url), _open_raw_stream(service.url)
    with pytest.raises(AssertionError, match="429"):
        _open_raw_stream(service.url)  # (its answer: 429, naming the limit)
    assert _metric(service.url, "mistk_step_streams_open") == 2.0
    second.close()
    first.settimeout(30)
    assert _closed_by_the_agent(first)  # idle: nothing sent
    half = _open_raw_stream(service.url)
    half.sendall(frames.REQUEST_HEAD.pack(100) + b"{" * 10)  # a frame begun, not finished
    half.settimeout(30)
    assert _closed_by_the_agent(half)
    log = service.log_path.read_text()
    assert "nothing came for" in log and "stream_idle_s=1" in log
    assert "is unfinished (frame_timeout_s=1); 14 bytes dropped" in log
    third = _open_raw_stream(service.url)  # (the two closed: room again)
    third.close()


def test_a_busy_stream_is_not_taken_for_an_idle_or_half_sent_one(launch):
    service = _ready(launch, "stream_idle_s=1", "frame_timeout_s=1")
    agent = service.client()
    pipeline = ColumnPipeline(agent, stream=True)
    obs = np.zeros((1, 4), np.float32)
    deadline = time.monotonic() + 3  # (three watchdog periods of steady steps)
    steps = 0
    while time.monotonic() < deadline:
        pipeline.send(np.array([0]), obs)
        pipeline.receive()
        steps += 1
    assert pipeline.upgraded and steps > 0
    assert _metric(service.url, "mistk_step_streams_opened_total") == 1.0  # (never reopened)
    pipeline.close()


def test_a_frame_larger_than_the_socket_buffers_still_gets_its_413(launch):
    """A frame over the body limit and larger than the kernel's buffers: the agent answers
    413, reads the frame to its end (dropping it) and only then closes, so the caller's
    send completes and the SDK raises PayloadTooLarge, not ServiceUnavailable."""
    service = launch("agent", RANDOM_AGENT, extra_args=["--max-body-bytes", "4096"])
    agent = _registered(service)
    agent.binary = True  # (16 bytes an observation, random: 16 MB in one frame)
    pipe = ColumnPipeline(agent, stream=True)
    rows = 1_000_000
    obs = np.random.default_rng(0).random((rows, 4), dtype=np.float32)
    pipe.send(np.arange(rows), obs)
    with pytest.raises(PayloadTooLarge):
        pipe.receive()
    assert agent.status().state == "in_episode"  # nothing changed


def test_a_slow_reader_gets_every_answer_in_order(launch):
    """A stream whose caller reads its answers slowly (64 KiB at a time with a pause) while
    it has sent many frames: the agent holds back, never drops or reorders, and status is
    answered meanwhile."""
    service = launch("agent", RANDOM_AGENT)
    _registered(service)
    sock = _open_raw_stream(service.url)
    count = 20_000
    sender = threading.Thread(
        target=sock.sendall, args=((frames.REQUEST_HEAD.pack(1) + b"x") * count,), daemon=True
    )
    sender.start()
    received, answers, slow_reads = bytearray(), 0, 0
    while answers < count:
        chunk = sock.recv(65536)
        assert chunk, f"the agent closed the stream after {answers} answers"
        received += chunk
        while len(received) >= frames.ANSWER_HEAD.size:
            status, _, length = frames.ANSWER_HEAD.unpack_from(received)
            if len(received) < frames.ANSWER_HEAD.size + length:
                break
            assert status == 400  # ("x" is no stepColumns body), each answered in turn
            del received[: frames.ANSWER_HEAD.size + length]
            answers += 1
        if slow_reads < 20:
            slow_reads += 1
            time.sleep(0.05)  # (the slowness under test, not a wait for something)
            status_call = requests.get(f"{service.url}/v1/mistk/agent/status", timeout=30)
            assert status_call.status_code == 200
    sender.join(30)
    assert not sender.is_alive() and answers == count and not received
    sock.close()


def test_unfinished_frames_past_the_workers_budget_close_the_connection_that_passes_it(launch):
    """`max_buffered_bytes` bounds what a worker holds of frames begun and not finished,
    over all its connections: the stream whose bytes would pass it is closed, saying so;
    the others go on."""
    service = _ready(launch, "max_buffered_bytes=1000000")
    first, second = _open_raw_stream(service.url), _open_raw_stream(service.url)
    frame = frames.REQUEST_HEAD.pack(700_000) + b"x" * 700_000
    first.sendall(frame[:600_000])
    deadline = time.monotonic() + 30
    while _metric(service.url, "mistk_buffered_bytes") < 600_000:  # (the first's, held)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second.sendall(frame[:600_000])  # 1.2 MB held together: over the budget
    second.settimeout(30)
    assert _closed_by_the_agent(second)
    first.sendall(frame[600_000:])  # the first's frame, whole: answered as ever
    first.settimeout(30)
    status, _, length = frames.ANSWER_HEAD.unpack(first.recv(frames.ANSWER_HEAD.size))
    assert status == 400 and length > 0
    log = service.log_path.read_text()
    assert "max_buffered_bytes=1000000" in log and "a connection closed" in log
    assert _metric(service.url, "mistk_buffered_bytes") == 0.0  # (nothing held now)
    first.close()
