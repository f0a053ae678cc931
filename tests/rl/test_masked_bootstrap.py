"""Masked bootstrap: DQN's target ranges over the legal actions of the next state."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from mistk_rl.rl.data.samples import ReplaySamples
from mistk_rl.rl.envs.base import Timestep
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.sdk.stepping import EntityStepper, replay_batch
from orchestrators.gym_orchestrator import _outcome
from tests.rl.nstep_reference import NStepAccumulator

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
ACT = gym.spaces.Discrete(4)


@pytest.mark.parametrize("double", [True, False])
def test_a_mask_that_hides_the_max_action_changes_the_target(double):
    policy = DQNPolicy({"learn": {"double": double}}, OBS, ACT, seed=0)
    next_obs = torch.rand(8, 3)
    q_next = policy.target(next_obs)["logit"]
    best = q_next.argmax(dim=1)
    hide_best = torch.ones(8, 4, dtype=torch.bool)
    hide_best[torch.arange(8), best] = False
    args = (next_obs, torch.zeros(8), torch.ones(8), torch.ones(8))
    unmasked = policy._td_target(*args, None)
    masked = policy._td_target(*args, hide_best)
    all_legal = policy._td_target(*args, torch.ones(8, 4, dtype=torch.bool))
    assert torch.equal(unmasked, all_legal)
    if not double:  # the max of the others is smaller, always
        assert (masked < unmasked).all()
        expected = q_next.masked_fill(~hide_best, float("-inf")).max(dim=1).values
        assert torch.allclose(masked, expected)
    else:  # double Q: the online argmax must be legal, so it is not the hidden action
        online_best = (
            policy.model(next_obs)["logit"].masked_fill(~hide_best, float("-inf")).argmax(dim=1)
        )
        assert hide_best[torch.arange(8), online_best].all()
        assert torch.allclose(masked, q_next.gather(1, online_best[:, None]).squeeze(1))


def test_no_legal_action_adds_nothing():
    policy = DQNPolicy({"learn": {"double": False}}, OBS, ACT, seed=0)
    none = torch.zeros(2, 4, dtype=torch.bool)
    target = policy._td_target(torch.rand(2, 3), torch.ones(2), torch.ones(2), torch.ones(2), none)
    assert torch.equal(target, torch.ones(2))


def test_a_masked_batch_trains():
    policy = DQNPolicy({"learn": {"batch_size": 4}}, OBS, ACT, seed=0)
    batch = ReplaySamples(
        obs=torch.rand(4, 3),
        action=torch.tensor([0, 1, 2, 3]),
        reward=torch.ones(4),
        next_obs=torch.rand(4, 3),
        terminated=torch.zeros(4),
        next_action_mask=torch.tensor(
            [[1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool
        ),
    )
    assert np.isfinite(policy.learn_mode.forward(batch)["loss"])


def test_nstep_keeps_the_mask_of_the_window_end():
    steps = [
        {
            "obs": i,
            "action": 0,
            "reward": 1.0,
            "next_obs": i + 1,
            "terminated": False,
            "truncated": False,
            "next_action_mask": np.array([i % 2 == 0, True]),
        }
        for i in range(4)
    ]

    def first(n: int) -> dict:
        acc = NStepAccumulator(n, gamma=0.9)
        return next(item for transition in steps for item in acc.push(transition))

    assert first(3)["next_obs"] == 3 and first(3)["next_action_mask"].tolist() == [True, True]
    assert first(2)["next_action_mask"].tolist() == [False, True]


def test_the_orchestrator_replays_the_next_masks_the_env_gives():
    with_mask = Timestep(
        obs=5,
        reward=0.0,
        terminated=False,
        truncated=False,
        info={"action_mask": np.array([1, 0, 1], dtype=np.int8)},
    )
    without = Timestep(obs=5, reward=0.0, terminated=False, truncated=False)
    assert _outcome(with_mask, truncated=False).action_mask.tolist() == [1, 0, 1]
    assert _outcome(without, truncated=False).action_mask is None

    def replayed(*timesteps: Timestep) -> dict:
        stepper = EntityStepper(None, frozenset(), "p", num_envs=len(timesteps))
        stepper.sent = {i: (4, 1) for i in range(len(timesteps))}
        return replay_batch(
            {
                stepper.entity(i): stepper._transition(i, _outcome(ts, False))
                for i, ts in enumerate(timesteps)
            }
        )

    both = replayed(with_mask, with_mask)
    assert both["newActionMask"]["p:0"].tolist() == [1, 0, 1]
    assert "newActionMask" not in replayed(with_mask, without)


def test_replayed_next_masks_reach_the_dqn_replay_buffer(tmp_path):
    from agents.dqn_agent import DQNAgent
    from mistk_rl.errors import InvalidRequest
    from mistk_rl.service.handlers import AgentService
    from mistk_rl.spaces import space_to_dict

    service = AgentService(DQNAgent(), tmp_path)
    service.initialize({"hyperparameters": {"seed": 0, "train": {"learning_starts": 1000}}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered(
        {"name": "p", "observationSpace": space_to_dict(OBS), "actionSpace": space_to_dict(ACT)}
    )
    obs = [0.0, 0.1, 0.2]
    service.episodeStarted({"obs": {"p": obs}, "actionMask": {"p": [1, 1, 0, 1]}})
    action = service.getAction({"obs": {"p": obs}, "actionMask": {"p": [1, 1, 0, 1]}})[0]
    replay = {
        "prevObs": {"p": obs},
        "actions": {"p": action["actions"]["p"]},
        "rewards": {"p": 1.0},
        "newObs": {"p": obs},
        "terminated": {"p": False},
        "truncated": {"p": False},
        "newActionMask": {"p": [0, 1, 0, 0]},
    }
    with pytest.raises(InvalidRequest, match="newActionMask"):
        service.replayAction({**replay, "newActionMask": {"p": [0, 1, 0]}})
    service.replayAction(replay)
    (stored,) = service.agent.trainer.buffer.sample(1)
    assert stored["next_action_mask"].tolist() == [False, True, False, False]
