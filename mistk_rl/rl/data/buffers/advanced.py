"""Prioritized replay with use-count and staleness limits, throughput control and statistics."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from mistk_rl.rl.data.buffers.base import Meta, Pushed, ReplayBuffer, as_transitions
from mistk_rl.rl.data.buffers.throughput import ThroughputController
from mistk_rl.rl.data.priority import PrioritySampler

_COUNTERS = (
    "pushed",
    "sampled",
    "removed_by_use",
    "removed_by_staleness",
    "refused_push",
    "refused_sample",
    "sample_calls",
)


class AdvancedReplayBuffer(ReplayBuffer):
    """FIFO ring with prioritized experience replay (Schaul et al. 2016) and data-quality rules.

    Sampling: a `PrioritySampler` over the slots (P(i) proportional to p_i^alpha, stratified,
    IS weights (N P(i))^-beta over their max); beta grows linearly from ``beta`` to 1 over
    ``anneal_step`` sample calls (0: fixed). New items get the largest priority seen so far.
    With ``priority: False`` every valid item weighs 1: uniform sampling, IS weights 1.

    Removal (an item is invalidated: leaf weight 0, never drawn again, not in ``count()``):
    - use: an item is returned by the sample in which its use count reaches ``max_use``, and
      never after;
    - staleness: at ``sample(size, learner_iter)`` every item whose
      ``learner_iter - collect_iter > max_staleness`` (strictly greater) is removed first.

    ``sample`` returns None when refused or short of data. Sampled items (and the columns of
    ``sample_batch``) carry meta keys: replay_unique_id, replay_buffer_idx, priority, IS, use
    (times sampled, this batch included), staleness (learner_iter - collect_iter).

    ``update`` finds an item's slot from its unique id alone (id k lives in slot k % size), so
    lookups are O(1); an update for an id that was overwritten or removed is ignored.
    """

    @classmethod
    def default_config(cls) -> dict:
        return {
            "replay_buffer_size": 4096,
            "max_use": float("inf"),
            "max_staleness": float("inf"),
            "alpha": 0.6,
            "beta": 0.4,
            "anneal_step": 100000,
            "priority": True,
            "thruput_controller": ThroughputController.default_config(),
            "monitor_statistics": True,
        }

    def __init__(
        self,
        config: dict | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(config, seed)
        self.takes_priority_feedback = bool(self.config["priority"])
        self._thruput = ThroughputController(self.config["thruput_controller"], clock)
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._reset_storage()
        self._last_sample: dict[str, float | None] = {"mean_use": None, "mean_staleness": None}

    # ----------------------------------------------------------------- interface
    def push(self, data: Pushed, collect_iter: int = 0) -> bool:
        """Store transitions at the current max priority; False if the rate limit refuses."""
        items = as_transitions(data)
        if not self._thruput.can_push(len(items)):
            self._counters["refused_push"] += 1
            return False
        self._thruput.record_push(len(items))
        slots = self._ring.put(items)
        self._use[slots] = 0
        self._collect_iter[slots] = collect_iter
        self._sampler.add(slots)
        self._counters["pushed"] += len(items)
        return True

    def update(self, info: dict) -> None:
        """Set priorities: ``{"replay_unique_id": [...], "priority": [...]}`` (list or array).

        ``"replay_buffer_idx"`` may be passed too (as sampled); the id alone locates the slot.
        Updates for ids no longer stored are ignored; a repeated id takes its last priority.
        """
        ids = np.asarray(info["replay_unique_id"], dtype=np.int64).ravel()
        priority = np.asarray(info["priority"], dtype=np.float64).ravel()
        if ids.shape != priority.shape:
            raise ValueError(f"update got {ids.size} ids and {priority.size} priorities")
        slots, live = self._ring.slots_of(ids)
        if "replay_buffer_idx" in info:
            live &= np.asarray(info["replay_buffer_idx"], dtype=np.int64).ravel() == slots
        self._sampler.update(slots[live], priority[live])

    def _draw(self, size: int, learner_iter: int) -> tuple[np.ndarray, Meta] | None:
        if size < 1:
            raise ValueError(f"sample size must be >= 1, got {size}")
        self._remove_stale(learner_iter)
        if not self._thruput.can_sample(size, self.count()):
            self._counters["refused_sample"] += 1
            return None
        slots = self._sampler.sample(size, self._rng)
        meta = {
            "replay_unique_id": self._ring.ids[slots],
            "replay_buffer_idx": slots,
            "priority": self._sampler.priority[slots],
            "IS": self._sampler.weights(slots, self.beta),
        }
        np.add.at(self._use, slots, 1)
        meta["use"] = use = self._use[slots]
        meta["staleness"] = staleness = learner_iter - self._collect_iter[slots]
        self._remove_used(slots)
        self._thruput.record_sample(size)
        self._counters["sampled"] += size
        self._counters["sample_calls"] += 1
        if self.config["monitor_statistics"]:
            self._last_sample = {
                "mean_use": float(use.mean()),
                "mean_staleness": float(staleness.mean()),
            }
        return slots, meta

    def clear(self) -> None:
        """Drop all data and priorities; counters, beta schedule and rate history remain."""
        self._ring.clear()
        self._reset_storage()

    def count(self) -> int:
        return self._ring.count()

    @property
    def beta(self) -> float:
        """IS exponent for the next sample: linear from ``beta`` to 1 over ``anneal_step``."""
        beta0, steps = self.config["beta"], self.config["anneal_step"]
        if not steps:
            return float(beta0)
        return float(min(1.0, beta0 + (1.0 - beta0) * self._counters["sample_calls"] / steps))

    def stats(self) -> dict:
        """Counters since creation plus the use/staleness means of the last sample.

        The means are None until a sample happened or when ``monitor_statistics`` is off.
        """
        counters = {k: v for k, v in self._counters.items() if k != "sample_calls"}
        return {
            "count": self.count(),
            **counters,
            **self._last_sample,
            "beta": self.beta,
            "max_priority": self._sampler.max_priority,
        }

    def state_dict(self) -> dict:
        return {
            "ring": self._ring.state_dict(),
            **self._sampler.state_dict(),  # priority, max_priority, sum_leaves
            "use": self._use.copy(),
            "collect_iter": self._collect_iter.copy(),
            "counters": dict(self._counters),
            "last_sample": dict(self._last_sample),
            "thruput": self._thruput.state_dict(),
            "rng": self._rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._ring.load_state_dict(state["ring"])
        self._sampler.load_state_dict(state)
        self._use = np.array(state["use"], dtype=np.int64)
        self._collect_iter = np.array(state["collect_iter"], dtype=np.int64)
        self._counters = dict(state["counters"])
        self._last_sample = dict(state["last_sample"])
        self._thruput.load_state_dict(state["thruput"])
        self._load_rng_state(state["rng"])

    # ----------------------------------------------------------------- internals
    def _reset_storage(self) -> None:
        size = self._ring.size
        # priority off: alpha 0 makes every leaf 1 (uniform draws, IS weights 1)
        alpha = self.config["alpha"] if self.config["priority"] else 0.0
        self._sampler = PrioritySampler(size, alpha)
        self._use = np.zeros(size, dtype=np.int64)
        self._collect_iter = np.zeros(size, dtype=np.int64)

    def _invalidate(self, slots: np.ndarray) -> None:
        self._ring.invalidate(slots)
        self._sampler.remove(slots)

    def _remove_used(self, slots: np.ndarray) -> None:
        used_up = np.unique(slots[self._use[slots] >= self.config["max_use"]])
        self._invalidate(used_up)
        self._counters["removed_by_use"] += len(used_up)

    def _remove_stale(self, learner_iter: int) -> None:
        stale = self._ring.valid & (
            learner_iter - self._collect_iter > self.config["max_staleness"]
        )
        slots = np.flatnonzero(stale)
        self._invalidate(slots)
        self._counters["removed_by_staleness"] += len(slots)
