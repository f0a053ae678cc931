"""A league job's life in one place: launched, ended with its results, or failed.

The league orchestrator tells `LeagueJobs` each of the three once, and it updates both
halves of the league itself, in the order that keeps them consistent:

- `launch`: the scheduler takes the player whose turn it is, the manager gives it a slot
  and its opponent (`LeagueManager.launch_job`), the scheduler its agents and worker;
- `finish`: the manager learns the results (payoff, ratings, the player's steps); the
  job's agents and worker are free, and a snapshot a pool agent loaded for it is kept;
- `fail`: the manager frees the slot and records the failure, nothing else; the agents
  are free and the worker counts the failure (its backoff, or its drop).

Who plays is the scheduler's choice and against whom the manager's, and the agents depend
on that opponent, so the scheduler asks for the job in the middle of its choice
(`Scheduler.next_job`, given the manager). Pure code, as both are: no threads, no I/O, the
clock passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mistk_rl.league.manager import LeagueManager
from mistk_rl.league.payoff import Result
from mistk_rl.league.scheduler import Assignment, Failure, Scheduler, one_line

FAILED_CHARS = 500  # a failed job's error as its record in league.json keeps it


@dataclass
class LeagueJobs:
    """The one owner of a job's launch, end and failure (module doc)."""

    manager: LeagueManager
    scheduler: Scheduler

    def launch(self, worker: int, now: float) -> Optional[Assignment]:
        """The next job on the idle `worker`, its slot, agents and worker taken
        (`Scheduler.next_job`); None when none can start now."""
        return self.scheduler.next_job(self.manager, worker, now)

    def finish(
        self,
        assignment: Assignment,
        results: list[Result],
        steps: int,
        returns: Optional[list[float]] = None,
    ) -> None:
        """The job played: the league learns its `results` (the launching player's side;
        a solo job: its episodes' `returns`) and the player's `steps`; its agents and
        worker are free, whatever the league made of it."""
        try:
            self.manager.finish_job(assignment.job_id, results, steps, returns=returns)
        finally:
            self.scheduler.job_done(assignment)

    def fail(
        self, assignment: Assignment, error: str, now: float, recovered: dict[str, str]
    ) -> Failure:
        """The job failed: recorded (the worker's URL and the agents brought back, agent ->
        the state each was found in) and nothing else; its agents are free and its worker
        counts the failure."""
        if assignment.worker is None:
            raise ValueError(f"job {assignment.job_id} was not launched on a worker")
        details: dict[str, object] = {"worker": self.scheduler.workers[assignment.worker].url}
        if recovered:
            details["recovered"] = dict(recovered)
        self.manager.fail_job(assignment.job_id, one_line(error, FAILED_CHARS), details)
        failure = self.scheduler.job_failed(assignment, error, now)
        assert failure is not None  # (its worker, checked above)
        return failure
