"""Keeps the push/sample ratio of a shared buffer inside bounds when collectors and learner
run at their own pace (a learner outrunning its data overfits; a collector outrunning the
learner wastes data)."""

from __future__ import annotations

import time
from collections.abc import Callable

from mistk_rl.rl.config import deep_merge


class ThroughputController:
    """Exponentially decayed push and sample counts over a time window.

    Counts shrink by ``0.01 ** (elapsed / window_seconds)``: what happened one window ago
    weighs 1 %. A push of n is refused when ``(push + n) / sample > max`` (only once something
    was sampled); a sample of n when ``push / (sample + n) < min`` or when
    ``valid_count / n < sample_min_limit_ratio``. ``clock`` is injectable for tests.
    """

    @classmethod
    def default_config(cls) -> dict:
        return {
            "push_sample_rate_limit": {"max": float("inf"), "min": 0.0},
            "window_seconds": 30.0,
            "sample_min_limit_ratio": 1.0,
        }

    def __init__(
        self, config: dict | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = deep_merge(self.default_config(), config)
        if self.config["window_seconds"] <= 0:
            raise ValueError(f"window_seconds must be > 0, got {self.config['window_seconds']}")
        self._clock = clock
        self._last = clock()
        self.push_count = 0.0
        self.sample_count = 0.0

    def can_push(self, n: int) -> bool:
        self._decay()
        limit = self.config["push_sample_rate_limit"]["max"]
        return self.sample_count <= 0 or (self.push_count + n) / self.sample_count <= limit

    def can_sample(self, n: int, valid_count: int) -> bool:
        self._decay()
        if valid_count < 1 or valid_count / n < self.config["sample_min_limit_ratio"]:
            return False
        return (
            self.push_count / (self.sample_count + n)
            >= (self.config["push_sample_rate_limit"]["min"])
        )

    def record_push(self, n: int) -> None:
        self.push_count += n

    def record_sample(self, n: int) -> None:
        self.sample_count += n

    def state_dict(self) -> dict:
        self._decay()
        return {"push_count": self.push_count, "sample_count": self.sample_count}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts; decay restarts from now (another process has another clock)."""
        self.push_count = float(state["push_count"])
        self.sample_count = float(state["sample_count"])
        self._last = self._clock()

    def _decay(self) -> None:
        now = self._clock()
        factor = 0.01 ** (max(0.0, now - self._last) / self.config["window_seconds"])
        self.push_count *= factor
        self.sample_count *= factor
        self._last = now
