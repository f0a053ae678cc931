"""The league's scheduler, pure: worker set-ups, backoff and drops on a clock the test
holds; job slots per worker; agent reservations; the next player; the pool's snapshots."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mistk_rl.league import scheduler as scheduler_module
from mistk_rl.league.manager import LeagueManager
from mistk_rl.league.scheduler import (
    BACKOFF,
    BUSY,
    DROPPED,
    IDLE,
    NEW,
    SETTING_UP,
    Backoff,
    Scheduler,
)

PLAYERS = [
    {"type": "main", "id": "main", "checkpoint": "main.pt"},
    {"type": "main_exploiter", "id": "me", "checkpoint": "me.pt"},
    {"type": "league_exploiter", "id": "le", "checkpoint": "le.pt"},
]
URLS = ["http://w0", "http://w1"]


def _league(players=PLAYERS) -> LeagueManager:
    return LeagueManager.create(players, one_phase_step=10**6, seed=0)


def _scheduler(
    players=("main", "me", "le"),
    urls=URLS,
    pool=("frozen_0",),
    backoff=Backoff(max_failures=3, first_s=1.0, max_s=3.0),
) -> Scheduler:
    sched = Scheduler(players, urls, backoff)
    for name in pool:
        sched.add_pool_agent(name)
    return sched


def _set_up_all(sched: Scheduler, now: float = 0.0) -> None:
    while (index := sched.next_set_up(now)) is not None:
        sched.begin_set_up(index)
        sched.set_up_done(index)


def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(max_failures=5, first_s=0.5, max_s=3.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        Backoff(max_failures=0)
    with pytest.raises(ValueError):
        Backoff(first_s=2.0, max_s=1.0)


def test_workers_are_set_up_one_at_a_time_before_their_first_job():
    sched, league = _scheduler(), _league()
    assert [w.state for w in sched.workers] == [NEW, NEW]
    assert sched.idle() == [] and sched.holding_jobs(0.0)
    first = sched.next_set_up(0.0)
    sched.begin_set_up(first)
    assert sched.workers[first].state == SETTING_UP
    assert sched.next_set_up(0.0) is None  # one set-up at a time
    sched.set_up_done(first)
    assert sched.idle() == [first]
    assert sched.next_job(league, first, 0.0) is None  # the other is due: jobs wait
    _set_up_all(sched)
    assert sched.idle() == [0, 1] and not sched.holding_jobs(0.0)
    assert [w.set_ups for w in sched.workers] == [1, 1]


def test_a_failing_worker_backs_off_doubling_and_is_dropped_after_failures_in_a_row():
    sched, league = _scheduler(), _league()
    _set_up_all(sched)
    job = sched.next_job(league, 0, now=0.0)
    failure = sched.job_failed(job, "GET http://w0/status: cannot connect", now=10.0)
    assert failure.delay == 1.0 and not failure.dropped
    assert "worker 0 http://w0: failure 1 in a row; set up again in 1 s" in failure.describe()
    w0 = sched.workers[0]
    assert (w0.state, w0.retry_at, w0.failures) == (BACKOFF, 11.0, 1)
    assert not sched.busy  # the job's agents are free again
    assert sched.due(10.5) == [] and sched.next_retry(10.5) == 0.5
    assert sched.next_set_up(10.5) is None  # not yet
    assert sched.next_set_up(11.0) == 0
    sched.begin_set_up(0)
    failure = sched.task_failed(0, "setting it up: cannot connect", now=11.0)
    assert failure.delay == 2.0 and sched.workers[0].retry_at == 13.0
    sched.begin_set_up(sched.next_set_up(13.0))
    failure = sched.task_failed(0, "setting it up: cannot connect", now=13.0)
    assert failure.dropped and w0.state == DROPPED and w0.failed == 3
    assert "dropped after 3 failures in a row" in failure.describe()
    assert sched.next_retry(100.0) is None and sched.due(100.0) == []
    assert sched.live() == [1] and sched.exhausted() is None


def test_a_finished_job_ends_a_run_of_failures_and_a_set_up_alone_does_not():
    sched, league = _scheduler(), _league()
    _set_up_all(sched)
    for now in (0.0, 10.0):  # a worker that sets up but fails every job
        job = sched.next_job(league, 0, now)
        assert job is not None and job.worker == 0
        sched.job_failed(job, "ServiceFailed: the worker failed", now)
        sched.begin_set_up(sched.next_set_up(now + 5))
        sched.set_up_done(0)
    assert sched.workers[0].failures == 2
    job = sched.next_job(league, 0, 20.0)
    sched.job_done(job)
    w0 = sched.workers[0]
    assert (w0.state, w0.failures, w0.failed, w0.jobs, w0.set_ups) == (IDLE, 0, 2, 1, 3)


def test_with_every_worker_dropped_the_reason_names_each_and_its_last_error():
    sched = _scheduler(backoff=Backoff(max_failures=1))
    for index in (0, 1):
        sched.begin_set_up(sched.next_set_up(0.0))
        sched.task_failed(index, f"setting it up: worker {index} is gone\n  (trace)", 0.0)
    reason = sched.exhausted()
    assert reason == (
        "no healthy worker left: worker 0 http://w0 failed 1 times in a row: "
        "setting it up: worker 0 is gone (trace); worker 1 http://w1 failed "
        "1 times in a row: setting it up: worker 1 is gone (trace)"
    )
    long = "x" * 10_000
    sched = _scheduler(urls=URLS[:1], backoff=Backoff(max_failures=1))
    sched.begin_set_up(0)
    sched.task_failed(0, long, 0.0)
    assert len(sched.exhausted()) < 400  # an error is kept short


def test_a_due_set_up_holds_new_jobs_until_the_agents_are_free():
    sched, league = _scheduler(), _league()
    _set_up_all(sched)
    running = sched.next_job(league, 0, 0.0)
    failed = sched.next_job(league, 1, 0.0)
    assert running and failed and not running.agents & failed.agents
    sched.job_failed(failed, "restarted", now=0.0)
    assert sched.next_set_up(1.0) is None  # due, but agents are in a job
    assert sched.holding_jobs(1.0)
    sched.job_done(running)
    assert sched.workers[0].state == IDLE
    assert sched.next_job(league, 0, 1.0) is None  # held back for the set-up
    assert sched.next_set_up(1.0) == 1
    sched.begin_set_up(1)
    with pytest.raises(ValueError, match="set-up due"):
        sched.begin_set_up(1)
    sched.set_up_done(1)
    assert sched.next_job(league, 0, 1.0) is not None


def test_idle_workers_take_jobs_in_turn():
    sched, league = _scheduler(players=("main",), urls=URLS + ["http://w2"]), _league(PLAYERS[:1])
    _set_up_all(sched)
    used = []
    for now in range(6):
        index = sched.idle()[0]
        job = sched.next_job(league, index, float(now))
        assert sched.workers[index].state == BUSY and sched.workers[index].job_id == job.job_id
        used.append(index)
        sched.job_done(job)
        league.finish_job(job.job_id, ["win"])
    assert used == [0, 1, 2, 0, 1, 2]
    assert [w.jobs for w in sched.workers] == [2, 2, 2]


def test_a_job_waiting_for_an_agent_gets_it_before_new_jobs():
    sched, league = _scheduler(urls=URLS + ["http://w2"]), _league()
    _set_up_all(sched)
    sched.busy.add("main")  # main is in a job (elsewhere)
    sched.next_player = 1
    job = sched.next_job(league, 0, 0.0)  # the exploiter must wait for main; le goes
    assert job.home == "le"
    assert sched.pending["me"].job.opponent == "main"
    sched.busy.discard("main")  # main's job ended: the waiting job comes first
    job = sched.next_job(league, 1, 0.0)
    assert (job.home, job.opponent_agent) == ("me", "main")
    assert not sched.pending and sched.busy >= {"me", "main", "le"}
    assert sched.next_job(league, 2, 0.0) is None  # every player's agent is taken
    assert sched.workers[2].state == IDLE  # (and the worker stays free)


def test_pool_agents_load_a_snapshot_once_keep_it_and_forget_a_failed_load():
    sched, league = (
        _scheduler(players=("main",), urls=URLS[:1], pool=("frozen_0", "frozen_1")),
        _league(PLAYERS[:1]),
    )
    _set_up_all(sched)
    (seed,) = league.historical
    jobs = []
    while len(jobs) < 3:
        running = league.launch_job("main")
        running.job.opponent, running.job.branch = seed, "pfsp"
        league.running[running.job_id] = running
        assignment = sched._assign(league, running, set())
        jobs.append(assignment)
        sched.busy |= assignment.agents
        if len(jobs) == 1:  # the first load fails: nobody holds the snapshot
            assignment.worker = None
            sched.job_failed(assignment, "buildModel failed", 0.0)
        else:
            sched.job_done(assignment)
    first, second, third = jobs
    assert first.load == "main.pt" and second.load == "main.pt"  # loaded again
    assert second.opponent_agent == "frozen_1"  # the pool agent used longest ago
    assert third.load is None and third.opponent_agent == "frozen_1"  # held: no load
    assert sched.pool == {"frozen_0": None, "frozen_1": "main.pt"}


def test_a_fixed_opponent_is_its_own_agent_reserved_as_a_player_is():
    sched = _scheduler(players=("main", "le"), urls=URLS[:1])
    league = LeagueManager.create(
        [PLAYERS[0], PLAYERS[2]], one_phase_step=10**6, seed=0, fixed=["winblock"]
    )
    running = league.launch_job("main")
    running.job.opponent = "winblock"
    assignment = sched._assign(league, running, set())
    assert assignment.opponent_agent == "winblock" and assignment.load is None
    assert sched._needs(league, running) == {"main", "winblock"}
    sched.busy |= assignment.agents  # the league exploiter's job against it must wait
    other = league.launch_job("le")
    other.job.opponent = "winblock"
    assert sched._assign(league, other, set()) is None
    sched.job_done(assignment)
    assert sched._assign(league, other, set()).opponent_agent == "winblock"
    assert sched.pool == {"frozen_0": None}


def test_the_league_package_is_pure():
    """mistk_rl/league imports the standard library, numpy, trueskill (ratings' maths) and
    its own modules, plus mistk_rl.errors/files/registry (the player types' registry): no
    HTTP, no services, no clock in the scheduler."""
    allowed = {"numpy", "trueskill", "mistk_rl.errors", "mistk_rl.files", "mistk_rl.registry"}
    package = Path(scheduler_module.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                ok = (
                    name in allowed
                    or top in allowed
                    or name.startswith("mistk_rl.league")
                    or (top != "mistk_rl" and _stdlib(top))
                )
                assert ok, f"{path.name} imports {name}"
    source = Path(scheduler_module.__file__).read_text()
    for forbidden in ("import threading", "import time", "requests", "client"):
        assert forbidden not in source.split('"""', 2)[2], forbidden


def _stdlib(name: str) -> bool:
    import sys

    return name in sys.stdlib_module_names or name == "__future__"


SOLO = [{"type": "solo", "id": p, "checkpoint": f"{p}.pt"} for p in ("a", "b")]


def test_bound_workers_run_their_players_jobs_one_at_a_time():
    league = _league(SOLO)
    with pytest.raises(ValueError, match="2 workers for 3 players"):
        Scheduler(["a", "b", "c"], URLS, bind=True)
    sched = Scheduler(["a", "b"], URLS + ["http://w2"], Backoff(max_failures=2), bind=True)
    assert [w.player for w in sched.workers] == ["a", "b", "a"]
    # set-ups of different players' workers run side by side, one per player at a time
    first, second = sched.next_set_up(0.0), None
    sched.begin_set_up(first)
    second = sched.next_set_up(0.0)
    sched.begin_set_up(second)
    assert (first, second) == (0, 1) and sched.next_set_up(0.0) is None  # w2 is a's too
    sched.set_up_done(1)
    b_job = sched.next_job(league, 1, 0.0)  # b's worker is ready: b plays
    assert b_job.home == "b" and b_job.agents == {"b"} and b_job.running.job.settings
    sched.set_up_done(0)
    assert sched.next_job(league, 0, 0.0) is None  # a's w2 is due its set-up: a waits
    assert sched.next_set_up(0.0) == 2
    sched.begin_set_up(2)
    sched.set_up_done(2)
    a_job = sched.next_job(league, 0, 0.0)
    assert a_job.home == "a" and sched.next_job(league, 2, 0.0) is None  # a is busy
    sched.job_done(a_job)
    league.finish_job(a_job.job_id, [], 10, returns=[1.0])
    assert sched.next_job(league, 2, 0.0).home == "a"  # its other worker takes the next
    # a player whose workers are all dropped cannot train: the run ends naming it
    sched.job_failed(b_job, "gone", 0.0)
    assert sched.exhausted() is None
    sched.begin_set_up(1)
    sched.task_failed(1, "gone again", 5.0)
    assert sched.exhausted() == (
        "player 'b' has no healthy worker left: worker 1 http://w1 "
        "failed 2 times in a row: gone again"
    )


def test_a_joining_worker_is_set_up_before_its_first_job():
    sched, league = _scheduler(), _league()
    _set_up_all(sched)
    joined = sched.add_worker("http://w2")
    assert (joined.index, joined.state, joined.player) == (2, NEW, None)
    assert sched.holding_jobs(0.0) and sched.next_job(league, 0, 0.0) is None
    assert sched.next_set_up(0.0) == 2
    sched.begin_set_up(2)
    sched.set_up_done(2)
    assert sched.idle() == [0, 1, 2]
    assert sched.next_job(league, 2, 0.0).worker == 2


def test_a_replaced_worker_is_dropped_once_its_task_ends_and_not_retried():
    sched, league = _scheduler(), _league()
    _set_up_all(sched)
    sched.add_worker("http://w2", replaces=1)  # an idle worker: dropped at once
    w1 = sched.workers[1]
    assert (w1.state, w1.replaced_by, w1.failed) == (DROPPED, 2, 0)
    assert sched.workers[1].view()["replacedBy"] == 2
    with pytest.raises(ValueError, match="dropped already"):
        sched.add_worker("http://w3", replaces=1)
    _set_up_all(sched)
    job = sched.next_job(league, 0, 0.0)
    sched.add_worker("http://w3", replaces=0)
    assert sched.workers[0].state == BUSY  # its job goes on ...
    failure = sched.job_failed(job, "ServiceUnavailable: cannot connect", now=1.0)
    assert failure.dropped and sched.workers[0].state == DROPPED  # ... and is not retried
    assert failure.describe().startswith("worker 0 http://w0: dropped (replaced by worker 3)")
    assert sched.next_retry(1.0) is None and sched.live() == [2, 3]
    # a replaced worker whose job finishes is dropped all the same
    _set_up_all(sched)
    job = sched.next_job(league, 2, 2.0)
    sched.add_worker("http://w4", replaces=2)
    sched.job_done(job)
    assert sched.workers[2].state == DROPPED and sched.workers[2].jobs == 1


def test_a_bound_workers_replacement_takes_its_player():
    sched = Scheduler(["a", "b"], URLS, Backoff(max_failures=2), bind=True)
    assert sched.add_worker("http://w2", replaces=1).player == "b"
    assert sched.add_worker("http://w3").player == "b"  # (as worker 3 of the start would)
    assert sched.workers[1].state == DROPPED and sched.exhausted() is None
