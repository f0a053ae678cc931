"""A tic-tac-toe league on the cluster: workers and players on different nodes, checkpoints
moved over HTTP (no shared directory), a worker's node lost mid-league and the worker
started again on another node."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from harness.config import RunConfig
from harness.run import run, run_from_file

pytestmark = pytest.mark.usefixtures("in_repo")
REPO = Path(__file__).resolve().parents[2]


def _league_config(tmp_path: Path) -> RunConfig:
    """configs/tictactoe_league.yaml, small: little DQNs, 600 main-player moves, an
    evaluation every 300 against the random player, enumerated."""
    data = yaml.safe_load((REPO / "configs" / "tictactoe_league.yaml").read_text())
    league = data["orchestrator"]["env"]["league"]
    league.update(
        onePhaseStep=300,
        gamesPerJob=16,
        numEnvs=8,
        workerBackoff=0.1,
        workerBackoffMax=0.5,
        maxWorkerFailures=2,
    )
    # (no resources: the league orchestrator runs on the driver's node by default)
    data["orchestrator"].update(cpus=0.2)
    data["workers"] = [
        {
            "target": "orchestrators.game_orchestrator:GameOrchestrator",
            "cpus": 0.2,
            "resources": {where: 1},
        }
        for where in ("alpha", "games")
    ]
    for agent in data["agents"]:
        hyper = agent["hyperparameters"]
        hyper["policy"]["model"] = {"hidden_sizes": [32]}
        hyper["train"] = {"learning_starts": 100, "train_freq": 16, "gradient_steps": 2}
        hyper["buffer"] = {"type": "naive", "replay_buffer_size": 4000}
        agent.update(cpus=0.2, resources={"beta": 0.5})
    data["game_training"] = {"agent_steps": 600, "eval_every": 300, "seed": 0, "checkpoints": 2}
    data["evaluation"]["against"] = [{"opponent": "random", "exhaustive": True}]
    data["cluster"] = {"address": "auto", "data_root": str(tmp_path / "nodes")}
    return RunConfig.model_validate(data)


def test_a_league_spreads_over_nodes_and_a_lost_worker_is_started_again_elsewhere(
    cluster, add_node, tmp_path
):
    first_games_node = add_node(num_cpus=1, resources={"games": 1})
    run_dir = tmp_path / "run"
    nodes_now: dict[str, object] = {}
    replaced = threading.Event()

    def say(line: str) -> None:
        if "worker worker1" in line and "started again" in line:
            replaced.set()
        if not nodes_now and (run_dir / "progress.json").exists():  # the first evaluation
            cluster.remove_node(first_games_node)  # (worker1's node) ...
            nodes_now["games"] = add_node(num_cpus=1, resources={"games": 1})
            # ... and another joins: the worker is started again there, and (the league
            # being between evaluations now) plays the next phase's jobs
            assert replaced.wait(120), "worker1 was not started again within 120 s"

    results = run(_league_config(tmp_path), run_dir, say=say, max_restarts=1)

    placement = results["placement"]
    nodes = {name: where["node"] for name, where in placement.items()}
    assert nodes["worker0"] == cluster.node_ids["alpha"]
    assert [w["node"] for w in placement["worker1"]["was"]] == [first_games_node.node_id]
    assert nodes["worker1"] == nodes_now["games"].node_id
    assert {
        nodes[a] for a in ("main", "main_exploiter", "league_exploiter", "frozen_0", "frozen_1")
    } == {cluster.node_ids["beta"]}
    assert nodes["orchestrator"] == cluster.node_ids["head"]
    # the league went on: both evaluations ran, the new worker played jobs
    assert [e["agent_steps"] >= s for e, s in zip(results["evals"], (300, 600))] == [True] * 2
    workers = {w["url"]: w for w in results["league"]["workers"]}
    lost = workers[placement["worker1"]["was"][0]["url"]]
    assert lost["state"] == "dropped" and lost["replaced_by"] == 2, lost
    again = workers[placement["worker1"]["url"]]
    assert again["failed"] == 0 and again["jobs"] > 0, again
    assert workers[placement["worker0"]["url"]]["failed"] == 0
    # no shared directory: the league orchestrator's own holds the league ...
    own = tmp_path / "nodes" / "run" / "orchestrator" / "league"
    state = json.loads((own / "league.json").read_text())
    for snapshot in state["historical"]:
        assert (own / snapshot["checkpoint_path"].removeprefix("league/")).is_file()
    # ... every service wrote only in its own data dir (and the logs beside them)
    node_root = tmp_path / "nodes" / "run"
    assert {p.name for p in node_root.iterdir()} == set(nodes) | {"worker1.1", "logs"}
    assert not (run_dir / "league").exists() and not (run_dir / "data").exists()


def test_a_league_whose_players_node_is_lost_resumes_the_same_league(
    cluster, add_node, tmp_path, monkeypatch
):
    """The players' agents are on one node, lost at the first evaluation: the run starts
    its services again (the agents on a node that joins, the league orchestrator on the
    driver's node, where its directory is) and resumes from that evaluation's checkpoint.
    The league goes on where it was (its counts carry on), not as a new one."""
    from tests.cluster.cases_node_loss import _follow, _write

    add_node(num_cpus=1, resources={"games": 1})  # (worker1's)
    players_node = add_node(num_cpus=2, resources={"players": 4})
    config = _league_config(tmp_path)
    for agent in config.agents:
        agent.resources = {"players": 0.5}
    run_dir = tmp_path / "run"
    lost: dict[str, object] = {}

    def on_line(line: str) -> None:
        if not lost and (run_dir / "progress.json").exists():  # the first evaluation
            lost["at"] = json.loads((run_dir / "progress.json").read_text())["agent_steps"]
            cluster.remove_node(players_node)
            lost["spare"] = add_node(num_cpus=2, resources={"players": 4})

    lines = _follow(monkeypatch, on_line)
    assert run_from_file(_write(config, tmp_path / "c.yaml"), out=run_dir) == 0, lines
    assert any("lost main" in line for line, _ in lines), lines
    results = json.loads((run_dir / "results.json").read_text())
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["resumed_at"] == [lost["at"]]
    nodes = {name: where["node"] for name, where in results["placement"].items()}
    assert nodes["main"] == lost["spare"].node_id
    assert nodes["orchestrator"] == cluster.node_ids["head"]
    assert [e["agent_steps"] >= s for e, s in zip(progress["evals"], (300, 600))] == [True] * 2
    # the same league: the main player's moves count those before the loss too
    main = next(p for p in results["league"]["players"] if p["id"] == "main")
    assert main["steps"] >= progress["agent_steps"] > lost["at"]
