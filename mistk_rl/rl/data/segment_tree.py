"""Array-based segment trees for prioritized replay.

The tree lives in one flat array: node 1 is the root, node i has children 2i and 2i+1, and
the leaves occupy [size, 2 * size) where size is the capacity rounded up to a power of two.
Every parent is recomputed from its two children (never patched with a delta), so the whole
tree is a pure function of its leaves: rebuilding it from saved leaves is bit-identical.
Batched writes and prefix-sum searches walk the levels with numpy, never per element.
"""

from __future__ import annotations

from typing import overload

import numpy as np

IndexLike = int | np.integer | np.ndarray | list[int]


def last_occurrence(indices: np.ndarray) -> np.ndarray:
    """Positions of the last occurrence of each distinct index.

    numpy does not define which write wins when a fancy assignment repeats an index; picking
    the last occurrence ourselves gives "last write wins" on every platform.
    """
    reversed_first = np.unique(indices[::-1], return_index=True)[1]
    return len(indices) - 1 - reversed_first


class SegmentTree:
    """Binary tree whose internal nodes hold ``op`` over their leaves.

    Args:
        capacity: number of leaves users may address (indices 0 .. capacity - 1).
        op: a binary numpy ufunc that is associative and commutative (np.add, np.minimum).
        neutral: the identity of ``op``; unused leaves hold it, so they never affect results.
    """

    def __init__(self, capacity: int, op: np.ufunc, neutral: float) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._size = 1 << (self.capacity - 1).bit_length()  # power of two >= capacity
        self._op = op
        self._neutral = float(neutral)
        self._tree = np.full(2 * self._size, self._neutral, dtype=np.float64)

    def _leaves(self, idx: IndexLike) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"segment tree indices must be integers, got dtype {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"segment tree index out of range [0, {self.capacity})")
        return idx.astype(np.int64) + self._size

    def __setitem__(self, idx: IndexLike, values: float | np.ndarray) -> None:
        nodes = self._leaves(idx)
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), nodes.shape).ravel()
        nodes = nodes.ravel()
        if nodes.size == 0:
            return
        keep = last_occurrence(nodes)
        nodes = nodes[keep]
        self._tree[nodes] = values[keep]
        while nodes[0] > 1:  # all nodes sit on the same level; climb one level per pass
            nodes = np.unique(nodes // 2)
            self._tree[nodes] = self._op(self._tree[2 * nodes], self._tree[2 * nodes + 1])

    @overload
    def __getitem__(self, idx: int | np.integer) -> float: ...
    @overload
    def __getitem__(self, idx: np.ndarray | list[int]) -> np.ndarray: ...
    def __getitem__(self, idx: IndexLike) -> float | np.ndarray:
        """A leaf's value for an integer, an array of them for an index array (a 0-d one: a
        float)."""
        values = self._tree[self._leaves(idx)]
        return float(values) if np.ndim(values) == 0 else values.copy()

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """``op`` over leaves [start, end); the neutral element for an empty range."""
        end = self.capacity if end is None else end
        if not 0 <= start <= end <= self.capacity:
            raise IndexError(f"bad range [{start}, {end}) for capacity {self.capacity}")
        if start == 0 and end >= self.capacity:
            return float(self._tree[1])  # padding leaves hold the neutral element
        result = self._neutral
        lo, hi = start + self._size, end + self._size
        while lo < hi:  # classic bottom-up walk: O(log n) nodes
            if lo & 1:
                result = self._op(result, self._tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                result = self._op(result, self._tree[hi])
            lo, hi = lo // 2, hi // 2
        return float(result)


class SumSegmentTree(SegmentTree):
    """Sum tree over non-negative leaves, with vectorised prefix-sum search."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def find_prefixsum_idx(self, prefixsums: np.ndarray | float) -> np.ndarray:
        """Leaf i with sum(leaves[:i]) <= p < sum(leaves[:i + 1]), for every p at once.

        The search never steps into a subtree of zero mass, so a query at or beyond the
        total (float rounding in callers can produce one) lands on the last positive leaf
        instead of an empty slot; results are clamped to [0, capacity).
        """
        remaining = np.atleast_1d(np.asarray(prefixsums, dtype=np.float64)).copy()
        nodes = np.ones(remaining.shape, dtype=np.int64)
        for _ in range(self._size.bit_length() - 1):  # one pass per level, all queries
            left = 2 * nodes
            left_sum = self._tree[left]
            go_right = (remaining >= left_sum) & (self._tree[left + 1] > 0)
            remaining = np.where(go_right, remaining - left_sum, remaining)
            nodes = np.where(go_right, left + 1, left)
        return np.clip(nodes - self._size, 0, self.capacity - 1)


class MinSegmentTree(SegmentTree):
    """Min tree; ``reduce`` gives the minimum leaf (``inf`` when the range is empty)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, float("inf"))
