"""`BaseEnvManager`: every env in the caller's thread, one after another.

The cheapest manager for envs that step in microseconds (no process hop at all). Its limit is
honest: Python cannot interrupt a call that hangs in the same process, so a step or reset that
overruns its timeout is only noticed when it returns; it is then reported as abnormal and the
env restarted. Use a subprocess manager for envs that may hang for good.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from mistk_rl.rl.envs.base import EnvManager, Timestep, overran


class BaseEnvManager(EnvManager):
    def _launch(self) -> None:
        self.envs = [fn() for fn in self.env_fns]

    def _reset(
        self, ids: list[int], seeds: dict[int, Optional[int]]
    ) -> dict[int, tuple[Any, dict]]:
        out = {}
        for i in ids:
            try:
                out[i] = self._reset_one(i, seeds.get(i))
            except Exception as exc:  # noqa: BLE001 - a broken env is restarted, not fatal
                self._abnormal(i, f"reset failed: {type(exc).__name__}: {exc}")
                restarted = self._restart(i)
                if restarted is not None:
                    out[i] = restarted
        return out

    def _step(self, actions: dict[int, Any]) -> dict[int, Timestep]:
        out = {}
        for i, action in actions.items():
            started = time.monotonic()
            try:
                obs, reward, terminated, truncated, info = self.envs[i].step(action)
                if overran(started, self.config["step_timeout"]):
                    raise TimeoutError(
                        f"step took {time.monotonic() - started:.2f} s, over "
                        f"step_timeout {self.config['step_timeout']} s"
                    )
            except Exception as exc:  # noqa: BLE001
                out[i] = self._failed(i, f"{type(exc).__name__}: {exc}")
                continue
            out[i] = Timestep(obs, float(reward), bool(terminated), bool(truncated), info)
            if terminated or truncated:
                restarted = self._reset([i], {}).get(i)  # auto-reset; failure restarts the env
                if restarted is None:
                    continue
                obs, info = restarted
            self._ready[i], self._info[i] = obs, info
        return out

    def _reset_one(self, i: int, seed: Optional[int]) -> tuple[Any, dict]:
        started = time.monotonic()
        obs, info = self.envs[i].reset(seed=seed)
        if overran(started, self.config["reset_timeout"]):
            raise TimeoutError(f"reset took {time.monotonic() - started:.2f} s")
        return obs, info

    def _restart(self, i: int) -> Optional[tuple[Any, dict]]:
        """Replace env i with a new copy and reset it; None if it was retired instead."""
        while not self._give_up(i):
            try:
                self.envs[i].close()
            except Exception:  # noqa: BLE001 - it is broken already
                pass
            try:
                self.envs[i] = self.env_fns[i]()
                obs, info = self._reset_one(i, self._env_seed(i))
                self._last_obs[i] = obs
                return obs, info
            except Exception as exc:  # noqa: BLE001
                self._abnormal(i, f"restart failed: {type(exc).__name__}: {exc}")
        return None

    def _close(self) -> None:
        for env in getattr(self, "envs", []):
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
