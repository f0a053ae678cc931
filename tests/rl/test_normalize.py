"""Observation and reward normalisation (VecNormalize semantics): statistics against numpy,
reward scaling against a hand computation, and the agent's use of it (collect vs eval mode,
what PPO and DQN store, checkpoints). Agents run in-process, their hooks called directly."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.agent import EpisodeInfo, ReplayBatch
from mistk_rl.rl.normalize import Normalizer, RunningMeanStd
from tests.entity_steps import EntitySteps

CONFIG = {
    "obs": True,
    "reward": True,
    "clip_obs": 10.0,
    "clip_reward": 10.0,
    "gamma": None,
    "epsilon": 1e-8,
}


def test_running_statistics_match_numpy_on_a_stream_of_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=[1.0, 5.0], size=(n, 2)) for n in (1, 7, 3, 50, 1, 16)]
    rms = RunningMeanStd((2,))
    for i, batch in enumerate(batches):
        rms.update(batch)
        seen = np.concatenate(batches[: i + 1])
        assert rms.count == len(seen)
        np.testing.assert_allclose(rms.mean, seen.mean(0), rtol=1e-12)
        np.testing.assert_allclose(rms.var, seen.var(0), rtol=1e-10)


def test_observations_normalised_and_clipped():
    norm = Normalizer({**CONFIG, "clip_obs": 2.0}, (2,), gamma=0.99)
    data = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]])
    norm.update_obs(data)
    std = np.sqrt(data.var(0) + 1e-8)
    expected = np.clip((np.array([[4.0, 10.0], [100.0, 11.0]]) - data.mean(0)) / std, -2, 2)
    np.testing.assert_allclose(
        norm.obs(np.array([[4.0, 10.0], [100.0, 11.0]])), expected, rtol=1e-6
    )
    as_tensor = norm.obs(torch.tensor([[4.0, 10.0], [100.0, 11.0]]))
    np.testing.assert_allclose(as_tensor.numpy(), expected, rtol=1e-6)
    assert expected[1, 1] == 2.0  # a constant feature: anything off it hits the clip


def test_reward_scaled_by_the_std_of_the_discounted_return_by_hand():
    gamma = 0.5
    norm = Normalizer({**CONFIG, "clip_reward": 100.0}, (1,), gamma=gamma)
    # two entities; "a" ends its episode after step 2, so its return restarts at step 3
    steps = [
        ({"a": 1.0, "b": 2.0}, {"a": False, "b": False}),
        ({"a": 1.0, "b": 0.0}, {"a": True, "b": False}),
        ({"a": 4.0, "b": 2.0}, {"a": False, "b": False}),
    ]
    # returns by hand: a: 1, 1*0.5+1 = 1.5, (reset) 4;  b: 2, 2*0.5+0 = 1, 1*0.5+2 = 2.5
    returns = [1.0, 2.0, 1.5, 1.0, 4.0, 2.5]
    for k, (rewards, dones) in enumerate(steps):
        norm.update_rewards(rewards, dones)
        seen = np.array(returns[: 2 * (k + 1)])
        assert norm.ret_rms.var == pytest.approx(seen.var())
    scale = np.sqrt(np.var(returns) + 1e-8)
    assert norm.reward(3.0) == pytest.approx(3.0 / scale)
    assert torch.allclose(norm.reward(torch.tensor([3.0, -1.0])), torch.tensor([3.0, -1.0]) / scale)
    assert Normalizer({**CONFIG, "clip_reward": 0.1}, (1,), 0.9).reward(5.0) == 0.1  # var 1
    off = Normalizer({**CONFIG, "obs": False, "reward": False}, (1,), 0.9)
    off.update_rewards({"a": 5.0}, {"a": False})
    assert off.reward(5.0) == 5.0 and off.ret_rms.count == 0


# ---- in the agent ---------------------------------------------------------------------------

PPO_HP = {
    "seed": 0,
    "log_every": 0,
    "train": {"n_steps": 64},
    "normalize": {"obs": True, "reward": True},
    "policy": {"model": {"hidden_sizes": [16]}, "learn": {"epochs": 1, "batch_size": 32}},
}
DQN_HP = {
    "seed": 0,
    "log_every": 0,
    "normalize": {"obs": True, "reward": True},
    "policy": {"model": {"hidden_sizes": [16]}, "learn": {"batch_size": 8}},
    "train": {"learning_starts": 20, "train_freq": 10, "gradient_steps": 2},
    "buffer": {"replay_buffer_size": 500},
}


def _agent(cls, hparams, env_id, data_dir, path=None):
    agent = cls()
    agent.data_dir = data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    env = gym.make(env_id)
    agent.observation_space, agent.action_space = env.observation_space, env.action_space
    agent.do_initialize({}, hparams)
    agent.do_build_model(path)
    agent.do_agent_registered({})
    return agent


def _play(agent, env_id, steps, mode="collect", seed=0):
    """Two env copies stepped together for `steps`; returns the raw observations acted on."""
    envs = [gym.make(env_id) for _ in range(2)]
    obs = {f"p:{i}": env.reset(seed=seed + i)[0] for i, env in enumerate(envs)}
    seen = []
    agent.do_episode_started(EpisodeInfo(dict(obs), mode))
    steps_of = EntitySteps(agent)
    for _ in range(steps):
        seen += list(obs.values())
        actions = steps_of.get_action(obs)
        batch = ReplayBatch(dict(obs), {}, {}, {}, {}, {})
        for i, env in enumerate(envs):
            name = f"p:{i}"
            new, reward, term, trunc, _ = env.step(actions[name])
            batch.actions[name], batch.rewards[name] = np.asarray(actions[name]), reward
            batch.new_obs[name], batch.terminated[name], batch.truncated[name] = new, term, trunc
            obs[name] = env.reset()[0] if term or trunc else new
        steps_of.replay_action(batch)
    agent.do_episode_stopped()
    return np.array(seen)


def test_ppo_agent_normalises_what_it_acts_on_and_stores(tmp_path):
    agent = _agent(PPOAgent, PPO_HP, "Pendulum-v1", tmp_path / "a")
    seen = _play(agent, "Pendulum-v1", 40)  # 80 transitions: one update, 16 in the rollout
    norm = agent.normalizer
    np.testing.assert_allclose(norm.obs_rms.mean, seen.mean(0), rtol=1e-6)
    assert norm.obs_rms.count == 80 and norm.ret_rms.count == 80
    rollout = [t for steps in agent.trainer.rollout().values() for t in steps.rows()]
    stored = np.stack([t["obs"] for t in rollout])
    assert np.abs(stored).max() < 5  # normalised (raw angular velocity reaches 8)
    rewards = [t["reward"] for t in rollout]
    assert max(abs(r) for r in rewards) < 10 and min(rewards) > -10  # scaled (raw to -16)


def test_dqn_agent_stores_raw_observations_and_normalises_samples(tmp_path):
    agent = _agent(DQNAgent, DQN_HP, "CartPole-v1", tmp_path / "a")
    _play(agent, "CartPole-v1", 30)
    assert agent.learner.train_iter > 0
    sample = agent.trainer.buffer.sample_batch(8, learner_iter=0)
    normalised = agent.trainer._normalized(sample)
    np.testing.assert_allclose(
        normalised.obs.numpy(), agent.normalizer.obs(sample.obs.numpy()), rtol=1e-5, atol=1e-6
    )
    # raw: CartPole's observations as the env gave them, not clipped or centred
    assert not np.allclose(sample.obs.numpy(), normalised.obs.numpy())


def test_statistics_frozen_in_eval_mode_and_restored_from_a_checkpoint(tmp_path):
    agent = _agent(PPOAgent, PPO_HP, "Pendulum-v1", tmp_path / "a")
    _play(agent, "Pendulum-v1", 50)
    before = agent.normalizer.state_dict()
    _play(agent, "Pendulum-v1", 30, mode="eval", seed=10)
    after = agent.normalizer.state_dict()
    for key in ("obs", "ret"):
        assert after[key]["count"] == before[key]["count"]
        np.testing.assert_array_equal(after[key]["mean"], before[key]["mean"])
        np.testing.assert_array_equal(after[key]["var"], before[key]["var"])
    agent.do_save_model(tmp_path / "a" / "ckpt.pt")
    restored = _agent(
        PPOAgent, {"seed": 3}, "Pendulum-v1", tmp_path / "b", tmp_path / "a" / "ckpt.pt"
    )
    assert restored.config["normalize"]["obs"] and restored.config["normalize"]["reward"]
    state = restored.normalizer.state_dict()
    for key in ("obs", "ret"):
        assert state[key]["count"] == before[key]["count"]
        np.testing.assert_array_equal(state[key]["mean"], before[key]["mean"])
        np.testing.assert_array_equal(state[key]["var"], before[key]["var"])
    # the restored agent acts as the original on the same observations (eval: greedy)
    obs = {"p:0": np.array([0.5, -0.5, 3.0], np.float32)}
    for a in (agent, restored):
        a.do_episode_started(EpisodeInfo(dict(obs), "eval"))
    assert EntitySteps(agent).get_action(obs) == EntitySteps(restored).get_action(obs)


def test_obs_normalisation_needs_a_box_observation_space(tmp_path):
    agent = PPOAgent()
    agent.data_dir = tmp_path
    config = agent.compile_config({"normalize": {"obs": True}})
    with pytest.raises(InvalidRequest, match="normalize.obs needs a Box"):
        agent._check_model(config, gym.spaces.Discrete(4), gym.spaces.Discrete(2))
