"""Env managers: many copies of an environment behind one interface, supervised.

    manager.launch(seed=0)                 # create and reset every env (env i: seed + i)
    obs = manager.ready_obs                # {env_id: obs} of envs waiting for an action
    timesteps = manager.step({i: action for i in obs})
    manager.close()                        # no worker process outlives this

Episodes reset themselves (auto-reset): a timestep that ends an episode carries the episode's
final observation, and `ready_obs` already holds the next episode's first one. Supervision:
an env that raises, dies or runs past its step/reset timeout is restarted on its own and
reported by an *abnormal* timestep (truncated, info["abnormal"] says why); the other envs go
on. An env that keeps failing `max_retry` times in a row is retired; when none is left the
manager raises `EnvManagerError`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import gymnasium as gym

from mistk_rl.rl.config import deep_merge

EnvFn = Callable[[], gym.Env]


class EnvManagerError(RuntimeError):
    """Every env failed past its retry limit, or the manager is used after close()."""


@dataclass
class Timestep:
    obs: Any  # the observation after the step; the final one when the episode ended
    reward: float
    terminated: bool
    truncated: bool
    info: dict = field(default_factory=dict)
    abnormal: bool = False  # the env failed and was restarted: this episode is cut here

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class GymEnvFactory:
    """A picklable env_fn for registered gymnasium envs (subprocess workers need one)."""

    env_id: str
    kwargs: tuple = ()

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id, **dict(self.kwargs))


def make_env_fns(env_id: str, kwargs: Optional[dict], n: int) -> list[EnvFn]:
    return [GymEnvFactory(env_id, tuple(sorted((kwargs or {}).items())))] * n


class EnvManager(ABC):
    """Common bookkeeping: seeds, ready observations, restart counters, retry limits."""

    @classmethod
    def default_config(cls) -> dict:
        return {"step_timeout": 30.0, "reset_timeout": 60.0, "max_retry": 3}

    def __init__(self, env_fns: Sequence[EnvFn], config: Optional[dict] = None) -> None:
        if not env_fns:
            raise ValueError("an env manager needs at least one env_fn")
        self.env_fns = list(env_fns)
        self.config = deep_merge(self.default_config(), config)
        self.env_num = len(self.env_fns)
        self._ready: dict[int, Any] = {}
        self._info: dict[int, dict] = {}  # info that came with each ready observation
        self._last_obs: dict[int, Any] = {}
        self.restarts = [0] * self.env_num
        self._failures_in_a_row = [0] * self.env_num
        self.retired: set[int] = set()
        self._launched = False
        self._closed = False
        self._seed: Optional[int] = None

    # ---- the interface -------------------------------------------------------------------
    @property
    def ready_obs(self) -> dict[int, Any]:
        """Observations of the envs waiting for an action, in env order (so what is built
        from them does not depend on which worker answered first)."""
        return dict(sorted(self._ready.items()))

    @property
    def ready_info(self) -> dict[int, dict]:
        """The info dict that came with each ready observation (e.g. an action mask)."""
        return {i: self._info.get(i, {}) for i in self._ready}

    @property
    def done(self) -> bool:
        return self._closed

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "restarts": sum(self.restarts),
            "restarts_per_env": list(self.restarts),
            "retired": sorted(self.retired),
        }

    def launch(self, seed: Optional[int] = None) -> None:
        """Create every env and reset it (env i with seed + i when a seed is given)."""
        self._check_open()
        self._seed = seed
        self._launch()
        self._launched = True
        self.reset(seeds={i: self._env_seed(i) for i in range(self.env_num)})

    def reset(
        self,
        env_ids: Optional[Sequence[int]] = None,
        seeds: Optional[dict[int, Optional[int]]] = None,
    ) -> None:
        """Reset `env_ids` (default all live envs); their first observations become ready."""
        self._check_launched()
        ids = [
            i
            for i in (range(self.env_num) if env_ids is None else env_ids)
            if i not in self.retired
        ]
        for i, (obs, info) in self._reset(ids, seeds or {}).items():
            self._ready[i] = self._last_obs[i] = obs
            self._info[i] = info

    def step(self, actions: dict[int, Any]) -> dict[int, Timestep]:
        """Step the envs named in `actions` (each must be ready); see the module docstring."""
        self._check_launched()
        unknown = [i for i in actions if i not in self._ready]
        if unknown:
            raise ValueError(
                f"envs {unknown} are not waiting for an action (ready: {sorted(self._ready)})"
            )
        for i in actions:
            del self._ready[i]
        timesteps = dict(sorted(self._step(actions).items()))
        for i, ts in timesteps.items():
            if not ts.abnormal:
                self._failures_in_a_row[i] = 0
                self._last_obs[i] = ts.obs
        return timesteps

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()
            self._ready.clear()

    def __enter__(self) -> "EnvManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- for subclasses ----------------------------------------------------------------
    @abstractmethod
    def _launch(self) -> None: ...

    @abstractmethod
    def _reset(
        self, ids: list[int], seeds: dict[int, Optional[int]]
    ) -> dict[int, tuple[Any, dict]]:
        """(obs, info) of each env reset; subclasses also set `_ready`/`_info` on steps."""

    @abstractmethod
    def _step(self, actions: dict[int, Any]) -> dict[int, Timestep]: ...

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def _restart(self, i: int) -> Optional[tuple[Any, dict]]:
        """A fresh env i, reset: its (obs, info); None if env i was retired instead."""

    def _reset_answered(self, i: int, status: str, payload: Any) -> Optional[tuple[Any, dict]]:
        """Env i's (obs, info) from its worker's answer to a reset (status "ok", or "error"
        and why); a failed reset starts the env again (None: it was retired instead)."""
        if status == "ok":
            published, info = payload
            return self._observation(i, published), info
        self._abnormal(i, f"reset failed: {payload}")
        return self._restart(i)

    def _observation(self, i: int, published: Any) -> Any:
        """An observation env i's worker answered with (as it came, unless the worker puts
        it elsewhere: shared memory)."""
        return published

    def _failed(self, i: int, reason: str) -> Timestep:
        """Env i failed in a step: the abnormal timestep that reports it; the env is started
        again (its first observation ready) unless it was retired."""
        timestep = self._abnormal(i, reason)
        restarted = self._restart(i)
        if restarted is not None:
            self._ready[i], self._info[i] = restarted
        return timestep

    def _answered(self, i: int, answer: tuple) -> Timestep:
        """Env i's timestep from a worker's answer (`worker.step_env`'s tuple); its next
        observation is ready."""
        reward, terminated, truncated, info, final, published, next_info = answer
        next_obs = self._observation(i, published)
        self._ready[i], self._info[i] = next_obs, next_info
        return Timestep(next_obs if final is None else final, reward, terminated, truncated, info)

    def _env_seed(self, i: int) -> Optional[int]:
        """Seed for env i's next reset after a restart: distinct per restart, reproducible."""
        if self._seed is None:
            return None
        return self._seed + i + 1_000_003 * self.restarts[i]

    def _abnormal(self, i: int, reason: str) -> Timestep:
        """Book a failure of env i: the timestep that reports it (the caller restarts it)."""
        self.restarts[i] += 1
        self._failures_in_a_row[i] += 1
        obs = self._last_obs.get(i)
        return Timestep(obs, 0.0, False, True, {"abnormal": reason}, abnormal=True)

    def _give_up(self, i: int) -> bool:
        """Retire env i once it failed max_retry times in a row; True if it was retired."""
        if self._failures_in_a_row[i] < self.config["max_retry"]:
            return False
        self.retired.add(i)
        self._ready.pop(i, None)
        if len(self.retired) == self.env_num:
            raise EnvManagerError(
                f"every env failed {self.config['max_retry']} times in a "
                f"row; restarts per env: {self.restarts}"
            )
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise EnvManagerError("the env manager is closed")

    def _check_launched(self) -> None:
        self._check_open()
        if not self._launched:
            raise EnvManagerError("call launch() first")


def overran(started: float, timeout: Optional[float]) -> bool:
    return timeout is not None and time.monotonic() - started > timeout
