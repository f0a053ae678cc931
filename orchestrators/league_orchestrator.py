"""LeagueOrchestrator: a league of agent services trains by playing each other on game
orchestrators (`GameOrchestrator` workers, anywhere on the network), or, a solo league,
each alone on gym orchestrators (`GymOrchestrator` workers).

initialize names the game and the league (``env.league``: players, workers, directory, ...).
Agents registered to train are the active players, named as in ``players``; agents
registered with skipTrain are a bounded pool of frozen opponents that load snapshots with
buildModel (those ``pool`` names, when given: the others sit out, for the lineups of
evaluations), but for the ``fixed`` ones: opponents the league plays as they are (a scripted
player, a policy trained elsewhere), historical players of their own that PFSP weighs as
any snapshot. The league's matchmaking, payoff, ratings and snapshot rules are
`mistk_rl.league.LeagueManager`'s; which job runs when, with which agents, on which worker,
and how failing workers are retried is `mistk_rl.league.scheduler.Scheduler`'s; a job's
launch, end and failure are each told once to `mistk_rl.league.jobs.LeagueJobs`, which
updates both (pure code). What a battle and a solo league do differently is their
`orchestrators.league_modes.LeagueMode`'s. This class does the HTTP:

- A league found in ``directory`` (``league.json``) at initialize is resumed: its counts show
  at once, and the first training startEpisode rebuilds its players' agents from their
  latest checkpoints. Else that call creates the league: every active agent saves its
  initial weights (``initial/ID.pt``, what a reset reloads) and the league starts
  with a snapshot of every main player.
- A worker is set up (reset, initialized with the game, every agent registered with it)
  before its first job, and again after a failure.
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
- A job that fails (its worker died, restarted, failed or timed out) records nothing but
  the failure: its episode is stopped on the worker if it still answers, and its agents are
  brought back to ``ready`` (an agent the job left mid-episode gets episodeStopped) before
  any other job gets them; an agent that cannot be (gone, failed, without its model) ends
  the run naming it. The worker waits ``workerBackoff`` seconds, doubling per failure in a
  row up to ``workerBackoffMax``, and is set up again; after ``maxWorkerFailures`` in a row
  it is dropped. With none left the startEpisode fails: "no healthy worker left", naming
  each worker and its last error. Each failure is one log line.
- With ``deterministic``, job results are applied in launch order, and after each one the
  next job is launched at once, so every decision of the league happens at the same point
  of the same sequence from run to run (`_watched`); a worker whose job ended first waits.
- A startEpisode with ``lineup`` or ``exhaustive`` is a plain game call, run on a set-up
  worker (the harness's evaluations of a player), retried on another under the same rules.
- A worker may join at any time (``POST /league/workers``): more capacity, or one started
  again elsewhere in place of a lost one (``replaces``: the lost one is dropped, and the
  new one takes its player in a solo league). It joins the running job loop within a second
  (`WAKE_S`), or at once when no episode runs, and is set up before its first job.

``directory`` must name the same files for every agent: serve them with
``--share league=DIR`` (or mount one volume there); or, where services share no file system
(a cluster), ``copyCheckpoints``: every checkpoint an agent saves is copied into this
orchestrator's directory over HTTP (getFile), and put into an agent (putFile) before it
loads it, so this orchestrator's directory alone holds the league.

A solo league (every player of type ``solo``, `SoloActivePlayer`; a mix of solo and battle
players is refused) trains single-agent players on a gymnasium env (``env.id``), on gym
orchestrator workers. A gym orchestrator takes exactly one agent, so each worker is bound
to one player at set-up (worker i to player i modulo the players; at least one worker per
player), and registers that player's agent only; a player's jobs run one at a time on its
workers (its agent is in one episode at a time), the players' side by side. A job is the
player's `Job.settings` (numEnvs, numEpisodes, envKwargs, and the player's decaying epsilon
in ``agents.ID.epsilon``), played with ``startEpisode`` on its worker; its episodes' env
steps advance the player (its snapshot clock: a snapshot every ``onePhaseStep``), its mean
return goes to the league's `SoloSharedPayoff`. startEpisode runs jobs until the players
took ``numSteps`` env steps in all (or ``numEpisodes`` episodes were played). There are no
frozen agents, no lineups and no enumerations; everything else (league.json, checkpoints,
resuming, faults) is as for battle players.
"""

from __future__ import annotations

import concurrent.futures as futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, cast

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_bytes
from mistk_rl.framework.implementation import Metric
from mistk_rl.framework.orchestrator import AbstractOrchestrator
from mistk_rl.league.jobs import LeagueJobs
from mistk_rl.league.manager import LeagueManager
from mistk_rl.league.scheduler import Assignment, Backoff, Failure, Scheduler
from mistk_rl.lifecycle import AGENT
from mistk_rl.sdk.client import BadRequest, Conflict, OrchestratorClient, ServiceError, WaitTimeout
from mistk_rl.sdk.schemas import (
    EpisodeResult,
    EpisodeSettings,
    GameEpisodeSettings,
    LeagueEnvSpec,
    LeagueSettings,
)
from orchestrators import league_modes
from orchestrators.league_modes import LeagueMode, SoloMode

log = logging.getLogger(__name__)
STATE = "league.json"
WAKE_S = 1.0  # the job loop looks at stopEpisode, due set-ups and joining workers this often
MAX_WORKERS = 256  # workers a league may have had, joined ones included (its job threads)
# /metrics rates every active player and the best this many snapshots: a league gains one
# every phase, and a series per snapshot would grow without end (league.json has them all)
RATED_SNAPSHOTS = 10
AGENT_SETTLED = frozenset(AGENT.states) - AGENT.busy_states
# the job loop's tasks in flight: each one's worker, and its job (None: a set-up)
Tasks = dict[futures.Future[Any], tuple[int, Optional[Assignment]]]


@dataclass
class _Outcome:
    """How a job ended, seen from its thread: its games and moves, or its error and what
    was done about its agents."""

    games: list[EpisodeResult] = field(default_factory=list)  # (solo: episodes)
    steps: int = 0
    error: Optional[str] = None
    recovered: dict[str, str] = field(default_factory=dict)  # agent -> the state it was in
    agent_error: Optional[str] = None  # an agent that cannot be brought back: the run ends


def rated_players(manager: LeagueManager) -> list[dict[str, Any]]:
    """The rows of `LeagueManager.table` whose ratings /metrics shows: every active player,
    and the best `RATED_SNAPSHOTS` snapshots (fixed opponents count as snapshots)."""
    rows = manager.table()  # (best first)
    active = [row for row in rows if row["id"] in manager.active]
    return active + [row for row in rows if row["id"] not in manager.active][:RATED_SNAPSHOTS]


class LeagueOrchestrator(AbstractOrchestrator):
    env_settings = LeagueEnvSpec
    episode_settings = GameEpisodeSettings
    clock = staticmethod(time.monotonic)  # the scheduler's clock (a test may give its own)
    # set by initialize, which the lifecycle puts before every call that reads them
    settings: LeagueSettings
    mode: LeagueMode  # a battle or a solo league (module doc)
    scheduler: Scheduler

    def __init__(self) -> None:
        super().__init__()
        self.env: dict[str, Any] = {}
        # the league: resumed at initialize, or created by the first training startEpisode
        self._jobs: Optional[LeagueJobs] = None
        self.clients: list[Optional[OrchestratorClient]] = []  # per worker, once set up
        self._agents_loaded = False  # a resumed league's players got their weights back
        self.evaluations: list[dict[str, Any]] = []
        # workers that asked to join (POST /league/workers): the job loop, which owns the
        # scheduler while an episode runs, takes them in (`_admit_joining`)
        self._joining: list[tuple[str, Optional[int]]] = []
        self._joining_lock = threading.Lock()
        self._in_episode = False

    @property
    def pool(self) -> dict[str, Optional[str]]:
        """Frozen agent -> the snapshot checkpoint it holds."""
        return self.scheduler.pool

    @property
    def solo(self) -> bool:
        """Whether the players train alone (module doc)."""
        return isinstance(self.mode, SoloMode)

    @property
    def manager(self) -> Optional[LeagueManager]:
        """The league's players, payoff and jobs; None before it is resumed or created."""
        return None if self._jobs is None else self._jobs.manager

    @property
    def jobs(self) -> LeagueJobs:
        """The owner of the league's jobs, once there is a league (`_start_episode`)."""
        if self._jobs is None:
            raise RuntimeError("no league yet: the first training startEpisode creates it")
        return self._jobs

    # ---- initialize and registration -----------------------------------------------------
    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        super().validate_initialize(env, agents_needed)
        if env.get("league") is None:
            raise InvalidRequest(
                "env.league: the league orchestrator needs its settings (players, workers)"
            )
        try:
            settings = LeagueSettings.model_validate(env["league"])
        except ValueError as exc:
            raise InvalidRequest(f"env.league: {exc}") from exc
        ids = [p.id for p in settings.players]
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"env.league.players: ids must be unique, got {ids}")
        if settings.worker_backoff_max < settings.worker_backoff:
            raise InvalidRequest("env.league.workerBackoffMax: at least workerBackoff")
        league_modes.validate(env, settings, agents_needed, self.env_modules)

    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        self._close_workers()
        with self._joining_lock:
            self._joining = []
        s = self.settings = LeagueSettings.model_validate(env["league"])
        self.env = {"id": env["id"], "kwargs": dict(env.get("kwargs", {}))}
        self.mode = league_modes.start(self.env, s, self.env_modules)
        self._jobs, self.evaluations, self._agents_loaded = None, [], False
        self.scheduler = Scheduler(
            [p.id for p in s.players],
            s.workers,
            Backoff(
                max_failures=s.max_worker_failures,
                first_s=s.worker_backoff,
                max_s=s.worker_backoff_max,
            ),
            bind=self.mode.bind_workers,
        )
        self.clients = [None] * len(s.workers)
        self.update_status(self.mode.status([p.id for p in s.players]))
        manager = self._load()  # a league in the directory: resumed (its counts now)
        if manager is not None:
            self._jobs = LeagueJobs(manager, self.scheduler)
            self._report()

    def validate_register_agent(
        self, name: str, seats: tuple[str, ...], skip_train: bool = False
    ) -> tuple[str, ...]:
        if seats:
            raise InvalidRequest(
                "the league seats its agents itself: registerAgent takes no seats here"
            )
        players = {p.id for p in self.settings.players}
        if not skip_train and name not in players:
            raise InvalidRequest(
                f"agent {name!r} trains but is no player of the league "
                f"({', '.join(sorted(players))}): register it under a "
                "player's id, or with skipTrain as a frozen opponent"
            )
        if skip_train and name in players:
            raise InvalidRequest(f"player {name!r} trains: register it without skipTrain")
        self.mode.check_agent(name, skip_train)
        if len(self.agents) + 1 == self.agents_needed:
            missing = players - set(self.agents) - {name}
            if missing:
                raise InvalidRequest(
                    f"the last agent leaves players {sorted(missing)} without an agent"
                )
            self.mode.check_last_agent(bool(self.pool) or self._in_pool(name, skip_train))
            unregistered = set(self.settings.fixed) - set(self.agents) - {name}
            if unregistered:
                raise InvalidRequest(
                    f"the last agent leaves the fixed opponents "
                    f"{sorted(unregistered)} without an agent"
                )
        return ()

    def agent_config(self, name: str, seats: tuple[str, ...] = ()) -> dict[str, Any]:
        return self.mode.agent_config()

    def do_register_agent(self, agent_name: str, agent_url: str, skip_train: bool) -> None:
        if self._in_pool(agent_name, skip_train):
            self.scheduler.add_pool_agent(agent_name)

    def _in_pool(self, name: str, skip_train: bool) -> bool:
        """Whether the agent is a frozen one that loads snapshots (module doc)."""
        return (
            skip_train
            and name not in self.settings.fixed
            and (self.settings.pool is None or name in self.settings.pool)
        )

    # ---- episodes ------------------------------------------------------------------------
    def validate_start_episode(self, config: EpisodeSettings) -> None:
        missing = [p.id for p in self.settings.players if p.id not in self.agents]
        if missing:  # (the lifecycle allows startEpisode only once all are registered)
            raise InvalidRequest(f"players {missing} have no agent")
        self.mode.check_start(_game_call(config), self.agents)

    def do_start_episode(self, config: EpisodeSettings) -> None:
        with self._joining_lock:  # (the job loop owns the scheduler until it ends)
            self._in_episode = True
        try:
            self._start_episode(_game_call(config))
        finally:
            with self._joining_lock:
                self._admit_joining()
                self._in_episode = False

    def _start_episode(self, config: GameEpisodeSettings) -> None:
        if config.lineup is not None or config.exhaustive is not None:
            self._forward(config)  # (an evaluation of agents as they are: no league needed)
            return
        if self._jobs is None:
            self._jobs = LeagueJobs(self._create(), self.scheduler)
            self._save()
        elif not self._agents_loaded:  # a resumed league: its players' latest weights
            call = self._call_timeout()
            for pid, player in self._jobs.manager.active.items():
                self._load_weights(pid, player.checkpoint_path, call)
        self._agents_loaded = True
        self._report()
        self._run_jobs(config)

    def league_view(self) -> Optional[dict[str, Any]]:
        manager = self.manager
        if manager is None:
            return None
        with self._joining_lock:
            joining = [
                {
                    "url": url,
                    "replaces": None if index is None else self.scheduler.workers[index].url,
                }
                for url, index in self._joining
            ]
        return {
            **manager.view(),
            "pool": dict(self.pool),
            "workers": self.scheduler.view(self.clock()),
            "joining": joining,
        }

    def add_worker(self, url: str, replaces: Optional[str] = None) -> dict[str, Any]:
        """POST /league/workers (module doc), once initialized: the worker at `url` joins,
        in place of the worker at `replaces` if given. InvalidRequest (400) for a URL the
        league has as a live worker, or a `replaces` it has not; what it does, for the
        answer."""
        with self._joining_lock:
            sched = self.scheduler  # (initialized: the service checked)
            live = {w.url: w.index for w in sched.workers if w.live and w.replaced_by is None}
            joining = {u for u, _ in self._joining}
            if url in live or url in joining:
                raise InvalidRequest(f"worker {url} is in the league already", field="url")
            index = None
            if replaces is not None:
                index = live.get(replaces)
                if index is None or index in {i for _, i in self._joining}:
                    raise InvalidRequest(
                        f"replaces: {replaces} is no live worker of the "
                        f"league (live: {sorted(live)})",
                        field="replaces",
                    )
            if len(sched.workers) + len(self._joining) >= MAX_WORKERS:
                raise InvalidRequest(
                    f"the league has had {MAX_WORKERS} workers: no more can join", field="url"
                )
            self._joining.append((url, index))
            if not self._in_episode:  # (no job loop runs: the scheduler is this call's)
                self._admit_joining()
        log.info(
            "worker %s joins the league%s", url, f" in place of {replaces}" if replaces else ""
        )
        return {"url": url, "replaces": replaces}

    def _admit_joining(self) -> None:
        """Take the workers that asked to join into the scheduler (called with the lock
        held, by whoever owns the scheduler now)."""
        for url, replaces in self._joining:
            worker = self.scheduler.add_worker(url, replaces)
            self.clients.append(None)
            if replaces is not None and not self.scheduler.workers[replaces].live:
                self._drop_client(replaces)
            log.info(
                "worker %d %s joined%s",
                worker.index,
                url,
                "" if replaces is None else f" in place of worker {replaces}",
            )
        if self._joining:
            self._joining = []
            self._report()

    def _drop_client(self, index: int) -> None:
        client, self.clients[index] = self.clients[index], None
        if client is not None:
            client.close()

    def extra_results(self) -> dict[str, Any]:
        return {"evaluations": list(self.evaluations)}

    def do_reset(self) -> None:
        self._close_workers(reset=True)
        self._jobs = None

    def do_terminate(self) -> None:
        self._close_workers()

    # ---- checkpoints ---------------------------------------------------------------------
    def _save_weights(self, agent: str, path: str, timeout: float) -> None:
        """`agent` saves its checkpoint at `path`; with copyCheckpoints this orchestrator
        copies it into its own directory (the agent's is on another machine)."""
        client = self.agents[agent].client
        client.save_model(path, timeout=timeout)
        if self.settings.copy_checkpoints:
            atomic_write_bytes(self.resolve_path(path), client.get_file(path, timeout=timeout))

    def _load_weights(self, agent: str, path: str, timeout: float) -> None:
        """`agent` builds its model from the checkpoint at `path`; with copyCheckpoints this
        orchestrator puts its copy there first."""
        client = self.agents[agent].client
        if self.settings.copy_checkpoints:
            client.put_file(path, self.resolve_path(path).read_bytes(), timeout=timeout)
        client.build_model(path, timeout=timeout)

    # ---- set-up --------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self.settings.directory.rstrip('/')}/{name}"

    def _load(self) -> Optional[LeagueManager]:
        """The league saved in the directory, if there is one (its agents' weights are
        loaded at the first training call, once they are registered)."""
        state_file = self.resolve_path(self._path(STATE))
        if not state_file.exists():
            return None
        manager = LeagueManager.load(state_file)
        given = {p.id: p.type for p in self.settings.players}
        kinds = {pid: p.kind for pid, p in manager.active.items()}
        if given != kinds or sorted(self.settings.fixed) != sorted(manager.fixed):
            raise ValueError(
                f"{state_file} holds a league of {kinds} (fixed opponents "
                f"{sorted(manager.fixed)}); the settings name {given} (fixed "
                f"{sorted(self.settings.fixed)}): give another directory for a "
                "new league"
            )
        log.info("resuming the league in %s (%d jobs)", state_file, manager.jobs_launched)
        return manager

    def _create(self) -> LeagueManager:
        """A new league: every player's initial weights saved (what a reset reloads)."""
        s, call = self.settings, self._call_timeout()
        specs = []
        for p in s.players:
            initial, latest = self._path(f"initial/{p.id}.pt"), self._path(f"players/{p.id}.pt")
            self._save_weights(p.id, initial, call)
            self._save_weights(p.id, latest, call)
            specs.append(
                {
                    "type": p.type,
                    "id": p.id,
                    "checkpoint": latest,
                    "initial_checkpoint": initial,
                    **p.settings(),
                }
            )
        return LeagueManager.create(
            specs,
            one_phase_step=s.one_phase_step,
            max_active_player_job=s.max_active_player_job,
            seed=s.seed,
            fixed=s.fixed,
        )

    def _client(self, index: Optional[int]) -> OrchestratorClient:
        """The client of a set-up worker (every worker given a task is one)."""
        client = None if index is None else self.clients[index]
        if client is None:
            raise RuntimeError(f"worker {index} is not set up")
        return client

    def _connect(self, url: str) -> OrchestratorClient:
        """A fresh client of a worker (it accepts whichever instance answers: a worker set
        up again may be a restarted process)."""
        return OrchestratorClient(url, token=self._token(), timeout=self._call_timeout())

    def _set_up_worker(self, index: int) -> Optional[str]:
        """Reset the worker (leaving the agents as they are: they play on other workers),
        initialize it with the game and register every agent (a solo league's: the env,
        and the agent of the player it is bound to); None when done, else the error. (In a
        job thread, or the hook's: the scheduler holds those agents meanwhile.)"""
        url, call = self.scheduler.workers[index].url, self._call_timeout()
        self._drop_client(index)
        client = self._connect(url)
        player = self.scheduler.workers[index].player  # (solo: the one it registers)
        agents = [self.agents[player]] if player is not None else list(self.agents.values())
        try:
            client.set_up(self.env, [(a.name, a.url, a.skip_train) for a in agents], timeout=call)
        except (ServiceError, ValueError) as exc:
            client.close()
            return f"setting it up: {exc}"
        self.clients[index] = client
        return None

    def _close_workers(self, reset: bool = False) -> None:
        clients, self.clients = self.clients, [None] * len(self.clients)
        for client in clients:
            if client is None:
                continue
            if reset:
                try:
                    client.reset(timeout=self._call_timeout())
                except ServiceError as exc:
                    log.warning("resetting worker %s: %s", client.base_url, exc)
            client.close()

    def _call_timeout(self) -> float:
        return max((a.client.timeout for a in self.agents.values()), default=30.0)

    def _token(self) -> Optional[str]:
        return next((a.client.token for a in self.agents.values()), None)

    # ---- jobs ----------------------------------------------------------------------------
    def _run_jobs(self, config: GameEpisodeSettings) -> None:
        """Set-ups and jobs on the workers until the budget is spent (module doc): a round
        at a time (`_round`); the scheduler decides, this runs its tasks in threads and
        reports back. Every task is settled however the loop ends (`_settle`)."""
        spent = self._budget(config)
        tasks: Tasks = {}
        with futures.ThreadPoolExecutor(
            MAX_WORKERS,  # (threads start as tasks need them)
            thread_name_prefix="league-job",
        ) as pool:
            try:
                while not self._round(pool, tasks, spent):
                    pass
            except BaseException:
                self._settle(tasks, ending=True)
                raise
            self._settle(tasks, ending=False)

    def _budget(self, config: GameEpisodeSettings) -> Callable[[], bool]:
        """Whether this startEpisode's budget is spent: numSteps of the mode's steps
        (`_budget_steps`) since now, or its episodes."""
        steps_before = self._budget_steps()
        games_before = len(self.results)
        limit = config.episode_limit()

        def spent() -> bool:
            if config.num_steps is not None and (
                self._budget_steps() - steps_before >= config.num_steps
            ):
                return True
            return limit is not None and len(self.results) - games_before >= limit

        return spent

    def _round(
        self, pool: futures.ThreadPoolExecutor, tasks: Tasks, spent: Callable[[], bool]
    ) -> bool:
        """One turn of the job loop: workers that joined, then (budget left) set-ups and
        jobs started, then the end of a task waited for, or of a backoff when none runs.
        True once the budget is spent (or stopEpisode came) and every task ended."""
        with self._joining_lock:
            self._admit_joining()
        now = self.clock()
        stopping = self.should_stop or spent()
        if not stopping:
            self._launch(pool, tasks, now)
        if tasks:
            self._take_ended(tasks, now)
            return False
        if stopping:
            return True
        sched = self.scheduler
        reason = sched.exhausted()
        if reason is not None:
            raise RuntimeError(reason)
        wait = sched.next_retry(now)
        if wait is None:
            raise RuntimeError(
                "no job can start: every player's opponent is waiting for an agent no job will free"
            )
        self._pause(wait)
        return False

    def _launch(self, pool: futures.ThreadPoolExecutor, tasks: Tasks, now: float) -> None:
        """The set-ups due (bound workers: one per player at once), then a job for each
        idle worker while one can start."""
        sched, started = self.scheduler, len(tasks)
        index = sched.next_set_up(now)
        while index is not None:
            sched.begin_set_up(index)
            tasks[pool.submit(self._set_up_worker, index)] = (index, None)
            index = sched.next_set_up(now)
        for index in sched.idle():
            assignment = self.jobs.launch(index, now)
            if assignment is None:
                if sched.bound:  # (another worker's player may have one)
                    continue
                break
            tasks[pool.submit(self._play, assignment)] = (index, assignment)
        if len(tasks) > started:
            self._report()

    def _take_ended(self, tasks: Tasks, now: float) -> None:
        """Wait for a watched task to end (`_watched`), at most until the next backoff ends
        or `WAKE_S`, and take in every one that did."""
        wait = self.scheduler.next_retry(now)
        watched = self._watched(tasks)
        futures.wait(
            watched,
            timeout=min(WAKE_S, wait or WAKE_S),
            return_when=futures.FIRST_COMPLETED,
        )
        for future in [f for f in watched if f.done()]:
            index, assignment = tasks.pop(future)
            self._ended(index, assignment, future.result())

    def _settle(self, tasks: Tasks, ending: bool) -> None:
        """The loop is over (`ending`: on an error, which is the one reported): the games of
        the jobs still running are stopped and every task is taken in, so no agent or
        worker stays held by a job that is over."""
        for index, assignment in tasks.values():
            client = self.clients[index]
            if assignment is not None and client is not None:
                _quietly(client.stop_episode)
        errors = []
        for future, (index, assignment) in tasks.items():
            try:
                self._ended(index, assignment, future.result())
            except Exception as exc:  # noqa: BLE001 (re-raised below)
                errors.append(exc)
        if errors and not ending:
            raise errors[0]
        for error in errors:
            log.warning("settling a job after the run ended: %s", error)

    def _watched(self, tasks: Tasks) -> list[futures.Future[Any]]:
        """The tasks whose end the loop takes next: any (set-ups always); with
        ``deterministic``, of the jobs only the one launched first, so results are applied
        in launch order and the next launch follows each one."""
        if not self.settings.deterministic:
            return list(tasks)
        jobs = [(a.job_id, f) for f, (_, a) in tasks.items() if a is not None]
        first = [min(jobs, key=lambda pair: pair[0])[1]] if jobs else []
        return [f for f, (_, a) in tasks.items() if a is None] + first

    def _pause(self, seconds: float) -> None:
        """Wait for a worker's backoff, waking early on stopEpisode."""
        if self._lifecycle is not None:
            self.wait_for_cancel(seconds)
        else:  # (called outside a service: a test drives the hook itself)
            time.sleep(seconds)

    def _ended(self, index: int, assignment: Optional[Assignment], result: object) -> None:
        """A task ended: a job (`result` its thread's `_Outcome`) or a set-up (`result` its
        error, or None)."""
        if assignment is not None:
            self._finish(assignment, cast(_Outcome, result))
        else:
            self._set_up_ended(index, cast(Optional[str], result))

    def _set_up_ended(self, index: int, error: Optional[str]) -> None:
        if error is not None:
            self._worker_failed(index, error)
            return
        self.scheduler.set_up_done(index)
        worker = self.scheduler.workers[index]
        log.info(
            "worker %d %s set up%s",
            index,
            worker.url,
            f" again (after: {worker.last_error})" if worker.set_ups > 1 else "",
        )
        self._report()

    def _worker_failed(self, index: int, error: str) -> Failure:
        failure = self.scheduler.task_failed(index, error, self.clock())
        log.warning("%s", failure.describe())
        self._report()
        return failure

    def _play(self, assignment: Assignment) -> _Outcome:
        """One job on its worker (in a job thread: HTTP only, no league state touched): the
        mode's startEpisode; a job that fails stops its episode and brings its agents back
        (`_recover`)."""
        s = self.settings
        config = self.mode.episode_config(s, assignment)
        client = self._client(assignment.worker)
        try:
            if assignment.load is not None:
                self._load_weights(assignment.opponent_agent, assignment.load, self._call_timeout())
            played = client.play(config, timeout=s.job_timeout)
            return _Outcome(played.episodes, self.mode.steps(played, assignment.home))
        except WaitTimeout as exc:
            error = f"timed out after {s.job_timeout} s: {exc}"
        except (ServiceError, ValueError) as exc:  # (ValueError: an answer out of the spec)
            error = f"{type(exc).__name__}: {exc}"
        _quietly(client.stop_episode)  # a worker still playing lets go of the agents
        return self._recover(assignment, error)

    def _recover(self, assignment: Assignment, error: str) -> _Outcome:
        """A failed job's outcome: its agents brought back to ready (`_recover_agent`),
        or the error of the one that cannot be."""
        outcome = _Outcome(error=error)
        try:
            for name in sorted(assignment.agents):
                found = self._recover_agent(name)
                if found is not None:
                    outcome.recovered[name] = found
        except (RuntimeError, ServiceError) as exc:
            outcome.agent_error = str(exc)
        return outcome

    def _recover_agent(self, name: str) -> Optional[str]:
        """Bring an agent a failed job used back to ready: wait out a request of the job's
        it is still answering; end the episode the job left it in; register it again if it
        was reset. Returns the state it was found in (None: ready already); RuntimeError
        when it cannot be (unreachable, failed, restarted, without its model)."""
        agent, call = self.agents[name], self._call_timeout()
        where = f"agent {name!r} at {agent.url}"
        try:
            status = agent.client.status()
            if status.state in AGENT.busy_states:
                status = agent.client.wait_for_state(AGENT_SETTLED, timeout=call)
            if status.state == "ready":
                return None
            if status.state == "in_episode":
                try:
                    agent.client.episode_stopped()
                except Conflict:  # ended meanwhile (by a worker shutting down cleanly)
                    if agent.client.status().state != "ready":
                        raise
            elif status.state == "initialized":  # (reset with its model: told its spaces)
                agent.client.agent_registered(
                    {"name": name, "train": not agent.skip_train, **self.agent_config(name)}
                )
            else:
                reason = f" ({status.reason})" if status.reason else ""
                raise RuntimeError(
                    f"{where} is '{status.state}'{reason} after a failed "
                    "job: the league cannot go on without it"
                )
        except ServiceError as exc:
            raise RuntimeError(
                f"{where} cannot be brought back to ready after a failed job: {exc}"
            ) from exc
        log.info("%s was '%s' after a failed job: back to ready", where, status.state)
        return status.state

    def _finish(self, assignment: Assignment, outcome: _Outcome) -> None:
        """A job ended: the league learns its episodes, as the mode counts them, or its
        failure (`_failed`); the player is snapshotted if due, its weights and the league
        are saved."""
        if outcome.error is not None:
            self._failed(assignment, outcome.error, outcome)
            return
        player = assignment.home
        try:
            results, returns = self.mode.record(self, assignment, outcome.games, outcome.steps)
            self.jobs.finish(assignment, results, outcome.steps, returns)
            self._snapshot_if_due(player)
            self._save_weights(
                player, self.jobs.manager.active[player].checkpoint_path, self._call_timeout()
            )
            self._save()
        finally:
            self._report()

    def _failed(self, assignment: Assignment, error: str, outcome: _Outcome) -> None:
        """A job failed (`error`): the league records the failure, its worker counts it;
        an agent that could not be brought back ends the run."""
        failure = self.jobs.fail(assignment, error, self.clock(), outcome.recovered)
        log.warning("league job %d failed on %s", assignment.job_id, failure.describe())
        self._save()
        self._report()
        if outcome.agent_error is not None:
            raise RuntimeError(outcome.agent_error)

    def _snapshot_if_due(self, player_id: str) -> None:
        manager = self.jobs.manager
        if not manager.snapshot_due(player_id):
            return
        call = self._call_timeout()
        path = self._path(f"snapshots/{manager.next_snapshot_id(player_id)}.pt")
        self._save_weights(player_id, path, call)
        snapshot, reset = manager.take_snapshot(player_id, path)
        log.info(
            "snapshot %s of %s%s",
            snapshot.player_id,
            player_id,
            "; reset to its initial weights" if reset else "",
        )
        if reset:  # a fresh learner: initial weights, no optimizer state, empty buffer
            self._load_weights(player_id, manager.active[player_id].initial_checkpoint, call)

    # ---- calls of the league's own -------------------------------------------------------
    def _forward(self, config: GameEpisodeSettings) -> None:
        """A plain game call (a lineup, an enumeration) on a set-up worker; a worker that
        fails it counts the failure (module doc) and the call goes to the next."""
        agents = _called(config)
        while True:
            index = self._worker_for_call()
            if index is None:
                return  # (stopEpisode)
            client = self._client(index)
            self.scheduler.begin_task(index)
            try:
                results = client.play(config, timeout=self.settings.job_timeout).results
            except BadRequest as exc:  # (the call is wrong, not the worker)
                self.scheduler.release(index)
                raise RuntimeError(f"worker {client.base_url} refused the call: {exc}") from exc
            except (ServiceError, ValueError) as exc:
                _quietly(client.stop_episode)
                for name in sorted(agents):
                    self._recover_agent(name)  # (RuntimeError: the run ends, naming it)
                self._worker_failed(index, f"{type(exc).__name__}: {exc}")
                continue
            self.scheduler.task_done(index)
            break
        for game in results.episodes:
            extra = {
                k: v
                for k, v in game.model_dump(by_alias=True, exclude_unset=True).items()
                if k not in ("episode", "agent", "return", "length", "envSteps")
            }
            self.record_episode(game.agent, game.return_, game.length, **extra)
        if config.exhaustive is not None and results.evaluations:
            self.evaluations.append(results.evaluations[-1])

    def _worker_for_call(self) -> Optional[int]:
        """A set-up worker with no task (no job runs now): an idle one, else the next one
        due set up now, waiting out backoffs; RuntimeError once none is left, None on
        stopEpisode."""
        sched = self.scheduler
        while not self.should_stop:
            with self._joining_lock:
                self._admit_joining()
            reason = sched.exhausted()
            if reason is not None:
                raise RuntimeError(reason)
            idle = sched.idle()
            if idle:
                return idle[0]
            now = self.clock()
            index = sched.next_set_up(now)
            if index is None:
                wait = sched.next_retry(now)
                if wait is None:  # (every live worker busy: not while no job runs)
                    raise RuntimeError(f"no worker can take the call: {sched.view(now)}")
                self._pause(wait)
                continue
            sched.begin_set_up(index)
            self._set_up_ended(index, self._set_up_worker(index))
        return None

    # ---- state ---------------------------------------------------------------------------
    def _budget_steps(self) -> int:
        """What a startEpisode's numSteps counts: the steps of the players the mode counts
        (the main players' moves; a solo league: every player's env steps)."""
        players = self.jobs.manager.active.values()
        return sum(p.total_agent_step for p in players if self.mode.counts(p))

    def _save(self) -> None:
        self.jobs.manager.save(self.resolve_path(self._path(STATE)))

    def metrics(self) -> list[Metric]:
        """The base's, and the league's jobs, its workers by health state and each player's
        ratings (Elo, TrueSkill's exposure)."""
        samples = super().metrics()
        m = self.manager
        if m is None:
            return samples
        jobs = (
            ("launched", m.jobs_launched, "Jobs launched"),
            ("finished", m.jobs_finished, "Jobs finished"),
            ("failed", m.jobs_failed, "Jobs that failed (their worker's error is logged)"),
        )
        samples += [
            Metric(f"league_jobs_{what}_total", "counter", text, count)
            for what, count, text in jobs
        ]
        samples += [
            Metric("league_jobs_running", "gauge", "Jobs running now", len(m.running)),
            Metric(
                "league_snapshots", "gauge", "Historical players (snapshots)", len(m.historical)
            ),
        ]
        states: dict[str, int] = {}
        for worker in self.scheduler.workers:
            states[worker.state] = states.get(worker.state, 0) + 1
        samples += [
            Metric(
                "league_workers",
                "gauge",
                "Workers (agent services playing jobs) by health state",
                count,
                (("state", state),),
            )
            for state, count in sorted(states.items())
        ]
        for row in rated_players(m):
            labels = (("player", str(row["id"])),)
            samples.append(Metric("league_rating_elo", "gauge", "Elo rating", row["elo"], labels))
            samples.append(
                Metric(
                    "league_rating_exposure",
                    "gauge",
                    "TrueSkill exposure (mu - 3 sigma)",
                    row["exposure"],
                    labels,
                )
            )
        return samples

    def _report(self) -> None:
        m = self.manager
        if m is None:  # (a worker set up for an evaluation before the league began)
            return
        self.update_status(
            {
                "agentSteps": {pid: p.total_agent_step for pid, p in m.active.items()},
                "envSteps": self.env_steps,
                "episodesDone": len(self.results),
                "league": {
                    "jobs": m.jobs_launched,
                    "finished": m.jobs_finished,
                    "failed": m.jobs_failed,
                    "running": len(m.running),
                    "snapshots": len(m.historical),
                    "workers": len(self.scheduler.live()),
                },
            }
        )


def _game_call(config: EpisodeSettings) -> GameEpisodeSettings:
    """startEpisode's settings, as the service parsed them (`episode_settings`)."""
    if not isinstance(config, GameEpisodeSettings):
        raise TypeError(f"a league's startEpisode takes GameEpisodeSettings, not {config!r}")
    return config


def _called(config: GameEpisodeSettings) -> set[str]:
    """The agents a lineup or an enumeration calls on."""
    if config.lineup:
        return set(config.lineup.values())
    return {config.exhaustive.agent} if config.exhaustive is not None else set()


def _quietly(call: Any) -> None:
    """A best-effort call to a worker that may be gone."""
    try:
        call()
    except ServiceError:
        pass
