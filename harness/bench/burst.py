"""`mistk-rl bench burst`: does a caller that floods an agent hold up everyone else? A
hostile client writes 1.5 MB of tiny requests at once and never reads the answers: 300,000
five-byte frames on a step stream, or as many bytes of pipelined HTTP stepColumns requests
(each malformed, so each is answered at once with a 400: the cheapest answer, the most per
byte). From 50 ms after the burst starts, another connection asks for the agent's status
`calls` times in a row; the record gives those calls' latency (p50, max), how many of the
burst's requests the agent answered (it should stop reading while its answers are unread)
and the worker's memory afterwards (from its /metrics).
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import requests

from mistk_rl.wire import frames

BURST_BYTES = 1_500_000
AGENT = "/v1/mistk/agent"


def bench_burst(runs: int = 3, calls: int = 20) -> list[dict]:
    """`runs` bursts of each kind against one RandomAgent service (module doc)."""
    from harness.bench.step import start_random_agent

    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        service, agent = start_random_agent(Path(tmp), name="player")
        try:
            agent.episode_started({"player": [0.0, 0.0, 0.0, 0.0]})
            for kind in ("stream", "pipelined-http"):
                for run in range(runs):
                    record = _burst(service.url, kind, calls)
                    records.append({"bench": "burst", "kind": kind, "run": run, **record})
                    print("  ".join(f"{k}={v}" for k, v in records[-1].items()), flush=True)
            agent.close()
        finally:
            service.stop()
    return records


def _burst(url: str, kind: str, calls: int) -> dict:
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    before = _metric(url, "mistk_requests_total", "stepColumns")
    if kind == "stream":
        _upgrade(sock, parts.netloc)
        one = frames.REQUEST_HEAD.pack(1) + b"x"
    else:
        one = (
            f"POST {AGENT}/stepColumns HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1\r\n\r\nx"
        ).encode()
    burst = one * (BURST_BYTES // len(one))
    sock.settimeout(5)  # (a send that makes no progress for 5 s: the agent stopped reading)
    sender = threading.Thread(target=_send, args=(sock, burst), daemon=True)
    session = requests.Session()
    session.get(f"{url}{AGENT}/status", timeout=30)  # (its connection made before the burst)
    sender.start()
    time.sleep(0.05)  # the burst's first bytes are in
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = session.get(f"{url}{AGENT}/status", timeout=60)
        latencies.append(time.perf_counter() - started)
        answer.raise_for_status()
    sender.join(60)
    answered = _metric(url, "mistk_requests_total", "stepColumns") - before
    rss = _metric(url, "mistk_process_resident_memory_bytes")
    sock.close()
    session.close()
    ms = np.asarray(latencies) * 1e3
    return {
        "burst_requests": len(burst) // len(one),
        "status_p50_ms": round(float(np.median(ms)), 2),
        "status_max_ms": round(float(ms.max()), 2),
        "answered": int(answered),
        "rss_mib": round(rss / 2**20, 1),
    }


def _upgrade(sock: socket.socket, host: str) -> None:
    sock.sendall(
        (
            f"GET {AGENT}{frames.PATH} HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
            f"Connection: Upgrade\r\nUpgrade: {frames.PROTOCOL}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # (byte by byte: nothing after the 101 is taken)
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"the stream was refused: {head[:200]!r}")


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # (held back: the agent stopped reading, as it should)
        pass


def _metric(url: str, name: str, operation: str = "") -> float:
    """A sample of the service's /metrics, summed over its labels (`operation`: only that
    operation's)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            if operation and f'operation="{operation}"' not in line:
                continue
            total += float(line.split()[-1])
    return total
