"""Clone/restore for envs without it: CartPole exact, the rest refused with a clear error."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from mistk_rl.thinker.cloneable import Cloneable, ensure_cloneable
from mistk_rl.thinker.puzzle import ENV_ID, PuzzleEnv

pytestmark = pytest.mark.filterwarnings("ignore:.*step.*:UserWarning")  # stepping past the end


def run(env: gym.Env, actions) -> list[tuple]:
    out = []
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(int(a))
        out.append((np.asarray(obs).tobytes(), reward, terminated, truncated))
    return out


def balance(obs: np.ndarray) -> int:
    return int(3 * obs[2] + obs[3] > 0)


def test_cartpole_random_replays_match():
    env = ensure_cloneable(gym.make("CartPole-v1"))
    assert isinstance(env, Cloneable)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(100):
        env.reset()
        run(env, rng.integers(2, size=rng.integers(0, 8)))
        snapshot = env.clone_state()
        actions = rng.integers(2, size=40)  # usually past termination, which CartPole allows
        first = run(env, actions)
        env.restore_state(snapshot)
        assert run(env, actions) == first


def test_cartpole_termination_counter_is_restored():
    env = ensure_cloneable(gym.make("CartPole-v1"))
    env.reset(seed=1)
    snapshots, terminated = [], False
    while not terminated:
        snapshots.append(env.clone_state())
        _, _, terminated, _, _ = env.step(1)
    env.restore_state(snapshots[-1])
    first = run(env, [1] * 3)  # the fall (reward 1), then reward 0 past it
    assert [(r, te) for _, r, te, _ in first] == [(1.0, True), (0.0, True), (0.0, True)]
    env.restore_state(snapshots[-1])
    assert run(env, [1] * 3) == first


def test_cartpole_truncates_at_500_after_restore():
    env = ensure_cloneable(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=0)
    for _ in range(490):
        obs, _, terminated, truncated, _ = env.step(balance(obs))
        assert not terminated and not truncated
    snapshot = env.clone_state()
    actions, flags = [], []
    for _ in range(10):
        actions.append(balance(obs))
        obs, _, terminated, truncated, _ = env.step(actions[-1])
        flags.append((terminated, truncated))
    assert flags == [(False, False)] * 9 + [(False, True)]
    env.restore_state(snapshot)
    assert [(te, tr) for _, _, te, tr in run(env, actions)] == flags


def test_envs_that_already_clone():
    bare = PuzzleEnv()
    assert ensure_cloneable(bare) is bare
    made = ensure_cloneable(gym.make(ENV_ID))  # gymnasium 1.x wrappers forward no attributes
    made.reset(seed=0)
    snapshot = made.clone_state()
    first = run(made, [0, 1, 2, 3] * 3)
    made.restore_state(snapshot)
    assert run(made, [0, 1, 2, 3] * 3) == first


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "Acrobot-v1"])
def test_other_envs_are_refused(env_id):
    with pytest.raises(ValueError, match=r"perfect model \(wrapper_type 2\).*clone_state"):
        ensure_cloneable(gym.make(env_id))


def test_unknown_wrappers_are_refused():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="RecordEpisodeStatistics"):
        ensure_cloneable(env)
