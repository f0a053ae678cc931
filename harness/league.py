"""What a league run adds to its results: the evaluation by seat order, the league table,
the kept checkpoint, a payoff-matrix heatmap and ratings-over-time plots (PNG)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from mistk_rl.client import OrchestratorClient
from mistk_rl.games.opponents import OPPONENTS

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
                seats[order].update(lines=r["lines"], lost_lines=r["lostLines"])
        named[f"vs_{OPPONENTS[opponent].label if opponent in OPPONENTS else opponent}"] = seats
    return named


def league_results(orch: OrchestratorClient, evals: list[dict], run_dir: Path,
                   checkpoint: Optional[Path]) -> dict[str, Any]:
    """results.json's league part; writes ``payoff.png`` and ``ratings.png``."""
    league = orch.get_league().model_dump()
    last = evals[-1] if evals else None
    passed = next((e for e in evals if e.get("passed")), None)
    plot_payoff(league["payoff"], run_dir / "payoff.png")
    plot_ratings(evals, run_dir / "ratings.png")
    return {"evaluation": by_seat_order(last["evaluation"]) if last else None,
            "evaluation_detail": last and last["evaluation"],
            "first_pass": passed and {k: passed[k] for k in ("agent_steps", "wall_s")},
            "checkpoint": str(checkpoint) if checkpoint else None,
            "league": league}


def table_text(league: dict[str, Any], rows: int = 12) -> str:
    """The league table as text (best first), for the end of a run."""
    lines = [f"league: {league['jobs']['launched']} jobs, {len(league['players'])} players "
             f"(best {min(rows, len(league['players']))} by TrueSkill exposure)",
             f"  {'player':32s} {'kind':16s} {'steps':>8s} {'exposure':>9s} {'elo':>6s}"]
    for row in league["players"][:rows]:
        lines.append(f"  {row['id']:32s} {row['kind']:16s} {row['steps']:8d} "
                     f"{row['exposure']:9.2f} {row['elo']:6.0f}")
    return "\n".join(lines)


def plot_payoff(payoff: dict[str, Any], path: Path) -> None:
    """Row player's win rate (draws half) against the column player; raw games annotated."""
    plt = _pyplot()
    ids, rates, games = payoff["ids"], payoff["winRate"], payoff["games"]
    size = max(5.0, 0.45 * len(ids) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(rates, vmin=0, vmax=1, cmap="RdYlGn")
    ax.set_xticks(range(len(ids)), ids, rotation=90, fontsize="small")
    ax.set_yticks(range(len(ids)), ids, fontsize="small")
    if len(ids) <= 20:
        for i in range(len(ids)):
            for j in range(len(ids)):
                if games[i][j]:
                    ax.text(j, i, f"{rates[i][j]:.2f}\n{games[i][j]}", ha="center",
                            va="center", fontsize=6)
    fig.colorbar(image, ax=ax, label="win rate of row vs column (draws half)")
    ax.set_title("payoff (decayed; prior 0.5 under 8 games; raw games below)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ratings(evals: list[dict], path: Path) -> None:
    """TrueSkill exposure and Elo of every player at each evaluation, against the evaluated
    player's steps."""
    plt = _pyplot()
    series: dict[str, list[tuple[int, float, float]]] = {}
    for record in evals:
        for row in record.get("league", ()):
            series.setdefault(row["id"], []).append(
                (record["agent_steps"], row["exposure"], row["elo"]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for name, points in series.items():
        steps, exposure, elo = zip(*points)
        style = ":" if _is_snapshot(name) else "-"
        top.plot(steps, exposure, style, marker=".", label=name)
        bottom.plot(steps, elo, style, marker=".")
    top.set_ylabel("TrueSkill exposure (mu - 3 sigma)")
    bottom.set_ylabel("Elo")
    bottom.set_xlabel("evaluated player's steps")
    if len(series) <= 12:
        top.legend(fontsize="x-small", loc="best")
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
