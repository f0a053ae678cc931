"""League runs. A battle league's results: the evaluation by seat order, the league table,
the kept checkpoint, a payoff-matrix heatmap and ratings-over-time plots (PNG).

A solo league (players that train alone on gym orchestrator workers) trains as a plain gym
training run does (`harness.training`, the same ``training:`` keys and `Progress`): blocks
of the league's jobs until the players took the env steps to the next evaluation point (in
all: the budget and the evaluations count every player's env steps; jobs are whole, so a
block may run past the point), then every player's agent is evaluated greedily on fixed
seeds on a gym orchestrator of the harness's (the evaluator: `eval_episodes` episodes each,
`train: false`), and every agent saves a checkpoint. An evaluation's ``mean_return`` is the
best player's (its ``players`` has each one's); ``stop_value`` stops the run once the best
player reaches it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from harness.config import TrainingSpec
from harness.episodes import EpisodesFile
from harness.loop import Evaluated
from harness.progress import TrainingProgress
from harness.training import EvalResult, GymSchedule, Progress, evaluate_returns, train
from mistk_rl.games.opponents import OPPONENTS
from mistk_rl.sdk.client import OrchestratorClient
from mistk_rl.sdk.schemas import EpisodeConfig

SEAT_ORDER = ("first", "second", "third", "fourth")


def by_seat_order(report: dict[str, Any]) -> dict[str, Any]:
    """``{"vs_random": {"first": {win, draw, loss}, "second": ...}, "vs_perfect": {"first":
    {win, draw, loss, lines, lost_lines}, ...}}`` from an evaluation report (seats in the
    game's order: the first mover first)."""
    named = {}
    for opponent, result in report.items():
        seats = {}
        for order, (_, r) in zip(SEAT_ORDER, result["seats"].items()):
            seats[order] = {k: r[k] for k in ("win", "draw", "loss")}
            if "lines" in r:
                seats[order].update(lines=r["lines"], lost_lines=r["lost_lines"])
        named[f"vs_{OPPONENTS[opponent].label if opponent in OPPONENTS else opponent}"] = seats
    return named


def league_results(
    orch: OrchestratorClient,
    evals: list[dict],
    run_dir: Path,
    checkpoint: Optional[Path],
    title: str = "",
) -> dict[str, Any]:
    """results.json's league part; writes ``payoff.png`` and ``ratings.png`` (`title`:
    the run's, on both)."""
    league = orch.get_league().model_dump()
    last = evals[-1] if evals else None
    passed = next((e for e in evals if e.get("passed")), None)
    plot_payoff(league["payoff"], run_dir / "payoff.png", title)
    plot_ratings(evals, run_dir / "ratings.png", title)
    return {
        "evaluation": by_seat_order(last["evaluation"]) if last else None,
        "evaluation_detail": last and last["evaluation"],
        "first_pass": passed and {k: passed[k] for k in ("agent_steps", "wall_s")},
        "checkpoint": str(checkpoint) if checkpoint else None,
        "league": league,
    }


def table_text(league: dict[str, Any], rows: int = 12) -> str:
    """The league table as text (best first), for the end of a run; a solo league's: its
    players' steps, epsilon and last job's mean return, and their snapshots."""
    if any("epsilon" in row for row in league["players"]):
        return _solo_table_text(league)
    lines = [
        f"league: {league['jobs']['launched']} jobs, {len(league['players'])} players "
        f"(best {min(rows, len(league['players']))} by TrueSkill exposure)",
        f"  {'player':32s} {'kind':16s} {'steps':>8s} {'exposure':>9s} {'elo':>6s}",
    ]
    for row in league["players"][:rows]:
        lines.append(
            f"  {row['id']:32s} {row['kind']:16s} {row['steps']:8d} "
            f"{row['exposure']:9.2f} {row['elo']:6.0f}"
        )
    mix = league["jobs"].get("mix", [])
    if mix:
        lines.append("what each player trained against (score: its own, draws half)")
        lines.append(
            f"  {'player':16s} {'branch':13s} {'opponent':26s} {'games':>7s} {'score':>6s} "
            f"{'moves':>9s} {'share':>6s}"
        )
        for m in mix:
            score = "-" if m["score"] is None else f"{m['score']:.3f}"
            share = "-" if m["share"] is None else f"{m['share']:.1%}"
            lines.append(
                f"  {m['player']:16s} {m['branch']:13s} {m['opponent']:26s} {m['games']:7d} "
                f"{score:>6s} {m['moves']:9d} {share:>6s}"
            )
    return "\n".join(lines)


def _solo_table_text(league: dict[str, Any]) -> str:
    jobs = league["jobs"]
    players = [row for row in league["players"] if "epsilon" in row]
    snapshots = len(league["players"]) - len(players)
    lines = [
        f"solo league: {jobs['launched']} jobs ({jobs['failed']} failed), "
        f"{len(players)} players, {snapshots} snapshots",
        f"  {'player':32s} {'steps':>8s} {'epsilon':>8s} {'last job mean return':>21s}",
    ]
    for row in sorted(players, key=lambda r: r["id"]):
        eps = "-" if row["epsilon"] is None else f"{row['epsilon']:.4f}"
        mean = "-" if row["mean_return"] is None else f"{row['mean_return']:.2f}"
        lines.append(f"  {row['id']:32s} {row['steps']:8d} {eps:>8s} {mean:>21s}")
    return "\n".join(lines)


def train_solo_league(
    league: OrchestratorClient,
    evaluator: "Evaluator",
    spec: TrainingSpec,
    run_dir: Path,
    timeout: float,
    say: Callable[[str], None],
    checkpoints: Any = None,
    progress: Optional[Progress] = None,
    quiet: bool = False,
    title: str = "",
    episodes: Optional[EpisodesFile] = None,
) -> Progress:
    """A solo league's training loop (module doc), from the start or from `progress` (a
    resumed run: the league resumes from its directory); returns where it ended."""
    return train(
        league,
        spec,
        run_dir,
        timeout,
        say,
        checkpoints,
        progress,
        quiet,
        title,
        schedule=functools.partial(_SoloSchedule, evaluator=evaluator),
        stop_line="the best player reached stop_value {}: stopping",
        episodes=episodes,
    )


class Evaluator:
    """The gym orchestrator a solo league's players are evaluated on: it takes one agent,
    so a player's agent is registered before its evaluation (the last one is kept)."""

    def __init__(
        self,
        client: OrchestratorClient,
        env: dict[str, Any],
        agent_urls: dict[str, str],
        timeout: float,
    ) -> None:
        self.client, self.env, self.agent_urls = client, env, agent_urls
        self.timeout = timeout
        self.current: Optional[str] = None

    def use(self, player: str) -> OrchestratorClient:
        if self.current != player:
            self.current = None
            self.client.set_up(
                self.env, [(player, self.agent_urls[player], False)], timeout=self.timeout
            )
            self.current = player
        return self.client


class _SoloSchedule(GymSchedule):
    """Solo league training for `run_loop` (module doc): the league's jobs train, every
    player is evaluated; progress, checkpoints and the curve as for gym training."""

    unit, eval_label = "env steps", "last eval (best player)"

    def __init__(
        self,
        league: OrchestratorClient,
        spec: TrainingSpec,
        run_dir: Path,
        timeout: float,
        progress: Progress,
        resumed: bool,
        title: str,
        *,
        evaluator: Evaluator,
        episodes: Optional[EpisodesFile] = None,
    ) -> None:
        super().__init__(
            league, spec, run_dir, timeout, progress, resumed, title, episodes=episodes
        )
        self.evaluator, self.players = evaluator, list(evaluator.agent_urls)

    def train_block(self, target: int, shown: TrainingProgress) -> None:
        progress = self.progress
        while progress.train_steps < target:
            done = progress.train_steps
            base = self.orch.progress().env_steps
            played = self.orch.play(
                EpisodeConfig(num_steps=target - done),
                timeout=self.timeout,
                on_status=lambda status: shown.update(
                    done + status.payload.get("envSteps", base) - base
                ),
            )
            if played.env_steps <= 0:
                raise RuntimeError(f"the league played no env steps toward {target}")
            progress.train_steps += played.env_steps
            progress.train_episodes += len(played.episodes)
            for e in played.episodes:
                at = done + (played.env_steps if e.env_steps is None else e.env_steps - base)
                self.writer.add_scalar(f"train/{e.agent}/episode_return", e.return_, at)
                progress.train_returns.append([at, e.return_])

    def evaluate(self, wall_s: float) -> Evaluated:
        progress, spec = self.progress, self.spec
        players: dict[str, dict[str, Any]] = {}
        results: dict[str, EvalResult] = {}
        for player in self.players:
            result = results[player] = evaluate_returns(
                self.evaluator.use(player), spec, self.timeout
            )
            players[player] = {
                "mean_return": result.mean_return,
                "std_return": result.std_return,
                "returns": result.returns,
            }
            self.writer.add_scalar(
                f"eval/{player}/mean_return", result.mean_return, progress.train_steps
            )
        best = max(players, key=lambda p: players[p]["mean_return"])
        top, stop = players[best], results[best].stop
        progress.evals.append(
            {
                "env_steps": progress.train_steps,
                "wall_s": wall_s,
                **top,
                "best": best,
                "players": players,
                "train_episodes": progress.train_episodes,
            }
        )
        progress.done = stop
        self.writer.flush()
        each = (
            f"mean return {top['mean_return']:7.2f} ± {top['std_return']:.2f}"
            if len(players) == 1
            else ", ".join(
                f"{p} {r['mean_return']:.2f} ± {r['std_return']:.2f}" for p, r in players.items()
            )
            + f" (best {best})"
        )
        return Evaluated(
            top["mean_return"],
            (
                f"  eval at {progress.train_steps:7d} env steps ({wall_s:7.1f} s): {each} over "
                f"{len(top['returns'])} episodes"
            ),
            stop,
        )


def plot_payoff(payoff: dict[str, Any], path: Path, title: str = "") -> None:
    """``payoff.png`` (`payoff_figure`)."""
    fig = payoff_figure(payoff, title)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


# The payoff figure's side in inches: it grows with the league up to this, then its cells
# shrink instead. A league gains a snapshot every phase, so an unbounded figure would make
# every TensorBoard payoff image (drawn at each evaluation) larger than the last, and the
# harness's memory with it (a 57-player figure took ~280 MiB more to draw than a 3-player one).
MAX_FIGURE_INCHES = 11.0
ANNOTATED_PLAYERS = 20  # above this, a cell is too small for its rate and games
LABELLED_PLAYERS = 60  # above this, every k-th player is named, for legible ticks


def payoff_figure(payoff: dict[str, Any], title: str = "") -> Any:
    """Row player's win rate (draws half) against the column player; raw games annotated;
    pairs that never played left blank. `title`: the run's (config name, seed). The figure's
    size is bounded (`MAX_FIGURE_INCHES`) however many players the league holds."""
    title = f"{title}: " if title else ""
    plt = _pyplot()
    ids, rates, games = payoff["ids"], payoff["winRate"], payoff["games"]
    n = len(ids)
    size = min(MAX_FIGURE_INCHES, max(5.0, 0.45 * n + 2))
    fig, ax = plt.subplots(figsize=(size + 1, size))
    # pairs that never played are blank (grey), not the prior's 0.5 coloured as a result
    played = np.ma.masked_where(np.asarray(games) == 0, np.asarray(rates, dtype=float))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="0.85")
    image = ax.imshow(played, vmin=0, vmax=1, cmap=cmap)
    every = max(1, -(-n // LABELLED_PLAYERS))
    ticks = list(range(0, n, every))
    fontsize = "small" if n <= 2 * ANNOTATED_PLAYERS else "xx-small"
    ax.set_xticks(ticks, [ids[i] for i in ticks], rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, [ids[i] for i in ticks], fontsize=fontsize)
    if n <= ANNOTATED_PLAYERS:
        for i in range(n):
            for j in range(n):
                if games[i][j]:
                    ax.text(
                        j,
                        i,
                        f"{rates[i][j]:.2f}\n{games[i][j]}",
                        ha="center",
                        va="center",
                        fontsize=6,
                    )
    fig.colorbar(image, ax=ax, label="win rate of row vs column (draws half)")
    ax.set_title(
        f"{title}payoff: row vs column (decayed; prior 0.5 under 8 games;\n"
        "games played below each rate; grey: never played)",
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def plot_ratings(evals: list[dict], path: Path, title: str = "") -> None:
    """TrueSkill exposure and Elo of every player at each evaluation, against the evaluated
    player's steps: active players solid, snapshots dotted."""
    plt = _pyplot()
    series: dict[str, list[tuple[int, float, float]]] = {}
    for record in evals:
        for row in record.get("league", ()):
            series.setdefault(row["id"], []).append(
                (record["agent_steps"], row["exposure"], row["elo"])
            )
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for name, points in series.items():
        steps, exposure, elo = zip(*points)
        style = ":" if _is_snapshot(name) else "-"
        top.plot(steps, exposure, style, marker=".", label=name)
        bottom.plot(steps, elo, style, marker=".")
    top.set_ylabel("TrueSkill exposure (mu - 3 sigma)")
    bottom.set_ylabel("Elo")
    bottom.set_xlabel("evaluated player's steps")
    top.set_title(
        f"{title + ': ' if title else ''}ratings at each evaluation "
        "(solid: active players; dotted: frozen snapshots)",
        fontsize="small",
    )
    if len(series) <= 12:
        top.legend(fontsize="x-small", loc="best")
    else:  # (too many names: the styles still say which is which)
        from matplotlib.lines import Line2D

        top.legend(
            [Line2D([], [], linestyle="-"), Line2D([], [], linestyle=":")],
            ["active player", "snapshot"],
            fontsize="x-small",
            loc="best",
        )
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _is_snapshot(name: str) -> bool:
    parts = name.rsplit("_", 2)
    return len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
