"""`mistk-rl bench faults`: how long the harness takes to give up, and what it leaves behind,
when a service dies, restarts or hangs mid-run.

Each scenario starts `mistk-rl run` (a random agent playing CartPole-v1 episodes for far
longer than the bench waits) as a user would, waits for the first finished episode, injects
the fault, and records the seconds from the fault to the harness's exit, its exit code, the
last line it printed on stderr, and the service processes still alive once it exited.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import yaml

from mistk_rl.deploy.launch import group_members, wait_until_gone

RANDOM_AGENT = "agents.random_agent:RandomAgent"
GYM_ORCHESTRATOR = "orchestrators.gym_orchestrator:GymOrchestrator"


def workers(master: int) -> list[int]:
    """The gunicorn workers of a service: the master's children."""
    return [
        pid
        for pid in group_members(master)
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(master)
    ]


def restart_worker(master: int) -> None:
    """SIGKILL the worker: gunicorn starts a fresh one, which has lost all state."""
    (worker,) = workers(master)
    os.kill(worker, signal.SIGKILL)


def long_run_config() -> dict:
    """A run that plays episodes until stopped."""
    return {
        "name": "long",
        "orchestrator": {"target": GYM_ORCHESTRATOR, "env": {"id": "CartPole-v1"}},
        "agents": [{"name": "player", "target": RANDOM_AGENT}],
        "episodes": [{"num_episodes": 1_000_000, "max_steps": 500}],
    }


class HarnessProcess:
    """`mistk-rl run` in a subprocess, its output read line by line as it comes."""

    def __init__(self, config: dict, run_dir: Path, cwd: Path) -> None:
        self.run_dir = run_dir
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        path = run_dir.parent / f"{run_dir.name}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness", "run", str(path), "--out", str(run_dir)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None  # (stdout=PIPE)
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for_line(self, fragment: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.process.kill()
                raise TimeoutError(f"no line with {fragment!r} within {timeout} s") from None
            if fragment in line:
                return

    def master(self, name: str) -> int:
        """The pid of a service the harness started (from its log's first lines)."""
        for line in (self.run_dir / "logs" / f"{name}.log").read_text().splitlines():
            if "Starting gunicorn" in line:  # (TIME [PID] LEVEL ...: `mistk_rl.service.logs`)
                return int(re.search(r"\[(\d+)\]", line).group(1))  # type: ignore[union-attr]
        raise RuntimeError(f"no gunicorn master in {name}'s log")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        code = self.process.wait(timeout)
        assert self.process.stderr is not None  # (stderr=PIPE)
        return code, self.process.stderr.read()


Fault = Callable[[HarnessProcess, dict[str, int]], None]
FAULTS: dict[str, Fault] = {
    "agent killed": lambda run, pids: os.killpg(pids["player"], signal.SIGKILL),
    "agent hung (SIGSTOP)": lambda run, pids: os.killpg(pids["player"], signal.SIGSTOP),
    "orchestrator worker killed (restarted)": lambda run, pids: restart_worker(
        pids["orchestrator"]
    ),
    "orchestrator killed": lambda run, pids: os.killpg(pids["orchestrator"], signal.SIGKILL),
    "orchestrator hung (SIGSTOP)": lambda run, pids: os.killpg(
        pids["orchestrator"], signal.SIGSTOP
    ),
    "harness SIGTERM": lambda run, pids: run.process.send_signal(signal.SIGTERM),
}


def bench_faults(cwd: Optional[Path] = None) -> list[dict]:
    cwd = Path.cwd() if cwd is None else cwd  # (a default of Path.cwd() is the import's)
    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-faults-") as tmp:
        for i, (name, inject) in enumerate(FAULTS.items()):
            run = HarnessProcess(long_run_config(), Path(tmp) / f"run{i}", cwd)
            run.wait_for_line("episode")
            pids = {n: run.master(n) for n in ("orchestrator", "player")}
            start = time.monotonic()
            inject(run, pids)
            code, stderr = run.finish()
            seconds = time.monotonic() - start
            left = [n for n, pid in pids.items() if group_members(pid)]
            for pid in pids.values():  # a stopped group left behind still goes, for the next
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    _signal(pid, sig)
                wait_until_gone(pid, 10)
            last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
            record = {
                "bench": "faults",
                "fault": name,
                "exit_s": round(seconds, 2),
                "exit_code": code,
                "services_left": left,
                "message": last[:300],
            }
            print(
                f"{name:40s} exit {code:3d} after {seconds:6.2f} s; left: "
                f"{', '.join(left) or 'none'}\n    {last[:200]}",
                flush=True,
            )
            records.append(record)
    return records


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
