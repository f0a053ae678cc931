"""FIFO replay with uniform sampling: the baseline buffer for off-policy learners."""

from __future__ import annotations

import numpy as np

from mistk_rl.rl.data.buffers.base import Meta, Pushed, ReplayBuffer, as_transitions


class NaiveReplayBuffer(ReplayBuffer):
    """A ring of ``replay_buffer_size`` transitions; the oldest is overwritten first.

    ``sample(size)`` draws ``size`` distinct items uniformly (without replacement, so a batch
    never holds the same transition twice) and returns None when fewer than ``size`` are
    stored; collect more data (e.g. a random warm-up) before training.
    """

    @classmethod
    def default_config(cls) -> dict:
        return {"replay_buffer_size": 10000}

    def push(self, data: Pushed, collect_iter: int = 0) -> bool:
        """Store one transition dict or a list of them; never refuses."""
        self._ring.put(as_transitions(data))
        return True

    def update(self, info: dict) -> None:
        """Nothing to update: sampling ignores priorities."""

    def clear(self) -> None:
        self._ring.clear()

    def count(self) -> int:
        return self._ring.count()

    def state_dict(self) -> dict:
        return {"ring": self._ring.state_dict(), "rng": self._rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self._ring.load_state_dict(state["ring"])
        self._load_rng_state(state["rng"])

    def _draw(self, size: int, learner_iter: int) -> tuple[np.ndarray, Meta] | None:
        slots = self._uniform_slots(size)
        if slots is None:
            return None
        return slots, {"replay_unique_id": self._ring.ids[slots], "replay_buffer_idx": slots}

    def _uniform_slots(self, size: int) -> np.ndarray | None:
        if size < 1:
            raise ValueError(f"sample size must be >= 1, got {size}")
        # nothing here invalidates single items, so the valid ones are the newest `count`
        # ids: draw offsets among them instead of listing every valid slot per sample
        count = self._ring.count()
        if size > count:
            return None
        offsets = self._rng.choice(count, size, replace=False)
        return (self._ring.next_id - count + offsets) % self._ring.size
