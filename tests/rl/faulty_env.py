"""Envs for supervision tests (picklable factories, importable by subprocess workers)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym


class FaultyCartPole(gym.Wrapper):
    """CartPole that fails once, at step `at`: raises, exits the process, or hangs. The
    marker file makes the failure happen once across restarts (and processes)."""

    def __init__(self, mode: str, at: int, marker: Path, always: bool = False) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.mode, self.at, self.marker, self.always = mode, at, Path(marker), always
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at and (self.always or self._first_to_fail()):
            if self.mode == "raise":
                raise RuntimeError("injected env failure")
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "hang":
                time.sleep(30)
            if self.mode == "hang-short":  # overruns a 0.2 s timeout, then returns
                time.sleep(0.5)
        return self.env.step(action)

    def _first_to_fail(self) -> bool:
        """Atomic across processes: only one env (of many stepping at once) fails."""
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


class SlowCartPole(gym.Wrapper):
    """CartPole whose every step takes `delay` seconds (a stand-in for an expensive env)."""

    def __init__(self, delay: float) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)


@dataclass(frozen=True)
class Faulty:
    mode: str
    at: int
    marker: str
    always: bool = False

    def __call__(self):
        return FaultyCartPole(self.mode, self.at, Path(self.marker), self.always)


@dataclass(frozen=True)
class Slow:
    delay: float

    def __call__(self):
        return SlowCartPole(self.delay)


# importable id for services and their env workers: "tests.rl.faulty_env:FaultyCartPole-v0"
if "FaultyCartPole-v0" not in gym.registry:
    gym.register("FaultyCartPole-v0", entry_point=FaultyCartPole)
