"""The machine's floor under `bench getaction` and one-copy `bench transport`.

A served step's round trip is this project's code plus what the machine charges for any
round trip between two processes: the loopback and the scheduler. The second differs
several-fold between machines of the same kind (a bare echo took 22 us on one and 80 us on
another), so a latency figure means little without it. Measured here, in the same sitting:

- ``echo``: a bare socket server sends back the bytes of a getAction request as they come;
  nothing parses them. What the kernel charges for a round trip.
- ``asgi``: the services' own server stack (uvicorn with `ServiceWorker`'s settings:
  httptools, uvloop, one send per answer) with an app that answers a constant, reached
  through the SDK's transport. Below this no service built on that stack can go.

Most of that floor can be the machine's idle CPUs. A virtual machine halts a vCPU that has
nothing to run, and a round trip wakes one twice (the service on a request, the caller on
the answer); each wake costs tens of microseconds where a running CPU takes a wake-up at
once. `cpus_kept_awake` keeps every CPU from halting, with a spinner per CPU at the lowest
scheduling class (``SCHED_IDLE``: it runs only when nothing else wants that CPU), as a
guest whose idle loop polls would (Linux's ``haltpoll`` cpuidle governor, ``idle=poll``).
`mistk-rl bench getaction --awake` and ``bench transport --awake`` run under it, to show
what the same code gives on such a machine.

`python -m harness.bench.floor KIND FD` is the child's side: it serves KIND on the
listening socket it inherits as FD; `python -m harness.bench.floor spin CPU` is a spinner.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from mistk_rl.deploy.launch import end_with_parent
from mistk_rl.sdk.transport import Transport

KINDS = ("echo", "asgi")
# a getAction of one CartPole observation, as the SDK sends it (JSON)
REQUEST_BODY = b'{"obs": {"player": [0.0273, -0.0061, 0.0359, 0.0197]}}'
ANSWER_BODY = b'{"actions":{"player":0}}'  # and its answer, as the agent service writes it
TIMEOUT_S = 10.0  # every wait on the child


def measure_floor(calls: int = 2000, warmup: int = 200) -> list[dict]:
    """A record per kind (`KINDS`): the round trip's distribution over `calls` calls
    (`latency_record`)."""
    return [_measure(kind, calls, warmup) for kind in KINDS]


def _measure(kind: str, calls: int, warmup: int) -> dict:
    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
    port = listener.getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, "-m", "harness.bench.floor", kind, str(listener.fileno())],
        pass_fds=(listener.fileno(),),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=end_with_parent,
    )
    listener.close()  # the child's now: connections queue in its backlog until it serves
    failure: OSError | None = None
    try:
        times = _time_calls(kind, port, calls, warmup)
    except OSError as exc:  # refused, timed out, or answered wrongly
        failure = exc
    finally:
        _, log = _stop(child)
    if failure is not None:
        raise RuntimeError(
            f"the {kind} floor server did not answer as it should ({failure}); "
            f"its log: {log.decode(errors='replace')[-2000:]}"
        ) from failure
    return {"bench": "floor", "kind": kind, **latency_record(times)}


def time_calls(call: Callable[[], object], calls: int, warmup: int) -> np.ndarray:
    """Seconds each of `calls` calls took, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    return times


@contextmanager
def cpus_kept_awake() -> Iterator[list[subprocess.Popen]]:
    """Inside: a spinner on each CPU this process may run on, at ``SCHED_IDLE`` (module
    doc); ended on the way out, however the block ends (and with this process, if it is
    killed). Linux only: elsewhere it raises RuntimeError naming why."""
    if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_getaffinity"):
        raise RuntimeError("keeping CPUs awake needs Linux's SCHED_IDLE scheduling class")
    spinners: list[subprocess.Popen] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            spinners.append(
                subprocess.Popen(
                    [sys.executable, "-m", "harness.bench.floor", "spin", str(cpu)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    preexec_fn=end_with_parent,
                )
            )
        for spinner in spinners:  # each says when it spins where and how it should
            said = spinner.stdout
            assert said is not None  # (stdout=PIPE)
            ready, _, _ = select.select([said], [], [], TIMEOUT_S)
            if not ready or said.read(1) != b"+":
                _, log = _stop(spinner)
                raise RuntimeError(
                    f"a CPU spinner did not start within {TIMEOUT_S} s: "
                    f"{log.decode(errors='replace')[-1000:]}"
                )
        yield spinners
    finally:
        for spinner in spinners:
            _stop(spinner)


def _stop(child: subprocess.Popen) -> tuple[bytes, bytes]:
    """End `child` and collect its output (killed if SIGTERM has not ended it in time)."""
    if child.poll() is None:
        child.terminate()
    try:
        return child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.communicate(timeout=TIMEOUT_S)


def _spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    sys.stdout.buffer.write(b"+")
    sys.stdout.flush()
    while True:
        pass


def latency_record(times: np.ndarray) -> dict:
    """A round trip's distribution, in ms (the fields of every latency bench's record)."""
    ms = times * 1e3
    return {
        "calls": len(times),
        "median_ms": round(float(np.median(ms)), 3),
        "p10_ms": round(float(np.percentile(ms, 10)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "mean_ms": round(float(ms.mean()), 3),
        "calls_per_s": round(float(len(times) / times.sum()), 1),
    }


def _time_calls(kind: str, port: int, calls: int, warmup: int) -> np.ndarray:
    call, close = (_echo_caller if kind == "echo" else _asgi_caller)(port)
    try:
        return time_calls(call, calls, warmup)
    finally:
        close()


def _echo_caller(port: int) -> tuple[Callable[[], None], Callable[[], None]]:
    request = Transport(f"http://127.0.0.1:{port}").encode(
        "POST", "/getAction", REQUEST_BODY, accept="application/json"
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call() -> None:
        sock.sendall(request)
        got = 0
        while got < len(request):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the echo server closed the connection")
            got += len(chunk)

    return call, sock.close


def _asgi_caller(port: int) -> tuple[Callable[[], None], Callable[[], None]]:
    transport = Transport(f"http://127.0.0.1:{port}")

    def call() -> None:
        answer = transport.request("POST", "/getAction", body=REQUEST_BODY, timeout=TIMEOUT_S)
        if answer.status != 200 or answer.body != ANSWER_BODY:
            raise ConnectionError(f"unexpected answer {answer.status} {answer.body[:80]!r}")

    return call, transport.close


# ---- the child's side ----------------------------------------------------------------------
def _serve_echo(fd: int) -> None:
    listener = socket.socket(fileno=fd)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(65536):
        conn.sendall(data)


async def _constant_app(scope: dict, receive: Callable, send: Callable) -> None:
    """Answers every request with `ANSWER_BODY`, as the services answer a getAction."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(ANSWER_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": ANSWER_BODY})


def _serve_asgi(fd: int) -> None:
    import uvicorn

    from mistk_rl.service.server import ServiceWorker

    settings = ServiceWorker.CONFIG_KWARGS
    config = uvicorn.Config(_constant_app, lifespan="off", log_level="warning", **settings)
    # a socket object that knows its family, as gunicorn hands the services' workers theirs
    # (uvicorn's own `fd=` takes any fd for a Unix socket: no TCP_NODELAY on connections)
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


if __name__ == "__main__":
    {"echo": _serve_echo, "asgi": _serve_asgi, "spin": _spin}[sys.argv[1]](int(sys.argv[2]))
