"""`mistk-rl compare`: runs side by side, as distributions over their seeds.

A learning claim is a distribution over seeds, not one run. Given run directories (of
`mistk-rl run`), this groups them (by their config's ``name``, or by the LABEL given as
``LABEL=DIR``) and prints, at each evaluation point, the mean and the range over the group's
runs of what the evaluations reported: a game run's win rate per opponent and seat, a gym
run's mean evaluation return. It reads each run's ``progress.json``, which is written at every
evaluation, so a run still going counts up to its last evaluation. Evaluation points are
the config's ``eval_every`` multiples nearest each evaluation (a run evaluates just past each
point: jobs and games are whole)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from harness.config import RunConfigError
from harness.games import GameProgress
from harness.training import Progress

CONFIG = "config.yaml"


@dataclass
class Run:
    """One run directory's evaluations: point -> metric -> value."""

    group: str
    path: Path
    seed: Optional[int]
    unit: str  # what its points count: "moves" (games) or "env steps" (gym)
    points: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass
class Cell:
    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int) -> str:
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1)"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] ({self.n})"


def load_run(spec: str) -> Run:
    """``DIR`` or ``LABEL=DIR``: the run's evaluations from its progress.json."""
    label, _, where = spec.rpartition("=")
    path = Path(where)
    try:  # (read as plain YAML: a run of an older schema still compares)
        config = yaml.safe_load((path / CONFIG).read_text())
    except FileNotFoundError:
        raise RunConfigError(
            f"{path}: not a run directory with evaluations ({CONFIG} is "
            "missing: it is not a mistk-rl run)"
        ) from None
    games = config.get("game_training")
    training = games or config.get("training")
    if training is None:
        raise RunConfigError(f"{path}: a run without training (nothing was evaluated over time)")
    progress = (GameProgress if games else Progress).load(path)  # (what --resume reads)
    every = int(training.get("eval_every") or 1)
    run = Run(
        label or config.get("name") or path.name,
        path,
        training.get("seed"),
        "moves" if games else "env steps",
    )
    for record in progress.evals:
        steps = record["agent_steps"] if games else record["env_steps"]
        point = max(1, round(steps / every)) * every
        run.points[point] = _metrics(record, games is not None)
    return run


def _metrics(record: dict[str, Any], game: bool) -> dict[str, float]:
    """What one evaluation says: per opponent and seat the win rate (a game run), or the
    mean evaluation return (a gym run; a league's, its best player's)."""
    if not game:
        return {"mean return": float(record["mean_return"])}
    return {
        f"{opponent} {seat}": float(result["win"])
        for opponent, matchup in record["evaluation"].items()
        for seat, result in matchup["seats"].items()
    }


def summarise(runs: Sequence[Run]) -> dict[str, dict[int, dict[str, Cell]]]:
    """group -> point -> metric -> the mean and range over the group's runs that have it."""
    by_group: dict[str, list[Run]] = {}
    for run in runs:
        by_group.setdefault(run.group, []).append(run)
    summary: dict[str, dict[int, dict[str, Cell]]] = {}
    for group, members in by_group.items():
        units = {run.unit for run in members}
        if len(units) > 1:
            raise RunConfigError(
                f"group {group!r} mixes game and gym runs: "
                + ", ".join(f"{r.path} ({r.unit})" for r in members)
            )
        table = summary[group] = {}
        for point in sorted({p for run in members for p in run.points}):
            metrics = sorted({m for run in members for m in run.points.get(point, {})})
            table[point] = {}
            for metric in metrics:
                values = [
                    run.points[point][metric]
                    for run in members
                    if metric in run.points.get(point, {})
                ]
                table[point][metric] = Cell(
                    statistics.fmean(values), min(values), max(values), len(values)
                )
    return summary


def table_text(runs: Sequence[Run], summary: dict[str, dict[int, dict[str, Cell]]]) -> str:
    """One table per group: a row per evaluation point, a column per metric."""
    lines = []
    for group, table in summary.items():
        members = [run for run in runs if run.group == group]
        seeds = ", ".join(f"{run.path.name} (seed {run.seed})" for run in members)
        unit = members[0].unit
        digits = 3 if unit == "moves" else 1
        lines.append(f"{group}: {len(members)} run{'s' if len(members) > 1 else ''}: {seeds}")
        metrics = sorted({m for row in table.values() for m in row})
        header = [unit, *metrics]
        rows = [
            [f"{point:,}", *(row[m].text(digits) if m in row else "-" for m in metrics)]
            for point, row in table.items()
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append(("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip())
        lines.append("")
    lines.append("mean [min, max] (runs with an evaluation there)")
    return "\n".join(lines)


def compare(specs: Sequence[str], json_out: Optional[Path] = None) -> str:
    """The text `mistk-rl compare` prints; with `json_out`, the summary as JSON there too."""
    runs = [load_run(spec) for spec in specs]
    summary = summarise(runs)
    if json_out is not None:
        json_out.write_text(
            json.dumps(
                {
                    group: {
                        "runs": [
                            {"path": str(r.path), "seed": r.seed} for r in runs if r.group == group
                        ],
                        "points": {
                            str(point): {m: vars(cell) for m, cell in row.items()}
                            for point, row in table.items()
                        },
                    }
                    for group, table in summary.items()
                },
                indent=2,
            )
        )
    return table_text(runs, summary)
