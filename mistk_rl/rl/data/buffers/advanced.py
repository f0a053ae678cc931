"""Prioritized replay with use-count and staleness limits, throughput control and statistics."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from mistk_rl.rl.data.buffers.base import Meta, TransitionReplayBuffer, as_transitions
from mistk_rl.rl.data.buffers.throughput import ThroughputController
from mistk_rl.rl.data.segment_tree import MinSegmentTree, SumSegmentTree, last_occurrence

_COUNTERS = ("pushed", "sampled", "removed_by_use", "removed_by_staleness", "refused_push",
             "refused_sample", "sample_calls")


class AdvancedReplayBuffer(TransitionReplayBuffer):
    """FIFO ring with prioritized experience replay (Schaul et al. 2016) and data-quality rules.

    Sampling: item i is drawn with probability P(i) = p_i^alpha / sum_j p_j^alpha by stratified
    sampling (one uniform draw in each of ``size`` equal slices of the total mass, so a batch
    may hold an item twice) and weighted by w_i = (N P(i))^-beta / max_j (N P(j))^-beta. beta
    grows linearly from ``beta`` to 1 over ``anneal_step`` sample calls (0: fixed). New items
    get the largest priority seen so far (1.0 at first) so each is likely seen once. With
    ``priority: False`` every valid item weighs 1: uniform sampling, IS weights 1.

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

    EPSILON = 1e-6  # added to updated priorities so no item becomes impossible to draw

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

    def __init__(self, config: dict | None = None, seed: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, seed)
        self.takes_priority_feedback = bool(self.config["priority"])
        self._thruput = ThroughputController(self.config["thruput_controller"], clock)
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._reset_storage()
        self._last_sample: dict[str, float | None] = {"mean_use": None, "mean_staleness": None}

    # ----------------------------------------------------------------- interface
    def push(self, data: dict | list[dict], collect_iter: int = 0) -> bool:
        """Store transitions at the current max priority; False if the rate limit refuses."""
        items = as_transitions(data)
        if not self._thruput.can_push(len(items)):
            self._counters["refused_push"] += 1
            return False
        self._thruput.record_push(len(items))
        slots = self._ring.put(items)
        self._use[slots] = 0
        self._collect_iter[slots] = collect_iter
        self._set_priority(slots, np.full(len(slots), self._max_priority))
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
        if not np.all(np.isfinite(priority) & (priority >= 0)):
            raise ValueError("priorities must be finite and >= 0")
        slots, live = self._ring.slots_of(ids)
        if "replay_buffer_idx" in info:
            live &= np.asarray(info["replay_buffer_idx"], dtype=np.int64).ravel() == slots
        keep = last_occurrence(ids)
        keep = keep[live[keep]]
        if keep.size:
            priority = priority[keep] + self.EPSILON
            self._max_priority = max(self._max_priority, float(priority.max()))
            self._set_priority(slots[keep], priority)

    def _draw(self, size: int, learner_iter: int) -> tuple[np.ndarray, Meta] | None:
        if size < 1:
            raise ValueError(f"sample size must be >= 1, got {size}")
        self._remove_stale(learner_iter)
        if not self._thruput.can_sample(size, self.count()):
            self._counters["refused_sample"] += 1
            return None
        slots = self._stratified_slots(size)
        meta = {"replay_unique_id": self._ring.ids[slots], "replay_buffer_idx": slots,
                "priority": self._priority[slots], "IS": self._importance_weights(slots)}
        np.add.at(self._use, slots, 1)
        meta["use"] = use = self._use[slots]
        meta["staleness"] = staleness = learner_iter - self._collect_iter[slots]
        self._remove_used(slots)
        self._thruput.record_sample(size)
        self._counters["sampled"] += size
        self._counters["sample_calls"] += 1
        if self.config["monitor_statistics"]:
            self._last_sample = {"mean_use": float(use.mean()),
                                 "mean_staleness": float(staleness.mean())}
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
        return {"count": self.count(), **counters, **self._last_sample, "beta": self.beta,
                "max_priority": self._max_priority}

    def state_dict(self) -> dict:
        leaves = np.arange(self._ring.size)
        return {
            "ring": self._ring.state_dict(),
            "priority": self._priority.copy(),
            "use": self._use.copy(),
            "collect_iter": self._collect_iter.copy(),
            "sum_leaves": self._sum_tree[leaves],
            "min_leaves": self._min_tree[leaves],
            "max_priority": self._max_priority,
            "counters": dict(self._counters),
            "last_sample": dict(self._last_sample),
            "thruput": self._thruput.state_dict(),
            "rng": self._rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._ring.load_state_dict(state["ring"])
        self._priority = np.array(state["priority"], dtype=np.float64)
        self._use = np.array(state["use"], dtype=np.int64)
        self._collect_iter = np.array(state["collect_iter"], dtype=np.int64)
        leaves = np.arange(self._ring.size)
        self._sum_tree[leaves] = state["sum_leaves"]
        self._min_tree[leaves] = state["min_leaves"]
        self._max_priority = float(state["max_priority"])
        self._counters = dict(state["counters"])
        self._last_sample = dict(state["last_sample"])
        self._thruput.load_state_dict(state["thruput"])
        self._load_rng_state(state["rng"])

    # ----------------------------------------------------------------- internals
    def _reset_storage(self) -> None:
        size = self._ring.size
        self._sum_tree = SumSegmentTree(size)
        self._min_tree = MinSegmentTree(size)
        self._priority = np.zeros(size, dtype=np.float64)
        self._use = np.zeros(size, dtype=np.int64)
        self._collect_iter = np.zeros(size, dtype=np.int64)
        self._max_priority = 1.0

    def _set_priority(self, slots: np.ndarray, priority: np.ndarray) -> None:
        self._priority[slots] = priority
        leaf = priority ** self.config["alpha"] if self.config["priority"] else 1.0
        self._sum_tree[slots] = leaf
        self._min_tree[slots] = leaf

    def _invalidate(self, slots: np.ndarray) -> None:
        self._ring.valid[slots] = False
        self._sum_tree[slots] = 0.0
        self._min_tree[slots] = np.inf

    def _stratified_slots(self, size: int) -> np.ndarray:
        """Stratified: one uniform point in each of ``size`` equal slices of the total mass."""
        total = self._sum_tree.reduce()
        points = (np.arange(size) + self._rng.random(size)) * (total / size)
        return self._sum_tree.find_prefixsum_idx(points)

    def _importance_weights(self, slots: np.ndarray) -> np.ndarray:
        # (N P_i)^-beta / (N P_min)^-beta = (leaf_i / leaf_min)^-beta: N and the total cancel.
        return (self._sum_tree[slots] / self._min_tree.reduce()) ** -self.beta

    def _remove_used(self, slots: np.ndarray) -> None:
        used_up = np.unique(slots[self._use[slots] >= self.config["max_use"]])
        self._invalidate(used_up)
        self._counters["removed_by_use"] += len(used_up)

    def _remove_stale(self, learner_iter: int) -> None:
        stale = self._ring.valid & (
            learner_iter - self._collect_iter > self.config["max_staleness"])
        slots = np.flatnonzero(stale)
        self._invalidate(slots)
        self._counters["removed_by_staleness"] += len(slots)
