"""envManager ray: a gym orchestrator's env copies as Ray actors on other nodes
(`mistk_rl.rl.envs.ray_workers`), supervised as the subprocess manager's workers are."""

from __future__ import annotations

import time

import pytest

from mistk_rl.rl.envs import BaseEnvManager, RayEnvManager, make_env_fns
from tests.rl.faulty_env import Faulty
from tests.rl.test_env_managers import _trajectories, abnormal_steps

pytestmark = pytest.mark.usefixtures("in_repo")
CARTPOLE = make_env_fns("CartPole-v1", None, 1)[0]
ON_ALPHA = {"cpus": 0.25, "resources": {"alpha": 1}}


def test_env_copies_run_on_the_node_their_resources_name_and_step_as_in_process(cluster):
    with RayEnvManager([CARTPOLE] * 3, ON_ALPHA) as manager:
        manager.launch(seed=7)
        assert manager.nodes == [cluster.node_ids["alpha"]] * 3
        on_ray = _trajectories(manager)
    with BaseEnvManager([CARTPOLE] * 3) as manager:
        manager.launch(seed=7)
        assert _trajectories(manager) == on_ray  # (auto-reset in the actor, as in a worker)


@pytest.mark.parametrize("mode", ["raise", "exit", "hang", "killed"])
def test_a_failing_env_actor_is_started_again_and_reported_while_others_go_on(
    cluster, tmp_path, mode
):
    import ray

    faulty = CARTPOLE if mode == "killed" else Faulty(mode, at=5, marker=str(tmp_path / "m"))
    with RayEnvManager([CARTPOLE, faulty, CARTPOLE], {**ON_ALPHA, "step_timeout": 2.0}) as manager:
        manager.launch(seed=0)

        def kill_at_4(step: int) -> None:  # its process (or its node) is gone
            if mode == "killed" and step == 4:
                ray.kill(manager._actors[1], no_restart=True)

        abnormal = abnormal_steps(manager, 12, kill_at_4)
        assert [i for i, _ in abnormal] == [1]
        assert manager.stats["restarts_per_env"] == [0, 1, 0]
        expected = {
            "raise": "injected env failure",
            "exit": "died",
            "hang": "hung",
            "killed": "died",
        }[mode]
        assert expected in abnormal[0][1]
        assert manager.nodes[1] == cluster.node_ids["alpha"]  # started again where it fits
    _wait_for_alpha(4.0)  # close leaves no actor behind: they gave back their units


def _wait_for_alpha(units: float, timeout: float = 30.0) -> None:
    """Until the `alpha` node has `units` free (Ray frees a killed actor's resources a
    moment after `ray.kill`)."""
    import ray

    deadline = time.monotonic() + timeout
    while ray.available_resources().get("alpha") != units and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("alpha") == units


def test_a_gym_orchestrator_on_the_cluster_plays_with_env_copies_on_another_node(cluster, tmp_path):
    """The orchestrator service, placed by Ray, reaches the cluster (RAY_ADDRESS from its
    host actor) and starts its env copies where `env.envWorkers` says: while it keeps them
    (until reset), they hold 3 of the `alpha` node's 4 units."""

    from mistk_rl.deploy.cluster import Cluster, Resources
    from mistk_rl.sdk.client import AgentClient, OrchestratorClient

    placed = Cluster("auto", run_id="envs", data_root=str(tmp_path / "nodes"))
    services = [
        placed.spawn(
            "orchestrator",
            "orchestrator",
            "orchestrators.gym_orchestrator:GymOrchestrator",
            resources=Resources(cpus=0.25, custom={"head": 1}),
        ),
        placed.spawn(
            "agent",
            "player",
            "agents.random_agent:RandomAgent",
            resources=Resources(cpus=0.25, custom={"beta": 1}),
        ),
    ]
    try:
        for service in services:
            service.wait_ready(60)
        orch = OrchestratorClient(services[0].url, timeout=60)
        agent = AgentClient(services[1].url)
        orch.initialize({"id": "CartPole-v1", "envWorkers": ON_ALPHA})
        agent.initialize(hyperparameters={"seed": 0})
        agent.build_model()
        orch.register_agent("player", services[1].url)
        orch.start_episode(
            {"numEpisodes": 6, "numEnvs": 3, "envManager": "ray", "seed": 0}, wait=True, timeout=120
        )
        orch.stop_episode()
        episodes = orch.get_results().episodes
        assert sorted(e.env_index for e in episodes) == [0, 0, 1, 1, 2, 2]
        assert all(e.length > 0 and not e.abnormal for e in episodes)
        assert orch.status().payload["envRestarts"] == 0
        _wait_for_alpha(1.0)  # its 3 env actors hold 3 of the 4
        orch.reset(reset_agents=False)  # the orchestrator closes its managers: actors go
        _wait_for_alpha(4.0)
    finally:
        for service in services:
            service.stop()
        placed.close()
