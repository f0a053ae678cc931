"""`SubprocessEnvManager` and `AsyncSubprocessEnvManager`: one process per env.

Workers start through multiprocessing's *forkserver*: forking a threaded server process
(a gunicorn worker) is unsafe, and spawn would re-import everything per env. Observations come
back through shared memory (`worker.py`). Supervision is the parent's: every wait has a
deadline (one `select.poll` over the pipes), so an env that raises, dies (EOF on its pipe) or
hangs past `step_timeout` is killed, restarted and reported, while the others go on.

The synchronous manager returns a timestep for every env it stepped. The asynchronous one
returns as soon as `wait_num` envs answered (or `wait_timeout` passed, with at least one
answer), and collects the slower ones on later calls: fast envs are not held back by slow
ones.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import select
import time
from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.rl.envs.base import EnvManager, Timestep
from mistk_rl.rl.envs.worker import run_worker

SHAREABLE = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


class SubprocessEnvManager(EnvManager):
    @classmethod
    def default_config(cls) -> dict:
        return {**super().default_config(), "context": "forkserver"}

    def _launch(self) -> None:
        self._ctx = mp.get_context(self.config["context"])
        if self.config["context"] == "forkserver":  # workers fork with these imported already
            self._ctx.set_forkserver_preload(["numpy", "gymnasium", "mistk_rl.rl.envs.worker"])
        probe = self.env_fns[0]()
        space = probe.observation_space
        probe.close()
        if isinstance(space, SHAREABLE):
            sample = np.asarray(space.sample())
            self._shape, self._dtype = sample.shape, sample.dtype
            nbytes = max(1, sample.nbytes)
            self._shared = [self._ctx.RawArray("b", nbytes) for _ in range(self.env_num)]
        else:  # Dict/Tuple observations travel through the pipe
            self._shape, self._dtype, self._shared = (), np.dtype("float64"), [None] * self.env_num
        self._procs: list[Any] = [None] * self.env_num
        self._conns: list[Any] = [None] * self.env_num
        self._in_flight: dict[int, float] = {}  # env id -> when its step was sent
        for i in range(self.env_num):
            self._spawn(i)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    # ---- commands ------------------------------------------------------------------------
    def _reset(
        self, ids: list[int], seeds: dict[int, Optional[int]]
    ) -> dict[int, tuple[Any, dict]]:
        stepping = [i for i in ids if i in self._in_flight]
        if stepping:  # answers still on the way would be read as the reset's: drain them
            self._collect(stepping, len(stepping), self.config["step_timeout"])
        for i in ids:
            self._ready.pop(i, None)
        sent = [i for i in ids if self._send(i, "reset", seeds.get(i))]
        answers = self._gather(sent, self.config["reset_timeout"]).items()
        return {
            i: reset
            for i, (status, payload) in answers
            if (reset := self._reset_answered(i, status, payload)) is not None
        }

    def _step(self, actions: dict[int, Any]) -> dict[int, Timestep]:
        self._send_steps(actions)
        return self._collect(
            list(self._in_flight), len(self._in_flight), self.config["step_timeout"]
        )

    def _send_steps(self, actions: dict[int, Any]) -> None:
        now = time.monotonic()
        for i, action in actions.items():
            self._in_flight[i] = now
            if not self._send(i, "step", action):
                self._in_flight[i] = -1.0  # already dead: reported by the next collect

    def _collect(self, ids: list[int], wait_num: int, timeout: float) -> dict[int, Timestep]:
        """Answers of the in-flight envs `ids`: at least `wait_num` unless `timeout` passes;
        envs overdue by step_timeout (or dead) are restarted and reported."""
        out: dict[int, Timestep] = {}
        for i, (status, payload) in self._gather(ids, timeout, wait_num).items():
            del self._in_flight[i]
            out[i] = self._answered(i, payload) if status == "ok" else self._failed(i, payload)
        return out

    def _gather(
        self, ids: list[int], timeout: float, wait_num: Optional[int] = None
    ) -> dict[int, tuple[str, Any]]:
        """Wait for answers from `ids` (all of them, or `wait_num`); an env that is dead or
        past `timeout` since its command gets ("error", reason)."""
        wanted = len(ids) if wait_num is None else min(wait_num, len(ids))
        pending = {i for i in ids}
        answers: dict[int, tuple[str, Any]] = {}
        for i in list(pending):
            if self._in_flight.get(i) == -1.0:
                answers[i] = ("error", "the worker process was gone")
                pending.discard(i)
        # one poll set for the whole wait: Connection.poll and connection.wait build a new
        # selector on every call, which made collecting n answers cost O(n^2)
        poller = select.poll()
        env_of_fd: dict[int, int] = {}
        for i in pending:
            fd = self._conns[i].fileno()
            poller.register(fd, select.POLLIN)  # a closed pipe reports POLLHUP as well
            env_of_fd[fd] = i
        deadline = time.monotonic() + timeout
        while pending and len(answers) < wanted:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, _event in poller.poll(math.ceil(remaining * 1000)):
                i = env_of_fd[fd]
                poller.unregister(fd)
                pending.discard(i)
                answers[i] = self._receive(i)
        now = time.monotonic()
        for i in pending:  # no answer yet: an env past the step timeout is hung
            started = self._in_flight.get(i, now - timeout)
            if wait_num is None or now - started >= self.config["step_timeout"]:
                answers[i] = ("error", f"no answer within {self.config['step_timeout']} s (hung)")
        return answers

    def _receive(self, i: int) -> tuple[str, Any]:
        """The answer waiting on env i's pipe; a closed pipe means the worker died."""
        try:
            return self._conns[i].recv()
        except (EOFError, OSError):
            code = self._procs[i].exitcode if self._procs[i] else None
            return ("error", f"the worker process died (exit code {code})")

    # ---- processes -----------------------------------------------------------------------
    def _spawn(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=run_worker,
            name=f"mistk-env-{i}",
            daemon=True,
            args=(self.env_fns[i], child, self._shared[i], self._shape, self._dtype.str),
        )
        proc.start()
        child.close()
        self._procs[i], self._conns[i] = proc, parent

    def _kill(self, i: int) -> None:
        proc, conn = self._procs[i], self._conns[i]
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self._procs[i] = self._conns[i] = None

    def _restart(self, i: int) -> Optional[tuple[Any, dict]]:
        """A fresh worker for env i, reset; None if env i was retired instead."""
        self._in_flight.pop(i, None)
        while not self._give_up(i):
            self._kill(i)
            self._spawn(i)
            if self._send(i, "reset", self._env_seed(i)):
                status, payload = self._gather([i], self.config["reset_timeout"])[i]
                if status == "ok":
                    obs = self._observation(i, payload[0])
                    self._last_obs[i] = obs
                    return obs, payload[1]
            else:
                payload = "the new worker died at once"
            self._abnormal(i, f"restart failed: {payload}")
        self._kill(i)
        return None

    def _send(self, i: int, command: str, arg: Any) -> bool:
        try:
            self._conns[i].send((command, arg))
            return True
        except (OSError, ValueError, AttributeError):
            return False

    def _observation(self, i: int, payload: Any) -> Any:
        """The observation env i published (a copy: shared memory is overwritten next step)."""
        if self._shared[i] is None:
            return payload
        view = np.frombuffer(self._shared[i], dtype=self._dtype).reshape(self._shape)
        return view.copy()

    def _close(self) -> None:
        for i in range(self.env_num):
            if getattr(self, "_conns", None) and self._conns[i] is not None:
                self._send(i, "close", None)
        for i in range(self.env_num):
            if getattr(self, "_procs", None) and self._procs[i] is not None:
                self._procs[i].join(1.0)
                self._kill(i)


class AsyncSubprocessEnvManager(SubprocessEnvManager):
    """Steps return whichever envs answered first (see the module docstring)."""

    @classmethod
    def default_config(cls) -> dict:
        return {**super().default_config(), "wait_num": None, "wait_timeout": 0.01}

    def _step(self, actions: dict[int, Any]) -> dict[int, Timestep]:
        self._send_steps(actions)
        in_flight = list(self._in_flight)
        wait_num = self.config["wait_num"] or max(1, (len(in_flight) + 1) // 2)
        out = self._collect(in_flight, wait_num, self.config["wait_timeout"])
        if not out and in_flight:  # never return empty-handed while envs are stepping
            out = self._collect(list(self._in_flight), 1, self.config["step_timeout"])
        return out

    @property
    def in_flight(self) -> list[int]:
        return sorted(self._in_flight)
