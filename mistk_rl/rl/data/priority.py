"""Proportional prioritized sampling (Schaul et al. 2016), the one every prioritized replay
here uses: the DQN agent's `AdvancedReplayBuffer` and the Thinker model's window replay.

Index i is drawn with probability P(i) = p_i^alpha / sum_j p_j^alpha and weighted by
w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (p_i^alpha / min_j p_j^alpha)^-beta: N and the
total cancel, so a sum tree (drawing) and a min tree (the largest weight) are all it takes.
"""

from __future__ import annotations

import numpy as np

from mistk_rl.rl.data.segment_tree import MinSegmentTree, SumSegmentTree, last_occurrence


class PrioritySampler:
    """Priorities of `capacity` indices; an index is drawable from `add` until `remove`.

    `priority` holds each index's priority as last set (the learner's error plus EPSILON);
    new indices get the largest priority set so far (1.0 at first), so each is likely drawn
    once before its own error is known. alpha 0 draws uniformly and weighs every index 1.
    """

    EPSILON = 1e-6  # added to every updated priority: an exact estimate stays drawable

    def __init__(self, capacity: int, alpha: float) -> None:
        self.alpha = float(alpha)
        self.priority = np.zeros(capacity, dtype=np.float64)
        self.max_priority = 1.0
        self._sum = SumSegmentTree(capacity)
        self._min = MinSegmentTree(capacity)

    @property
    def total(self) -> float:
        """The drawable mass, sum of p^alpha: 0 when there is nothing to draw."""
        return self._sum.reduce()

    def drawable(self) -> np.ndarray:
        """A mask of the indices that can be drawn now."""
        return self._sum[np.arange(self._sum.capacity)] > 0

    def add(self, indices: np.ndarray) -> None:
        """Make `indices` drawable at the largest priority so far."""
        self._set(indices, np.full(len(indices), self.max_priority))

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set priorities (e.g. |TD error|, finite and >= 0) of drawable indices; a repeated
        index keeps its last one."""
        indices = np.asarray(indices, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise ValueError("priorities must be finite and >= 0")
        keep = last_occurrence(indices)
        if keep.size:
            priorities = priorities[keep] + self.EPSILON
            self.max_priority = max(self.max_priority, float(priorities.max()))
            self._set(indices[keep], priorities)

    def remove(self, indices: np.ndarray) -> None:
        """Never draw `indices` again (until `add`)."""
        self._sum[indices] = 0.0
        self._min[indices] = np.inf

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """`size` indices, stratified: one uniform point in each of `size` equal slices of
        the mass (lower variance than `size` free draws; a batch may hold an index twice)."""
        points = (np.arange(size) + rng.random(size)) * (self.total / size)
        return self._sum.find_prefixsum_idx(points)

    def weights(self, indices: np.ndarray, beta: float) -> np.ndarray:
        """Importance weights (N P(i))^-beta of drawn indices, divided by the largest any
        drawable index has (the least likely one's), so every weight is at most 1."""
        return (self._sum[indices] / self._min.reduce()) ** -beta

    def state_dict(self) -> dict:
        """The leaves (the trees are a pure function of them) and the priorities."""
        return {
            "priority": self.priority.copy(),
            "max_priority": self.max_priority,
            "sum_leaves": self._sum[np.arange(self._sum.capacity)],
        }

    def load_state_dict(self, state: dict) -> None:
        self.priority = np.array(state["priority"], dtype=np.float64)
        self.max_priority = float(state["max_priority"])
        leaves = np.asarray(state["sum_leaves"], dtype=np.float64)
        indices = np.arange(self._sum.capacity)
        self._sum[indices] = leaves
        self._min[indices] = np.where(leaves > 0, leaves, np.inf)

    def _set(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.priority[indices] = priorities
        leaves = priorities**self.alpha
        self._sum[indices] = leaves
        self._min[indices] = leaves
