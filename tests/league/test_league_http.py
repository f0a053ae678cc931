"""A league over HTTP: a league orchestrator, two game-orchestrator workers, DQN agent services
for the players and a frozen pool, all sharing one league directory."""

from __future__ import annotations

import json

import pytest

from mistk_rl.deploy.launch import wait_ready
from mistk_rl.sdk.client import BadRequest, NotFound
from orchestrators.league_orchestrator import RATED_SNAPSHOTS
from tests.test_metrics import scrape

LEAGUE = "orchestrators.league_orchestrator:LeagueOrchestrator"
GAME = "orchestrators.game_orchestrator:GameOrchestrator"
DQN = "agents.dqn_agent:DQNAgent"
SMALL_DQN = {
    "policy": {"model": {"hidden_sizes": [32]}},
    "train": {"learning_starts": 50, "train_freq": 16, "gradient_steps": 2},
    "buffer": {"replay_buffer_size": 2000},
    "checkpoint_buffer": False,
}
PLAYERS = [{"id": "main", "type": "main"}, {"id": "exploiter", "type": "main_exploiter"}]


def _env(workers, directory="league"):
    return {
        "id": "classic/tictactoe-v3",
        "league": {
            "players": PLAYERS,
            "workers": workers,
            "directory": directory,
            "onePhaseStep": 300,
            "gamesPerJob": 8,
            "numEnvs": 8,
            "seed": 0,
        },
    }


@pytest.mark.long(25)
def test_a_league_trains_snapshots_persists_and_resumes(launch, tmp_path):
    share = ["--share", f"league={tmp_path / 'shared'}"]
    services = (
        [launch("orchestrator", GAME, wait=False) for _ in range(2)]
        + [launch("agent", DQN, extra_args=share, wait=False) for _ in range(3)]
        + [launch("orchestrator", LEAGUE, extra_args=share, wait=False)]
    )
    for service in services:  # (booted side by side)
        wait_ready(service, 60)
    workers = [s.url for s in services[:2]]
    agents = {}
    for i, (name, service) in enumerate(zip(["main", "exploiter", "frozen"], services[2:5])):
        client = service.client()
        client.initialize(hyperparameters={**SMALL_DQN, "seed": i})
        client.build_model()
        agents[name] = service.url
    league = services[5].client()
    with pytest.raises(NotFound):
        league.get_league()
    with pytest.raises(BadRequest, match="frozen agent"):
        league.initialize(_env(workers), agents_needed=2)
    league.initialize(_env(workers), agents_needed=3)
    with pytest.raises(BadRequest, match="no player"):
        league.register_agent("stranger", agents["frozen"])
    league.register_agent("main", agents["main"])
    league.register_agent("exploiter", agents["exploiter"])
    league.register_agent("frozen", agents["frozen"], skip_train=True)

    league.start_episode({"numSteps": 1000}, wait=True, timeout=300)
    league.stop_episode()
    status = league.status().payload
    assert status["agentSteps"]["main"] >= 1000
    view = league.get_league()
    ids = view.payoff["ids"]
    snapshots = [p for p in view.players if p["kind"] == "HistoricalPlayer"]
    assert {p["parent"] for p in snapshots} >= {"main"}  # the seed snapshot, at least
    assert len(snapshots) >= 2  # and one taken in training (300 moves per phase)
    recent = view.jobs["recent"]
    finished = [job for job in recent if "results" in job]
    assert finished and all(sum(job["results"].values()) == 8 for job in finished)
    assert {job["branch"] for job in finished} & {"pfsp", "sp", "verification"}
    assert {job["launch_player"] for job in finished} == {"main", "exploiter"}
    games = sum(sum(row) for row in view.payoff["games"])
    assert games > 0 and len(ids) == len(view.payoff["winRate"])
    assert set(view.pool) == {"frozen"}
    shared = tmp_path / "shared"
    state = json.loads((shared / "league.json").read_text())
    assert state["jobs_launched"] == view.jobs["launched"]
    for snapshot in state["historical"]:  # every snapshot's checkpoint is on disk
        assert (shared / snapshot["checkpoint_path"].removeprefix("league/")).exists()
    # what an operator scrapes: the league's jobs, workers and ratings
    samples = scrape(services[5].url)
    assert samples[("mistk_league_jobs_launched_total", ())] == view.jobs["launched"]
    assert samples[("mistk_league_jobs_failed_total", ())] == 0
    assert samples[("mistk_league_snapshots", ())] == len(snapshots)
    assert sum(v for (name, _), v in samples.items() if name == "mistk_league_workers") == 2
    rated = {
        dict(labels)["player"] for name, labels in samples if name == "mistk_league_rating_elo"
    }
    active = {p["id"] for p in view.players if p["kind"] != "HistoricalPlayer"}
    assert active == {"main", "exploiter"} and active <= rated <= set(ids)
    assert len(rated) == len(active) + min(len(snapshots), RATED_SNAPSHOTS)
    episodes = league.get_results().episodes
    assert (
        len(episodes) == sum(sum(job["results"].values()) for job in finished)
        or len(episodes) >= len(finished) * 8
    )  # (every game of every finished job)

    # an evaluation of the main player goes to a worker, the league untouched
    league.start_episode(
        {"exhaustive": {"agent": "main", "opponent": "random"}}, wait=True, timeout=120
    )
    league.stop_episode()
    evaluation = league.get_results().evaluations[-1]
    assert evaluation["complete"] and set(evaluation["seats"]) == {"player_1", "player_2"}
    assert league.get_league().jobs["launched"] == view.jobs["launched"]

    # a new league orchestrator given the same directory continues the same league
    league.terminate()
    again = launch("orchestrator", LEAGUE, extra_args=share).client()
    again.initialize(_env(workers), agents_needed=3)
    main_before = next(p for p in view.players if p["id"] == "main")["steps"]
    # the league's counts are back at once (a harness measures its progress against them)
    assert again.status().payload["agentSteps"]["main"] == main_before
    for name in ("main", "exploiter"):
        again.register_agent(name, agents[name])
    again.register_agent("frozen", agents["frozen"], skip_train=True)
    again.start_episode({"numEpisodes": 1}, wait=True, timeout=120)
    again.stop_episode()
    resumed = again.get_league()
    assert resumed.jobs["launched"] > view.jobs["launched"]
    assert {p["id"] for p in snapshots} <= {p["id"] for p in resumed.players}
    assert next(p for p in resumed.players if p["id"] == "main")["steps"] >= main_before
    again.reset()


@pytest.mark.long(45)
def test_a_league_without_a_shared_directory_moves_checkpoints_over_http(launch):
    """copyCheckpoints, no --share: every checkpoint an agent saves is copied into the league
    orchestrator's own directory, and put into an agent before it loads one. A new league
    orchestrator on that directory resumes the league with new agent services (as after
    losing the machines they ran on): they get their players' weights over HTTP."""

    def agent_services():
        return [launch("agent", DQN, wait=False) for _ in range(3)]

    services = (
        [launch("orchestrator", GAME, wait=False) for _ in range(2)]
        + agent_services()
        + [launch("orchestrator", LEAGUE, wait=False)]
    )
    for service in services:
        wait_ready(service, 60)
    workers, league_service = [s.url for s in services[:2]], services[5]

    def register(league, agents):
        for i, (name, service) in enumerate(zip(["main", "exploiter", "frozen"], agents)):
            client = service.client()
            client.initialize(hyperparameters={**SMALL_DQN, "seed": i})
            client.build_model()
            league.register_agent(name, service.url, skip_train=name == "frozen")

    env = _env(workers)
    env["league"]["copyCheckpoints"] = True
    league = league_service.client()
    league.initialize(env, agents_needed=3)
    register(league, services[2:5])
    league.start_episode({"numSteps": 700}, wait=True, timeout=300)
    league.stop_episode()
    view = league.get_league()
    own = league_service.data_dir / "league"
    state = json.loads((own / "league.json").read_text())
    active = {p["player_id"]: p for p in state["active"]}
    named = {p["checkpoint_path"] for p in state["historical"]} | {
        path for p in active.values() for path in (p["checkpoint_path"], p["initial_checkpoint"])
    }
    assert any("/snapshots/" in path for path in named)
    for path in named:  # the orchestrator's directory holds every checkpoint of the league
        assert (own / path.removeprefix("league/")).is_file(), path
    # each agent's directory holds what it saved or was given, nothing of a shared one
    main_dir = services[2].data_dir / "league"
    assert (main_dir / "players" / "main.pt").is_file()
    assert not (main_dir / "players" / "exploiter.pt").exists()
    league.terminate()

    # the same directory, new agents: the league resumes and puts its weights into them
    again_service = launch(
        "orchestrator", LEAGUE, extra_args=["--data-dir", str(league_service.data_dir)]
    )
    fresh = agent_services()
    for service in fresh:
        wait_ready(service, 60)
    again = again_service.client()
    again.initialize(env, agents_needed=3)
    register(again, fresh)
    again.start_episode({"numEpisodes": 1}, wait=True, timeout=120)
    again.stop_episode()
    for name, service in zip(["main", "exploiter"], fresh):  # given the league's weights
        assert (service.data_dir / active[name]["checkpoint_path"]).is_file()
    assert again.get_league().jobs["launched"] > view.jobs["launched"]
    again.reset()


def _deterministic_league(launch, tmp_path, name: str) -> tuple[dict, list]:
    """A fresh league (DQN players that learn, two workers), 400 main-player moves with
    ``deterministic``; its league.json and its games."""
    share = ["--share", f"league={tmp_path / name}"]
    services = (
        [launch("orchestrator", GAME, wait=False) for _ in range(2)]
        + [launch("agent", DQN, extra_args=share, wait=False) for _ in range(3)]
        + [launch("orchestrator", LEAGUE, extra_args=share, wait=False)]
    )
    for service in services:
        wait_ready(service, 60)
    league = services[5].client()
    env = _env([s.url for s in services[:2]])
    env["league"].update(onePhaseStep=150, deterministic=True)
    league.initialize(env, agents_needed=3)
    for i, (agent, service) in enumerate(zip(["main", "exploiter", "frozen"], services[2:5])):
        client = service.client()
        client.initialize(hyperparameters={**SMALL_DQN, "seed": i})
        client.build_model()
        league.register_agent(agent, service.url, skip_train=agent == "frozen")
    league.start_episode({"numSteps": 400}, wait=True, timeout=300)
    league.stop_episode()
    games = [
        (g.agent, g.seats, g.winner, g.length, g.return_) for g in league.get_results().episodes
    ]
    return json.loads((tmp_path / name / "league.json").read_text()), games


@pytest.mark.long(30)
def test_a_deterministic_league_is_the_same_league_every_time(launch, tmp_path):
    """Jobs run side by side on two workers and end in whatever order; with
    ``deterministic`` the league applies them in launch order, so two runs with the same
    seeds make the same matches, snapshots and games, move for move."""
    first, first_games = _deterministic_league(launch, tmp_path, "one")
    second, second_games = _deterministic_league(launch, tmp_path, "two")
    assert first_games == second_games and len(first_games) >= 400 // 5
    assert first["jobs_launched"] == second["jobs_launched"] > 8
    assert len(first["historical"]) >= 2  # the first snapshot and one taken in training
    for key in ("payoff", "historical", "active"):
        assert first[key] == second[key], key
