"""A 7-cell chain with clone/restore and a table value-policy function: small enough to
compute the Thinker tree's statistics by hand."""

from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

CELLS = 7
START = 3
REWARDS = np.array([1.0, 0.0, 0.25, 0.0, 0.5, 0.0, 2.0])  # for entering each cell
VALUES = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.0])  # the table value function
LOGITS = np.array([[0.1 * c, -0.1 * c] for c in range(CELLS)], dtype=np.float32)


class Chain(gym.Env):
    """Cells 0..6, start at 3; action 0 moves left, 1 right; entering cell c pays
    REWARDS[c]; the ends are terminal; `cap` steps truncate. Observation: the one-hot cell."""

    def __init__(self, cap: int = 20) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (CELLS,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cap = cap
        self.pos, self.steps = START, 0
        self.real_steps = 0  # steps taken, restored or not: imagination included

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.pos, self.steps = START, 0
        return self._obs(), {}

    def step(self, action):
        self.real_steps += 1
        self.pos += 1 if int(action) == 1 else -1
        self.steps += 1
        terminated = self.pos in (0, CELLS - 1)
        truncated = not terminated and self.steps >= self.cap
        return self._obs(), float(REWARDS[self.pos]), terminated, truncated, {}

    def _obs(self) -> np.ndarray:
        return np.eye(CELLS, dtype=np.float32)[self.pos]

    def clone_state(self) -> tuple[int, int]:
        return self.pos, self.steps

    def restore_state(self, state: tuple[int, int]) -> None:
        self.pos, self.steps = state


def table_vp(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """v and logits of each cell, looked up from the one-hot observations."""
    cells = np.asarray(obs).argmax(axis=1)
    return VALUES[cells], LOGITS[cells]
