"""Start services as child processes on free loopback ports, and stop them without orphans.

The parent binds the listening socket itself (port 0: the kernel picks a free port, no race)
and hands it to gunicorn as an inherited fd. Requests queue in the socket's backlog until the
worker is up, so readiness is one apiVersion call with a timeout, not a sleep-and-retry loop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from mistk_rl.sdk.client import AgentClient, OrchestratorClient, ServiceUnavailable

_CLIENTS = {"agent": AgentClient, "orchestrator": OrchestratorClient}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ServiceStartError(RuntimeError):
    """The service process exited or never answered; the message carries its log tail."""


@dataclass
class ServiceProcess:
    role: str
    target: str
    url: str  # root URL, e.g. http://127.0.0.1:40123
    process: subprocess.Popen
    log_path: Path
    data_dir: Path

    def client(self, token: Optional[str] = None, timeout: float = 30.0):
        return _CLIENTS[self.role](self.url, token=token, timeout=timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """`wait_ready` (below) for this service."""
        wait_ready(self, timeout)

    def begin_stop(self) -> None:
        """SIGTERM the process group without waiting: stop several side by side, then
        `stop` each (which waits, and kills what is left)."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            _signal_group(self.process, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM the service's process group, SIGKILL it after `timeout`; returns the code."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            _signal_group(self.process, signal.SIGCONT)  # a stopped service handles it too
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait(timeout)
        _signal_group(self.process, signal.SIGKILL)  # stragglers (a wedged worker)
        wait_until_gone(self.process.pid, timeout)
        return self.process.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_service(
    role: str,
    target: str,
    *,
    data_dir: Path,
    log_path: Path,
    token: Optional[str] = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    startup_timeout: float = 60.0,
    env: Optional[dict[str, str]] = None,
) -> ServiceProcess:
    """Start ``mistk-rl serve ROLE TARGET`` on a fresh port and wait until it answers."""
    service = spawn_service(
        role,
        target,
        data_dir=data_dir,
        log_path=log_path,
        token=token,
        host=host,
        extra_args=extra_args,
        env=env,
    )
    wait_ready(service, startup_timeout)
    return service


def spawn_service(
    role: str,
    target: str,
    *,
    data_dir: Path,
    log_path: Path,
    token: Optional[str] = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    env: Optional[dict[str, str]] = None,
) -> ServiceProcess:
    """Start ``mistk-rl serve ROLE TARGET`` on a fresh port without waiting for it: spawn
    several, then `wait_ready` each, and they boot side by side (the caller stops them)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    os.set_inheritable(fd, True)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.getcwd(), child_env.get("PYTHONPATH", "")) if p
    )
    if token:
        child_env["MISTK_RL_TOKEN"] = token
    cmd = [
        sys.executable,
        "-m",
        "mistk_rl",
        "serve",
        role,
        target,
        "--fd",
        str(fd),
        "--host",
        host,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *extra_args,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd,
            pass_fds=(fd,),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,
            preexec_fn=end_with_parent,
        )
    listener.close()
    return ServiceProcess(role, target, f"http://{host}:{port}", process, log_path, Path(data_dir))


def end_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, even by
    SIGKILL (which runs no clean-up), so a killed harness leaves no service behind."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_ready(service: ServiceProcess, timeout: float) -> None:
    """Wait until the service answers apiVersion; ServiceStartError (with its log tail) when
    it exits or does not answer in time, after stopping it."""
    try:
        _wait_ready(service, timeout)
    except BaseException:
        service.stop()
        raise


def _wait_ready(service: ServiceProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    client = service.client(timeout=timeout)
    try:
        while True:
            remaining = deadline - time.monotonic()
            try:
                client.timeout = max(remaining, 0.1)
                client.api_version()
                return
            except ServiceUnavailable as exc:
                if remaining <= 0:
                    raise ServiceStartError(
                        f"{service.role} {service.target} did not answer "
                        f"within {timeout} s:\n{service.log_tail()}"
                    ) from exc
                try:  # a refused connection means the process is going down: wait for that
                    service.process.wait(min(0.2, max(remaining, 0.01)))
                except subprocess.TimeoutExpired:
                    continue
                raise ServiceStartError(
                    f"{service.role} {service.target} exited with code "
                    f"{service.process.returncode}:\n{service.log_tail()}"
                ) from exc
    finally:
        client.close()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process is gone already
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def wait_until_gone(pgid: int, timeout: float) -> bool:
    """Wait (bounded) until no live process is left in group `pgid`: killed children of a
    killed parent need a moment to be reaped. True if the group emptied in time."""
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
