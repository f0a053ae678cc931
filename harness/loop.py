"""The training loop every kind of run shares: train to the next evaluation point, evaluate,
save every agent's checkpoint and then ``progress.json`` (agents first: progress must name
checkpoints that exist), until the budget is spent or an evaluation meets the stop targets.

What differs between gym training (`harness.training`) and game training (`harness.games`)
is a `Schedule`: what the steps count, how a block of training runs, how an evaluation runs
and what it records. The loop owns the order of things and the resume points."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from harness.progress import TrainingProgress


@dataclass
class Evaluated:
    """What the loop needs from an evaluation (the schedule recorded the rest)."""

    headline: float  # shown beside the progress bar (mean return, win rate)
    line: str  # said once the evaluation is saved
    stop: bool  # the stop targets are met


class Schedule(Protocol):
    unit: str  # what the steps count: "env steps", "agent steps"
    eval_label: str  # the headline's name on the progress bar
    budget: int  # steps to train in all
    eval_every: int  # steps between evaluations

    def steps(self) -> int:
        """Steps trained so far (a resumed run starts where its progress says)."""

    def train_block(self, target: int, shown: TrainingProgress) -> None:
        """Train until `steps()` reaches `target` (episodes in progress are not cut)."""

    def evaluate(self, wall_s: float) -> Evaluated:
        """Evaluate at `steps()` and record it (its record carries `wall_s`)."""

    def save(self, checkpoints: dict[str, str], wall_s: float) -> None:
        """Record the checkpoints just saved (agent -> path) and save the progress."""

    def close(self) -> None:
        """Write what the run shows (curves, CSV), also after a failure."""


class Checkpointer(Protocol):
    def save(self, steps: int) -> dict[str, str]: ...
    def prune(self) -> None: ...


def next_eval_point(steps: int, eval_every: int, budget: int) -> int:
    """The next multiple of `eval_every` after `steps`, or the budget if that comes first."""
    return min(steps - steps % eval_every + eval_every, budget)


def run_loop(
    schedule: Schedule,
    wall_s: float,
    say: Callable[[str], None],
    checkpoints: Optional[Checkpointer] = None,
    quiet: bool = False,
    last_headline: Optional[float] = None,
    stop_line: str = "stopping",
    done: bool = False,
) -> None:
    """Run `schedule` from where it stands (`wall_s`: training time already spent by the
    run this one resumes; `done`: it already met its stop targets). Shows a progress bar on
    a terminal, plain lines otherwise, nothing when `quiet`."""
    shown = TrainingProgress(
        schedule.budget,
        schedule.steps(),
        quiet=quiet,
        say=say,
        unit=schedule.unit,
        eval_label=schedule.eval_label,
    )
    if last_headline is not None:
        shown.evaluated(last_headline)
    started = time.monotonic() - wall_s
    try:
        while not done and schedule.steps() < schedule.budget:
            schedule.train_block(
                next_eval_point(schedule.steps(), schedule.eval_every, schedule.budget), shown
            )
            shown.update(schedule.steps())
            result = schedule.evaluate(round(time.monotonic() - started, 3))
            shown.evaluated(result.headline)
            if checkpoints is not None:
                saved = checkpoints.save(schedule.steps())
                schedule.save(saved, round(time.monotonic() - started, 3))
                checkpoints.prune()  # after progress names the newest
            shown.write(result.line)
            done = result.stop
            if done:
                shown.write(f"  {stop_line}")
    finally:
        shown.close()
        schedule.close()
