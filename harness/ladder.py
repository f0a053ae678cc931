"""A ladder: trained players and built-in opponents in a round robin, rated with intervals.

`mistk-rl ladder RUN_DIR... --opponents NAME,...` gathers its players
(`harness.ladder_players`):

- from each run directory, the evaluated agent as it ended (the model it saved, else the
  checkpoint of its last evaluation), named by the run (or ``LABEL=RUN_DIR``);
- with ``--snapshots K``, a league run's last K snapshots of that agent too;
- built-in opponents by their registered names (`mistk_rl.games.opponents`: random,
  connect4_winblock, the alpha-beta and MCTS searchers).

It writes a run of its own (its `config.yaml` reruns it: ``mistk-rl run``) whose `ladder`
block plays every pair, `games_per_seat` games in each seat order (`play_round_robin`,
the harness's sequence runs it), and fits Bradley-Terry ratings with bootstrap intervals
anchored to one player (`mistk_rl.league.bradley_terry`). In the run directory:
``ladder.json`` (every cell's games, the ratings), ``ladder.csv`` and two plots,
``ratings.png`` and ``headtohead.png``; the table is printed.

With ``--group NAME=PLAYER,...`` (twice or more: e.g. a league config's seeds and
self-play's) it also compares the groups as wholes: each pair of groups' mean score over
every pairing of their members (both seats), with a 95% interval that resamples both
groups' members and each pairing's games (`harness.stats.crossed_bootstrap`), so a
difference between two configs is judged against their seed-to-seed spread, not the games'
alone.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from harness.config import LadderSpec, member_players
from harness.stats import crossed_bootstrap
from mistk_rl.files import atomic_write_json
from mistk_rl.games.pettingzoo_games import result_for
from mistk_rl.league.bradley_terry import PairRecord, rate
from mistk_rl.sdk.client import OrchestratorClient
from mistk_rl.sdk.schemas import AgentSettings, EpisodeConfig


def play_round_robin(
    orch: OrchestratorClient, spec: LadderSpec, timeout: float, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every pair of `spec.players`, `games_per_seat` games in each seat order (alternating
    game by game), then the ratings; what `ladder.json` holds."""
    seats = orch.status().payload["seats"]
    mode = "collect" if spec.mode == "sampled" else "eval"
    cells: list[PairRecord] = []
    pairs = list(itertools.combinations(spec.players, 2))
    for k, (a, b) in enumerate(pairs):
        games = orch.play(
            EpisodeConfig(
                num_episodes=2 * spec.games_per_seat,
                num_envs=spec.num_envs,
                seed=spec.seed + k * spec.num_envs,
                train=False,
                lineup={seats[0]: a, seats[1]: b},
                seat_assignment="alternate",
                agents={p: AgentSettings(mode=mode, train=False) for p in (a, b)},
            ),
            timeout=timeout,
        ).episodes
        for first, second in ((a, b), (b, a)):
            tally = {"win": 0, "draw": 0, "loss": 0}
            for game in games:
                if (game.seats or {}).get(seats[0]) == first:
                    tally[result_for(seats[0], game.winner)] += 1
            cells.append(PairRecord(first, second, **tally))
        mine = cells[-2:]
        say(
            f"  {k + 1}/{len(pairs)} {a} vs {b} (W/D/L of {a}): first seat {_wdl(mine[0])}, "
            f"second seat {_wdl(_flipped(mine[1]))}"
        )
    rated = rate(cells, spec.players, spec.anchor, spec.resamples, seed=spec.seed)
    return {
        "groups": group_scores(cells, spec.groups, seed=spec.seed, players=spec.players),
        "group_members": {
            g: [member_players(m, spec.players) for m in ms] for g, ms in spec.groups.items()
        },
        "anchor": spec.anchor,
        "mode": spec.mode,
        "games_per_seat": spec.games_per_seat,
        "resamples": spec.resamples,
        "cells": [asdict(c) for c in cells],
        "ratings": {p: asdict(r) for p, r in rated.players.items()},
        "first_seat": {
            "rating": rated.first_seat,
            "low": rated.first_seat_low,
            "high": rated.first_seat_high,
        },
    }


def pair_records(cells: list[PairRecord]) -> dict[tuple[str, str], np.ndarray]:
    """(row, column) -> the row's (wins, draws, losses) against the column over both seat
    orders (a cell is the first seat's record: it counts for both players)."""
    wdl: dict[tuple[str, str], np.ndarray] = {}
    for c in cells:
        wdl[c.first, c.second] = wdl.get((c.first, c.second), 0) + np.array([c.win, c.draw, c.loss])
        wdl[c.second, c.first] = wdl.get((c.second, c.first), 0) + np.array([c.loss, c.draw, c.win])
    return wdl


def group_scores(
    cells: list[PairRecord],
    groups: dict[str, list[str]],
    resamples: int = 2000,
    seed: int = 0,
    players: Optional[list[str]] = None,
) -> list[dict[str, Any]]:
    """For each pair of groups (in the order given), the first's mean score against the
    second over all their members' pairings, both seats, with its crossed-bootstrap 95%
    interval, and each pairing's score. A member that is a run's checkpoints (`players`
    holds ``MEMBER:step-N``) is compared checkpoint by checkpoint, counted from the last
    (a run keeps its last ones): the k-th of each member against the k-th of the other
    group's, for every k all members have ("at": k, 0 the earliest compared)."""
    wdl = pair_records(cells)
    everyone = players or sorted({p for pair in wdl for p in pair})
    expanded = {g: [member_players(m, everyone) for m in ms] for g, ms in groups.items()}
    compared = []
    for a, b in itertools.combinations(groups, 2):
        depth = min(len(players_) for players_ in expanded[a] + expanded[b])
        for k in range(depth):  # (aligned on the last: a run keeps its last checkpoints)
            rows = [m[len(m) - depth + k] for m in expanded[a]]
            cols = [m[len(m) - depth + k] for m in expanded[b]]
            grid = np.array([[wdl[p, q] for q in cols] for p in rows], float)
            score, low, high = crossed_bootstrap(grid, resamples, seed)
            pairings = {
                f"{p} vs {q}": round(float((record[0] + record[1] / 2) / record.sum()), 4)
                for p, row in zip(rows, grid)
                for q, record in zip(cols, row)
            }
            compared.append(
                {
                    "group": a,
                    "against": b,
                    "at": k,
                    "moves": _moves(rows + cols),
                    "score": score,
                    "low": low,
                    "high": high,
                    "games": int(grid.sum()),
                    "pairings": pairings,
                }
            )
    return compared


def _flipped(cell: PairRecord) -> PairRecord:
    return PairRecord(cell.second, cell.first, cell.loss, cell.draw, cell.win)


def _wdl(cell: PairRecord) -> str:
    return f"{cell.win}/{cell.draw}/{cell.loss}"


def table(ladder: dict[str, Any]) -> str:
    """The ratings, best first, with intervals and records."""
    rows = sorted(ladder["ratings"].items(), key=lambda kv: -kv[1]["rating"])
    width = max(len(p) for p, _ in rows)
    lines = [
        f"ratings (Elo points above {ladder['anchor']}; 95% bootstrap interval over "
        f"{ladder['resamples']} resamples; {ladder['games_per_seat']} games per pair and "
        f"seat, {ladder['mode']} play)",
        f"  {'player':{width}s}  rating  interval          score  games",
    ]
    for player, r in rows:
        lines.append(
            f"  {player:{width}s}  {r['rating']:6.0f}  [{r['low']:6.0f}, {r['high']:6.0f}]"
            f"  {r['score']:.3f}  {r['games']:5d}"
        )
    seat = ladder["first_seat"]
    lines.append(
        f"  first seat's advantage: {seat['rating']:.0f} [{seat['low']:.0f}, {seat['high']:.0f}]"
    )
    for g in ladder.get("groups", []):
        lines.append(
            f"group {g['group']} against {g['against']}{_at(g)}: score {g['score']:.3f} "
            f"[{g['low']:.3f}, {g['high']:.3f}] (95%, both groups' members and the games "
            f"resampled; {g['games']} games over {len(g['pairings'])} pairings)"
        )
        lines += [f"  {pairing}: {s:.3f}" for pairing, s in g["pairings"].items()]
    return "\n".join(lines)


def _at(group: dict[str, Any]) -> str:
    return "" if group.get("moves") is None else f" at {group['moves']:,} moves (mean)"


def _moves(players: list[str]) -> Optional[int]:
    """The mean moves of checkpoint players (``LABEL:step-N``); None for other players."""
    steps = [_steps(p) for p in players if ":step-" in p]
    return round(sum(steps) / len(steps)) if len(steps) == len(players) else None


def write_ladder(ladder: dict[str, Any], run_dir: Path, title: str = "") -> None:
    """ladder.json, ladder.csv, ratings.png and headtohead.png in `run_dir`."""
    atomic_write_json(run_dir / "ladder.json", ladder)
    with open(run_dir / "ladder.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["player", "rating", "low", "high", "score", "games"])
        for player, r in ladder["ratings"].items():
            out.writerow(
                [player, *(round(r[k], 1) for k in ("rating", "low", "high"))]
                + [
                    round(r["score"], 4),
                    r["games"],
                ]
            )
    _plots(ladder, run_dir, title)


def _plots(ladder: dict[str, Any], run_dir: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = sorted(ladder["ratings"].items(), key=lambda kv: kv[1]["rating"])
    names = [p for p, _ in rows]
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.35 * len(rows)))
    y = np.arange(len(rows))
    rating = np.array([r["rating"] for _, r in rows])
    low = np.array([r["low"] for _, r in rows])
    high = np.array([r["high"] for _, r in rows])
    ax.errorbar(rating, y, xerr=[rating - low, high - rating], fmt="o", capsize=3)
    ax.set_yticks(y, names, fontsize="small")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"rating (Elo points above {ladder['anchor']}; 95% bootstrap interval)")
    ax.set_title(title or "ladder", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "ratings.png", dpi=100)
    plt.close(fig)

    best_first = names[::-1]
    index = {p: k for k, p in enumerate(best_first)}
    score = np.full((len(names), len(names)), np.nan)
    for (row, col), (w, d, lost) in pair_records(
        [PairRecord(**c) for c in ladder["cells"]]
    ).items():
        score[index[row], index[col]] = (w + d / 2) / (w + d + lost)
    played = ~np.isnan(score)
    fig, ax = plt.subplots(figsize=(1.6 + 0.55 * len(names), 1.2 + 0.5 * len(names)))
    image = ax.imshow(score, cmap="RdBu", vmin=0, vmax=1)
    for i, j in zip(*np.nonzero(played)):
        ax.text(j, i, f"{score[i, j]:.2f}", ha="center", va="center", fontsize="x-small")
    ax.set_xticks(range(len(names)), best_first, rotation=60, ha="right", fontsize="x-small")
    ax.set_yticks(range(len(names)), best_first, fontsize="x-small")
    ax.set_title("score of the row against the column (both seats)", fontsize="small")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(run_dir / "headtohead.png", dpi=100)
    plt.close(fig)
    _plot_over_moves(ladder, run_dir, title, plt)


def _plot_over_moves(ladder: dict[str, Any], run_dir: Path, title: str, plt: Any) -> None:
    """ratings_over_moves.png when the players are runs' checkpoints (``LABEL:step-N``):
    each run a thin line with its rating's interval shaded; each group of runs its mean
    over them, with the band from its lowest to its highest run."""
    import numpy as np

    series: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for player, r in ladder["ratings"].items():
        label, sep, steps = player.rpartition(":step-")
        if sep and steps.isdigit():
            series.setdefault(label, []).append((int(steps), r))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    groups = ladder.get("group_members", {})
    label_group = {p.rpartition(":step-")[0]: g for g, ms in groups.items() for m in ms for p in m}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    group_colour = {g: colours[k % len(colours)] for k, g in enumerate(groups)}
    for k, (label, points) in enumerate(sorted(series.items())):
        points.sort(key=lambda x: x[0])
        xs = np.array([x for x, _ in points])
        ys, lows, highs = (
            np.array([r[key] for _, r in points]) for key in ("rating", "low", "high")
        )
        group = label_group.get(label)
        colour = group_colour[group] if group else colours[k % len(colours)]
        ax.plot(xs, ys, lw=0.8, alpha=0.6, color=colour, label=None if group else label)
        ax.fill_between(xs, lows, highs, color=colour, alpha=0.08)
    for g, members in groups.items():
        depth = min(len(m) for m in members)
        if depth < 2:
            continue
        members = [m[len(m) - depth :] for m in members]  # (aligned on the last)
        at = [[_steps(m[k]) for m in members] for k in range(depth)]
        rated = np.array(
            [[ladder["ratings"][m[k]]["rating"] for m in members] for k in range(depth)]
        )
        xs = np.array([np.mean(x) for x in at])
        ax.plot(
            xs,
            rated.mean(axis=1),
            lw=2,
            color=group_colour[g],
            label=f"{g} (mean of {len(members)})",
        )
        ax.fill_between(xs, rated.min(axis=1), rated.max(axis=1), color=group_colour[g], alpha=0.2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("moves of the player when saved")
    ax.set_ylabel(f"rating (Elo points above {ladder['anchor']})")
    ax.set_title(title or "ratings over moves", fontsize="small")
    ax.legend(fontsize="x-small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "ratings_over_moves.png", dpi=100)
    plt.close(fig)


def _steps(player: str) -> int:
    return int(player.rpartition(":step-")[2])
