"""Games in the harness: training blocks of games between registered agents, and the
evaluation of one agent against opponents in every seat (`mistk-rl eval`).

An evaluation is greedy and deterministic for the evaluated agent. A matchup is either
enumerated (``exhaustive``: every game against all of a built-in opponent's replies, which
gives the exact expectation against ``random`` and the lost lines against
``tictactoe_perfect``) or sampled (``games_per_seat`` games in each seat against a registered
agent, seats alternating game by game). Per seat it reports win / draw / loss (probabilities
or rates), and lines and lost lines where enumerated.

Training counts the moves of the evaluated agent ("agent steps"; in self-play every move is
one): blocks of games until the next evaluation point, then an evaluation and a checkpoint of
every agent (and ``progress.json``: what ``mistk-rl run --resume RUN_DIR`` continues), until
the budget is spent. Games in progress at a budget are finished, not cut.
"""
from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config import GameEvaluation, GameTrainingSpec, Matchup, Target
from harness.progress import TrainingProgress
from harness.training import Checkpoints, ProgressFile, run_call
from mistk_rl.client import OrchestratorClient
from mistk_rl.games.pettingzoo_games import RESULTS, result_for
from mistk_rl.schemas import AgentSettings, EpisodeConfig, EpisodeResult, ExhaustiveSpec


def evaluate(orch: OrchestratorClient, spec: GameEvaluation, timeout: float) -> dict[str, Any]:
    """{opponent: {"exhaustive": bool, "seats": {seat: {win, draw, loss, ...}}}}."""
    return {matchup.opponent: (_enumerated(orch, spec, matchup, timeout) if matchup.exhaustive
                               else _sampled(orch, spec, matchup, timeout))
            for matchup in spec.against}


def _enumerated(orch: OrchestratorClient, spec: GameEvaluation, matchup: Matchup,
                timeout: float) -> dict[str, Any]:
    run_call(orch, EpisodeConfig(exhaustive=ExhaustiveSpec(agent=spec.agent,
                                                        opponent=matchup.opponent)), timeout)
    report = orch.get_results().evaluations[-1]
    if not report["complete"]:
        raise RuntimeError(f"the enumeration against {matchup.opponent} did not complete "
                           f"({report['positions']} positions)")
    return {"exhaustive": True, "seats": {
        seat: {**{r: round(tally[r], 6) for r in RESULTS},
               "lines": tally["lines"], "lostLines": tally["lostLines"]}
        for seat, tally in report["seats"].items()}}


def _sampled(orch: OrchestratorClient, spec: GameEvaluation, matchup: Matchup,
             timeout: float) -> dict[str, Any]:
    seats = orch.status().payload["seats"]
    lineup = {seats[0]: spec.agent, seats[1]: matchup.opponent}
    games = run_call(orch, EpisodeConfig(
        num_episodes=matchup.games_per_seat * len(seats), num_envs=spec.num_envs,
        seed=spec.seed, train=False, lineup=lineup, seat_assignment="alternate"), timeout)
    return {"exhaustive": False, "seats": seat_rates(games, spec.agent, seats)}


def seat_rates(games: list[EpisodeResult], agent: str, seats: list[str]) -> dict[str, Any]:
    """Win / draw / loss rates of `agent` per seat it held, from game results."""
    counts = {seat: dict.fromkeys(RESULTS, 0) for seat in seats}
    for game in games:
        for seat, holder in (game.seats or {}).items():
            if holder == agent:
                counts[seat][result_for(seat, game.winner)] += 1
    return {seat: {**{r: round(c[r] / max(1, sum(c.values())), 4) for r in RESULTS},
                   "games": sum(c.values())} for seat, c in counts.items()}


def train_games(orch: OrchestratorClient, spec: GameTrainingSpec, evaluation: GameEvaluation,
                run_dir: Path, timeout: float, say: Callable[[str], None],
                checkpoints: Optional[Checkpoints] = None, quiet: bool = False,
                progress: Optional[GameProgress] = None) -> list[dict]:
    """The training loop (module doc), from the start or from `progress` (a resumed run);
    returns the evaluations, also written to ``evals.csv`` in `run_dir`. With `checkpoints`,
    every evaluation saves each agent's checkpoint and then ``progress.json``."""
    agent = evaluation.agent
    progress = progress or GameProgress()
    if progress.evals:
        progress.resumed_at.append(progress.agent_steps)
    shown = TrainingProgress(spec.agent_steps, progress.agent_steps, quiet=quiet, say=say,
                             unit="agent steps", eval_label="last eval win rate")
    say = shown.write
    started = time.monotonic() - progress.wall_s
    steps, block, evals = progress.agent_steps, progress.blocks, progress.evals
    settings = {name: AgentSettings.model_validate(value)
                for name, value in spec.agents.items()}
    try:
        while steps < spec.agent_steps and not progress.done:
            target = min(steps - steps % spec.eval_every + spec.eval_every, spec.agent_steps)
            while steps < target:
                base = _agent_steps(orch, agent)
                run_call(orch, EpisodeConfig(
                    num_steps=target - steps, num_envs=spec.num_envs,
                    seed=spec.seed + block * spec.num_envs, train=True,
                    seat_assignment=spec.seat_assignment, lineup=spec.lineup,
                    agents=settings), timeout,
                    lambda status, done=steps, base=base: shown.update(
                        done + status.payload.get("agentSteps", {}).get(agent, base) - base))
                steps += _agent_steps(orch, agent) - base
                block += 1
            shown.update(steps)
            report = evaluate(orch, evaluation, timeout)
            record = {"agent_steps": steps, "wall_s": round(time.monotonic() - started, 3),
                      "moves": orch.status().payload.get("envSteps", 0), "evaluation": report}
            evals.append(record)
            first = next(iter(report.values()))["seats"].values()
            shown.evaluated(sum(r["win"] for r in first) / len(first))
            if "league" in orch.status().payload:  # the league as it stood: ratings over time
                record["league"] = orch.get_league().model_dump()["players"]
            progress.done = record["passed"] = meets(report, spec.stop_when)
            if checkpoints is not None:  # agents first: progress must name saved checkpoints
                progress.checkpoints = checkpoints.save(steps)
                record["checkpoint"] = progress.checkpoints.get(agent)
                progress.agent_steps, progress.blocks = steps, block
                progress.wall_s = record["wall_s"]
                progress.save(run_dir)
                checkpoints.prune()
            say(f"  eval at {steps:7d} agent steps ({record['wall_s']:7.1f} s): "
                f"{summary(report)}")
            if progress.done:
                say("  every stop_when target met: stopping (this checkpoint is kept)")
                break
    finally:
        shown.close()
        write_evals(evals, run_dir)
    return evals


@dataclass
class GameProgress(ProgressFile):
    """A game training run after its last evaluation: what ``mistk-rl run --resume``
    continues (the agents load `checkpoints`, training goes on from `agent_steps`). The
    games themselves are not kept here (tens of thousands): a resumed run's results.json
    lists the games played since the resume; `evals` holds the whole history."""

    agent_steps: int = 0
    blocks: int = 0
    wall_s: float = 0.0
    evals: list[dict] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)
    resumed_at: list[int] = field(default_factory=list)
    episodes: list[dict] = field(default_factory=list)  # (the harness's interface: none kept)
    done: bool = False  # an evaluation met every stop_when target


def meets(report: dict[str, Any], targets: list[Target]) -> bool:
    """Whether an evaluation meets every target (False when there are none)."""
    if not targets:
        return False
    for target in targets:
        seats = report[target.opponent]["seats"]
        for seat in [target.seat] if target.seat else list(seats):
            r = seats[seat]
            if ((target.min_win is not None and r["win"] < target.min_win)
                    or (target.max_loss is not None and r["loss"] > target.max_loss)
                    or (target.max_lost_lines is not None
                        and r.get("lostLines", target.max_lost_lines + 1)
                        > target.max_lost_lines)):
                return False
    return True


def _agent_steps(orch: OrchestratorClient, agent: str) -> int:
    return int(orch.status().payload.get("agentSteps", {}).get(agent, 0))


def summary(report: dict[str, Any]) -> str:
    """One line: per opponent and seat, W/D/L and the lost lines where enumerated."""
    parts = []
    for opponent, result in report.items():
        seats = []
        for seat, r in result["seats"].items():
            lost = f" lost lines {r['lostLines']}/{r['lines']}" if "lines" in r else ""
            seats.append(f"{seat} {r['win']:.3f}/{r['draw']:.3f}/{r['loss']:.3f}{lost}")
        parts.append(f"vs {opponent}: " + "; ".join(seats))
    return " | ".join(parts)


def write_evals(evals: list[dict], run_dir: Path) -> None:
    """``evals.csv``: one row per evaluation, matchup and seat."""
    with open(run_dir / "evals.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["agent_steps", "wall_s", "opponent", "seat", "win", "draw", "loss",
                      "lines", "lost_lines"])
        for record in evals:
            for opponent, result in record["evaluation"].items():
                for seat, r in result["seats"].items():
                    out.writerow([record["agent_steps"], record["wall_s"], opponent, seat,
                                  r["win"], r["draw"], r["loss"], r.get("lines", ""),
                                  r.get("lostLines", "")])
