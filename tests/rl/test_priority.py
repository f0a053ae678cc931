"""PrioritySampler against brute force: draws, importance weights, priorities, state."""

from __future__ import annotations

import numpy as np
import pytest

from mistk_rl.rl.data.priority import PrioritySampler

EPS = PrioritySampler.EPSILON


def brute_draw(leaves: np.ndarray, size: int, u: np.ndarray) -> np.ndarray:
    """Stratified proportional draws by a cumulative sum: the first index whose running
    mass exceeds each point."""
    cumulative = np.cumsum(leaves)
    points = (np.arange(size) + u) * (cumulative[-1] / size)
    return np.searchsorted(cumulative, points, side="right")


def filled(capacity: int, alpha: float, seed: int) -> tuple[PrioritySampler, np.ndarray]:
    """A sampler with some indices removed and the rest at random priorities; also the
    brute-force leaves p^alpha (0 where not drawable)."""
    rng = np.random.default_rng(seed)
    sampler = PrioritySampler(capacity, alpha)
    sampler.add(np.arange(capacity))
    priorities = rng.exponential(size=capacity)
    sampler.update(np.arange(capacity), priorities)
    removed = rng.choice(capacity, capacity // 3, replace=False)
    sampler.remove(removed)
    leaves = (priorities + EPS) ** alpha
    leaves[removed] = 0.0
    return sampler, leaves


@pytest.mark.parametrize(
    "capacity, alpha, seed", [(1, 0.6, 0), (7, 0.6, 1), (64, 1.0, 2), (100, 0.4, 3), (33, 0.0, 4)]
)
def test_draws_and_weights_match_brute_force(capacity, alpha, seed):
    sampler, leaves = filled(capacity, alpha, seed)
    if capacity == 1:  # (capacity // 3 removed nothing)
        assert sampler.total == pytest.approx(leaves.sum())
    size = 16
    drawn = sampler.sample(size, np.random.default_rng(seed))
    expected = brute_draw(leaves, size, np.random.default_rng(seed).random(size))
    np.testing.assert_array_equal(drawn, expected)
    assert np.all(leaves[drawn] > 0)  # never a removed index
    live = leaves > 0
    probability = leaves[live] / leaves.sum()
    weight = np.zeros(capacity)
    weight[live] = (live.sum() * probability) ** -0.4
    weight /= weight.max()
    np.testing.assert_allclose(sampler.weights(drawn, 0.4), weight[drawn], rtol=1e-12)
    assert sampler.total == pytest.approx(leaves.sum(), rel=1e-12)
    np.testing.assert_array_equal(sampler.drawable(), leaves > 0)


def test_frequencies_follow_priority_to_the_alpha():
    sampler = PrioritySampler(5, alpha=0.5)
    sampler.add(np.arange(5))
    sampler.update(np.arange(5), [1.0, 4.0, 9.0, 0.0, 16.0])
    counts = np.bincount(sampler.sample(50_000, np.random.default_rng(0)), minlength=5)
    expected = np.sqrt(np.array([1.0, 4.0, 9.0, 0.0, 16.0]) + EPS)
    np.testing.assert_allclose(counts / counts.sum(), expected / expected.sum(), atol=0.005)


def test_new_indices_get_the_largest_priority_so_far():
    sampler = PrioritySampler(4, alpha=0.6)
    sampler.add(np.array([0, 1]))
    assert sampler.priority[[0, 1]].tolist() == [1.0, 1.0]  # nothing set yet: 1
    sampler.update(np.array([0]), np.array([5.0]))
    sampler.update(np.array([1]), np.array([2.0]))  # lower: the max stays
    sampler.add(np.array([2]))
    assert sampler.max_priority == sampler.priority[2] == pytest.approx(5.0 + EPS)
    assert sampler.weights(np.array([2]), 1.0)[0] == pytest.approx(
        ((2.0 + EPS) / (5.0 + EPS)) ** 0.6
    )  # the weight relative to the least likely


def test_a_repeated_index_keeps_its_last_priority_and_bad_priorities_are_refused():
    sampler = PrioritySampler(3, alpha=1.0)
    sampler.add(np.arange(3))
    sampler.update(np.array([1, 2, 1]), np.array([9.0, 2.0, 3.0]))
    assert sampler.priority.tolist() == pytest.approx([1.0, 3.0 + EPS, 2.0 + EPS])
    assert sampler.max_priority == pytest.approx(3.0 + EPS)  # the 9 was overwritten
    for bad in (np.nan, np.inf, -1.0):
        with pytest.raises(ValueError, match="finite and >= 0"):
            sampler.update(np.array([0]), np.array([bad]))
    sampler.update(np.array([], dtype=np.int64), np.array([]))  # nothing to do


def test_alpha_zero_is_uniform_with_unit_weights():
    sampler = PrioritySampler(4, alpha=0.0)
    sampler.add(np.arange(4))
    sampler.update(np.arange(4), [100.0, 1.0, 0.0, 5.0])
    drawn = sampler.sample(4, np.random.default_rng(0))
    assert sorted(drawn.tolist()) == [0, 1, 2, 3]  # equal slices: one each
    assert sampler.weights(drawn, 0.7).tolist() == [1.0] * 4


def test_removed_indices_are_never_drawn_and_nothing_left_means_no_mass():
    sampler = PrioritySampler(6, alpha=0.6)
    sampler.add(np.arange(6))
    sampler.remove(np.array([0, 2, 3, 5]))
    assert set(sampler.sample(200, np.random.default_rng(1)).tolist()) == {1, 4}
    sampler.remove(np.array([1, 4]))
    assert sampler.total == 0.0 and not sampler.drawable().any()


def test_a_restored_sampler_draws_and_weighs_the_same():
    original, _ = filled(50, 0.6, seed=5)
    restored = PrioritySampler(50, 0.6)
    restored.load_state_dict(original.state_dict())
    for seed in range(3):
        drawn = original.sample(32, np.random.default_rng(seed))
        np.testing.assert_array_equal(restored.sample(32, np.random.default_rng(seed)), drawn)
        np.testing.assert_array_equal(restored.weights(drawn, 0.5), original.weights(drawn, 0.5))
    restored.add(np.array([0]))
    original.add(np.array([0]))
    assert restored.priority[0] == original.priority[0] == original.max_priority
