"""An `OrchestratorVectorEnv` as Stable-Baselines3's `VecEnv`: SB3 takes gymnasium envs one
at a time (DummyVecEnv over N of them would start N orchestrators), so this lets SB3 step
all of one orchestrator's copies in one request. Needs the ``sb3`` extra.

    env = OrchestratorVecEnv(OrchestratorVectorEnv({"id": "CartPole-v1"}, num_envs=8))
    PPO("MlpPolicy", env).learn(100_000)

SB3's conventions over the vector env's: ``dones`` is terminated or truncated, and a copy
whose episode ended has its final observation in ``infos[i]["terminal_observation"]`` and
``infos[i]["TimeLimit.truncated"]`` when it was cut rather than ended (SB3 bootstraps
those); the observation returned is already the next episode's (both reset in the same
step). SB3's `seed(s)` seeds the next reset's copies ``s, s + 1, ...``, as the
orchestrator does.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from mistk_rl.bridges.gymnasium_env import OrchestratorVectorEnv


class OrchestratorVecEnv(VecEnv):
    """`venv` for SB3 (module doc); closing it closes `venv`."""

    def __init__(self, venv: OrchestratorVectorEnv) -> None:
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: Optional[np.ndarray] = None

    def reset(self) -> VecEnvObs:
        seed = self._seeds[0]  # (`seed` set them to s, s + 1, ...; else all None)
        obs, info = self.venv.reset(seed=seed)
        self._reset_seeds()
        self.reset_infos = self._split(info)
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait without step_async")
        obs, rewards, terminated, truncated, info = self.venv.step(self._actions)
        self._actions = None
        dones = terminated | truncated
        infos = self._split(info)
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = info["final_obs"][i]
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return obs, rewards.astype(np.float32), dones, infos

    def _split(self, info: dict[str, Any]) -> list[dict[str, Any]]:
        """The vector env's per-copy infos (action masks), one dict a copy."""
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if "action_mask" in info:
            for i in np.flatnonzero(info["_action_mask"]):
                infos[i]["action_mask"] = info["action_mask"][i]
        return infos

    def close(self) -> None:
        self.venv.close()

    # ---- what SB3 asks of the copies: they are one orchestrator's, not envs here --------
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        value = getattr(self.venv, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self.venv, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **kwargs: Any
    ) -> list[Any]:
        raise AttributeError(
            f"env_method({method_name!r}): the env copies live in an orchestrator, not here"
        )

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[Optional[np.ndarray]]:
        return [None for _ in range(self.num_envs)]
