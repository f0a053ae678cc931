"""LeagueOrchestrator: a league of agent services trains by playing each other on game
orchestrators (`GameOrchestrator` workers, anywhere on the network).

initialize names the game and the league (``env.league``: players, workers, directory, ...).
Agents registered to train are the active players, named as in ``players``; agents
registered with skipTrain are a bounded pool of frozen opponents that load snapshots with
buildModel (those ``pool`` names, when given: the others sit out, for the lineups of
evaluations). The league's matchmaking, payoff, ratings and snapshot rules are
`mistk_rl.league.LeagueManager`'s; this class runs its jobs:

- A league found in ``directory`` (``league.json``) at initialize is resumed: its counts show
  at once, and the first training startEpisode rebuilds its players' agents from their
  latest checkpoints. Else that call creates the league: every active agent saves its
  initial weights (``initial/ID.pt``, what a reset reloads) and the league starts
  with a snapshot of every main player. Each worker is initialized with the game and every
  agent is registered with it.
- startEpisode then runs jobs until the main players made ``numSteps`` moves in this call
  (or ``numEpisodes`` games were played): one job per free worker, for the next active player
  whose agent is free. A job is ``gamesPerJob`` games, seats alternating, of the player
  (collect mode, training) against its opponent (``opponentMode``, never learning): itself
  (self-play), another active player's agent, or a pool agent holding the snapshot.
  An agent is in one job at a time; a job whose opponent is busy waits, keeping its slot.
- After a job: payoff and ratings, the player's moves, a snapshot if it is due (the agent
  saves ``snapshots/ID.pt``; a reset reloads ``initial/ID.pt``), the player's weights to
  ``players/ID.pt`` and the whole league to ``league.json``, atomically. A restarted league
  orchestrator given the same directory resumes the same league.
- A job that times out or whose worker fails releases its slot and records nothing; a worker
  that cannot be reached is dropped (the league fails, saying why, once none is left).
- A startEpisode with ``lineup`` or ``exhaustive`` is a plain game call, run on the first
  worker (the harness's evaluations of a player).

``directory`` must name the same files for every agent: serve them with
``--share league=DIR`` (or mount one volume there).
"""
from __future__ import annotations

import concurrent.futures as futures
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from mistk_rl.client import (OrchestratorClient, ServiceError, ServiceUnavailable,
                             WaitTimeout)
from mistk_rl.errors import InvalidRequest
from mistk_rl.games.pettingzoo_games import probe_game, result_for
from mistk_rl.league.manager import PLAYER_TYPES, LeagueManager, RunningJob
from mistk_rl.league.player import MainPlayer
from mistk_rl.orchestrator import AbstractOrchestrator
from mistk_rl.schemas import AgentSettings, EpisodeConfig, EpisodeResult, LeagueSettings
from mistk_rl.spaces import space_to_dict

log = logging.getLogger(__name__)
STATE = "league.json"
WAKE_S = 1.0  # the scheduler looks at finished jobs and stopEpisode at least this often


@dataclass
class _Launch:
    """A job with the agents it holds: its player's, the opponent's (the same in
    self-play) and, for a snapshot, the checkpoint the pool agent loads first."""

    running: RunningJob
    opponent_agent: str
    load: Optional[str] = None

    @property
    def home(self) -> str:
        return self.running.job.launch_player

    @property
    def agents(self) -> set[str]:
        return {self.home, self.opponent_agent}


@dataclass
class _Outcome:
    games: list[EpisodeResult] = field(default_factory=list)
    steps: int = 0
    error: Optional[str] = None
    worker_lost: bool = False


@dataclass
class _Worker:
    url: str
    client: OrchestratorClient


class LeagueOrchestrator(AbstractOrchestrator):
    runs_league = True

    def __init__(self) -> None:
        super().__init__()
        self.env: dict[str, Any] = {}
        self.settings: Optional[LeagueSettings] = None
        self.seats: list[str] = []
        self.spaces: dict[str, tuple[Any, Any]] = {}
        self.manager: Optional[LeagueManager] = None
        self.workers: list[_Worker] = []
        self.pool: dict[str, Optional[str]] = {}  # frozen agent -> snapshot checkpoint held
        self._last_use: dict[str, int] = {}
        self._pending: dict[str, RunningJob] = {}  # player -> its job waiting for agents
        self._busy: set[str] = set()
        self._next_player = 0
        self._agents_loaded = False  # a resumed league's players got their weights back
        self.evaluations: list[dict[str, Any]] = []

    # ---- initialize and registration -----------------------------------------------------
    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        super().validate_initialize(env, agents_needed)
        if env.get("league") is None:
            raise InvalidRequest("env.league: the league orchestrator needs its settings "
                                 "(players, workers)")
        try:
            settings = LeagueSettings.model_validate(env["league"])
        except ValueError as exc:
            raise InvalidRequest(f"env.league: {exc}") from exc
        ids = [p.id for p in settings.players]
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"env.league.players: ids must be unique, got {ids}")
        if not any(p.type == "main" for p in settings.players):
            raise InvalidRequest("env.league.players: a league needs a main player")
        if agents_needed <= len(ids):
            raise InvalidRequest(f"agentsNeeded {agents_needed}: one agent per player "
                                 f"({len(ids)}) and at least one frozen agent (skipTrain) "
                                 "for the snapshots")
        probe_game({"id": env["id"], "kwargs": env.get("kwargs", {})})

    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        self._close_workers()
        self.settings = LeagueSettings.model_validate(env["league"])
        self.env = {"id": env["id"], "kwargs": dict(env.get("kwargs", {}))}
        game = probe_game(self.env)
        self.seats, self.spaces = game.seats, game.spaces
        self.manager, self.pool, self._pending, self._busy = None, {}, {}, set()
        self.evaluations, self._agents_loaded = [], False
        self.update_status({"game": self.env["id"], "seats": list(self.seats),
                            "players": [p.id for p in self.settings.players]})
        self.manager = self._load()  # a league in the directory: resumed (its counts now)
        if self.manager is not None:
            self._report()

    def validate_register_agent(self, name: str, seats: tuple[str, ...],
                                skip_train: bool = False) -> tuple[str, ...]:
        if seats:
            raise InvalidRequest("the league seats its agents itself: registerAgent takes no "
                                 "seats here")
        players = {p.id for p in self.settings.players}
        if not skip_train and name not in players:
            raise InvalidRequest(f"agent {name!r} trains but is no player of the league "
                                 f"({', '.join(sorted(players))}): register it under a "
                                 "player's id, or with skipTrain as a frozen opponent")
        if skip_train and name in players:
            raise InvalidRequest(f"player {name!r} trains: register it without skipTrain")
        if len(self.agents) + 1 == self.agents_needed:
            missing = players - set(self.agents) - {name}
            if missing:
                raise InvalidRequest(f"the last agent leaves players {sorted(missing)} "
                                     "without an agent")
            if not self.pool and not self._in_pool(name, skip_train):
                raise InvalidRequest("the last agent leaves the league without a frozen "
                                     "agent (skipTrain, in pool) to load snapshots")
        return ()

    def agent_config(self, name: str, seats: tuple[str, ...] = ()) -> dict[str, Any]:
        obs_space, act_space = self.spaces[self.seats[0]]  # (a game's seats share them)
        return {"observationSpace": space_to_dict(obs_space),
                "actionSpace": space_to_dict(act_space),
                "properties": {"game": self.env["id"], "league": True}}

    def do_register_agent(self, agent_name: str, agent_url: str, skip_train: bool) -> None:
        if self._in_pool(agent_name, skip_train):
            self.pool[agent_name] = None

    def _in_pool(self, name: str, skip_train: bool) -> bool:
        """Whether the agent is a frozen one that loads snapshots (module doc)."""
        return skip_train and (self.settings.pool is None or name in self.settings.pool)

    # ---- episodes ------------------------------------------------------------------------
    def validate_start_episode(self, config: EpisodeConfig) -> None:
        if (config.resume or config.max_steps is not None or config.env_manager != "base"
                or config.env_kwargs):
            raise InvalidRequest("resume, maxSteps, envManager, envKwargs: not for a league")
        missing = [p.id for p in self.settings.players if p.id not in self.agents]
        if missing:  # (the lifecycle allows startEpisode only once all are registered)
            raise InvalidRequest(f"players {missing} have no agent")

    def do_start_episode(self, config: EpisodeConfig) -> None:
        if config.lineup is not None or config.exhaustive is not None:
            self._set_up_workers()  # (an evaluation of agents as they are: no league needed)
            self._forward(config)
        else:
            if self.manager is None:
                self.manager = self._create()
                self._save()
            elif not self._agents_loaded:  # a resumed league: its players' latest weights
                call = self._call_timeout()
                for pid, player in self.manager.active.items():
                    self.agents[pid].client.build_model(player.checkpoint_path, timeout=call)
            self._agents_loaded = True
            self._set_up_workers()
            self._report()
            self._run_jobs(config)

    def league_view(self) -> Optional[dict[str, Any]]:
        if self.manager is None:
            return None
        return {**self.manager.view(), "pool": dict(self.pool),
                "workers": [w.url for w in self.workers]}

    def extra_results(self) -> dict[str, Any]:
        return {"evaluations": list(self.evaluations)}

    def do_reset(self) -> None:
        self._close_workers(reset=True)
        self.manager = None

    def do_terminate(self) -> None:
        self._close_workers()

    # ---- set-up --------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self.settings.directory.rstrip('/')}/{name}"

    def _set_up_workers(self) -> None:
        if not self.workers:
            self.workers = [self._set_up_worker(url) for url in self.settings.workers]

    def _load(self) -> Optional[LeagueManager]:
        """The league saved in the directory, if there is one (its agents' weights are
        loaded at the first training call, once they are registered)."""
        state_file = self.resolve_path(self._path(STATE))
        if not state_file.exists():
            return None
        manager = LeagueManager.load(state_file)
        given = {p.id: p.type for p in self.settings.players}
        kinds = {pid: _kind(p) for pid, p in manager.active.items()}
        if given != kinds:
            raise ValueError(f"{state_file} holds a league of {kinds}; the settings name "
                             f"{given}: give another directory for a new league")
        log.info("resuming the league in %s (%d jobs)", state_file, manager.jobs_launched)
        return manager

    def _create(self) -> LeagueManager:
        """A new league: every player's initial weights saved (what a reset reloads)."""
        s, call = self.settings, self._call_timeout()
        specs = []
        for p in s.players:
            initial, latest = self._path(f"initial/{p.id}.pt"), self._path(f"players/{p.id}.pt")
            self.agents[p.id].client.save_model(initial, timeout=call)
            self.agents[p.id].client.save_model(latest, timeout=call)
            specs.append({"type": p.type, "id": p.id, "checkpoint": latest,
                          "initial_checkpoint": initial})
        return LeagueManager.create(specs, one_phase_step=s.one_phase_step,
                                    max_active_player_job=s.max_active_player_job, seed=s.seed)

    def _set_up_worker(self, url: str) -> _Worker:
        call = self._call_timeout()
        client = OrchestratorClient(url, token=self._token(), timeout=call)
        try:
            if client.status().state != "uninitialized":
                client.reset(timeout=call)
            client.initialize(self.env, agents_needed=len(self.agents), timeout=call)
            for agent in self.agents.values():
                client.register_agent(agent.name, agent.url, skip_train=agent.skip_train)
        except ServiceError as exc:
            client.close()
            raise RuntimeError(f"setting up worker {url}: {exc}") from exc
        return _Worker(url, client)

    def _close_workers(self, reset: bool = False) -> None:
        workers, self.workers = self.workers, []
        for worker in workers:
            if reset:
                try:
                    worker.client.reset(timeout=self._call_timeout())
                except ServiceError as exc:
                    log.warning("resetting worker %s: %s", worker.url, exc)
            worker.client.close()

    def _call_timeout(self) -> float:
        return max((a.client.timeout for a in self.agents.values()), default=30.0)

    def _token(self) -> Optional[str]:
        return next((a.client.token for a in self.agents.values()), None)

    # ---- jobs ----------------------------------------------------------------------------
    def _run_jobs(self, config: EpisodeConfig) -> None:
        """Jobs on every free worker until the budget is spent (module doc)."""
        mains_before = self._main_steps()
        games_before = len(self.results)
        limit = config.episode_limit()

        def spent() -> bool:
            if config.num_steps is not None and (self._main_steps() - mains_before
                                                 >= config.num_steps):
                return True
            return limit is not None and len(self.results) - games_before >= limit

        running: dict[futures.Future, tuple[_Worker, _Launch]] = {}
        with futures.ThreadPoolExecutor(len(self.workers),
                                        thread_name_prefix="league-job") as pool:
            try:
                while True:
                    if not self.should_stop and not spent():
                        for worker in self._free_workers(running):
                            launch = self._next_launch()
                            if launch is None:
                                break
                            running[pool.submit(self._play, worker, launch)] = (worker, launch)
                    if not running:
                        if self.should_stop or spent():
                            return
                        raise RuntimeError("no job can start: every player's opponent is "
                                           "waiting for an agent no job will free")
                    done, _ = futures.wait(running, timeout=WAKE_S,
                                           return_when=futures.FIRST_COMPLETED)
                    for future in done:
                        worker, launch = running.pop(future)
                        self._finish(worker, launch, future.result())
            finally:
                for worker, launch in running.values():  # cancelled: stop their games
                    try:
                        worker.client.stop_episode()
                    except ServiceError:
                        pass
                for future, (worker, launch) in running.items():
                    self._finish(worker, launch, future.result())

    def _free_workers(self, running: dict) -> list[_Worker]:
        busy = {id(worker) for worker, _ in running.values()}
        return [w for w in self.workers if id(w) not in busy]

    def _next_launch(self) -> Optional[_Launch]:
        """A job that can start now, its agents marked busy: first the jobs waiting for
        agents, oldest first, then a new job for the next player in turn. A waiting job
        reserves the agents it needs, so later jobs cannot keep taking them (an exploiter
        waiting for the main player's agent would otherwise starve)."""
        reserved: set[str] = set()
        for pid, running in sorted(self._pending.items(), key=lambda kv: kv[1].job_id):
            launch = self._assign(running, reserved)
            if launch is not None:
                del self._pending[pid]
                return self._hold(launch)
            reserved |= self._needs(running)
        ids = [p.id for p in self.settings.players]
        for k in range(len(ids)):
            pid = ids[(self._next_player + k) % len(ids)]
            if pid in self._pending or pid in self._busy or pid in reserved:
                continue
            running = self.manager.launch_job(pid)
            if running is None:
                continue
            launch = self._assign(running, reserved)
            if launch is None:
                self._pending[pid] = running
                reserved |= self._needs(running)
                continue
            self._next_player = (self._next_player + k + 1) % len(ids)
            return self._hold(launch)
        return None

    def _hold(self, launch: _Launch) -> _Launch:
        self._busy |= launch.agents
        return launch

    def _needs(self, running: RunningJob) -> set[str]:
        """The agents a job needs by name (a snapshot takes whichever pool agent is free)."""
        job = running.job
        return {job.launch_player} | ({job.opponent} if job.opponent in self.manager.active
                                      else set())

    def _assign(self, running: RunningJob, reserved: set[str]) -> Optional[_Launch]:
        """The agents for this job, if they are free and not reserved: the opponent's own
        agent, or a pool agent holding the snapshot (else the free one used longest ago,
        to load it)."""
        home, opponent = running.job.launch_player, running.job.opponent
        taken = self._busy | reserved
        if home in taken:
            return None
        if opponent == home or opponent in self.manager.active:
            return None if opponent in taken else _Launch(running, opponent)
        checkpoint = self.manager.historical[opponent].checkpoint_path
        free = [name for name in self.pool if name not in taken]
        holding = [name for name in free if self.pool[name] == checkpoint]
        if holding:
            return _Launch(running, holding[0])
        if not free:
            return None
        name = min(free, key=lambda n: self._last_use.get(n, -1))
        return _Launch(running, name, load=checkpoint)

    def _play(self, worker: _Worker, launch: _Launch) -> _Outcome:
        """One job on `worker` (in a job thread: HTTP only, no league state touched)."""
        s, home, opponent = self.settings, launch.home, launch.opponent_agent
        lineup = {self.seats[0]: home, self.seats[1]: opponent}
        agents = {home: AgentSettings(mode="collect", train=True)}
        if opponent != home:
            agents[opponent] = AgentSettings(mode=s.opponent_mode, train=False)
        seed = None if s.seed is None else s.seed + launch.running.job_id * s.num_envs
        config = EpisodeConfig(num_episodes=s.games_per_job, seed=seed,
                               num_envs=min(s.num_envs, s.games_per_job), train=True,
                               lineup=lineup, seat_assignment="alternate", agents=agents)
        client = worker.client
        try:
            if launch.load is not None:
                self.agents[opponent].client.build_model(launch.load,
                                                         timeout=self._call_timeout())
            before = client.progress()
            client.start_episode(config, wait=True, timeout=s.job_timeout)
            client.stop_episode()
            games = client.get_results(since=before.episodes_done).episodes
            steps = client.progress().agent_steps.get(home, 0)
            return _Outcome(games, steps - before.agent_steps.get(home, 0))
        except WaitTimeout as exc:
            try:
                client.stop_episode()
            except ServiceError:
                pass
            return _Outcome(error=f"timed out after {s.job_timeout} s: {exc}")
        except ServiceUnavailable as exc:
            return _Outcome(error=str(exc), worker_lost=True)
        except ServiceError as exc:
            return _Outcome(error=str(exc))

    def _finish(self, worker: _Worker, launch: _Launch, outcome: _Outcome) -> None:
        """A job ended: the league learns its games (or its failure), snapshots the player
        if due, and is saved; then its agents are free."""
        job, job_id = launch.running.job, launch.running.job_id
        try:
            if launch.load is not None and outcome.error is None:
                self.pool[launch.opponent_agent] = launch.load
            self._last_use[launch.opponent_agent] = job_id
            if outcome.error is not None:
                self.manager.fail_job(job_id, outcome.error)
                if launch.load is not None:
                    self.pool[launch.opponent_agent] = None  # (the load may not have happened)
                self._lose_worker(worker, outcome)
                return
            results = []
            for game in outcome.games:
                seat = next(seat for seat, agent in (game.seats or {}).items()
                            if agent == job.launch_player)
                results.append(result_for(seat, game.winner))
                self.record_episode(job.launch_player, game.returns[seat], game.length,
                                    every_s=1.0, job=job_id, opponent=job.opponent,
                                    branch=job.branch, seats=game.seats,
                                    winner=game.winner, illegal=game.illegal)
            self.env_steps += sum(game.length for game in outcome.games)
            self.manager.finish_job(job_id, results, outcome.steps)
            self._snapshot_if_due(job.launch_player)
            self.agents[job.launch_player].client.save_model(
                self.manager.active[job.launch_player].checkpoint_path,
                timeout=self._call_timeout())
            self._save()
        finally:
            self._busy -= launch.agents
            self._report()

    def _snapshot_if_due(self, player_id: str) -> None:
        if not self.manager.snapshot_due(player_id):
            return
        client, call = self.agents[player_id].client, self._call_timeout()
        path = self._path(f"snapshots/{self.manager.next_snapshot_id(player_id)}.pt")
        client.save_model(path, timeout=call)
        snapshot, reset = self.manager.take_snapshot(player_id, path)
        log.info("snapshot %s of %s%s", snapshot.player_id, player_id,
                 "; reset to its initial weights" if reset else "")
        if reset:  # a fresh learner: initial weights, no optimizer state, empty buffer
            client.build_model(self.manager.active[player_id].initial_checkpoint,
                               timeout=call)

    def _lose_worker(self, worker: _Worker, outcome: _Outcome) -> None:
        log.warning("league job on %s failed: %s", worker.url, outcome.error)
        if outcome.worker_lost and worker in self.workers:
            self.workers.remove(worker)
            worker.client.close()
            if not self.workers:
                raise RuntimeError(f"every worker is lost; the last, {worker.url}: "
                                   f"{outcome.error}")

    def _forward(self, config: EpisodeConfig) -> None:
        """A plain game call (a lineup, an enumeration) on the first worker."""
        if not self.workers:
            raise RuntimeError("every worker is lost: nothing can play this call")
        client = self.workers[0].client
        before = client.progress().episodes_done
        client.start_episode(config, wait=True, timeout=self.settings.job_timeout)
        client.stop_episode()
        results = client.get_results(since=before)
        for game in results.episodes:
            extra = {k: v for k, v in game.model_dump(by_alias=True, exclude_unset=True).items()
                     if k not in ("episode", "agent", "return", "length", "envSteps")}
            self.record_episode(game.agent, game.return_, game.length, **extra)
        if config.exhaustive is not None and results.evaluations:
            self.evaluations.append(results.evaluations[-1])

    # ---- state ---------------------------------------------------------------------------
    def _main_steps(self) -> int:
        return sum(p.total_agent_step for p in self.manager.active.values()
                   if isinstance(p, MainPlayer))

    def _save(self) -> None:
        self.manager.save(self.resolve_path(self._path(STATE)))

    def _report(self) -> None:
        m = self.manager
        self.update_status({
            "agentSteps": {pid: p.total_agent_step for pid, p in m.active.items()},
            "envSteps": self.env_steps, "episodesDone": len(self.results),
            "league": {"jobs": m.jobs_launched, "running": len(m.running),
                       "snapshots": len(m.historical), "workers": len(self.workers)}})


def _kind(player: Any) -> str:
    return next(name for name, cls in PLAYER_TYPES.items() if type(player) is cls)
