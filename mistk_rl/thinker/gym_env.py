"""One env behind the Thinker MDP as a gymnasium env: how the gym orchestrator serves it.

The observation is the dict ``{"tree_reps", "real_states"}``; the action is one integer of
Discrete(2A), ``reset * A + primary`` (so the first A actions keep walking and the last A walk
then return to the root), or a pair of MultiDiscrete([A, 2]). The reward and the episode's end
come on real steps only; ``info["real_step"]`` says which steps those are, so a caller can
count real env steps for its budgets; ``info["im_reward"]`` is the planning reward.

An episode's end returns the final state (a tree rooted at the last real frame, which a
truncated episode bootstraps from) and waits for reset(), as gymnasium envs do: the MDP runs
with auto_reset off, not the seed's way of resetting inside the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from mistk_rl.rl.envs.base import make_env_fns
from mistk_rl.thinker.config import load_config
from mistk_rl.thinker.env import STATUS_REAL, ThinkerEnv

ACTION_FORMATS = ("Discrete", "MultiDiscrete")


class ThinkerGymEnv(gym.Env):
    def __init__(
        self,
        env_id: str,
        env_kwargs: Optional[dict[str, Any]] = None,
        thinker: Optional[dict[str, Any]] = None,
        actions: str = "Discrete",
    ) -> None:
        if actions not in ACTION_FORMATS:
            raise ValueError(f"Thinker actions are {' or '.join(ACTION_FORMATS)}, not {actions!r}")
        # (gym.make imports the module of a "module:EnvId" id itself)
        self.mdp = ThinkerEnv(
            make_env_fns(env_id, env_kwargs, 1), load_config(thinker or {}), auto_reset=False
        )
        self.num_actions = a = self.mdp.num_actions
        self.observation_space = self.mdp.observation_space
        self.action_space = (
            gym.spaces.Discrete(2 * a)
            if actions == "Discrete"
            else gym.spaces.MultiDiscrete([a, 2])
        )

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        return _first(self.mdp.reset(seed=seed)), {}

    def step(self, action: Any):
        primary, reset = self.split(action)
        state, reward, done, info = self.mdp.step([primary], [reset])
        truncated = bool(info["truncated_done"][0])
        terminated = bool(done[0]) and not truncated
        single = {k: (v[0].item() if isinstance(v, np.ndarray) else v) for k, v in info.items()}
        single["real_step"] = single["step_status"] == STATUS_REAL
        return _first(state), float(reward[0]), terminated, truncated, single

    def split(self, action: Any) -> tuple[int, int]:
        """(primary, reset) of an action in this env's action space."""
        if isinstance(self.action_space, gym.spaces.MultiDiscrete):
            primary, reset = (int(x) for x in np.asarray(action).reshape(2))
            return primary, reset
        return int(action) % self.num_actions, int(action) // self.num_actions

    def close(self) -> None:
        self.mdp.close()


def _first(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: value[0] for key, value in state.items()}


@dataclass(frozen=True)
class ThinkerEnvFactory:
    """A picklable env_fn (subprocess env workers need one)."""

    env_id: str
    env_kwargs: tuple
    thinker: tuple
    actions: str = "Discrete"

    def __call__(self) -> ThinkerGymEnv:
        return ThinkerGymEnv(self.env_id, dict(self.env_kwargs), dict(self.thinker), self.actions)
