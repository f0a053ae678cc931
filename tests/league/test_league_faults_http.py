"""A league whose workers die or restart mid-job, over HTTP: real services, faults injected
by process (SIGSTOP to catch a job mid-episode, SIGKILL), every wait a status long-poll
with a timeout. A failing worker is set up again or dropped after a few failures in a row,
the agents a dead job left mid-episode are brought back to ready, the launches stay
bounded, and with no worker left the run (the league's startEpisode, and the harness
driving it) ends, saying why."""

from __future__ import annotations

import os
import queue
import signal
import time
from typing import Callable

import pytest

from harness.bench.faults import HarnessProcess
from harness.bench.faults import workers as gunicorn_workers
from mistk_rl.deploy.launch import ServiceProcess, wait_ready, wait_until_gone
from mistk_rl.sdk.client import BadRequest, NotFound, OrchestratorClient
from mistk_rl.sdk.schemas import League
from tests.conftest import REPO

LEAGUE = "orchestrators.league_orchestrator:LeagueOrchestrator"
GAME = "orchestrators.game_orchestrator:GameOrchestrator"
RANDOM = "agents.random_agent:RandomAgent"
FAILURES = 3  # maxWorkerFailures: dropped after 3 in a row (waits .05 s, then .1 s)
WAIT_S = 60  # the longest any condition below may take to come about


class League_:
    """The services of a small league: two game workers, a main player, a frozen agent."""

    def __init__(self, launch: Callable[..., ServiceProcess], tmp_path) -> None:
        share = ["--share", f"league={tmp_path / 'shared'}"]
        self.workers = [launch("orchestrator", GAME, wait=False) for _ in range(2)]
        agents = {
            name: launch("agent", RANDOM, extra_args=share, wait=False)
            for name in ("main", "frozen")
        }
        service = launch("orchestrator", LEAGUE, extra_args=share, wait=False)
        for s in [*self.workers, *agents.values(), service]:
            wait_ready(s, 60)
        self.agents = {name: s.client() for name, s in agents.items()}
        for k, agent in enumerate(self.agents.values()):
            agent.initialize(hyperparameters={"seed": k})
            agent.build_model()
        self.client: OrchestratorClient = service.client()
        self.client.initialize(
            {
                "id": "classic/tictactoe-v3",
                "league": {
                    "players": [{"id": "main", "type": "main"}],
                    "workers": [w.url for w in self.workers],
                    "onePhaseStep": 10**6,
                    "gamesPerJob": 24,
                    "numEnvs": 1,
                    "seed": 0,
                    "maxWorkerFailures": FAILURES,
                    "workerBackoff": 0.05,
                    "workerBackoffMax": 0.2,
                },
            },
            agents_needed=2,
        )
        self.client.register_agent("main", agents["main"].url)
        self.client.register_agent("frozen", agents["frozen"].url, skip_train=True)

    def view(self) -> League:
        return self.client.get_league()

    def until(self, what: str, done: Callable[[League], bool]) -> League:
        """Long-poll the league's status until `done(GET /league)` holds."""
        deadline = time.monotonic() + WAIT_S
        status = self.client.status()
        while True:
            try:
                view = self.view()
            except NotFound:  # (the league begins in the startEpisode)
                view = None
            if view is not None and done(view):
                return view
            assert status.state in ("running", "completed_episode"), status
            assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}: {view}"
            status = self.client.status(status.resource_version, timeout=5)

    def freeze_mid_episode(self) -> tuple[ServiceProcess, dict]:
        """SIGSTOP the worker of a running job while the job's player is mid-episode (its
        agent in_episode, or answering one of the job's requests); returns the worker's
        service and the job. A worker caught between games goes on, and the next job is
        tried."""
        by_url = {w.url: w for w in self.workers}
        tried: set[int] = set()

        def caught(view: League) -> bool:
            for worker in view.workers:
                if worker.state != "busy" or worker.job is None or worker.job in tried:
                    continue
                job = next((j for j in view.jobs["running"] if j["job_id"] == worker.job), None)
                if job is None:
                    continue
                tried.add(worker.job)
                service = by_url[worker.url]
                os.killpg(service.process.pid, signal.SIGSTOP)
                if self.agents[job["launch_player"]].status().state != "ready":
                    self.frozen = service, job
                    return True
                os.killpg(service.process.pid, signal.SIGCONT)
            return False

        self.until("a job caught mid-episode", caught)
        return self.frozen

    def counts(self, view: League) -> dict:
        jobs = view.jobs
        return {
            "launched": jobs["launched"],
            "finished": jobs["finished"],
            "failed": jobs["failed"],
            "running": len(jobs["running"]),
        }


def _worker(view: League, service: ServiceProcess):
    return next(w for w in view.workers if w.url == service.url)


def _finished_after(view: League, job_id: int, player: str = "main") -> int:
    return sum(
        1
        for j in view.jobs["recent"]
        if "results" in j and j["job_id"] > job_id and j["launch_player"] == player
    )


@pytest.fixture
def league(launch, tmp_path):
    return League_(launch, tmp_path)


def test_a_restarted_worker_is_set_up_again_and_the_league_goes_on(league):
    league.client.start_episode({"numEpisodes": 100_000})
    service, job = league.freeze_mid_episode()
    (process,) = gunicorn_workers(service.process.pid)
    os.kill(process, signal.SIGKILL)  # its gunicorn worker dies; the master starts another
    os.killpg(service.process.pid, signal.SIGCONT)
    view = league.until(
        "the restarted worker set up again and playing jobs",
        lambda v: (
            _worker(v, service).set_ups == 2
            and _worker(v, service).failures == 0
            and _worker(v, service).jobs >= 1
            and _finished_after(v, job["job_id"]) >= 2
        ),
    )
    (failed,) = [j for j in view.jobs["recent"] if "failed" in j]
    assert failed["job_id"] == job["job_id"] and failed["worker"] == service.url
    # (the league's call in flight dropped, or the next one met the new instance)
    assert failed["failed"].startswith(("ServiceUnavailable", "ServiceRestarted"))
    assert failed["recovered"]["main"] == "in_episode"  # the job left it mid-episode
    league.client.stop_episode()
    view = league.view()
    counts = league.counts(view)
    assert counts["failed"] == 1  # one job lost to the restart; no storm of relaunches
    assert counts["launched"] == counts["finished"] + counts["failed"] + counts["running"]
    assert [w.state for w in view.workers] == ["idle", "idle"]
    assert {a.status().state for a in league.agents.values()} == {"ready"}


def test_a_killed_worker_is_dropped_its_agents_come_back_and_the_league_finishes(league):
    league.client.start_episode({"numEpisodes": 100_000})
    service, job = league.freeze_mid_episode()
    os.killpg(service.process.pid, signal.SIGKILL)  # gone for good, mid-episode
    view = league.until(
        "the dead worker dropped; main playing on the other",
        lambda v: _worker(v, service).state == "dropped" and _finished_after(v, job["job_id"]) >= 2,
    )
    dead = _worker(view, service)
    assert (dead.failures, dead.failed) == (FAILURES, FAILURES)  # 1 job + 2 set-ups
    assert "cannot connect" in dead.last_error
    (failed,) = [j for j in view.jobs["recent"] if "failed" in j]
    assert failed["job_id"] == job["job_id"] and failed["worker"] == service.url
    # the agents the dead job left mid-episode were brought back before their next job
    assert failed["recovered"]["main"] == "in_episode"
    league.client.stop_episode()
    assert {a.status().state for a in league.agents.values()} == {"ready"}
    # the run goes on with the surviving worker, and finishes
    before = league.counts(league.view())
    league.client.start_episode({"numEpisodes": 48}, wait=True, timeout=WAIT_S)
    league.client.stop_episode()
    view = league.view()
    after = league.counts(view)
    assert after["failed"] == before["failed"] == 1  # launches stay bounded
    assert after["finished"] >= before["finished"] + 2
    assert after["launched"] == after["finished"] + after["failed"] + after["running"]
    progress = league.client.progress()
    assert progress.league.failed == 1 and progress.league.workers == 1
    assert [w.state for w in view.workers if w.url != service.url] == ["idle"]


def test_a_worker_started_again_elsewhere_takes_the_place_of_a_lost_one(league, launch):
    """POST /league/workers with ``replaces`` (what the harness does when a cluster node
    is lost): the lost worker's job fails and it is dropped, not retried; the new worker
    joins the running league, is set up and plays its jobs."""
    fresh = launch("orchestrator", GAME)
    league.client.start_episode({"numEpisodes": 100_000})
    service, job = league.freeze_mid_episode()
    joined = league.client.add_league_worker(fresh.url, replaces=service.url)
    assert (joined.url, joined.replaces) == (fresh.url, service.url)
    os.killpg(service.process.pid, signal.SIGKILL)  # its node is gone
    view = league.until(
        "the new worker set up and playing jobs",
        lambda v: any(w.url == fresh.url and w.jobs >= 2 for w in v.workers),
    )
    lost = _worker(view, service)
    assert (lost.state, lost.replaced_by, lost.failed, lost.set_ups) == ("dropped", 2, 1, 1)
    (failed,) = [j for j in view.jobs["recent"] if "failed" in j]
    assert failed["job_id"] == job["job_id"] and failed["worker"] == service.url
    league.client.stop_episode()
    assert {a.status().state for a in league.agents.values()} == {"ready"}
    # with no episode running a worker joins at once; bad requests change nothing
    before = league.view().workers
    for url, replaces, match in (
        (fresh.url, None, "in the league already"),
        ("http://127.0.0.1:9/", service.url, "no live worker"),
        ("ftp://w/", None, "url 'ftp://w/' is not an http"),
    ):
        with pytest.raises(BadRequest, match=match):
            league.client.add_league_worker(url, replaces=replaces)
    assert league.view().workers == before
    spare = league.client.add_league_worker("http://127.0.0.1:9/")
    assert [w.state for w in league.view().workers][-1:] == ["new"] and not spare.replaces
    with pytest.raises(NotFound, match="runs no league"):
        fresh.client().add_league_worker(league.workers[0].url)


def test_with_every_worker_killed_the_run_ends_naming_them(league):
    league.client.start_episode({"numEpisodes": 100_000})
    service, job = league.freeze_mid_episode()
    for worker in league.workers:
        os.killpg(worker.process.pid, signal.SIGKILL)
    failed = league.client.wait_for_state("failed", timeout=WAIT_S)
    assert failed.reason.startswith(
        "startEpisode raised RuntimeError: no healthy worker left: worker 0 "
    )
    for k, worker in enumerate(league.workers):
        assert f"worker {k} {worker.url} failed {FAILURES} times in a row: " in failed.reason
    view = league.view()  # (GET /league answers in state failed)
    counts = league.counts(view)
    assert counts["failed"] <= 2 and counts["launched"] <= counts["finished"] + 2
    assert [w.state for w in view.workers] == ["dropped", "dropped"]
    assert league.agents["main"].status().state == "ready"  # brought back all the same
    league.client.reset()  # a clear state: reset leaves it
    assert league.client.status().state == "uninitialized"


def test_the_harness_ends_naming_the_cause_when_every_worker_dies(tmp_path):
    league = {
        "players": [{"id": "main", "type": "main"}],
        "onePhaseStep": 10**6,
        "gamesPerJob": 24,
        "numEnvs": 1,
        "maxWorkerFailures": 2,
        "workerBackoff": 0.05,
    }
    config = {
        "name": "league_faults",
        "orchestrator": {"target": LEAGUE, "env": {"id": "classic/tictactoe-v3", "league": league}},
        "workers": [{"target": GAME}, {"target": GAME}],
        "agents": [
            {"name": "main", "target": RANDOM},
            {"name": "frozen", "target": RANDOM, "train": False},
        ],
        "game_training": {"agent_steps": 10**8, "eval_every": 10**8},
        "evaluation": {"agent": "main", "against": [{"opponent": "random", "exhaustive": True}]},
    }
    run = HarnessProcess(config, tmp_path / "run", REPO)
    masters = {}
    try:
        url = _started(run, "started orchestrator orchestrator ").rsplit(" at ", 1)[1]
        masters = {name: run.master(name) for name in ("orchestrator", "worker0", "worker1")}
        client = OrchestratorClient(url)
        status, deadline = client.status(), time.monotonic() + WAIT_S
        while not status.payload.get("league", {}).get("finished"):  # jobs are being played
            assert time.monotonic() < deadline, "no league job finished"
            status = client.status(status.resource_version, timeout=5)
        for name in ("worker0", "worker1"):
            os.killpg(masters[name], signal.SIGKILL)
        code, stderr = run.finish(timeout=WAIT_S)
        assert code == 1
        assert "no healthy worker left: worker 0 " in stderr and "; worker 1 " in stderr
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(10)
    left = [name for name, pid in masters.items() if not wait_until_gone(pid, 15)]
    assert not left, f"services left behind: {left}"


def _started(run: HarnessProcess, fragment: str) -> str:
    """The harness's first stdout line holding `fragment`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            line = run.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the harness printed no {fragment!r}") from None
        if fragment in line:
            return line.strip()
