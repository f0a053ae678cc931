"""n-step transitions and GAE against values worked out by hand and a direct reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistk_rl.rl.data.returns import gae
from tests.rl.nstep_reference import NStepAccumulator


def nstep_transitions(trajectory: list[dict], n: int, gamma: float) -> list[dict]:
    """The n-step items of a whole trajectory, as `NStepAccumulator` streams them: every
    step pushed, then a flush (the trajectory's end cuts the last episode)."""
    acc = NStepAccumulator(n, gamma)
    return [item for transition in trajectory for item in acc.push(transition)] + acc.flush()


def reference(trajectory: list[dict], n: int, gamma: float) -> list[dict]:
    """Brute force: from each step, sum discounted rewards until n steps, an episode end or
    the trajectory's end."""
    out = []
    for t, first in enumerate(trajectory):
        reward, m = 0.0, 0
        while True:
            last = trajectory[t + m]
            reward += gamma**m * float(last["reward"])
            m += 1
            if m == n or last["terminated"] or last["truncated"] or t + m == len(trajectory):
                break
        out.append(
            {
                **first,
                "reward": reward,
                "next_obs": last["next_obs"],
                "terminated": bool(last["terminated"]),
                "truncated": bool(last["truncated"]),
                "gamma_n": gamma**m,
            }
        )
    return out


def step(t: int, reward: float, terminated: bool = False, truncated: bool = False) -> dict:
    return {
        "obs": t,
        "action": t % 2,
        "reward": reward,
        "next_obs": t + 1,
        "terminated": terminated,
        "truncated": truncated,
        "info": f"step{t}",
    }


def test_nstep_two_episodes_by_hand():
    # gamma 0.5, n 3. Episode A: steps 0..3, rewards 1 2 4 8, terminated at step 3.
    # Episode B: steps 4..5, rewards 16 32, the trajectory stops without an episode end.
    trajectory = [
        step(0, 1),
        step(1, 2),
        step(2, 4),
        step(3, 8, terminated=True),
        step(4, 16),
        step(5, 32),
    ]
    out = nstep_transitions(trajectory, n=3, gamma=0.5)
    # (reward, next_obs, terminated, gamma_n):
    expected = [
        (1 + 0.5 * 2 + 0.25 * 4, 3, False, 0.125),  # 3.0, full window 0..2
        (2 + 0.5 * 4 + 0.25 * 8, 4, True, 0.125),  # 6.0, window 1..3 ends in termination
        (4 + 0.5 * 8, 4, True, 0.25),  # 8.0, m = 2 (episode ends)
        (8, 4, True, 0.5),  # m = 1
        (16 + 0.5 * 32, 6, False, 0.25),  # 32.0, m = 2 (trajectory ends)
        (32, 6, False, 0.5),
    ]
    assert [(o["reward"], o["next_obs"], o["terminated"], o["gamma_n"]) for o in out] == expected
    assert [(o["obs"], o["action"], o["info"]) for o in out] == [
        (t, t % 2, f"step{t}") for t in range(6)
    ]
    assert not any(o["truncated"] for o in out)


def test_nstep_truncation_keeps_bootstrap():
    # gamma 0.9, n 3, the episode is truncated at step 1: item 0 = 1 + 0.9 * 1 = 1.9 with
    # gamma_n 0.81 and terminated False, so the learner still bootstraps from next_obs 2.
    out = nstep_transitions([step(0, 1), step(1, 1, truncated=True), step(2, 5)], 3, 0.9)
    assert out[0]["reward"] == pytest.approx(1.9) and out[0]["gamma_n"] == pytest.approx(0.81)
    assert (out[0]["next_obs"], out[0]["terminated"], out[0]["truncated"]) == (2, False, True)
    assert (out[1]["reward"], out[1]["gamma_n"]) == (1.0, 0.9)
    assert (out[2]["reward"], out[2]["next_obs"], out[2]["gamma_n"]) == (5.0, 3, 0.9)
    assert nstep_transitions([], 3, 0.9) == []
    with pytest.raises(ValueError):
        nstep_transitions([step(0, 1)], 0, 0.9)


def test_accumulator_emits_as_windows_complete():
    acc = NStepAccumulator(n=2, gamma=0.5)
    assert acc.push(step(0, 1)) == []
    first = acc.push(step(1, 2))  # window 0..1 is full: 1 + 0.5 * 2 = 2
    assert [(o["obs"], o["reward"]) for o in first] == [(0, 2.0)]
    done = acc.push(step(2, 4, terminated=True))  # flushes 1..2 and 2..2
    assert [(o["obs"], o["reward"], o["gamma_n"]) for o in done] == [(1, 4.0, 0.25), (2, 4.0, 0.5)]
    assert len(acc) == 0 and acc.flush() == []


stream = st.lists(
    st.tuples(st.integers(-3, 3), st.booleans(), st.booleans(), st.booleans()), max_size=30
)


@settings(max_examples=100, deadline=None)
@given(stream, st.integers(1, 5), st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
def test_accumulator_equals_the_reference(rows, n, gamma):
    # Each row: reward, terminated, truncated, and whether the stream is cut after it.
    trajectory = [
        step(t, r, terminated=term and t % 3 == 0, truncated=trunc and t % 4 == 1)
        for t, (r, term, trunc, _) in enumerate(rows)
    ]
    cuts = [t + 1 for t, row in enumerate(rows) if row[3]]
    acc = NStepAccumulator(n, gamma)
    streamed, expected, start = [], [], 0
    for t, transition in enumerate(trajectory):
        streamed += acc.push(transition)
        if t + 1 in cuts or t + 1 == len(trajectory):  # a cut: flush, compare per piece
            streamed += acc.flush()
            expected += reference(trajectory[start : t + 1], n, gamma)
            start = t + 1
    assert streamed == expected
    assert len(streamed) == len(trajectory)


def test_gae_by_hand():
    # gamma 0.5, lam 0.5 (so gamma * lam = 0.25), rewards 1, values 0.5 1 2, next 1 2 4:
    # delta = 1 + 0.5 * next - value = 1.0 at every step.
    rewards, values, next_values = np.ones(3), np.array([0.5, 1.0, 2.0]), np.array([1.0, 2.0, 4.0])
    cases = {
        # no episode end: A2 = 1, A1 = 1 + 0.25 * 1 = 1.25, A0 = 1 + 0.25 * 1.25 = 1.3125
        "none": ([0, 0, 0], [0, 0, 0], [1.3125, 1.25, 1.0]),
        # terminated at t=1: delta1 = 1 + 0 - 1 = 0 and the recursion stops: A1 = 0, A0 = 1
        "terminated": ([0, 1, 0], [0, 1, 0], [1.0, 0.0, 1.0]),
        # truncated at t=1: delta1 still bootstraps (= 1), the recursion stops: A0 = 1.25
        "truncated": ([0, 0, 0], [0, 1, 0], [1.25, 1.0, 1.0]),
    }
    for terminated, dones, expected in cases.values():
        adv, ret = gae(
            rewards, values, next_values, np.array(terminated), np.array(dones), gamma=0.5, lam=0.5
        )
        np.testing.assert_allclose(adv, expected)
        np.testing.assert_allclose(ret, np.array(expected) + values)
    # The same three cases as three parallel envs: shape [T, N].
    terminated, dones, expected = (np.array(column).T for column in zip(*cases.values()))
    adv, ret = gae(
        *(np.repeat(a[:, None], 3, axis=1) for a in (rewards, values, next_values)),
        terminated,
        dones,
        gamma=0.5,
        lam=0.5,
    )
    np.testing.assert_allclose(adv, expected)
    assert adv.shape == ret.shape == (3, 3)


def test_gae_lambda_one_is_monte_carlo_and_dtype_follows_values():
    # gamma 1, lam 1, no ends: A_t = sum of rewards from t + next_values[-1] - values_t.
    rewards = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    values = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    next_values = np.array([0.5, 0.5, 10.0], dtype=np.float32)
    zeros = np.zeros(3, dtype=bool)
    adv, ret = gae(rewards, values, next_values, zeros, zeros, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [15.5, 14.5, 12.5])
    assert adv.dtype == np.float32 and ret.dtype == np.float32
    with pytest.raises(ValueError):
        gae(rewards, values, next_values[:2], zeros, zeros, 0.9, 0.9)
