"""The Thinker MDP on the puzzle: imagination replays on a copy, the gymnasium adapter the
gym orchestrator serves, and the scripted planner."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from mistk_rl.thinker import decode_tree_reps, make
from mistk_rl.thinker.cloneable import ensure_cloneable
from mistk_rl.thinker.gym_env import ThinkerGymEnv
from mistk_rl.thinker.planner import plan
from mistk_rl.thinker.puzzle import ENV_ID


def zero_vp(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(len(obs)), np.zeros((len(obs), 4))


def test_imagined_rewards_and_frames_replay_on_a_copy_of_the_puzzle():
    rng = np.random.default_rng(0)
    env = make(
        ENV_ID, env_n=3, wrapper_type=2, rec_t=8, max_depth=4, vp_fn=zero_vp, return_x=True, seed=0
    )
    env.reset()
    roots = [r.state for r in env.roots]
    paths: list[list[int]] = [[], [], []]
    checked = 0
    for _ in range(400):
        actions, resets = rng.integers(4, size=3), (rng.random(3) < 0.15).astype(int)
        state, _, _, info = env.step(actions, resets)
        if info["step_status"][0] == 0:
            roots, paths = [r.state for r in env.roots], [[], [], []]
            continue
        reps = decode_tree_reps(state["tree_reps"], 4)
        for i in range(3):
            paths[i].append(int(actions[i]))
            copy = ensure_cloneable(gym.make(ENV_ID))
            copy.reset(seed=0)
            copy.restore_state(roots[i])
            reward, frame, ended = 0.0, None, False
            for a in paths[i]:
                if ended:
                    reward = 0.0  # past the end: nothing happens
                    continue
                frame, reward, terminated, truncated, _ = copy.step(a)
                ended = terminated or truncated
            assert reps["cur_r"][i, 0] == pytest.approx(reward)
            np.testing.assert_array_equal(state["xs"][i], frame)
            checked += 1
            if reps["reset"][i] == 1:
                paths[i] = []
    assert checked > 300


@pytest.mark.parametrize("actions", ["Discrete", "MultiDiscrete"])
def test_the_gymnasium_adapter(actions):
    env = ThinkerGymEnv(
        ENV_ID,
        thinker={"wrapper_type": 2, "rec_t": 4, "max_depth": 2, "vp_fn": zero_vp},
        actions=actions,
    )
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert set(obs) == {"tree_reps", "real_states"} and obs["real_states"].dtype == np.uint8
    if actions == "Discrete":
        assert env.action_space.n == 8
        assert env.split(5) == (1, 1) and env.split(2) == (2, 0)
        move = 3  # right, no reset
    else:
        assert env.action_space.nvec.tolist() == [4, 2]
        move = [3, 0]
    frame = obs["real_states"].copy()
    real, rewards = [], []
    for _ in range(8):
        obs, reward, terminated, truncated, info = env.step(move)
        real.append(info["real_step"])
        rewards.append(reward)
        assert info["step_status"] in (0, 1, 2)
        if not info["real_step"]:
            assert reward == 0.0 and not terminated and not truncated
            np.testing.assert_array_equal(obs["real_states"], frame)
        else:
            frame = obs["real_states"].copy()
    assert real == [False, False, False, True] * 2
    assert all(r != 0.0 for r, is_real in zip(rewards, real) if is_real)  # -0.01 at least


def test_the_adapter_ends_an_episode_on_its_final_state_and_waits_for_reset():
    """The step that ends an episode returns the last real frame (a truncation bootstraps
    from it, not from the next level), and the next episode starts at reset(), as in
    gymnasium."""
    env = ThinkerGymEnv(
        ENV_ID, thinker={"wrapper_type": 2, "rec_t": 3, "max_depth": 2, "vp_fn": zero_vp}
    )
    copy = gym.make(ENV_ID)
    rng = np.random.default_rng(0)
    ends = []
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        frame, _ = copy.reset(seed=seed)
        np.testing.assert_array_equal(obs["real_states"], frame)
        ended = False
        while not ended:
            a = int(rng.integers(4))
            obs, reward, terminated, truncated, info = env.step(a)
            if not info["real_step"]:
                continue
            frame, r, term, trunc, _ = copy.step(a)
            np.testing.assert_array_equal(obs["real_states"], frame)
            assert (reward, terminated, truncated) == (pytest.approx(r), term, trunc)
            ended = term or trunc
        reps = decode_tree_reps(obs["tree_reps"][None], 4)
        assert reps["root_ns"].sum() == 0  # a fresh root at the final state: nothing visited
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
        ends.append("truncated" if truncated else "terminated")
    assert set(ends) == {"truncated", "terminated"}


def test_the_adapter_refuses_unknown_settings_and_formats():
    with pytest.raises(ValueError, match="rec_tt"):
        ThinkerGymEnv(ENV_ID, thinker={"rec_tt": 3})
    with pytest.raises(ValueError, match="Discrete"):
        ThinkerGymEnv(ENV_ID, thinker={"wrapper_type": 2, "vp_fn": zero_vp}, actions="Box")


def test_the_planner_takes_the_best_visited_root_child():
    a, k = 4, 3
    n = 9 + 10 * a + k
    reps = np.zeros((2, n), dtype=np.float32)
    fields = decode_tree_reps(reps, a)  # views into reps
    fields["root_qs_max"][:] = [[-0.5, 0.0, -0.02, 0.0], [0.1, 0.2, 0.3, 0.4]]
    fields["root_ns"][:] = [[1 / k, 0, 1 / k, 0], [0, 0, 0, 0]]
    fields["time"][:, k - 1] = 1  # the next step is real
    primary, reset = plan(reps, a, np.random.default_rng(0))
    assert primary[0] == 2  # the best *visited* child, though unvisited ones show 0
    assert reset.tolist() == [0, 0]
    fields["time"][:] = 0
    fields["time"][:, 0] = 1  # imagining: random
    draws = {int(plan(reps, a, np.random.default_rng(s))[0][0]) for s in range(20)}
    assert draws == {0, 1, 2, 3}


def test_the_planner_solves_more_than_a_random_policy():
    """A small sample (the target, >= .35 over 3,000 episodes, is measured by
    `mistk-rl bench thinker-planner`): random play solves about 14%."""
    env = make(ENV_ID, env_n=8, wrapper_type=2, rec_t=10, max_depth=5, vp_fn=zero_vp, seed=1)
    rng = np.random.default_rng(1)
    state = env.reset()
    solved = ended = 0
    while ended < 48:
        state, _, done, info = env.step(*plan(state["tree_reps"], 4, rng))
        ended += int(done.sum())
        solved += int((info["episode_return"][done] > 5).sum())
    assert solved / ended > 0.25


def test_an_untrained_zero_headed_value_function_needs_no_network():
    env = make(ENV_ID, env_n=2, wrapper_type=2, rec_t=4, train_model=False, seed=0)
    assert env.model is None
    env.reset()
    state, _, _, _ = env.step([0, 1], [0, 0])
    fields = decode_tree_reps(state["tree_reps"], 4)
    assert not fields["root_v"].any() and not fields["root_logits"].any()
    assert (fields["cur_r"][:, 0] <= 0).all()  # the step penalty (or a bump): no value added


def _table_vp(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and priors that differ per frame, so a root at the wrong frame shows."""
    flat = obs.reshape(len(obs), -1).astype(np.float64)
    return flat.mean(1), np.stack([flat[:, k::7].mean(1) for k in range(4)], axis=1)


@pytest.mark.parametrize("wrapper_type", [1, 2])
def test_auto_reset_gives_a_truncated_episodes_final_state_as_the_gym_convention_returns_it(
    wrapper_type,
):
    from mistk_rl.thinker import load_config
    from mistk_rl.thinker.env import ThinkerEnv

    settings = load_config(
        None,
        wrapper_type=wrapper_type,
        rec_t=3,
        max_depth=2,
        vp_fn=_table_vp,
        return_x=True,
        seed=0,
    )
    auto, manual = (
        ThinkerEnv([lambda: gym.make(ENV_ID)] * 3, settings, auto_reset=flag)
        for flag in (True, False)
    )
    auto.reset(), manual.reset()
    rng = np.random.default_rng(1)
    truncated_seen = 0
    while truncated_seen < 3:
        actions, resets = rng.integers(4, size=3), rng.integers(2, size=3)
        state, _, done, info = auto.step(actions, resets)
        m_state, _, m_done, m_info = manual.step(actions, resets)
        assert (done == m_done).all()
        if not done.any():
            continue
        truncated = info["truncated_done"]
        finals = info.get("final_state", {})
        assert sorted(finals) == np.flatnonzero(truncated).tolist()
        for i in np.flatnonzero(truncated):
            row = finals[i]
            assert sorted(row) == sorted(m_state)
            for key, value in m_state.items():
                np.testing.assert_array_equal(row[key], value[i], err_msg=key)
            assert not np.array_equal(state["real_states"][i], row["real_states"])
        truncated_seen += int(truncated.sum())
        seed = int(rng.integers(1000))  # an ended episode parts the twins: both start again
        auto.reset(seed=seed), manual.reset(seed=seed)
