"""GymOrchestrator over HTTP: training flags, other space kinds, action masks."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from tests.conftest import GYM_ORCHESTRATOR

COUNTING = "tests.service_fixtures:CountingAgent"


def _pair(launch, env, skip_train=False):
    orch_service = launch(
        "orchestrator", GYM_ORCHESTRATOR, extra_args=["--env-module", "tests.rl.faulty_env"]
    )
    agent_service = launch("agent", COUNTING)
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize(env)
    agent.initialize(hyperparameters={"seed": 3})
    agent.build_model()
    orch.register_agent("player", agent_service.url, skip_train=skip_train)
    return orch, agent


def _play(orch, **config):
    """Run one startEpisode; return the episodes it added to the results."""
    before = len(orch.get_results().episodes)
    orch.start_episode(config, wait=True, timeout=120)
    orch.stop_episode()
    return orch.get_results().episodes[before:]


def test_replay_only_when_training(launch):
    orch, agent = _pair(launch, "CartPole-v1")
    trained = _play(orch, numEpisodes=2, seed=0, train=True)
    assert agent.status().payload["replayed"] == sum(e.length for e in trained)
    _play(orch, numEpisodes=2, seed=0, train=False)  # evaluation: no replay
    payload = agent.status().payload
    assert payload["replayed"] == sum(e.length for e in trained)
    assert payload["modes"] == ["collect", "eval"]  # one agent episode per startEpisode


def test_skip_train_agent_never_replays(launch):
    orch, agent = _pair(launch, "CartPole-v1", skip_train=True)
    episodes = _play(orch, numEpisodes=2, seed=0, train=True)
    assert sum(e.length for e in episodes) > 0
    payload = agent.status().payload
    assert payload.get("replayed", 0) == 0 and payload["modes"] == ["eval"]


def test_results_accumulate_across_runs(launch):
    orch, _ = _pair(launch, "CartPole-v1")
    first = _play(orch, numEpisodes=2, seed=11)
    second = _play(orch, numEpisodes=1, seed=11)
    # the first episode of each run is seeded; later ones continue the env's random stream
    assert [e.seed for e in first + second] == [11, None, 11]
    assert [e.episode for e in orch.get_results().episodes] == [0, 1, 2]
    # a page at a time: `limit`, and the SDK's iterator over pages
    assert [e.episode for e in orch.get_results(since=1, limit=1).episodes] == [1]
    assert [e.episode for e in orch.iter_episodes(page=2)] == [0, 1, 2]
    assert [e.episode for e in orch.iter_episodes(since=2, page=1)] == [2]
    # a call's counts without its episodes (a long block's need not travel)
    quiet = orch.play({"numEpisodes": 1, "seed": 3}, episodes=False)
    assert quiet.episodes == [] and quiet.env_steps > 0 and quiet.after.episodes_done == 4


@pytest.mark.parametrize(
    "env",
    [
        {"id": "Pendulum-v1"},  # Box actions, episodes truncated by maxSteps
        {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}},  # Discrete observations
    ],
)
def test_other_space_kinds(launch, env):
    orch, _ = _pair(launch, env)
    episodes = _play(orch, numEpisodes=2, seed=0, maxSteps=25)
    assert len(episodes) == 2 and all(1 <= e.length <= 25 for e in episodes)


def test_max_steps_truncates(launch):
    orch, _ = _pair(launch, {"id": "Pendulum-v1"})
    (episode,) = _play(orch, numEpisodes=1, seed=0, maxSteps=7)
    assert episode.length == 7 and episode.truncated and not episode.terminated


def test_taxi_action_masks_reach_the_agent(launch):
    """Taxi-v4 puts an action mask in info; the random agent must only pick allowed actions,
    so the orchestrator never sees an illegal one and the episode runs."""
    orch, agent = _pair(launch, "Taxi-v4")
    (episode,) = _play(orch, numEpisodes=1, seed=0, maxSteps=40)
    payload = agent.status().payload
    assert payload["masked"] == episode.length  # every getAction carried the mask
    assert payload["violations"] == 0


def test_random_agent_respects_masks_in_process(tmp_path):
    from agents.random_agent import RandomAgent
    from mistk_rl.service.handlers import AgentService

    service = AgentService(RandomAgent(), tmp_path)
    service.initialize({"hyperparameters": {"seed": 0}})
    service.lifecycle.wait_for_state("initialized", 5)
    service.agentRegistered({"name": "p", "actionSpace": {"type": "Discrete", "n": 6}})
    service.episodeStarted({"obs": {"p": 0}})
    mask = [0, 0, 0, 1, 0, 1]
    picks = {
        service.getAction({"obs": {"p": 0}, "actionMask": {"p": mask}})[0]["actions"]["p"]
        for _ in range(200)
    }
    assert picks == {3, 5}
    unmasked = {service.getAction({"obs": {"p": 0}})[0]["actions"]["p"] for _ in range(200)}
    assert unmasked == set(range(6))
    assert np.all(np.isin(list(picks), np.flatnonzero(mask)))


def test_num_steps_runs_whole_episodes_until_the_budget(launch):
    orch, _ = _pair(launch, "CartPole-v1")
    episodes = _play(orch, numSteps=100, seed=0)
    lengths = [e.length for e in episodes]
    assert sum(lengths) >= 100 and sum(lengths[:-1]) < 100  # no episode started past it
    assert [e.env_steps for e in episodes] == list(np.cumsum(lengths))
    capped = _play(orch, numSteps=10_000, numEpisodes=2, seed=0)
    assert len(capped) == 2


@pytest.mark.parametrize("manager", ["base", "subprocess"])  # (async: timing decides)
def test_resumed_blocks_play_exactly_the_continuous_run(launch, manager):
    """Blocks of numSteps with resume stop at the budget and continue their episodes, so
    they add up to one uninterrupted run."""
    config = dict(numEnvs=3, envManager=manager, seed=5, train=True, resume=True)
    orch, _ = _pair(launch, "CartPole-v1")
    whole = _play(orch, numSteps=150, **config)
    assert orch.status().payload["envSteps"] == 150  # cut at the budget (50 steps of 3 envs)
    orch, agent = _pair(launch, "CartPole-v1")
    blocks = [e for _ in range(5) for e in _play(orch, numSteps=30, **config)]
    key = [(e.env_index, e.length, e.return_) for e in whole]
    assert [(e.env_index, e.length, e.return_) for e in blocks] == key
    assert sum(e.length for e in blocks) < 150  # the episodes in progress are not recorded
    assert agent.status().payload["replayed"] == 150  # every training step replayed once


def test_pipelined_blocks_play_the_continuous_pipelined_run_and_replay_each_step_once(launch):
    """pipelineDepth 2: half the copies step while the agent answers for the other half.
    A block's end reads the answer in flight and keeps its actions for the next block, so
    blocks still add up to one uninterrupted run, and every step is replayed once."""
    config = dict(numEnvs=4, seed=5, train=True, resume=True, pipelineDepth=2)
    orch, agent = _pair(launch, "CartPole-v1")
    whole = _play(orch, numSteps=200, **config)
    assert orch.status().payload["envSteps"] == 200
    assert agent.status().payload["replayed"] == 200
    orch, agent = _pair(launch, "CartPole-v1")
    blocks = [e for _ in range(5) for e in _play(orch, numSteps=40, **config)]
    key = [(e.env_index, e.length, e.return_) for e in whole]
    assert len(key) > 4 and [(e.env_index, e.length, e.return_) for e in blocks] == key
    assert agent.status().payload["replayed"] == 200


@pytest.mark.parametrize(
    "config, match",
    [
        ({"numEnvs": 2, "pipelineDepth": 3}, "more than numEnvs 2"),
        (
            {"numEnvs": 4, "pipelineDepth": 2, "agents": {"player": {"localInference": {}}}},
            "sends no step requests",
        ),
    ],
)
def test_a_pipeline_it_cannot_run_is_refused_and_changes_nothing(launch, config, match):
    from mistk_rl.sdk.client import BadRequest

    orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
    agent_service = launch("agent", "agents.dqn_agent:DQNAgent")
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize("CartPole-v1")
    agent.initialize(hyperparameters={"seed": 0})
    agent.build_model()
    orch.register_agent("player", agent_service.url)
    before = orch.status()
    with pytest.raises(BadRequest, match=match):
        orch.start_episode(config)
    after = orch.status()
    assert (after.state, after.payload.get("envSteps", 0)) == (before.state, 0)


@pytest.mark.parametrize("manager", ["base", "async"])
def test_an_evaluation_between_resumed_blocks_leaves_training_episodes_alone(launch, manager):
    """Training blocks resume their envs although evaluations on as many envs ran between
    them. Blocks of 60 steps give each env about 100 training steps in all: async hands steps
    to whichever env answers first, so episode lengths and the split vary with timing, but a
    random CartPole episode is almost never that long."""
    orch, agent = _pair(launch, "CartPole-v1")
    trained, steps = [], 0
    for _ in range(5):
        trained += _play(
            orch, numSteps=60, numEnvs=3, seed=5, train=True, resume=True, envManager=manager
        )
        taken = orch.status().payload["envSteps"] - steps
        assert 60 <= taken < 63  # cut at the budget (async: within one batch of it)
        evaluated = _play(
            orch, numEpisodes=3, numEnvs=3, seed=9, train=False, envManager=manager
        )  # the same number of envs
        steps += taken + sum(e.length for e in evaluated)
    # had an evaluation reset the training envs, each block would reseed them: every env's
    # first training episode carries its seed, and no later one does
    for env_index in range(3):
        seeds = [e.seed for e in trained if e.env_index == env_index]
        assert seeds[:1] == [5 + env_index] and not any(seeds[1:]), (env_index, seeds)
    assert agent.status().payload["replayed"] == steps - sum(  # every training step, once
        e.length for e in orch.get_results().episodes if not e.train
    )


@pytest.mark.parametrize("manager", ["base", "subprocess", "async"])
def test_vectorized_episodes_are_counted_once_per_env(launch, manager):
    orch, agent = _pair(launch, "CartPole-v1")
    episodes = _play(orch, numEpisodes=8, numEnvs=4, envManager=manager, seed=0, train=True)
    assert len(episodes) == 8
    assert sorted(e.env_index for e in episodes) == [0, 0, 1, 1, 2, 2, 3, 3]  # quota 2 each
    assert sorted(e.seed for e in episodes if e.seed is not None) == [0, 1, 2, 3]
    payload = agent.status().payload
    assert payload["replayed"] == sum(e.length for e in episodes)  # each step learned once


def test_same_seed_same_vectorized_run_across_managers(launch):
    runs = [
        _play(
            _pair(launch, "CartPole-v1")[0],
            numEpisodes=4,
            numEnvs=2,
            envManager=m,
            seed=5,
            train=False,
        )
        for m in ("base", "subprocess")
    ]
    assert [(e.env_index, e.length) for e in runs[0]] == [(e.env_index, e.length) for e in runs[1]]


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_crashing_or_hanging_env_costs_only_its_episode(launch, tmp_path, mode):
    env = {
        "id": "tests.rl.faulty_env:FaultyCartPole-v0",
        "kwargs": {"mode": mode, "at": 5, "marker": str(tmp_path / "failed")},
    }
    orch, _ = _pair(launch, env)
    episodes = _play(
        orch,
        numEpisodes=6,
        numEnvs=3,
        envManager="subprocess",
        seed=0,
        train=False,
        stepTimeout=1.0,
    )
    assert len(episodes) == 6
    assert [e.abnormal for e in episodes].count(True) == 1
    normal = [e for e in episodes if not e.abnormal]
    assert all(e.terminated or e.truncated for e in normal)
    assert orch.status().payload["envRestarts"] == 1


@pytest.mark.parametrize("last_cluster", [False, True])
def test_env_copies_on_ray_without_a_cluster_are_a_400_that_changes_nothing(
    launch, monkeypatch, tmp_path, last_cluster
):
    """envManager ray where no Ray cluster answers: refused at startEpisode, naming why
    (the cluster tests run it on one: tests/cluster/cases_env_workers.py). Also where Ray's
    ray_current_cluster file names a cluster that is gone, as one that stopped leaves it:
    ray.init would retry that address for minutes, past the client's timeout."""
    from mistk_rl.sdk.client import BadRequest

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # Ray's files: tmp_path/ray/...
    (tmp_path / "ray").mkdir()  # (the services inherit the variable)
    if last_cluster:
        with socket.socket() as gone:  # a port nothing listens on once this closes
            gone.bind(("127.0.0.1", 0))
            port = gone.getsockname()[1]
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    orch, _ = _pair(launch, "CartPole-v1")
    before = orch.status()
    with pytest.raises(BadRequest, match="envManager ray: no Ray cluster") as refused:
        orch.start_episode({"numEpisodes": 1, "numEnvs": 2, "envManager": "ray"})
    if last_cluster:  # (the file's port; or, while tests/cluster/ runs beside this test in
        # its own network namespace, that cluster's: Ray's auto prefers a running gcs_server)
        assert ", Ray's last cluster here" in str(refused.value)
    assert orch.status().state == before.state
    assert orch.get_results().episodes == []
