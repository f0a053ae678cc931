"""Agent checkpoints that training continues from: a DQN/PPO agent restored from its
saveModel or periodic checkpoint acts, samples and learns exactly as the original would have.

The agents run in-process (their hooks called directly, as the service calls them) on real
CartPole envs: two env copies, so requests carry several entities as over HTTP.
"""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.framework.agent import EpisodeInfo, ReplayBatch
from mistk_rl.rl.data.buffers import NaiveReplayBuffer
from mistk_rl.rl.learner import Learner, LogHook, load_checkpoint, save_checkpoint
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.rl.policies.ppo import PPOPolicy
from mistk_rl.rl.trainers import OffPolicyTrainer, OnPolicyTrainer
from tests.entity_steps import EntitySteps

ENVS = 2
# exact reproduction holds while the pacing's time guard never cuts a request short
# (`mistk_rl.rl.pacing`): off here, so a busy machine cannot change what runs
NO_TIME_GUARD = {"max_update_seconds_per_request": 3600.0}
DQN_HP = {
    "seed": 0,
    "log_every": 0,
    "policy": {
        "model": {"hidden_sizes": [32]},
        "nstep": 3,
        "learn": {"batch_size": 16},
        "collect": {"eps": {"type": "linear", "start": 1.0, "end": 0.1, "duration": 400}},
    },
    "train": {"learning_starts": 60, "train_freq": 10, "gradient_steps": 4, **NO_TIME_GUARD},
    "buffer": {"replay_buffer_size": 1000},
}
PPO_HP = {
    "seed": 0,
    "log_every": 0,
    "train": {"n_steps": 64, **NO_TIME_GUARD},
    "policy": {"model": {"hidden_sizes": [32]}, "learn": {"epochs": 2, "batch_size": 32}},
}


def _agent(cls, hparams: dict, data_dir, path=None):
    """An agent through initialize, buildModel(path) and registration."""
    agent = cls()
    agent.data_dir = data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    env = gym.make("CartPole-v1")
    agent.observation_space, agent.action_space = env.observation_space, env.action_space
    agent.do_initialize({}, hparams)
    agent.do_build_model(path)
    agent.do_agent_registered({})
    return agent


class Envs:
    """ENVS CartPole copies stepped together, as the orchestrator does."""

    def __init__(self, seed: int) -> None:
        self.envs = [gym.make("CartPole-v1") for _ in range(ENVS)]
        self.obs = {f"p:{i}": env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)}

    def play(self, agent, steps: int) -> list[int]:
        """`steps` collect steps (per env copy); returns the actions taken."""
        agent.do_episode_started(EpisodeInfo(dict(self.obs), "collect"))
        steps_of = EntitySteps(agent)
        taken = []
        for _ in range(steps):
            actions = steps_of.get_action(self.obs)
            batch = ReplayBatch(dict(self.obs), {}, {}, {}, {}, {})
            for i, env in enumerate(self.envs):
                name = f"p:{i}"
                obs, reward, term, trunc, _ = env.step(actions[name])
                batch.actions[name], batch.rewards[name] = np.int64(actions[name]), reward
                batch.new_obs[name], batch.terminated[name], batch.truncated[name] = (
                    obs,
                    term,
                    trunc,
                )
                self.obs[name] = env.reset()[0] if term or trunc else obs
                taken.append(actions[name])
            steps_of.replay_action(batch)
        agent.do_episode_stopped()
        return taken


def _weights(agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.policy.model.parameters()]


def _counters(agent) -> dict:
    """The status payload's training counters (not the last loss: a restored learner has not
    trained yet)."""
    return {k: v for k, v in agent.progress().items() if k not in ("loss", "mode")}


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b)))


@pytest.mark.parametrize("buffer", ["naive", "advanced"])
def test_dqn_resumed_from_save_model_continues_as_the_original(tmp_path, buffer):
    hp = {**DQN_HP, "buffer": {**DQN_HP["buffer"], "type": buffer}}
    original = _agent(DQNAgent, hp, tmp_path / "a")
    Envs(0).play(original, 100)  # past learning_starts, mid-epsilon, n-step windows flushed
    original.do_save_model(tmp_path / "a" / "ckpt.pt")

    # another seed: everything random must come from the checkpoint
    restored = _agent(DQNAgent, {**hp, "seed": 7}, tmp_path / "b", tmp_path / "a" / "ckpt.pt")
    assert _counters(restored) == _counters(original)
    assert _same_weights(original, restored)

    # the same new episodes: same exploration, same replay samples, same updates
    assert Envs(100).play(original, 60) == Envs(100).play(restored, 60)
    assert original.progress() == restored.progress()
    assert _same_weights(original, restored)
    assert original.policy.target.steps == restored.policy.target.steps
    assert all(
        torch.equal(x, y)
        for x, y in zip(original.policy.target.parameters(), restored.policy.target.parameters())
    )


def test_ppo_resumed_from_save_model_continues_as_the_original(tmp_path):
    original = _agent(PPOAgent, PPO_HP, tmp_path / "a")
    Envs(0).play(original, 64)  # two rollouts of 64 transitions: none in progress
    original.do_save_model(tmp_path / "a" / "ckpt.pt")
    restored = _agent(PPOAgent, {**PPO_HP, "seed": 7}, tmp_path / "b", tmp_path / "a" / "ckpt.pt")
    assert _counters(restored) == _counters(original)
    assert Envs(100).play(original, 80) == Envs(100).play(restored, 80)  # samples, minibatches
    assert original.progress() == restored.progress() and original.progress()["updates"] == 4
    assert _same_weights(original, restored)


def test_periodic_checkpoint_is_what_save_model_writes(tmp_path):
    """Item 2 of issue 9: checkpoints/latest.pt lacked the learner state and failed buildModel."""
    original = _agent(DQNAgent, {**DQN_HP, "checkpoint_every": 4}, tmp_path / "a")
    Envs(0).play(original, 65)  # the last burst of 4 updates ends at env step 130
    latest = tmp_path / "a" / "checkpoints" / "latest.pt"
    assert load_checkpoint(latest).keys() == {
        "agent",
        "format",
        "config",
        "spaces",
        "learner",
        "trainer",
        "rng",
        "normalizer",
    }
    restored = _agent(DQNAgent, DQN_HP, tmp_path / "b", latest)
    assert _counters(restored) == _counters(original)
    assert _counters(restored)["envSteps"] == 130
    assert _same_weights(original, restored)


def test_checkpoint_without_replay_buffer(tmp_path):
    hp = {**DQN_HP, "checkpoint_buffer": False}
    original = _agent(DQNAgent, hp, tmp_path / "a")
    Envs(0).play(original, 50)
    original.do_save_model(tmp_path / "a" / "ckpt.pt")
    restored = _agent(DQNAgent, hp, tmp_path / "b", tmp_path / "a" / "ckpt.pt")
    assert restored.progress()["bufferSize"] == 0 < original.progress()["bufferSize"]
    assert restored.progress()["envSteps"] == 100 and _same_weights(original, restored)


def _transition(i: int, value: float = 0.0) -> dict:
    return {
        "obs": np.full(4, i, np.float32),
        "action": np.int64(i % 2),
        "reward": 1.0,
        "next_obs": np.full(4, i + 1, np.float32),
        "terminated": False,
        "truncated": False,
        "log_prob": np.float32(-0.7),
        "value": np.float32(value),
    }


def test_off_policy_windows_in_progress_end_as_cut_episodes(tmp_path):
    """A checkpoint outlives the env episodes in progress: their n-step windows reach the
    buffer as the windows of a truncated episode would."""
    obs, act = gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2)

    def trainer():
        policy = DQNPolicy({"nstep": 3}, obs, act, seed=0)
        return OffPolicyTrainer(
            policy,
            Learner(policy.learn_mode),
            NaiveReplayBuffer({"replay_buffer_size": 50}, seed=0),
            {"learning_starts": 100, "train_freq": 10, "gradient_steps": 1},
        )

    original = trainer()
    original.observe_all({"a": _transition(0), "b": _transition(10)})
    original.observe_all({"a": _transition(1), "b": _transition(11)})
    original.observe_all({"a": _transition(2)})  # a's first window completes
    save_checkpoint(original.state_dict(), tmp_path / "t.pt")
    restored = trainer()
    restored.load_state_dict(load_checkpoint(tmp_path / "t.pt"))
    original.end_all_episodes()  # what a cut does to the original
    assert restored.buffer.count() == original.buffer.count() == 5
    assert (
        restored.buffer.state_dict()["ring"]["columns"].keys()
        == original.buffer.state_dict()["ring"]["columns"].keys()
    )
    for key, column in original.buffer.state_dict()["ring"]["columns"].items():
        np.testing.assert_array_equal(
            restored.buffer.state_dict()["ring"]["columns"][key], column, err_msg=key
        )


def test_on_policy_rollout_in_progress_is_kept_and_cut(tmp_path):
    obs, act = gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2)
    policy = PPOPolicy(None, obs, act, seed=0)
    original = OnPolicyTrainer(policy, Learner(policy.learn_mode), {"n_steps": 8})
    for t in range(3):
        original.observe_all({"a": _transition(t), "b": _transition(10 + t)})
    save_checkpoint(original.state_dict(), tmp_path / "t.pt")
    restored = OnPolicyTrainer(
        policy, Learner(policy.learn_mode), {"n_steps": 8, "updates_per_request": 100}
    )
    restored.load_state_dict(load_checkpoint(tmp_path / "t.pt"))
    assert restored._count == 6
    for entity in ("a", "b"):
        steps = restored.rollout()[entity].rows()
        assert [s["truncated"] for s in steps] == [False, False, True]
        np.testing.assert_array_equal(steps[0]["obs"], original.rollout()[entity].rows()[0]["obs"])
    # the next two steps complete the rollout: 8 transitions, one update of 20 epochs x 1
    # minibatch steps, all paid in this request (updates_per_request 100)
    restored.observe_all({"a": _transition(20), "b": _transition(30)})
    assert restored.maybe_train() == 20 and restored.learner.train_iter == 1


def test_log_hook_resumed_keeps_rows_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "learner.csv"
    path.write_text("train_iter,env_steps,loss\n1,10,0.5\n2,20,0.4\n3,30,0.3\n")
    learner = Learner(
        PPOPolicy(
            None, gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2)
        ).learn_mode
    )
    hook = LogHook(tmp_path, every=1, resumed_at=2)
    learner.train_iter, learner.env_steps, learner.last_info = 3, 35, {"loss": 0.25}
    hook(learner)
    hook.close()
    rows = list(csv.reader(open(path)))
    assert rows == [
        ["train_iter", "env_steps", "loss"],
        ["1", "10", "0.5"],
        ["2", "20", "0.4"],
        ["3", "35", "0.25"],
    ]
