"""A solo league's job loop in-process, against scripted gym workers and agents: each job is
its player's `Job.settings` played on a worker bound to the player, its env steps advance
the player, SoloSharedPayoff records it, snapshots come every phase, the epsilon decays in
the settings; and what a solo league refuses."""

from __future__ import annotations

import itertools
import math
import threading

import pytest

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.orchestrator import RegisteredAgent
from mistk_rl.league.manager import LeagueManager
from mistk_rl.sdk.client import OrchestratorClient, ServerError
from mistk_rl.sdk.schemas import EpisodeConfig, EpisodeResult, OrchestratorProgress, Results, Status
from orchestrators.league_orchestrator import LeagueOrchestrator
from tests.league.test_league_orchestrator import FakeAgent, wire_workers

ENV = "CartPole-v1"


class FakeGymWorker:
    """A gym orchestrator that plays a job's episodes at once: each lasts `length` env steps
    and returns `length`. It keeps every startEpisode config, takes one agent, and refuses
    a job whose agent is not ready or is in another job (as a real agent would)."""

    lock = threading.Lock()

    def __init__(self, length: int = 10, fail=None) -> None:
        self.length, self.fail = length, fail or {}
        self.calls = itertools.count()
        self.configs: list[EpisodeConfig] = []
        self.episodes: list[EpisodeResult] = []
        self.env_steps = 0
        self.registered: list[str] = []
        self.initialized: list[tuple[dict, int]] = []
        self.resets: list[bool] = []
        self.agents: dict = {}  # name -> FakeAgent (the test wires them)
        self.state = "uninitialized"

    def status(self):
        return Status(state=self.state, resource_version=1)

    def reset(self, reset_agents=True, timeout=None):
        self.resets.append(reset_agents)
        self.registered, self.state = [], "uninitialized"

    def initialize(self, env, agents_needed=1, timeout=None):
        assert agents_needed == 1  # (a gym orchestrator takes exactly one agent)
        self.initialized.append((dict(env), agents_needed))
        self.state = "waiting_for_agents"

    def register_agent(self, name, url, skip_train=False):
        assert not self.registered, "a gym orchestrator takes one agent"
        self.registered.append(name)
        self.state = "ready"

    def progress(self):
        return OrchestratorProgress(env_steps=self.env_steps, episodes_done=len(self.episodes))

    def start_episode(self, config: EpisodeConfig, wait=True, timeout=None, on_status=None):
        call = next(self.calls)
        (name,) = self.registered
        assert set(config.agents) == {name}, "a job's settings name its worker's agent"
        agent = self.agents[name]
        with self.lock:
            if agent.state != "ready":
                raise ServerError(f"episodeStarted: 409 {name} is {agent.state}")
            agent.state = "in_episode"
        try:
            error = self.fail.get(call)
            if error is not None:
                raise error
            self.configs.append(config)
            for i in range(config.num_episodes):
                self.env_steps += self.length
                self.episodes.append(
                    EpisodeResult.model_validate(
                        {
                            "episode": len(self.episodes),
                            "agent": name,
                            "return": self.length,
                            "length": self.length,
                            "envIndex": i % config.num_envs,
                            "terminated": True,
                            "envSteps": self.env_steps,
                        }
                    )
                )
        finally:
            with self.lock:
                agent.state = "ready"

    def stop_episode(self):
        pass

    def get_results(self, since=0):
        return Results(episodes=self.episodes[since:])

    def close(self):
        pass

    play = OrchestratorClient.play  # the SDK's, over the calls above
    set_up = OrchestratorClient.set_up


def _players(*ids, **settings):
    return [
        {
            "id": i,
            "type": "solo",
            "numEnvs": 2,
            "episodesPerJob": 4,
            "epsStart": 0.9,
            "epsEnd": 0.1,
            "epsDecay": 100,
            **settings,
        }
        for i in ids
    ]


def _env(players, workers, **settings):
    return {
        "id": ENV,
        "kwargs": {},
        "league": {
            "players": players,
            "workers": [f"http://w{i}" for i in range(workers)],
            "onePhaseStep": 60,
            "seed": 0,
            "maxWorkerFailures": 3,
            "workerBackoff": 1.0,
            **settings,
        },
    }


def _solo_league(tmp_path, monkeypatch, workers, players, **settings):
    orch = LeagueOrchestrator()
    orch.data_dir = tmp_path
    env = _env(players, len(workers), **settings)
    orch.agents_needed = len(players)
    orch.validate_initialize(env, orch.agents_needed)
    orch.do_initialize(env, orch.agents_needed)
    for p in players:
        orch.agents[p["id"]] = RegisteredAgent(p["id"], f"http://{p['id']}", False, FakeAgent())
    return wire_workers(orch, workers, monkeypatch)


def test_a_solo_job_plays_its_settings_and_the_league_learns_its_results(tmp_path, monkeypatch):
    workers = [FakeGymWorker(), FakeGymWorker()]
    players = _players("learner", envKwargs={"max_episode_steps": 50})
    orch = _solo_league(tmp_path, monkeypatch, workers, players, maxActivePlayerJob=3)
    assert orch.solo and orch.agent_config("learner")["actionSpace"]["n"] == 2
    orch.do_start_episode(EpisodeConfig(num_steps=200))
    m = orch.manager
    # 5 jobs of 4 episodes of 10 steps; the player's jobs one at a time, on either worker
    assert (m.jobs_launched, m.jobs_finished, m.jobs_failed) == (5, 5, 0)
    configs = sorted((c for w in workers for c in w.configs), key=lambda c: c.seed)
    assert len(configs) == 5 and all(w.registered == ["learner"] for w in workers)
    for k, config in enumerate(configs):  # the job's settings, its epsilon decaying
        assert (config.num_envs, config.num_episodes, config.train) == (2, 4, True)
        assert config.env_kwargs == {"max_episode_steps": 50}
        settings = config.agents["learner"]
        assert (settings.mode, settings.train) == ("collect", True)
        assert settings.epsilon == pytest.approx(0.8 * math.exp(-40 * k / 100) + 0.1, abs=1e-6)
    assert [c.seed for c in configs] == [2 * k for k in range(5)]  # seed + job * numEnvs
    # the player's steps are the env steps played; the payoff has every job
    assert m.active["learner"].total_agent_step == 200 == orch.env_steps
    assert len(orch.results) == 20 and {r["job"] for r in orch.results} == set(range(5))
    jobs = list(m.solo_payoff.jobs["learner"])
    assert [j["job_id"] for j in jobs] == list(range(5))
    assert all((j["episodes"], j["mean_return"], j["steps"]) == (4, 10.0, 40) for j in jobs)
    assert [j["epsilon"] for j in jobs] == [c.agents["learner"].epsilon for c in configs]
    # a snapshot every 60 steps of the player's: at 80 and 160 (after its 2nd and 4th job)
    assert sorted(p.total_agent_step for p in m.historical.values()) == [80, 160]
    agent = orch.agents["learner"].client
    assert [p for p in agent.saved if "snapshots/" in p] == [
        "league/snapshots/learner_80_0.pt",
        "league/snapshots/learner_160_1.pt",
    ]
    assert agent.saved.count("league/players/learner.pt") == 1 + 5  # created, every job
    assert agent.built == []  # a solo player never resets
    view = orch.league_view()
    assert [w["player"] for w in view["workers"]] == ["learner", "learner"]
    assert len(view["payoff"]["solo"]["learner"]) == 5
    (row,) = [r for r in view["players"] if r["id"] == "learner"]
    assert row["epsilon"] == pytest.approx(0.8 * math.exp(-2) + 0.1, abs=1e-6)
    # league.json holds it all; a league orchestrator given the directory resumes it
    saved = LeagueManager.load(tmp_path / "league" / "league.json")
    assert list(saved.solo_payoff.jobs["learner"]) == jobs
    assert saved.active["learner"].env_kwargs == {"max_episode_steps": 50}
    again = _solo_league(tmp_path, monkeypatch, [FakeGymWorker()], players)
    assert again.manager.active["learner"].total_agent_step == 200
    again.do_start_episode(EpisodeConfig(num_episodes=4))
    assert again.agents["learner"].client.built == ["league/players/learner.pt"]
    assert again.manager.active["learner"].total_agent_step == 240
    assert len(again.manager.solo_payoff.jobs["learner"]) == 6


def test_each_worker_is_bound_to_one_player(tmp_path, monkeypatch):
    workers = [FakeGymWorker(length=5), FakeGymWorker(length=7), FakeGymWorker(length=5)]
    orch = _solo_league(tmp_path, monkeypatch, workers, _players("a", "b"))
    orch.do_start_episode(EpisodeConfig(num_steps=300))
    assert [w.registered for w in workers] == [["a"], ["b"], ["a"]]
    assert all(c.agents.keys() == {"a"} for w in (workers[0], workers[2]) for c in w.configs)
    assert all(c.agents.keys() == {"b"} for c in workers[1].configs)
    m = orch.manager
    steps = {p: m.active[p].total_agent_step for p in ("a", "b")}
    assert sum(steps.values()) >= 300 and steps["a"] > 0 and steps["b"] > 0
    assert steps["b"] == 28 * len(workers[1].configs)  # each player: its own workers' steps
    assert [w.initialized[0][0] for w in workers] == [{"id": ENV, "kwargs": {}}] * 3


def test_a_failed_solo_job_records_nothing_and_its_worker_is_set_up_again(tmp_path, monkeypatch):
    worker = FakeGymWorker(fail={1: ServerError("worker failed")})
    orch = _solo_league(tmp_path, monkeypatch, [worker], _players("learner"))
    orch.do_start_episode(EpisodeConfig(num_steps=120))
    m = orch.manager
    assert (m.jobs_finished, m.jobs_failed) == (3, 1)
    assert m.active["learner"].total_agent_step == 120 == orch.env_steps
    assert [j["job_id"] for j in m.solo_payoff.jobs["learner"]] == [0, 2, 3]
    (failed,) = [j for j in m.recent if "failed" in j]
    assert failed["job_id"] == 1 and "worker failed" in failed["failed"]
    # the failure: a wait, then the worker set up again with its player's agent only
    assert orch.test_clock.pauses == [1.0] and worker.resets == [False]
    assert orch.agents["learner"].client.state == "ready"
    # the failed job (at 40 steps) moved nothing: the next one explores as it would have
    assert [c.agents["learner"].epsilon for c in worker.configs] == pytest.approx(
        [0.8 * math.exp(-s / 100) + 0.1 for s in (0, 40, 80)], abs=1e-6
    )


@pytest.mark.parametrize(
    "players, workers, agents, match",
    [
        (
            _players("a") + [{"id": "m", "type": "main"}],
            2,
            2,
            r"not a mix: solo \['a'\], battle \['m'\]",
        ),
        (_players("a", "b"), 1, 2, "1 workers for 2 solo players; give at least 2"),
        (_players("a"), 1, 2, "agentsNeeded 2: a solo league's agents are its players"),
        (_players("a", envKwargs={"bogus": 1}), 1, 1, "player 'a': env 'CartPole-v1' cannot"),
    ],
)
def test_what_a_solo_league_refuses(players, workers, agents, match):
    with pytest.raises(InvalidRequest, match=match):
        LeagueOrchestrator().validate_initialize(_env(players, workers), agents)


def test_a_battle_player_takes_no_solo_settings():
    from pydantic import ValidationError

    from mistk_rl.sdk.schemas import LeaguePlayerSpec

    assert LeaguePlayerSpec(id="s", type="solo", numEnvs=3).settings() == {"num_envs": 3}
    with pytest.raises(ValidationError, match="player 'm' \\(main\\) has no setting numEnvs"):
        LeaguePlayerSpec(id="m", type="main", numEnvs=3)
