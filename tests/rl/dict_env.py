"""A tiny env with a Dict observation space, for the tests of dict observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictCue(gym.Env):
    """Each step shows the rewarded action in "planes" (uint8, plane a all ones, the other
    all zeros) next to a "noise" vector that says nothing; reward 1 for that action, else 0.
    Episodes last `length` steps, so a random policy scores length / 2."""

    def __init__(self, length: int = 8) -> None:
        self.length = length
        self.observation_space = spaces.Dict(
            {
                "noise": spaces.Box(-1.0, 1.0, (3,), np.float32),
                "planes": spaces.Box(0, 1, (2, 3, 3), np.uint8),
            }
        )
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.target)
        self.t += 1
        return self._observe(), reward, self.t >= self.length, False, {}

    def _observe(self) -> dict[str, np.ndarray]:
        self.target = int(self.np_random.integers(2))
        planes = np.zeros((2, 3, 3), np.uint8)
        planes[self.target] = 1
        noise = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return {"noise": noise, "planes": planes}


# importable id for services and their env workers: "tests.rl.dict_env:DictCue-v0"
if "DictCue-v0" not in gym.registry:
    gym.register("DictCue-v0", entry_point=DictCue)
