"""The league orchestrator's job loop in-process, against scripted workers and agents: what a
failed job or a lost worker leaves behind, and how the frozen pool loads snapshots."""
from __future__ import annotations

import itertools

import pytest

from mistk_rl.client import ServerError, ServiceUnavailable
from mistk_rl.orchestrator import RegisteredAgent
from mistk_rl.schemas import (EpisodeConfig, EpisodeResult, OrchestratorProgress, Results,
                              Status)
from orchestrators import league_orchestrator
from orchestrators.league_orchestrator import LeagueOrchestrator, _Worker


class FakeAgent:
    timeout, token = 30.0, None

    def __init__(self) -> None:
        self.built: list[str] = []
        self.saved: list[str] = []

    def build_model(self, path, timeout=None):
        self.built.append(path)

    def save_model(self, path, timeout=None):
        self.saved.append(path)


class FakeWorker:
    """Plays each job's games instantly: the first seat always wins. `fail` maps a call
    number to the exception that call raises."""

    def __init__(self, fail=None) -> None:
        self.games: list[EpisodeResult] = []
        self.steps: dict[str, int] = {}
        self.calls = itertools.count()
        self.fail = fail or {}
        self.lineups: list[dict] = []

    def status(self):
        return Status(state="ready", resource_version=1,
                      payload={"episodesDone": len(self.games), "agentSteps": dict(self.steps)})

    def progress(self):
        return OrchestratorProgress(episodes_done=len(self.games), agent_steps=dict(self.steps))

    def start_episode(self, config: EpisodeConfig, wait=True, timeout=None):
        error = self.fail.get(next(self.calls))
        if error is not None:
            raise error
        self.lineups.append(dict(config.lineup))
        seats = list(config.lineup)
        for game in range(config.num_episodes):
            holders = dict(zip(seats, [config.lineup[s] for s in
                                       (seats if game % 2 == 0 else seats[::-1])]))
            self.games.append(EpisodeResult.model_validate({
                "episode": len(self.games), "agent": holders[seats[0]], "return": 1.0,
                "length": 5, "seats": holders, "winner": seats[0],
                "returns": {seats[0]: 1.0, seats[1]: -1.0},
                "illegal": dict.fromkeys(seats, 0)}))
            for seat, agent in holders.items():
                self.steps[agent] = self.steps.get(agent, 0) + (3 if seat == seats[0] else 2)

    def stop_episode(self):
        pass

    def get_results(self, since=0):
        return Results(episodes=self.games[since:])

    def close(self):
        pass


def _league(tmp_path, monkeypatch, workers, players=(("main", "main"),), pool=1,
            games_per_job=4):
    orch = LeagueOrchestrator()
    orch.data_dir = tmp_path
    settings = {"players": [{"id": i, "type": t} for i, t in players],
                "workers": [f"http://w{i}" for i in range(len(workers))],
                "onePhaseStep": 10 ** 6, "gamesPerJob": games_per_job, "numEnvs": 2,
                "seed": 0}
    env = {"id": "classic/tictactoe-v3", "kwargs": {}, "league": settings}
    orch.agents_needed = len(players) + pool
    orch.validate_initialize(env, orch.agents_needed)
    orch.do_initialize(env, orch.agents_needed)
    for name, _ in players:
        orch.agents[name] = RegisteredAgent(name, "http://a", False, FakeAgent())
    for k in range(pool):
        orch.agents[f"frozen_{k}"] = RegisteredAgent(f"frozen_{k}", "http://a", True,
                                                     FakeAgent())
        orch.do_register_agent(f"frozen_{k}", "http://a", True)
    by_url = {f"http://w{i}": w for i, w in enumerate(workers)}
    monkeypatch.setattr(orch, "_set_up_worker", lambda url: _Worker(url, by_url[url]))
    return orch


def test_a_failed_job_frees_its_slot_and_agents_and_records_nothing(tmp_path, monkeypatch):
    worker = FakeWorker(fail={1: ServerError("worker failed"), 3: ServerError("again")})
    orch = _league(tmp_path, monkeypatch, [worker])
    orch.do_start_episode(EpisodeConfig(num_episodes=12))
    m = orch.manager
    failed = [job for job in m.recent if "failed" in job]
    finished = [job for job in m.recent if "results" in job]
    assert len(failed) == 2 and len(finished) == 3  # 12 games of 4 each
    assert not m.running and not orch._busy and not orch._pending
    assert len(orch.results) == 12
    played = sum(m.payoff.played("main", p) for p in m.historical)
    assert played == sum(4 for job in finished if job["opponent"] != "main")


def test_a_lost_worker_is_dropped_and_the_league_goes_on(tmp_path, monkeypatch):
    lost = FakeWorker(fail={0: ServiceUnavailable("gone")})
    good = FakeWorker()
    orch = _league(tmp_path, monkeypatch, [lost, good],
                   players=(("main", "main"), ("exploiter", "main_exploiter")))
    orch.do_start_episode(EpisodeConfig(num_episodes=16))
    assert [w.client for w in orch.workers] == [good]
    assert len(orch.results) == 16 and not orch.manager.running and not orch._busy


def test_the_league_fails_clearly_when_every_worker_is_lost(tmp_path, monkeypatch):
    orch = _league(tmp_path, monkeypatch, [FakeWorker(fail={0: ServiceUnavailable("gone")})])
    with pytest.raises(RuntimeError, match="every worker is lost"):
        orch.do_start_episode(EpisodeConfig(num_episodes=4))
    assert not orch.manager.running  # (its slot released all the same)


def test_pool_agents_load_a_snapshot_once_and_keep_it(tmp_path, monkeypatch):
    monkeypatch.setattr(league_orchestrator.LeagueManager, "launch_job",
                        _always_the_seed_snapshot(league_orchestrator.LeagueManager.launch_job))
    worker = FakeWorker()
    orch = _league(tmp_path, monkeypatch, [worker], pool=2)
    orch.do_start_episode(EpisodeConfig(num_episodes=12))
    loads = {name: orch.agents[name].client.built for name in orch.pool}
    assert sum(len(paths) for paths in loads.values()) == 1  # loaded once, then reused
    assert list(orch.pool.values()).count("league/initial/main.pt") == 1
    assert all(lineup == {"player_1": "main", "player_2": next(iter(
        n for n, p in loads.items() if p))} for lineup in worker.lineups)
    # every job saved the player's weights, and the league after it
    assert orch.agents["main"].client.saved.count("league/players/main.pt") == 1 + 3
    assert (tmp_path / "league" / "league.json").exists()


def _always_the_seed_snapshot(launch_job):
    def launch(self, player_id):
        running = launch_job(self, player_id)
        if running is not None:
            running.job.opponent, running.job.branch = "main_0_0", "pfsp"
        return running
    return launch


def test_a_job_waiting_for_an_agent_gets_it_before_new_jobs(tmp_path, monkeypatch):
    orch = _league(tmp_path, monkeypatch, [FakeWorker()],
                   players=(("main", "main"), ("exploiter", "main_exploiter"),
                            ("league_exploiter", "league_exploiter")))
    orch.manager = orch._create()
    orch._busy.add("main")  # main is in a job
    orch._next_player = 1
    launch = orch._next_launch()  # the exploiter must wait for main; the league exploiter goes
    assert launch.home == "league_exploiter"
    assert orch._pending["exploiter"].job.opponent == "main"
    orch._busy.discard("main")  # main's job ended: the waiting job comes first
    launch = orch._next_launch()
    assert (launch.home, launch.opponent_agent) == ("exploiter", "main")
    assert not orch._pending and orch._busy >= {"exploiter", "main"}
    assert orch._next_launch() is None  # main is taken; the league exploiter still plays
