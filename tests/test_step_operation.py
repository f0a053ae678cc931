"""The combined step operation is replayAction + getAction in one call: same results."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.errors import IllegalState
from mistk_rl.service.handlers import AgentService
from mistk_rl.spaces import space_to_dict

HPARAMS = {
    "seed": 3,
    "log_every": 0,
    "policy": {"model": {"hidden_sizes": [32]}},
    "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 5},
}


def _service(agent_cls, tmp_path, name, hparams):
    env = gym.make("CartPole-v1")
    service = AgentService(agent_cls(), tmp_path / name)
    service.initialize({"hyperparameters": hparams})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered(
        {
            "name": "p",
            "observationSpace": space_to_dict(env.observation_space),
            "actionSpace": space_to_dict(env.action_space),
        }
    )
    return service


def _drive(service, combined: bool, steps: int = 200) -> list[int]:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    service.episodeStarted({"obs": {"p": obs.tolist()}})
    actions, replay = [], None
    for _ in range(steps):
        if combined:
            body = {"obs": {"p": obs.tolist()}, **({"replay": replay} if replay else {})}
            action = service.step(body)[0]["actions"]["p"]
        else:
            action = service.getAction({"obs": {"p": obs.tolist()}})[0]["actions"]["p"]
        actions.append(action)
        new_obs, reward, term, trunc, _ = env.step(action)
        replay = {
            "prevObs": {"p": obs.tolist()},
            "actions": {"p": action},
            "rewards": {"p": float(reward)},
            "newObs": {"p": new_obs.tolist()},
            "terminated": {"p": bool(term)},
            "truncated": {"p": bool(trunc)},
        }
        if not combined:
            service.replayAction(replay)
            replay = None
        obs = new_obs if not (term or trunc) else env.reset()[0]
    if replay:
        service.replayAction(replay)
    return actions


@pytest.mark.parametrize(
    "agent_cls, hparams",
    [
        (DQNAgent, HPARAMS),
        (
            PPOAgent,
            {
                "seed": 3,
                "log_every": 0,
                "train": {"n_steps": 64},
                "policy": {"learn": {"epochs": 2, "batch_size": 32}},
            },
        ),
    ],
)
def test_combined_step_equals_replay_then_get_action(tmp_path, agent_cls, hparams):
    separate = _service(agent_cls, tmp_path, "separate", hparams)
    combined = _service(agent_cls, tmp_path, "combined", hparams)
    assert _drive(separate, combined=False) == _drive(combined, combined=True)
    a, b = separate.lifecycle.status()["payload"], combined.lifecycle.status()["payload"]
    assert a["updates"] > 0
    for key in ("envSteps", "updates", "loss"):
        assert a[key] == b[key], key


def test_step_is_only_legal_in_an_episode(tmp_path):
    service = _service(DQNAgent, tmp_path, "a", HPARAMS)
    with pytest.raises(IllegalState):
        service.step({"obs": {"p": [0.0, 0.0, 0.0, 0.0]}})
