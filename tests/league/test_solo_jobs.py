"""Solo jobs: a SoloActivePlayer's job carries the episode settings a gym orchestrator plays
it with (env kwargs, env copies, episodes, the exploration epsilon of the player's step)."""

from __future__ import annotations

import math

import pytest

from agents.random_agent import RandomAgent
from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.agent import EpisodeInfo
from mistk_rl.league.manager import LeagueManager

DQN = "agents.dqn_agent:DQNAgent"
GYM = "orchestrators.gym_orchestrator:GymOrchestrator"


def _solo_league() -> LeagueManager:
    return LeagueManager.create(
        [
            {
                "type": "solo",
                "id": "learner",
                "checkpoint": "league/players/learner.pt",
                "env_kwargs": {"max_episode_steps": 20},
                "num_envs": 3,
                "episodes_per_job": 6,
                "eps_start": 0.95,
                "eps_end": 0.05,
                "eps_decay": 10_000,
            }
        ],
        one_phase_step=1000,
        seed=0,
    )


def test_solo_job_settings_follow_the_players_steps():
    league = _solo_league()
    first = league.launch_job("learner")
    assert first.job.opponent == "" and first.job.branch == "solo"
    assert first.job.settings["agents"]["learner"]["epsilon"] == pytest.approx(0.95)
    league.finish_job(first.job_id, [], steps=10_000)  # no payoff: there is no opponent
    second = league.launch_job("learner").job
    assert second.settings["agents"]["learner"]["epsilon"] == pytest.approx(
        0.9 * math.exp(-1) + 0.05, abs=1e-6
    )
    assert second.settings["envKwargs"] == {"max_episode_steps": 20}


def test_an_agent_without_epsilon_greedy_refuses_an_epsilon():
    info = EpisodeInfo(obs={}, mode="collect", epsilon=0.3)
    with pytest.raises(InvalidRequest, match="epsilon"):
        RandomAgent().validate_episode_start(info)


def test_a_gym_orchestrator_plays_a_solo_job_over_http(launch):
    orch = launch("orchestrator", GYM).client()
    service = launch("agent", DQN)
    agent = service.client()
    agent.initialize(hyperparameters={"seed": 0, "policy": {"model": {"hidden_sizes": [16]}}})
    agent.build_model()
    orch.initialize({"id": "CartPole-v1"})
    orch.register_agent("learner", service.url)
    job = _solo_league().launch_job("learner").job
    orch.start_episode(job.settings, wait=True, timeout=120)
    episodes = orch.get_results().episodes
    assert len(episodes) == 6
    assert {e.env_index for e in episodes} == {0, 1, 2}  # numEnvs from the job
    assert max(e.length for e in episodes) <= 20  # its env kwargs (a 20-step time limit)
    status = agent.status().payload
    assert status["epsilon"] == pytest.approx(job.settings["agents"]["learner"]["epsilon"])
    assert status["envSteps"] == sum(e.length for e in episodes)  # it trained on them
    orch.reset()
