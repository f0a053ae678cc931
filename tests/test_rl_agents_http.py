"""DQN and PPO agents over HTTP: config errors, checkpoints, and learning that beats random."""

from __future__ import annotations

import shutil

import gymnasium as gym
import numpy as np
import pytest
import yaml

from harness.config import RunConfig
from harness.run import read_episodes, run
from mistk_rl.sdk.client import BadRequest
from mistk_rl.spaces import space_to_dict
from tests.conftest import GYM_ORCHESTRATOR

DQN, PPO = "agents.dqn_agent:DQNAgent", "agents.ppo_agent:PPOAgent"
CARTPOLE = gym.make("CartPole-v1")
SPACES = {
    "observationSpace": space_to_dict(CARTPOLE.observation_space),
    "actionSpace": space_to_dict(CARTPOLE.action_space),
}
FAST_DQN = {
    "seed": 0,
    "log_every": 50,
    "policy": {
        "model": {"hidden_sizes": [64, 64]},
        "learn": {"lr": 1e-3, "target": {"every": 100}},
        "collect": {"eps": {"type": "linear", "start": 1.0, "end": 0.05, "duration": 2500}},
    },
    "train": {"learning_starts": 500, "train_freq": 50, "gradient_steps": 50},
}
FAST_PPO = {
    "seed": 0,
    "train": {"n_steps": 512},
    "policy": {"learn": {"lr": 3e-3, "epochs": 10, "batch_size": 128}},
}


@pytest.mark.parametrize("target", [DQN, PPO])
def test_unknown_hyperparameter_is_a_400_naming_it(launch, target):
    agent = launch("agent", target).client()
    with pytest.raises(BadRequest, match=r"policy\.learn\.batchsize.*Did you mean 'batch_size'"):
        agent.initialize(hyperparameters={"policy": {"learn": {"batchsize": 32}}})
    with pytest.raises(BadRequest, match="buffer"):
        agent.initialize(hyperparameters={"buffer": {"type": "fancy"}})
    with pytest.raises(BadRequest, match="torch_threads must be a positive integer"):
        agent.initialize(hyperparameters={"torch_threads": 0})
    assert agent.status().state == "started"


def _registered(launch, hparams):
    service = launch("agent", DQN)
    agent = service.client()
    agent.initialize(hyperparameters=hparams)
    agent.build_model()
    agent.agent_registered({"name": "p", **SPACES})
    return service, agent


def _greedy(agent, observations):
    agent.episode_started({"p": observations[0]}, mode="eval")
    actions = [agent.get_action({"p": o})["p"] for o in observations]
    agent.episode_stopped()
    return actions


@pytest.mark.parametrize("source", ["saveModel", "checkpoint_every"])
def test_checkpoint_round_trip_through_the_service(launch, source):
    # checkpoint_every 10: after each burst of 10 updates, the last one at env step 120
    periodic = {"checkpoint_every": 10} if source == "checkpoint_every" else {}
    service, agent = _registered(
        launch,
        {
            **FAST_DQN,
            **periodic,
            "train": {"learning_starts": 50, "train_freq": 10, "gradient_steps": 10},
        },
    )
    assert (service.data_dir / "config.yaml").exists()
    merged = yaml.safe_load((service.data_dir / "config.yaml").read_text())
    assert merged["policy"]["learn"]["gamma"] == 0.99 and merged["train"]["train_freq"] == 10
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    agent.episode_started({"p": obs})
    for _ in range(120):
        action = agent.get_action({"p": obs})["p"]
        new_obs, reward, term, trunc, _ = env.step(action)
        agent.replay_action(
            {
                "prevObs": {"p": obs},
                "actions": {"p": action},
                "rewards": {"p": reward},
                "newObs": {"p": new_obs},
                "terminated": {"p": term},
                "truncated": {"p": trunc},
            }
        )
        obs = new_obs if not (term or trunc) else env.reset()[0]
    agent.episode_stopped()
    progress = agent.status().payload
    # trains at env steps 50, 60, ..., 120; the first two find < 64 (a batch) in the buffer
    assert progress["envSteps"] == 120 and progress["updates"] == 6 * 10
    assert progress["bufferSize"] > 0 and 0.04 < progress["epsilon"] < 1.0
    observations = [env.observation_space.sample() * 0.1 for _ in range(25)]
    before = _greedy(agent, observations)
    path = "ckpt/dqn.pt" if source == "saveModel" else "checkpoints/latest.pt"
    if source == "saveModel":
        agent.save_model(path)

    other, fresh = _registered(launch, {"seed": 123})
    (other.data_dir / path).parent.mkdir()
    shutil.copy(service.data_dir / path, other.data_dir / path)
    fresh.reset(unload_model=True)
    fresh.initialize(hyperparameters={"seed": 123})
    fresh.build_model(path)
    assert fresh.status().state == "initialized"  # not failed
    fresh.agent_registered({"name": "p", **SPACES})
    assert _greedy(fresh, observations) == before
    fresh.episode_started({"p": observations[0]})
    fresh.episode_stopped()
    restored = fresh.status().payload
    assert restored["envSteps"] == 120 and restored["updates"] == 60


def test_checkpoint_of_another_agent_kind_is_refused(launch):
    service, agent = _registered(launch, FAST_DQN)
    agent.save_model("dqn.pt")
    ppo_service = launch("agent", PPO)
    ppo = ppo_service.client()
    shutil.copy(service.data_dir / "dqn.pt", ppo_service.data_dir / "dqn.pt")
    ppo.initialize()
    with pytest.raises(Exception, match="DQNAgent checkpoint, not a PPOAgent"):
        ppo.build_model("dqn.pt")


def _random_mean(episodes: int, seed: int) -> float:
    env, rng, returns = gym.make("CartPole-v1"), np.random.default_rng(0), []
    for i in range(episodes):
        env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(2)))
            total, done = total + r, term or trunc
        returns.append(total)
    return float(np.mean(returns))


@pytest.mark.long(15)
@pytest.mark.parametrize("target, hparams, steps", [(DQN, FAST_DQN, 5000), (PPO, FAST_PPO, 8192)])
def test_learning_smoke_over_http(tmp_path, monkeypatch, target, hparams, steps):
    """A small budget over real services must clearly beat a random policy (~22)."""
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)
    config = RunConfig.model_validate(
        {
            "name": "smoke",
            "orchestrator": {"target": GYM_ORCHESTRATOR, "env": {"id": "CartPole-v1"}},
            "agents": [
                {
                    "name": "player",
                    "target": target,
                    "hyperparameters": hparams,
                    "save_path": "final.pt",
                }
            ],
            "training": {
                "env_steps": steps,
                "eval_every": steps // 2,
                "eval_episodes": 5,
                "eval_seed": 500,
                "stop_value": 200,
            },
        }
    )
    results = run(config, tmp_path / "run", say=lambda _: None)
    random_mean = _random_mean(5, 500)
    best = max(e["mean_return"] for e in results["evals"])
    assert best > 2 * random_mean, (best, random_mean, results["evals"])
    # each evaluation played its 5 episodes on 5 env copies at once, one per copy and seed
    played = [e for e in read_episodes(tmp_path / "run") if not e["train"]]
    assert len(played) == 5 * len(results["evals"])
    for first in range(0, len(played), 5):
        batch = played[first : first + 5]
        assert sorted((e["envIndex"], e["seed"]) for e in batch) == [(i, 500 + i) for i in range(5)]
    for name in ("evals.csv", "learning_curve.png", "results.json", "config.yaml"):
        assert (tmp_path / "run" / name).exists()
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    agent_dir = tmp_path / "run" / "data" / "player"
    assert (agent_dir / "final.pt").exists() and (agent_dir / "logs" / "learner.csv").exists()
