"""Segment trees against brute force on the leaves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistk_rl.rl.data.segment_tree import MinSegmentTree, SumSegmentTree, last_occurrence

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def trees_with_updates(draw):
    """A capacity and a few batched updates (with repeated indices) of small integers.

    Integer values keep every sum exact, so the tree can be compared with == to numpy.
    """
    capacity = draw(st.integers(1, 40))
    updates = draw(
        st.lists(
            st.lists(
                st.tuples(st.integers(0, capacity - 1), st.integers(0, 9)), min_size=1, max_size=12
            ),
            min_size=1,
            max_size=5,
        )
    )
    return capacity, updates


def build(tree_cls, capacity, updates):
    tree, leaves = tree_cls(capacity), np.full(capacity, tree_cls(1).reduce())
    for batch in updates:
        idx = np.array([i for i, _ in batch])
        values = np.array([v for _, v in batch], dtype=float)
        tree[idx] = values
        for i, v in batch:  # brute force: sequential writes, the last one wins
            leaves[i] = v
    return tree, leaves


@SETTINGS
@given(trees_with_updates(), st.data())
def test_sum_tree_matches_brute_force(case, data):
    capacity, updates = case
    tree, leaves = build(SumSegmentTree, capacity, updates)
    np.testing.assert_array_equal(tree[np.arange(capacity)], leaves)
    start = data.draw(st.integers(0, capacity))
    end = data.draw(st.integers(start, capacity))
    assert tree.reduce(start, end) == leaves[start:end].sum()
    assert tree.reduce() == leaves.sum()


@SETTINGS
@given(trees_with_updates(), st.data())
def test_min_tree_matches_brute_force(case, data):
    capacity, updates = case
    tree, leaves = build(MinSegmentTree, capacity, updates)
    start = data.draw(st.integers(0, capacity - 1))
    end = data.draw(st.integers(start + 1, capacity))
    assert tree.reduce(start, end) == leaves[start:end].min()
    assert tree.reduce() == leaves.min()
    assert tree.reduce(start, start) == np.inf  # empty range: the neutral element


@SETTINGS
@given(trees_with_updates(), st.data())
def test_prefixsum_search_matches_searchsorted(case, data):
    capacity, updates = case
    tree, leaves = build(SumSegmentTree, capacity, updates)
    total = leaves.sum()
    if total == 0:
        return
    # Half-integers and the integers themselves (the slice boundaries), all exact in float.
    queries = (
        np.array(data.draw(st.lists(st.integers(0, int(2 * total) - 1), min_size=1, max_size=20)))
        / 2.0
    )
    expected = np.searchsorted(np.cumsum(leaves), queries, side="right")
    np.testing.assert_array_equal(tree.find_prefixsum_idx(queries), expected)
    assert np.all(leaves[tree.find_prefixsum_idx(queries)] > 0)


def test_prefixsum_at_or_past_total_lands_on_last_positive_leaf():
    tree = SumSegmentTree(6)
    tree[np.arange(4)] = [1.0, 0.0, 2.0, 0.0]  # leaves 3..5 (and the padding) are empty
    np.testing.assert_array_equal(tree.find_prefixsum_idx(np.array([3.0, 3.5, 1e9])), [2, 2, 2])
    np.testing.assert_array_equal(tree.find_prefixsum_idx(np.array([0.0, 1.0])), [0, 2])


def test_scalar_access_and_capacity_rounding():
    tree = SumSegmentTree(5)  # 8 leaves inside, 5 addressable
    tree[3] = 2.5
    assert tree[3] == 2.5 and isinstance(tree[3], float)
    assert tree.reduce() == 2.5 and tree.reduce(0, 3) == 0.0
    with pytest.raises(IndexError):
        tree[5] = 1.0
    with pytest.raises(IndexError):
        tree.reduce(0, 6)
    one = MinSegmentTree(1)
    one[0] = 4.0
    assert one.reduce() == 4.0


def test_last_occurrence():
    np.testing.assert_array_equal(np.sort(last_occurrence(np.array([3, 1, 3, 2, 1]))), [2, 3, 4])
