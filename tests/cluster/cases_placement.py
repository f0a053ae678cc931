"""Services placed on the cluster by `mistk-rl run`'s `cluster:` block
(`mistk_rl.deploy.cluster`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import RunConfig
from harness.run import HarnessError, read_episodes, run

pytestmark = pytest.mark.usefixtures("in_repo")


def _config(
    tmp_path: Path, agent: dict, orchestrator: dict | None = None, startup: float = 60.0
) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "placed",
            "orchestrator": {
                "target": "orchestrators.gym_orchestrator:GymOrchestrator",
                "env": {"id": "CartPole-v1"},
                **(orchestrator or {}),
            },
            "agents": [
                {
                    "name": "player",
                    "target": "agents.random_agent:RandomAgent",
                    "hyperparameters": {"seed": 0},
                    "save_path": "player.json",
                    **agent,
                }
            ],
            "episodes": [{"num_episodes": 2, "seed": 0, "max_steps": 50}],
            "cluster": {"address": "auto", "data_root": str(tmp_path / "nodes")},
            "timeouts": {"startup": startup, "call": 30},
        }
    )


def test_each_service_runs_on_the_node_its_resources_name(cluster, tmp_path):
    """The orchestrator asks for `alpha`, the agent for `beta`: each lands on that node,
    they play over HTTP, and each service wrote only inside its data dir on its node."""
    config = _config(
        tmp_path, {"cpus": 0.5, "resources": {"beta": 1}}, {"cpus": 0.5, "resources": {"alpha": 1}}
    )
    run_dir = tmp_path / "run"
    results = run(config, run_dir, say=lambda _: None)

    placement = results["placement"]
    assert placement["orchestrator"]["node"] == cluster.node_ids["alpha"]
    assert placement["player"]["node"] == cluster.node_ids["beta"]
    assert results == json.loads((run_dir / "results.json").read_text())
    episodes = read_episodes(run_dir)
    assert len(episodes) == results["episode_count"] == 2
    assert all(e["length"] > 0 for e in episodes)
    # the agent saved its model in its own data dir, on its node; the run dir holds no data
    node_dirs = tmp_path / "nodes" / "run"
    assert (node_dirs / "player" / "player.json").is_file()
    assert {p.name for p in node_dirs.iterdir()} == {"orchestrator", "player", "logs"}
    assert not (run_dir / "data").exists()


def test_a_service_the_cluster_cannot_place_ends_the_run_naming_it(cluster, tmp_path):
    """No node has `gamma`: the run stops, with an error naming the agent and what it asked
    for, once that has lasted `UNPLACEABLE_GRACE_S` (not at the startup timeout), and
    leaves no actor behind."""
    import ray

    # (15 s: the orchestrator, placeable, must come up within it too, also on a busy machine;
    # 5 s once failed there with the orchestrator not yet answering)
    config = _config(tmp_path, {"resources": {"gamma": 1}}, startup=15.0)
    unplaceable = r"starting agent 'player'.*not placed: no live node of the cluster has .*1 gamma"
    with pytest.raises(HarnessError, match=unplaceable):
        run(config, tmp_path / "run", say=lambda _: None)  # (a hang fails the case's bound)
    assert ray.util.list_named_actors() == []


def test_a_service_that_fails_to_start_on_its_node_reports_its_log(cluster, tmp_path):
    config = _config(tmp_path, {"target": "agents.random_agent:NoSuchAgent"})
    with pytest.raises(HarnessError, match=r"starting agent 'player'.*NoSuchAgent"):
        run(config, tmp_path / "run", say=lambda _: None)
    import ray

    assert ray.util.list_named_actors() == []


class _Idle:
    def ping(self) -> int:
        return 1


def test_a_killed_service_is_gone_when_kill_returns(cluster):
    """`PlacedService.kill` returns once Ray has ended the actor: its name is free at once
    (right after a bare `ray.kill` Ray still listed it 2 times in 40)."""
    import ray

    from mistk_rl.deploy.cluster import PlacedService, Resources

    host = ray.remote(max_restarts=0, num_cpus=0)(_Idle)
    for i in range(20):
        actor = host.options(name=f"kill-case/{i}").remote()
        ray.get(actor.ping.remote(), timeout=30)
        PlacedService("agent", "-", str(i), Resources(cpus=0), actor).kill()
        assert f"kill-case/{i}" not in ray.util.list_named_actors()


def test_a_service_asked_near_the_driver_runs_on_its_node_when_it_can(cluster, tmp_path):
    """The league orchestrator's default (`harness.run`): on the driver's node (the head
    here) while it has room, elsewhere when it has not."""
    from mistk_rl.deploy.cluster import Cluster, Resources

    placed = Cluster("auto", run_id="near", data_root=str(tmp_path / "nodes"))
    near = placed.spawn(
        "agent",
        "near",
        "agents.random_agent:RandomAgent",
        resources=Resources(cpus=0.5),
        near_driver=True,
    )
    # no room on the head (2 CPUs): soft affinity places it on another node
    roomless = placed.spawn(
        "agent",
        "roomless",
        "agents.random_agent:RandomAgent",
        resources=Resources(cpus=2.0),
        near_driver=True,
    )
    try:
        for service in (near, roomless):
            service.wait_ready(60)
        assert placed.driver_node_id() == cluster.node_ids["head"]
        assert near.node_id == cluster.node_ids["head"]
        assert roomless.node_id in (cluster.node_ids["alpha"], cluster.node_ids["beta"])
    finally:
        for service in (near, roomless):
            service.stop()
        placed.close()
