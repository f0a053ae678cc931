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
import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config import (
    GameEvaluation,
    GameTrainingSpec,
    Matchup,
    RunConfig,
    RunConfigError,
    Target,
)
from harness.league import payoff_figure
from harness.loop import Evaluated, run_loop
from harness.progress import TrainingProgress
from harness.training import Checkpoints, ProgressFile, tensorboard_writer
from mistk_rl.games.pettingzoo_games import RESULTS, result_for
from mistk_rl.sdk.client import OrchestratorClient
from mistk_rl.sdk.schemas import AgentSettings, EpisodeConfig, EpisodeResult, ExhaustiveSpec


def evaluate(
    orch: OrchestratorClient,
    spec: GameEvaluation,
    timeout: float,
    trained_against: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """{opponent: {"exhaustive": bool, "trained_against": bool, "seats": {seat: {win, draw,
    loss, ...}}}}; `trained_against`: the opponents the agent trains on
    (`training_opponents`), whose figures say so."""
    return {
        matchup.opponent: {
            **(
                _enumerated(orch, spec, matchup, timeout)
                if matchup.exhaustive
                else _sampled(orch, spec, matchup, timeout)
            ),
            "trained_against": matchup.opponent in trained_against,
        }
        for matchup in spec.against
    }


TRAINED_AGAINST = " (trained against)"  # how a matchup's figures say the agent trains on it


def shown_as(opponent: str, result: dict[str, Any]) -> str:
    """`opponent` as its figures are labelled: marked where the agent trains on it."""
    return opponent + (TRAINED_AGAINST if result.get("trained_against") else "")


def training_opponents(config: RunConfig, status: dict[str, Any]) -> frozenset[str]:
    """Whom the evaluated agent meets in its training games: a league's other players, its
    pool and its fixed opponents (``orchestrator.env.league``); else game training's lineup,
    or, without one, the agents holding seats (the game orchestrator's ``seatHolders`` in
    `status`, as it bound them). An evaluation against one of them is not held out."""
    evaluation = config.evaluation
    if evaluation is None:
        return frozenset()
    league = config.orchestrator.env.league
    if league is not None:
        met = {p["id"] for p in league.get("players", [])}
        met |= set(league.get("pool", [])) | set(league.get("fixed", []))
    elif config.game_training is not None:
        lineup = config.game_training.lineup
        met = set((lineup or status.get("seatHolders") or {}).values())
    else:
        met = set()
    return frozenset(met - {evaluation.agent})


def check_held_out(evaluation: GameEvaluation, trained_against: frozenset[str]) -> None:
    """``evaluation.held_out``: refuse a run that trains on one of its evaluation's
    opponents, before it trains (`RunConfigError`, naming them)."""
    overlap = sorted(trained_against & {m.opponent for m in evaluation.against})
    if evaluation.held_out and overlap:
        raise RunConfigError(
            f"evaluation.held_out: the agent trains against {', '.join(overlap)}, which the "
            "evaluation plays; take them out of training (league fixed/pool, lineup, seats) "
            "or out of evaluation.against"
        )


def _enumerated(
    orch: OrchestratorClient, spec: GameEvaluation, matchup: Matchup, timeout: float
) -> dict[str, Any]:
    played = orch.play(
        EpisodeConfig(exhaustive=ExhaustiveSpec(agent=spec.agent, opponent=matchup.opponent)),
        timeout=timeout,
    )
    evaluations = played.results.evaluations
    assert evaluations, "an exhaustive episode's results hold its evaluation"
    report = evaluations[-1]
    if not report["complete"]:
        raise RuntimeError(
            f"the enumeration against {matchup.opponent} did not complete "
            f"({report['positions']} positions)"
        )
    return {
        "exhaustive": True,
        "seats": {
            seat: {
                **{r: round(tally[r], 6) for r in RESULTS},
                "lines": tally["lines"],
                "lost_lines": tally["lostLines"],
            }
            for seat, tally in report["seats"].items()
        },
    }


def _sampled(
    orch: OrchestratorClient, spec: GameEvaluation, matchup: Matchup, timeout: float
) -> dict[str, Any]:
    seats = orch.status().payload["seats"]
    lineup = {seats[0]: spec.agent, seats[1]: matchup.opponent}
    games = orch.play(
        EpisodeConfig(
            num_episodes=matchup.games_per_seat * len(seats),
            num_envs=spec.num_envs,
            seed=spec.seed,
            train=False,
            lineup=lineup,
            seat_assignment="alternate",
            agents={matchup.opponent: AgentSettings(mode=matchup.opponent_mode, train=False)},
        ),
        timeout=timeout,
    ).episodes
    return {"exhaustive": False, "seats": seat_rates(games, spec.agent, seats)}


def seat_rates(games: list[EpisodeResult], agent: str, seats: list[str]) -> dict[str, Any]:
    """Win / draw / loss rates of `agent` per seat it held, from game results."""
    counts = {seat: dict.fromkeys(RESULTS, 0) for seat in seats}
    for game in games:
        for seat, holder in (game.seats or {}).items():
            if holder == agent:
                counts[seat][result_for(seat, game.winner)] += 1
    return {
        seat: {
            **{r: round(c[r] / max(1, sum(c.values())), 4) for r in RESULTS},
            "games": sum(c.values()),
        }
        for seat, c in counts.items()
    }


def train_games(
    orch: OrchestratorClient,
    spec: GameTrainingSpec,
    evaluation: GameEvaluation,
    run_dir: Path,
    timeout: float,
    say: Callable[[str], None],
    checkpoints: Optional[Checkpoints] = None,
    quiet: bool = False,
    progress: Optional[GameProgress] = None,
    title: str = "",
    trained_against: frozenset[str] = frozenset(),
) -> list[dict]:
    """The training loop (module doc; `harness.loop`), from the start or from `progress` (a
    resumed run); returns the evaluations, also written to ``evals.csv``, TensorBoard and
    ``learning_curve.png`` in `run_dir` (`title`: the config's name). With `checkpoints`,
    every evaluation saves each agent's checkpoint and then ``progress.json``."""
    progress = progress or GameProgress()
    resumed = bool(progress.evals)
    if resumed:
        progress.resumed_at.append(progress.agent_steps)
    last = progress.evals[-1]["evaluation"] if progress.evals else None
    run_loop(
        _GameSchedule(
            orch,
            spec,
            evaluation,
            run_dir,
            timeout,
            progress,
            resumed,
            f"{title or run_dir.name} (seed {spec.seed})",
            trained_against,
        ),
        progress.wall_s,
        say,
        checkpoints,
        quiet,
        last and _win_rate(last),
        "every stop_when target met: stopping (this checkpoint is kept)",
        done=progress.done,
    )
    return progress.evals


class _GameSchedule:
    """Game training for `run_loop`: blocks of games until the evaluated agent has made the
    steps to the next evaluation point (games in progress are finished), then `evaluate`."""

    unit, eval_label = "agent steps", "last eval win rate"

    def __init__(
        self,
        orch: OrchestratorClient,
        spec: GameTrainingSpec,
        evaluation: GameEvaluation,
        run_dir: Path,
        timeout: float,
        progress: GameProgress,
        resumed: bool = False,
        title: str = "",
        trained_against: frozenset[str] = frozenset(),
    ) -> None:
        self.orch, self.spec, self.evaluation = orch, spec, evaluation
        self.trained_against = trained_against
        self.run_dir, self.timeout, self.progress = run_dir, timeout, progress
        self.title = title
        # the x axis is the evaluated agent's moves, as evals.csv's
        self.writer = tensorboard_writer(
            run_dir / "tensorboard", purge_step=progress.agent_steps + 1 if resumed else None
        )
        self.budget, self.eval_every = spec.agent_steps, spec.eval_every
        self.settings = {
            name: AgentSettings.model_validate(value) for name, value in spec.agents.items()
        }

    def steps(self) -> int:
        return self.progress.agent_steps

    def train_block(self, target: int, shown: TrainingProgress) -> None:
        agent, spec, progress = self.evaluation.agent, self.spec, self.progress
        while progress.agent_steps < target:
            done, base = progress.agent_steps, _agent_steps(self.orch, agent)
            played = self.orch.play(
                EpisodeConfig(
                    num_steps=target - done,
                    num_envs=spec.num_envs,
                    seed=spec.seed + progress.blocks * spec.num_envs,
                    train=True,
                    seat_assignment=spec.seat_assignment,
                    lineup=spec.lineup,
                    agents=self.settings,
                ),
                timeout=self.timeout,
                on_status=lambda status: shown.update(
                    done + status.payload.get("agentSteps", {}).get(agent, base) - base
                ),
                episodes=False,  # (its counts are enough; the games go to episodes.jsonl)
            )
            progress.agent_steps += played.agent_steps(agent)
            progress.blocks += 1

    def evaluate(self, wall_s: float) -> Evaluated:
        report = evaluate(self.orch, self.evaluation, self.timeout, self.trained_against)
        status = self.orch.status()
        record = {
            "agent_steps": self.progress.agent_steps,
            "wall_s": wall_s,
            "moves": status.payload.get("envSteps", 0),
            "evaluation": report,
        }
        if "league" in status.payload:  # the league as it stood: ratings over time
            record["league"] = self.orch.get_league().model_dump()["players"]
        self.progress.done = record["passed"] = meets(report, self.spec.stop_when)
        self.progress.evals.append(record)
        self._log(record)
        return Evaluated(
            _win_rate(report),
            (
                f"  eval at {self.progress.agent_steps:7d} agent steps ({wall_s:7.1f} s): "
                f"{summary(report)}"
            ),
            self.progress.done,
        )

    def save(self, checkpoints: dict[str, str], wall_s: float) -> None:
        self.progress.checkpoints = checkpoints
        self.progress.evals[-1]["checkpoint"] = checkpoints.get(self.evaluation.agent)
        self.progress.wall_s = wall_s
        self.progress.save(self.run_dir)

    def close(self) -> None:
        write_evals(self.progress.evals, self.run_dir)
        plot_game_curve(self.progress.evals, self.run_dir / "learning_curve.png", self.title)
        self.writer.close()

    def _log(self, record: dict[str, Any]) -> None:
        """TensorBoard at the evaluated agent's moves: win / draw / loss (and lost lines,
        enumerated) per opponent and seat; a league's ratings per player and its payoff."""
        step = record["agent_steps"]
        for opponent, result in record["evaluation"].items():
            for seat, r in result["seats"].items():
                for key in ("win", "draw", "loss", "lost_lines"):
                    if key in r:
                        self.writer.add_scalar(f"eval/{opponent}/{seat}/{key}", r[key], step)
        for row in record.get("league", ()):
            for key in ("exposure", "elo"):
                self.writer.add_scalar(f"league/{key}/{row['id']}", row[key], step)
        if "league" in record:
            self.writer.add_figure(
                "league/payoff",
                payoff_figure(self.orch.get_league().model_dump()["payoff"], self.title),
                step,
            )
            # a closed matplotlib figure is a web of reference cycles, freed only by a full
            # collection, which a process this size runs rarely: without this, the league
            # soak's harness climbed ~10 MiB an evaluation between them (313 to 416 MiB)
            gc.collect()
        self.writer.flush()


def plot_game_curve(evals: list[dict], path: Path, title: str) -> None:
    """``learning_curve.png`` of game training: per opponent and seat, the evaluated
    agent's win rate (solid) and loss rate (dotted) at each evaluation."""
    if not evals:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    steps = [e["agent_steps"] for e in evals]
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
    for opponent, result in evals[-1]["evaluation"].items():
        for seat in result["seats"]:
            color = next(colors)
            rates = [e["evaluation"][opponent]["seats"][seat] for e in evals]
            ax.plot(
                steps,
                [r["win"] for r in rates],
                "-o",
                color=color,
                markersize=3,
                label=f"vs {shown_as(opponent, result)}, {seat}: win",
            )
            ax.plot(
                steps,
                [r["loss"] for r in rates],
                ":",
                color=color,
                label=f"vs {shown_as(opponent, result)}, {seat}: loss",
            )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("evaluated agent's moves")
    ax.set_ylabel("rate in its evaluation games")
    ax.set_title(title, fontsize="small")
    ax.legend(loc="best", fontsize="x-small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _win_rate(report: dict[str, Any]) -> float:
    """The first matchup's win rate over its seats: the headline beside the progress bar."""
    seats = next(iter(report.values()))["seats"].values()
    return sum(r["win"] for r in seats) / len(seats)


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
    episodes_saved: int = 0  # (the harness's interface: none kept)
    done: bool = False  # an evaluation met every stop_when target

    def __post_init__(self) -> None:
        for record in self.evals:  # (a progress.json from before files spelt lost_lines)
            for result in record.get("evaluation", {}).values():
                for seat in result.get("seats", {}).values():
                    if "lostLines" in seat:
                        seat["lost_lines"] = seat.pop("lostLines")


def meets(report: dict[str, Any], targets: list[Target]) -> bool:
    """Whether an evaluation meets every target (False when there are none)."""
    if not targets:
        return False
    for target in targets:
        seats = report[target.opponent]["seats"]
        for seat in [target.seat] if target.seat else list(seats):
            r = seats[seat]
            if (
                (target.min_win is not None and r["win"] < target.min_win)
                or (target.max_loss is not None and r["loss"] > target.max_loss)
                or (
                    target.max_lost_lines is not None
                    and r.get("lost_lines", target.max_lost_lines + 1) > target.max_lost_lines
                )
            ):
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
            lost = f" lost lines {r['lost_lines']}/{r['lines']}" if "lines" in r else ""
            seats.append(f"{seat} {r['win']:.3f}/{r['draw']:.3f}/{r['loss']:.3f}{lost}")
        parts.append(f"vs {shown_as(opponent, result)}: " + "; ".join(seats))
    return " | ".join(parts)


def write_evals(evals: list[dict], run_dir: Path) -> None:
    """``evals.csv``: one row per evaluation, matchup and seat."""
    with open(run_dir / "evals.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(
            [
                "agent_steps",
                "wall_s",
                "opponent",
                "seat",
                "win",
                "draw",
                "loss",
                "lines",
                "lost_lines",
                "trained_against",
            ]
        )
        for record in evals:
            for opponent, result in record["evaluation"].items():
                for seat, r in result["seats"].items():
                    out.writerow(
                        [
                            record["agent_steps"],
                            record["wall_s"],
                            opponent,
                            seat,
                            r["win"],
                            r["draw"],
                            r["loss"],
                            r.get("lines", ""),
                            r.get("lost_lines", ""),
                            int(bool(result.get("trained_against"))),
                        ]
                    )
