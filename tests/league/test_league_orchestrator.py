"""The league orchestrator's job loop in-process, against scripted workers and agents on a
clock the test holds: what a failed job leaves behind, how a failing worker is retried and
dropped, what ends a run, the agents a dead worker left mid-episode, and how the frozen
pool loads snapshots."""

from __future__ import annotations

import itertools

import pytest

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.orchestrator import RegisteredAgent
from mistk_rl.sdk.client import (
    Conflict,
    OrchestratorClient,
    ServerError,
    ServiceRestarted,
    ServiceUnavailable,
)
from mistk_rl.sdk.schemas import (
    EpisodeConfig,
    EpisodeResult,
    GameEpisodeSettings,
    OrchestratorProgress,
    Results,
    Status,
)
from orchestrators import league_orchestrator
from orchestrators.league_orchestrator import LeagueOrchestrator


class FakeAgent:
    timeout, token = 30.0, None

    def __init__(self) -> None:
        self.built: list[str] = []
        self.saved: list[str] = []
        self.state, self.reason = "ready", None
        self.stopped = 0

    def build_model(self, path, timeout=None):
        self.built.append(path)

    def save_model(self, path, timeout=None):
        self.saved.append(path)

    def status(self):
        return Status(state=self.state, resource_version=1, reason=self.reason)

    def wait_for_state(self, states, timeout=60.0):
        return self.status()

    def episode_stopped(self):
        assert self.state == "in_episode"
        self.state = "ready"
        self.stopped += 1


class FakeWorker:
    """Plays each job's games instantly: the first seat always wins. `fail` maps a
    startEpisode call number to the exception it raises; from call `dies_at` on, the
    worker is gone (every call: ServiceUnavailable) and leaves its job's agents
    mid-episode. A job's agents must be ready, as a real worker's episodeStarted needs."""

    def __init__(self, fail=None, dies_at=None) -> None:
        self.games: list[EpisodeResult] = []
        self.steps: dict[str, int] = {}
        self.calls = itertools.count()
        self.fail = fail or {}
        self.dies_at = dies_at
        self.dead = False
        self.lineups: list[dict] = []
        self.resets: list[bool] = []
        self.agents: dict = {}  # name -> FakeAgent (the test wires them)
        self.state = "uninitialized"

    def _alive(self):
        if self.dead:
            raise ServiceUnavailable("GET http://w/status: cannot connect (refused)")

    def status(self):
        self._alive()
        return Status(state=self.state, resource_version=1)

    def reset(self, reset_agents=True, timeout=None):
        self._alive()
        self.resets.append(reset_agents)
        self.state = "uninitialized"

    def initialize(self, env, agents_needed=1, timeout=None):
        self._alive()
        self.state = "waiting_for_agents"

    def register_agent(self, name, url, skip_train=False):
        self._alive()
        if self.agents[name].state != "ready":  # (the agent refuses agentRegistered)
            raise ServerError(f"registerAgent: {name} is {self.agents[name].state}")
        self.state = "ready"

    def progress(self):
        self._alive()
        return OrchestratorProgress(episodes_done=len(self.games), agent_steps=dict(self.steps))

    def start_episode(self, config: EpisodeConfig, wait=True, timeout=None, on_status=None):
        self._alive()
        call = next(self.calls)
        for name in set(config.lineup.values()):
            if self.agents[name].state != "ready":
                self.state = "failed"
                raise ServerError(f"episodeStarted: 409 {name} is {self.agents[name].state}")
        if self.dies_at is not None and call >= self.dies_at:
            for name in set(config.lineup.values()):
                self.agents[name].state = "in_episode"
            self.dead = True
            self._alive()
        error = self.fail.get(call)
        if error is not None:
            raise error
        self.lineups.append(dict(config.lineup))
        seats = list(config.lineup)
        for game in range(config.num_episodes):
            holders = dict(
                zip(seats, [config.lineup[s] for s in (seats if game % 2 == 0 else seats[::-1])])
            )
            self.games.append(
                EpisodeResult.model_validate(
                    {
                        "episode": len(self.games),
                        "agent": holders[seats[0]],
                        "return": 1.0,
                        "length": 5,
                        "seats": holders,
                        "winner": seats[0],
                        "returns": {seats[0]: 1.0, seats[1]: -1.0},
                        "illegal": dict.fromkeys(seats, 0),
                    }
                )
            )
            for seat, agent in holders.items():
                self.steps[agent] = self.steps.get(agent, 0) + (3 if seat == seats[0] else 2)

    def stop_episode(self):
        self._alive()

    def get_results(self, since=0):
        self._alive()
        return Results(episodes=self.games[since:])

    def close(self):
        pass

    play = OrchestratorClient.play  # the SDK's, over the calls above
    set_up = OrchestratorClient.set_up


class Clock:
    """The league's clock: moves when the league waits out a backoff, and by `tick` each
    time the league reads it (time passing while jobs run elsewhere)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.tick = 0.0
        self.pauses: list[float] = []

    def now(self) -> float:
        self.t += self.tick
        return self.t

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.t += seconds


def _league(
    tmp_path,
    monkeypatch,
    workers,
    players=(("main", "main"),),
    pool=1,
    games_per_job=4,
    fixed=(),
    **settings,
):
    orch = LeagueOrchestrator()
    orch.data_dir = tmp_path
    settings = {
        "players": [
            {"id": i, "type": t, **(extra[0] if extra else {})} for i, t, *extra in players
        ],
        "workers": [f"http://w{i}" for i in range(len(workers))],
        "onePhaseStep": 10**6,
        "gamesPerJob": games_per_job,
        "numEnvs": 2,
        "seed": 0,
        "maxWorkerFailures": 3,
        "workerBackoff": 1.0,
        **({"fixed": list(fixed)} if fixed else {}),
        **settings,
    }
    env = {"id": "classic/tictactoe-v3", "kwargs": {}, "league": settings}
    orch.agents_needed = len(players) + pool + len(fixed)
    orch.validate_initialize(env, orch.agents_needed)
    orch.do_initialize(env, orch.agents_needed)
    for name, *_ in players:
        orch.agents[name] = RegisteredAgent(name, "http://a", False, FakeAgent())
    for name in [f"frozen_{k}" for k in range(pool)] + list(fixed):
        orch.agents[name] = RegisteredAgent(name, "http://a", True, FakeAgent())
        orch.do_register_agent(name, "http://a", True)
    return wire_workers(orch, workers, monkeypatch)


def wire_workers(orch: LeagueOrchestrator, workers: list, monkeypatch) -> LeagueOrchestrator:
    """`orch` reaches the fake `workers` at http://w0, http://w1, ... (they see its agents),
    and waits on a test clock (`orch.test_clock`) instead of the wall clock."""
    by_url = {f"http://w{i}": w for i, w in enumerate(workers)}
    for worker in workers:
        worker.agents = {name: agent.client for name, agent in orch.agents.items()}
    monkeypatch.setattr(orch, "_connect", lambda url: by_url[url])
    clock = Clock()
    monkeypatch.setattr(orch, "clock", clock.now)
    monkeypatch.setattr(orch, "_pause", clock.pause)
    orch.test_clock = clock
    return orch


def test_a_failed_job_frees_its_slot_and_agents_and_records_nothing(tmp_path, monkeypatch):
    worker = FakeWorker(fail={1: ServerError("worker failed"), 3: ServerError("again")})
    orch = _league(tmp_path, monkeypatch, [worker])
    orch.do_start_episode(EpisodeConfig(num_episodes=12))
    m = orch.manager
    failed = [job for job in m.recent if "failed" in job]
    finished = [job for job in m.recent if "results" in job]
    assert len(failed) == 2 and len(finished) == 3  # 12 games of 4 each
    assert (m.jobs_launched, m.jobs_finished, m.jobs_failed) == (5, 3, 2)
    assert not m.running and not orch.scheduler.busy and not orch.scheduler.pending
    assert len(orch.results) == 12
    played = sum(m.payoff.played("main", p) for p in m.historical)
    assert played == sum(4 for job in finished if job["opponent"] != "main")
    # each failure: a wait, then the worker set up again, its own agents left alone
    (health,) = orch.league_view()["workers"]
    assert (health["state"], health["failures"], health["failed"], health["setUps"]) == (
        "idle",
        0,
        2,
        3,
    )
    assert orch.test_clock.pauses == [1.0, 1.0] and worker.resets == [False, False]


def test_a_restarted_worker_is_set_up_again_and_plays_on(tmp_path, monkeypatch):
    worker = FakeWorker(fail={0: ServiceRestarted("http://w0", "a", "b")})
    orch = _league(tmp_path, monkeypatch, [worker])
    orch.do_start_episode(EpisodeConfig(num_episodes=8))
    assert orch.manager.jobs_failed == 1 and orch.manager.jobs_finished == 2
    assert orch.scheduler.workers[0].set_ups == 2 and orch.test_clock.pauses == [1.0]


def test_a_worker_failing_in_a_row_is_dropped_and_the_league_goes_on(tmp_path, monkeypatch):
    lost, good = FakeWorker(dies_at=0), FakeWorker()
    orch = _league(
        tmp_path,
        monkeypatch,
        [lost, good],
        players=(("main", "main"), ("exploiter", "main_exploiter")),
    )
    orch.test_clock.tick = 0.5  # the good worker's jobs take time: the lost one's waits end
    orch.do_start_episode(EpisodeConfig(num_episodes=40))
    w_lost, w_good = orch.scheduler.workers
    assert (w_lost.state, w_lost.failures, w_lost.failed) == ("dropped", 3, 3)
    assert "cannot connect" in w_lost.last_error
    assert w_good.state == "idle" and w_good.failed == 0
    m = orch.manager
    assert m.jobs_failed == 1  # its set-ups failed too, but they are no jobs
    assert len(orch.results) == 40 and not m.running and not orch.scheduler.busy
    assert orch.league_view()["workers"][0]["state"] == "dropped"


def test_an_agent_left_mid_episode_is_brought_back_to_ready_before_its_next_job(
    tmp_path, monkeypatch
):
    lost, good = FakeWorker(dies_at=0), FakeWorker()
    orch = _league(tmp_path, monkeypatch, [lost, good])
    orch.do_start_episode(EpisodeConfig(num_episodes=8))
    (failed,) = [job for job in orch.manager.recent if "failed" in job]
    assert failed["worker"] == "http://w0" and "cannot connect" in failed["failed"]
    held = {"main"} | ({"frozen_0"} if failed["opponent"] != "main" else set())
    assert failed["recovered"] == dict.fromkeys(held, "in_episode")
    assert orch.agents["main"].client.state == "ready"
    assert orch.agents["main"].client.stopped == 1
    assert orch.manager.jobs_finished == 2 and len(good.lineups) == 2  # main played on


def test_an_agent_whose_episode_ends_meanwhile_counts_as_brought_back(tmp_path, monkeypatch):
    """A worker going down cleanly (its node lost: SIGTERM) ends its agents' episodes
    itself, between the league's look at an agent and its episodeStopped, which then gets
    409: the agent is ready, the league goes on."""
    lost, good = FakeWorker(dies_at=0), FakeWorker()
    orch = _league(tmp_path, monkeypatch, [lost, good])
    main = orch.agents["main"].client
    raced = []

    def ended_by_the_worker():
        if main.state == "in_episode" and not raced:
            main.state = "ready"  # (the dying worker's episodeStopped came first)
            raced.append(1)
            raise Conflict("episodeStopped: not allowed in state 'ready'", 409)
        return FakeAgent.episode_stopped(main)

    monkeypatch.setattr(main, "episode_stopped", ended_by_the_worker)
    orch.do_start_episode(EpisodeConfig(num_episodes=8))
    assert raced and main.state == "ready"
    assert orch.manager.jobs_finished == 2  # main played on


def test_the_run_ends_naming_every_worker_when_none_is_left(tmp_path, monkeypatch):
    orch = _league(
        tmp_path,
        monkeypatch,
        [FakeWorker(dies_at=0), FakeWorker(dies_at=0)],
        players=(("main", "main"), ("exploiter", "main_exploiter")),
        pool=2,
    )
    with pytest.raises(RuntimeError) as raised:
        orch.do_start_episode(EpisodeConfig(num_episodes=1000))
    reason = str(raised.value)
    assert reason.startswith("no healthy worker left: worker 0 http://w0 failed 3 times in a row: ")
    assert "; worker 1 http://w1 failed 3 times in a row: " in reason
    assert "cannot connect" in reason
    m = orch.manager
    assert m.jobs_failed <= 2 and m.jobs_launched - m.jobs_failed <= 2  # launches bounded
    assert all(p in (1.0, 2.0) for p in orch.test_clock.pauses)  # backoff: 1 s, then 2 s
    assert not orch.scheduler.busy


def test_an_agent_that_cannot_be_brought_back_ends_the_run_naming_it(tmp_path, monkeypatch):
    class BreakingWorker(FakeWorker):
        def start_episode(self, config, wait=True, timeout=None, on_status=None):
            main = self.agents["main"]  # (the worker's step made it fail)
            main.state, main.reason = "failed", "do_step raised ValueError: nan"
            raise ServerError("worker failed")

    worker = BreakingWorker()
    orch = _league(tmp_path, monkeypatch, [worker])
    with pytest.raises(
        RuntimeError,
        match=r"agent 'main' at http://a is 'failed' \(do_step "
        r"raised ValueError: nan\) after a failed job",
    ):
        orch.do_start_episode(EpisodeConfig(num_episodes=8))
    assert orch.manager.jobs_failed == 1 and worker.lineups == []


def test_pool_agents_load_a_snapshot_once_and_keep_it(tmp_path, monkeypatch):
    monkeypatch.setattr(
        league_orchestrator.LeagueManager,
        "launch_job",
        _always_the_seed_snapshot(league_orchestrator.LeagueManager.launch_job),
    )
    worker = FakeWorker()
    orch = _league(tmp_path, monkeypatch, [worker], pool=2)
    orch.do_start_episode(EpisodeConfig(num_episodes=12))
    loads = {name: orch.agents[name].client.built for name in orch.pool}
    assert sum(len(paths) for paths in loads.values()) == 1  # loaded once, then reused
    assert list(orch.pool.values()).count("league/initial/main.pt") == 1
    assert all(
        lineup == {"player_1": "main", "player_2": next(iter(n for n, p in loads.items() if p))}
        for lineup in worker.lineups
    )
    # every job saved the player's weights, and the league after it
    assert orch.agents["main"].client.saved.count("league/players/main.pt") == 1 + 3
    assert (tmp_path / "league" / "league.json").exists()


def test_a_fixed_opponent_plays_with_its_own_agent_and_loads_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(
        league_orchestrator.LeagueManager,
        "launch_job",
        _always_against("winblock", league_orchestrator.LeagueManager.launch_job),
    )
    worker = FakeWorker()
    orch = _league(tmp_path, monkeypatch, [worker], fixed=["winblock"])
    assert set(orch.pool) == {"frozen_0"}  # (skipTrain, but not a pool agent)
    orch.do_start_episode(EpisodeConfig(num_episodes=8))
    assert worker.lineups == [{"player_1": "main", "player_2": "winblock"}] * 2
    assert orch.agents["winblock"].client.built == [] == orch.agents["frozen_0"].client.built
    m = orch.manager
    assert m.historical["winblock"].fixed and m.fixed == ["winblock"]
    assert m.payoff.played("main", "winblock") == 8
    # a league resumed from the directory must name the same fixed opponents
    with pytest.raises(ValueError, match=r"fixed opponents \['winblock'\]"):
        _league(tmp_path, monkeypatch, [FakeWorker()])


@pytest.mark.parametrize(
    "fixed, pool, needed, error",
    [
        (["main"], None, 4, "neither a player's nor in pool"),
        (["wb"], ["wb"], 4, "neither a player's nor in pool"),
        (["wb", "wb"], None, 4, "unique names"),
        (["wb"], None, 2, "one per fixed opponent"),
    ],
)
def test_fixed_opponents_that_cannot_be_are_refused(fixed, pool, needed, error):
    settings = {
        "players": [{"id": "main", "type": "main"}],
        "workers": ["http://w0"],
        "fixed": fixed,
        **({"pool": pool} if pool else {}),
    }
    with pytest.raises(InvalidRequest, match=error):
        LeagueOrchestrator().validate_initialize(
            {"id": "classic/tictactoe-v3", "kwargs": {}, "league": settings}, needed
        )


def test_a_main_player_given_only_pfsp_never_plays_itself(tmp_path, monkeypatch):
    """`branches` replaces its type's (pfsp .5, sp .35, verification .15): every job is
    PFSP over the historical players, and the league keeps the branches when resumed."""
    worker = FakeWorker()
    orch = _league(
        tmp_path,
        monkeypatch,
        [worker],
        fixed=["winblock"],
        players=(("main", "main", {"branches": {"pfsp": 1.0}}),),
    )
    orch.do_start_episode(EpisodeConfig(num_episodes=40))
    jobs = list(orch.manager.recent)
    assert len(jobs) == 10 and {j["branch"] for j in jobs} == {"pfsp"}
    assert all(set(lineup.values()) != {"main"} for lineup in worker.lineups)
    assert {j["opponent"] for j in jobs} <= {"main_0_0", "winblock"}
    resumed = _league(tmp_path, monkeypatch, [FakeWorker()], fixed=["winblock"])
    resumed.do_start_episode(EpisodeConfig(num_episodes=4))
    assert resumed.manager.active["main"].branches == {"pfsp": 1.0}


@pytest.mark.parametrize(
    "branches, error",
    [
        (
            {"pfsp": 0.5, "fancy": 0.5},
            r"player 'main' \(main\) has no branch fancy \(its branches: pfsp, sp, verification, "
            r"fixed\)",
        ),
        (
            {"pfsp": 0.5, "fixed": 0.5},
            r"the fixed branch plays the fixed opponents, and "
            r"env.league.fixed names none",
        ),
        ({"pfsp": 0.5, "sp": 0.3}, "branch probabilities must sum to 1, not 0.8"),
        ({"pfsp": 1.5, "sp": -0.5}, "less than or equal to 1"),
    ],
)
def test_branches_that_cannot_be_are_refused(branches, error):
    settings = {
        "players": [{"id": "main", "type": "main", "branches": branches}],
        "workers": ["http://w0"],
    }
    with pytest.raises(InvalidRequest, match=error):
        LeagueOrchestrator().validate_initialize(
            {"id": "classic/tictactoe-v3", "kwargs": {}, "league": settings}, 2
        )


def _always_against(opponent: str, launch_job):
    def launch(self, player_id):
        running = launch_job(self, player_id)
        if running is not None:
            running.job.opponent, running.job.branch = opponent, "pfsp"
        return running

    return launch


def _always_the_seed_snapshot(launch_job):
    def launch(self, player_id):
        running = launch_job(self, player_id)
        if running is not None:
            running.job.opponent, running.job.branch = "main_0_0", "pfsp"
        return running

    return launch


def test_an_evaluation_goes_to_a_set_up_worker_and_moves_on_from_a_dead_one(tmp_path, monkeypatch):
    dead, good = FakeWorker(), FakeWorker()
    dead.dead = True
    orch = _league(tmp_path, monkeypatch, [dead, good])
    orch.do_start_episode(
        EpisodeConfig(num_episodes=4, lineup={"player_1": "main", "player_2": "frozen_0"})
    )
    assert len(orch.results) == 4 and len(good.lineups) == 1
    w_dead, w_good = orch.scheduler.workers
    assert (w_dead.state, w_dead.failures) == ("backoff", 1)  # its set-up failed
    assert (w_good.state, w_good.jobs) == ("idle", 1)
    assert orch.test_clock.pauses == []  # the good one was set up meanwhile: no wait
    good.dead = True  # the next evaluation: no worker answers; it waits out the backoffs
    with pytest.raises(RuntimeError, match="no healthy worker left"):
        orch.do_start_episode(
            EpisodeConfig(num_episodes=4, lineup={"player_1": "main", "player_2": "frozen_0"})
        )
    assert [w.state for w in orch.scheduler.workers] == ["dropped", "dropped"]
    assert orch.test_clock.pauses and max(orch.test_clock.pauses) <= 2.0


@pytest.mark.parametrize(
    "call, complaint",
    [
        ({"lineup": {"player_1": "main", "seat_9": "frozen_0"}}, "lineup names seats"),
        ({"lineup": {"player_1": "main", "player_2": "nobody"}}, "'nobody' is not registered"),
        ({"exhaustive": {"agent": "nobody", "opponent": "random"}}, "exhaustive.agent 'nobody'"),
        (
            {"exhaustive": {"agent": "main", "opponent": "connect4_winblock"}},
            "exhaustive.opponent connect4_winblock",
        ),
    ],
)
def test_a_game_call_the_workers_would_refuse_is_a_400_here(tmp_path, monkeypatch, call, complaint):
    """A lineup or enumeration the league forwards is checked before it is accepted: a
    caller's mistake is a 400, not a worker's refusal that fails the league."""
    orch = _league(tmp_path, monkeypatch, [FakeWorker()])
    with pytest.raises(InvalidRequest, match=complaint):
        orch.validate_start_episode(GameEpisodeSettings.model_validate(call))
    orch.validate_start_episode(
        GameEpisodeSettings.model_validate({"lineup": {"player_1": "main", "player_2": "frozen_0"}})
    )
