"""The league orchestrator's scheduler: which job runs next, with which agents, on which
worker, and which workers are fit to run one. Pure code: no threads, no I/O and no clock
of its own (every call that depends on time takes `now`, seconds on any monotonic clock),
so a test drives it call by call. The league orchestrator does the HTTP and reports back
(a job's end or failure through `mistk_rl.league.jobs.LeagueJobs`, which tells the manager
too).

Jobs and agents

- An agent is in one job at a time (`busy`). A new job is for the next player in turn
  (round robin) whose agent is free; `LeagueManager.launch_job` picks its opponent: the
  player itself (self-play), another active player's agent, a fixed opponent's own agent,
  or a snapshot, which a pool agent plays: one holding that checkpoint, else the free one
  used longest ago, which loads it first (`Assignment.load`).
- A job whose agents are busy waits (`pending`), keeping its league slot, and reserves the
  agents it needs, so later jobs cannot keep taking them (an exploiter waiting for the
  main player's agent would otherwise starve); waiting jobs start first, oldest first.

Workers

- A worker runs one task at a time: its set-up (the orchestrator resets it, initializes it
  and registers the agents), a job, or a call of the league's own (an evaluation). A worker
  starts out needing its set-up (`NEW`).
- A set-up registers every agent with the worker, which an agent in a job refuses: it runs
  alone, once no agent is in a job, one worker at a time. While one is due no new job
  starts, so the running jobs end and free the agents (a failing worker costs the league a
  pause of at most one job per retry).
- Idle workers get jobs least recently used first, so the jobs spread over all of them.
- A task that fails counts against its worker. After `Backoff.max_failures` failures in a
  row the worker is `DROPPED`; before that it waits `Backoff.delay(n)` seconds after its
  n-th failure in a row (``first_s * 2 ** (n - 1)``, at most ``max_s``) and is set up
  again before its next job. Only a finished job (or call) ends a run of failures: a
  worker that sets up but fails every job is dropped all the same.
- With every worker dropped, `exhausted` names each one's last error: the caller ends the
  run with it (nothing is left to retry on).
- A worker may join at any time (`add_worker`: more capacity, or a service started again
  on another node in place of a lost one). It is `NEW`, so it is set up before its first
  job. The worker it `replaces` is retired: dropped at once when it runs no task, else when
  its task ends (a job on a lost node fails, and is dropped as any failed job is).

Bound workers (a solo league: players that train alone on gym orchestrators, which take
exactly one agent)

- With ``bind=True`` worker i is bound to player ``i % len(players)`` for good (so each
  player needs a worker: workers >= players): its set-up registers that player's agent
  only, and it runs that player's jobs only. A player's jobs run one at a time (its agent
  is in one episode at a time); a player with several workers has spares, which take over
  while one backs off.
- The set-up rule holds per player: a worker's set-up waits until its player's agent is in
  no job and no other worker of that player is being set up, and while one is due, that
  player's new jobs wait (the other players' go on).
- A player whose workers are all dropped cannot train: `exhausted` names the player and
  its workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from mistk_rl.league.manager import LeagueManager, RunningJob

NEW, SETTING_UP, IDLE, BUSY, BACKOFF, DROPPED = (
    "new",
    "setting_up",
    "idle",
    "busy",
    "backoff",
    "dropped",
)
ERROR_CHARS = 300  # an error kept (and shown) per worker: enough to name the cause


@dataclass(frozen=True)
class Backoff:
    """How a failing worker is retried: the wait after its n-th failure in a row, and the
    failures in a row that drop it."""

    max_failures: int = 5
    first_s: float = 1.0
    max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.first_s < 0 or self.max_s < self.first_s:
            raise ValueError(f"invalid backoff {self}: max_failures >= 1, 0 <= first_s <= max_s")

    def delay(self, failures: int) -> float:
        return min(self.first_s * 2.0 ** max(failures - 1, 0), self.max_s)


@dataclass
class WorkerHealth:
    """One worker as the scheduler sees it."""

    index: int
    url: str
    state: str = NEW
    failures: int = 0  # in a row
    failed: int = 0  # in all
    jobs: int = 0  # finished jobs and calls
    set_ups: int = 0  # set-ups that succeeded
    retry_at: Optional[float] = None  # (BACKOFF) when it is set up again
    last_error: Optional[str] = None
    last_task: int = -1  # when it was last given a task (a counter): least recent first
    job_id: Optional[int] = None  # the job it runs
    player: Optional[str] = None  # bound workers: the one player whose jobs it runs
    replaced_by: Optional[int] = None  # retired: the worker that took its place

    @property
    def live(self) -> bool:
        return self.state != DROPPED

    def view(self, now: Optional[float] = None) -> dict[str, Any]:
        """GET /league's row for the worker."""
        retry = (
            None
            if self.retry_at is None or now is None
            else round(max(self.retry_at - now, 0.0), 3)
        )
        return {
            "url": self.url,
            "state": self.state,
            "failures": self.failures,
            "failed": self.failed,
            "jobs": self.jobs,
            "setUps": self.set_ups,
            "job": self.job_id,
            "retryInS": retry,
            "lastError": self.last_error,
            "player": self.player,
            "replacedBy": self.replaced_by,
        }


@dataclass
class Failure:
    """What a failed task did to its worker: `delay` seconds until it is set up again, or
    None: it is dropped."""

    worker: WorkerHealth
    delay: Optional[float]

    @property
    def dropped(self) -> bool:
        return self.delay is None

    def describe(self) -> str:
        """One line (the error cut short): for a log."""
        w = self.worker
        if w.replaced_by is not None and self.dropped:
            then = f"dropped (replaced by worker {w.replaced_by})"
        elif self.dropped:
            then = f"dropped after {w.failures} failures in a row"
        else:
            then = f"failure {w.failures} in a row; set up again in {self.delay:g} s"
        return f"worker {w.index} {w.url}: {then}: {w.last_error}"


@dataclass
class Assignment:
    """A job with the agents it holds: its player's, the opponent's (the same in
    self-play) and, for a snapshot, the checkpoint the pool agent loads first; and the
    worker that runs it."""

    running: RunningJob
    opponent_agent: str
    load: Optional[str] = None
    worker: Optional[int] = None

    @property
    def job_id(self) -> int:
        return self.running.job_id

    @property
    def home(self) -> str:
        return self.running.job.launch_player

    @property
    def agents(self) -> set[str]:
        return {self.home, self.opponent_agent}


class Scheduler:
    """Job slots per worker, agent reservations, the next player, worker health (module
    doc). `players`: the active players' ids in turn order; `workers`: the workers' URLs;
    `bind`: each worker bound to one player (solo players, module doc)."""

    def __init__(
        self,
        players: Iterable[str],
        workers: Iterable[str],
        backoff: Backoff = Backoff(),
        bind: bool = False,
    ) -> None:
        self.players = list(players)
        self.workers = [WorkerHealth(i, url) for i, url in enumerate(workers)]
        if not self.workers:
            raise ValueError("a scheduler needs at least one worker")
        self.bound = bind
        if bind:
            if len(self.workers) < len(self.players):
                raise ValueError(
                    f"{len(self.workers)} workers for {len(self.players)} "
                    "players: bound workers need one per player at least"
                )
            for worker in self.workers:
                worker.player = self.players[worker.index % len(self.players)]
        self.backoff = backoff
        self.pool: dict[str, Optional[str]] = {}  # frozen agent -> the checkpoint it holds
        self.last_use: dict[str, int] = {}  # pool agent -> the last job it was in
        self.pending: dict[str, RunningJob] = {}  # player -> its job waiting for agents
        self.busy: set[str] = set()  # agents in a job
        self.next_player = 0
        self._tasks = 0

    # ---- the pool ------------------------------------------------------------------------
    def add_pool_agent(self, name: str) -> None:
        """A frozen agent that plays snapshots (it holds none yet)."""
        self.pool[name] = None

    # ---- workers -------------------------------------------------------------------------
    def add_worker(self, url: str, replaces: Optional[int] = None) -> WorkerHealth:
        """A worker joins (module doc): set up before its first job. `replaces`: the worker
        it stands in for, retired; bound workers: whose player it takes (else it is bound
        as worker i of the start would be)."""
        if replaces is not None and not self.workers[replaces].live:
            raise ValueError(f"worker {replaces} is dropped already: nothing to replace")
        worker = WorkerHealth(len(self.workers), url)
        if self.bound:
            worker.player = (
                self.workers[replaces].player
                if replaces is not None
                else self.players[worker.index % len(self.players)]
            )
        self.workers.append(worker)
        if replaces is not None:
            retired = self.workers[replaces]
            retired.replaced_by = worker.index
            if retired.state not in (SETTING_UP, BUSY):  # (else once its task ends)
                retired.state, retired.retry_at = DROPPED, None
        return worker

    def due(self, now: float) -> list[int]:
        """Workers due a set-up: new ones, and failed ones whose wait is over."""
        return [
            w.index
            for w in self.workers
            if w.state == NEW
            or (w.state == BACKOFF and w.retry_at is not None and w.retry_at <= now)
        ]

    def next_set_up(self, now: float) -> Optional[int]:
        """The worker to set up now, if one is due and a set-up can run: none running, and
        no agent in a job (module doc; bound workers: none of its player's running, and its
        player's agent in no job). The caller then calls `begin_set_up`."""
        if not self.bound:
            if self.busy or any(w.state == SETTING_UP for w in self.workers):
                return None
            due = self.due(now)
            return due[0] if due else None
        for index in self.due(now):
            player = self.workers[index].player
            if player not in self.busy and not any(
                w.state == SETTING_UP and w.player == player for w in self.workers
            ):
                return index
        return None

    def holding_jobs(self, now: float, player: Optional[str] = None) -> bool:
        """Whether new jobs wait: a set-up is due or running (bound workers: one of
        `player`'s)."""
        mine = [w for w in self.workers if player is None or w.player == player]
        due = set(self.due(now))
        return any(w.index in due or w.state == SETTING_UP for w in mine)

    def idle(self) -> list[int]:
        """Set-up workers with no task, least recently given one first."""
        return [w.index for w in sorted(self.workers, key=lambda w: w.last_task) if w.state == IDLE]

    def begin_set_up(self, index: int) -> None:
        worker = self.workers[index]
        if worker.state not in (NEW, BACKOFF):
            raise ValueError(f"worker {index} is {worker.state}: no set-up due")
        if self.bound and worker.player in self.busy:
            raise ValueError(
                f"agent {worker.player!r} is in a job: the set-up of its "
                f"worker {index} registers it"
            )
        if not self.bound and self.busy:
            raise ValueError(
                f"agents {sorted(self.busy)} are in jobs: a set-up registers every agent"
            )
        worker.state, worker.retry_at = SETTING_UP, None

    def set_up_done(self, index: int) -> None:
        worker = self._expect(index, SETTING_UP)
        worker.state = IDLE
        worker.set_ups += 1
        self._retire_if_replaced(worker)

    def begin_task(self, index: int, job_id: Optional[int] = None) -> None:
        """An idle worker takes a job (`job_id`) or a call of the league's own."""
        worker = self._expect(index, IDLE)
        worker.state, worker.job_id = BUSY, job_id
        worker.last_task, self._tasks = self._tasks, self._tasks + 1

    def task_done(self, index: int) -> None:
        """Its job or call finished: idle, and its run of failures is over."""
        worker = self._expect(index, BUSY)
        worker.state, worker.job_id = IDLE, None
        worker.failures = 0
        worker.jobs += 1
        self._retire_if_replaced(worker)

    def release(self, index: int) -> None:
        """Its call was refused as wrong (the caller's fault, not the worker's): idle, its
        counts as they were."""
        worker = self._expect(index, BUSY)
        worker.state, worker.job_id = IDLE, None
        self._retire_if_replaced(worker)

    def task_failed(self, index: int, error: str, now: float) -> Failure:
        """Its set-up, job or call failed: it waits and is set up again, or is dropped."""
        worker = self.workers[index]
        if worker.state not in (SETTING_UP, BUSY):
            raise ValueError(f"worker {index} is {worker.state}: it runs no task")
        worker.failures += 1
        worker.failed += 1
        worker.job_id = None
        worker.last_error = one_line(error)
        if worker.failures >= self.backoff.max_failures or worker.replaced_by is not None:
            worker.state, worker.retry_at = DROPPED, None
            return Failure(worker, None)
        delay = self.backoff.delay(worker.failures)
        worker.state, worker.retry_at = BACKOFF, now + delay
        return Failure(worker, delay)

    @staticmethod
    def _retire_if_replaced(worker: WorkerHealth) -> None:
        if worker.replaced_by is not None:
            worker.state, worker.retry_at = DROPPED, None

    def next_retry(self, now: float) -> Optional[float]:
        """Seconds until the next waiting worker is due its set-up (None: none waits)."""
        times = [w.retry_at for w in self.workers if w.state == BACKOFF and w.retry_at is not None]
        return max(min(times) - now, 0.0) if times else None

    def live(self) -> list[int]:
        return [w.index for w in self.workers if w.live]

    def exhausted(self) -> Optional[str]:
        """None while a worker is left (bound workers: one for every player); else why the
        run must end, naming every worker (of the player left without one)."""
        if self.bound:
            for player in self.players:
                mine = [w for w in self.workers if w.player == player]
                if not any(w.live for w in mine):
                    return f"player {player!r} has no healthy worker left: " + _failures(mine)
            return None
        if any(w.live for w in self.workers):
            return None
        return "no healthy worker left: " + _failures(self.workers)

    def view(self, now: Optional[float] = None) -> list[dict[str, Any]]:
        return [w.view(now) for w in self.workers]

    def _expect(self, index: int, state: str) -> WorkerHealth:
        worker = self.workers[index]
        if worker.state != state:
            raise ValueError(f"worker {index} is {worker.state}, not {state}")
        return worker

    # ---- jobs ----------------------------------------------------------------------------
    def next_job(self, league: LeagueManager, worker: int, now: float) -> Optional[Assignment]:
        """A job that can start now on the idle `worker`, its agents and the worker taken:
        first the jobs waiting for agents, oldest first, then a new job for the next player
        in turn (module doc). None when no job can start, or new jobs wait for a set-up."""
        self._expect(worker, IDLE)
        if self.bound:
            return self._bound_job(league, worker, now)
        if self.holding_jobs(now):
            return None
        assignment = self._next_assignment(league)
        if assignment is not None:
            assignment.worker = worker
            self.busy |= assignment.agents
            self.begin_task(worker, assignment.job_id)
        return assignment

    def _bound_job(self, league: LeagueManager, worker: int, now: float) -> Optional[Assignment]:
        """The next job of the worker's player, if its agent is free and none of its
        workers is due a set-up."""
        player = self.workers[worker].player
        assert player is not None  # (a bound worker's)
        if player in self.busy or self.holding_jobs(now, player):
            return None
        running = league.launch_job(player)
        if running is None:
            return None
        if running.job.opponent:
            league.fail_job(running.job_id, "a bound worker runs solo jobs only")
            raise ValueError(
                f"player {player!r} got a job against {running.job.opponent!r}:"
                " bound workers run solo jobs (players that train alone) only"
            )
        assignment = Assignment(running, player, worker=worker)
        self.busy.add(player)
        self.begin_task(worker, assignment.job_id)
        return assignment

    def job_done(self, assignment: Assignment) -> None:
        """The job finished: its agents and worker are free; a loaded snapshot is held."""
        if assignment.load is not None:
            self.pool[assignment.opponent_agent] = assignment.load
        self._release(assignment)
        if assignment.worker is not None:
            self.task_done(assignment.worker)

    def job_failed(self, assignment: Assignment, error: str, now: float) -> Optional[Failure]:
        """The job failed: its agents are free (the caller brought them back to ready), a
        snapshot it was loading is held by nobody, and its worker counts the failure."""
        if assignment.load is not None:
            self.pool[assignment.opponent_agent] = None  # (the load may not have happened)
        self._release(assignment)
        if assignment.worker is None:
            return None
        return self.task_failed(assignment.worker, error, now)

    def _release(self, assignment: Assignment) -> None:
        self.busy -= assignment.agents
        if assignment.opponent_agent in self.pool:
            self.last_use[assignment.opponent_agent] = assignment.job_id

    def _next_assignment(self, league: LeagueManager) -> Optional[Assignment]:
        reserved: set[str] = set()
        for pid, running in sorted(self.pending.items(), key=lambda kv: kv[1].job_id):
            assignment = self._assign(league, running, reserved)
            if assignment is not None:
                del self.pending[pid]
                return assignment
            reserved |= self._needs(league, running)
        ids = self.players
        for k in range(len(ids)):
            pid = ids[(self.next_player + k) % len(ids)]
            if pid in self.pending or pid in self.busy or pid in reserved:
                continue
            launched = league.launch_job(pid)
            if launched is None:
                continue
            assignment = self._assign(league, launched, reserved)
            if assignment is None:
                self.pending[pid] = launched
                reserved |= self._needs(league, launched)
                continue
            self.next_player = (self.next_player + k + 1) % len(ids)
            return assignment
        return None

    @staticmethod
    def _needs(league: LeagueManager, running: RunningJob) -> set[str]:
        """The agents a job needs by name (a snapshot takes whichever pool agent is free)."""
        job = running.job
        return {job.launch_player} | ({job.opponent} if _own_agent(league, job.opponent) else set())

    def _assign(
        self, league: LeagueManager, running: RunningJob, reserved: set[str]
    ) -> Optional[Assignment]:
        """The agents for this job, if they are free and not reserved: the opponent's own
        agent, or a pool agent holding the snapshot (else the free one used longest ago,
        to load it)."""
        home, opponent = running.job.launch_player, running.job.opponent
        taken = self.busy | reserved
        if home in taken:
            return None
        if opponent == home or _own_agent(league, opponent):
            return None if opponent in taken else Assignment(running, opponent)
        checkpoint = league.historical[opponent].checkpoint_path
        free = [name for name in self.pool if name not in taken]
        holding = [name for name in free if self.pool[name] == checkpoint]
        if holding:
            return Assignment(running, holding[0])
        if not free:
            return None
        name = min(free, key=lambda n: self.last_use.get(n, -1))
        return Assignment(running, name, load=checkpoint)


def _own_agent(league: LeagueManager, player: str) -> bool:
    """Whether an opponent plays with its own agent: an active player, or a fixed opponent
    (no snapshot for a pool agent to load)."""
    return player in league.active or (
        player in league.historical and league.historical[player].fixed
    )


def _failures(workers: Iterable[WorkerHealth]) -> str:
    return "; ".join(
        f"worker {w.index} {w.url} failed {w.failures} times in a row: {w.last_error}"
        for w in workers
    )


def one_line(error: str, limit: int = ERROR_CHARS) -> str:
    """An error on one line, cut to `limit` characters (for logs, job records, status)."""
    line = " ".join(str(error).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
