"""The gym orchestrator's Thinker option over HTTP: agents get {"tree_reps", "real_states"}
dict observations and answer one Discrete(2A) action; budgets, episode lengths and env steps
count real env steps only; bad settings get 400."""

from __future__ import annotations

import pytest

from mistk_rl.deploy.launch import wait_ready
from mistk_rl.sdk.client import BadRequest
from mistk_rl.thinker.puzzle import MAX_STEPS
from tests.conftest import GYM_ORCHESTRATOR

PUZZLE = "mistk_rl.thinker.puzzle:MistkPuzzle-v0"
K = 4
THINKER = {"wrapper_type": 2, "rec_t": K, "max_depth": 3, "train_model": False}
PPO = {
    "seed": 0,
    "train": {"n_steps": 32},
    "policy": {"model": {"hidden_sizes": [32]}, "learn": {"epochs": 1, "batch_size": 64}},
}


def _services(launch, agent_target):
    orch_service = launch(
        "orchestrator",
        GYM_ORCHESTRATOR,
        wait=False,
        extra_args=["--env-module", "mistk_rl.thinker.puzzle"],
    )
    agent_service = launch("agent", agent_target, wait=False)
    for service in (orch_service, agent_service):
        wait_ready(service, 60)
    return orch_service.client(), agent_service


def test_a_planner_plays_the_thinker_puzzle_counting_real_steps(launch):
    orch, agent_service = _services(launch, "agents.thinker_planner:ThinkerPlannerAgent")
    agent = agent_service.client()
    agent.initialize(hyperparameters={"seed": 0})
    agent.build_model()
    orch.initialize({"id": PUZZLE, "thinker": THINKER})
    orch.register_agent("planner", agent_service.url)
    orch.start_episode(
        {"numEpisodes": 6, "numEnvs": 3, "seed": 0, "train": False}, wait=True, timeout=120
    )
    orch.stop_episode()
    episodes = orch.get_results().episodes
    lengths = [e.length for e in episodes]
    assert len(episodes) == 6 and all(1 <= n <= MAX_STEPS for n in lengths), lengths
    assert orch.status().payload["envSteps"] == sum(lengths)
    # a solved episode's return holds the +10; planning finds some in 6 levels
    assert any(e.return_ > 5 for e in episodes), [e.return_ for e in episodes]


def test_ppo_sees_dict_observations_and_learns_from_every_augmented_step(launch):
    orch, agent_service = _services(launch, "agents.ppo_agent:PPOAgent")
    agent = agent_service.client()
    agent.initialize(hyperparameters=PPO)
    agent.build_model()
    orch.initialize({"id": PUZZLE, "thinker": THINKER})
    orch.register_agent("ppo", agent_service.url)
    registered = agent.status()
    orch.start_episode({"numSteps": 60, "numEnvs": 2, "seed": 0}, wait=True, timeout=120)
    orch.stop_episode()
    real = orch.status().payload["envSteps"]
    assert real >= 60
    # every augmented step is a transition for the agent: K per real step (the run ends
    # after a real step of each env)
    assert agent.status().payload["envSteps"] == K * real
    assert registered.state == "ready"


def test_bad_thinker_settings_get_400(launch):
    orch, _ = _services(launch, "agents.thinker_planner:ThinkerPlannerAgent")
    before = orch.status()
    with pytest.raises(BadRequest, match="rec_tt"):
        orch.initialize({"id": PUZZLE, "thinker": {"rec_tt": 3}})
    with pytest.raises(BadRequest, match="Discrete action space"):
        orch.initialize({"id": "Pendulum-v1", "thinker": {"wrapper_type": 2}})
    with pytest.raises(BadRequest, match="actions"):
        orch.initialize({"id": PUZZLE, "thinker": {"actions": "Box"}})
    after = orch.status()  # nothing changed
    assert (after.state, after.resource_version) == (before.state, before.resource_version)
    orch.initialize({"id": PUZZLE, "thinker": THINKER})
    assert orch.status().state == "waiting_for_agents"


def test_orchestrators_that_do_not_wrap_envs_refuse_thinker_settings():
    from mistk_rl.errors import InvalidRequest
    from mistk_rl.service.handlers import refuse_unknown_options
    from orchestrators.game_orchestrator import GameOrchestrator
    from orchestrators.gym_orchestrator import GymOrchestrator
    from orchestrators.league_orchestrator import LeagueOrchestrator

    env = {"id": "classic/tictactoe-v3", "thinker": {"rec_t": 4}}
    for cls in (GameOrchestrator, LeagueOrchestrator):
        with pytest.raises(
            InvalidRequest, match=f"env: 'thinker' is not an option of {cls.__name__}"
        ):
            refuse_unknown_options(env, cls.env_settings, "env", cls.__name__)
    refuse_unknown_options(env, GymOrchestrator.env_settings, "env", "GymOrchestrator")


def test_multidiscrete_actions(launch):
    """actions: MultiDiscrete registers the agent with MultiDiscrete([A, 2]) (the planner
    refuses any other space) and its [primary, reset] pairs play the puzzle."""
    orch, agent_service = _services(launch, "agents.thinker_planner:ThinkerPlannerAgent")
    agent = agent_service.client()
    agent.initialize(hyperparameters={"seed": 1})
    agent.build_model()
    orch.initialize({"id": PUZZLE, "thinker": {**THINKER, "actions": "MultiDiscrete"}})
    orch.register_agent("planner", agent_service.url)
    orch.start_episode({"numEpisodes": 2, "seed": 1, "train": False}, wait=True, timeout=60)
    orch.stop_episode()
    episodes = orch.get_results().episodes
    assert len(episodes) == 2 and all(1 <= e.length <= MAX_STEPS for e in episodes)
